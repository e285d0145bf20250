package federation

import (
	"fmt"
	"testing"

	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// BenchmarkImportChange is one import change as a spoke's session takes it,
// with 1,000 and 10,000 imports: the hub's next set (the current one with
// the change), the session's delta, its wire form, and the spoke's ack. The
// cost of a change must not grow with the imports.
func BenchmarkImportChange(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("imports=%d", n), func(b *testing.B) {
			forms := make([][2]*imports.Import, n)
			for i := range forms {
				name := fmt.Sprintf("svc-%05d", i)
				forms[i] = [2]*imports.Import{testImport("default", name, "10.0.0.1", "10.0.0.2"), testImport("default", name, "10.0.0.1", "10.0.0.3")}
			}
			all := make([]*imports.Import, n)
			for i := range forms {
				all[i] = forms[i][0]
			}
			src := newImportSource(true, all...)
			s, stream := importSession(src, 4<<20)
			im := newHubImports(s, []string{"default"})
			s.imports = im
			if err := im.next(); err != nil {
				b.Fatal(err)
			}
			ackAll(b, im, stream)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				imp := forms[i%n][(i/n+1)%2]
				src.mu.Lock()
				src.replace(src.set.Then(src.set.Imports.Set(imp.Service, imp), []registry.ServiceKey{imp.Service}, true))
				src.mu.Unlock()
				if err := im.next(); err != nil {
					b.Fatal(err)
				}
				if len(stream.sent) != 1 || len(stream.sent[0].GetImports().GetUpserts()) != 1 {
					b.Fatalf("change %d: sent %d messages", i, len(stream.sent))
				}
				u := stream.sent[0].GetImports()
				stream.sent = stream.sent[:0]
				if err := im.handle(ackMessage(u)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
