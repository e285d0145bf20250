package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/relay"
	"github.com/navemesh/nave/spoke"
)

// How a footprint is read: a process is left alone for settleFor (a
// chance for the Go runtime to finish its GC cycle and scavenge), then its
// memory is sampled footprintSamples times, sampleEvery apart, and the
// median of each figure is reported (the log also gives min and max).
const (
	settleFor        = 5 * time.Second
	footprintSamples = 5
	sampleEvery      = time.Second
)

// spokeLoad is a candidate spoke's load: services exported Services, each
// with one EndpointSlice of perService endpoints spread over benchNodes
// Nodes.
type spokeLoad struct{ services, perService int }

func (l spokeLoad) endpoints() int { return l.services * l.perService }

// The loads BenchmarkFootprintSpoke measures: both hold 10,000 endpoints.
// Small slices show what each object costs (a Service, its slice, and the
// ServiceImport, derived Service and slice written back); full ones (the
// EndpointSlice controller puts up to 100 endpoints in a slice) show what
// each endpoint costs.
var spokeLoads = []spokeLoad{{services: 1000, perService: 10}, {services: 100, perService: 100}}

const benchNodes = 20

// The node agent's load: nodeClients local clients (one grpc-go process
// each, as far as xDS is concerned: its own bootstrap and node ID), each
// calling servicesPerClient of nodeServices services. grpc-go opens one ADS
// stream per channel target, so a client of three services holds three streams.
const (
	nodeServices      = 10
	nodeClients       = 50
	servicesPerClient = 3
)

// BenchmarkFootprintSpoke measures the resident memory of a candidate
// spoke (the nave-spoke binary, built as deploy/Dockerfile builds it) on a
// real kube-apiserver, streaming to a hub:
//   - idle: its caches synced and its session with the hub synced, with
//     benchNodes Nodes and no exported service;
//   - half, then loaded: once the hub holds half, then all of a spokeLoad
//     of exported Services (nave.io/export=true) and their endpoints
//     in EndpointSlices, created while the spoke runs, and the spoke has
//     written the imports the hub sends back (a cluster imports its own
//     exports: a ServiceImport, a derived Service and an EndpointSlice per
//     service, which the spoke's informers cache too); per endpoint, it
//     reports (loaded - idle) / endpoints, which counts what any load costs
//     once (the Go heap's minimum, the writer's machinery), and
//     (loaded - half) / (endpoints/2), what one more endpoint costs, and
//     the spoke's CPU time and garbage collections while it took the load;
//   - steady: the loaded spoke once a collection ran with nothing being
//     written (see steadyFootprint);
//   - restarted: a new spoke process that starts in the loaded cluster (its
//     first LIST holds everything), once the hub synced its session and the
//     imports are written; its peak RSS is the cold start's.
//
// The spoke runs with the defaults of its flags (leader election and
// imports on), as deploy/spoke runs it, built as the image builds it (see
// buildImageBinary), with the Go runtime's settings of
// deploy/spoke/deployment.yaml (GOGC; see deployedRuntimeEnv).
//
// Each figure is the median of footprintSamples samples of
// /proc/PID/smaps_rollup after settleFor: Rss (everything resident,
// including file-backed pages of the binary's text) and Anonymous (heap,
// stacks, runtime). The live heap is the one the spoke's last garbage
// collection kept (GODEBUG=gctrace=1). It measures once, whatever
// -benchtime says; nothing is asserted. Targets: <= 30 MB idle, and
// <= 30 MB + 1.5 KiB per endpoint.
func BenchmarkFootprintSpoke(b *testing.B) {
	for _, load := range spokeLoads {
		b.Run(fmt.Sprintf("%dx%d", load.services, load.perService), func(b *testing.B) {
			measureOnce(b, func(b *testing.B) []benchFigure { return measureSpokeFootprint(b, load) })
		})
	}
}

