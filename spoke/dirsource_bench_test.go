package spoke

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkDirSourceEditToPublish measures how long a manifest edit takes
// to reach the directory source's publish, with the spoke's default poll
// interval (500ms): each op flips an endpoint's ready condition and waits
// for the state that shows it. "write" rewrites the file in place (as
// os.WriteFile, most editors and the tests do); "rename" writes a
// temporary file and renames it into place (as the e2e harness and
// careful tools do). It reports the latency's p50, p99 and max over the
// ops (ns/op is its mean); run it with -benchtime=50x.
func BenchmarkDirSourceEditToPublish(b *testing.B) {
	for _, mode := range []string{"write", "rename"} {
		b.Run(mode, func(b *testing.B) {
			dir := b.TempDir()
			if err := os.CopyFS(dir, os.DirFS("testdata/cluster")); err != nil {
				b.Fatal(err)
			}
			path := filepath.Join(dir, "slices.yaml")
			raw, err := os.ReadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			notReady := strings.Replace(string(raw), "ready: true", "ready: false", 1)
			if notReady == string(raw) {
				b.Fatal("slices.yaml has no ready endpoint")
			}
			src := NewDirSource(dir, BuildOptions{Cluster: "east", DefaultRegion: "dc1"}, 500*time.Millisecond,
				slog.New(slog.NewTextHandler(io.Discard, nil)))
			ctx, cancel := context.WithCancel(context.Background())
			states := make(chan State)
			done := make(chan error, 1)
			go func() {
				done <- src.Run(ctx, sinkFunc(func(s State) {
					select {
					case states <- s:
					case <-ctx.Done():
					}
				}))
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					b.Error(err)
				}
			}()
			readyIn := func(s State) bool {
				sh := s[webKey]
				if sh == nil {
					b.Fatalf("no web in %v", describe(s))
				}
				for _, e := range sh.Endpoints {
					if e.Addresses[0].String() == "10.0.1.1" {
						return e.Conditions.Ready
					}
				}
				b.Fatalf("no 10.0.1.1 in %s", mustJSON(sh))
				return false
			}
			await := func(want bool) {
				deadline := time.After(30 * time.Second)
				for {
					select {
					case s := <-states:
						if readyIn(s) == want {
							return
						}
					case <-deadline:
						b.Fatalf("no state with 10.0.1.1 ready=%v", want)
					}
				}
			}
			write := func(content string) {
				target := path
				if mode == "rename" {
					target = path + ".tmp"
				}
				if err := os.WriteFile(target, []byte(content), 0o644); err != nil {
					b.Fatal(err)
				}
				if mode == "rename" {
					if err := os.Rename(target, path); err != nil {
						b.Fatal(err)
					}
				}
			}
			await(true)

			latencies := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				want := i%2 == 1 // the first edit makes it not ready
				content := notReady
				if want {
					content = string(raw)
				}
				begun := time.Now()
				write(content)
				await(want)
				latencies = append(latencies, time.Since(begun))
			}
			b.StopTimer()
			slices.Sort(latencies)
			ms := func(q float64) float64 {
				return float64(latencies[int(q*float64(len(latencies)-1))]) / float64(time.Millisecond)
			}
			b.ReportMetric(ms(0.5), "p50-ms")
			b.ReportMetric(ms(0.99), "p99-ms")
			b.ReportMetric(ms(1), "max-ms")
		})
	}
}
