package xds

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/navemesh/nave/registry"
)

const backendHeader = "x-backend"

// backend is a real gRPC server answering health checks and naming itself in a response header.
type backend struct {
	name string
	addr *net.TCPAddr
}

func startBackend(t *testing.T, name, ip string) backend {
	t.Helper()
	lis, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("backend %s: %v", name, err)
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := grpc.SetHeader(ctx, metadata.Pairs(backendHeader, name)); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(g, health.NewServer())
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return backend{name: name, addr: lis.Addr().(*net.TCPAddr)}
}

func startXDS(t *testing.T) (*Server, *prometheus.Registry, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	s := NewServer(DefaultConfig(), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), reg)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return s, reg, lis.Addr().String()
}

// newXDSClient dials target through its own grpc-go xDS client with the given node locality.
func newXDSClient(t *testing.T, xdsAddr, node string, l registry.Locality, target string) healthpb.HealthClient {
	t.Helper()
	locality := ""
	if !l.IsZero() {
		locality = fmt.Sprintf(`,"locality":{"region":%q,"zone":%q}`, l.Region, l.Zone)
	}
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":%q%s}}`,
		xdsAddr, node, locality)
	resolver, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatalf("xDS resolver: %v", err)
	}
	conn, err := grpc.NewClient("xds:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// poller calls a client continuously and remembers who answered and what failed.
type poller struct {
	name   string
	mu     sync.Mutex
	cond   *sync.Cond
	recent []string // the last answers, newest last
	seen   map[string]bool
	calls  int
	failed []error
	done   chan struct{}
}

const streak = 10

func startPoller(ctx context.Context, t *testing.T, name string, c healthpb.HealthClient) *poller {
	t.Helper()
	// The first call waits for the client to resolve and connect; failures count from then on.
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("%s: first call: %v", name, err)
	}
	p := &poller{name: name, seen: map[string]bool{}, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	go func() {
		defer close(p.done)
		defer p.cond.Broadcast()
		for ctx.Err() == nil {
			var md metadata.MD
			_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.calls++
			if err != nil {
				p.failed = append(p.failed, err)
			} else if v := md.Get(backendHeader); len(v) == 1 {
				p.seen[v[0]] = true
				p.recent = append(p.recent, v[0])
				if len(p.recent) > streak {
					p.recent = p.recent[1:]
				}
			}
			p.mu.Unlock()
			p.cond.Broadcast()
		}
	}()
	t.Cleanup(func() { <-p.done })
	return p
}

// await blocks until cond holds over what the poller saw (or ctx ends, which fails the test).
func (p *poller) await(ctx context.Context, t *testing.T, what string, cond func(recent []string, seen map[string]bool) bool) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for !cond(p.recent, p.seen) {
		if ctx.Err() != nil {
			t.Fatalf("%s: never saw %s; last answers %v", p.name, what, p.recent)
		}
		p.cond.Wait()
	}
}

// awaitOnly waits until the last answers all came from the given backends.
func (p *poller) awaitOnly(ctx context.Context, t *testing.T, backends ...string) {
	t.Helper()
	p.await(ctx, t, "only "+strings.Join(backends, ","), func(recent []string, _ map[string]bool) bool {
		if len(recent) < streak {
			return false
		}
		for _, b := range recent {
			if !slices.Contains(backends, b) {
				return false
			}
		}
		return true
	})
}

func (p *poller) failures() (int, []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, slices.Clone(p.failed)
}