// BenchmarkFootprintNode measures the resident memory of a node agent (the
// nave-node binary, built as deploy/Dockerfile builds it; --zone and
// --region given, so it reads no Node) relaying a hub's xDS:
//   - idle: connected to the hub, no local client;
//   - 50x1: nodeClients real grpc-go xDS clients, each calling one service
//     (nodeClients ADS streams), every call answered;
//   - 50x3: each of them calling servicesPerClient services
//     (nodeClients*servicesPerClient streams), every call answered.
//
// Figures are read as BenchmarkFootprintSpoke reads them. Targets: <= 20 MB
// idle, <= 40 MB serving 50 local clients.
func BenchmarkFootprintNode(b *testing.B) { measureOnce(b, measureNodeFootprint) }

func measureSpokeFootprint(b *testing.B, load spokeLoad) []benchFigure {
	requireSmaps(b)
	kubetest.APIServerBinary(b) // skip before building anything when there is none
	built := buildImageBinary(b, "nave-spoke")
	cluster := kubetest.StartClusters(b, "east")[0]
	crds, err := filepath.Glob("../deploy/crds/*.yaml")
	if err != nil || len(crds) == 0 {
		b.Fatalf("no CRDs in deploy/crds: %v", err)
	}
	cluster.Apply(b, append(crds, "../deploy/base/namespace.yaml", "../deploy/spoke/rbac.yaml")...)
	c := &kubeCluster{name: "east", client: cluster.Client, dynamic: cluster.Dynamic, local: cluster}
	const ns = "bench"
	createNamespace(b, c, ns)
	nodes := createBenchNodes(b, c, benchNodes)

	h := startHub(b)
	env := &kubeEnv{admin: h.admin} // what awaitResynced and cluster read
	dir := b.TempDir()
	tokenFile := filepath.Join(dir, "east.token")
	writeFile(b, tokenFile, tokens["east"])
	bin := built()
	runtimeEnv := deployedRuntimeEnv(b, "../deploy/spoke/deployment.yaml")
	args := append([]string{"--source=kube", "--kubeconfig=" + cluster.SpokeKubeconfig, "--cluster-id=east",
		"--hub=" + h.FederationAddr.String(), "--token-file=" + tokenFile, "--lease-namespace=nave-system"}, testLease...)

	// 1. Idle: caches synced, the hub's session synced, nothing exported.
	sp := startTraced(b, "spoke-a", bin, runtimeEnv, append(slices.Clone(args), "--spoke-id=spoke-a")...)
	env.awaitResynced(b, "east", 0)
	idle := settledFootprint(b, sp)

	// 2. Loaded, in two halves: services and endpoints at the hub, and the imports written back.
	endpoints := load.endpoints()
	loadUpTo := func(from, to int) footprint {
		start := time.Now()
		createExportedServices(b, c, ns, nodes, load, from, to)
		written := time.Since(start)
		awaitFor(b, fmt.Sprintf("the hub holding east's %d services", to), 3*time.Minute, func() bool {
			s := env.cluster(b, "east")
			return s.Services == to && s.Endpoints == to*load.perService
		})
		atHub := time.Since(start)
		awaitImportCount(b, env, "east", to)
		b.Logf("services %d to %d: Services and EndpointSlices written in %v, at the hub after %v, their imports written back into east after %v",
			from, to, written.Round(time.Millisecond), atHub.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		return settledFootprint(b, sp)
	}
	half := loadUpTo(0, load.services/2)
	loaded := loadUpTo(load.services/2, load.services)
	// Steady: what a spoke holding the load keeps for as long as it runs,
	// once a collection has run with nothing being written.
	steady := steadyFootprint(b, sp)

	// 3. Restarted: a new process whose first LIST holds everything.
	epoch := env.cluster(b, "east").Epoch
	sp.stop()
	sp2 := startTraced(b, "spoke-b", bin, runtimeEnv, append(slices.Clone(args), "--spoke-id=spoke-b")...)
	env.awaitResynced(b, "east", epoch)
	awaitFor(b, "the restarted spoke's state at the hub", time.Minute, func() bool {
		s := env.cluster(b, "east")
		return s.Services == load.services && s.Endpoints == endpoints
	})
	awaitImportCount(b, env, "east", load.services)
	restarted := settledFootprint(b, sp2)

	// Per endpoint: from idle (what a load costs, fixed costs included), and
	// from half the load to all of it (what one more endpoint costs).
	perEndpoint := func(from footprint, n int, f func(resident) int64) float64 {
		return float64(f(loaded.median)-f(from.median)) / 1024 / float64(n)
	}
	rssPer, anonPer := perEndpoint(idle, endpoints, resident.rssOf), perEndpoint(idle, endpoints, resident.anonOf)
	halfEndpoints := endpoints - load.services/2*load.perService
	rssMarginal := perEndpoint(half, halfEndpoints, resident.rssOf)
	heapPer := float64(loaded.liveHeap-idle.liveHeap) / 1024 / float64(endpoints)
	heapMarginal := float64(loaded.liveHeap-half.liveHeap) / 1024 / float64(halfEndpoints)
	b.Logf("nave-spoke (binary: %s), %d Nodes", describeBinary(b, bin), benchNodes)
	b.Logf("%-12s %s", "idle:", idle)
	b.Logf("%-12s %s", "half:", half)
	b.Logf("%-12s %s", "loaded:", loaded)
	b.Logf("%-12s %s", "steady:", steady)
	b.Logf("%-12s %s", "restarted:", restarted)
	b.Logf("per endpoint (%d services of %d endpoints, one slice each; medians): from idle RSS %.2f KiB, anonymous %.2f KiB, live heap %.2f KiB; "+
		"from half the load RSS %.2f KiB, live heap %.2f KiB (target <= 1.5 KiB)",
		load.services, load.perService, rssPer, anonPer, heapPer, rssMarginal, heapMarginal)
	const idleTarget = 30e6 / (1 << 20) // 30 MB in MiB
	b.Logf("targets: idle RSS %.1f MiB (<= 30 MB = %.1f MiB), loaded RSS %.1f MiB and steady %.1f MiB (<= 30 MB + 1.5 KiB x %d = %.1f MiB)",
		inMiB(idle.median.rss), idleTarget, inMiB(loaded.median.rss), inMiB(steady.median.rss), endpoints, idleTarget+1.5*float64(endpoints)/1024)
	return []benchFigure{
		{inMiB(idle.median.rss), "idle-rss-MiB"},
		{inMiB(idle.median.anon), "idle-anon-MiB"},
		{inMiB(half.median.rss), "half-rss-MiB"},
		{inMiB(loaded.median.rss), "loaded-rss-MiB"},
		{inMiB(loaded.median.anon), "loaded-anon-MiB"},
		{inMiB(loaded.peak), "loaded-peak-rss-MiB"},
		{(loaded.cpu - idle.cpu).Seconds(), "load-cpu-s"},
		{float64(loaded.collections - idle.collections), "load-collections"},
		{inMiB(steady.median.rss), "steady-rss-MiB"},
		{inMiB(steady.median.anon), "steady-anon-MiB"},
		{float64(steady.liveHeap) / (1 << 20), "steady-heap-MiB"},
		{rssPer, "rss-KiB/endpoint"},
		{anonPer, "anon-KiB/endpoint"},
		{heapPer, "heap-KiB/endpoint"},
		{rssMarginal, "marginal-rss-KiB/endpoint"},
		{heapMarginal, "marginal-heap-KiB/endpoint"},
		{inMiB(restarted.median.rss), "restarted-rss-MiB"},
		{inMiB(restarted.median.anon), "restarted-anon-MiB"},
		{inMiB(restarted.peak), "restarted-peak-rss-MiB"},
	}
}

func measureNodeFootprint(b *testing.B) []benchFigure {
	requireSmaps(b)
	built := buildImageBinary(b, "nave-node")
	h := startHub(b)
	dir := filepath.Join(b.TempDir(), "east")
	targets := make([]string, nodeServices)
	for i := range nodeServices {
		name := fmt.Sprintf("svc-%d", i)
		var eps []endpoint
		for j := range 3 {
			eps = append(eps, endpoint{xdstest.StartBackend(b, fmt.Sprintf("%s-%d", name, j), "127.0.0.1"), "z1", true})
		}
		writeService(b, dir, name, eps...)
		targets[i] = name + ".default.svc.clusterset.local:8080"
	}
	startSpoke(b, h, "east", dir, "r1")
	env := &kubeEnv{admin: h.admin}
	awaitFor(b, "the hub holding the services", time.Minute, func() bool { return env.cluster(b, "east").Services == nodeServices })

	bin := built()
	xdsAddr, admin := freeAddr(b), freeAddr(b)
	agent := startTraced(b, "nave-node", bin, deployedRuntimeEnv(b, "../deploy/node/daemonset.yaml"), "--hub="+h.XDSAddr.String(), "--xds-addr="+xdsAddr, "--admin-addr="+admin,
		"--zone=z1", "--region=r1", "--node-name=bench-node")
	metrics := "http://" + admin + "/metrics"
	await(b, "the node agent serving", func() bool { return httpStatus("http://"+admin+"/readyz") == http.StatusOK })

	// 1. Idle: serving, no local client (and so no stream to the hub; read
	// after the figure, since serving /metrics allocates).
	idle := settledFootprint(b, agent)
	if n := scrapeGauges(b, metrics)[relay.MetricUpstreamConnected]; n != 0 {
		b.Fatalf("an idle node agent holds a stream to the hub (%s %v)", relay.MetricUpstreamConnected, n)
	}

	// 2. Each client calls one service, then servicesPerClient of them.
	clients := make([][]healthpb.HealthClient, nodeClients)
	connect := func(k int) footprint {
		for i := range clients {
			target := targets[(i+k)%nodeServices]
			clients[i] = append(clients[i], xdstest.NewClient(b, xdsAddr, fmt.Sprintf("pod-%02d", i), locality("r1", "z1"), target))
		}
		callEveryChannel(b, clients)
		want := float64(nodeClients * (k + 1))
		await(b, fmt.Sprintf("%v local streams, one upstream", want), func() bool {
			g := scrapeGauges(b, metrics)
			return g[relay.MetricStreams] == want && g[relay.MetricUpstreamConnected] == 1
		})
		return settledFootprint(b, agent)
	}
	one := connect(0)
	var three footprint
	for k := 1; k < servicesPerClient; k++ {
		three = connect(k)
	}
	callEveryChannel(b, clients) // still served after settling

	// 3. An ingress gateway on the node exposing every service, served on a
	// stream of its own.
	gw := startEnvoyStandIn(b.Context(), b, xdsAddr, ingressNode(b, "bench-ingress"))
	await(b, "the gateway holding every service's endpoints", func() bool { return gw.count(resource.EndpointType) == nodeServices })
	gateway := settledFootprint(b, agent)

	streams := nodeClients * servicesPerClient
	perStream := float64(three.median.rss-idle.median.rss) / 1024 / float64(streams)
	anonPerStream := float64(three.median.anon-idle.median.anon) / 1024 / float64(streams)
	b.Logf("nave-node (binary: %s), %d grpc-go xDS clients of %d services (%d backends each), every call answered",
		describeBinary(b, bin), nodeClients, nodeServices, 3)
	b.Logf("%-12s %s", "idle:", idle)
	b.Logf("%-12s %s", "50x1:", one)
	b.Logf("%-12s %s", "50x3:", three)
	b.Logf("%-12s %s", "+ gateway:", gateway)
	b.Logf("per local stream (idle -> %d streams; medians): RSS %.1f KiB, anonymous %.1f KiB", streams, perStream, anonPerStream)
	b.Logf("an ingress gateway of %d services (its own view): RSS %+.1f MiB, anonymous %+.1f MiB",
		nodeServices, inMiB(gateway.median.rss-three.median.rss), inMiB(gateway.median.anon-three.median.anon))
	b.Logf("targets: idle RSS %.1f MiB (<= 20 MB), %d clients RSS %.1f MiB with 1 service each, %.1f MiB with %d each (<= 40 MB)",
		inMiB(idle.median.rss), nodeClients, inMiB(one.median.rss), inMiB(three.median.rss), servicesPerClient)
	return []benchFigure{
		{inMiB(idle.median.rss), "idle-rss-MiB"},
		{inMiB(idle.median.anon), "idle-anon-MiB"},
		{inMiB(one.median.rss), "50x1-rss-MiB"},
		{inMiB(one.median.anon), "50x1-anon-MiB"},
		{inMiB(three.median.rss), "50x3-rss-MiB"},
		{inMiB(three.median.anon), "50x3-anon-MiB"},
		{inMiB(three.peak), "50x3-peak-rss-MiB"},
		{perStream, "rss-KiB/stream"},
		{inMiB(gateway.median.rss), "gateway-rss-MiB"},
		{inMiB(gateway.median.anon), "gateway-anon-MiB"},
	}
}

// awaitImportCount waits until the spoke of cluster has written the n
// imports the hub sends it (a cluster imports its own exports too, as MCS has it).
func awaitImportCount(b *testing.B, env *kubeEnv, cluster string, n int) {
	b.Helper()
	awaitFor(b, fmt.Sprintf("%d imports written in %s", n, cluster), 3*time.Minute, func() bool {
		var info adminapi.ImportsInfo
		if err := fetchJSON(b.Context(), env.admin+"/debug/imports", &info); err != nil {
			return false
		}
		for _, s := range info.Sessions {
			if string(s.Cluster) == cluster && s.Imports >= n && s.Written() {
				return true
			}
		}
		return false
	})
}

// callEveryChannel makes one call through every client's channels, all at once,
// and fails unless each is answered.
func callEveryChannel(b *testing.B, clients [][]healthpb.HealthClient) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
	defer cancel()
	var g errgroup.Group
	for i, cs := range clients {
		for k, c := range cs {
			g.Go(func() error {
				if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
					return fmt.Errorf("client %d, service %d: %w", i, k, err)
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// createBenchNodes creates n Nodes spread over three zones of region r1, as a
// cluster's kubelets would register them, and returns their names.
func createBenchNodes(b *testing.B, c *kubeCluster, n int) []string {
	b.Helper()
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("bench-node-%02d", i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{
			corev1.LabelTopologyRegion: "r1", corev1.LabelTopologyZone: fmt.Sprintf("z%d", 1+i%3),
			corev1.LabelHostname: names[i], corev1.LabelOSStable: "linux"}}}
		if _, err := c.client.CoreV1().Nodes().Create(b.Context(), node, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	return names
}

// createExportedServices creates Services from to to (of load.services)
// labelled for export, each with one EndpointSlice of load.perService ready
// endpoints (distinct addresses in 10.100.0.0/16, on nodes), as the
// EndpointSlice controller would write them.
func createExportedServices(b *testing.B, c *kubeCluster, ns string, nodes []string, load spokeLoad, from, to int) {
	b.Helper()
	g, ctx := errgroup.WithContext(b.Context())
	g.SetLimit(16)
	for i := from; i < to; i++ {
		g.Go(func() error {
			name := fmt.Sprintf("svc-%04d", i)
			svc := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{spoke.ExportLabel: "true", "app": name}},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{
					Name: "grpc", Port: backendPort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(backendPort)}}},
			}
			if _, err := c.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create Service %s: %w", name, err)
			}
			es := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-x7k2p", Labels: map[string]string{
					discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "nave-bench"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr("grpc"), Port: ptr(int32(backendPort)), Protocol: ptr(corev1.ProtocolTCP)}},
			}
			for j := range load.perService {
				k := i*load.perService + j
				node := nodes[k%len(nodes)]
				es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 100+k/62500, 1+k/250%250, 1+k%250)},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
					NodeName:   ptr(node),
					Zone:       ptr(fmt.Sprintf("z%d", 1+k%len(nodes)%3)),
					TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("%s-%d", name, j)},
				})
			}
			if _, err := c.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create EndpointSlice %s: %w", es.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// benchFigure is one metric a benchmark reports.
