package imports

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/navemesh/nave/registry"
)

// benchService is a 1,000-endpoint service exported by 10 clusters.
func benchService(b *testing.B) *registry.Service {
	var shards []*registry.Shard
	for c := range 10 {
		var eps []registry.Endpoint
		for i := range 100 {
			e := ep(netip.AddrFrom4([4]byte{10, byte(c), byte(i >> 8), byte(i)}).String())
			e.Hostname = fmt.Sprintf("pod-%d", i)
			eps = append(eps, e)
		}
		shards = append(shards, shard(registry.ClusterID(fmt.Sprintf("cluster-%d", c)), 0, eps...))
	}
	return merged(b, shards...)
}

func BenchmarkBuild(b *testing.B) {
	svc := benchService(b)
	ips := []netip.Addr{addr("10.99.0.1")}
	b.ReportAllocs()
	for b.Loop() {
		Build(svc, nil, ips)
	}
}

func BenchmarkHash(b *testing.B) {
	imp, _ := Build(benchService(b), nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		imp.Hash()
	}
}

// BenchmarkSlices is the steady state: the cluster already holds the slices.
func BenchmarkSlices(b *testing.B) {
	imp, _ := Build(benchService(b), nil, nil)
	prev := Slices(imp, nil)
	b.ReportAllocs()
	for b.Loop() {
		Slices(imp, prev)
	}
}

// BenchmarkSlicesFromScratch packs into a cluster that holds nothing yet.
func BenchmarkSlicesFromScratch(b *testing.B) {
	imp, _ := Build(benchService(b), nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		Slices(imp, nil)
	}
}
