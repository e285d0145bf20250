package xds

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/registry"
)

// fakeClock is the group table's clock in tests.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// startGroupsXDS serves twoServices with cfg and w, and the group table on clock.
func startGroupsXDS(t *testing.T, cfg Config, w Wiring, clock *fakeClock) (*Server, string) {
	t.Helper()
	s, _, addr := startXDSWith(t, cfg, w)
	s.table.now = clock.now
	r, _ := twoServices(t, ready)
	s.Update(r, registry.Diff{})
	return s, addr
}

// tableState is what the group table holds: entries by kind and held, and
// the bytes of client strings and version prefixes they keep.
type tableState struct{ locality, gateway, held, bytes int }

func stateOf(s *Server) tableState {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	var st tableState
	built := 0 // locality groups whose EDS cache a watch asked for
	for _, e := range s.table.entries {
		if e.key.gateway {
			st.gateway++
			st.bytes += len(e.view.lds.prefix)
		} else {
			st.locality++
			if e.eds != nil {
				built++
				st.bytes += len(e.eds.prefix)
			}
		}
		st.bytes += e.key.keyBytes()
		if e.refs > 0 {
			st.held++
		}
	}
	if n := len(*s.groups.Load()); n != built {
		panic(fmt.Sprintf("%d locality groups published, %d built in the table", n, built))
	}
	if n := len(*s.views.Load()); n != st.gateway {
		panic(fmt.Sprintf("%d gateway groups published, %d in the table", n, st.gateway))
	}
	return st
}

// await polls cond until it holds or ctx ends.
func await(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// edsStream opens an ADS stream for node asking for echo's assignment. It
// returns the first answer (or how the stream ended) and the stream's cancel.
func edsStream(ctx context.Context, t *testing.T, ads discovery.AggregatedDiscoveryServiceClient, node *core.Node) (*endpoint.ClusterLoadAssignment, context.CancelFunc, error) {
	t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	stream, err := ads.StreamAggregatedResources(sctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{ClusterName(echo, 8080)}}); err != nil {
		cancel()
		return nil, nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, nil, err
	}
	var cla endpoint.ClusterLoadAssignment
	if err := resp.GetResources()[0].UnmarshalTo(&cla); err != nil {
		t.Fatal(err)
	}
	return &cla, cancel, nil
}

// priorityOf is the priority echo's assignment gives zone.
func priorityOf(cla *endpoint.ClusterLoadAssignment, zone string) (uint32, bool) {
	for _, l := range cla.GetEndpoints() {
		if l.GetLocality().GetZone() == zone {
			return l.GetPriority(), true
		}
	}
	return 0, false
}

