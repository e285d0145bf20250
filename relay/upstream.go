package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/internal/backoff"
	"github.com/navemesh/nave/internal/xdstype"
)

// dial returns the relay's connection to the hub (it connects on first
// use), shared by the upstream streams of every view.
func dial(cfg setup) (*grpc.ClientConn, error) {
	// The connection's own backoff follows BackoffMin and BackoffMax (grpc's
	// default starts at 1 s and grows to 120 s), and is reset when the hub's
	// port answers again (see view.run); the caller's options come after,
	// so they may override it.
	opts := append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: grpcbackoff.Config{BaseDelay: cfg.BackoffMin, Multiplier: 2, Jitter: 0.2, MaxDelay: cfg.BackoffMax},
		// Give a slow connection (a TLS handshake far away) time to complete.
		MinConnectTimeout: max(cfg.BackoffMax, minConnectTimeout),
	}),
		// A response for a large subscription (every assignment of a big
		// clusterset) passes grpc's default 4 MiB: refused, it would be
		// asked for again forever while the clients kept stale state.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxUpstreamMessage)),
	}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Upstream, opts...)
	if err != nil {
		return nil, fmt.Errorf("relay: dial %s: %w", cfg.Upstream, err)
	}
	return conn, nil
}

// run keeps the view's ADS stream to the hub until ctx ends, reconnecting
// with jittered exponential backoff, or as soon as the hub's port answers
// again. The view's local streams end when it returns.
func (v *view) run(ctx context.Context) {
	defer v.stopLocal()
	client := discovery.NewAggregatedDiscoveryServiceClient(v.conn)
	held := newHeldState()
	bc := backoff.Config{Min: v.cfg.BackoffMin, Max: v.cfg.BackoffMax, Target: v.cfg.Upstream}
	if v.conn != nil {
		bc.Conn = v.conn
	}
	retry := backoff.New(bc)
	failures := 0
	for {
		// No stream while no local client asks for anything: the hub ends a
		// stream that sends no request (its first-message deadline), and a
		// node without proxyless clients would be refused over and over.
		if !v.awaitSubscriptions(ctx, held) {
			return
		}
		served, err := v.session(ctx, client, held)
		if errors.Is(err, errIdle) {
			continue
		}
		v.cache.reset()
		v.upstreamMu.Lock()
		clear(v.upstreamSubs)
		v.upstreamMu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if served {
			retry.Reset()
			failures = 0
		}
		failures++
		v.metrics.reconnects.Inc()
		wait := retry.Next()
		// Warn when the hub goes away and now and then while it stays away, not on every attempt.
		level := slog.LevelDebug
		if failures&(failures-1) == 0 {
			level = slog.LevelWarn
		}
		v.log.Log(ctx, level, "upstream stream ended; serving the last good state", "upstream", v.cfg.Upstream, "err", err, "attempt", failures, "retry in", wait)
		// The wait ends early once the hub's port answers again.
		w := retry.Start(ctx, wait)
		<-w.Done()
		w.Stop()
		if ctx.Err() != nil {
			return
		}
		if w.Answered() {
			v.log.Info("upstream answers again; reconnecting now", "upstream", v.cfg.Upstream)
		}
	}
}

// minConnectTimeout is the least time a connection attempt to the hub is given.
const minConnectTimeout = 5 * time.Second

// maxUpstreamMessage bounds a response from the hub (which bounds none).
const maxUpstreamMessage = 1 << 30

// errIdle ends a session that had nothing to ask for.
var errIdle = errors.New("relay: no local subscription")

// idle says whether no local client subscribes to anything.
func idle(union map[string]subscription) bool {
	for _, sub := range union {
		if !sub.empty() {
			return false
		}
	}
	return true
}

