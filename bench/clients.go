package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/gateways"
	"github.com/navemesh/nave/xds"
)

// Lightweight ADS clients over real gRPC streams, speaking like grpc-go
// (LDS -> RDS -> CDS -> EDS by name) or like an Envoy gateway (wildcard CDS,
// EDS for every cluster), state of the world or delta, ACKing everything.

// profile is the kind of client.
type profile uint8

const (
	profileGRPC    profile = iota // proxyless gRPC: a few services by name, with a locality
	profileGateway                // gateway: every cluster, no locality
	profiles
)

func (p profile) String() string { return [...]string{"grpc", "gateway"}[p] }

// xDS types, in the order a gRPC client asks for them.
const (
	typeLDS = iota
	typeRDS
	typeCDS
	typeEDS
	types
)

var (
	typeURLs  = [types]string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}
	typeNames = [types]string{"lds", "rds", "cds", "eds"}
)

func typeIndex(url string) int { return slices.Index(typeURLs[:], url) }

// Phases tag what clients observe (stale or unknown states) by when they saw it.
const (
	phaseConnect = iota
	phaseChurn
	phaseWarmRestart
	phaseColdRestart
	phaseCatalogRestart // cold, with the cluster catalog kept (see catalog.go)
	phases
)

var phaseNames = [phases]string{"connect", "churn", "warm-restart", "cold-restart", "catalog-restart"}

// resourceNames maps bench services to their xDS names and back.
type resourceNames struct {
	listener []string // by service
	cluster  []string // by service: the Cluster, its EDS service name and its ClusterLoadAssignment
	service  map[string]int
	// byListener: service by listener (and route configuration) name.
	byListener map[string]int
}

func newResourceNames(services int) *resourceNames {
	n := &resourceNames{service: make(map[string]int, services), byListener: make(map[string]int, services)}
	for s := range services {
		n.listener = append(n.listener, xds.ListenerName(serviceKey(s), servicePort))
		n.byListener[n.listener[s]] = s
		c := xds.ClusterName(serviceKey(s), servicePort)
		n.cluster = append(n.cluster, c)
		n.service[c] = s
	}
	return n
}

// xdsCounters count what clients received, by profile and type.
type xdsCounters struct {
	responses, bytes, resources [profiles][types]atomic.Int64
}

// trafficSnapshot is a copy of the counters.
type trafficSnapshot struct {
	Responses, Bytes, Resources [profiles][types]int64
}

func (c *xdsCounters) snapshot() trafficSnapshot {
	var s trafficSnapshot
	for p := range profiles {
		for t := range types {
			s.Responses[p][t] = c.responses[p][t].Load()
			s.Bytes[p][t] = c.bytes[p][t].Load()
			s.Resources[p][t] = c.resources[p][t].Load()
		}
	}
	return s
}

func (s trafficSnapshot) minus(o trafficSnapshot) trafficSnapshot {
	for p := range profiles {
		for t := range types {
			s.Responses[p][t] -= o.Responses[p][t]
			s.Bytes[p][t] -= o.Bytes[p][t]
			s.Resources[p][t] -= o.Resources[p][t]
		}
	}
	return s
}

// sample is one converged (client, change) pair.
type sample struct {
	converged
	profile profile
}

// fleet is every ADS client and what they measured.
type fleet struct {
	ledger   *ledger
	layout   addrLayout
	names    *resourceNames
	clusters int
	delta    bool
	conns    []*grpc.ClientConn
	clients  []*adsClient
	counters xdsCounters
	phase    atomic.Int32
	// observed counts stale (obsOlder) and unknown states seen, by phase.
	observed [phases][2]atomic.Int64
	// streamErrors tallies the errors that ended client streams, by phase
	// (not the ones the bench ended itself).
	streamErrors [phases]errorTally
	// restarting is true while the rolling restart runs; restartPushes counts
	// the assignments of service 0 its subscribers received meanwhile.
	restarting    atomic.Bool
	restartPushes atomic.Int64

	// routes is the routes' ledger and plan which services carry one (nil:
	// no routes; see routes.go). routeObserved counts stale and unknown
	// route states seen, by phase; routeWatches is how many (gRPC client,
	// routed service) pairs there are, routeHolders how many of them have
	// seen the route.
	routes        *ledger
	plan          *trafficPlan
	routeObserved [phases][2]atomic.Int64
	routeWatches  int64
	routeHolders  atomic.Int64

	samplesMu sync.Mutex
	samples   []sample

	wg     sync.WaitGroup
	cancel context.CancelFunc
	ctx    context.Context
}

