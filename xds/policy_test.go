package xds

import (
	"context"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/navemesh/nave/registry"
)

// startRestrictedXDS serves twoServices, moving other to namespace
// "shop", to clients that may receive namespace "default" only.
func startRestrictedXDS(t *testing.T) (*Server, *prometheus.Registry, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Restrict = func(context.Context) (Restriction, string, error) {
		return func(ns string) bool { return ns == "default" }, "test-identity", nil
	}
	s, reg, addr := startXDSWith(t, cfg)
	r, _ := apply(t, registry.New(),
		shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))),
		shard("west", shopKey, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.1", loc("r2", "z3"), ready, eport("grpc", 9090))))
	s.Update(r, registry.Diff{})
	return s, reg, addr
}

var shopKey = registry.ServiceKey{Namespace: "shop", Name: "cart"}

func TestPolicyHoldsForDeltaWithoutANode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, reg, addr := startRestrictedXDS(t)
	stream, err := dialADS(ctx, t, addr).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := ClusterName(echo, 8080), ClusterName(shopKey, 8080)
	// No node at all, and a wildcard CDS subscription besides.
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{mine, theirs}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := resourceNames(resp.GetResources()); !slices.Equal(got, []string{mine}) {
		t.Fatalf("a nodeless delta client was sent %v, want only %s", got, mine)
	}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *discovery.DeltaDiscoveryResponse, 1)
	go func() {
		if r, err := stream.Recv(); err == nil {
			got <- r
		}
	}()
	select {
	case r := <-got:
		t.Fatalf("a restricted wildcard subscription was answered: %v", resourceNames(r.GetResources()))
	case <-time.After(500 * time.Millisecond):
	}
	// Denied: theirs, and the wildcard; the ACK counts nothing.
	if n := metricValue(t, reg, MetricDeniedResources, typeEDS); n != 1 {
		t.Errorf("denied EDS names counted %v, want 1", n)
	}
	if n := metricValue(t, reg, MetricDeniedResources, typeCDS); n != 1 {
		t.Errorf("denied CDS wildcard counted %v, want 1", n)
	}
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	if len(s.restrict.byNode) != 1 {
		t.Errorf("%d nodes remembered for one stream", len(s.restrict.byNode))
	}
}

// A node resent with every request (Envoy's default) replaces the last: one
// entry per stream, whatever it sends.
func TestPolicyRemembersOneNodePerStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, _, addr := startRestrictedXDS(t)
	stream, err := dialADS(ctx, t, addr).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mine := ClusterName(echo, 8080)
	req := func(nonce string) {
		t.Helper()
		if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "envoy", Locality: &core.Locality{Region: "r1"}},
			TypeUrl: resource.EndpointType, ResourceNames: []string{mine, ClusterName(shopKey, 8080)}, ResponseNonce: nonce}); err != nil {
			t.Fatal(err)
		}
	}
	req("")
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := claNames(t, resp.GetResources()); !slices.Equal(got, []string{mine}) {
		t.Fatalf("sent %v, want only %s", got, mine)
	}
	for range 50 {
		req(resp.GetNonce())
	}
	// Nothing answers these (nothing changed): give the server the time to
	// read them, far more than 50 requests on loopback take.
	time.Sleep(500 * time.Millisecond)
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	if n := len(s.restrict.byNode); n != 1 {
		t.Fatalf("%d nodes remembered for one stream", n)
	}
}