// awaitSubscriptions returns true once some local client subscribes to
// something, false if ctx ends first. Meanwhile what no client wants
// leaves the caches after RetainUnwanted, as during a session.
func (v *view) awaitSubscriptions(ctx context.Context, held *heldState) bool {
	tick := v.cfg.Clock.NewTicker(v.tickInterval())
	defer tick.Stop()
	for {
		union := v.local.union()
		if !idle(union) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-v.changed:
		case now := <-tick.C():
			v.prune(held, union, now)
		}
	}
}

// tickInterval is how often retention and holds are looked at: often
// enough for both to end near their time, at most once a second.
func (v *view) tickInterval() time.Duration {
	return min(max(min(v.cfg.RetainUnwanted, v.cfg.HoldUnknown)/4, 10*time.Millisecond), time.Second)
}

// errPanic reports a recovered panic.
var errPanic = errors.New("relay: panic")

// heldState is what the caches hold, kept across upstream streams; owned
// by the goroutine running the view's run.
type heldState struct {
	// wire is, per type URL, the wire form of each resource the cache holds
	// (to skip unchanged ones).
	wire map[string]map[string][]byte
	// unwanted is, per type URL, since when each held resource no local
	// client wants has been unwanted.
	unwanted map[string]map[string]time.Time
}

func newHeldState() *heldState {
	h := &heldState{wire: map[string]map[string][]byte{}, unwanted: map[string]map[string]time.Time{}}
	for _, t := range relayedTypes {
		h.wire[t] = map[string][]byte{}
		h.unwanted[t] = map[string]time.Time{}
	}
	return h
}

// upstreamType is the state of one type on one upstream stream.
type upstreamType struct {
	// sent is what the last request asked for (valid when requested).
	sent      subscription
	requested bool
	// answerable is what every request the next response may answer asked
	// for: the intersection of the requests sent since the last response
	// (the ACK of that response included). A name missing from a full-state
	// response is deleted only if it is in answerable: the response may
	// answer an older request than the last, one that did not name it.
	answerable subscription
	// version is the last version ACKed, nonce the last nonce received.
	version, nonce string
	// reported holds the local rejections reported to the hub (each is
	// reported once, and forgotten when it ends); rejected says the relay's
	// last word to the hub is such a report, which an ACK ends once no
	// local client rejects. ownNACK says the relay's own NACK of the last
	// response stands (it is not overwritten by a report).
	reported map[rejectionKey]struct{}
	rejected bool
	ownNACK  bool
}

// session runs one upstream stream until it fails or ctx ends, and says
// whether the hub answered on it (which resets the backoff).
func (v *view) session(ctx context.Context, client discovery.AggregatedDiscoveryServiceClient, held *heldState) (served bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			v.log.Error("upstream session panicked", "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: %v", errPanic, p)
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Not WaitForReady: while the hub is unreachable each attempt fails at
	// once, so the failure (a refused connection, a bad certificate) is
	// logged; the connection's backoff follows BackoffMin and BackoffMax
	// (see dial), and run resets it when the hub's port answers again, so
	// the hub's return is noticed within about a probe interval.
	stream, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	responses := make(chan *discovery.DiscoveryResponse)
	recvErr := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				v.log.Error("upstream receiver panicked", "panic", p, "stack", string(debug.Stack()))
				recvErr <- fmt.Errorf("%w: %v", errPanic, p)
			}
		}()
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case responses <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()

	u := &upstream{view: v, stream: stream, held: held, types: map[string]*upstreamType{}, first: true}
	for _, t := range relayedTypes {
		u.types[t] = &upstreamType{reported: map[rejectionKey]struct{}{}}
	}
	if err := u.sync(); err != nil {
		return false, err
	}
	if u.first {
		// The last local subscription ended before the stream opened: a
		// stream that sends nothing is ended by the hub.
		return false, errIdle
	}
	v.connected.Inc()
	defer v.connected.Dec()
	v.log.Info("upstream stream open", "upstream", v.cfg.Upstream, "node", v.cfg.Node.GetId())
	// The ticker ends retention and holds that no event ends.
	tick := v.cfg.Clock.NewTicker(v.tickInterval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return served, ctx.Err()
		case now := <-tick.C():
			u.prune(v.local.union(), now)
			v.cache.release(now)
			// Rejections wait reportSettle: the tick reports them.
			if err := u.report(v.local.rejections(), now); err != nil {
				return served, err
			}
		case err := <-recvErr:
			return served, fmt.Errorf("receive: %w", err)
		case <-v.changed:
			if err := u.sync(); err != nil {
				return served, err
			}
		case resp := <-responses:
			served = true
			if err := u.handle(resp); err != nil {
				return served, err
			}
		}
	}
}

