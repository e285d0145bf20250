package registry

import (
	"testing"
	"time"

	"github.com/navemesh/nave/traffic"
)

func sampleRoute(created time.Time) traffic.Route {
	return traffic.Route{Kind: traffic.GRPCRoute, Name: "split", CreatedAt: created, Rules: []traffic.Rule{{
		Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "web", Weight: 1}}}}}
}

func trafficShard(cluster ClusterID, set traffic.Set) *Shard {
	s := shard(cluster, keyWeb, []ServicePort{tcp("grpc", 8080)}, endpoint("10.0.0.1", eport("grpc", 9090)))
	s.Traffic = set
	s.Normalize()
	return s
}

// The same GRPCRoute applied to two clusters (GitOps: one manifest, every
// cluster) has each cluster's own creation time; merged, it is one route,
// not a RouteConflict on every multi-cluster route.
func TestSameRouteInTwoClustersIsNoConflict(t *testing.T) {
	east := trafficShard("east", traffic.Set{Routes: []traffic.Route{sampleRoute(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}})
	west := trafficShard("west", traffic.Set{Routes: []traffic.Route{sampleRoute(time.Date(2026, 1, 1, 0, 0, 7, 0, time.UTC))}})
	for _, s := range []*Shard{east, west} {
		if err := s.Validate(DefaultLimits()); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := New().Apply(Change{Cluster: "east", Upserts: []*Shard{east}})
	r, _ = r.Apply(Change{Cluster: "west", Upserts: []*Shard{west}})
	svc := r.Service(keyWeb)
	for _, c := range svc.Conflicts {
		if c.Kind == RouteConflict {
			t.Errorf("one route applied alike in two clusters is a conflict: %s", c.Reason)
		}
	}
}

// A change of traffic alone is a shape change (xDS rebuilds routes and
// clusters), and the registry's snapshot keeps the traffic.
func TestTrafficOnlyChangeIsAShapeChange(t *testing.T) {
	a := trafficShard("east", traffic.Set{})
	b := trafficShard("east", traffic.Set{Policy: &traffic.Policy{Name: "p",
		LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash}}})
	r, _ := New().Apply(Change{Cluster: "east", Upserts: []*Shard{a}})
	r, d := r.Apply(Change{Cluster: "east", Upserts: []*Shard{b}})
	if len(d.Services) != 1 || !d.Services[0].ShapeChanged {
		t.Fatalf("diff of a traffic-only change = %+v, want a shape change", d.Services)
	}
	t.Logf("EndpointsChanged=%v for a traffic-only change", d.Services[0].EndpointsChanged)
	enc, err := EncodeSnapshot(r.Snapshot(nil))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := DecodeSnapshot(enc)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Clusters[0].Shards[0]; !got.Equal(b) || got.Hash() != b.Hash() {
		t.Errorf("snapshot round trip: %+v, want %+v", got.Traffic, b.Traffic)
	}
}
