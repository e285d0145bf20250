package relay

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcxds "google.golang.org/grpc/xds"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// TestRelayServesTheRelaysLocality: a grpc-go client reaches its backend
// through the relay, is served the relay's locality (not its own), and an
// endpoint change at the hub reaches it.
func TestRelayServesTheRelaysLocality(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	near := xdstest.StartBackend(t, "near", "127.0.0.1")   // r1/z1, the relay's zone
	far := xdstest.StartBackend(t, "far", "127.0.0.2")     // r2/z3, the client's own zone
	near2 := xdstest.StartBackend(t, "near2", "127.0.0.3") // r1/z1, replaces near
	zone1, zone3 := loc("r1", "z1"), loc("r2", "z3")
	r, _ := apply(t, registry.New(), shard("east", echo, endpointOf(near, zone1), endpointOf(far, zone3)))
	h := startHub(t, "127.0.0.1:0", r)
	relay, reg, relayAddr := startRelay(t, h.addr, zone1)

	target := xds.ListenerName(echo, grpcPort.Port)
	// The client says it is in r2/z3; the hub computes for the relay's r1/z1.
	client := xdstest.StartPoller(ctx, t, "client", xdstest.NewClient(t, relayAddr, "client", zone3, target))
	client.AwaitOnly(ctx, t, "near")

	r2, d := apply(t, r, shard("east", echo, endpointOf(near2, zone1), endpointOf(far, zone3)))
	h.srv.Update(r2, d)
	client.AwaitOnly(ctx, t, "near2")
	noFailures(t, client)

	if n := metricValue(t, reg, MetricUpstreamConnected, ""); n != 1 {
		t.Errorf("%s = %v, want 1", MetricUpstreamConnected, n)
	}
	if n := metricValue(t, reg, MetricStreams, ""); n != 1 {
		t.Errorf("%s = %v, want 1", MetricStreams, n)
	}
	if n := metricValue(t, reg, MetricUpstreamResponses, typeEDS); n < 2 {
		t.Errorf("%s{eds} = %v, want at least 2", MetricUpstreamResponses, n)
	}
	if nodes := h.nodeIDs(); !slices.Equal(nodes, []string{"node-1"}) {
		t.Errorf("the hub saw nodes %v, want one stream of node-1", nodes)
	}
	// The client's ACKs are recorded.
	waitFor(ctx, t, "the client's EDS ACK of the last version", func() bool {
		cs := relay.Clients()
		return len(cs) == 1 && cs[0].NodeID == "client" && cs[0].Types[typeEDS].Sent != "" &&
			cs[0].Types[typeEDS].Acked == cs[0].Types[typeEDS].Sent && cs[0].Types[typeEDS].LastNACK == nil
	})
}