// Streams that name more localities than the bound, one after another,
// leave idle groups that new ones replace: an honest client of a new zone
// is served its own priorities, the table never holds more than the
// bound, and once the idle period passes the closed streams' groups are
// gone. With every group held, a new locality is refused, not served
// another group's priorities.
func TestLocalityGroupsAreHeldByStreamsAndExpire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const bound = 8
	cfg := DefaultConfig()
	cfg.MaxLocalityGroups = bound
	clock := newFakeClock()
	s, addr := startGroupsXDS(t, cfg, Wiring{}, clock)
	ads := dialADS(ctx, t, addr)

	for i := range 3 * bound {
		_, stop, err := edsStream(ctx, t, ads, nodeAt(loc(fmt.Sprint("junk-", i), "z"), ""))
		if err != nil {
			t.Fatalf("short stream %d: %v", i, err)
		}
		stop()
		await(ctx, t, "the short stream lets go of its group", func() bool { return stateOf(s).held == 0 })
		if st := stateOf(s); st.locality > bound {
			t.Fatalf("%d locality groups; the bound is %d", st.locality, bound)
		}
	}
	// An honest client in zone r1/z2: z2 first, z1 next.
	cla, stop, err := edsStream(ctx, t, ads, nodeAt(loc("r1", "z2"), ""))
	if err != nil {
		t.Fatalf("honest client: %v", err)
	}
	if p, ok := priorityOf(cla, "z2"); !ok || p != 0 {
		t.Fatalf("the honest client's own zone is at priority %d (%v); want 0: %v", p, ok, cla.GetEndpoints())
	}
	if p, _ := priorityOf(cla, "z1"); p != 1 {
		t.Fatalf("the honest client's neighbour zone is at priority %d, want 1: %v", p, cla.GetEndpoints())
	}
	stop()
	await(ctx, t, "the honest client lets go", func() bool { return stateOf(s).held == 0 })

	// The idle period passes: the next stream finds only its own group.
	clock.advance(GroupIdleTimeout)
	_, stopNext, err := edsStream(ctx, t, ads, nodeAt(loc("r1", "z1"), ""))
	if err != nil {
		t.Fatal(err)
	}
	if st := stateOf(s); st.locality != 1 || st.held != 1 {
		t.Fatalf("after the idle period the table holds %+v; want the one held group", st)
	}

	// Every group held: a new locality is refused, saying which bound.
	stops := []context.CancelFunc{stopNext}
	for i := range bound - 1 {
		_, stop, err := edsStream(ctx, t, ads, nodeAt(loc(fmt.Sprint("held-", i), "z"), ""))
		if err != nil {
			t.Fatalf("held stream %d: %v", i, err)
		}
		stops = append(stops, stop)
	}
	_, _, err = edsStream(ctx, t, ads, nodeAt(loc("r2", "z3"), ""))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "locality groups") {
		t.Fatalf("a new locality with every group held: %v; want ResourceExhausted naming the locality group bound", err)
	}
	// A client of a held group still joins it.
	if _, stop, err := edsStream(ctx, t, ads, nodeAt(loc("held-0", "z"), "")); err != nil {
		t.Fatalf("a client of a held group: %v", err)
	} else {
		stop()
	}
	for _, stop := range stops {
		stop()
	}
}

// Streams naming long localities (at the node field bound) leave nothing
// once they are closed and their groups expire; while held, the version
// prefix their caches stamp on every version stays short.
func TestLongLocalitiesLeaveNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clock := newFakeClock()
	s, addr := startGroupsXDS(t, DefaultConfig(), Wiring{}, clock)
	ads := dialADS(ctx, t, addr)
	var stops []context.CancelFunc
	for i := range 20 {
		region := fmt.Sprintf("%03d", i) + strings.Repeat("r", MaxNodeFieldBytes-3)
		_, stop, err := edsStream(ctx, t, ads, nodeAt(loc(region, strings.Repeat("z", MaxNodeFieldBytes)), ""))
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		stops = append(stops, stop)
	}
	s.stateMu.Lock()
	for _, e := range s.table.entries {
		if n := len(e.eds.prefix); n > len(s.cfg.VersionPrefix)+maxGroupPrefixBytes {
			t.Errorf("a group's version prefix is %d bytes", n)
		}
	}
	s.stateMu.Unlock()
	for _, stop := range stops {
		stop()
	}
	await(ctx, t, "the streams let go", func() bool { return stateOf(s).held == 0 })
	clock.advance(GroupIdleTimeout)
	// Anything that touches the table frees what expired; here, one more stream.
	_, stop, err := edsStream(ctx, t, ads, nodeAt(loc("r1", "z1"), ""))
	if err != nil {
		t.Fatal(err)
	}
	stop()
	await(ctx, t, "the last stream lets go", func() bool { return stateOf(s).held == 0 })
	clock.advance(GroupIdleTimeout)
	s.stateMu.Lock()
	s.expireGroups()
	s.stateMu.Unlock()
	if st := stateOf(s); st.locality != 0 || st.bytes != 0 {
		t.Fatalf("after every stream closed and the idle period passed, the table holds %+v; want nothing", st)
	}
}

// gatewayAudience classifies nodes with NAVE_GATEWAY metadata, one group
// per value, and serves each group every service's cluster.
type gatewayAudience struct{}

