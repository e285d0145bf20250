package registry

import (
	"fmt"
	"net/netip"
	"testing"
)

// benchShard is cluster c's shard of its i-th service, with one endpoint
// whose address depends on v: the benchmark changes a service by changing v.
func benchShard(c, i, v int) *Shard {
	k := ServiceKey{Namespace: fmt.Sprint("team-", i%100), Name: fmt.Sprintf("svc-%d-%d", c, i)}
	addr := netip.AddrFrom4([4]byte{10, byte(c), byte(i >> 8), byte(i)})
	if v != 0 {
		addr = netip.AddrFrom4([4]byte{10, byte(100 + v), byte(i >> 8), byte(i)})
	}
	return shard(ClusterID(fmt.Sprint("c", c)), k, []ServicePort{tcp("http", 80)}, endpoint(addr.String(), eport("http", 8080)))
}

// BenchmarkApplyOneChange measures what the hub pays for one endpoint
// change of one service as the registry grows: every iteration applies one
// changed shard to the latest registry, as a spoke's update does.
func BenchmarkApplyOneChange(b *testing.B) {
	for _, size := range []struct{ clusters, services int }{{10, 1_000}, {10, 10_000}, {10, 100_000}} {
		b.Run(fmt.Sprintf("services=%d/clusters=%d", size.services, size.clusters), func(b *testing.B) {
			r := New()
			for c := range size.clusters {
				ch := Change{Cluster: ClusterID(fmt.Sprint("c", c)), Replace: true}
				for i := range size.services {
					ch.Upserts = append(ch.Upserts, benchShard(c, i, 0))
				}
				r, _ = r.Apply(ch)
			}
			// Changed shards are made ahead, so only Apply is measured: each
			// of 512 services (spread over clusters) alternates two states.
			const ring = 512
			var changes [2][ring]Change
			for j := range ring {
				c, i := j%size.clusters, (j*7919)%size.services
				for v := range 2 {
					changes[v][j] = Change{Cluster: ClusterID(fmt.Sprint("c", c)), Upserts: []*Shard{benchShard(c, i, v+1)}}
				}
			}
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				var d Diff
				r, d = r.Apply(changes[(n/ring)%2][n%ring])
				if len(d.Services) != 1 {
					b.Fatalf("diff %+v, want one service", d)
				}
				n++
			}
		})
	}
}
