package xds

import (
	"fmt"
	"runtime"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/registry"
)

// nodeInCluster is a client node in locality l that names its cluster (CLUSTER_ID), as
// Istio bootstraps and the node agent do.
func nodeInCluster(l registry.Locality, cluster registry.ClusterID) *core.Node {
	n := nodeAt(l, "")
	n.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{MetadataCluster: structpb.NewStringValue(string(cluster))}}
	return n
}

// Clients that name their cluster (as Istio bootstraps and the node agent
// do) are grouped per cluster too: a Service backend and a failoverPriority
// naming nave.io/cluster hand each cluster's clients their own assignment.
// Where the assignment does not depend on the cluster, the groups of one
// zone share one computation of it, so an endpoint change costs what it
// did per zone: the same assignment object in both groups' caches.
func TestClusterGroupsShareAssignmentsThatIgnoreTheCluster(t *testing.T) {
	s := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	r, d := apply(t, registry.New(),
		shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))),
		shard("west", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))))
	s.Update(r, d)
	east := s.edsCache(nodeInCluster(loc("r1", "z1"), "east"))
	west := s.edsCache(nodeInCluster(loc("r1", "z1"), "west"))
	if n := len(*s.groups.Load()); n != 2 {
		t.Fatalf("%d EDS caches, want one per cluster", n)
	}
	r, d = apply(t, r, shard("west", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.1", loc("r1", "z1"), draining, eport("grpc", 9090))))
	s.Update(r, d)
	name := ClusterName(echo, 8080)
	a, b := east.linear.GetResources()[name], west.linear.GetResources()[name]
	if a == nil || a != b {
		t.Errorf("the two clusters' groups of zone r1/z1 hold %p and %p, want one assignment computed once", a, b)
	}
}

// BenchmarkClusterIDGroups is BenchmarkSplitHorizon's registry (10
// clusters, 2 per region, 1,000 services x 10 endpoints) with clients in
// every zone of every region, in each of the region's two clusters: with
// and without CLUSTER_ID in their nodes.
func BenchmarkClusterIDGroups(b *testing.B) {
	for _, named := range []bool{false, true} {
		b.Run(fmt.Sprintf("clusterID=%v", named), func(b *testing.B) {
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r, flip := largeRegistry(b)
			s := NewServer(DefaultConfig(), Wiring{}, nil, nil)
			s.Update(r, registry.Diff{})
			for region := range 5 {
				for z := range 3 {
					l := loc(fmt.Sprintf("region-%d", region), fmt.Sprintf("region-%d-%c", region, 'a'+z))
					for c := 2 * region; c < 2*region+2; c++ {
						n := nodeAt(l, "")
						if named {
							n = nodeInCluster(l, registry.ClusterID(fmt.Sprintf("c%d", c)))
						}
						s.edsCache(n)
					}
				}
			}
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			held := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
			groups := float64(len(*s.groups.Load()))
			drained, toDrained := flip(7, draining)
			_, toBack := flip(7, ready)
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

// An endpoint change of a service no route names as a Service backend
// costs nothing in touchLocal (before it returned early, it made the
// routing maps and two cluster names per port: BenchmarkUpdateOneEndpoint
// 181 allocations an Update before Service backends, 188 after).
func TestTouchLocalCostsNothingWithoutServiceBackends(t *testing.T) {
	s := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	r, d := apply(t, registry.New(), shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))))
	s.Update(r, d)
	ports := ServicePorts(r.Service(echo))
	allocs := testing.AllocsPerRun(100, func() {
		var routing routingChanges
		s.touchLocal(echo, ports, &routing)
	})
	if allocs > 0 {
		t.Errorf("touchLocal of a service no route uses: %.0f allocations, want 0", allocs)
	}
}
