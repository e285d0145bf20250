package xds

import (
	"context"
	"log/slog"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"

	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
)

func startXDS(t *testing.T) (*Server, *prometheus.Registry, string) {
	t.Helper()
	return startXDSWith(t, DefaultConfig(), Wiring{})
}

// startXDSWith is startXDS with cfg and w.
func startXDSWith(t *testing.T, cfg Config, w Wiring) (*Server, *prometheus.Registry, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	s := NewServer(cfg, w, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), reg)
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
	a1 := xdstest.StartBackend(t, "a1", "127.0.0.1") // east, r1/z1
	a2 := xdstest.StartBackend(t, "a2", "127.0.0.2") // east, r1/z1
	b1 := xdstest.StartBackend(t, "b1", "127.0.0.3") // central, r1/z2
	c1 := xdstest.StartBackend(t, "c1", "127.0.0.4") // west, r2/z3
	zoneA, zoneB, regionC := loc("r1", "z1"), loc("r1", "z2"), loc("r2", "z3")
	port := tcp("grpc", 8080)
	endpoint := func(b xdstest.Backend, l registry.Locality, c registry.Conditions) registry.Endpoint {
		return ep(b.Addr.IP.String(), l, c, eport("grpc", int32(b.Addr.Port)))
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
	inZoneA := xdstest.StartPoller(ctx, t, "client-a", xdstest.NewClient(t, xdsAddr, "client-a", zoneA, target))
	inRegionC := xdstest.StartPoller(ctx, t, "client-c", xdstest.NewClient(t, xdsAddr, "client-c", regionC, target))
	nowhere := xdstest.StartPoller(ctx, t, "client-none", xdstest.NewClient(t, xdsAddr, "client-none", registry.Locality{}, target))

	inZoneA.AwaitOnly(ctx, t, "a1", "a2")
	inRegionC.AwaitOnly(ctx, t, "c1")
	nowhere.Await(ctx, t, "every backend", func(_ []string, seen map[string]bool) bool {
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
	if shapeChanged(d) {
		t.Fatalf("an endpoint change changed the service shape: %+v", d)
	}
	srv.Update(r, d)
	inZoneA.AwaitOnly(ctx, t, "b1")

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
	inZoneA.AwaitOnly(ctx, t, "c1")

	// And back.
	r, d = apply(t, r, east(ready), central(ready))
	srv.Update(r, d)
	inZoneA.AwaitOnly(ctx, t, "a1", "a2")
	inRegionC.AwaitOnly(ctx, t, "c1")

	for _, p := range []*xdstest.Poller{inZoneA, inRegionC, nowhere} {
		calls, failed := p.Failures()
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d calls failed, first: %v", p.Name(), len(failed), calls, failed[0])
		}
		t.Logf("%s: %d calls", p.Name(), calls)
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

// shapeChanged reports whether any service was added, removed or changed shape.
func shapeChanged(d registry.Diff) bool {
	return slices.ContainsFunc(d.Services, func(s registry.ServiceDiff) bool { return s.ShapeChanged })
}