// upstream is one stream's state; owned by the goroutine running session.
type upstream struct {
	view   *view
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	held   *heldState
	types  map[string]*upstreamType
	// first is true until the first request (which carries the node) is sent.
	first bool
}

// sync asks the hub for the union of the local subscriptions where it
// changed, and drops from the caches what no local client has wanted for
// RetainUnwanted.
func (u *upstream) sync() error {
	v := u.view
	union := v.local.union()
	for _, t := range relayedTypes {
		want, st := union[t], u.types[t]
		if (!st.requested && want.empty()) || (st.requested && st.sent.equal(want)) {
			continue
		}
		if err := u.send(t, want, nil); err != nil {
			return err
		}
		if st.requested {
			st.answerable = st.answerable.intersect(want)
		} else {
			st.answerable = want
		}
		st.sent, st.requested = want, true
	}
	v.upstreamMu.Lock()
	clear(v.upstreamSubs)
	for t, st := range u.types {
		if st.requested {
			v.upstreamSubs[t] = st.sent
		}
	}
	v.upstreamMu.Unlock()
	now := v.cfg.Clock.Now()
	u.prune(union, now)
	return u.report(v.local.rejections(), now)
}

// report tells the hub of its local clients' rejections: a local client's
// NACK of a response is repeated upstream, once, as a NACK of the hub's
// last response (version_info is still the version the relay holds, so
// the hub resends nothing), naming the client and its error; an ACK
// follows once no local client rejects what it was last sent. The hub's
// NACK metrics and logs then count the clients behind the relay.
//
// A rejection is reported once it is reportSettle old and still stands: a
// client may NACK the previous state just as the relay hands it the next
// one, which may fix it (reported at once, it would be counted against the
// hub's response that fixes it). Rejections that come together go up as
// one NACK (naming the first) and count one each in the relay's metric.
func (u *upstream) report(rejections map[string][]rejection, now time.Time) error {
	v := u.view
	for _, t := range relayedTypes {
		st := u.types[t]
		if !st.requested || st.nonce == "" || st.ownNACK {
			continue
		}
		current := rejections[t]
		var fresh []rejection
		standing := make(map[rejectionKey]struct{}, len(current))
		for _, rj := range current {
			standing[rj.key] = struct{}{}
			if _, ok := st.reported[rj.key]; !ok && now.Sub(rj.at) >= reportSettle {
				fresh = append(fresh, rj)
			}
		}
		// Forget the rejections that ended; keep those reported.
		for key := range st.reported {
			if _, ok := standing[key]; !ok {
				delete(st.reported, key)
			}
		}
		var detail *rpcstatus.Status
		switch {
		case len(fresh) > 0:
			msg := fresh[0].message()
			if len(fresh) > 1 {
				msg += fmt.Sprintf(" (and %d more local clients)", len(fresh)-1)
			}
			detail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}
			v.metrics.reportedNACKs.WithLabelValues(typeLabel(t)).Add(float64(len(fresh)))
			v.log.Info("reporting local clients' rejections upstream", "type", typeLabel(t), "node", fresh[0].node, "new", len(fresh), "rejecting", len(current))
		case len(current) == 0 && st.rejected:
			v.log.Info("local clients no longer reject; ACK upstream", "type", typeLabel(t))
		default:
			continue
		}
		if err := u.send(t, st.sent, detail); err != nil {
			return err
		}
		for _, rj := range fresh {
			st.reported[rj.key] = struct{}{}
		}
		st.rejected = len(fresh) > 0
	}
	return nil
}

