package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// The simulated clusters: their services, endpoints and churn, and a real
// federation.Publisher per cluster streaming them to the hub.

const (
	benchNamespace    = "bench"
	servicePort       = 8080
	endpointPort      = 9090
	clustersPerRegion = 2
)

var zoneSuffixes = []string{"a", "b", "c"}

// benchNetwork is the network of every simulated cluster, whose east-west
// gateways the gateway clients are.
const benchNetwork = "bench"

// The shape every bench service shares (read-only once built).
var (
	servicePorts  = []registry.ServicePort{{Name: "grpc", Port: servicePort, Protocol: registry.ProtocolTCP}}
	endpointPorts = []registry.EndpointPort{{Name: "grpc", Port: endpointPort}}
	exportedAt    = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ready         = registry.Conditions{Ready: true, Serving: true}
	notReady      = registry.Conditions{}
)

// serviceKey is the key of bench service s.
func serviceKey(s int) registry.ServiceKey {
	return registry.ServiceKey{Namespace: benchNamespace, Name: fmt.Sprintf("svc-%04d", s)}
}

// echoKey is the one service with a real backend, for the grpc-go sanity clients.
var echoKey = registry.ServiceKey{Namespace: benchNamespace, Name: "echo"}

// clusterID is the ID of cluster c.
func clusterID(c int) registry.ClusterID { return registry.ClusterID(fmt.Sprintf("c%02d", c)) }

// regionOf is the region of cluster c.
func regionOf(c int) string { return fmt.Sprintf("region-%d", c/clustersPerRegion) }

// regions is how many regions the clusters span.
func regions(clusters int) int { return (clusters + clustersPerRegion - 1) / clustersPerRegion }

func zoneOf(region string, i int) string { return region + "-" + zoneSuffixes[i%len(zoneSuffixes)] }

// simCluster is one simulated cluster. Owned by the churn goroutine, except
// out, which its publisher reads.
type simCluster struct {
	index  int
	id     registry.ClusterID
	region string
	// next is the last address number handed out (see addrLayout).
	next   uint32
	zone   int // round-robin zone for new endpoints
	shards []*registry.Shard
	state  federation.State
	// out takes the cluster's changes to its publisher.
	out *federation.Changes
	// origins tells the publisher when each change was made (the hub's trace).
	origins *federation.Origins
}

// world is every simulated cluster and the churn that changes them.
type world struct {
	layout    addrLayout
	ledger    *ledger
	rng       *rand.Rand
	endpoints int // per (cluster, service) at start; the churn keeps counts within [endpoints/2, 2*endpoints]
	clusters  []*simCluster
	services  int
	// restarted: service 0 of cluster 0 is the rolling restart's, with its
	// own size; random changes leave service 0 alone, in every cluster, so
	// every push of it during the restart is the restart's.
	restarted bool
	// onRestart, when set, hears when the rolling restart starts and ends.
	onRestart func(running bool)

	// plan says which services carry a route or a policy (nil: none; see
	// routes.go). routes is the routes' ledger (one "cluster": the route's
	// states; nil without routes), weights each routed service's own
	// weight now, by service.
	plan    *trafficPlan
	routes  *ledger
	weights []int32
	// routeFraction is the share of the churn's changes that move a
	// route's weights (-route-changes); onSegment, when set, hears when the
	// churn switches between route and endpoint changes (and at its first change).
	routeFraction float64
	onSegment     func(route bool)
}

