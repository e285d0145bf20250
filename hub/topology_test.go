package hub_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/registry"
)

// The topology counts each cluster's endpoints by region, zone and
// health, over every service, whatever ports they have.
func TestTopology(t *testing.T) {
	ep := func(addr, region, zone string, c registry.Conditions) registry.Endpoint {
		return registry.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, Locality: registry.Locality{Region: region, Zone: zone}, Conditions: c}
	}
	ready, draining := registry.Conditions{Ready: true, Serving: true}, registry.Conditions{Serving: true, Terminating: true}
	shard := func(cluster registry.ClusterID, name string, port int32, eps ...registry.Endpoint) *registry.Shard {
		s := &registry.Shard{Cluster: cluster, Service: registry.ServiceKey{Namespace: "d", Name: name},
			Ports: []registry.ServicePort{{Name: "p", Port: port, Protocol: registry.ProtocolTCP}}, Endpoints: eps}
		s.Normalize()
		return s
	}
	r := registry.New()
	r, _ = r.Apply(registry.Change{Cluster: "east", Upserts: []*registry.Shard{
		shard("east", "api", 80, ep("10.0.0.1", "r1", "a", ready), ep("10.0.0.2", "r1", "b", draining)),
		shard("east", "web", 8080, ep("10.0.0.3", "r1", "a", ready), ep("10.0.0.4", "r1", "a", registry.Conditions{})),
	}})
	r, _ = r.Apply(registry.Change{Cluster: "west", Upserts: []*registry.Shard{shard("west", "api", 81, ep("10.0.0.1", "r2", "c", ready))}})
	got := hub.Topology(r)
	want := []adminapi.LocalityCount{
		{Region: "r1", Zone: "a", Cluster: "east", Healthy: 2, NotReady: 1},
		{Region: "r1", Zone: "b", Cluster: "east", Draining: 1},
		{Region: "r2", Zone: "c", Cluster: "west", Healthy: 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("topology %+v\nwant %+v", got, want)
	}
}
