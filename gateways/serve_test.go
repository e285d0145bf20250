package gateways

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// serve runs an xDS server with the gateway audience over r and nets.
func serve(t *testing.T, r *registry.Registry, nets registry.Networks) (*xds.Server, discovery.AggregatedDiscoveryServiceClient) {
	t.Helper()
	srv := xds.NewServer(xds.DefaultConfig(), xds.Wiring{Audience: NewAudience(Exposure{}, nil)}, nil, nil)
	srv.SetNetworks(nets)
	srv.Update(r, registry.Diff{})
	g := grpc.NewServer()
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return srv, discovery.NewAggregatedDiscoveryServiceClient(conn)
}

// fetch opens an ADS stream as node and returns the first response for typeURL and names.
func fetch(t *testing.T, ads discovery.AggregatedDiscoveryServiceClient, node *core.Node, typeURL string, names ...string) *discovery.DiscoveryResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("%s for %s: %v", typeURL, node.GetId(), err)
	}
	return resp
}

// Over real ADS: an east-west gateway gets its listeners and only its
// network's endpoints; a proxyless client beside it still gets API
// listeners and split-horizon endpoints; a gateway with bad metadata gets nothing.
func TestGatewaysAreServedTheirOwnResources(t *testing.T) {
	r := goldenRegistry(t)
	nets := registry.Networks{
		Clusters: map[registry.ClusterID]registry.Network{"east": "net-a", "west": "net-b"},
		Gateways: map[registry.Network][]registry.Gateway{"net-b": {{Address: "192.0.2.20", Port: EastWestHTTP2Port}}},
	}
	_, ads := serve(t, r, nets)

	names := func(resp *discovery.DiscoveryResponse) []string {
		var out []string
		for _, a := range resp.GetResources() {
			var l listener.Listener
			if err := a.UnmarshalTo(&l); err != nil {
				t.Fatal(err)
			}
			out = append(out, l.GetName())
		}
		slices.Sort(out)
		return out
	}
	gw := gatewayNode(RoleEastWest, "net-a", nil)
	if got := names(fetch(t, ads, gw, resource.ListenerType)); !slices.Equal(got, []string{EastWestHTTP2Listener, EastWestTLSListener}) {
		t.Errorf("east-west gateway listeners %v", got)
	}
	plain := &core.Node{Id: "plain", Locality: &core.Locality{Region: "r1", Zone: "z1"}}
	if got := names(fetch(t, ads, plain, resource.ListenerType, "echo.default.svc.clusterset.local:8080")); !slices.Equal(got, []string{"echo.default.svc.clusterset.local:8080"}) {
		t.Errorf("proxyless client listeners %v", got)
	}
	bad := gatewayNode("router", "net-a", nil)
	bad.Id = "bad"
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	stream, _ := ads.StreamAggregatedResources(ctx)
	_ = stream.Send(&discovery.DiscoveryRequest{Node: bad, TypeUrl: resource.ListenerType})
	if resp, err := stream.Recv(); err == nil && len(resp.GetResources()) > 0 {
		t.Errorf("a gateway with invalid metadata was served %d listeners", len(resp.GetResources()))
	}

	addrs := func(resp *discovery.DiscoveryResponse) []string {
		var out []string
		for _, a := range resp.GetResources() {
			var cla endpoint.ClusterLoadAssignment
			if err := a.UnmarshalTo(&cla); err != nil {
				t.Fatal(err)
			}
			for _, l := range cla.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					out = append(out, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
				}
			}
		}
		slices.Sort(out)
		return out
	}
	echo8080 := xds.ClusterName(echo, 8080)
	// The east-west gateway of net-a forwards into net-a only: never to net-b's gateway.
	if got := addrs(fetch(t, ads, gw, resource.EndpointType, echo8080)); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Errorf("east-west gateway of net-a: echo endpoints %v, want net-a's only", got)
	}
	// A proxyless client on net-a reaches net-b through net-b's gateway.
	plain.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{xds.MetadataNetwork: structpb.NewStringValue("net-a")}}
	if got := addrs(fetch(t, ads, plain, resource.EndpointType, echo8080)); !slices.Equal(got, []string{"10.0.0.1", "192.0.2.20"}) {
		t.Errorf("proxyless client on net-a: echo endpoints %v, want its own and net-b's gateway", got)
	}
}
