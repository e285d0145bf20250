package replicas

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/internal/changelog"
	"github.com/navemesh/nave/registry"
)

const replPeerToken = "peer-token-0123456789"

// testTokens are the cluster tokens the replicas' servers admit next to the peer token.
var testTokens = federation.Tokens{"east": "east-token-0123456789", "west": "west-token-0123456789"}

func dial(t *testing.T, addr, token string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: token, AllowInsecure: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func testShard(cluster registry.ClusterID, name string, addrs ...string) *registry.Shard {
	s := &registry.Shard{
		Cluster: cluster, Service: registry.ServiceKey{Namespace: "default", Name: name},
		Ports: []registry.ServicePort{{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, registry.Endpoint{
			Addresses: []netip.Addr{netip.MustParseAddr(a)}, Ports: []registry.EndpointPort{{Name: "grpc", Port: 9090}},
			Locality: registry.Locality{Region: "r1", Zone: "z1"}, Conditions: registry.Conditions{Ready: true, Serving: true},
		})
	}
	s.Normalize()
	return s
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// replStore is a Store in memory that applies the rules a hub replica
// follows: a full state over an older or equal stamp, a delta only over its
// exact base, ErrStale and ErrBaseMismatch otherwise.
type replStore struct {
	refuse   map[registry.ServiceKey]bool // a policy's: applied without them, ErrPartlyRefused
	mu       sync.Mutex
	clusters map[registry.ClusterID]Cluster
	changed  chan struct{}
	applied  []Update // every update applied, in order
}

func newReplStore() *replStore {
	return &replStore{clusters: map[registry.ClusterID]Cluster{}, changed: make(chan struct{})}
}

func (s *replStore) Replicas() (map[registry.ClusterID]Cluster, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clusters, s.changed
}

func (s *replStore) ApplyReplica(_ context.Context, from string, u Update) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := s.clusters[u.Cluster]
	var shards map[registry.ServiceKey]*registry.Shard
	if u.Base == nil {
		if u.Stamp.Less(held.Stamp) {
			return fmt.Errorf("%w: full state %s, holding %s", ErrStale, u.Stamp, held.Stamp)
		}
		if !u.Change.Replace || len(u.Change.Removes) > 0 {
			return errors.New("a full state must replace and cannot remove")
		}
		shards = map[registry.ServiceKey]*registry.Shard{}
	} else {
		if !u.Base.Less(u.Stamp) {
			return fmt.Errorf("delta to %s over %s", u.Stamp, *u.Base)
		}
		if held.Stamp != *u.Base {
			if !held.Stamp.Less(u.Stamp) {
				return fmt.Errorf("%w: delta to %s, holding %s", ErrStale, u.Stamp, held.Stamp)
			}
			return fmt.Errorf("%w: delta over %s, holding %s", ErrBaseMismatch, *u.Base, held.Stamp)
		}
		shards = map[registry.ServiceKey]*registry.Shard{}
		if held.Shards != nil {
			maps.Insert(shards, held.Shards.All())
		}
		for _, k := range u.Change.Removes {
			delete(shards, k)
		}
	}
	refused := 0
	for _, sh := range u.Change.Upserts {
		if sh.Cluster != u.Cluster {
			return fmt.Errorf("shard of cluster %s in an update of %s", sh.Cluster, u.Cluster)
		}
		if s.refuse[sh.Service] {
			refused++
			continue
		}
		shards[sh.Service] = sh
	}
	s.applied = append(s.applied, u)
	s.putLocked(u.Cluster, Cluster{Stamp: u.Stamp, Digest: registry.Digest(shards), Network: u.Network,
		Shards: ShardMap(shards), Origin: u.Origin})
	if refused > 0 {
		return fmt.Errorf("%w: %d services", ErrPartlyRefused, refused)
	}
	return nil
}

func (s *replStore) putLocked(id registry.ClusterID, c Cluster) {
	next := maps.Clone(s.clusters)
	next[id] = c
	s.clusters = next
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *replStore) put(id registry.ClusterID, c Cluster) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(id, c)
}

// local records a change a spoke session at this replica made.
func (s *replStore) local(id registry.ClusterID, stamp Stamp, shards ...*registry.Shard) {
	s.put(id, replicaOf(stamp, true, "", shards...))
}

// remote records data this replica received from origin (or had tampered with).
func (s *replStore) remote(id registry.ClusterID, stamp Stamp, origin string, shards ...*registry.Shard) {
	s.put(id, replicaOf(stamp, false, origin, shards...))
}

func replicaOf(stamp Stamp, local bool, origin string, shards ...*registry.Shard) Cluster {
	m := map[registry.ServiceKey]*registry.Shard{}
	for _, sh := range shards {
		m[sh.Service] = sh
	}
	return Cluster{Stamp: stamp, Digest: registry.Digest(m), Network: "net-1", Shards: ShardMap(m), Local: local, Origin: origin}
}

func (s *replStore) get(id registry.ClusterID) (Cluster, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clusters[id]
	return c, ok
}

// appliedOf returns the updates of cluster id applied so far.
func (s *replStore) appliedOf(id registry.ClusterID) []Update {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Update
	for _, u := range s.applied {
		if u.Cluster == id {
			out = append(out, u)
		}
	}
	return out
}

// holds reports whether the store holds cluster id at stamp with digest.
func (s *replStore) holds(id registry.ClusterID, stamp Stamp, digest registry.Hash) bool {
	c, ok := s.get(id)
	return ok && c.Stamp == stamp && c.Digest == digest
}

// replHooks counts what the hooks report, by "hook cluster detail".
type replHooks struct {
	mu     sync.Mutex
	counts map[string]int
}

func (h *replHooks) add(hook string, c registry.ClusterID, detail string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[hook+" "+string(c)+" "+detail]++
}

func (h *replHooks) count(hook string, c registry.ClusterID, detail string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[hook+" "+string(c)+" "+detail]
}

func (h *replHooks) hooks() ReplicationHooks {
	return ReplicationHooks{
		Sent:    func(c registry.ClusterID, kind string) { h.add("sent", c, kind) },
		Applied: func(c registry.ClusterID, result string) { h.add("applied", c, result) },
		Resync:  func(c registry.ClusterID, reason string) { h.add("resync", c, reason) },
	}
}

// replNode is a hub replica as replication sees it: a store, the server its
// peers subscribe to and the replicator that subscribes to its peers.
type replNode struct {
	id         string
	cfg        ReplicationConfig
	w          ReplicationWiring
	store      *replStore
	hooks      *replHooks
	srv        *ReplicationServer
	addr       string
	stopServer func()
	rep        *Replicator
}

func fastReplication(id string) (ReplicationConfig, ReplicationWiring) {
	cfg := DefaultReplicationConfig()
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	fed := federation.DefaultHubConfig()
	return cfg, ReplicationWiring{ReplicaID: id, PeerToken: func() string { return replPeerToken }, MaxMessageBytes: fed.MaxMessageBytes, Limits: fed.Limits}
}

// startReplNode starts a replica; tune, if not nil, adjusts its configuration and wiring.
func startReplNode(t *testing.T, id string, tune func(*ReplicationConfig, *ReplicationWiring)) *replNode {
	t.Helper()
	cfg, w := fastReplication(id)
	if tune != nil {
		tune(&cfg, &w)
	}
	n := &replNode{id: id, store: newReplStore(), hooks: &replHooks{counts: map[string]int{}}}
	w.Hooks = n.hooks.hooks()
	n.cfg, n.w = cfg, w
	n.serve(t, "127.0.0.1:0")
	n.rep = NewReplicator(n.store, cfg, w, insecure.NewCredentials(), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.rep.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return n
}

// noFederation admits every Publish that passes authentication, and does nothing.
type noFederation struct {
	fedv1.UnimplementedFederationServer
}

// serve starts the node's gRPC server on addr, authenticated as a hub is:
// cluster tokens for Publish, the peer token for Replication.
func (n *replNode) serve(t *testing.T, addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	n.addr = lis.Addr().String()
	var opts []federation.AuthOption
	if n.w.PeerToken != nil {
		opts = append(opts, federation.WithPeerToken(n.w.PeerToken()))
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(2*n.w.MaxMessageBytes), grpc.StreamInterceptor(federation.AuthInterceptor(testTokens, opts...)))
	n.srv = NewReplicationServer(n.store, n.cfg, n.w, slog.New(slog.DiscardHandler))
	fedv1.RegisterReplicationServer(g, n.srv)
	fedv1.RegisterFederationServer(g, noFederation{})
	go func() { _ = g.Serve(lis) }()
	n.stopServer = g.Stop
	t.Cleanup(g.Stop)
}

// peerStatus returns where n's subscription to peer stands.
func (n *replNode) peerStatus(peer string) (PeerStatus, bool) {
	for _, s := range n.rep.Status() {
		if s.ID == peer {
			return s, true
		}
	}
	return PeerStatus{}, false
}

// synced reports whether every peer has caught n up.
func (n *replNode) synced(peers ...string) bool {
	for _, p := range peers {
		if s, ok := n.peerStatus(p); !ok || !s.Synced {
			return false
		}
	}
	return true
}

func peersOf(nodes ...*replNode) map[string]string {
	out := map[string]string{}
	for _, n := range nodes {
		out[n.id] = n.addr
	}
	return out
}

// sameCluster reports whether b holds cluster id exactly as a does.
func sameCluster(a, b *replNode, id registry.ClusterID) bool {
	ca, ok := a.store.get(id)
	return ok && b.store.holds(id, ca.Stamp, ca.Digest)
}

func TestReplicationLateJoinerCatchesUpCompletely(t *testing.T) {
	a := startReplNode(t, "a", nil)
	a.store.local("east", Stamp{1, 3}, testShard("east", "a", "10.0.0.1"), testShard("east", "b", "10.0.0.2"))
	a.store.remote("west", Stamp{4, 1}, "c", testShard("west", "a", "10.1.0.1"))
	a.store.local("gone", Stamp{2, 7}) // dropped by a as leader: no shards left

	b := startReplNode(t, "b", nil)
	b.rep.SetPeers(peersOf(a))
	waitFor(t, func() bool { return b.synced("a") })
	for id, origin := range map[registry.ClusterID]string{"east": "a", "west": "c", "gone": "a"} {
		want, _ := a.store.get(id)
		got, ok := b.store.get(id)
		switch {
		case !ok:
			t.Errorf("b does not hold cluster %s", id)
		case got.Stamp != want.Stamp || got.Digest != want.Digest || got.Network != want.Network:
			t.Errorf("b holds %s at %s (%s, %s), want %s (%s, %s)", id, got.Stamp, got.Digest, got.Network, want.Stamp, want.Digest, want.Network)
		case got.Origin != origin:
			t.Errorf("b says %s came from %q, want %q", id, got.Origin, origin)
		}
	}
	if got := a.srv.Subscribers(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("a's subscribers: %v, want [b]", got)
	}
}

func TestReplicationDeltasFlowFromTheOriginOnly(t *testing.T) {
	a, b, c := startReplNode(t, "a", nil), startReplNode(t, "b", nil), startReplNode(t, "c", nil)
	s1, s2 := testShard("east", "one", "10.0.0.1"), testShard("east", "two", "10.0.0.2")
	a.store.local("east", Stamp{1, 1}, s1, s2)
	a.rep.SetPeers(peersOf(b, c))
	b.rep.SetPeers(peersOf(a, c))
	c.rep.SetPeers(peersOf(a, b))
	waitFor(t, func() bool { return b.synced("a", "c") && c.synced("a", "b") })

	// One service changes, one goes, one arrives: a delta to each subscriber.
	s2b, s3 := testShard("east", "two", "10.0.0.2", "10.0.0.3"), testShard("east", "three", "10.0.0.4")
	a.store.local("east", Stamp{1, 2}, s2b, s3)
	waitFor(t, func() bool { return sameCluster(a, b, "east") && sameCluster(a, c, "east") })
	if got := a.hooks.count("sent", "east", "delta"); got != 2 {
		t.Errorf("a sent %d deltas of east, want 2 (one per subscriber)", got)
	}
	last := b.store.appliedOf("east")
	if u := last[len(last)-1]; u.Base == nil || *u.Base != (Stamp{1, 1}) || len(u.Change.Upserts) != 2 || len(u.Change.Removes) != 1 {
		t.Errorf("b's last update of east: base %v, %d upserts, %d removes; want a delta over 1.1 with 2 and 1",
			u.Base, len(u.Change.Upserts), len(u.Change.Removes))
	}

	// What a received from a peer, a does not forward; and b and c never
	// forward east, which a sent them. "apple" sorts before "east": had a
	// sent it, it would have arrived before the next change of east.
	a.store.remote("apple", Stamp{7, 1}, "z", testShard("apple", "a", "10.9.0.1"))
	a.store.local("east", Stamp{1, 3}, s3)
	waitFor(t, func() bool { return sameCluster(a, b, "east") && sameCluster(a, c, "east") })
	for _, n := range []*replNode{b, c} {
		if _, ok := n.store.get("apple"); ok {
			t.Errorf("%s holds apple, which a only received", n.id)
		}
		if got := n.hooks.count("sent", "east", "delta"); got != 0 {
			t.Errorf("%s forwarded %d deltas of east", n.id, got)
		}
	}
	if got := a.hooks.count("sent", "apple", "delta") + a.hooks.count("sent", "apple", "full"); got != 0 {
		t.Errorf("a sent apple %d times", got)
	}
}

func TestReplicationStaleOriginCannotOverwriteNewerData(t *testing.T) {
	a, b, c := startReplNode(t, "a", nil), startReplNode(t, "b", nil), startReplNode(t, "c", nil)
	// a is east's old home (epoch 1): it lost the spoke without noticing; the
	// spoke's new session (epoch 2) is at b. c follows both.
	a.store.local("east", Stamp{1, 4}, testShard("east", "svc", "10.0.0.1"))
	b.store.local("east", Stamp{2, 1}, testShard("east", "svc", "10.0.0.2"))
	c.rep.SetPeers(peersOf(a, b))
	waitFor(t, func() bool { return c.synced("a", "b") })
	if !sameCluster(b, c, "east") {
		t.Fatal("c does not hold b's newer east")
	}

	stale := c.hooks.count("applied", "east", "stale")
	a.store.local("east", Stamp{1, 5}, testShard("east", "svc", "10.0.0.9"))
	waitFor(t, func() bool { return c.hooks.count("applied", "east", "stale") > stale })
	if !sameCluster(b, c, "east") {
		t.Fatal("the stale home overwrote c's newer east")
	}

	// A newer session at a (epoch 3) wins: its delta does not apply over
	// b's data, so c asks a for a full state, which replaces it.
	a.store.local("east", Stamp{3, 1}, testShard("east", "svc", "10.0.0.3"))
	waitFor(t, func() bool { return sameCluster(a, c, "east") })
	if got := c.hooks.count("resync", "east", "base"); got != 1 {
		t.Errorf("c asked for %d resyncs of east, want 1", got)
	}
	if u := c.store.appliedOf("east"); u[len(u)-1].Base != nil || u[len(u)-1].Origin != "a" {
		t.Errorf("c's last update of east: base %v from %q, want a full state from a", u[len(u)-1].Base, u[len(u)-1].Origin)
	}
}

func TestReplicationDeltaOnAnotherBaseResyncs(t *testing.T) {
	a, b := startReplNode(t, "a", nil), startReplNode(t, "b", nil)
	a.store.local("east", Stamp{1, 1}, testShard("east", "svc", "10.0.0.1"))
	b.rep.SetPeers(peersOf(a))
	waitFor(t, func() bool { return b.synced("a") })

	// b lost an update somehow: it holds an older state than a sent it.
	b.store.remote("east", Stamp{1, 0}, "a", testShard("east", "old", "10.0.0.7"))
	a.store.local("east", Stamp{1, 2}, testShard("east", "svc", "10.0.0.1", "10.0.0.2"))
	waitFor(t, func() bool { return sameCluster(a, b, "east") })
	if got := b.hooks.count("resync", "east", "base"); got != 1 {
		t.Errorf("b asked for %d resyncs, want 1", got)
	}
	if got := b.hooks.count("applied", "east", "mismatch"); got != 1 {
		t.Errorf("b saw %d deltas on another base, want 1", got)
	}

	// Deltas flow again on top of the full state.
	a.store.local("east", Stamp{1, 3}, testShard("east", "svc", "10.0.0.3"))
	waitFor(t, func() bool { return sameCluster(a, b, "east") })
	if u := b.store.appliedOf("east"); u[len(u)-1].Base == nil {
		t.Error("the change after a resync came as a full state, want a delta")
	}
}

func TestReplicationAntiEntropy(t *testing.T) {
	fast := func(cfg *ReplicationConfig, _ *ReplicationWiring) { cfg.DigestInterval = 20 * time.Millisecond }
	a, b := startReplNode(t, "a", fast), startReplNode(t, "b", fast)
	a.store.local("east", Stamp{1, 1}, testShard("east", "svc", "10.0.0.1"))
	b.rep.SetPeers(peersOf(a))
	waitFor(t, func() bool { return b.synced("a") })

	// Same stamp, other content: b asks for a resync at the next digest.
	b.store.remote("east", Stamp{1, 1}, "a", testShard("east", "svc", "10.0.0.66"))
	waitFor(t, func() bool { return sameCluster(a, b, "east") })
	if got := b.hooks.count("resync", "east", "digest"); got < 1 {
		t.Error("b converged without a digest resync")
	}

	// An older stamp than the peer's digest, for longer than an interval.
	b.store.remote("east", Stamp{1, 0}, "a")
	waitFor(t, func() bool { return sameCluster(a, b, "east") })
	if got := b.hooks.count("resync", "east", "behind"); got < 1 {
		t.Error("b converged without a resync for being behind")
	}
}

func TestReplicationChunkedFullStateArrivesWholeAndAtomically(t *testing.T) {
	a := startReplNode(t, "a", func(_ *ReplicationConfig, w *ReplicationWiring) { w.MaxMessageBytes = 4096 })
	var shards []*registry.Shard
	for i := range 300 {
		shards = append(shards, testShard("east", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)))
	}
	a.store.local("east", Stamp{5, 1}, shards...)
	b := startReplNode(t, "b", nil)
	b.rep.SetPeers(peersOf(a))
	waitFor(t, func() bool { return b.synced("a") })
	if !sameCluster(a, b, "east") {
		t.Fatal("b does not hold east as a does")
	}
	if u := b.store.appliedOf("east"); len(u) != 1 || len(u[0].Change.Upserts) != 300 {
		t.Fatalf("b applied %d updates of east, want 1 with all 300 services", len(u))
	}

	// A replica that buffers less refuses it whole, and stays subscribed.
	c := startReplNode(t, "c", func(cfg *ReplicationConfig, _ *ReplicationWiring) { cfg.MaxBufferedBytes = 8192 })
	c.rep.SetPeers(peersOf(a))
	waitFor(t, func() bool { return c.synced("a") })
	if _, ok := c.store.get("east"); ok {
		t.Fatal("c applied a full state larger than it buffers")
	}
	if got := c.hooks.count("applied", "east", "dropped"); got != 1 {
		t.Fatalf("c dropped %d updates, want 1", got)
	}
	a.store.local("west", Stamp{1, 1}, testShard("west", "svc", "10.1.0.1"))
	waitFor(t, func() bool { return sameCluster(a, c, "west") })
}

func TestReplicationChunksFitTheBudget(t *testing.T) {
	const maxBytes = 2048
	var shards []*registry.Shard
	var removes []registry.ServiceKey
	for i := range 100 {
		shards = append(shards, testShard("east", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.0.0.%d", i+1)))
		removes = append(removes, registry.ServiceKey{Namespace: "default", Name: fmt.Sprintf("old-service-%d", i)})
	}
	head := &fedv1.ReplicaUpdate{ClusterId: "east", Network: "net-1", Stamp: stampToProto(Stamp{1, 2}), Base: stampToProto(Stamp{1, 1}), Origin: "a"}
	var got []*fedv1.ReplicaUpdate
	n, err := sendChunked(head, removes, shards, maxBytes, func(u *fedv1.ReplicaUpdate) error {
		got = append(got, proto.Clone(u).(*fedv1.ReplicaUpdate))
		return nil
	})
	if err != nil || n != len(got) || n < 3 {
		t.Fatalf("%d chunks (%d sent), err %v; want several", n, len(got), err)
	}
	var upserts, removed int
	for i, u := range got {
		if size := proto.Size(&fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Update{Update: u}}); size > maxBytes {
			t.Errorf("chunk %d is %d bytes, more than %d", i, size, maxBytes)
		}
		if u.GetLastChunk() != (i == len(got)-1) {
			t.Errorf("chunk %d: last_chunk %v", i, u.GetLastChunk())
		}
		if u.GetClusterId() != "east" || stampFromProto(u.GetBase()) != (Stamp{1, 1}) || stampFromProto(u.GetStamp()) != (Stamp{1, 2}) {
			t.Errorf("chunk %d does not carry the update's head", i)
		}
		upserts += len(u.GetUpserts())
		removed += len(u.GetRemoves())
	}
	if upserts != 100 || removed != 100 {
		t.Errorf("chunks carry %d upserts and %d removes, want 100 and 100", upserts, removed)
	}
	// An empty update is one chunk.
	got = nil
	if n, _ := sendChunked(head, nil, nil, maxBytes, func(u *fedv1.ReplicaUpdate) error { got = append(got, u); return nil }); n != 1 || !got[0].GetLastChunk() {
		t.Errorf("an empty update went as %d chunks", n)
	}
}

func TestReplicationFollowsPeerSetAndRestarts(t *testing.T) {
	a, b := startReplNode(t, "a", nil), startReplNode(t, "b", nil)
	a.store.local("east", Stamp{1, 1}, testShard("east", "svc", "10.0.0.1"))
	b.rep.SetPeers(peersOf(a))
	waitFor(t, func() bool { return b.synced("a") && slices.Equal(a.srv.Subscribers(), []string{"b"}) })

	// A peer removed: its stream closes.
	b.rep.SetPeers(nil)
	waitFor(t, func() bool { return len(a.srv.Subscribers()) == 0 && len(b.rep.Status()) == 0 })

	// Back again: only what b does not hold exactly is sent.
	fulls := a.hooks.count("sent", "east", "full")
	b.rep.SetPeers(peersOf(a))
	waitFor(t, func() bool { return b.synced("a") })
	if got := a.hooks.count("sent", "east", "full"); got != fulls {
		t.Errorf("a sent east again to a replica that held it: %d full states, want %d", got, fulls)
	}
	a.store.local("east", Stamp{1, 2}, testShard("east", "svc", "10.0.0.2"))
	waitFor(t, func() bool { return sameCluster(a, b, "east") })

	// The peer restarts at the same address, with newer data: b subscribes again.
	a.stopServer()
	waitFor(t, func() bool { s, _ := b.peerStatus("a"); return !s.Connected })
	a.store = newReplStore()
	a.store.local("east", Stamp{2, 1}, testShard("east", "svc", "10.0.0.3"))
	a.serve(t, a.addr)
	waitFor(t, func() bool { return sameCluster(a, b, "east") && b.synced("a") })
}

func TestReplicationPeerToken(t *testing.T) {
	a := startReplNode(t, "a", nil)
	hello := &fedv1.ReplicaRequest{Kind: &fedv1.ReplicaRequest_Hello{Hello: &fedv1.ReplicaHello{ReplicaId: "x"}}}
	subscribe := func(t *testing.T, conn *grpc.ClientConn) error {
		t.Helper()
		stream, err := fedv1.NewReplicationClient(conn).Subscribe(t.Context())
		if err != nil {
			return err
		}
		_ = stream.Send(hello)
		m, err := stream.Recv()
		if err == nil && m.GetWelcome().GetReplicaId() != "a" {
			t.Fatalf("answer %v, want a's welcome", m)
		}
		return err
	}
	noToken, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { noToken.Close() })
	for _, tc := range []struct {
		name string
		conn *grpc.ClientConn
		code codes.Code
	}{
		{"peer token", dial(t, a.addr, replPeerToken), codes.OK},
		{"no token", noToken, codes.Unauthenticated},
		{"unknown token", dial(t, a.addr, "forged-token-0123456789"), codes.Unauthenticated},
		{"a cluster's token", dial(t, a.addr, testTokens["east"]), codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := subscribe(t, tc.conn); status.Code(err) != tc.code {
				t.Fatalf("subscribe: %v, want %s", err, tc.code)
			}
		})
	}
	t.Run("peer token cannot publish", func(t *testing.T) {
		for token, code := range map[string]codes.Code{replPeerToken: codes.PermissionDenied, testTokens["east"]: codes.Unimplemented} {
			stream, err := fedv1.NewFederationClient(dial(t, a.addr, token)).Publish(t.Context())
			if err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != code {
				t.Errorf("publish: %v, want %s", err, code)
			}
		}
	})
	t.Run("replicator with a wrong token", func(t *testing.T) {
		b := startReplNode(t, "b", func(_ *ReplicationConfig, w *ReplicationWiring) {
			w.PeerToken = func() string { return "wrong-token-0123456789" }
		})
		b.rep.SetPeers(peersOf(a))
		waitFor(t, func() bool { s, _ := b.peerStatus("a"); return s.LastError != "" })
		if s, _ := b.peerStatus("a"); s.Connected || !strings.Contains(s.LastError, "Unauthenticated") || slices.Contains(a.srv.Subscribers(), "b") {
			t.Fatalf("subscription with a wrong token: %+v, a's subscribers %v", s, a.srv.Subscribers())
		}
	})
	t.Run("open without a peer token", func(t *testing.T) {
		dev := startReplNode(t, "dev", func(_ *ReplicationConfig, w *ReplicationWiring) { w.PeerToken = nil })
		c, err := grpc.NewClient(dev.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		stream, err := fedv1.NewReplicationClient(c).Subscribe(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(hello)
		if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
			t.Fatalf("got %v, %v; want a welcome", m, err)
		}
	})
}

// scriptedPeer is a peer that follows a script instead of a store.
type scriptedPeer struct {
	fedv1.UnimplementedReplicationServer
	script func(stream fedv1.Replication_SubscribeServer) error
}

// serveScriptedPeer serves peer on a loopback port until the test ends, and returns its address.
func serveScriptedPeer(t *testing.T, peer *scriptedPeer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	fedv1.RegisterReplicationServer(g, peer)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

func (p *scriptedPeer) Subscribe(stream fedv1.Replication_SubscribeServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Welcome{Welcome: &fedv1.ReplicaWelcome{ReplicaId: "p"}}}); err != nil {
		return err
	}
	return p.script(stream)
}

