package relay

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// Small registry helpers, as in xds's tests.

var exportedAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

var (
	echo     = registry.ServiceKey{Namespace: "default", Name: "echo"}
	other    = registry.ServiceKey{Namespace: "default", Name: "other"}
	grpcPort = registry.ServicePort{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}
	ready    = registry.Conditions{Ready: true, Serving: true}
)

func loc(region, zone string) registry.Locality { return registry.Locality{Region: region, Zone: zone} }

// endpointOf is backend b as a ready endpoint in locality l.
func endpointOf(b xdstest.Backend, l registry.Locality) registry.Endpoint {
	return registry.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(b.Addr.IP.String())},
		Ports: []registry.EndpointPort{{Name: "grpc", Port: int32(b.Addr.Port)}}, Locality: l, Conditions: ready}
}

func shard(cluster registry.ClusterID, key registry.ServiceKey, eps ...registry.Endpoint) *registry.Shard {
	s := &registry.Shard{Cluster: cluster, Service: key, ExportedAt: exportedAt, Ports: []registry.ServicePort{grpcPort}, Endpoints: eps}
	s.Normalize()
	return s
}

// apply applies each shard as its cluster's upsert, checking it is valid first.
func apply(t testing.TB, r *registry.Registry, shards ...*registry.Shard) (*registry.Registry, registry.Diff) {
	t.Helper()
	var all registry.Diff
	for _, s := range shards {
		if err := s.Validate(registry.DefaultLimits()); err != nil {
			t.Fatalf("test shard: %v", err)
		}
		var d registry.Diff
		r, d = r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
		all.Version = d.Version
		all.Services = append(all.Services, d.Services...)
	}
	return r, all
}

func testLogger() *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// hub is a real hub xDS server that records the requests it receives.
type hub struct {
	srv  *xds.Server
	addr string
	g    *grpc.Server

	mu sync.Mutex
	// last holds the resource names of the last request per type label.
	last map[string][]string
	// nodes are the nodes seen on first requests.
	nodes []*core.Node
}

// nodeIDs returns the IDs of the nodes seen on first requests.
func (h *hub) nodeIDs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, len(h.nodes))
	for i, n := range h.nodes {
		ids[i] = n.GetId()
	}
	return ids
}

// startHub serves a new hub xDS server with registry r on addr ("127.0.0.1:0": any port);
// opts adjust its wiring.
func startHub(t *testing.T, addr string, r *registry.Registry, opts ...func(*xds.Wiring)) *hub {
	t.Helper()
	var w xds.Wiring
	for _, o := range opts {
		o(&w)
	}
	h := &hub{srv: xds.NewServer(xds.DefaultConfig(), w, testLogger(), prometheus.NewRegistry()), last: map[string][]string{}}
	h.srv.Update(r, registry.Diff{})
	var lis net.Listener
	var err error
	// A restarted hub takes its predecessor's port; retry briefly in case the
	// old listener has not let go of it yet.
	deadline := time.Now().Add(5 * time.Second)
	for {
		lis, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	h.addr = lis.Addr().String()
	h.g = grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &recordingStream{ServerStream: ss, hub: h})
	}))
	h.srv.Register(h.g)
	go func() { _ = h.g.Serve(lis) }()
	t.Cleanup(h.g.Stop)
	return h
}

func (h *hub) stop() { h.g.Stop() }

// lastNames returns the resource names of the last request of type label typ.
func (h *hub) lastNames(typ string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.last[typ])
}

type recordingStream struct {
	grpc.ServerStream
	hub *hub
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*discovery.DiscoveryRequest); ok && err == nil {
		names := slices.Sorted(slices.Values(req.GetResourceNames()))
		s.hub.mu.Lock()
		s.hub.last[typeLabel(req.GetTypeUrl())] = names
		if req.GetNode() != nil {
			s.hub.nodes = append(s.hub.nodes, req.GetNode())
		}
		s.hub.mu.Unlock()
	}
	return err
}

// startRelay runs a relay for a node in locality l, upstream of hubAddr,
// and serves it on its own listener; opts adjust its config and wiring.
func startRelay(t *testing.T, hubAddr string, l registry.Locality, opts ...func(*setup)) (*Relay, *prometheus.Registry, string) {
	t.Helper()
	cfg := setup{Config: DefaultConfig(), Wiring: Wiring{Upstream: hubAddr,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Node:        &core.Node{Id: "node-1", Locality: &core.Locality{Region: l.Region, Zone: l.Zone}}}}
	// Short backoff: the tests await reconnections.
	cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, 200*time.Millisecond
	// Short retention and hold: the tests await their ends.
	cfg.RetainUnwanted, cfg.HoldUnknown = 20*time.Millisecond, 200*time.Millisecond
	for _, o := range opts {
		o(&cfg)
	}
	reg := prometheus.NewRegistry()
	r, err := New(cfg.Config, cfg.Wiring, testLogger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	r.Register(g)
	go func() { _ = g.Serve(lis) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
		g.Stop()
	})
	return r, reg, lis.Addr().String()
}

// waitFor polls cond until it holds; it fails the test when ctx ends first.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("never saw %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
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

// noFailures fails the test if any poller saw a failed call.
func noFailures(t *testing.T, pollers ...*xdstest.Poller) {
	t.Helper()
	for _, p := range pollers {
		calls, failed := p.Failures()
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d calls failed, first: %v", p.Name(), len(failed), calls, failed[0])
		}
	}
}

// dialLocal opens an ADS stream to the relay at relayAddr, as a local
// client would, until ctx ends (its connection closes when the test ends).
func dialLocal(ctx context.Context, t *testing.T, relayAddr string) discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	conn, err := grpc.NewClient(relayAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
