package relay

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"github.com/prometheus/client_golang/prometheus"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

// startScriptedHub serves a scriptedHub on its own listener.
func startScriptedHub(t *testing.T) (*scriptedHub, string) {
	t.Helper()
	h := &scriptedHub{requests: make(chan *discovery.DiscoveryRequest, 64), responses: make(chan *discovery.DiscoveryResponse)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, h)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return h, lis.Addr().String()
}

// next returns the next request the relay sent the hub.
func (h *scriptedHub) next(ctx context.Context, t *testing.T, what string) *discovery.DiscoveryRequest {
	t.Helper()
	select {
	case req := <-h.requests:
		return req
	case <-ctx.Done():
		t.Fatalf("no upstream request: %s", what)
		return nil
	}
}

// nextNames is next, checking the request's type and resource names.
func (h *scriptedHub) nextNames(ctx context.Context, t *testing.T, what, typeURL string, names ...string) *discovery.DiscoveryRequest {
	t.Helper()
	req := h.next(ctx, t, what)
	if req.GetTypeUrl() != typeURL || !slices.Equal(slices.Sorted(slices.Values(req.GetResourceNames())), names) {
		t.Fatalf("%s: upstream request for %s %v, want %s %v", what, typeLabel(req.GetTypeUrl()), req.GetResourceNames(), typeLabel(typeURL), names)
	}
	return req
}

func (h *scriptedHub) respond(ctx context.Context, t *testing.T, resp *discovery.DiscoveryResponse) {
	t.Helper()
	select {
	case h.responses <- resp:
	case <-ctx.Done():
		t.Fatal("the scripted hub's stream is gone")
	}
}