func TestReplicationDropsInvalidUpdatesWhole(t *testing.T) {
	valid, invalid := federation.ShardToProto(testShard("east", "good", "10.0.0.1")), federation.ShardToProto(testShard("east", "bad", "10.0.0.2"))
	invalid.Ports[0].Port = 0
	update := func(u *fedv1.ReplicaUpdate) *fedv1.ReplicaMessage {
		u.ClusterId = "east"
		return &fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Update{Update: u}}
	}
	resynced := make(chan string, 1)
	peer := &scriptedPeer{script: func(stream fedv1.Replication_SubscribeServer) error {
		for _, m := range []*fedv1.ReplicaMessage{
			// A full state whose second chunk holds an invalid shard: nothing of it applies.
			update(&fedv1.ReplicaUpdate{Stamp: stampToProto(Stamp{1, 1}), FullState: true, Upserts: []*fedv1.Shard{valid}}),
			update(&fedv1.ReplicaUpdate{Stamp: stampToProto(Stamp{1, 1}), FullState: true, LastChunk: true, Upserts: []*fedv1.Shard{invalid}}),
			// A delta that upserts and removes the same service.
			update(&fedv1.ReplicaUpdate{Stamp: stampToProto(Stamp{1, 2}), Base: stampToProto(Stamp{1, 1}), LastChunk: true,
				Upserts: []*fedv1.Shard{valid}, Removes: []*fedv1.ServiceKey{valid.Service}}),
			// A valid delta over a base the subscriber does not hold: it asks for a resync.
			update(&fedv1.ReplicaUpdate{Stamp: stampToProto(Stamp{1, 3}), Base: stampToProto(Stamp{1, 2}), LastChunk: true, Upserts: []*fedv1.Shard{valid}}),
		} {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		resynced <- req.GetResync().GetClusterId()
		if err := stream.Send(update(&fedv1.ReplicaUpdate{Stamp: stampToProto(Stamp{1, 3}), FullState: true, LastChunk: true, Upserts: []*fedv1.Shard{valid}})); err != nil {
			return err
		}
		if err := stream.Send(&fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Digests{Digests: &fedv1.ReplicaDigests{}}}); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}}
	addr := serveScriptedPeer(t, peer)
	b := startReplNode(t, "b", func(_ *ReplicationConfig, w *ReplicationWiring) { w.PeerToken = nil })
	b.rep.SetPeers(map[string]string{"p": addr})
	waitFor(t, func() bool { return b.synced("p") })
	if got := <-resynced; got != "east" {
		t.Fatalf("resync of %q, want east", got)
	}
	u := b.store.appliedOf("east")
	if len(u) != 1 || u[0].Base != nil || u[0].Stamp != (Stamp{1, 3}) || len(u[0].Change.Upserts) != 1 || u[0].Origin != "p" {
		t.Fatalf("b applied %+v; want only the full state 1.3 from p", u)
	}
	if got := b.hooks.count("applied", "east", "dropped"); got != 2 {
		t.Errorf("b dropped %d updates, want 2", got)
	}
}

