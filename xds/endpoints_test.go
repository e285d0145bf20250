package xds

import (
	"fmt"
	"math/rand/v2"
	"testing"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/registry"
)

// TestSharedAssignmentsMatchAssign checks the fast path against the reference:
// for random services (several clusters and localities, draining and
// not-ready endpoints, addresses repeated across clusters) and every locality
// group, the assignment derived from shared blocks decodes, as a client
// decodes it, to exactly ClusterLoadAssignment(Assign(...)), is valid, and
// its sum changes exactly when the resource does.
func TestSharedAssignmentsMatchAssign(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	localities := []registry.Locality{loc("r1", "z1"), loc("r1", "z2"), loc("r2", "z3"), {Region: "r2", Zone: "z3", Subzone: "rack1"}, {}}
	var groups []Client
	for _, network := range []registry.Network{"", "n1", "n2", "n3"} {
		for _, l := range []registry.Locality{{}, loc("r1", "z1"), loc("r1", "z2"), loc("r2", "z3"), loc("r3", "z9")} {
			groups = append(groups, Client{Network: network, Locality: l})
			if network == "n1" {
				groups = append(groups, Client{Network: network, Locality: l, NetworkOnly: true})
			}
		}
	}
	// Topologies: none; every cluster on its own network, some with gateways
	// (one shared by two networks, one known only by name); two clusters on one network.
	gwA, gwB := registry.Gateway{Address: "192.0.2.1", Port: 15443}, registry.Gateway{Address: "192.0.2.2", Port: 15443}
	topologies := []registry.Networks{
		{},
		{Clusters: map[registry.ClusterID]registry.Network{"east": "n1", "west": "n2", "north": "n3"},
			Gateways: map[registry.Network][]registry.Gateway{"n1": {gwA, gwB}, "n2": {gwB}, "n3": {{Address: "gw.example.com", Port: 15443}}}},
		{Clusters: map[registry.ClusterID]registry.Network{"east": "n1", "west": "n1"},
			Gateways: map[registry.Network][]registry.Gateway{"n1": {gwA}}},
	}
	conditions := []registry.Conditions{ready, ready, ready, draining, notReady}
	port := tcp("grpc", 8080)

	type published struct {
		client Client
		cla    *endpoint.ClusterLoadAssignment
		sum    uint64
	}
	var seen []published
	var prev *portEndpoints
	for round := range 120 {
		var shards []*registry.Shard
		for c, cluster := range []registry.ClusterID{"east", "west", "north"} {
			var eps []registry.Endpoint
			for range rng.IntN(6) {
				// Few addresses, so clusters sometimes name the same one (shadowing).
				addr := fmt.Sprintf("10.0.%d.%d", rng.IntN(2), rng.IntN(6))
				if rng.IntN(3) > 0 {
					addr = fmt.Sprintf("10.%d.%d.%d", c+1, rng.IntN(2), rng.IntN(6))
				}
				eps = append(eps, ep(addr, localities[rng.IntN(len(localities))], conditions[rng.IntN(len(conditions))], eport("grpc", 9090)))
			}
			if len(eps) > 0 {
				shards = append(shards, shard(cluster, echo, []registry.ServicePort{port}, dedupe(eps)...))
			}
		}
		if len(shards) == 0 {
			continue
		}
		r, _ := apply(t, registry.New(), shards...)
		svc := r.Service(echo)
		nets := topologies[(round/3)%len(topologies)]
		topo := newTopology(nets)
		if round%3 == 0 {
			prev = nil // a new topology: nothing to reuse
		}
		// Built from scratch, and from the previous round's form (reusing what it can).
		pe, err := newPortEndpoints(svc, port, nil, topo)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		reused, err := newPortEndpoints(svc, port, prev, topo)
		if err != nil {
			t.Fatalf("round %d, reusing: %v", round, err)
		}
		prev = reused
		for _, g := range groups {
			want := ClusterLoadAssignment(AssignFor(svc, port, g, nets))
			if g.Network == "" {
				if plain := ClusterLoadAssignment(Assign(svc, port, g.Locality)); !proto.Equal(plain, want) {
					t.Fatalf("round %d, group %v: a client without a network is not assigned as before networks", round, g)
				}
			}
			cla, sum := pe.forClient(g, topo)
			got := decoded(t, cla)
			if !proto.Equal(got, want) {
				t.Fatalf("round %d, group %v:\nshared %v\nAssign %v", round, g, got, want)
			}
			if err := Validate(got); err != nil {
				t.Fatalf("round %d, group %v: %v", round, g, err)
			}
			if rcla, rsum := reused.forClient(g, topo); !proto.Equal(decoded(t, rcla), want) || rsum != sum {
				t.Fatalf("round %d, group %v: built from the previous form\n%v\nwant %v", round, g, decoded(t, rcla), want)
			}
			seen = append(seen, published{g, got, sum})
		}
	}
	// Sums agree with proto.Equal on every pair of one client's (what one EDS cache compares).
	equalPairs := 0
	for i := range seen {
		for j := i + 1; j < len(seen); j++ {
			if seen[i].client != seen[j].client {
				continue
			}
			same := proto.Equal(seen[i].cla, seen[j].cla)
			if same {
				equalPairs++
			}
			if same != (seen[i].sum == seen[j].sum) {
				t.Fatalf("resources %d and %d: proto.Equal %v but sums %x and %x:\n%v\n%v", i, j, same, seen[i].sum, seen[j].sum, seen[i].cla, seen[j].cla)
			}
		}
	}
	if equalPairs == 0 {
		t.Fatal("no two resources were equal: the sum check proved nothing")
	}
}

// dedupe keeps the first endpoint of each address: one cluster never names an address twice.
func dedupe(eps []registry.Endpoint) []registry.Endpoint {
	seen := map[string]bool{}
	out := eps[:0]
	for _, e := range eps {
		if a := e.Addresses[0].String(); !seen[a] {
			seen[a] = true
			out = append(out, e)
		}
	}
	return out
}

// A change rebuilds only the localities it touched: the others keep their
// blocks, already validated and marshalled.
func TestChangeRebuildsOnlyItsLocalities(t *testing.T) {
	port := tcp("grpc", 8080)
	build := func(zone2 registry.Conditions, prev *portEndpoints) *portEndpoints {
		t.Helper()
		r, _ := apply(t, registry.New(),
			shard("east", echo, []registry.ServicePort{port},
				ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)),
				ep("10.0.0.2", loc("r1", "z2"), zone2, eport("grpc", 9090)),
				ep("10.0.0.3", loc("r1", "z2"), ready, eport("grpc", 9090))),
			shard("west", echo, []registry.ServicePort{port},
				ep("10.1.0.1", loc("r2", "z3"), ready, eport("grpc", 9090))))
		pe, err := newPortEndpoints(r.Service(echo), port, prev, nil)
		if err != nil {
			t.Fatal(err)
		}
		return pe
	}
	before := build(ready, nil)
	after := build(draining, before)
	if len(after.blocks) != 3 {
		t.Fatalf("%d blocks, want 3", len(after.blocks))
	}
	for i, l := range after.localities {
		same := after.blocks[i].atPriority[0] == before.blocks[i].atPriority[0]
		if want := l.Zone != "z2"; same != want {
			t.Errorf("locality %v: block reused %v, want %v", l, same, want)
		}
	}
	_, sumBefore := before.forGroup(registry.Locality{})
	if _, sumAfter := after.forGroup(registry.Locality{}); sumAfter == sumBefore {
		t.Error("the assignment's sum did not change")
	}
}
