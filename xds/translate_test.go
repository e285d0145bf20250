package xds

import (
	"errors"
	"maps"
	"slices"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	goldenfile "github.com/navemesh/nave/internal/golden"
	"github.com/navemesh/nave/registry"
)

// goldenRegistry is a small multi-cluster registry: echo is exported by east
// (two zones of r1) and west (r2) with per-cluster port names, a draining and
// an excluded endpoint and a UDP port; cart only by west.
func goldenRegistry(t *testing.T) *registry.Registry {
	t.Helper()
	cart := registry.ServiceKey{Namespace: "shop", Name: "cart"}
	r, _ := apply(t, registry.New(),
		shard("east", echo, []registry.ServicePort{tcp("grpc", 8080), tcp("metrics", 9000), {Name: "dns", Port: 53, Protocol: registry.ProtocolUDP}},
			ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090), eport("metrics", 9100), eport("dns", 53)),
			ep("10.0.0.2", loc("r1", "z1"), draining, eport("grpc", 9090), eport("metrics", 9100), eport("dns", 53)),
			ep("10.0.0.3", loc("r1", "z1"), notReady, eport("grpc", 9090), eport("metrics", 9100), eport("dns", 53)),
			ep("10.0.1.1", loc("r1", "z2"), ready, eport("grpc", 9090), eport("metrics", 9100), eport("dns", 53)),
			ep("10.0.1.2", registry.Locality{Region: "r1", Zone: "z2", Subzone: "rack1"}, ready, eport("grpc", 9090), eport("metrics", 9100), eport("dns", 53))),
		shard("west", echo, []registry.ServicePort{tcp("api", 8080)},
			ep("10.1.0.1", loc("r2", "z3"), ready, eport("api", 7070)),
			ep("2001:db8::1", loc("r2", "z3"), ready, eport("api", 7070))),
		shard("west", cart, []registry.ServicePort{tcp("", 80)},
			ep("10.1.1.1", loc("r2", "z3"), ready, eport("", 8080)),
			ep("10.1.1.2", loc("r2", "z4"), ready, eport("", 8080))),
	)
	return r
}

func TestServedResourcesGolden(t *testing.T) {
	r := goldenRegistry(t)
	clients := map[string]registry.Locality{
		"default": {},
		"r1-z1":   loc("r1", "z1"),
		"r1-z2":   loc("r1", "z2"),
		"r2-z3":   loc("r2", "z3"),
	}
	var shared servedSet
	for name, client := range clients {
		res := served(t, r, client)
		golden(t, "endpoints-"+name, res.Assignments)
		shared = res
	}
	golden(t, "listeners", shared.Listeners)
	golden(t, "routes", shared.Routes)
	golden(t, "clusters", shared.Clusters)
}

// goldenNetworks puts east on network net-a and west on net-b, each with a
// gateway (net-a's second one known only by name), and names net-c, with no
// gateway, for a cluster that exports nothing.
var goldenNetworks = registry.Networks{
	Clusters: map[registry.ClusterID]registry.Network{"east": "net-a", "west": "net-b", "south": "net-c"},
	Gateways: map[registry.Network][]registry.Gateway{
		"net-a": {{Address: "192.0.2.10", Port: 15443}, {Address: "gw-a.example.com", Port: 15443}},
		"net-b": {{Address: "192.0.2.20", Port: 15443}, {Address: "192.0.2.21", Port: 15443}},
	},
}