type benchFigure struct {
	value float64
	unit  string
}

// measuredFigures holds the figures of each benchmark by name.
var measuredFigures sync.Map

// measureOnce runs measure when b.N is 1 (every -count round starts so)
// and reports its figures; when the testing package calls again with a
// larger b.N (-benchtime=Nx), it reports the same figures without
// measuring again. The timer runs throughout, so that the default
// -benchtime (1s) asks for no second call; ns/op is hidden, since the
// time of a measurement says nothing.
func measureOnce(b *testing.B, measure func(*testing.B) []benchFigure) {
	var figs []benchFigure
	if v, ok := measuredFigures.Load(b.Name()); ok && b.N > 1 {
		figs = v.([]benchFigure)
	} else {
		figs = measure(b)
		measuredFigures.Store(b.Name(), figs)
	}
	for _, f := range figs {
		b.ReportMetric(f.value, f.unit)
	}
	b.ReportMetric(0, "ns/op")
}

// resident is a process's resident memory at one moment, in bytes.
type resident struct {
	rss  int64 // smaps_rollup Rss: every resident page, file-backed ones (the binary's text) included
	anon int64 // smaps_rollup Anonymous: resident pages backed by no file (heap, stacks, runtime)
}

func (m resident) rssOf() int64  { return m.rss }
func (m resident) anonOf() int64 { return m.anon }

