package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/kubetest"
)

// BenchmarkImports measures the import path on three real API servers with
// real CoreDNS (make bench; it runs once, whatever -benchtime says):
//   - a ServiceExport created in east -> an A answer from north's DNS;
//   - an endpoint's readiness flipped in east -> the slice changed in north,
//     and how many EndpointSlice writes each importing cluster saw per flip;
//   - NAVE_BENCH_SERVICES services (default 200) exported at once in east ->
//     every import written in west and north;
//   - a spoke that starts in a cluster holding none of the imports -> all written.
//
// Figures are printed and reported as metrics; nothing is asserted.
func BenchmarkImports(b *testing.B) {
	// Once: the timer keeps running through the scenario (about a minute), so
	// the runner never asks for more (a stopped timer made it ask for b.N =
	// 100, then 10,000: the whole scenario again each time).
	benchImports(b)
}

func benchImports(b *testing.B) {
	tt := testing.TB(b)
	env := startKubeEnvWith(tt, nil, "east", "west", "north")
	east, west, north := env.clusters["east"], env.clusters["west"], env.clusters["north"]
	d := kubetest.StartCoreDNS(b, north.local)
	const ns = "bench"
	for _, c := range []*kubeCluster{east, west, north} {
		createNamespace(tt, c, ns)
	}
	host := kubetest.NewHost(b)
	node := east.node(tt, "r1", "a")

	// 1. Export -> DNS answer in another cluster.
	// The first ServiceImport a cluster stores waits for its CRD to settle
	// (the API server holds a new CRD's first creates up to 2 s): it is
	// reported apart from the rest.
	const exports = 50
	var exportLat []time.Duration
	for i := range exports {
		name := fmt.Sprintf("exp-%d", i)
		start := time.Now()
		exportService(tt, east, ns, name, false)
		if _, err := d.AwaitAnswer(b.Context(), name+"."+ns+".svc.clusterset.local.", dns.TypeA,
			func(a kubetest.DNSAnswer) bool { return len(a.Addrs) == 1 }); err != nil {
			b.Fatalf("no answer for %s: %v", name, err)
		}
		exportLat = append(exportLat, time.Since(start))
	}

	// 2. Readiness flips -> slice in north; writes seen per flip in west and north.
	exportService(tt, east, ns, "flip", false)
	setEndpoints(tt, east, ns, "flip", kubeEndpoint{host, node, true})
	env.awaitImport(tt, north, ns, "flip", "flip imported", func(v importView) bool { return len(v.addresses("east")) == 1 })
	env.awaitImport(tt, west, ns, "flip", "flip imported", func(v importView) bool { return len(v.addresses("east")) == 1 })
	counts := map[string]*countingWatch{}
	for _, c := range []*kubeCluster{west, north} {
		counts[c.name] = watchSlices(b, c, ns, "flip")
	}
	const flips = 50
	var flipLat []time.Duration
	ready := true
	for range flips {
		ready = !ready
		start := time.Now()
		setEndpoints(tt, east, ns, "flip", kubeEndpoint{host, node, ready})
		want := 0
		if ready {
			want = 1
		}
		counts["north"].await(b, func(es *discoveryv1.EndpointSlice) bool { return readyCount(es) == want })
		flipLat = append(flipLat, time.Since(start))
	}
	time.Sleep(time.Second) // let any trailing write arrive before counting
	for _, c := range []string{"west", "north"} {
		n := counts[c].writes()
		b.ReportMetric(float64(n)/flips, "slice-writes/flip/"+c)
		b.Logf("EndpointSlice writes seen in %s per readiness flip in east: %.2f (%d for %d flips)", c, float64(n)/flips, n, flips)
	}

	// 3. Many services at once -> every import written elsewhere.
	services := 200
	if v, err := strconv.Atoi(os.Getenv("NAVE_BENCH_SERVICES")); err == nil && v > 0 {
		services = v
	}
	start := time.Now()
	for i := range services {
		exportService(tt, east, ns, fmt.Sprintf("bulk-%d", i), false)
	}
	created := time.Now()
	for _, c := range []*kubeCluster{west, north} {
		awaitFor(tt, fmt.Sprintf("%d ServiceImports in %s", services, c.name), 10*time.Minute, func() bool {
			list, err := c.dynamic.Resource(serviceImports).Namespace(ns).List(b.Context(), metav1.ListOptions{})
			return err == nil && len(list.Items) >= services+exports+1
		})
	}
	bulk := time.Since(start)
	afterLast := time.Since(created)

	// 4. A spoke that starts in a cluster holding none of the imports: time
	// until the hub shows them all written there, and the writes it took.
	env.stopNorth(tt)
	for _, del := range []func() error{
		func() error {
			return north.dynamic.Resource(serviceImports).Namespace(ns).DeleteCollection(b.Context(), metav1.DeleteOptions{}, metav1.ListOptions{})
		},
		func() error {
			return north.client.DiscoveryV1().EndpointSlices(ns).DeleteCollection(b.Context(), metav1.DeleteOptions{}, metav1.ListOptions{})
		},
	} {
		if err := del(); err != nil {
			b.Fatal(err)
		}
	}
	svcs, err := north.client.CoreV1().Services(ns).List(b.Context(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range svcs.Items {
		_ = north.client.CoreV1().Services(ns).Delete(b.Context(), s.Name, metav1.DeleteOptions{})
	}
	want := services + exports + 1
	coldStart := time.Now()
	env.spokes.(*localSpokes).start("north", "north-a")
	awaitFor(tt, fmt.Sprintf("north's %d imports written", want), 15*time.Minute, func() bool {
		var info adminapi.ImportsInfo
		if err := fetchJSON(b.Context(), env.admin+"/debug/imports", &info); err != nil {
			return false
		}
		for _, s := range info.Sessions {
			if s.Cluster == "north" && s.Imports >= want && s.Written() {
				return true
			}
		}
		return false
	})
	cold := time.Since(coldStart)
	b.ReportMetric(cold.Seconds(), "cold-spoke-all-written-s")
	b.Logf("a spoke started in north, which held none of the %d imports -> all written: %v", want, cold)

	p := func(ds []time.Duration, q float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}
	first, exportLat := exportLat[0], exportLat[1:]
	b.ReportMetric(float64(p(exportLat, 0.5).Milliseconds()), "export-to-dns-p50-ms")
	b.ReportMetric(float64(p(exportLat, 0.99).Milliseconds()), "export-to-dns-p99-ms")
	b.ReportMetric(float64(p(flipLat, 0.5).Microseconds())/1000, "ready-to-slice-p50-ms")
	b.ReportMetric(float64(p(flipLat, 0.99).Microseconds())/1000, "ready-to-slice-p99-ms")
	b.ReportMetric(bulk.Seconds(), "bulk-imports-written-s")
	b.ReportMetric(afterLast.Seconds(), "bulk-after-last-export-s")
	b.Logf("ServiceExport in east -> A answer in north (%d after the first): p50 %v, p99 %v, max %v; the first (a new CRD) %v",
		len(exportLat), p(exportLat, 0.5), p(exportLat, 0.99), slices.Max(exportLat), first)
	b.Logf("readiness flip in east -> slice in north (%d): p50 %v, p99 %v, max %v", flips, p(flipLat, 0.5), p(flipLat, 0.99), slices.Max(flipLat))
	b.Logf("%d services exported in east (the test's own writes took %v) -> every import written in west and north: %v, %v after the last export",
		services, created.Sub(start), bulk, afterLast)
}

// readyCount counts the ready endpoints of a slice.
func readyCount(es *discoveryv1.EndpointSlice) int {
	n := 0
	for _, e := range es.Endpoints {
		if e.Conditions.Ready == nil || *e.Conditions.Ready {
			n++
		}
	}
	return n
}

// countingWatch watches an import's EndpointSlices in one cluster, counting
// the writes (added, modified, deleted) and keeping the latest object.
type countingWatch struct {
	mu     sync.Mutex
	events int
	latest *discoveryv1.EndpointSlice
	change chan struct{}
}

func watchSlices(b *testing.B, c *kubeCluster, ns, name string) *countingWatch {
	w, err := c.client.DiscoveryV1().EndpointSlices(ns).Watch(b.Context(), metav1.ListOptions{LabelSelector: mcsv1beta1.LabelServiceName + "=" + name})
	if err != nil {
		b.Fatal(err)
	}
	cw := &countingWatch{change: make(chan struct{}, 1)}
	first := true
	go func() {
		for ev := range w.ResultChan() {
			es, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			cw.mu.Lock()
			if first && ev.Type == watch.Added {
				// The initial list arrives as ADDED events: not writes.
			} else {
				cw.events++
			}
			cw.latest = es
			cw.mu.Unlock()
			select {
			case cw.change <- struct{}{}:
			default:
			}
		}
	}()
	// Let the initial ADDED events pass before counting.
	time.Sleep(200 * time.Millisecond)
	cw.mu.Lock()
	first = false
	cw.events = 0
	cw.mu.Unlock()
	b.Cleanup(w.Stop)
	return cw
}

func (cw *countingWatch) writes() int {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.events
}

func (cw *countingWatch) await(b *testing.B, cond func(*discoveryv1.EndpointSlice) bool) {
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
	defer cancel()
	for {
		cw.mu.Lock()
		ok := cw.latest != nil && cond(cw.latest)
		cw.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-cw.change:
		case <-ctx.Done():
			b.Fatal("the slice never changed as expected")
		}
	}
}
