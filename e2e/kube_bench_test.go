package e2e

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/internal/xdstest"
)

// BenchmarkKubeFlipToTraffic measures, on a real kube-apiserver with a spoke
// on the Kubernetes source and a real grpc-go xDS client of the hub, how long
// an EndpointSlice readiness flip takes to move the client's traffic, next to
// how long the API server itself takes to tell a watcher about the write.
//
// The slice names two backends in the client's zone, one ready. Each flip
// swaps which one is ready. From the same start (just before the Update is
// sent), per flip:
//   - (a) write -> watch: a plain client-go watch on the namespace's
//     EndpointSlices, opened in this process before the flips, receives the
//     event carrying the resourceVersion the Update returned;
//   - (b) write -> traffic: RPCs issued back to back (no sleeps, from just
//     before the write) get their first answer from the newly ready backend
//     (the time that answer arrived; the streak awaited afterwards to confirm
//     convergence is not counted);
//   - (b - a): what Nave and grpc-go add to the API server's own delivery.
//
// N flips: -benchtime Nx (ns/op is then per flip, pacing included), else 50
// (run once, as BenchmarkImports; ns/op is then the whole run). Nothing is
// asserted beyond the traffic moving every time. The next flip starts once the previous one has
// converged (Streak answers in a row from the new backend) and the watcher
// has seen it.
func BenchmarkKubeFlipToTraffic(b *testing.B) {
	// Skip as early as the other kube e2e tests would (before building nave).
	kubetest.APIServerBinary(b)
	flips, fixed := flipCount()

	tt := testing.TB(b)
	env := startKubeEnv(tt, "east")
	east := env.clusters["east"]
	const ns, svc = "flip", "echo"
	createNamespace(tt, east, ns)
	node := east.node(tt, "us-east", "us-east-1a")
	hosts := [2]*kubetest.Host{startKubeBackend(tt, "flip-0"), startKubeBackend(tt, "flip-1")}
	exportService(tt, east, ns, svc, false)
	setEndpoints(tt, east, ns, svc, kubeEndpoint{hosts[0], node, true}, kubeEndpoint{hosts[1], node, false})

	sliceAPI := east.client.DiscoveryV1().EndpointSlices(ns)
	es, err := sliceAPI.Get(b.Context(), svc+"-e2e", metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	watcher := startFlipWatcher(b, east, ns, es.Name, es.ResourceVersion)

	const target = svc + "." + ns + ".svc.clusterset.local:8080"
	client := xdstest.NewClient(tt, env.xds, "c-flip", locality("us-east", "us-east-1a"), target)
	ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		b.Fatalf("first call through xDS: %v", err)
	}
	cancel()
	// Settled on flip-0 before the first flip.
	if r := awaitFlipMoved(b.Context(), client, "flip-0"); r.err != nil {
		b.Fatalf("client never settled on flip-0: %v", r.err)
	}

	var toWatch, toTraffic, extra, writeRTT []time.Duration
	var failures, flaps int
	ready := 0 // index of the ready backend
	flip := func() {
		ready = 1 - ready
		want := fmt.Sprintf("flip-%d", ready)
		for i := range es.Endpoints {
			es.Endpoints[i].Conditions.Ready = ptr(i == ready)
		}
		moved := make(chan flipMove, 1)
		start := time.Now()
		go func() { moved <- awaitFlipMoved(b.Context(), client, want) }()
		updated, err := sliceAPI.Update(b.Context(), es, metav1.UpdateOptions{})
		wrote := time.Now()
		if err != nil {
			b.Fatalf("flip to %s: %v", want, err)
		}
		es = updated
		seen, err := watcher.await(b.Context(), es.ResourceVersion)
		if err != nil {
			b.Fatalf("watch never saw resourceVersion %s: %v", es.ResourceVersion, err)
		}
		r := <-moved
		if r.err != nil {
			b.Fatalf("traffic never moved to %s: %v", want, r.err)
		}
		failures, flaps = failures+r.failures, flaps+r.flaps
		a, tr := seen.Sub(start), r.first.Sub(start)
		toWatch, toTraffic, extra, writeRTT = append(toWatch, a), append(toTraffic, tr), append(extra, tr-a), append(writeRTT, wrote.Sub(start))
	}
	if fixed {
		// One call runs exactly N flips (b.Loop: the runner does not call
		// again, as it would with a b.N loop), timed from the first.
		for b.Loop() {
			flip()
		}
	} else {
		// The timer keeps running from the start (setup included), so the
		// runner, whose default goal is 1s, does not ask again with a larger
		// b.N (it would redo the whole setup): one run, ns/op the whole of it.
		for range flips {
			flip()
		}
	}
	b.StopTimer()

	n := len(toWatch)
	report := func(name, unit string, ds []time.Duration) {
		s := slices.Clone(ds)
		slices.Sort(s)
		p50, p99, mx := flipPct(s, 0.50), flipPct(s, 0.99), s[len(s)-1]
		b.ReportMetric(flipMs(p50), unit+"-p50-ms")
		b.ReportMetric(flipMs(p99), unit+"-p99-ms")
		b.ReportMetric(flipMs(mx), unit+"-max-ms")
		b.Logf("%-44s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  min %7.2f ms", name, flipMs(p50), flipMs(p99), flipMs(mx), flipMs(s[0]))
	}
	b.Logf("%d readiness flips (start: just before the Update is sent; p99 is the nearest rank, the max below 100 flips)", n)
	report("(a) write -> API server watch event", "watch", toWatch)
	report("(b) write -> grpc-go traffic moved", "traffic", toTraffic)
	report("(b-a) watch event -> traffic moved", "nave", extra)
	report("the Update's own round trip", "write", writeRTT)
	afterReturn := make([]time.Duration, n)
	for i := range n {
		afterReturn[i] = toWatch[i] - writeRTT[i]
	}
	slices.Sort(afterReturn)
	b.Logf("watch event relative to the Update's return: p50 %.2f ms, min %.2f ms, max %.2f ms (negative: it came first)",
		flipMs(flipPct(afterReturn, 0.5)), flipMs(afterReturn[0]), flipMs(afterReturn[n-1]))
	b.ReportMetric(float64(failures)/float64(n), "failed-rpcs/flip")
	b.Logf("RPCs failed during flips: %d; answers from the old backend after the new one had answered: %d", failures, flaps)
}

