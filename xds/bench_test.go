package xds

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/navemesh/nave/registry"
)

// BenchmarkUpdateOneEndpoint measures Update for one endpoint flip in a
// registry of 1,000 services (3 clusters, 10 endpoints each), with 4 locality
// groups of clients.
func BenchmarkUpdateOneEndpoint(b *testing.B) {
	s := NewServer(DefaultConfig(), Wiring{}, nil, nil)
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

// largeRegistry is the large bench's registry: 10 clusters (2 per region, a
// zone each) x 1,000 services x 10 endpoints.
func largeRegistry(b *testing.B) (*registry.Registry, func(i int, cond registry.Conditions) (*registry.Registry, registry.Diff)) {
	b.Helper()
	shardOf := func(c, i int, cond registry.Conditions) *registry.Shard {
		var eps []registry.Endpoint
		region := fmt.Sprintf("region-%d", c/2)
		for e := range 10 {
			eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d", c, i/25, (i%25)*10+e), loc(region, fmt.Sprintf("%s-%c", region, 'a'+c%2)), cond, eport("grpc", 9090)))
		}
		return shard(registry.ClusterID(fmt.Sprintf("c%d", c)), registry.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, []registry.ServicePort{tcp("grpc", 8080)}, eps...)
	}
	r := registry.New()
	for c := range 10 {
		shards := make([]*registry.Shard, 0, 1000)
		for i := range 1000 {
			shards = append(shards, shardOf(c, i, ready))
		}
		r, _ = r.Apply(registry.Change{Cluster: registry.ClusterID(fmt.Sprintf("c%d", c)), Upserts: shards})
	}
	flip := func(i int, cond registry.Conditions) (*registry.Registry, registry.Diff) {
		return r.Apply(registry.Change{Cluster: "c0", Upserts: []*registry.Shard{shardOf(0, i, cond)}})
	}
	return r, flip
}

// BenchmarkSplitHorizon measures what networks cost the hub at the large
// bench's scale: the same registry and the same clients (every region's
// three zones), with every cluster and client on one network, or with the
// five regions spread over three networks (a region's clusters and clients
// on one network; each network with a gateway). It reports Update's time
// for one endpoint flip and the heap the xDS server holds once every
// client group is built.
func BenchmarkSplitHorizon(b *testing.B) {
	for _, networks := range []int{1, 3} {
		b.Run(fmt.Sprintf("networks=%d", networks), func(b *testing.B) {
			networkOf := func(region int) registry.Network { return registry.Network(fmt.Sprintf("net-%d", region%networks)) }
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r, flip := largeRegistry(b)
			nets := registry.Networks{Clusters: map[registry.ClusterID]registry.Network{}, Gateways: map[registry.Network][]registry.Gateway{}}
			for c := range 10 {
				nets.Clusters[registry.ClusterID(fmt.Sprintf("c%d", c))] = networkOf(c / 2)
			}
			for n := range networks {
				nets.Gateways[networkOf(n)] = []registry.Gateway{{Address: fmt.Sprintf("192.0.2.%d", n+1), Port: 15444}}
			}
			s := NewServer(DefaultConfig(), Wiring{}, nil, nil)
			s.SetNetworks(nets)
			s.Update(r, registry.Diff{})
			for region := range 5 {
				for z := range 3 {
					l := loc(fmt.Sprintf("region-%d", region), fmt.Sprintf("region-%d-%c", region, 'a'+z))
					s.edsCache(nodeAt(l, networkOf(region)))
				}
			}
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			held := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
			groups := float64(len(*s.groups.Load()))
			drained, toDrained := flip(7, draining)
			back, toBack := flip(7, ready)
			_ = back
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if i%2 == 0 {
					s.Update(drained, toDrained)
				} else {
					s.Update(r, toBack)
				}
			}
			b.ReportMetric(held, "MiB-held")
			b.ReportMetric(groups, "groups")
		})
	}
}

// BenchmarkInternRequest measures what interning costs a request naming 92
// resources the table holds (a node agent's ACK).
func BenchmarkInternRequest(b *testing.B) {
	table := newNameTable(maxInterned)
	names := make([]string, 92)
	for i := range names {
		names[i] = ClusterName(registry.ServiceKey{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)}, 8080)
	}
	table.intern(names)
	b.ReportAllocs()
	for b.Loop() {
		table.intern(names)
	}
}
