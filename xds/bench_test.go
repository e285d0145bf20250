package xds

import (
	"fmt"
	"testing"

	"github.com/navemesh/nave/registry"
)

// BenchmarkUpdateOneEndpoint measures Update for one endpoint flip in a
// registry of 1,000 services (3 clusters, 10 endpoints each), with 4 locality
// groups of clients.
func BenchmarkUpdateOneEndpoint(b *testing.B) {
	s := NewServer(DefaultConfig(), nil, nil)
	r := registry.New()
	shardOf := func(cluster registry.ClusterID, i, c int, cond registry.Conditions) *registry.Shard {
		var eps []registry.Endpoint
		for e := range 10 {
			eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d", c, i/25, (i%25)*10+e), loc(fmt.Sprintf("r%d", c%2), fmt.Sprintf("z%d", c)), cond, eport("grpc", 9090)))
		}
		return shard(cluster, registry.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, []registry.ServicePort{tcp("grpc", 8080)}, eps...)
	}
	for c, cluster := range []registry.ClusterID{"east", "west", "north"} {
		var shards []*registry.Shard
		for i := range 1000 {
			shards = append(shards, shardOf(cluster, i, c, ready))
		}
		r, _ = r.Apply(registry.Change{Cluster: cluster, Upserts: shards})
	}
	s.Update(r, registry.Diff{})
	for _, l := range []registry.Locality{{}, loc("r0", "z0"), loc("r1", "z1"), loc("r0", "z2")} {
		s.edsCache(nodeAt(l, ""))
	}
	// Two registries to alternate between, so the loop measures Update alone.
	drained, toDrained := r.Apply(registry.Change{Cluster: "east", Upserts: []*registry.Shard{shardOf("east", 7, 0, draining)}})
	back, toBack := drained.Apply(registry.Change{Cluster: "east", Upserts: []*registry.Shard{shardOf("east", 7, 0, ready)}})
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			s.Update(drained, toDrained)
		} else {
			s.Update(back, toBack)
		}
	}
}
