package hub

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// topologies records every network topology a publisher is handed.
type topologies struct {
	updates
	nets []registry.Networks
}

func (p *topologies) SetNetworks(n registry.Networks) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nets = append(p.nets, n)
}

func (p *topologies) last() (registry.Networks, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.nets) == 0 {
		return registry.Networks{}, 0
	}
	return p.nets[len(p.nets)-1], len(p.nets)
}

var (
	gwEast = registry.Gateway{Address: "192.0.2.1", Port: 15443}
	gwName = registry.Gateway{Address: "gw.west.example.com", Port: 15443}
)

// Gateways announced by a session reach the topology xDS is given, peers
// (with the cluster's data), the snapshot and the networks view; a stale
// session cannot change them, and a dropped cluster vouches for none.
func TestGatewaysFollowTheirCluster(t *testing.T) {
	ctx := context.Background()
	pub := &topologies{}
	s := newState("hub-test", DefaultLiveness(), pub, registry.DefaultLimits(), nil, slog.New(slog.DiscardHandler))
	runCtx, cancel := context.WithCancel(ctx)
	go s.run(runCtx)
	t.Cleanup(func() { cancel(); <-s.done })

	if _, err := s.Begin(ctx, federation.Session{Cluster: "east", Network: "net-a", Epoch: 3, Started: time.Now(),
		Gateways: []registry.Gateway{gwEast}, GatewaysKnown: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, 3, 1, registry.Change{Cluster: "east", Upserts: []*registry.Shard{apiShard("east", time.Unix(1, 0), "grpc")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, federation.Session{Cluster: "west", Network: "net-b", Epoch: 1, Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	want := registry.Networks{
		Clusters: map[registry.ClusterID]registry.Network{"east": "net-a", "west": "net-b"},
		Gateways: map[registry.Network][]registry.Gateway{"net-a": {gwEast}},
	}
	if got, _ := pub.last(); !got.Equal(want) {
		t.Fatalf("topology %+v, want %+v", got, want)
	}
	if m, _ := s.Replicas(); !slices.Equal(m["east"].Gateways, []registry.Gateway{gwEast}) {
		t.Errorf("replicated gateways of east %v", m["east"].Gateways)
	}

	// A change of gateways: the topology follows, and the leader sees a state
	// to persist; the same set again is no change.
	heldBefore := s.View().held()
	if err := s.SetGateways(ctx, "east", 3, []registry.Gateway{gwEast, gwName}); err != nil {
		t.Fatal(err)
	}
	if s.View().held() == heldBefore {
		t.Error("a change of gateways alone leaves nothing new to persist")
	}
	if err := s.SetGateways(ctx, "east", 3, []registry.Gateway{gwEast}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetGateways(ctx, "west", 1, []registry.Gateway{gwName}); err != nil {
		t.Fatal(err)
	}
	_, n := pub.last()
	if err := s.SetGateways(ctx, "west", 1, []registry.Gateway{gwName}); err != nil {
		t.Fatal(err)
	}
	if got, m := pub.last(); m != n || !slices.Equal(got.Gateways["net-b"], []registry.Gateway{gwName}) {
		t.Errorf("after announcing west's gateway: %d topologies (want %d), net-b %v", m, n, got.Gateways["net-b"])
	}
	nets := s.View().Networks()
	if len(nets) != 2 || nets[0].Network != "net-a" || !nets[0].Reachable || nets[1].Reachable ||
		len(nets[1].Gateways) != 1 || nets[1].Gateways[0].Usable || !slices.Equal(nets[1].Gateways[0].Clusters, []registry.ClusterID{"west"}) {
		t.Errorf("networks view %+v", nets)
	}
	// An older session of east cannot change them.
	if err := s.SetGateways(ctx, "east", 2, nil); !errors.Is(err, federation.ErrSuperseded) {
		t.Errorf("SetGateways from a superseded epoch = %v, want ErrSuperseded", err)
	}

	// The snapshot keeps them; a restore brings them back.
	snap, _, err := s.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	restored := startState(t)
	if err := restored.restore(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if c := restored.View().Clusters["east"]; !slices.Equal(c.Gateways, []registry.Gateway{gwEast}) {
		t.Errorf("restored east gateways %v", c.Gateways)
	}

	// A peer takes them with the cluster's data, and a later full state at
	// the same stamp that changes only them.
	peer := startState(t)
	u := replicas.Update{Cluster: "east", Network: "net-a", Gateways: []registry.Gateway{gwEast}, Stamp: stamp(3, 1), Origin: "hub-test",
		Change: registry.Change{Cluster: "east", Replace: true, Upserts: []*registry.Shard{apiShard("east", time.Unix(1, 0), "grpc")}}}
	if err := peer.ApplyReplica(ctx, "hub-test", u); err != nil {
		t.Fatal(err)
	}
	u.Gateways = nil
	if err := peer.ApplyReplica(ctx, "hub-test", u); err != nil {
		t.Fatal(err)
	}
	if got := peer.View().Topology.Gateways["net-a"]; len(got) != 0 {
		t.Errorf("peer still holds net-a gateways %v after they were withdrawn", got)
	}

	// A dropped cluster vouches for no gateway.
	_ = s.do(ctx, func() { s.clusters["east"].Stale = true })
	if dropped, err := s.drop(ctx, "east", 9); err != nil || !dropped {
		t.Fatal(dropped, err)
	}
	if got, _ := pub.last(); len(got.Gateways["net-a"]) != 0 {
		t.Errorf("net-a still has gateways %v after east was dropped", got.Gateways["net-a"])
	}
}

// A gateway known by a DNS name reaches clients by the addresses the name
// resolves to (here through the machine's own resolver: localhost), and
// keeps them while later lookups fail.
func TestGatewayNamesAreResolvedAndKept(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := &topologies{}
	s := newState("hub-test", DefaultLiveness(), pub, registry.DefaultLimits(), nil, slog.New(slog.DiscardHandler))
	go s.run(ctx)
	t.Cleanup(func() { cancel(); <-s.done })
	if _, err := s.Begin(ctx, federation.Session{Cluster: "west", Network: "net-b", Epoch: 1, Started: time.Now(),
		Gateways: []registry.Gateway{{Address: "localhost", Port: 15444}}, GatewaysKnown: true}); err != nil {
		t.Fatal(err)
	}
	var failing atomic.Bool
	lookup := func(ctx context.Context, host string) ([]netip.Addr, error) {
		if failing.Load() {
			return nil, errors.New("DNS is down")
		}
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}
	var lookups atomic.Int32
	counted := func(ctx context.Context, host string) ([]netip.Addr, error) {
		lookups.Add(1)
		return lookup(ctx, host)
	}
	go s.resolveGatewayNames(ctx, counted, 20*time.Millisecond)
	resolvedTo := func() []registry.Gateway {
		got, _ := pub.last()
		return got.Gateways["net-b"]
	}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(resolvedTo(), registry.Gateway{Address: "127.0.0.1", Port: 15444}) {
		if time.Now().After(deadline) {
			t.Fatalf("net-b gateways %v, want localhost resolved to 127.0.0.1", resolvedTo())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if nets := s.View().Networks(); !nets[0].Reachable || !slices.Contains(nets[0].Gateways[0].Resolved, "127.0.0.1") {
		t.Errorf("networks view %+v, want localhost shown resolved", nets)
	}
	// DNS fails: the addresses stay.
	failing.Store(true)
	for before := lookups.Load(); lookups.Load() < before+3; {
		time.Sleep(10 * time.Millisecond)
	}
	if !slices.Contains(resolvedTo(), registry.Gateway{Address: "127.0.0.1", Port: 15444}) {
		t.Errorf("after failed lookups net-b gateways are %v; the resolved address must stay", resolvedTo())
	}
}

// Peers tell a cluster's data apart by its network and gateways too, and
// take a new network with newer data.
func TestReplicasCompareNetworksAndGateways(t *testing.T) {
	ctx := context.Background()
	shards := registry.Hash{1, 2, 3}
	if replicaDigest(shards, "", nil) != shards {
		t.Error("without a network the replicated digest must be the shards' (replicas that predate networks)")
	}
	a := replicaDigest(shards, "net-a", []registry.Gateway{gwEast})
	if a == shards || a == replicaDigest(shards, "net-a", nil) || a == replicaDigest(shards, "net-b", []registry.Gateway{gwEast}) {
		t.Error("the replicated digest does not follow the network and gateways")
	}
	peer := startState(t)
	u := replicas.Update{Cluster: "east", Network: "net-a", Stamp: stamp(3, 1), Origin: "home",
		Change: registry.Change{Cluster: "east", Replace: true, Upserts: []*registry.Shard{apiShard("east", time.Unix(1, 0), "grpc")}}}
	if err := peer.ApplyReplica(ctx, "home", u); err != nil {
		t.Fatal(err)
	}
	u.Network, u.Stamp = "net-b", stamp(3, 2)
	if err := peer.ApplyReplica(ctx, "home", u); err != nil {
		t.Fatal(err)
	}
	if got := peer.View().Clusters["east"].Network; got != "net-b" {
		t.Errorf("peer holds network %q after newer data said net-b", got)
	}
	m, _ := peer.Replicas()
	if m["east"].Digest != replicaDigest(peer.View().Registry.ClusterDigest("east"), "net-b", nil) {
		t.Error("the replica view's digest is not the replicated digest")
	}
}

// nave_hub_network_gateways says, per network, how many gateways other
// networks' clients can be handed; a network gone loses its series.
func TestNetworkGatewaysMetric(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	v := View{Registry: registry.New(), Topology: registry.Networks{
		Clusters: map[registry.ClusterID]registry.Network{"east": "net-a", "west": "net-b", "north": "net-b"},
		Gateways: map[registry.Network][]registry.Gateway{"net-a": {gwEast, gwName, {Address: "192.0.2.99", Port: 15444}}},
	}}
	m.observe(v, time.Now())
	if got := testutil.ToFloat64(m.networkGateways.WithLabelValues("net-a")); got != 2 {
		t.Errorf("net-a: %v usable gateways, want 2 (a name not yet resolved is not usable)", got)
	}
	if got := testutil.ToFloat64(m.networkGateways.WithLabelValues("net-b")); got != 0 {
		t.Errorf("net-b: %v, want 0", got)
	}
	v.Topology = registry.Networks{Clusters: map[registry.ClusterID]registry.Network{"east": "net-a"}}
	m.observe(v, time.Now())
	if n := testutil.CollectAndCount(m.networkGateways); n != 1 {
		t.Errorf("%d series after net-b went, want 1", n)
	}
}

// A dropped cluster's series go (issue 12's leftover from the HA work).
func TestDroppedClusterSeriesAreDeleted(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	v := View{Registry: registry.New(), Clusters: map[registry.ClusterID]ClusterStatus{
		"east": clusterStatus(adminapi.ClusterStatus{Cluster: "east", Services: 3, Endpoints: 9}),
		"west": clusterStatus(adminapi.ClusterStatus{Cluster: "west", Services: 1, Endpoints: 2})}}
	m.observe(v, time.Now())
	m.updates.WithLabelValues("east", "delta", "ack").Inc()
	m.resyncs.WithLabelValues("east", "digest").Inc()
	if n := testutil.CollectAndCount(m.clusterServices); n != 2 {
		t.Fatalf("%d cluster_services series, want 2", n)
	}
	v.Clusters["east"] = clusterStatus(adminapi.ClusterStatus{Cluster: "east", Dropped: true, Stale: true})
	m.observe(v, time.Now())
	for name, c := range map[string]prometheus.Collector{"services": m.clusterServices, "endpoints": m.clusterEndpoints,
		"stale": m.clusterStale, "restored": m.clusterRestored, "data age": m.clusterDataAge, "updates": m.updates, "resyncs": m.resyncs} {
		want := 1
		if name == "updates" || name == "resyncs" {
			want = 0
		}
		if n := testutil.CollectAndCount(c); n != want {
			t.Errorf("%s: %d series after east was dropped, want %d (west's only)", name, n, want)
		}
	}
}

// What a gateway's DNS name resolved to travels with the cluster's data in
// the snapshot: a restarted hub hands the gateway out from its first push,
// and keeps it while DNS fails (it never resolved the name itself).
func TestResolvedGatewayNamesSurviveARestart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func(pub Publisher) *state {
		s := newState("hub-test", DefaultLiveness(), pub, registry.DefaultLimits(), nil, slog.New(slog.DiscardHandler))
		go s.run(ctx)
		t.Cleanup(func() { cancel(); <-s.done })
		return s
	}
	before := start(&topologies{})
	if _, err := before.Begin(ctx, federation.Session{Cluster: "west", Network: "net-b", Epoch: 1, Started: time.Now(),
		Gateways: []registry.Gateway{{Address: "localhost", Port: 15444}}, GatewaysKnown: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := before.Apply(ctx, 1, 1, registry.Change{Cluster: "west", Replace: true}); err != nil {
		t.Fatal(err)
	}
	go before.resolveGatewayNames(ctx, func(ctx context.Context, host string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("192.0.2.7")}, nil
	}, time.Hour)
	var snap registry.Snapshot
	for deadline := time.Now().Add(10 * time.Second); len(snap.Clusters) == 0 || len(snap.Clusters[0].Resolved) == 0; time.Sleep(10 * time.Millisecond) {
		var err error
		if snap, _, err = before.snapshot(ctx); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the snapshot never held localhost's resolution: %+v", snap)
		}
	}
	b, err := replicas.EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	if snap, err = replicas.DecodeSnapshot(b); err != nil {
		t.Fatal(err)
	}

	pub := &topologies{}
	after := start(pub)
	if _, _, err := after.restoreHeld(ctx, snap); err != nil {
		t.Fatal(err)
	}
	want := registry.Gateway{Address: "192.0.2.7", Port: 15444}
	if got, _ := pub.last(); !slices.Contains(got.Gateways["net-b"], want) {
		t.Fatalf("net-b gateways once restored: %v, want %v (the name's last resolution)", got.Gateways["net-b"], want)
	}
	var lookups atomic.Int32
	go after.resolveGatewayNames(ctx, func(ctx context.Context, host string) ([]netip.Addr, error) {
		lookups.Add(1)
		return nil, errors.New("DNS is down")
	}, 20*time.Millisecond)
	for lookups.Load() < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	if got, _ := pub.last(); !slices.Contains(got.Gateways["net-b"], want) {
		t.Errorf("net-b gateways after failed lookups: %v, want %v kept", got.Gateways["net-b"], want)
	}
}
