package relay

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/gateways"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// ingressNode is an ingress gateway's node as `nave gateway` writes it,
// exposing namespace default on port: no locality, no cluster, no network.
func ingressNode(id string, port uint32) *core.Node {
	return &core.Node{Id: id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		gateways.MetadataRole:             structpb.NewStringValue(gateways.RoleIngress),
		gateways.MetadataExposeNamespaces: structpb.NewStringValue("default"),
		gateways.MetadataListeners:        structpb.NewStringValue(fmt.Sprintf("%d/http", port)),
	}}}
}

// withGateways makes a hub serve gateways (its Audience).
func withGateways(w *xds.Wiring) {
	w.Audience = gateways.NewAudience(gateways.Exposure{}, testLogger())
}

// envoyFetch asks over c, as Envoy does, for every resource of typeURL
// (names: those), ACKs the answer and returns it by name.
func envoyFetch(ctx context.Context, t *testing.T, c *rawClient, typeURL string, names ...string) map[string]proto.Message {
	t.Helper()
	c.send(t, &discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names})
	return received(ctx, t, c, typeURL, names...)
}

// received receives over c until a response of typeURL comes, ACKs it
// (keeping names) and returns its resources by name.
func received(ctx context.Context, t *testing.T, c *rawClient, typeURL string, names ...string) map[string]proto.Message {
	t.Helper()
	for {
		resp := c.recv(ctx, t, typeLabel(typeURL))
		if resp.GetTypeUrl() != typeURL {
			continue
		}
		c.ack(t, resp, names...)
		out := map[string]proto.Message{}
		for _, a := range resp.GetResources() {
			m, err := a.UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			out[cache.GetResourceName(m)] = m
		}
		return out
	}
}

// sameResources fails the test unless got and want hold equal resources by name.
func sameResources(t *testing.T, what string, got, want map[string]proto.Message) {
	t.Helper()
	if len(want) == 0 {
		t.Fatalf("%s: the hub served nothing to compare with", what)
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: %s missing through the relay", what, name)
			continue
		}
		if !proto.Equal(g, w) {
			t.Errorf("%s: %s differs through the relay:\n got %v\nwant %v", what, name, g, w)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: %s served through the relay only", what, name)
		}
	}
}