// ldsResponse is a listener response carrying listeners named names (statPrefix tells versions apart).
func ldsResponse(t *testing.T, version, nonce, statPrefix string, names ...string) *discovery.DiscoveryResponse {
	t.Helper()
	resp := &discovery.DiscoveryResponse{TypeUrl: resource.ListenerType, VersionInfo: version, Nonce: nonce}
	for _, name := range names {
		a, err := anypb.New(&listener.Listener{Name: name, StatPrefix: statPrefix})
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

// rawClient is a hand-driven local ADS stream.
type rawClient struct {
	stream    discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	responses chan *discovery.DiscoveryResponse
	done      chan error // the stream's end
	cancel    context.CancelFunc
}

// openRaw opens a local stream to the relay and sends its first request.
func openRaw(ctx context.Context, t *testing.T, relayAddr, node, typeURL string, names ...string) *rawClient {
	t.Helper()
	return openRawNode(ctx, t, relayAddr, &core.Node{Id: node}, typeURL, names...)
}

// openRawNode is openRaw for a node given whole.
func openRawNode(ctx context.Context, t *testing.T, relayAddr string, node *core.Node, typeURL string, names ...string) *rawClient {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	s := dialLocal(ctx, t, relayAddr)
	c := &rawClient{stream: s, responses: make(chan *discovery.DiscoveryResponse, 1024), done: make(chan error, 1), cancel: cancel}
	go func() {
		for {
			resp, err := s.Recv()
			if err != nil {
				c.done <- err
				return
			}
			select {
			case c.responses <- resp:
			default: // a flood: the test counts what it can
			}
		}
	}()
	c.send(t, &discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names})
	return c
}

func (c *rawClient) send(t *testing.T, req *discovery.DiscoveryRequest) {
	t.Helper()
	if err := c.stream.Send(req); err != nil {
		t.Fatal(err)
	}
}

func (c *rawClient) recv(ctx context.Context, t *testing.T, what string) *discovery.DiscoveryResponse {
	t.Helper()
	select {
	case resp := <-c.responses:
		return resp
	case err := <-c.done:
		t.Fatalf("%s: the stream ended: %v", what, err)
	case <-ctx.Done():
		t.Fatalf("%s: no response", what)
	}
	return nil
}

// ack ACKs resp, keeping names.
func (c *rawClient) ack(t *testing.T, resp *discovery.DiscoveryResponse, names ...string) {
	t.Helper()
	c.send(t, &discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResourceNames: names, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
}

// end returns the error that ends the stream; a response first fails the test.
func (c *rawClient) end(ctx context.Context, t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.done:
		return err
	case resp := <-c.responses:
		t.Fatalf("got a response (%s), want the stream ended", typeLabel(resp.GetTypeUrl()))
	case <-ctx.Done():
		t.Fatal("the stream never ended")
	}
	return nil
}

// quiet fails the test if a response comes within d.
func (c *rawClient) quiet(t *testing.T, what string, d time.Duration) {
	t.Helper()
	select {
	case resp := <-c.responses:
		t.Fatalf("%s: got a response with %v", what, listenerNames(t, resp.GetResources()))
	case <-time.After(d):
	}
}

// held returns the names the relay's cache of type typeURL holds.
func held(r *Relay, typeURL string) []string {
	var out []string
	for name := range r.node.caches[typeURL].GetResources() {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// TestRelayKeepsWhatAnOlderAnswerDoesNotName: a hub response
// that answers a request sent before a name was added to the subscription
// does not delete that name; the next one, which answers a request naming
// it, does (listeners are full state).
func TestRelayKeepsWhatAnOlderAnswerDoesNotName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	relay, _, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"), func(c *setup) { c.RetainUnwanted = time.Minute })
	lds := resource.ListenerType

	_ = openRaw(ctx, t, relayAddr, "c1", lds, "A")
	h.nextNames(ctx, t, "c1's subscription", lds, "A")
	h.respond(ctx, t, ldsResponse(t, "v1", "n1", "", "A"))
	h.nextNames(ctx, t, "the ACK of n1", lds, "A")

	c2 := openRaw(ctx, t, relayAddr, "c2", lds, "B")
	h.nextNames(ctx, t, "c2's subscription", lds, "A", "B")
	h.respond(ctx, t, ldsResponse(t, "v2", "n2", "", "A", "B"))
	h.nextNames(ctx, t, "the ACK of n2", lds, "A", "B")
	// c2 leaves: B is kept, unwanted.
	c2.cancel()
	h.nextNames(ctx, t, "c2 gone", lds, "A")

	// c3 asks for B: served from the cache, and B is asked for again.
	c3 := openRaw(ctx, t, relayAddr, "c3", lds, "B")
	resp := c3.recv(ctx, t, "c3's first answer")
	if got := listenerNames(t, resp.GetResources()); !slices.Equal(got, []string{"B"}) {
		t.Fatalf("c3's first answer carries %v, want [B] from the cache", got)
	}
	c3.ack(t, resp, "B")
	h.nextNames(ctx, t, "c3's subscription", lds, "A", "B")

	// The hub's answer to [A] arrives: B must stay.
	h.respond(ctx, t, ldsResponse(t, "v3", "n3", "", "A"))
	if req := h.nextNames(ctx, t, "the ACK of n3", lds, "A", "B"); req.GetResponseNonce() != "n3" {
		t.Fatalf("ACK carries nonce %q, want n3", req.GetResponseNonce())
	}
	if got := held(relay, lds); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("after an answer to an older request the cache holds %v, want [A B]", got)
	}
	c3.quiet(t, "c3 after the answer to [A]", 300*time.Millisecond)

	// An answer to [A B] without B deletes it, at the relay and at c3.
	h.respond(ctx, t, ldsResponse(t, "v4", "n4", "", "A"))
	h.nextNames(ctx, t, "the ACK of n4", lds, "A", "B")
	if got := held(relay, lds); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("after the hub deleted B the cache holds %v, want [A]", got)
	}
	if got := listenerNames(t, c3.recv(ctx, t, "c3 after B's deletion").GetResources()); len(got) != 0 {
		t.Fatalf("c3 after B's deletion got %v, want no listener", got)
	}
}