// footprint is a process's settled memory.
type footprint struct {
	median, min, max resident
	peak             int64 // VmHWM: the most RSS the process ever had
	// liveHeap and heapGoal are what the process's last garbage collection
	// kept and aimed at (gctrace; whole MiB, -1 when no collection ran yet).
	liveHeap, heapGoal int64
	// cpu is the CPU time the process has used so far, and collections the
	// garbage collections it has run.
	cpu         time.Duration
	collections int
}

func (f footprint) String() string {
	heap := "no GC yet"
	if f.liveHeap >= 0 {
		heap = fmt.Sprintf("live heap %d MiB (goal %d MiB)", f.liveHeap>>20, f.heapGoal>>20)
	}
	return fmt.Sprintf("RSS %.1f MiB [%.1f-%.1f], anonymous %.1f MiB [%.1f-%.1f], file-backed and other %.1f MiB; peak RSS %.1f MiB; %s; CPU used %v in %d collections and the rest",
		inMiB(f.median.rss), inMiB(f.min.rss), inMiB(f.max.rss), inMiB(f.median.anon), inMiB(f.min.anon), inMiB(f.max.anon),
		inMiB(f.median.rss-f.median.anon), inMiB(f.peak), heap, f.cpu, f.collections)
}

// settledFootprint waits settleFor, then samples p's memory footprintSamples times.
func settledFootprint(b *testing.B, p *proc) footprint {
	b.Helper()
	time.Sleep(settleFor)
	pid := p.cmd.Process.Pid
	var rss, anon []int64
	for i := range footprintSamples {
		if i > 0 {
			time.Sleep(sampleEvery)
		}
		m, err := readResident(pid)
		if err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
		rss, anon = append(rss, m.rss), append(anon, m.anon)
	}
	slices.Sort(rss)
	slices.Sort(anon)
	f := footprint{
		median: resident{rss[len(rss)/2], anon[len(anon)/2]},
		min:    resident{rss[0], anon[0]},
		max:    resident{rss[len(rss)-1], anon[len(anon)-1]},
	}
	var err error
	if f.peak, err = procStatusField(pid, "VmHWM:"); err != nil {
		b.Fatalf("%s: %v", p.name, err)
	}
	f.liveHeap, f.heapGoal = lastGCHeap(b, p.log)
	if f.cpu, err = cpuTime(pid); err != nil {
		b.Fatalf("%s: %v", p.name, err)
	}
	f.collections = collections(b, p)
	return f
}