// TestRelayServesAGatewayItsOwnView: a gateway behind the relay is served,
// on an upstream stream in its own name, what the hub serves that gateway
// connected directly (its listeners, routes, clusters, and endpoints for
// its locality, which it takes from the relay's node as it names none),
// while a proxyless client on the same relay gets the node's view; and the
// view is dropped once the gateway is gone.
func TestRelayServesAGatewayItsOwnView(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	near := xdstest.StartBackend(t, "near", "127.0.0.1")
	far := xdstest.StartBackend(t, "far", "127.0.0.2")
	r, _ := apply(t, registry.New(), shard("east", echo, endpointOf(near, loc("r1", "z1")), endpointOf(far, loc("r2", "z3"))))
	h := startHub(t, "127.0.0.1:0", r, withGateways)
	relay, reg, relayAddr := startRelay(t, h.addr, loc("r1", "z1"), func(c *setup) { c.RetainUnwanted = 200 * time.Millisecond })

	client := xdstest.StartPoller(ctx, t, "client", xdstest.NewClient(t, relayAddr, "client", loc("r2", "z3"), xds.ListenerName(echo, grpcPort.Port)))
	client.AwaitOnly(ctx, t, "near")

	gw := ingressNode("gw-1", 8080)
	viaRelay := openRawNode(ctx, t, relayAddr, gw, resource.ListenerType)
	// Directly: the node the relay must have named upstream.
	want := proto.CloneOf(gw)
	want.Locality = &core.Locality{Region: "r1", Zone: "z1"}
	direct := openRawNode(ctx, t, h.addr, want, resource.ListenerType)
	lds := received(ctx, t, direct, resource.ListenerType)
	if _, ok := lds[gateways.ListenerName(8080)]; !ok {
		t.Fatalf("the hub served gateway listeners %v, want %s", slices.Collect(maps.Keys(lds)), gateways.ListenerName(8080))
	}
	sameResources(t, "lds", received(ctx, t, viaRelay, resource.ListenerType), lds)
	cds := envoyFetch(ctx, t, direct, resource.ClusterType)
	sameResources(t, "cds", envoyFetch(ctx, t, viaRelay, resource.ClusterType), cds)
	clusters := slices.Sorted(maps.Keys(cds))
	sameResources(t, "eds", envoyFetch(ctx, t, viaRelay, resource.EndpointType, clusters...), envoyFetch(ctx, t, direct, resource.EndpointType, clusters...))
	// An HTTP listener's routes have its name.
	routes := gateways.ListenerName(8080)
	sameResources(t, "rds", envoyFetch(ctx, t, viaRelay, resource.RouteType, routes), envoyFetch(ctx, t, direct, resource.RouteType, routes))

	// The hub saw the node's stream and the gateway's, as the gateway with the relay's locality.
	h.mu.Lock()
	var upstream *core.Node
	for _, n := range h.nodes {
		if n.GetId() == "gw-1" && n.GetUserAgentName() == "nave-relay" {
			upstream = n
		}
	}
	h.mu.Unlock()
	nodes := h.nodeIDs()
	if upstream == nil || !slices.Contains(nodes, "node-1") {
		t.Fatalf("the hub saw nodes %v, want node-1 and gw-1 through the relay", nodes)
	}
	if upstream.GetLocality().GetZone() != "z1" || upstream.GetMetadata().GetFields()[gateways.MetadataRole].GetStringValue() != gateways.RoleIngress {
		t.Errorf("the gateway's upstream node is %v, want its metadata and the relay's locality", upstream)
	}
	for _, m := range []string{MetricUpstreamConnected, MetricGatewayUpstreams, MetricGateways} {
		if n := metricValue(t, reg, m, ""); n != 1 {
			t.Errorf("%s = %v, want 1", m, n)
		}
	}
	gws := relay.Gateways()
	if len(gws) != 1 || gws[0].NodeID != "gw-1" || gws[0].Streams != 1 || !slices.Equal(gws[0].Upstream[typeLDS], []string{"*"}) {
		t.Errorf("Gateways() = %+v, want gw-1 with one stream, subscribed to every listener", gws)
	}
	if got := relay.Subscriptions()[typeLDS]; !slices.Equal(got, []string{xds.ListenerName(echo, grpcPort.Port)}) {
		t.Errorf("the node's view subscribes to listeners %v, want the client's only", got)
	}
	// Each view numbers its streams: a stream is its view's and its number.
	streams := map[string]string{}
	for _, c := range relay.Clients() {
		streams[c.NodeID] = fmt.Sprintf("%s/%d", c.Gateway, c.StreamID)
	}
	if len(streams) != 2 || streams["client"] != "/1" || streams["gw-1"] != "gw-1/1" {
		t.Errorf("Clients() are %v, want client in the node's view and gw-1 in its own", streams)
	}

	// The gateway goes: its view, and its upstream stream, go after RetainUnwanted.
	viaRelay.cancel()
	waitFor(ctx, t, "the gateway's view dropped", func() bool {
		return len(relay.Gateways()) == 0 && metricValue(t, reg, MetricGateways, "") == 0 && metricValue(t, reg, MetricGatewayUpstreams, "") == 0
	})
	if n := metricValue(t, reg, MetricUpstreamConnected, ""); n != 1 {
		t.Errorf("%s = %v once the gateway is gone, want 1 (the node's stream)", MetricUpstreamConnected, n)
	}
	noFailures(t, client)
}