// newWorld builds every cluster's initial state (generation 0 of every pair)
// and, when echo is valid, an echo service in cluster 0 served by that address.
func newWorld(cfg scaleConfig, l *ledger, seed uint64, echo netip.AddrPort) (*world, error) {
	layout := newAddrLayout(cfg.Clusters)
	// Initial addresses plus one fresh one per change (generous: restarts add a few more).
	need := uint64(cfg.Services)*uint64(cfg.Endpoints) + uint64(cfg.Rate*cfg.Duration.Seconds()) + uint64(2*cfg.Endpoints) + uint64(2*cfg.RestartEndpoints) + 1
	if need > uint64(layout.capacity()) {
		return nil, fmt.Errorf("%d clusters leave %d addresses per cluster, fewer than the %d the scale needs", cfg.Clusters, layout.capacity(), need)
	}
	w := &world{layout: layout, ledger: l, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), endpoints: cfg.Endpoints, services: cfg.Services,
		restarted: cfg.RestartOver > 0 && cfg.Services > 1, routeFraction: cfg.RouteChanges}
	if cfg.Routes > 0 || cfg.Policies > 0 {
		var err error
		if w.plan, err = newTrafficPlan(cfg.Clusters, cfg.Services, cfg.Routes, cfg.Policies, seed); err != nil {
			return nil, err
		}
	}
	if cfg.Routes > 0 {
		w.routes, w.weights = newLedger(l.start, 1, cfg.Services), make([]int32, cfg.Services)
		for _, s := range w.plan.routed {
			w.weights[s] = initialRouteWeight
			if _, err := w.routes.record(0, s, initialRouteWeight, kindInitial, time.Now()); err != nil {
				return nil, err
			}
		}
	} else if cfg.RouteChanges > 0 {
		return nil, fmt.Errorf("route changes need routes")
	}
	for c := range cfg.Clusters {
		cl := &simCluster{index: c, id: clusterID(c), region: regionOf(c),
			shards: make([]*registry.Shard, cfg.Services), state: make(federation.State, cfg.Services+1), out: federation.NewChanges(), origins: federation.NewOrigins()}
		w.clusters = append(w.clusters, cl)
		for s := range cfg.Services {
			n := cfg.Endpoints
			if w.isRestarted(c, s) {
				n = cfg.RestartEndpoints
			}
			eps := make([]registry.Endpoint, 0, n)
			for range n {
				eps = append(eps, w.freshEndpoint(cl))
			}
			sh := w.shard(cl, s, eps)
			cl.shards[s], cl.state[sh.Service] = sh, sh
			if _, err := l.record(c, s, fingerprint(layout, sh.Endpoints), kindInitial, time.Now()); err != nil {
				return nil, err
			}
		}
		if c == 0 && echo.IsValid() {
			sh := &registry.Shard{Cluster: cl.id, Service: echoKey, ExportedAt: exportedAt, Ports: servicePorts,
				Endpoints: []registry.Endpoint{{Addresses: []netip.Addr{echo.Addr()},
					Ports:    []registry.EndpointPort{{Name: "grpc", Port: int32(echo.Port())}},
					Locality: registry.Locality{Region: cl.region, Zone: zoneOf(cl.region, 0)}, Conditions: ready}}}
			sh.Normalize()
			cl.state[echoKey] = sh
		}
		cl.out.Set(maps.Clone(cl.state))
	}
	return w, nil
}

// endpointCount is how many endpoints the world holds now (echo included).
func (w *world) endpointCount() int {
	n := 0
	for _, cl := range w.clusters {
		for _, sh := range cl.state {
			n += len(sh.Endpoints)
		}
	}
	return n
}

// shard is the state of service s in cluster cl with endpoints eps, and
// the cluster's route and policy of it, if it carries them.
func (w *world) shard(cl *simCluster, s int, eps []registry.Endpoint) *registry.Shard {
	sh := &registry.Shard{Cluster: cl.id, Service: serviceKey(s), ExportedAt: exportedAt, Ports: servicePorts, Endpoints: eps}
	if w.plan != nil {
		var weight int32
		if w.weights != nil {
			weight = w.weights[s]
		}
		sh.Traffic = w.plan.set(cl.index, s, weight)
	}
	sh.Normalize()
	return sh
}

// freshEndpoint is a ready endpoint with an address never used before.
func (w *world) freshEndpoint(cl *simCluster) registry.Endpoint {
	cl.next++
	cl.zone++
	return registry.Endpoint{
		Addresses: []netip.Addr{w.layout.addr(cl.index, cl.next)}, Ports: endpointPorts,
		Locality: registry.Locality{Region: cl.region, Zone: zoneOf(cl.region, cl.zone)}, Conditions: ready,
	}
}