// fleetConfig says which clients to make.
type fleetConfig struct {
	GRPC, ServicesPerClient, Gateways int
	// Conns is how many gRPC connections the clients share (client i uses
	// connection i % Conns); each dials from a loopback address of its own.
	Conns int
	Delta bool
	Seed  uint64
	// TLS, when set, is the TLS configuration of connection j (mTLS: its
	// client certificate); nil: plaintext.
	TLS func(conn int) *tls.Config
	// Dial is how the connections dial (timeouts, backoff) and counts them.
	Dial *peerDialing
	// Routes and Plan, when set, are the world's routes' ledger and
	// traffic plan: gRPC clients then follow their services' routes.
	Routes *ledger
	Plan   *trafficPlan
}

// clientBackoff is the clients' reconnect backoff: fast (grpc-go's default
// starts at 1 s and grows to 120 s), so restarts measure the hub, not the
// backoff; a reconnect storm is all the harsher for it.
var clientBackoff = backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond}

// newFleet makes the clients (not yet connected) and counts each service's
// subscribers in the ledger.
func newFleet(ctx context.Context, cfg fleetConfig, sc scaleConfig, l *ledger, xdsAddr string) (*fleet, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := &fleet{ledger: l, layout: newAddrLayout(sc.Clusters), names: newResourceNames(sc.Services), clusters: sc.Clusters,
		delta: cfg.Delta, ctx: ctx, cancel: cancel, plan: cfg.Plan}
	if cfg.Routes != nil && cfg.Plan != nil {
		f.routes = cfg.Routes
	}
	for j := range max(cfg.Conns, 1) {
		var tlsCfg *tls.Config
		if cfg.TLS != nil {
			tlsCfg = cfg.TLS(j)
		}
		opts := append(cfg.Dial.options(loopbackAddr(clientBlock, j), tlsCfg), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
		conn, err := grpc.NewClient(xdsAddr, opts...)
		if err != nil {
			f.stop()
			return nil, fmt.Errorf("xDS connection: %w", err)
		}
		f.conns = append(f.conns, conn)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0xc1e7))
	nRegions := regions(sc.Clusters)
	k := min(cfg.ServicesPerClient, sc.Services)
	for i := range cfg.GRPC {
		region := fmt.Sprintf("region-%d", i%nRegions)
		node := &core.Node{Id: fmt.Sprintf("grpc-%04d", i),
			Locality: &core.Locality{Region: region, Zone: zoneOf(region, i/nRegions)}}
		services := rng.Perm(sc.Services)[:k]
		slices.Sort(services)
		f.clients = append(f.clients, f.newClient(profileGRPC, node, services))
	}
	all := make([]int, sc.Services)
	for s := range all {
		all[s] = s
	}
	for i := range cfg.Gateways {
		// Real east-west gateways of the network every simulated cluster is
		// on: served the gateway's own clusters and its network's endpoints
		// (here every endpoint, as for a client without locality).
		node := &core.Node{Id: fmt.Sprintf("gateway-%02d", i), Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			gateways.MetadataRole:    structpb.NewStringValue(gateways.RoleEastWest),
			gateways.MetadataNetwork: structpb.NewStringValue(benchNetwork),
		}}}
		f.clients = append(f.clients, f.newClient(profileGateway, node, all))
	}
	for _, c := range f.clients {
		for _, s := range c.services {
			l.subscribers[s]++
			// The gRPC clients watch their services' routes (RDS); gateways watch none.
			if f.routes != nil && c.prof == profileGRPC && f.plan.isRouted(s) {
				f.routes.subscribers[s]++
				f.routeWatches++
			}
		}
	}
	return f, nil
}