// collections counts the garbage collections p logged (gctrace).
func collections(b *testing.B, p *proc) int {
	b.Helper()
	data, err := os.ReadFile(p.log)
	if err != nil {
		b.Fatal(err)
	}
	return len(gctraceHeap.FindAll(data, -1))
}

// cpuTime reads the CPU time (user and system) a process has used from
// /proc/PID/stat, in clock ticks of 10 ms (USER_HZ).
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command's closing parenthesis start at the third (state); utime and stime are the 14th and 15th.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	user, err1 := strconv.ParseInt(f[11], 10, 64)
	sys, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := cmp.Or(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(user+sys) * 10 * time.Millisecond, nil
}

// steadyFootprint waits for a collection in p after the work it was
// given (the Go runtime runs one after two minutes without any, so a
// process that stopped allocating gets there), then reads p's footprint.
// Until then the heap's goal, and so RSS, follows the heap marked during
// the last burst of work.
func steadyFootprint(b *testing.B, p *proc) footprint {
	b.Helper()
	before := collections(b, p)
	awaitFor(b, p.name+"'s next collection", 3*time.Minute, func() bool { return collections(b, p) > before })
	return settledFootprint(b, p)
}

// readResident reads Rss and Anonymous from /proc/PID/smaps_rollup.
func readResident(pid int) (resident, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return resident{}, err
	}
	var m resident
	var haveRSS, haveAnon bool
	for line := range strings.SplitSeq(string(data), "\n") {
		switch f := strings.Fields(line); {
		case len(f) == 3 && f[0] == "Rss:":
			m.rss, haveRSS = kBytes(f[1]), true
		case len(f) == 3 && f[0] == "Anonymous:":
			m.anon, haveAnon = kBytes(f[1]), true
		}
	}
	if !haveRSS || !haveAnon {
		return resident{}, fmt.Errorf("no Rss or Anonymous in /proc/%d/smaps_rollup", pid)
	}
	return m, nil
}