// fingerprint is the fingerprint of the healthy endpoints of a shard (see ledger.go).
func fingerprint(layout addrLayout, eps []registry.Endpoint) uint64 {
	var fp uint64
	for i := range eps {
		if !eps[i].Conditions.Ready {
			continue
		}
		for _, a := range eps[i].Addresses {
			if ip, ok := ipv4(a); ok {
				fp += endpointHash(ip, endpointPort)
			}
		}
	}
	return fp
}

func healthy(eps []registry.Endpoint) int {
	n := 0
	for i := range eps {
		if eps[i].Conditions.Ready {
			n++
		}
	}
	return n
}

// tryChange computes the endpoints after a change of the given kind, or false
// when the kind is not possible now (bounds, or no healthy endpoint left).
func (w *world) tryChange(cl *simCluster, cur []registry.Endpoint, kind changeKind) ([]registry.Endpoint, bool) {
	lo, hi := max(1, w.endpoints/2), max(2, 2*w.endpoints)
	eps := slices.Clone(cur)
	switch kind {
	case kindFlip:
		i := w.rng.IntN(len(eps))
		if eps[i].Conditions.Ready {
			eps[i].Conditions = notReady
		} else {
			eps[i].Conditions = ready
		}
	case kindScaleUp:
		if len(eps) >= hi {
			return nil, false
		}
		eps = append(eps, w.freshEndpoint(cl))
	case kindScaleDown:
		if len(eps) <= lo {
			return nil, false
		}
		i := w.rng.IntN(len(eps))
		eps = slices.Delete(eps, i, i+1)
	case kindReplace, kindRestart:
		i := w.rng.IntN(len(eps))
		e := w.freshEndpoint(cl)
		e.Locality = eps[i].Locality
		eps[i] = e
	}
	return eps, healthy(eps) > 0
}

// randomChange makes one random, client-visible change to service s of
// cluster c and hands the cluster's new state to its publisher.
func (w *world) randomChange(c, s int) (changeKind, error) {
	cl := w.clusters[c]
	cur := cl.shards[s].Endpoints
	for range 8 {
		var kind changeKind
		switch r := w.rng.Float64(); {
		case r < 0.5:
			kind = kindFlip
		case r < 0.75:
			kind = kindScaleUp
		default:
			kind = kindScaleDown
		}
		eps, ok := w.tryChange(cl, cur, kind)
		if !ok {
			continue
		}
		if fp := fingerprint(w.layout, eps); !w.ledger.seen(c, s, fp) {
			return kind, w.commit(cl, s, eps, fp, kind)
		}
	}
	// Every state with a never-used address is new.
	eps, _ := w.tryChange(cl, cur, kindReplace)
	return kindReplace, w.commit(cl, s, eps, fingerprint(w.layout, eps), kindReplace)
}

// isRestarted reports whether (c, s) is the rolling restart's service.
func (w *world) isRestarted(c, s int) bool { return w.restarted && c == 0 && s == 0 }

// restartStep replaces the endpoint with address old (if service s of
// cluster c still has it) by a ready one with a new address, as a rolling
// restart does; false when old is gone.
func (w *world) restartStep(c, s int, old netip.Addr) (bool, error) {
	cl := w.clusters[c]
	eps := slices.Clone(cl.shards[s].Endpoints)
	i := slices.IndexFunc(eps, func(e registry.Endpoint) bool { return slices.Contains(e.Addresses, old) })
	if i < 0 {
		return false, nil
	}
	e := w.freshEndpoint(cl)
	e.Locality = eps[i].Locality
	eps[i] = e
	return true, w.commit(cl, s, eps, fingerprint(w.layout, eps), kindRestart)
}

// addresses returns the addresses service s of cluster c has now.
func (w *world) addresses(c, s int) []netip.Addr {
	var out []netip.Addr
	for _, e := range w.clusters[c].shards[s].Endpoints {
		out = append(out, e.Addresses...)
	}
	return out
}

// commit records the new state of (cl, s) in the ledger and hands it over.
func (w *world) commit(cl *simCluster, s int, eps []registry.Endpoint, fp uint64, kind changeKind) error {
	if cl.next >= w.layout.capacity() {
		return fmt.Errorf("cluster %s ran out of addresses", cl.id)
	}
	sh := w.shard(cl, s, eps)
	if _, err := w.ledger.record(cl.index, s, fp, kind, time.Now()); err != nil {
		return err
	}
	w.hand(cl, s, sh)
	return nil
}