// TestRelayOutlivesTheHub: with the hub gone, the client keeps calling, a
// new client is served from the relay's caches, and a hub restarted on the
// same address is resubscribed and its changes flow.
func TestRelayOutlivesTheHub(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a1 := xdstest.StartBackend(t, "a1", "127.0.0.1")
	a2 := xdstest.StartBackend(t, "a2", "127.0.0.2")
	zone1 := loc("r1", "z1")
	r, _ := apply(t, registry.New(), shard("east", echo, endpointOf(a1, zone1)))
	h := startHub(t, "127.0.0.1:0", r)
	relay, reg, relayAddr := startRelay(t, h.addr, zone1)
	target := xds.ListenerName(echo, grpcPort.Port)

	first := xdstest.StartPoller(ctx, t, "first", xdstest.NewClient(t, relayAddr, "first", zone1, target))
	first.AwaitOnly(ctx, t, "a1")

	h.stop()
	waitFor(ctx, t, "the relay notice the hub is gone", func() bool {
		return metricValue(t, reg, MetricUpstreamConnected, "") == 0
	})
	// A new client, served from the cache alone (StartPoller waits for its first answer).
	second := xdstest.StartPoller(ctx, t, "second", xdstest.NewClient(t, relayAddr, "second", zone1, target))
	second.AwaitOnly(ctx, t, "a1")
	first.AwaitOnly(ctx, t, "a1")
	if n := metricValue(t, reg, MetricUpstreamConnected, ""); n != 0 {
		t.Fatalf("the relay is connected to a stopped hub")
	}

	// The hub comes back on the same address, with a1 replaced by a2.
	r2, _ := apply(t, r, shard("east", echo, endpointOf(a2, zone1)))
	h2 := startHub(t, h.addr, r2)
	first.AwaitOnly(ctx, t, "a2")
	second.AwaitOnly(ctx, t, "a2")
	noFailures(t, first, second)

	clusterName := xds.ClusterName(echo, grpcPort.Port)
	for typ, want := range map[string]string{typeLDS: target, typeRDS: target, typeCDS: clusterName, typeEDS: clusterName} {
		if got := h2.lastNames(typ); !slices.Equal(got, []string{want}) {
			t.Errorf("restarted hub: last %s request named %v, want [%s]", typ, got, want)
		}
	}
	if n := len(relay.Clients()); n != 2 {
		t.Errorf("relay has %d clients, want 2", n)
	}
}

// newClosableClient is xdstest.NewClient whose connection the caller closes.
func newClosableClient(t *testing.T, xdsAddr, node string, l registry.Locality, target string) (healthpb.HealthClient, *grpc.ClientConn) {
	t.Helper()
	resolver, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(xdstest.Bootstrap(xdsAddr, node, l)))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn), conn
}

// TestRelaySubscribesTheUnion: two local clients of two services; the hub
// is asked for both, and for one only once the other client is gone.
func TestRelaySubscribesTheUnion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e1 := xdstest.StartBackend(t, "e1", "127.0.0.1")
	o1 := xdstest.StartBackend(t, "o1", "127.0.0.2")
	zone1 := loc("r1", "z1")
	r, _ := apply(t, registry.New(), shard("east", echo, endpointOf(e1, zone1)), shard("east", other, endpointOf(o1, zone1)))
	h := startHub(t, "127.0.0.1:0", r)
	relay, _, relayAddr := startRelay(t, h.addr, zone1)

	echoL, otherL := xds.ListenerName(echo, grpcPort.Port), xds.ListenerName(other, grpcPort.Port)
	echoC, otherC := xds.ClusterName(echo, grpcPort.Port), xds.ClusterName(other, grpcPort.Port)
	echoClient := xdstest.StartPoller(ctx, t, "echo-client", xdstest.NewClient(t, relayAddr, "echo-client", zone1, echoL))
	otherHealth, otherConn := newClosableClient(t, relayAddr, "other-client", zone1, otherL)
	otherCtx, otherCancel := context.WithCancel(ctx)
	otherClient := xdstest.StartPoller(otherCtx, t, "other-client", otherHealth)
	echoClient.AwaitOnly(ctx, t, "e1")
	otherClient.AwaitOnly(ctx, t, "o1")

	expect := func(what string, names map[string][]string) {
		t.Helper()
		waitFor(ctx, t, what, func() bool {
			sub := relay.Subscriptions()
			for typ, want := range names {
				slices.Sort(want)
				if !slices.Equal(h.lastNames(typ), want) || !slices.Equal(sub[typ], want) {
					return false
				}
			}
			return true
		})
	}
	expect("both services subscribed upstream", map[string][]string{
		typeLDS: {echoL, otherL}, typeRDS: {echoL, otherL}, typeCDS: {echoC, otherC}, typeEDS: {echoC, otherC}})

	otherCancel()
	_ = otherConn.Close()
	expect("only echo subscribed upstream", map[string][]string{
		typeLDS: {echoL}, typeRDS: {echoL}, typeCDS: {echoC}, typeEDS: {echoC}})
	waitFor(ctx, t, "other's resources dropped from the relay's caches", func() bool {
		for _, c := range relay.node.caches {
			for name := range c.GetResources() {
				if name == otherL || name == otherC {
					return false
				}
			}
		}
		return true
	})
	waitFor(ctx, t, "one local client", func() bool { return len(relay.Clients()) == 1 })
	echoClient.AwaitOnly(ctx, t, "e1")
	noFailures(t, echoClient)
}