// metricValue reads a counter or gauge (label type=typ when typ is not "").
func metricValue(t *testing.T, reg *prometheus.Registry, name, typ string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if typ != "" && !hasLabel(m, "type", typ) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// TestFailoverWithGRPCClients runs the real thing: the xDS server on a real gRPC
// server, real backends, and grpc-go xDS clients in different localities.
func TestFailoverWithGRPCClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Each backend gets its own loopback address: a shard's endpoints need distinct addresses.
	a1 := startBackend(t, "a1", "127.0.0.1") // east, r1/z1
	a2 := startBackend(t, "a2", "127.0.0.2") // east, r1/z1
	b1 := startBackend(t, "b1", "127.0.0.3") // central, r1/z2
	c1 := startBackend(t, "c1", "127.0.0.4") // west, r2/z3
	zoneA, zoneB, regionC := loc("r1", "z1"), loc("r1", "z2"), loc("r2", "z3")
	port := tcp("grpc", 8080)
	endpoint := func(b backend, l registry.Locality, c registry.Conditions) registry.Endpoint {
		return ep(b.addr.IP.String(), l, c, eport("grpc", int32(b.addr.Port)))
	}
	east := func(c registry.Conditions) *registry.Shard {
		return shard("east", echo, []registry.ServicePort{port}, endpoint(a1, zoneA, c), endpoint(a2, zoneA, c))
	}
	central := func(c registry.Conditions) *registry.Shard {
		return shard("central", echo, []registry.ServicePort{port}, endpoint(b1, zoneB, c))
	}
	west := shard("west", echo, []registry.ServicePort{port}, endpoint(c1, regionC, ready))
	// Another service, to check that its assignments are left alone.
	other := registry.ServiceKey{Namespace: "default", Name: "other"}
	otherShard := shard("west", other, []registry.ServicePort{port}, endpoint(c1, regionC, ready))

	srv, metrics, xdsAddr := startXDS(t)
	r, _ := apply(t, registry.New(), east(ready), central(ready), west, otherShard)
	srv.Update(r, registry.Diff{}) // first call: everything

	target := ListenerName(echo, port.Port)
	inZoneA := startPoller(ctx, t, "client-a", newXDSClient(t, xdsAddr, "client-a", zoneA, target))
	inRegionC := startPoller(ctx, t, "client-c", newXDSClient(t, xdsAddr, "client-c", regionC, target))
	nowhere := startPoller(ctx, t, "client-none", newXDSClient(t, xdsAddr, "client-none", registry.Locality{}, target))

	inZoneA.awaitOnly(ctx, t, "a1", "a2")
	inRegionC.awaitOnly(ctx, t, "c1")
	nowhere.await(ctx, t, "every backend", func(_ []string, seen map[string]bool) bool {
		return seen["a1"] && seen["a2"] && seen["b1"] && seen["c1"]
	})

	responses := func() map[string]float64 {
		out := map[string]float64{}
		for _, typ := range []string{typeLDS, typeRDS, typeCDS, typeEDS} {
			out[typ] = metricValue(t, metrics, MetricResponses, typ)
		}
		return out
	}
	before := responses()

	// Zone A's endpoints start terminating: client A moves to the same region.
	var d registry.Diff
	r, d = apply(t, r, east(draining))
	if d.ShapeChanged() {
		t.Fatalf("an endpoint change changed the service shape: %+v", d)
	}
	srv.Update(r, d)
	inZoneA.awaitOnly(ctx, t, "b1")

	after := responses()
	for _, typ := range []string{typeLDS, typeRDS, typeCDS} {
		if after[typ] != before[typ] {
			t.Errorf("endpoint-only change sent %v %s responses, want none", after[typ]-before[typ], typ)
		}
	}
	if after[typeEDS] <= before[typeEDS] {
		t.Errorf("endpoint-only change sent no EDS response")
	}

	// The same region goes too: client A moves to the other region.
	r, d = apply(t, r, central(notReady))
	srv.Update(r, d)
	inZoneA.awaitOnly(ctx, t, "c1")

	// And back.
	r, d = apply(t, r, east(ready), central(ready))
	srv.Update(r, d)
	inZoneA.awaitOnly(ctx, t, "a1", "a2")
	inRegionC.awaitOnly(ctx, t, "c1")

	for _, p := range []*poller{inZoneA, inRegionC, nowhere} {
		calls, failed := p.failures()
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d calls failed, first: %v", p.name, len(failed), calls, failed[0])
		}
		t.Logf("%s: %d calls", p.name, calls)
	}
	final := responses()
	if final[typeLDS] != before[typeLDS] || final[typeCDS] != before[typeCDS] || final[typeRDS] != before[typeRDS] {
		t.Errorf("endpoint changes resent listeners, routes or clusters: before %v, after %v", before, final)
	}
	if n := metricValue(t, metrics, MetricNACKs, typeEDS) + metricValue(t, metrics, MetricNACKs, typeLDS) +
		metricValue(t, metrics, MetricNACKs, typeRDS) + metricValue(t, metrics, MetricNACKs, typeCDS); n != 0 {
		t.Errorf("clients NACKed %v responses", n)
	}
	if n := metricValue(t, metrics, MetricConnectedClients, ""); n != 3 {
		t.Errorf("connected clients = %v, want 3", n)
	}
	if n := metricValue(t, metrics, MetricPushLatency, typeEDS); n == 0 {
		t.Errorf("no EDS push latency observed")
	}
	if n := metricValue(t, metrics, MetricLocalityGroups, ""); n != 3 {
		t.Errorf("locality groups = %v, want 3", n)
	}
	cancel()
}