// reportSettle is how long a local rejection must stand before it is
// reported (see report).
const reportSettle = 100 * time.Millisecond

// prune drops from the caches what no local client has wanted for RetainUnwanted.
func (u *upstream) prune(union map[string]subscription, now time.Time) {
	u.view.prune(u.held, union, now)
}

// prune drops from the caches, and held, what no local client has wanted for RetainUnwanted.
func (v *view) prune(held *heldState, union map[string]subscription, now time.Time) {
	for _, t := range relayedTypes {
		want, unwanted := union[t], held.unwanted[t]
		var drop []string
		for name := range held.wire[t] {
			if want.wants(name) {
				delete(unwanted, name)
				continue
			}
			since, ok := unwanted[name]
			if !ok {
				unwanted[name] = now
			} else if now.Sub(since) >= v.cfg.RetainUnwanted {
				drop = append(drop, name)
			}
		}
		if len(drop) == 0 {
			continue
		}
		for _, name := range drop {
			delete(held.wire[t], name)
			delete(unwanted, name)
		}
		if err := v.caches[t].UpdateResources(nil, drop); err != nil {
			v.log.Error("drop unwanted resources", "type", typeLabel(t), "err", err)
		}
		v.cache.dropped(t, drop)
		v.log.Debug("dropped resources no local client wants", "type", typeLabel(t), "count", len(drop))
	}
}

// send sends a request for type t asking for sub, with the last ACKed
// version and last nonce; nack, if not nil, rejects the last response.
func (u *upstream) send(t string, sub subscription, nack *rpcstatus.Status) error {
	st := u.types[t]
	req := &discovery.DiscoveryRequest{
		TypeUrl:       t,
		ResourceNames: sub.requestNames(),
		VersionInfo:   st.version,
		ResponseNonce: st.nonce,
		ErrorDetail:   nack,
	}
	if u.first {
		req.Node = proto.CloneOf(u.view.cfg.Node)
		if req.Node.UserAgentName == "" {
			req.Node.UserAgentName = "nave-relay"
		}
		u.first = false
	}
	if err := u.stream.Send(req); err != nil {
		return fmt.Errorf("send %s request: %w", typeLabel(t), err)
	}
	return nil
}

// handle applies a response to the caches and ACKs it, or NACKs it if it
// cannot be decoded (the caches keep the last good state).
func (u *upstream) handle(resp *discovery.DiscoveryResponse) error {
	v := u.view
	t := resp.GetTypeUrl()
	label := typeLabel(t)
	v.metrics.upstreamResponses.WithLabelValues(label).Inc()
	st := u.types[t]
	if st == nil || !st.requested {
		// Never asked for on this stream: answering would subscribe to it (an
		// empty first request is a wildcard).
		v.log.Warn("upstream sent a type the relay did not ask for", "type", t)
		return nil
	}
	st.nonce = resp.GetNonce()
	err := u.receive(t, resp, st.sent, st.answerable)
	if err != nil {
		v.metrics.upstreamNACKs.WithLabelValues(label).Inc()
		v.log.Warn("rejecting an upstream response (NACK)", "type", label, "version", resp.GetVersionInfo(), "nonce", resp.GetNonce(), "err", err)
		st.answerable = st.sent
		st.ownNACK = true
		return u.send(t, st.sent, &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()})
	}
	st.ownNACK = false
	st.version = resp.GetVersionInfo()
	now := v.cfg.Clock.Now()
	v.cache.synced(t, now, st.answerable.wildcard)
	v.cache.release(now)
	// The next response answers this ACK or a later request.
	st.answerable = st.sent
	if err := u.send(t, st.sent, nil); err != nil {
		return err
	}
	// The ACK ends the report (the rejections reported are not reported
	// again: each is a local client's answer to one response).
	st.rejected = false
	return nil
}