func (f *fleet) newClient(p profile, node *core.Node, services []int) *adsClient {
	c := &adsClient{f: f, id: len(f.clients), prof: p, node: node, services: services,
		held:          make([]int32, len(services)*f.clusters),
		fps:           make([]uint64, f.clusters),
		listenerRoute: map[string]string{}, routeClusters: map[string][]string{}, clusterEDS: map[string]string{},
	}
	if p == profileGRPC {
		c.slot = make(map[int]int, len(services))
		for i, s := range services {
			c.slot[s] = i
		}
		if f.routes != nil {
			c.routeHeld, c.routeSeen = make([]int32, len(services)), make([]bool, len(services))
		}
	}
	return c
}

// firstPerGroup returns the clients that open each locality group: one
// gRPC client per (region, zone) and the first gateway.
func (f *fleet) firstPerGroup(regions int) []int {
	var out []int
	seenGateway := false
	for i, c := range f.clients {
		switch {
		case c.prof == profileGRPC && i < regions*len(zoneSuffixes):
			out = append(out, i)
		case c.prof == profileGateway && !seenGateway:
			out, seenGateway = append(out, i), true
		}
	}
	return out
}

// start connects the clients at the given indices.
func (f *fleet) start(indices []int) {
	for _, i := range indices {
		c := f.clients[i]
		conn := f.conns[i%len(f.conns)]
		f.wg.Go(func() { c.run(f.ctx, conn) })
	}
}

// complete reports, when every client at indices holds the latest state of
// every service it subscribes to on a stream that completed after t, the
// time the last one got there; and how many are complete.
func (f *fleet) complete(indices []int, after time.Duration) (last time.Duration, done int) {
	for _, i := range indices {
		at := time.Duration(f.clients[i].completeAt.Load())
		if at > after {
			done++
			last = max(last, at)
		}
	}
	return last, done
}

// completionTimes returns, for the clients at indices that completed after
// t, how long after t each did.
func (f *fleet) completionTimes(indices []int, after time.Duration) []time.Duration {
	var out []time.Duration
	for _, i := range indices {
		if at := time.Duration(f.clients[i].completeAt.Load()); at > after {
			out = append(out, at-after)
		}
	}
	return out
}

func (f *fleet) record(p profile, conv []converged) {
	if len(conv) == 0 {
		return
	}
	f.samplesMu.Lock()
	for _, c := range conv {
		f.samples = append(f.samples, sample{converged: c, profile: p})
	}
	f.samplesMu.Unlock()
}

// takeSamples returns every converged pair recorded so far.
func (f *fleet) takeSamples() []sample {
	f.samplesMu.Lock()
	defer f.samplesMu.Unlock()
	return slices.Clone(f.samples)
}

func (f *fleet) stop() {
	f.cancel()
	f.wg.Wait()
	for _, c := range f.conns {
		_ = c.Close()
	}
}

// adsClient is one simulated xDS client. Its fields are owned by its
// goroutine, except the atomics.
type adsClient struct {
	f        *fleet
	id       int
	prof     profile
	node     *core.Node
	services []int       // the services it subscribes to (gateway: all)
	slot     map[int]int // service -> index in services (nil: the service is its own index)
	// held is the generation held of each (slot, cluster): slot*clusters + cluster.
	held []int32
	fps  []uint64 // scratch: fingerprints by cluster
	conv []converged
	// routeHeld is the route generation held, by slot (gRPC clients with
	// routes only); routeSeen whether the slot's route was ever seen.
	routeHeld []int32
	routeSeen []bool

	// What it learned: kept across streams, like a real client's watches.
	listenerRoute map[string]string   // listener -> route configuration
	routeClusters map[string][]string // route configuration -> clusters
	clusterEDS    map[string]string   // cluster -> EDS service name

	// Per stream: which slots hold the latest state of every cluster.
	matched  []bool
	nMatched int

	// completeAt is when (since the ledger's start) the current stream first
	// held the latest state of every subscribed service; 0 until it does.
	completeAt atomic.Int64
}

func (c *adsClient) slotOf(s int) (int, bool) {
	if c.slot == nil {
		return s, s < len(c.services)
	}
	i, ok := c.slot[s]
	return i, ok
}