// TestRelayServesAGatewayWithoutTheHub: a gateway's Envoy that left (the
// relay unsubscribed in its name) and comes back while the hub is away
// gets its listeners from the relay; a gateway the relay has no room for
// is refused, and one that names no ID, or too much metadata, too.
func TestRelayServesAGatewayWithoutTheHub(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, _ := apply(t, registry.New(), shard("east", echo, endpointOf(xdstest.StartBackend(t, "near", "127.0.0.1"), loc("r1", "z1"))))
	h := startHub(t, "127.0.0.1:0", r, withGateways)
	relay, _, relayAddr := startRelay(t, h.addr, loc("r1", "z1"), func(c *setup) { c.MaxGateways, c.RetainUnwanted = 1, 10*time.Second })

	old := openRawNode(ctx, t, relayAddr, ingressNode("gw-1", 8080), resource.ListenerType)
	resp := old.recv(ctx, t, "listeners")
	old.ack(t, resp)
	want := listenerNames(t, resp.GetResources())
	if !slices.Contains(want, gateways.ListenerName(8080)) {
		t.Fatalf("gateway listeners %v, want %s", want, gateways.ListenerName(8080))
	}
	old.cancel()
	waitFor(ctx, t, "the old gateway's stream gone and unsubscribed upstream, its view kept", func() bool {
		gws := relay.Gateways()
		return len(gws) == 1 && gws[0].Streams == 0 && len(gws[0].Upstream[typeLDS]) == 0
	})
	h.stop()
	// The new Envoy holds nothing yet: it asks with no version.
	restarted := openRawNode(ctx, t, relayAddr, ingressNode("gw-1", 8080), resource.ListenerType)
	if got := listenerNames(t, restarted.recv(ctx, t, "listeners with the hub away").GetResources()); !slices.Equal(got, want) {
		t.Errorf("with the hub away the restarted gateway got listeners %v, want %v", got, want)
	}

	other := openRawNode(ctx, t, relayAddr, ingressNode("gw-2", 8080), resource.ListenerType)
	if err := other.end(ctx, t); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a gateway past MaxGateways: stream ended with %v, want ResourceExhausted", err)
	}
	// Once gw-1 is gone, its kept view makes room for another gateway.
	restarted.cancel()
	waitFor(ctx, t, "gw-1's stream gone", func() bool { gws := relay.Gateways(); return len(gws) == 1 && gws[0].Streams == 0 })
	openRawNode(ctx, t, relayAddr, ingressNode("gw-2", 8080), resource.ListenerType)
	waitFor(ctx, t, "gw-2 in gw-1's room", func() bool { gws := relay.Gateways(); return len(gws) == 1 && gws[0].NodeID == "gw-2" })
	noID := ingressNode("", 8080)
	if err := openRawNode(ctx, t, relayAddr, noID, resource.ListenerType).end(ctx, t); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a gateway with no ID: stream ended with %v, want InvalidArgument", err)
	}
	large := ingressNode("gw-1", 8080)
	large.Metadata.Fields["padding"] = structpb.NewStringValue(strings.Repeat("x", maxGatewayMetadata))
	if err := openRawNode(ctx, t, relayAddr, large, resource.ListenerType).end(ctx, t); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a gateway with too much metadata: stream ended with %v, want InvalidArgument", err)
	}
	longID := ingressNode(strings.Repeat("g", xds.MaxNodeFieldBytes+1), 8080)
	if err := openRawNode(ctx, t, relayAddr, longID, resource.ListenerType).end(ctx, t); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a gateway whose node ID the hub would refuse: stream ended with %v, want InvalidArgument", err)
	}
	_, _, noGateways := startRelay(t, h.addr, loc("r1", "z1"), func(c *setup) { c.MaxGateways = 0 })
	if err := openRawNode(ctx, t, noGateways, ingressNode("gw-1", 8080), resource.ListenerType).end(ctx, t); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a gateway at a relay serving none: stream ended with %v, want FailedPrecondition", err)
	}
}