// procStatusField reads a "Name: N kB" field of /proc/PID/status, in bytes.
func procStatusField(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == field {
			return kBytes(f[1]), nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

func kBytes(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n << 10
}

func inMiB(n int64) float64 { return float64(n) / (1 << 20) }

// requireSmaps skips where /proc/PID/smaps_rollup is not there (not Linux, or before 4.14).
func requireSmaps(b *testing.B) {
	b.Helper()
	if _, err := readResident(os.Getpid()); err != nil {
		b.Skipf("footprints are read from /proc/PID/smaps_rollup: %v", err)
	}
}

// gctraceHeap matches the heap figures of a gctrace line: "4->4->2 MB, 5 MB goal".
var gctraceHeap = regexp.MustCompile(`(\d+)->(\d+)->(\d+) MB, (\d+) MB goal`)

// lastGCHeap returns the live heap and the goal of the last collection a
// process logged (gctrace), in bytes; -1 when it logged none.
func lastGCHeap(b *testing.B, log string) (live, goal int64) {
	b.Helper()
	f, err := os.Open(log)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	live, goal = -1, -1
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := gctraceHeap.FindSubmatch(sc.Bytes()); m != nil {
			l, _ := strconv.ParseInt(string(m[3]), 10, 64)
			g, _ := strconv.ParseInt(string(m[4]), 10, 64)
			live, goal = l<<20, g<<20
		}
	}
	return live, goal
}

// scrapeGauges returns the unlabelled samples of a Prometheus text exposition by name (none when it cannot be read).
func scrapeGauges(b *testing.B, url string) map[string]float64 {
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				out[f[0]] = v
			}
		}
	}
	return out
}