// run keeps a stream open until ctx ends, reconnecting after errors.
func (c *adsClient) run(ctx context.Context, conn *grpc.ClientConn) {
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	for ctx.Err() == nil {
		if err := c.session(ctx, ads); err != nil && ctx.Err() == nil {
			c.f.streamErrors[c.f.phase.Load()].add(streamErrorKey(err), err.Error())
		}
		c.completeAt.Store(0)
		// The connection backs off by itself (streams wait for it to be
		// ready); this only keeps a refused stream from spinning.
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(10+rand.IntN(40)) * time.Millisecond):
		}
	}
}

// want returns the names the client subscribes to for type t, and whether it subscribes at all.
func (c *adsClient) want(t int) ([]string, bool) {
	var out []string
	switch {
	case c.prof == profileGateway && t == typeCDS:
		return nil, true // wildcard
	case c.prof == profileGateway && t != typeEDS:
		return nil, false
	case t == typeLDS:
		for _, s := range c.services {
			out = append(out, c.f.names.listener[s])
		}
		return out, true
	case t == typeRDS:
		for _, s := range c.services {
			if r, ok := c.listenerRoute[c.f.names.listener[s]]; ok {
				out = append(out, r)
			}
		}
	case t == typeCDS:
		for _, r := range c.want2(typeRDS) {
			out = append(out, c.routeClusters[r]...)
		}
	case t == typeEDS:
		clusters := c.want2(typeCDS)
		if c.prof == profileGateway {
			clusters = nil
			for name := range c.clusterEDS {
				clusters = append(clusters, name)
			}
		}
		for _, cl := range clusters {
			if e, ok := c.clusterEDS[cl]; ok {
				out = append(out, e)
			}
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	return out, len(out) > 0
}

func (c *adsClient) want2(t int) []string { names, _ := c.want(t); return names }

func (c *adsClient) session(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var tr transport
	if c.f.delta {
		s, err := ads.DeltaAggregatedResources(ctx, grpc.WaitForReady(true))
		if err != nil {
			return err
		}
		tr = &deltaTransport{stream: s, node: c.node, subs: map[int]map[string]bool{}}
	} else {
		s, err := ads.StreamAggregatedResources(ctx, grpc.WaitForReady(true))
		if err != nil {
			return err
		}
		tr = &sotwTransport{stream: s, node: c.node, subs: map[int][]string{}}
	}
	c.matched, c.nMatched = make([]bool, len(c.services)), 0
	for t := range types {
		if names, ok := c.want(t); ok {
			if err := tr.subscribe(t, names); err != nil {
				return err
			}
		}
	}
	for {
		r, err := tr.recv()
		if err != nil {
			return err
		}
		if err := c.handle(tr, r); err != nil {
			return err
		}
	}
}

// handle takes one response: counts it, ACKs it, follows what it names.
func (c *adsClient) handle(tr transport, r response) error {
	now := time.Now()
	t := r.typ
	if t < 0 {
		return tr.ack(r) // not a type we asked for
	}
	cnt := &c.f.counters
	cnt.responses[c.prof][t].Add(1)
	cnt.bytes[c.prof][t].Add(int64(r.size))
	cnt.resources[c.prof][t].Add(int64(len(r.resources)))
	if err := tr.ack(r); err != nil {
		return err
	}
	switch t {
	case typeLDS:
		if r.full {
			clear(c.listenerRoute)
		}
		for _, name := range r.removed {
			delete(c.listenerRoute, name)
		}
		for _, a := range r.resources {
			var l listener.Listener
			var m hcm.HttpConnectionManager
			if a.UnmarshalTo(&l) != nil || l.GetApiListener().GetApiListener().UnmarshalTo(&m) != nil {
				continue
			}
			c.listenerRoute[l.GetName()] = m.GetRds().GetRouteConfigName()
		}
	case typeRDS:
		for _, name := range r.removed {
			delete(c.routeClusters, name)
		}
		for _, a := range r.resources {
			var rc route.RouteConfiguration
			if a.UnmarshalTo(&rc) != nil {
				continue
			}
			var clusters []string
			for _, vh := range rc.GetVirtualHosts() {
				for _, rt := range vh.GetRoutes() {
					if cl := rt.GetRoute().GetCluster(); cl != "" {
						clusters = append(clusters, cl)
					}
					for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
						clusters = append(clusters, wc.GetName())
					}
				}
			}
			c.routeClusters[rc.GetName()] = clusters
			if c.f.routes != nil && c.prof == profileGRPC {
				c.routeConfig(&rc, now)
			}
		}
	case typeCDS:
		if r.full {
			clear(c.clusterEDS)
		}
		for _, name := range r.removed {
			delete(c.clusterEDS, name)
		}
		for _, a := range r.resources {
			var cl cluster.Cluster
			if a.UnmarshalTo(&cl) != nil {
				continue
			}
			c.clusterEDS[cl.GetName()] = cmpOr(cl.GetEdsClusterConfig().GetServiceName(), cl.GetName())
		}
	case typeEDS:
		phase := int(c.f.phase.Load())
		for _, a := range r.resources {
			c.assignment(a.GetValue(), now, phase)
		}
		return nil
	}
	// Follow what changed downstream of this type.
	for next := t + 1; next < types; next++ {
		names, ok := c.want(next)
		if ok && !slices.Equal(names, tr.subscribed(next)) {
			if err := tr.subscribe(next, names); err != nil {
				return err
			}
		}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// assignment compares a ClusterLoadAssignment with the ledger, cluster by cluster.
func (c *adsClient) assignment(cla []byte, now time.Time, phase int) {
	clear(c.fps)
	name, err := scanAssignment(cla, func(addr string, port uint32, health core.HealthStatus) {
		if health != core.HealthStatus_HEALTHY && health != core.HealthStatus_UNKNOWN {
			return
		}
		a, err := netip.ParseAddr(addr)
		if err != nil {
			return
		}
		ip, ok := ipv4(a)
		if !ok {
			return
		}
		if ci, ok := c.f.layout.cluster(ip); ok && ci < len(c.fps) {
			c.fps[ci] += endpointHash(ip, port)
		}
	})
	if err != nil {
		return
	}
	s, ok := c.f.names.service[name]
	if !ok {
		return // not a bench service (echo)
	}
	slot, ok := c.slotOf(s)
	if !ok {
		return
	}
	if s == 0 && c.f.restarting.Load() {
		c.f.restartPushes.Add(1)
	}
	latest := true
	c.conv = c.conv[:0]
	for ci, fp := range c.fps {
		var obs observation
		c.conv, obs = c.f.ledger.observe(ci, s, fp, &c.held[slot*c.f.clusters+ci], now, c.conv)
		switch obs {
		case obsOlder:
			c.f.observed[phase][0].Add(1)
		case obsUnknown:
			c.f.observed[phase][1].Add(1)
		}
		if fp != c.f.ledger.latest(ci, s) {
			latest = false
		}
	}
	c.f.record(c.prof, c.conv)
	if latest != c.matched[slot] {
		c.matched[slot] = latest
		if latest {
			c.nMatched++
		} else {
			c.nMatched--
		}
	}
	if c.nMatched == len(c.services) && c.completeAt.Load() == 0 {
		c.completeAt.Store(int64(max(c.f.ledger.since(now), 1)))
	}
}

// routeConfig compares a RouteConfiguration of a routed service the client
// subscribes to with the routes' ledger.
func (c *adsClient) routeConfig(rc *route.RouteConfiguration, now time.Time) {
	s, ok := c.f.names.byListener[rc.GetName()]
	if !ok || !c.f.plan.isRouted(s) {
		return
	}
	slot, ok := c.slotOf(s)
	if !ok {
		return
	}
	phase := c.f.phase.Load()
	fp, ok := routeMarker(rc, c.f.names.cluster[s])
	if !ok {
		c.f.routeObserved[phase][1].Add(1) // served without its route
		return
	}
	var obs observation
	c.conv, obs = c.f.routes.observe(0, s, fp, &c.routeHeld[slot], now, c.conv[:0])
	switch obs {
	case obsOlder:
		c.f.routeObserved[phase][0].Add(1)
	case obsUnknown:
		c.f.routeObserved[phase][1].Add(1)
		return
	}
	if !c.routeSeen[slot] {
		c.routeSeen[slot] = true
		c.f.routeHolders.Add(1)
	}
	c.f.record(c.prof, c.conv)
}

// response is a DiscoveryResponse or DeltaDiscoveryResponse, reduced to what clients use.
type response struct {
	typ       int // index in typeURLs, -1 for another type
	typeURL   string
	resources []*anypb.Any
	removed   []string
	version   string
	nonce     string
	size      int  // encoded bytes
	full      bool // state of the world: resources are everything (meaningful for LDS and CDS)
}

// transport is one ADS stream, state of the world or delta.
type transport interface {
	// subscribe sets the names subscribed for type t (nil: wildcard).
	subscribe(t int, names []string) error
	subscribed(t int) []string
	ack(r response) error
	recv() (response, error)
}

type sotwTransport struct {
	stream   discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node     *core.Node
	nodeSent bool
	subs     map[int][]string
	version  [types]string
	nonce    [types]string
}

func (s *sotwTransport) send(t int) error {
	req := &discovery.DiscoveryRequest{TypeUrl: typeURLs[t], ResourceNames: s.subs[t], VersionInfo: s.version[t], ResponseNonce: s.nonce[t]}
	if !s.nodeSent {
		req.Node, s.nodeSent = s.node, true
	}
	return s.stream.Send(req)
}

func (s *sotwTransport) subscribe(t int, names []string) error {
	s.subs[t] = names
	return s.send(t)
}

func (s *sotwTransport) subscribed(t int) []string { return s.subs[t] }

func (s *sotwTransport) ack(r response) error {
	if r.typ < 0 {
		return nil
	}
	s.version[r.typ], s.nonce[r.typ] = r.version, r.nonce
	return s.send(r.typ)
}

func (s *sotwTransport) recv() (response, error) {
	m, err := s.stream.Recv()
	if err != nil {
		return response{}, err
	}
	return response{typ: typeIndex(m.GetTypeUrl()), typeURL: m.GetTypeUrl(), resources: m.GetResources(),
		version: m.GetVersionInfo(), nonce: m.GetNonce(), size: proto.Size(m), full: true}, nil
}

type deltaTransport struct {
	stream   discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node     *core.Node
	nodeSent bool
	subs     map[int]map[string]bool
	names    [types][]string
}

func (d *deltaTransport) subscribe(t int, names []string) error {
	req := &discovery.DeltaDiscoveryRequest{TypeUrl: typeURLs[t]}
	cur := d.subs[t]
	if cur == nil {
		cur = map[string]bool{}
		d.subs[t] = cur
	}
	next := make(map[string]bool, len(names))
	for _, n := range names {
		next[n] = true
		if !cur[n] {
			req.ResourceNamesSubscribe = append(req.ResourceNamesSubscribe, n)
		}
	}
	for n := range cur {
		if !next[n] {
			req.ResourceNamesUnsubscribe = append(req.ResourceNamesUnsubscribe, n)
		}
	}
	d.subs[t], d.names[t] = next, names
	if !d.nodeSent {
		req.Node, d.nodeSent = d.node, true
	}
	return d.stream.Send(req)
}

func (d *deltaTransport) subscribed(t int) []string { return d.names[t] }

func (d *deltaTransport) ack(r response) error {
	return d.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.typeURL, ResponseNonce: r.nonce})
}

func (d *deltaTransport) recv() (response, error) {
	m, err := d.stream.Recv()
	if err != nil {
		return response{}, err
	}
	r := response{typ: typeIndex(m.GetTypeUrl()), typeURL: m.GetTypeUrl(), removed: m.GetRemovedResources(),
		version: m.GetSystemVersionInfo(), nonce: m.GetNonce(), size: proto.Size(m)}
	for _, res := range m.GetResources() {
		if res.GetResource() != nil {
			r.resources = append(r.resources, res.GetResource())
		}
	}
	return r, nil
}