// flipCount is how many flips to run: N of -benchtime Nx (fixed: b.Loop
// runs exactly N), else 50.
func flipCount() (n int, fixed bool) {
	if f := flag.Lookup("test.benchtime"); f != nil {
		if s, ok := strings.CutSuffix(f.Value.String(), "x"); ok {
			if v, err := strconv.Atoi(s); err == nil && v > 0 {
				return v, true
			}
		}
	}
	return 50, false
}

// flipMove is what awaitFlipMoved saw.
type flipMove struct {
	first    time.Time // when the first answer from the wanted backend arrived
	failures int       // RPCs that failed
	flaps    int       // answers from another backend after the first from the wanted one
	err      error
}

// awaitFlipMoved calls the client back to back until an answer comes from
// want (the time it arrived is first), then on until xdstest.Streak answers
// in a row came from want (convergence; not part of first).
func awaitFlipMoved(ctx context.Context, c healthpb.HealthClient, want string) flipMove {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var r flipMove
	streak := 0
	for streak < xdstest.Streak {
		var md metadata.MD
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		at := time.Now()
		if ctx.Err() != nil {
			r.err = fmt.Errorf("%w (%d answers from %s so far, %d failures)", ctx.Err(), streak, want, r.failures)
			return r
		}
		if err != nil {
			r.failures++
			streak = 0
			continue
		}
		if got := md.Get(xdstest.BackendHeader); len(got) == 1 && got[0] == want {
			if r.first.IsZero() {
				r.first = at
			}
			streak++
			continue
		}
		if !r.first.IsZero() {
			r.flaps++
		}
		streak = 0
	}
	return r
}

// flipWatcher is a plain client-go watch on one namespace's EndpointSlices,
// remembering when each resourceVersion of one slice arrived.
type flipWatcher struct {
	mu     sync.Mutex
	seen   map[string]time.Time // by resourceVersion
	err    error                // why watching stopped
	change chan struct{}
}

func startFlipWatcher(b *testing.B, c *kubeCluster, ns, name, fromRV string) *flipWatcher {
	sw := &flipWatcher{seen: map[string]time.Time{}, change: make(chan struct{}, 1)}
	ctx, stop := context.WithCancel(b.Context())
	open := func(rv string) (watch.Interface, error) {
		return c.client.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	}
	w, err := open(fromRV)
	if err != nil {
		stop()
		b.Fatal(err)
	}
	notify := func() {
		select {
		case sw.change <- struct{}{}:
		default:
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := fromRV
		for {
			for ev := range w.ResultChan() {
				at := time.Now()
				if ev.Type == watch.Error {
					sw.mu.Lock()
					sw.err = fmt.Errorf("watch error: %v", ev.Object)
					sw.mu.Unlock()
					notify()
					w.Stop()
					return
				}
				es, ok := ev.Object.(*discoveryv1.EndpointSlice)
				if !ok || es.Name != name {
					continue
				}
				last = es.ResourceVersion
				sw.mu.Lock()
				sw.seen[es.ResourceVersion] = at
				sw.mu.Unlock()
				notify()
			}
			w.Stop()
			if ctx.Err() != nil {
				return
			}
			// The server ended the watch (its timeout): go on from the last event.
			var err error
			if w, err = open(last); err != nil {
				sw.mu.Lock()
				sw.err = err
				sw.mu.Unlock()
				notify()
				return
			}
		}
	}()
	// Ending the context ends the watch's stream and so the goroutine.
	b.Cleanup(func() { stop(); <-done })
	return sw
}

// await returns when the watch delivered resourceVersion rv.
func (sw *flipWatcher) await(ctx context.Context, rv string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		sw.mu.Lock()
		at, ok := sw.seen[rv]
		err := sw.err
		sw.mu.Unlock()
		if ok {
			return at, nil
		}
		if err != nil {
			return time.Time{}, err
		}
		select {
		case <-sw.change:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// flipPct is the nearest-rank q-quantile of sorted durations.
func flipPct(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(len(sorted)-1, i))]
}

func flipMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