// A replica whose policy refuses part of a peer's update holds the peer's
// stamp with another digest: the peer's digests do not make it ask for the
// cluster again and again (each answer would be refused the same way).
func TestReplicationDoesNotResyncWhatItRefused(t *testing.T) {
	svc, hostile := testShard("east", "svc", "10.0.0.1"), testShard("east", "hostile", "10.0.0.66")
	held := registry.Digest(map[registry.ServiceKey]*registry.Shard{svc.Service: svc, hostile.Service: hostile})
	update := func(cluster string, shards ...*registry.Shard) *fedv1.ReplicaMessage {
		u := &fedv1.ReplicaUpdate{ClusterId: cluster, Stamp: stampToProto(Stamp{1, 1}), FullState: true, LastChunk: true}
		for _, sh := range shards {
			u.Upserts = append(u.Upserts, federation.ShardToProto(sh))
		}
		return &fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Update{Update: u}}
	}
	digests := &fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Digests{Digests: &fedv1.ReplicaDigests{
		Clusters: []*fedv1.ClusterDigest{{ClusterId: "east", Stamp: stampToProto(Stamp{1, 1}), Digest: held.String()}}}}}
	peer := &scriptedPeer{script: func(stream fedv1.Replication_SubscribeServer) error {
		msgs := []*fedv1.ReplicaMessage{update("east", svc, hostile)}
		for range 5 {
			msgs = append(msgs, digests)
		}
		// West, last: once it is applied, every digest before it was taken.
		msgs = append(msgs, update("west", testShard("west", "svc", "10.1.0.1")))
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
		<-stream.Context().Done()
		return nil
	}}
	addr := serveScriptedPeer(t, peer)
	b := startReplNode(t, "b", func(_ *ReplicationConfig, w *ReplicationWiring) { w.PeerToken = nil })
	b.store.refuse = map[registry.ServiceKey]bool{hostile.Service: true}
	b.rep.SetPeers(map[string]string{"p": addr})
	waitFor(t, func() bool { return len(b.store.appliedOf("west")) == 1 })
	if got := b.hooks.count("applied", "east", "partly_refused"); got != 1 {
		t.Errorf("east applied partly %d times, want once", got)
	}
	if got := b.hooks.count("resync", "east", "digest"); got != 0 {
		t.Errorf("b asked %d times for east again after 5 digests, want never (each answer would be refused the same way)", got)
	}
}

