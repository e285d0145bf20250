package gateways

import (
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
	"github.com/navemesh/nave/xds"
)

// trafficRegistry: echo (public, in east and west) with a GRPCRoute that
// splits 80/20 between itself and echo-v2 (not public), sends x-canary
// requests to its own cluster's echo-v2 (a Service backend), and one
// method to ghost, which no cluster exports; echo's policy has a timeout
// and a retry; echo-v2's hashes on a header.
func trafficRegistry(t *testing.T) *registry.Registry {
	t.Helper()
	grpc := []registry.ServicePort{{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}}
	public := registry.Properties{Labels: map[string]string{"public": "true"}}
	v2 := registry.ServiceKey{Namespace: "default", Name: "echo-v2"}
	imp := func(name string, w int32) traffic.Backend {
		return traffic.Backend{Kind: traffic.BackendServiceImport, Name: name, Weight: w}
	}
	set := traffic.Set{
		Routes: []traffic.Route{{Kind: traffic.GRPCRoute, Name: "echo", Port: 8080, CreatedAt: time.Unix(1_700_000_000, 0), Rules: []traffic.Rule{
			{Matches: []traffic.Match{{Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-canary", Value: "yes"}}}},
				Backends: []traffic.Backend{{Kind: traffic.BackendService, Name: "echo-v2", Port: 8080, Weight: 1}}},
			{Matches: []traffic.Match{{Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "echo.Echo", Method: "Ghost"}}},
				Backends: []traffic.Backend{imp("ghost", 1)}},
			{Backends: []traffic.Backend{imp("echo", 80), imp("echo-v2", 20)}},
		}}},
		Policy: &traffic.Policy{Name: "echo", Timeout: time.Second, Retry: &traffic.Retry{Attempts: 2, GRPCCodes: []string{"unavailable"}},
			LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.LeastRequest}},
	}
	east := shard("east", echo, public, grpc, "10.0.0.1")
	east.Traffic = set
	east.Normalize()
	v2s := shard("west", v2, registry.Properties{}, grpc, "10.1.0.9")
	v2s.Traffic = traffic.Set{Policy: &traffic.Policy{Name: "v2", LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-user"}}}
	v2s.Normalize()
	r := registry.New()
	for _, s := range []*registry.Shard{east, shard("west", echo, public, grpc, "10.1.0.1"), v2s} {
		if err := s.Validate(registry.DefaultLimits()); err != nil {
			t.Fatal(err)
		}
		r, _ = r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
	}
	return r
}

// An ingress gateway serves an exposed service's routes and policies as
// every client of it gets them (host rewritten to the service's
// authority), with a cluster for each backend its routes name; an
// east-west gateway applies each service's policy among its endpoints.
func TestGatewayTrafficGolden(t *testing.T) {
	r := trafficRegistry(t)
	n, ok, err := ParseNode(gatewayNode(RoleIngress, "net-a", map[string]string{
		MetadataExposeNamespaces: "default", MetadataExposeSelector: "public=true", MetadataListeners: "8080/http",
	}), Exposure{})
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	v2 := registry.ServiceKey{Namespace: "default", Name: "echo-v2"}
	ghost := xds.ClusterName(registry.ServiceKey{Namespace: "default", Name: "ghost"}, 8080)
	res := Ingress(r, n)
	check(t, r, res, xds.LocalClusterName(v2, 8080), ghost)
	golden(t, "ingress-traffic", res)
	named := map[string]bool{}
	for _, c := range res.Clusters {
		named[c.GetName()] = true
	}
	for _, want := range []string{xds.ClusterName(echo, 8080), xds.ClusterName(v2, 8080), xds.LocalClusterName(v2, 8080), ghost} {
		if !named[want] {
			t.Errorf("ingress clusters %v lack %s", named, want)
		}
	}
	for _, vh := range res.Routes[0].GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			if a := rt.GetRoute(); a != nil && a.GetHostRewriteLiteral() != "echo.default.svc.clusterset.local:8080" {
				t.Errorf("route %v rewrites the host to %q", rt.GetMatch(), a.GetHostRewriteLiteral())
			}
			if a := rt.GetRoute(); a != nil && a.GetRetryPolicy().GetRetryOn() != "unavailable" {
				t.Errorf("route %v: retry %v, want the policy's", rt.GetMatch(), a.GetRetryPolicy())
			}
		}
	}
	ew := EastWest(r)
	check(t, r, ew)
	golden(t, "eastwest-traffic", ew)
}