// TestRelayRecordsLocalNACKs drives a raw ADS stream that rejects a listener.
func TestRelayRecordsLocalNACKs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e1 := xdstest.StartBackend(t, "e1", "127.0.0.1")
	zone1 := loc("r1", "z1")
	r, _ := apply(t, registry.New(), shard("east", echo, endpointOf(e1, zone1)))
	h := startHub(t, "127.0.0.1:0", r)
	relay, reg, relayAddr := startRelay(t, h.addr, zone1)

	stream := dialLocal(ctx, t, relayAddr)
	echoL := xds.ListenerName(echo, grpcPort.Port)
	names := []string{echoL}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "raw"}, TypeUrl: resource.ListenerType, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	// The relay may answer before its cache holds the listener: ACK until it comes.
	var resp *discovery.DiscoveryResponse
	var err error
	acked := ""
	for {
		resp, err = stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(listenerNames(t, resp.GetResources())) == 1 {
			break
		}
		acked = resp.GetVersionInfo()
		if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ListenerType, ResourceNames: names,
			VersionInfo: acked, ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ListenerType, ResourceNames: names,
		VersionInfo: acked, ResponseNonce: resp.GetNonce(), ErrorDetail: &status.Status{Code: 3, Message: "listener rejected by test"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the NACK recorded", func() bool {
		for _, c := range relay.Clients() {
			if n := c.Types[typeLDS].LastNACK; c.NodeID == "raw" && n != nil {
				if n.Detail != "listener rejected by test" || n.Version != resp.GetVersionInfo() || n.Nonce != resp.GetNonce() {
					t.Fatalf("recorded NACK %+v, want detail %q, version %q, nonce %q", n, "listener rejected by test", resp.GetVersionInfo(), resp.GetNonce())
				}
				return c.Types[typeLDS].Sent == resp.GetVersionInfo() && c.Types[typeLDS].Acked == acked
			}
		}
		return false
	})
	if n := metricValue(t, reg, MetricNACKs, typeLDS); n != 1 {
		t.Errorf("%s{lds} = %v, want 1", MetricNACKs, n)
	}
}

func listenerNames(t *testing.T, resources []*anypb.Any) []string {
	t.Helper()
	var out []string
	for _, a := range resources {
		var l listener.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l.GetName())
	}
	return out
}

