package federation

import (
	"fmt"
	"log/slog"
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/registry"
)

// BenchmarkSpokeChange is a spoke's work for one endpoint change, from the
// source's hand-over to the update's wire form (what gRPC then sends), in
// clusters of 1,000 and 10,000 services of 10 endpoints: the cost of a
// change must not grow with the cluster.
func BenchmarkSpokeChange(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			st, forms := State{}, make([][2]*registry.Shard, n)
			addrs := func(i, last int) []string {
				out := make([]string, 10)
				for j := range out {
					out[j] = fmt.Sprintf("10.%d.%d.%d", i/250, i%250, j)
				}
				out[9] = fmt.Sprintf("10.%d.%d.%d", i/250, i%250, last)
				return out
			}
			for i := range n {
				name := fmt.Sprintf("svc-%05d", i)
				forms[i] = [2]*registry.Shard{testShard("east", name, addrs(i, 100)...), testShard("east", name, addrs(i, 101)...)}
				st[forms[i][0].Service] = forms[i][0]
			}
			src := NewChanges()
			src.Set(maps.Clone(st))
			p := NewPublisher(DefaultSpokeConfig(), SpokeWiring{Cluster: "east"}, nil, slog.New(slog.DiscardHandler))
			p.maxBytes = 1 << 20
			p.take(src)
			p.resetAcked(maps.Clone(p.desired))
			clear(p.dirty)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				s := i % n
				sh := forms[s][(i/n+1)%2]
				src.Apply(State{sh.Service: sh}, nil)
				p.take(src)
				batch := p.delta()
				if len(batch) != 1 || len(batch[0].upserts) != 1 {
					b.Fatalf("change %d: %d updates", i, len(batch))
				}
				if _, err := proto.Marshal(encodeUpdate(batch[0])); err != nil {
					b.Fatal(err)
				}
				p.applyAcked(batch[0])
			}
		})
	}
}