// benchTagsEnv, when set (even empty), replaces the build tags of the
// binaries the footprint benchmarks build, to measure a build other than
// the image's.
const benchTagsEnv = "NAVE_BENCH_TAGS"

// imageTags are the build tags of deploy/Dockerfile and make build:
// grpcnotrace leaves out grpc's request tracing, whose html/template made
// the linker keep every exported method of every type (RSS of an idle
// spoke 45 -> 32 MiB).
const imageTags = "grpcnotrace"

// buildImageBinary starts building ./cmd/NAME as deploy/Dockerfile builds the
// image's binaries (CGO off, -trimpath, -ldflags='-s -w', imageTags or the
// tags of $NAVE_BENCH_TAGS), and returns a function that waits for the build and
// returns the binary's path.
func buildImageBinary(b *testing.B, name string) func() string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), name)
	ctx, cancel := context.WithCancel(context.Background())
	tags, ok := os.LookupEnv(benchTagsEnv)
	if !ok {
		tags = imageTags
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-tags="+tags, "-o", bin, "./cmd/"+name)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		b.Fatalf("build %s: %v", name, err)
	}
	exited := make(chan struct{})
	var err error // set before exited closes
	go func() { err = cmd.Wait(); close(exited) }()
	// Registered after TempDir's, so it runs first: the build is over before its directory goes.
	b.Cleanup(func() { cancel(); <-exited })
	return func() string {
		b.Helper()
		<-exited
		if err != nil {
			b.Fatalf("build %s: %v\n%s", name, err, out.String())
		}
		return bin
	}
}