// hand makes sh the state of service s in cl and hands it to the publisher.
func (w *world) hand(cl *simCluster, s int, sh *registry.Shard) {
	cl.shards[s], cl.state[sh.Service] = sh, sh
	cl.origins.Saw(sh.Service, "", time.Time{})
	cl.out.Apply(federation.State{sh.Service: sh}, nil)
}

// churnResult is what the churn did.
type churnResult struct {
	Changes     int              // changes handed over
	ByKind      map[string]int   // changes by kind
	Elapsed     time.Duration    // from the start of the churn to its last change
	MaxLag      time.Duration    // how far behind its schedule the churn ever ran
	Restart     string           // the service restarted ("" none)
	RestartSpan [2]time.Duration // when the restart ran, since the ledger's start
	started     time.Time
	kinds       map[changeKind]int
	perCluster  []int // changes per cluster
}

// churn makes rate random changes per second, spread uniformly over clusters
// and services, for d; with restartOver > 0 it also restarts service 0 of
// cluster 0 (replaces every endpoint's address, one by one, over restartOver,
// starting a third of the way in). With a route fraction, each cycle of
// the churn (routeCycle) gives its first share to route changes (a random
// routed service's weights move), the rest to endpoint changes.
func (w *world) churn(ctx context.Context, rate float64, d, restartOver time.Duration) (churnResult, error) {
	res := churnResult{kinds: map[changeKind]int{}, perCluster: make([]int, len(w.clusters)), started: time.Now()}
	start := res.started
	interval := time.Duration(float64(time.Second) / rate)
	nextRandom := start
	var plan []netip.Addr
	var restartStart, step time.Duration
	nextRestart := time.Time{}
	if restartOver > 0 {
		plan = w.addresses(0, 0)
		restartStart = d / 3
		step = restartOver / time.Duration(max(len(plan), 1))
		nextRestart = start.Add(restartStart)
		res.Restart = string(w.clusters[0].id) + "/" + serviceKey(0).String()
	}
	end := start.Add(d)
	cycle, lastRoute, marked := routeCycle(d), false, false
	if w.routeFraction > 0 && w.routes == nil {
		return res, fmt.Errorf("route changes need routes")
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		next := nextRandom
		isRestart := len(plan) > 0 && nextRestart.Before(nextRandom)
		if isRestart {
			next = nextRestart
		}
		if !next.Before(end) {
			break
		}
		if wait := time.Until(next); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return res, ctx.Err()
		}
		res.MaxLag = max(res.MaxLag, time.Since(next))
		if isRestart {
			old := plan[0]
			plan = plan[1:]
			nextRestart = nextRestart.Add(step)
			if res.RestartSpan[0] == 0 {
				res.RestartSpan[0] = w.ledger.since(time.Now())
				if w.onRestart != nil {
					w.onRestart(true)
				}
			}
			ok, err := w.restartStep(0, 0, old)
			if err != nil {
				return res, err
			}
			if ok {
				res.kinds[kindRestart]++
				res.perCluster[0]++
				res.Changes++
			}
			res.RestartSpan[1] = w.ledger.since(time.Now())
			if len(plan) == 0 && w.onRestart != nil {
				w.onRestart(false)
			}
			continue
		}
		isRoute := routeTurn(nextRandom.Sub(start), cycle, w.routeFraction)
		nextRandom = nextRandom.Add(interval)
		if w.onSegment != nil && (!marked || isRoute != lastRoute) {
			w.onSegment(isRoute)
		}
		lastRoute, marked = isRoute, true
		if isRoute {
			c, err := w.routeChange()
			if err != nil {
				return res, err
			}
			res.kinds[kindRoute]++
			res.perCluster[c]++
			res.Changes++
			continue
		}
		c, s := w.rng.IntN(len(w.clusters)), w.rng.IntN(w.services)
		for w.restarted && s == 0 {
			s = w.rng.IntN(w.services)
		}
		kind, err := w.randomChange(c, s)
		if err != nil {
			return res, err
		}
		res.kinds[kind]++
		res.perCluster[c]++
		res.Changes++
	}
	res.Elapsed = time.Since(start)
	res.ByKind = map[string]int{}
	for k, n := range res.kinds {
		res.ByKind[k.String()] = n
	}
	return res, nil
}