// TestRelayKeepsTheUnionGoingWildcard: the same when the
// subscription goes from named to wildcard.
func TestRelayKeepsTheUnionGoingWildcard(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	relay, _, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"), func(c *setup) { c.RetainUnwanted = time.Minute })
	lds := resource.ListenerType

	_ = openRaw(ctx, t, relayAddr, "c1", lds, "A")
	h.nextNames(ctx, t, "c1's subscription", lds, "A")
	c2 := openRaw(ctx, t, relayAddr, "c2", lds, "B")
	h.nextNames(ctx, t, "c2's subscription", lds, "A", "B")
	h.respond(ctx, t, ldsResponse(t, "v1", "n1", "", "A", "B"))
	h.nextNames(ctx, t, "the ACK of n1", lds, "A", "B")
	c2.cancel()
	h.nextNames(ctx, t, "c2 gone", lds, "A")
	// A wildcard client: served B (held) from the cache.
	c3 := openRaw(ctx, t, relayAddr, "c3", lds, "*")
	resp := c3.recv(ctx, t, "c3's first answer")
	if got := listenerNames(t, resp.GetResources()); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"A", "B"}) {
		t.Fatalf("c3's first answer carries %v, want [A B]", got)
	}
	c3.ack(t, resp, "*")
	h.nextNames(ctx, t, "c3's subscription", lds, "*")
	h.respond(ctx, t, ldsResponse(t, "v2", "n2", "", "A"))
	h.nextNames(ctx, t, "the ACK of n2", lds, "*")
	if got := held(relay, lds); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("after an answer to [A] the cache holds %v, want [A B]", got)
	}
	c3.quiet(t, "c3 after the answer to [A]", 300*time.Millisecond)
	// The answer to the wildcard request.
	h.respond(ctx, t, ldsResponse(t, "v3", "n3", "", "A"))
	h.nextNames(ctx, t, "the ACK of n3", lds, "*")
	if got := held(relay, lds); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("after a wildcard answer without B the cache holds %v, want [A]", got)
	}
}

// TestRelayRetainsUnwanted: a resource no client wants stays cached for
// RetainUnwanted (and is kept up to date meanwhile), then goes. The relay's
// clock is a fake one, stepped, and what the relay does at each step is
// awaited through another client's subscription (the relay prunes what is
// unwanted when a subscription changes, before it handles the next
// response): B is held a second short of RetainUnwanted and gone at it.
func TestRelayRetainsUnwanted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	const retain = time.Minute
	clk := testingclock.NewFakeClock(time.Now())
	start := clk.Now() // B becomes unwanted at start: the clock does not move until it is stepped
	relay, _, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"), func(c *setup) { c.RetainUnwanted, c.Clock = retain, clk })
	lds := resource.ListenerType

	c := openRaw(ctx, t, relayAddr, "c", lds, "B")
	h.nextNames(ctx, t, "c's subscription", lds, "B")
	h.respond(ctx, t, ldsResponse(t, "v1", "n1", "one", "B"))
	h.nextNames(ctx, t, "the ACK of n1", lds, "B")
	c.cancel()
	h.nextNames(ctx, t, "c gone", lds) // B is unwanted from now on the relay's clock
	// A response that crossed the unsubscription updates what is still held.
	h.respond(ctx, t, ldsResponse(t, "v2", "n2", "two", "B"))
	h.nextNames(ctx, t, "the ACK of n2", lds)
	if l, ok := relay.node.caches[lds].GetResources()["B"].(*listener.Listener); !ok || l.GetStatPrefix() != "two" {
		t.Errorf("unwanted B not updated: the cache holds %v", relay.node.caches[lds].GetResources()["B"])
	}
	// A second short of RetainUnwanted: still there. d's subscription makes
	// the relay prune at that time (sync), before it handles n3.
	clk.Step(retain - time.Second)
	d := openRaw(ctx, t, relayAddr, "d", lds, "A")
	h.nextNames(ctx, t, "d's subscription", lds, "A")
	h.respond(ctx, t, ldsResponse(t, "v3", "n3", "three", "A"))
	h.nextNames(ctx, t, "the ACK of n3", lds, "A")
	if got := held(relay, lds); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("%v after the last client left the cache holds %v, want [A B] until %v", retain-time.Second, got, retain)
	}
	// At it: gone. d leaving makes the relay prune at that time (sync),
	// before it handles n4.
	clk.Step(time.Second)
	d.cancel()
	h.nextNames(ctx, t, "d gone", lds)
	h.respond(ctx, t, ldsResponse(t, "v4", "n4", "four", "A"))
	h.nextNames(ctx, t, "the ACK of n4", lds)
	if got := held(relay, lds); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("%v after B became unwanted the cache holds %v, want [A]", clk.Since(start), got)
	}
}