// receive decodes resp and applies it to the caches; an error leaves them as they were.
func (u *upstream) receive(t string, resp *discovery.DiscoveryResponse, sent, answerable subscription) error {
	decoded, wire, err := decode(t, resp, u.held.wire[t])
	if err != nil {
		return err
	}
	u.apply(t, sent, answerable, decoded, wire)
	return nil
}

// apply updates the cache of type t: upserts what changed and, for types
// whose responses are full state (LDS, CDS), deletes what is absent.
// Resources neither in sent, the subscription last asked for, nor held are
// left out: a response that crossed an unsubscription brings what no client
// wants (but what the caches still hold is kept up to date). Only what
// answerable names can be deleted: retained resources are not asked for,
// and names added to the subscription since the last response may be
// missing from an answer to an older request.
func (u *upstream) apply(t string, sent, answerable subscription, decoded map[string]types.Resource, wire map[string][]byte) {
	held := u.held.wire[t]
	upserts := map[string]types.Resource{}
	added := []string{}
	for name, res := range decoded {
		_, isHeld := held[name]
		if !sent.wants(name) && !isHeld {
			continue
		}
		upserts[name] = res
		held[name] = wire[name]
		added = append(added, name)
	}
	var deletes []string
	if cache.ResourceRequiresFullStateInSotw(t) {
		for name := range held {
			if _, ok := wire[name]; !ok && answerable.wants(name) {
				deletes = append(deletes, name)
				delete(held, name)
				delete(u.held.unwanted[t], name)
			}
		}
	}
	if len(upserts) == 0 && len(deletes) == 0 {
		return
	}
	if err := u.view.caches[t].UpdateResources(upserts, deletes); err != nil {
		u.view.log.Error("update local cache", "type", typeLabel(t), "err", err)
	}
	u.view.cache.noteHeld(t, added, deletes)
	u.view.log.Debug("relayed upstream resources", "type", typeLabel(t), "changed", len(upserts), "deleted", len(deletes))
}

// decode reads resp, whose resources must all be of type t and named:
// wire holds every resource's bytes by name, and decoded the resources
// whose bytes differ from what held holds (a push to a relay subscribed
// to many resources changes few of them: decoding the others was most of
// the relay's work). What held holds decoded before, so it is valid.
func decode(t string, resp *discovery.DiscoveryResponse, held map[string][]byte) (map[string]types.Resource, map[string][]byte, error) {
	decoded := map[string]types.Resource{}
	wire := make(map[string][]byte, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		if a.GetTypeUrl() != t {
			return nil, nil, fmt.Errorf("resource %d has type %q in a %q response", i, a.GetTypeUrl(), t)
		}
		name, err := xdstype.WireName(a.GetValue())
		if err != nil {
			return nil, nil, fmt.Errorf("resource %d: %w", i, err)
		}
		if name == "" {
			return nil, nil, fmt.Errorf("resource %d has no name", i)
		}
		if _, dup := wire[name]; dup {
			return nil, nil, fmt.Errorf("resource %q appears twice", name)
		}
		wire[name] = a.GetValue()
		if old, ok := held[name]; ok && bytes.Equal(old, a.GetValue()) {
			continue
		}
		m := newResource(t)
		if m == nil {
			return nil, nil, fmt.Errorf("type %q is not relayed", t)
		}
		if err := proto.Unmarshal(a.GetValue(), m); err != nil {
			return nil, nil, fmt.Errorf("resource %d: %w", i, err)
		}
		if got := cache.GetResourceName(m); got != name {
			return nil, nil, fmt.Errorf("resource %d: named %q, decoded as %q", i, name, got)
		}
		decoded[name] = m
	}
	return decoded, wire, nil
}

func newResource(t string) types.Resource {
	switch t {
	case resource.ListenerType:
		return &listener.Listener{}
	case resource.RouteType:
		return &route.RouteConfiguration{}
	case resource.ClusterType:
		return &cluster.Cluster{}
	case resource.EndpointType:
		return &endpoint.ClusterLoadAssignment{}
	default:
		return nil
	}
}
