package xds

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/navemesh/nave/registry"
)

// startRestrictedXDS serves twoServices, moving other to namespace
// "shop", to clients that may receive namespace "default" only.
func startRestrictedXDS(t *testing.T) (*Server, *prometheus.Registry, string, *registry.Registry) {
	t.Helper()
	s, reg, addr := startXDSWith(t, DefaultConfig(), Wiring{Restrict: func(context.Context) (Restriction, string, error) {
		return func(ns string) bool { return ns == "default" }, "test-identity", nil
	}})
	r, _ := apply(t, registry.New(),
		shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))),
		shard("west", shopKey, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.1", loc("r2", "z3"), ready, eport("grpc", 9090))))
	s.Update(r, registry.Diff{})
	return s, reg, addr, r
}

var shopKey = registry.ServiceKey{Namespace: "shop", Name: "cart"}

func TestPolicyHoldsForDeltaWithoutANode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, reg, addr, _ := startRestrictedXDS(t)
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
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := resourceNames(resp.GetResources()); !slices.Equal(got, []string{mine}) {
		t.Fatalf("a restricted wildcard subscription was sent %v, want only %s", got, mine)
	}
	// Denied: theirs; the ACK counts nothing, and a wildcard is no denial.
	if n := metricValue(t, reg, MetricDeniedResources, typeEDS); n != 1 {
		t.Errorf("denied EDS names counted %v, want 1", n)
	}
	if n := metricValue(t, reg, MetricDeniedResources, typeCDS); n != 0 {
		t.Errorf("denied CDS names counted %v, want 0", n)
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
	s, _, addr, _ := startRestrictedXDS(t)
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

// A restricted wildcard subscription (an Envoy gateway's CDS) receives the
// part it may see, and follows it: a service appearing in its namespaces
// is pushed, one in another namespace is not, one going is withdrawn.
func TestPolicyWildcardGetsWhatItMaySee(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, reg, addr, r := startRestrictedXDS(t)
	stream, err := dialADS(ctx, t, addr).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &core.Node{Id: "gateway", Locality: &core.Locality{Region: "r1"}}
	var last *discovery.DiscoveryResponse
	// ack acknowledges the last answer (or asks first), and waits until
	// the stream's new watch is open.
	ack := func() {
		t.Helper()
		req := &discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}
		if last != nil {
			req.VersionInfo, req.ResponseNonce = last.GetVersionInfo(), last.GetNonce()
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			s.cds.wildcards.mu.Lock()
			n := len(s.cds.wildcards.open)
			s.cds.wildcards.mu.Unlock()
			if n == 1 || last == nil {
				return
			}
			if time.Now().After(end) {
				t.Fatal("no watch open after the ACK")
			}
		}
	}
	recv := func(want ...string) {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got := namesOf(t, resp.GetResources(), (*clusterv3.Cluster).GetName)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("sent clusters %v, want %v", got, want)
		}
		last = resp
	}
	mine := ClusterName(echo, 8080)
	ack()
	recv(mine)
	ack()
	added := registry.ServiceKey{Namespace: "default", Name: "added"}
	r, d := apply(t, r, shard("east", added, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.2", loc("r1", "z1"), ready, eport("grpc", 9090))))
	s.Update(r, d)
	recv(mine, ClusterName(added, 8080))
	ack()
	// With a watch open, a service elsewhere changes nothing the client
	// sees: the next answer is the withdrawal that follows, not a repeat.
	hidden := registry.ServiceKey{Namespace: "shop", Name: "hidden"}
	r, d = apply(t, r, shard("west", hidden, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.2", loc("r2", "z3"), ready, eport("grpc", 9090))))
	s.Update(r, d)
	r, d = r.Apply(registry.Change{Cluster: "east", Removes: []registry.ServiceKey{added}})
	s.Update(r, d)
	recv(mine)
	if n := metricValue(t, reg, MetricDeniedResources, typeCDS); n != 0 {
		t.Errorf("a wildcard counted %v denied names, want 0", n)
	}
	ack()
	s.cds.wildcards.mu.Lock()
	defer s.cds.wildcards.mu.Unlock()
	if n := len(s.cds.wildcards.open); n != 1 {
		t.Errorf("%d restricted wildcard watches open for one stream", n)
	}
}

// A delta client's first wildcard request is answered even when it may
// see nothing (Envoy waits for that answer to initialise).
func TestPolicyDeltaWildcardSeeingNothingIsAnswered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, _, addr := startXDSWith(t, DefaultConfig(), Wiring{Restrict: func(context.Context) (Restriction, string, error) {
		return func(ns string) bool { return ns == "empty" }, "gateway", nil
	}})
	r, _ := apply(t, registry.New(), shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))))
	s.Update(r, registry.Diff{})
	stream, err := dialADS(ctx, t, addr).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "gateway"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResources()) != 0 || len(resp.GetRemovedResources()) != 0 || resp.GetNonce() == "" {
		t.Fatalf("first answer: %d resources, removed %v, nonce %q; want an empty answer", len(resp.GetResources()), resp.GetRemovedResources(), resp.GetNonce())
	}
}

// No answer is sent once a restricted wildcard watch is cancelled: a
// delta stream closes its channel right after (go-control-plane's
// watches.Cancel), and a send then would panic the process.
func TestRestrictedWildcardSendsNothingAfterItsCancel(t *testing.T) {
	c := newResourceCache(resource.ClusterType, "cds-", slog.New(slog.DiscardHandler), nil, nil)
	name := ClusterName(echo, 8080)
	if err := c.linear.UpdateResources(map[string]types.Resource{name: &clusterv3.Cluster{Name: name}}, nil); err != nil {
		t.Fatal(err)
	}
	allow := func(string) bool { return true }
	for i := range 20_000 { // each watch is answered at once: its forwarder races the stream's end
		req := &cache.DeltaRequest{TypeUrl: resource.ClusterType, Node: &core.Node{Id: "gateway"}}
		sub := stream.NewDeltaSubscription(nil, nil, nil, true)
		muxed := make(chan cache.DeltaResponse, 16)
		cancel, err := watchRestrictedWildcard(c, allow, muxed, func(names map[string]struct{}, ch chan cache.DeltaResponse) (func(), error) {
			return c.linear.CreateDeltaWatch(req, restrictedSubscription{Subscription: &sub, names: names}, ch)
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for j := range i % 2000 { // the stream ends a moment later
			_ = j * j
		}
		cancel()
		close(muxed)
	}
}