// TestRelayDoesNotResendOnNACK: a local NACK does not make the
// relay resend the same state; later changes still arrive.
func TestRelayDoesNotResendOnNACK(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	_, reg, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"))
	lds := resource.ListenerType
	nack := func(c *rawClient, resp *discovery.DiscoveryResponse) {
		t.Helper()
		// A client that never accepted anything NACKs with no version.
		c.send(t, &discovery.DiscoveryRequest{TypeUrl: lds, ResourceNames: []string{"A"}, ResponseNonce: resp.GetNonce(),
			ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "rejected by test"}})
	}
	// count counts the responses within d, NACKing each (as grpc-go does
	// with what it cannot accept).
	count := func(c *rawClient, d time.Duration) int {
		n := 0
		deadline := time.After(d)
		for {
			select {
			case resp := <-c.responses:
				n++
				nack(c, resp)
			case <-deadline:
				return n
			}
		}
	}

	c := openRaw(ctx, t, relayAddr, "c", lds, "A")
	h.nextNames(ctx, t, "c's subscription", lds, "A")
	first := c.recv(ctx, t, "the first (empty) answer")
	nack(c, first)
	if n := count(c, 300*time.Millisecond); n != 0 {
		t.Fatalf("after a NACK the relay sent %d responses in 300ms, want none", n)
	}
	h.respond(ctx, t, ldsResponse(t, "v1", "n1", "", "A"))
	h.nextNames(ctx, t, "the ACK of n1", lds, "A")
	resp := c.recv(ctx, t, "the change after a NACK")
	if got := listenerNames(t, resp.GetResources()); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("after a NACK and a change the client got %v, want [A]", got)
	}
	nack(c, resp)
	if n := count(c, 300*time.Millisecond); n != 0 {
		t.Fatalf("after the second NACK the relay sent %d responses in 300ms, want none", n)
	}
	if n := metricValue(t, reg, MetricNACKs, typeLDS); n != 2 {
		t.Errorf("%s{lds} = %v, want 2", MetricNACKs, n)
	}
}

// TestRelayBoundsResourceNames: a local request naming too many
// resources ends its stream only; a union past the bound is asked for as a
// wildcard.
func TestRelayBoundsResourceNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	relay, _, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"), func(c *setup) { c.MaxResourceNames = 3 })
	lds := resource.ListenerType

	greedy := openRaw(ctx, t, relayAddr, "greedy", lds, "A", "B", "C", "D")
	if err := greedy.end(ctx, t); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a request naming 4 of at most 3 resources ended its stream with %v, want ResourceExhausted", err)
	}
	_ = openRaw(ctx, t, relayAddr, "c1", lds, "A", "B")
	h.nextNames(ctx, t, "c1's subscription", lds, "A", "B")
	_ = openRaw(ctx, t, relayAddr, "c2", lds, "C", "D")
	h.nextNames(ctx, t, "a union of 4 names", lds, "*")
	// The relay records what it asked for once the request is sent: the hub may read it first.
	waitFor(ctx, t, "Subscriptions()[lds] = [*]", func() bool { return slices.Equal(relay.Subscriptions()[typeLDS], []string{"*"}) })
}