// TestRelayHoldsAGatewaysFirstWatchAndReportsItsNACK: a gateway's first listener
// watch waits for the hub's answer, and its rejection goes to the hub on the
// gateway's own stream, naming it.
func TestRelayHoldsAGatewaysFirstWatchAndReportsItsNACK(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	_, reg, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"))
	gw := openRawNode(ctx, t, relayAddr, ingressNode("gw-1", 8080), resource.ListenerType)
	if req := h.nextNames(ctx, t, "the gateway's subscription", resource.ListenerType, "*"); req.GetNode().GetId() != "gw-1" {
		t.Fatalf("the upstream stream names node %q, want the gateway's", req.GetNode().GetId())
	}
	// An Envoy's first listener watch waits for the hub's answer: an empty
	// one would let it go live without listeners.
	gw.quiet(t, "the gateway's first listener watch before the hub answered", 100*time.Millisecond)
	h.respond(ctx, t, ldsResponse(t, "v1", "n1", "one", gateways.ListenerName(8080)))
	if req := h.next(ctx, t, "the ACK of v1"); req.GetErrorDetail() != nil {
		t.Fatalf("ACK of v1: %v", req)
	}
	resp := gw.recv(ctx, t, "the gateway's listeners")
	if got := listenerNames(t, resp.GetResources()); !slices.Equal(got, []string{gateways.ListenerName(8080)}) {
		t.Fatalf("the gateway's first listeners %v, want the hub's", got)
	}
	gw.send(t, &discovery.DiscoveryRequest{TypeUrl: resource.ListenerType, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "listener rejected by the gateway"}})
	req := h.next(ctx, t, "the report")
	if msg := req.GetErrorDetail().GetMessage(); req.GetVersionInfo() != "v1" || !strings.Contains(msg, `node "gw-1"`) || !strings.Contains(msg, "listener rejected by the gateway") {
		t.Fatalf("report %v: want a NACK keeping v1 that names gw-1 and its error", req)
	}
	if n := metricValue(t, reg, MetricReportedNACKs, typeLDS); n != 1 {
		t.Errorf("%s{lds} = %v, want 1", MetricReportedNACKs, n)
	}
}

// TestBehindRelayCompletesOnlyWhatIsMissing: a gateway's own locality,
// cluster and network win over the relay's.
func TestBehindRelayCompletesOnlyWhatIsMissing(t *testing.T) {
	relayNode := &core.Node{Id: "node-1", Cluster: "east", Locality: &core.Locality{Region: "r1", Zone: "z1"},
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			xds.MetadataCluster: structpb.NewStringValue("east"),
			xds.MetadataNetwork: structpb.NewStringValue("net-1"),
		}}}
	bare := ingressNode("gw", 8080)
	got := behindRelay(bare, relayNode)
	if got.GetLocality().GetZone() != "z1" || got.GetCluster() != "east" ||
		got.GetMetadata().GetFields()[xds.MetadataNetwork].GetStringValue() != "net-1" ||
		got.GetMetadata().GetFields()[xds.MetadataCluster].GetStringValue() != "east" {
		t.Errorf("a bare gateway behind the relay: %v, want the relay's locality, cluster and network", got)
	}
	if _, ok := bare.GetMetadata().GetFields()[xds.MetadataNetwork]; ok || bare.Locality != nil {
		t.Error("behindRelay changed the gateway's own node")
	}
	own := ingressNode("gw", 8080)
	own.Locality, own.Cluster = &core.Locality{Zone: "z9"}, "west"
	own.Metadata.Fields[xds.MetadataNetwork] = structpb.NewStringValue("net-2")
	got = behindRelay(own, relayNode)
	if got.GetLocality().GetZone() != "z9" || got.GetLocality().GetRegion() != "" || got.GetCluster() != "west" ||
		got.GetMetadata().GetFields()[xds.MetadataNetwork].GetStringValue() != "net-2" {
		t.Errorf("a gateway naming its own: %v, want its own locality, cluster and network kept", got)
	}
}