// TestDecodeRejectsBadResponses: what the relay NACKs upstream.
func TestDecodeRejectsBadResponses(t *testing.T) {
	good, err := anypb.New(&listener.Listener{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	unnamed, err := anypb.New(&listener.Listener{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		resources []*anypb.Any
		ok        bool
	}{
		{"good", []*anypb.Any{good}, true},
		{"empty", nil, true},
		{"wrong type", []*anypb.Any{{TypeUrl: resource.ClusterType, Value: good.GetValue()}}, false},
		{"garbage", []*anypb.Any{{TypeUrl: resource.ListenerType, Value: []byte{0xff, 0xff, 0xff}}}, false},
		{"unnamed", []*anypb.Any{unnamed}, false},
		{"twice", []*anypb.Any{good, good}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decode(resource.ListenerType, &discovery.DiscoveryResponse{TypeUrl: resource.ListenerType, Resources: tc.resources}, nil)
			if (err == nil) != tc.ok {
				t.Errorf("decode: err = %v, want ok = %v", err, tc.ok)
			}
		})
	}
	// What the relay holds byte for byte is not decoded again; what changed is.
	changed, err := anypb.New(&listener.Listener{Name: "b", StatPrefix: "v2"})
	if err != nil {
		t.Fatal(err)
	}
	held := map[string][]byte{"a": good.GetValue(), "b": []byte("an older b")}
	decoded, wire, err := decode(resource.ListenerType, &discovery.DiscoveryResponse{TypeUrl: resource.ListenerType,
		Resources: []*anypb.Any{good, changed}}, held)
	if err != nil || len(wire) != 2 || len(decoded) != 1 || decoded["b"] == nil {
		t.Errorf("decode with a held: wire %d, decoded %v, err %v; want both in wire and only b decoded", len(wire), decoded, err)
	}
}

// TestRelayHoldsWhatAClientMayHold: a client that comes with another
// server's listener version (the relay restarted) is not answered while the
// relay does not hold its listener (the answer would delete it at the
// client), and is answered with it once the hub is back. A client with no
// state is answered at once.
func TestRelayHoldsWhatAClientMayHold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The hub's address, with nothing listening on it yet.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hubAddr := lis.Addr().String()
	_ = lis.Close()
	_, _, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"))

	conn, err := grpc.NewClient(relayAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	echoL := xds.ListenerName(echo, grpcPort.Port)
	open := func(node, version string, names ...string) (discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, <-chan *discovery.DiscoveryResponse) {
		t.Helper()
		stream, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: resource.ListenerType,
			ResourceNames: names, VersionInfo: version}); err != nil {
			t.Fatal(err)
		}
		responses := make(chan *discovery.DiscoveryResponse, 8)
		go func() {
			for {
				resp, err := stream.Recv()
				if err != nil {
					return
				}
				responses <- resp
			}
		}()
		return stream, responses
	}

	_, fresh := open("fresh", "", echoL)
	select {
	case resp := <-fresh:
		if n := len(resp.GetResources()); n != 0 {
			t.Fatalf("fresh client: first answer has %d listeners, want none (the relay holds none)", n)
		}
	case <-ctx.Done():
		t.Fatal("a client with no state was not answered")
	}

	_, returning := open("returning", "nave-lds-7", echoL)
	// Nothing must come while the hub is away: give it a while to go wrong.
	select {
	case resp := <-returning:
		t.Fatalf("a client holding another server's state was answered with %d listeners while the relay held none", len(resp.GetResources()))
	case <-time.After(500 * time.Millisecond):
	}

	e1 := xdstest.StartBackend(t, "e1", "127.0.0.1")
	r, _ := apply(t, registry.New(), shard("east", echo, endpointOf(e1, loc("r1", "z1"))))
	startHub(t, hubAddr, r)
	select {
	case resp := <-returning:
		if got := listenerNames(t, resp.GetResources()); !slices.Equal(got, []string{echoL}) {
			t.Fatalf("returning client: first answer carries %v, want [%s]", got, echoL)
		}
	case <-ctx.Done():
		t.Fatal("the returning client was never answered")
	}

	// With the hub answering, a listener it does not have is held
	// HoldUnknown (200 ms; checked every 50 ms): nothing before, an answer after.
	const missing = "missing.default.svc.clusterset.local:80"
	opened := time.Now()
	_, lost := open("lost", "nave-lds-7", echoL, missing)
	select {
	case resp := <-lost:
		t.Fatalf("a client naming a listener the hub does not have was answered after %v (with %v), before HoldUnknown",
			time.Since(opened), listenerNames(t, resp.GetResources()))
	case <-time.After(150 * time.Millisecond):
	}
	select {
	case resp := <-lost:
		if d := time.Since(opened); d < 200*time.Millisecond {
			t.Errorf("a client naming a listener the hub does not have was answered after %v, before HoldUnknown", d)
		}
		if got := listenerNames(t, resp.GetResources()); !slices.Equal(got, []string{echoL}) {
			t.Fatalf("client naming a missing listener: first answer carries %v, want [%s]", got, echoL)
		}
	case <-ctx.Done():
		t.Fatal("a client naming a listener the hub does not have was never answered")
	}
}