func TestSplitHorizonEndpointsGolden(t *testing.T) {
	r := goldenRegistry(t)
	clients := map[string]*core.Node{
		"net-a-r1-z1": nodeAt(loc("r1", "z1"), "net-a"),
		"net-b-r2-z3": nodeAt(loc("r2", "z3"), "net-b"),
		"net-c-r1-z2": nodeAt(loc("r1", "z2"), "net-c"),
	}
	for name, node := range clients {
		res := servedWith(t, r, goldenNetworks, node)
		golden(t, "split-"+name, res.Assignments)
		for _, cla := range res.Assignments {
			if err := Validate(cla); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	// A client that names only its cluster is on that cluster's network.
	byCluster := nodeAt(loc("r2", "z3"), "")
	byCluster.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{MetadataCluster: structpb.NewStringValue("west")}}
	if got, want := servedWith(t, r, goldenNetworks, byCluster), servedWith(t, r, goldenNetworks, clients["net-b-r2-z3"]); !slices.EqualFunc(got.Assignments, want.Assignments, func(a, b *endpoint.ClusterLoadAssignment) bool { return proto.Equal(a, b) }) {
		t.Errorf("a client naming cluster west got\n%v\nwant net-b's\n%v", got.Assignments, want.Assignments)
	}
}

// golden compares the resources, rendered as sorted, indented JSON, with
// testdata/<name>.golden (rewritten with -update).
func golden[T proto.Message](t *testing.T, name string, resources []T) {
	t.Helper()
	list := make([]any, 0, len(resources))
	for _, m := range resources {
		list = append(list, goldenfile.Proto(t, m))
	}
	goldenfile.Check(t, name+".golden", goldenfile.JSON(t, list))
}

func TestTranslateLeavesOutInvalid(t *testing.T) {
	// A service whose only endpoints are draining yields an empty (valid) assignment,
	// not a locality of weight 0.
	r, _ := apply(t, registry.New(), shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), draining, eport("grpc", 9090))))
	res := served(t, r, loc("r1", "z1"))
	if len(res.Assignments) != 1 || len(res.Assignments[0].GetEndpoints()) != 0 {
		t.Fatalf("want one empty assignment, got %v", res.Assignments)
	}
	if err := Validate(res.Listeners[0]); err != nil {
		t.Fatalf("listener: %v", err)
	}
	bad := res.Clusters[0]
	bad.Name = ""
	if err := Validate(bad); !errors.Is(err, ErrInvalidResource) {
		t.Fatalf("Validate(cluster without name) = %v, want ErrInvalidResource", err)
	}
}

// servedSet is everything the server publishes for one locality group of
// clients, each list sorted by name: what the golden files show.
type servedSet struct {
	Listeners   []*listener.Listener
	Routes      []*route.RouteConfiguration
	Clusters    []*cluster.Cluster
	Assignments []*endpoint.ClusterLoadAssignment
}

// served publishes r on a fresh server and reads back what its caches hold
// for clients in the client locality.
func served(t *testing.T, r *registry.Registry, client registry.Locality) servedSet {
	t.Helper()
	return servedWith(t, r, registry.Networks{}, nodeAt(client, ""))
}

// servedWith publishes r against the network topology nets and reads back
// what the caches hold for node.
func servedWith(t *testing.T, r *registry.Registry, nets registry.Networks, node *core.Node) servedSet {
	t.Helper()
	srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	srv.SetNetworks(nets)
	srv.Update(r, registry.Diff{})
	eds := srv.edsCache(node)
	srv.stateMu.Lock()
	defer srv.stateMu.Unlock()
	return servedSet{
		Listeners:   publishedOf[*listener.Listener](t, srv.lds),
		Routes:      publishedOf[*route.RouteConfiguration](t, srv.rds),
		Clusters:    publishedOf[*cluster.Cluster](t, srv.cds),
		Assignments: publishedOf[*endpoint.ClusterLoadAssignment](t, eds),
	}
}

// publishedOf reads what c's LinearCache holds, checking that it is what c
// believes it published, as clients decode it.
// decoded is m as a client reads it: marshalled, then unmarshalled.
func decoded[T proto.Message](t testing.TB, m T) T {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := m.ProtoReflect().New().Interface().(T)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func publishedOf[T proto.Message](t *testing.T, c *resourceCache) []T {
	t.Helper()
	held := c.linear.GetResources()
	if !slices.Equal(slices.Sorted(maps.Keys(held)), slices.Sorted(maps.Keys(c.published))) {
		t.Fatalf("%s cache holds %v, published %v", c.label, slices.Sorted(maps.Keys(held)), slices.Sorted(maps.Keys(c.published)))
	}
	out := make([]T, 0, len(held))
	for _, name := range slices.Sorted(maps.Keys(held)) {
		m, ok := held[name].(T)
		if !ok {
			t.Fatalf("%s cache holds %T", c.label, held[name])
		}
		out = append(out, decoded(t, m))
	}
	return out
}