// describeBinary is a binary's size and build tags, for the log.
func describeBinary(b *testing.B, path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	tags, ok := os.LookupEnv(benchTagsEnv)
	if !ok {
		tags = imageTags
	}
	return fmt.Sprintf("%.1f MiB, tags %q", inMiB(fi.Size()), tags)
}

// startTraced is startProc for a process whose Go runtime logs each
// garbage collection (GODEBUG=gctrace=1), which lastGCHeap reads.
func startTraced(b *testing.B, name, bin string, env []string, args ...string) *proc {
	b.Helper()
	logPath := filepath.Join(b.TempDir(), name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), env...), "GODEBUG=gctrace=1")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		b.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); out.Close(); close(p.done) }()
	b.Cleanup(func() {
		p.stop()
		if b.Failed() {
			b.Logf("--- %s: warnings, errors and last lines of its log:\n%s", name, logSummary(logPath))
		}
	})
	return p
}

// deployedRuntimeEnv returns the Go runtime's settings (GOGC, GOMEMLIMIT,
// GOMAXPROCS) that a manifest's workload gives its first container, so that
// a benchmark runs a binary as it is deployed.
func deployedRuntimeEnv(b *testing.B, manifest string) []string {
	b.Helper()
	raw, err := os.ReadFile(manifest)
	if err != nil {
		b.Fatal(err)
	}
	var w struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &w); err != nil {
		b.Fatalf("%s: %v", manifest, err)
	}
	cs := w.Spec.Template.Spec.Containers
	if len(cs) == 0 {
		b.Fatalf("%s: no container", manifest)
	}
	var env []string
	for _, e := range cs[0].Env {
		switch e.Name {
		case "GOGC", "GOMEMLIMIT", "GOMAXPROCS":
			env = append(env, e.Name+"="+e.Value)
		}
	}
	return env
}