// TestRelayRunsOnce: a second Run is refused, and the local
// streams end when Run returns, those that sent nothing yet too; a
// gateway that comes before Run is served once it runs.
func TestRelayRunsOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, hubAddr := startScriptedHub(t)
	r, err := New(DefaultConfig(), Wiring{Upstream: hubAddr, DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Node: &core.Node{Id: "node-1"}}, testLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	r.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	// A gateway that comes before Run is served once it runs.
	early := openRawNode(ctx, t, lis.Addr().String(), ingressNode("gw", 8080), resource.ListenerType)
	early.quiet(t, "a gateway before Run", 50*time.Millisecond)
	if gws := r.Gateways(); len(gws) != 0 {
		t.Fatalf("gateways served before Run: %+v", gws)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	c := openRaw(ctx, t, lis.Addr().String(), "c", resource.ListenerType, "A")
	waitFor(ctx, t, "the early gateway served", func() bool { return len(r.Gateways()) == 1 })
	// A stream that never sends a request.
	silentCtx, cancelSilent := context.WithCancel(ctx)
	defer cancelSilent()
	silent := dialLocal(silentCtx, t, lis.Addr().String())
	silentEnd := make(chan error, 1)
	go func() {
		_, err := silent.Recv()
		silentEnd <- err
	}()
	c.recv(ctx, t, "the first answer")
	if err := r.Run(ctx); !errors.Is(err, ErrRunTwice) {
		t.Errorf("second Run: %v, want ErrRunTwice", err)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatal("a local stream outlived Run")
	}
	select {
	case <-silentEnd:
	case <-ctx.Done():
		t.Fatal("a local stream that sent nothing outlived Run")
	}
	select {
	case <-early.done:
	case <-ctx.Done():
		t.Fatal("a gateway's stream outlived Run")
	}
	if gws := r.Gateways(); len(gws) != 0 {
		t.Errorf("gateways once Run returned: %+v", gws)
	}
}

// TestWildcardWatchWaitsForAWildcardAnswer: an answer to a named
// request does not cover a wildcard watch.
func TestWildcardWatchWaitsForAWildcardAnswer(t *testing.T) {
	caches := map[string]*cache.LinearCache{resource.ListenerType: cache.NewLinearCache(resource.ListenerType)}
	c := newLocalCache(caches, map[string]string{resource.ListenerType: "p-"}, nil, time.Second, clock.RealClock{}, testLogger())
	wildcard := stream.NewSotwSubscription(nil, true)
	if !wildcard.IsWildcard() {
		t.Fatal("test subscription is not wildcard")
	}
	c.synced(resource.ListenerType, time.Now(), false)
	c.mu.Lock()
	covered := c.covers(resource.ListenerType, &wildcard)
	c.mu.Unlock()
	if covered {
		t.Error("an answer to a named request covers a wildcard watch")
	}
	c.synced(resource.ListenerType, time.Now(), true)
	c.mu.Lock()
	covered = c.covers(resource.ListenerType, &wildcard)
	c.mu.Unlock()
	if !covered {
		t.Error("an answer to a wildcard request does not cover a wildcard watch")
	}
	// The stream ends: what the relay holds is the last good state, and still covers.
	c.reset()
	c.mu.Lock()
	covered = c.covers(resource.ListenerType, &wildcard)
	c.mu.Unlock()
	if !covered {
		t.Error("after the stream ended, the last wildcard answer no longer covers a wildcard watch")
	}
	// Listeners dropped as unwanted: the relay no longer holds them all.
	c.dropped(resource.ListenerType, []string{"a"})
	c.mu.Lock()
	covered = c.covers(resource.ListenerType, &wildcard)
	c.mu.Unlock()
	if covered {
		t.Error("a wildcard watch is covered after listeners were dropped as unwanted")
	}
}

// TestLocalStreamsRecordRelayedTypesOnly.
func TestLocalStreamsRecordRelayedTypesOnly(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	l := newLocalStreams(m, testLogger(), 10, clock.RealClock{}, func() {})
	l.open(1)
	for i := range 100 {
		typeURL := "type.example.com/t" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if err := l.request(1, &discovery.DiscoveryRequest{TypeUrl: typeURL, ResponseNonce: "1"}); err != nil {
			t.Fatal(err)
		}
		l.response(1, typeURL, &discovery.DiscoveryResponse{TypeUrl: typeURL, Nonce: "2"})
	}
	if err := l.request(1, &discovery.DiscoveryRequest{TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	n := len(l.streams[1].types)
	l.mu.Unlock()
	if n != 1 {
		t.Errorf("a stream records %d types, want 1 (the listener type only)", n)
	}
}