// publisherStatus follows one publisher's sessions.
type publisherStatus struct {
	mu       sync.Mutex
	cur      federation.SessionStatus
	sessions int // sessions opened so far
	// syncedIn is the session in which the hub last acknowledged the state
	// (its full state, or a resume); syncedAt when it first did in that session.
	syncedIn int
	syncedAt time.Time
}

func (p *publisherStatus) update(st federation.SessionStatus) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if st.Connected && !p.cur.Connected {
		p.sessions++
	}
	if st.Connected && st.Synced && p.syncedIn != p.sessions {
		p.syncedIn, p.syncedAt = p.sessions, now
	}
	p.cur = st
}

// snapshot returns the current status, the number of sessions so far, and
// when the current session synced (zero if it has not).
func (p *publisherStatus) snapshot() (federation.SessionStatus, int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var at time.Time
	if p.cur.Connected && p.syncedIn == p.sessions {
		at = p.syncedAt
	}
	return p.cur, p.sessions, at
}

// spokes are the running publishers, one per simulated cluster.
type spokes struct {
	status []*publisherStatus
	conns  []*grpc.ClientConn
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

// startSpokes runs a publisher per cluster against the hub's federation
// address, each over its own gRPC connection, until stop.
// Each dials from a loopback address of its own, over TLS with the
// configuration tlsFor returns for its cluster (nil: plaintext).
func startSpokes(ctx context.Context, w *world, fedAddr string, maxBackoff time.Duration, log *slog.Logger,
	tlsFor func(registry.ClusterID) *tls.Config, dial *peerDialing) (*spokes, error) {
	ctx, cancel := context.WithCancel(ctx)
	sp := &spokes{cancel: cancel}
	for i, cl := range w.clusters {
		var tlsCfg *tls.Config
		if tlsFor != nil {
			tlsCfg = tlsFor(cl.id)
		}
		conn, err := grpc.NewClient(fedAddr, dial.options(loopbackAddr(spokeBlock, i), tlsCfg)...)
		if err != nil {
			sp.stop()
			return nil, fmt.Errorf("spoke %s: %w", cl.id, err)
		}
		sp.conns = append(sp.conns, conn)
		cfg := federation.DefaultSpokeConfig()
		cfg.SpokeID, cfg.Build = "bench-"+string(cl.id), "bench"
		cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, maxBackoff
		st := &publisherStatus{}
		sp.status = append(sp.status, st)
		w := federation.SpokeWiring{Cluster: cl.id, Network: benchNetwork, Origins: cl.origins, Status: st.update}
		pub := federation.NewPublisher(cfg, w, conn, log.With("cluster", cl.id))
		sp.wg.Go(func() {
			if err := pub.Run(ctx, cl.out); err != nil {
				log.Error("publisher stopped", "cluster", cl.id, "err", err)
			}
		})
	}
	return sp, nil
}

// sessions returns how many sessions each publisher has opened.
func (sp *spokes) sessions() []int {
	out := make([]int, len(sp.status))
	for i, p := range sp.status {
		_, out[i], _ = p.snapshot()
	}
	return out
}

// syncedSince reports, when every publisher has a session later than
// after[i] that the hub acknowledged, the latest time one of them synced.
func (sp *spokes) syncedSince(after []int) (time.Time, bool) {
	var last time.Time
	for i, p := range sp.status {
		_, n, at := p.snapshot()
		if at.IsZero() || (after != nil && n <= after[i]) {
			return time.Time{}, false
		}
		if at.After(last) {
			last = at
		}
	}
	return last, true
}

func (sp *spokes) stop() {
	sp.cancel()
	sp.wg.Wait()
	for _, c := range sp.conns {
		_ = c.Close()
	}
}