func (gatewayAudience) Classify(node *core.Node) (string, Client, bool) {
	v, ok := node.GetMetadata().GetFields()["NAVE_GATEWAY"]
	if !ok {
		return "", Client{}, false
	}
	return "gw/" + v.GetStringValue(), Client{}, true
}

func (gatewayAudience) Build(_ string, r *registry.Registry, _ registry.Networks) Resources {
	var res Resources
	for _, svc := range r.Services() {
		for _, p := range ServicePorts(svc) {
			res.Clusters = append(res.Clusters, Cluster(svc.Key, p, nil))
		}
	}
	return res
}

func gatewayNode(name string) *core.Node {
	return &core.Node{Id: name, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAVE_GATEWAY": structpb.NewStringValue(name)}}}
}

// cdsStream opens an ADS stream as identity who for node asking for every
// cluster, and returns how many its first answer carries (or how the
// stream ended) and the stream's cancel.
func cdsStream(ctx context.Context, t *testing.T, ads discovery.AggregatedDiscoveryServiceClient, who string, node *core.Node) (int, context.CancelFunc, error) {
	t.Helper()
	sctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "test-identity", who))
	stream, err := ads.StreamAggregatedResources(sctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		cancel()
		return 0, nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		cancel()
		return 0, nil, err
	}
	return len(resp.GetResources()), cancel, nil
}

// An identity the policy does not grant every namespace cannot make a
// gateway group by claiming NAVE_GATEWAY; with every gateway group held by
// real gateways, a new gateway is refused with a status saying so, not
// served nothing.
func TestGatewayGroupsAreAdmittedByThePolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := Wiring{Audience: gatewayAudience{}}
	w.Restrict = func(ctx context.Context) (Restriction, string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if who := md.Get("test-identity"); len(who) == 1 && who[0] == "gateway" {
			return nil, "gateway", nil // the policy grants it "*"
		}
		return func(ns string) bool { return ns == "shop" }, "shop-workload", nil
	}
	clock := newFakeClock()
	s, addr := startGroupsXDS(t, DefaultConfig(), w, clock)
	const bound = 4
	s.table.maxGateways = bound
	ads := dialADS(ctx, t, addr)

	for i := range 3 * bound {
		_, _, err := cdsStream(ctx, t, ads, "shop-workload", gatewayNode(fmt.Sprint("fake-", i)))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "may not be a gateway") {
			t.Fatalf("a workload claiming a gateway role: %v; want PermissionDenied", err)
		}
	}
	if st := stateOf(s); st.gateway != 0 || st.locality != 0 {
		t.Fatalf("refused gateway claims left %+v in the table; want nothing", st)
	}
	var stops []context.CancelFunc
	for i := range bound {
		n, stop, err := cdsStream(ctx, t, ads, "gateway", gatewayNode(fmt.Sprint("real-", i)))
		if err != nil || n != 2 {
			t.Fatalf("real gateway %d: %d clusters, %v; want both services' clusters", i, n, err)
		}
		stops = append(stops, stop)
	}
	_, _, err := cdsStream(ctx, t, ads, "gateway", gatewayNode("one-too-many"))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "gateway groups") {
		t.Fatalf("a new gateway with every gateway group held: %v; want ResourceExhausted naming the gateway group bound", err)
	}
	// One lets go: its idle group makes room for the new gateway.
	stops[0]()
	await(ctx, t, "a gateway lets go", func() bool { return stateOf(s).held < bound+1 })
	if n, stop, err := cdsStream(ctx, t, ads, "gateway", gatewayNode("one-too-many")); err != nil || n != 2 {
		t.Fatalf("a new gateway once a group is idle: %d clusters, %v", n, err)
	} else {
		stop()
	}
	if st := stateOf(s); st.gateway > bound {
		t.Fatalf("%d gateway groups; the bound is %d", st.gateway, bound)
	}
	for _, stop := range stops[1:] {
		stop()
	}
}