// A delta from the Changed log is what comparing every shard finds, but
// for services that changed and changed back (sent again, equal).
func TestChangesSince(t *testing.T) {
	s := func(v uint64) Stamp { return Stamp{Epoch: 1, Version: v} }
	a1, a2 := testShard("east", "a", "10.0.0.1"), testShard("east", "a", "10.0.0.2")
	b1, c1, d1 := testShard("east", "b", "10.0.0.3"), testShard("east", "c", "10.0.0.4"), testShard("east", "d", "10.0.0.5")
	keys := func(ks ...*registry.Shard) []registry.ServiceKey {
		var out []registry.ServiceKey
		for _, k := range ks {
			out = append(out, k.Service)
		}
		return out
	}
	sent := (*changelog.Log[registry.ServiceKey])(nil).Then(keys(a1, b1, d1), 3)
	prev := sentCluster{stamp: s(1), shards: ShardMap{a1.Service: a1, b1.Service: b1, d1.Service: d1}, changed: sent.Position()}
	cur := ShardMap{a2.Service: a2, c1.Service: c1, d1.Service: d1}
	log := sent.Then(keys(a1, d1), 3) // d changed and changed back
	log = log.Then(append(keys(b1, c1), registry.ServiceKey{Namespace: "default", Name: "never"}), 3)
	names := func(up []*registry.Shard, rm []registry.ServiceKey) string {
		var u, r []string
		for _, sh := range up {
			u = append(u, sh.Service.Name)
		}
		for _, k := range rm {
			r = append(r, k.Name)
		}
		slices.Sort(u)
		slices.Sort(r)
		return fmt.Sprintf("upserts %v removes %v", u, r)
	}
	if got, want := names(changesSince(prev, Cluster{Stamp: s(3), Shards: cur, Changed: log})), "upserts [a c d] removes [b]"; got != want {
		t.Errorf("from the log: %s, want %s", got, want)
	}
	if got, want := names(changesSince(prev, Cluster{Stamp: s(3), Shards: cur})), "upserts [a c] removes [b]"; got != want {
		t.Errorf("by comparing: %s, want %s", got, want)
	}
	// The cluster held anew (it left the view and came back): its new log
	// does not reach what was sent.
	anew := (*changelog.Log[registry.ServiceKey])(nil).Then(keys(a1), 3)
	if got, want := names(changesSince(prev, Cluster{Stamp: s(3), Shards: cur, Changed: anew})), "upserts [a c] removes [b]"; got != want {
		t.Errorf("across a new log: %s, want %s", got, want)
	}
	// A subscriber a few changes behind a full log (64 links), which is cut
	// since, still gets just what they named: d, which changed back.
	for range 60 {
		log = log.Then(nil, 3)
	}
	prev = sentCluster{stamp: s(63), shards: cur, changed: log.Position()}
	log = log.Then(keys(d1), 3).Then(nil, 3)
	if got, want := names(changesSince(prev, Cluster{Stamp: s(65), Shards: cur, Changed: log})), "upserts [d] removes []"; got != want {
		t.Errorf("behind a full log: %s, want %s", got, want)
	}
}