// A restricted identity holds at most MaxGroupsPerIdentity locality
// groups at once, whatever the table's bound.
// oneWorkload is a server under a policy granting every stream's identity,
// one workload's, its namespace alone.
func oneWorkload() Wiring {
	return Wiring{Restrict: func(context.Context) (Restriction, string, error) {
		return func(ns string) bool { return ns == "default" }, "one-workload", nil
	}}
}

func TestOneIdentityHoldsItsShareOfLocalityGroups(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, addr := startGroupsXDS(t, DefaultConfig(), oneWorkload(), newFakeClock())
	ads := dialADS(ctx, t, addr)
	var stops []context.CancelFunc
	for i := range MaxGroupsPerIdentity {
		_, stop, err := edsStream(ctx, t, ads, nodeAt(loc(fmt.Sprint("r-", i), "z"), ""))
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		stops = append(stops, stop)
	}
	_, _, err := edsStream(ctx, t, ads, nodeAt(loc("one-more", "z"), ""))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "per identity") {
		t.Fatalf("one locality beyond the identity's share: %v; want ResourceExhausted naming the per-identity bound", err)
	}
	if st := stateOf(s); st.locality != MaxGroupsPerIdentity {
		t.Fatalf("the table holds %+v; want the identity's %d groups", st, MaxGroupsPerIdentity)
	}
	for _, stop := range stops {
		stop()
	}
}

// A stream's locality group follows the topology: a client that names only
// its cluster joins that cluster's network's group once the network is
// known, on its next request (its node, sent once, does not change).
func TestAStreamsGroupFollowsItsClustersNetwork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, addr := startGroupsXDS(t, DefaultConfig(), Wiring{}, newFakeClock())
	ads := dialADS(ctx, t, addr)
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := nodeAt(loc("r1", "z1"), "")
	node.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{MetadataCluster: structpb.NewStringValue("east")}}
	req := &discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{ClusterName(echo, 8080)}}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	heldNetwork := func() registry.Network {
		s.table.mu.Lock()
		defer s.table.mu.Unlock()
		for _, h := range s.table.streams {
			return h.eds.key.client.Network
		}
		return "none"
	}
	if n := heldNetwork(); n != "" {
		t.Fatalf("before its cluster's network is known the stream holds the group of network %q", n)
	}
	s.SetNetworks(registry.Networks{Clusters: map[registry.ClusterID]registry.Network{"east": "net-a", "west": "net-b"}})
	// The ACK carries no node: the stream's own is taken, and its group again.
	if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: req.ResourceNames,
		VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	await(ctx, t, "the stream in net-a's group", func() bool { return heldNetwork() == "net-a" })
}

// A stream that moves to a new locality at its identity's bound is not
// refused for the group it leaves: it holds one group before and after.
func TestAStreamMovesAtItsIdentitysBound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, addr := startGroupsXDS(t, DefaultConfig(), oneWorkload(), newFakeClock())
	ads := dialADS(ctx, t, addr)
	for i := range MaxGroupsPerIdentity - 1 {
		_, stop, err := edsStream(ctx, t, ads, nodeAt(loc(fmt.Sprint("r-", i), "z"), ""))
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		defer stop()
	}
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{ClusterName(echo, 8080)}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: nodeAt(loc("last", "z"), ""), TypeUrl: resource.EndpointType, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("the identity's last group: %v", err)
	}
	// The same stream, now elsewhere (a node may change on a stream).
	if err := stream.Send(&discovery.DiscoveryRequest{Node: nodeAt(loc("moved", "z"), ""), TypeUrl: resource.EndpointType, ResourceNames: names,
		VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	await(ctx, t, "the stream in its new group", func() bool {
		s.table.mu.Lock()
		defer s.table.mu.Unlock()
		for _, h := range s.table.streams {
			if h.eds.key.client.Locality.Region == "moved" {
				return true
			}
		}
		return false
	})
	if st := stateOf(s); st.held != MaxGroupsPerIdentity {
		t.Errorf("the table holds %+v; want the identity's %d groups held", st, MaxGroupsPerIdentity)
	}
}