// A change at the same stamp (the export policy's enforcement) is in the
// delta to a subscriber that holds the content from before it.
func TestChangesSinceASameStampChange(t *testing.T) {
	s := func(v uint64) Stamp { return Stamp{Epoch: 1, Version: v} }
	a1, a2, b1 := testShard("east", "a", "10.0.0.1"), testShard("east", "a", "10.0.0.2"), testShard("east", "b", "10.0.0.3")
	sent := (*changelog.Log[registry.ServiceKey])(nil).Then([]registry.ServiceKey{a1.Service, b1.Service}, 2)
	prev := sentCluster{stamp: s(1), shards: ShardMap{a1.Service: a1, b1.Service: b1}, changed: sent.Position()}
	atOne := sent.Then([]registry.ServiceKey{b1.Service}, 1) // at s(1) still
	cur := Cluster{Stamp: s(2), Shards: ShardMap{a2.Service: a2}, Changed: atOne.Then([]registry.ServiceKey{a1.Service}, 1)}
	up, rm := changesSince(prev, cur)
	if len(up) != 1 || up[0] != a2 || len(rm) != 1 || rm[0] != b1.Service {
		t.Errorf("delta from the log: upserts %v, removes %v; want a2, and b removed", up, rm)
	}
}

// A wiring that sets no bounds gets the federation's: zero would refuse every
// message and every shard a peer sends.
func TestReplicationWiringWithoutBoundsGetsTheFederations(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for name, cfg := range map[string]replicationSetup{
		"server":     NewReplicationServer(nil, DefaultReplicationConfig(), ReplicationWiring{}, log).cfg,
		"replicator": NewReplicator(nil, DefaultReplicationConfig(), ReplicationWiring{}, insecure.NewCredentials(), log).cfg,
	} {
		if cfg.MaxMessageBytes != federation.DefaultHubConfig().MaxMessageBytes || cfg.Limits != registry.DefaultLimits() {
			t.Errorf("%s: bounds %d bytes, %+v; want the federation's defaults", name, cfg.MaxMessageBytes, cfg.Limits)
		}
	}
}
