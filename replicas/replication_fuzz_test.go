package replicas

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// subscribeStream is a subscriber's end of a subscription: it keeps what the subscriber sends.
type subscribeStream struct {
	grpc.ClientStream
	sent []*fedv1.ReplicaRequest
}

func (s *subscribeStream) Send(m *fedv1.ReplicaRequest) error { s.sent = append(s.sent, m); return nil }

func (s *subscribeStream) Recv() (*fedv1.ReplicaMessage, error) { return nil, io.EOF }

// fuzzPeerSession is a subscription of this replica (holding nothing) to
// peer hub-b, with limits small enough for the fuzzer to reach.
func fuzzPeerSession() (*peerSession, *replStore, *subscribeStream) {
	store := newReplStore()
	cfg := DefaultReplicationConfig()
	cfg.MaxBufferedBytes = 4 << 10
	w := ReplicationWiring{ReplicaID: "hub-a", MaxMessageBytes: federation.DefaultHubConfig().MaxMessageBytes,
		Limits: registry.Limits{MaxPorts: 2, MaxEndpoints: 3, MaxAddressesPerEndpoint: 2, MaxServicesPerCluster: 2, MaxEndpointsPerCluster: 4}}
	log := slog.New(slog.DiscardHandler)
	r := NewReplicator(store, cfg, w, insecure.NewCredentials(), log)
	stream := &subscribeStream{}
	s := &peerSession{r: r, peer: "hub-b", log: log, stream: stream,
		asked: map[registry.ClusterID]time.Time{}, behind: map[registry.ClusterID]time.Time{}, refused: map[registry.ClusterID]Stamp{}}
	return s, store, stream
}

// FuzzReplicaMessage: what a peer replica sends a subscriber. An update
// (one chunk, the last or not) is applied only when valid, as a spoke's
// would be: its shards validate and survive the wire round trip, and it is
// a full state that replaces or a delta over an older base. Anything else
// is dropped, or, for a delta over a base this replica does not hold,
// answered with a resync request. A digest is taken only with a valid
// cluster ID and digest.
func FuzzReplicaMessage(f *testing.F) {
	web, db := testShard("east", "web", "10.0.0.1", "fd00::1"), testShard("east", "db", "10.0.0.2")
	web.ExportedAt = time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC)
	web.Properties = registry.Properties{Labels: map[string]string{"tier": "web"}}
	gws := []*fedv1.NetworkGateway{{Address: "192.0.2.10", Port: 15443}}
	msg := func(u *fedv1.ReplicaUpdate) {
		f.Add(mustMarshalReplica(f, &fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Update{Update: u}}))
	}
	msg(&fedv1.ReplicaUpdate{ClusterId: "east", Network: "n1", Stamp: &fedv1.Stamp{Epoch: 3, Version: 7}, FullState: true, LastChunk: true,
		Upserts: []*fedv1.Shard{federation.ShardToProto(web), federation.ShardToProto(db)}, Origin: "hub-c", Gateways: gws})
	msg(&fedv1.ReplicaUpdate{ClusterId: "east", Stamp: &fedv1.Stamp{Epoch: 3, Version: 8}, Base: &fedv1.Stamp{}, LastChunk: true,
		Upserts: []*fedv1.Shard{federation.ShardToProto(db)}, Removes: []*fedv1.ServiceKey{{Namespace: "default", Name: "web"}}})
	msg(&fedv1.ReplicaUpdate{ClusterId: "east", Stamp: &fedv1.Stamp{Epoch: 3, Version: 8}, Base: &fedv1.Stamp{Epoch: 3, Version: 7}, LastChunk: true,
		Removes: []*fedv1.ServiceKey{{Namespace: "default", Name: "web"}}}) // a base this replica does not hold
	msg(&fedv1.ReplicaUpdate{ClusterId: "east", Stamp: &fedv1.Stamp{Epoch: 4, Version: 1}, FullState: true,
		Upserts: []*fedv1.Shard{federation.ShardToProto(web)}}) // a first chunk
	msg(&fedv1.ReplicaUpdate{ClusterId: "east", Stamp: &fedv1.Stamp{Epoch: 4, Version: 1}, FullState: true, LastChunk: true,
		Upserts: []*fedv1.Shard{federation.ShardToProto(web), federation.ShardToProto(web)}}) // a service twice
	msg(&fedv1.ReplicaUpdate{ClusterId: "East", Stamp: &fedv1.Stamp{Epoch: 1}, FullState: true, LastChunk: true})
	f.Add(mustMarshalReplica(f, &fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Digests{Digests: &fedv1.ReplicaDigests{Clusters: []*fedv1.ClusterDigest{
		clusterDigestOf("east", Cluster{Stamp: Stamp{Epoch: 3, Version: 7}, Digest: registry.Digest(map[string]*registry.Shard{"web": web})}),
		{ClusterId: "west", Stamp: &fedv1.Stamp{Epoch: 1, Version: 2}, Digest: strings.Repeat("AB", 16)},
		{ClusterId: "north", Digest: "not hex"},
	}}}}))

	f.Fuzz(func(t *testing.T, b []byte) {
		var m fedv1.ReplicaMessage
		if err := proto.Unmarshal(b, &m); err != nil {
			return
		}
		s, store, stream := fuzzPeerSession()
		switch k := m.GetKind().(type) {
		case *fedv1.ReplicaMessage_Update:
			fuzzReplicaUpdate(t, s, store, stream, k.Update)
		case *fedv1.ReplicaMessage_Digests:
			for _, p := range k.Digests.GetClusters() {
				d, err := clusterDigestFromProto(p)
				if err != nil {
					continue
				}
				if registry.ValidateClusterID(d.cluster) != nil || d.digest.String() != strings.ToLower(p.GetDigest()) {
					t.Fatalf("accepted digest %v of %q as %s", p, d.cluster, d.digest)
				}
				back, err := clusterDigestFromProto(clusterDigestOf(d.cluster, Cluster{Stamp: d.stamp, Digest: d.digest}))
				if err != nil || back != d {
					t.Fatalf("digest round trip: %+v, %v; want %+v", back, err, d)
				}
			}
			if err := s.digests(k.Digests); err != nil {
				t.Fatal(err)
			}
			// This replica holds nothing: it is behind every valid cluster the peer
			// names, and asks for nothing before a digest interval has passed.
			for id := range s.behind {
				if registry.ValidateClusterID(id) != nil {
					t.Fatalf("behind on invalid cluster %q", id)
				}
			}
			if len(stream.sent) != 0 {
				t.Fatalf("asked for %v at once", stream.sent)
			}
		}
	})
}

// fuzzReplicaUpdate checks what one chunk of an update does to a fresh subscription.
func fuzzReplicaUpdate(t *testing.T, s *peerSession, store *replStore, stream *subscribeStream, u *fedv1.ReplicaUpdate) {
	if err := s.update(t.Context(), u); err != nil {
		t.Fatalf("update: %v", err)
	}
	cluster, stamp := registry.ClusterID(u.GetClusterId()), stampFromProto(u.GetStamp())
	if !u.GetLastChunk() {
		if len(store.applied) != 0 || s.partial == nil || !s.partial.continues(u) {
			t.Fatalf("a first chunk was applied, or is not the update in progress")
		}
		if s.partial.dropped == "" {
			checkInbound(t, s.partial, s.r.cfg.Limits)
		}
		return
	}
	if s.partial != nil {
		t.Fatalf("an update is still in progress after its last chunk")
	}
	switch {
	case len(store.applied) == 1:
		checkReplicaUpdate(t, store.applied[0], u, s.r.cfg.Limits)
	case len(store.applied) > 1:
		t.Fatalf("one update applied %d times", len(store.applied))
	default:
		if got, dropped := s.refused[cluster]; dropped && got == stamp {
			if len(stream.sent) != 0 {
				t.Fatalf("a dropped update was answered with %v", stream.sent)
			}
			return
		}
		// Neither applied nor dropped: a delta whose base this replica does not
		// hold, answered with a request for a full state.
		if u.GetFullState() || len(stream.sent) != 1 || stream.sent[0].GetResync().GetClusterId() != string(cluster) {
			t.Fatalf("update neither applied, dropped nor answered with a resync: sent %v", stream.sent)
		}
	}
}

// checkInbound fails unless an update received whole so far is valid.
func checkInbound(t *testing.T, in *inbound, lim registry.Limits) {
	t.Helper()
	if err := registry.ValidateClusterID(in.cluster); err != nil {
		t.Fatalf("accepted an update of cluster %q", in.cluster)
	}
	if in.base != nil && !in.base.Less(in.stamp) || in.base == nil && len(in.removes) > 0 {
		t.Fatalf("accepted a delta over %v to %v, or a full state that removes %v", in.base, in.stamp, in.removes)
	}
	if _, err := registry.NormalizeGateways(in.gateways); err != nil {
		t.Fatalf("accepted gateways %v: %v", in.gateways, err)
	}
	checkReplicatedChange(t, in.cluster, in.upserts, in.removes, lim)
}

// checkReplicaUpdate fails unless u, applied from the wire update p, is valid and says what p said.
func checkReplicaUpdate(t *testing.T, u Update, p *fedv1.ReplicaUpdate, lim registry.Limits) {
	t.Helper()
	if string(u.Cluster) != p.GetClusterId() || string(u.Network) != p.GetNetwork() || u.Stamp != stampFromProto(p.GetStamp()) || p.GetStamp() == nil {
		t.Fatalf("applied %s/%s at %v from an update of %q/%q at %v", u.Cluster, u.Network, u.Stamp, p.GetClusterId(), p.GetNetwork(), p.GetStamp())
	}
	if want := p.GetOrigin(); u.Origin != want && (want != "" || u.Origin != "hub-b") {
		t.Fatalf("origin %q, want %q", u.Origin, want)
	}
	if err := registry.ValidateClusterID(u.Cluster); err != nil {
		t.Fatal(err)
	}
	if (u.Base == nil) != p.GetFullState() || u.Change.Replace != p.GetFullState() || u.Change.Cluster != u.Cluster {
		t.Fatalf("applied base %v, replace %v, for a full state %v", u.Base, u.Change.Replace, p.GetFullState())
	}
	if u.Base != nil && !u.Base.Less(u.Stamp) || u.Base == nil && len(u.Change.Removes) > 0 {
		t.Fatalf("applied a delta over %v to %v, or a full state that removes", u.Base, u.Stamp)
	}
	if u.Base == nil && len(u.Change.Upserts) > lim.MaxServicesPerCluster {
		t.Fatalf("applied a full state of %d services", len(u.Change.Upserts))
	}
	gws, err := registry.NormalizeGateways(u.Gateways)
	if err != nil || !slices.Equal(gws, u.Gateways) {
		t.Fatalf("applied gateways %v (normalized %v, %v)", u.Gateways, gws, err)
	}
	checkReplicatedChange(t, u.Cluster, u.Change.Upserts, u.Change.Removes, lim)
}

// checkReplicatedChange fails unless every upsert is a valid, canonical
// shard of cluster and no service is named twice.
func checkReplicatedChange(t *testing.T, cluster registry.ClusterID, upserts []*registry.Shard, removes []registry.ServiceKey, lim registry.Limits) {
	t.Helper()
	named := map[registry.ServiceKey]bool{}
	for _, sh := range upserts {
		if named[sh.Service] {
			t.Fatalf("service %v named twice", sh.Service)
		}
		named[sh.Service] = true
		if sh.Cluster != cluster {
			t.Fatalf("a shard of cluster %q in an update of %q", sh.Cluster, cluster)
		}
		if err := sh.Validate(lim); err != nil {
			t.Fatalf("accepted an invalid shard: %v", err)
		}
		back, err := federation.ShardFromProto(cluster, federation.ShardToProto(sh), lim)
		if err != nil || !back.Equal(sh) || back.Hash() != sh.Hash() {
			t.Fatalf("accepted shard %v does not survive the wire round trip: %v", sh.Service, err)
		}
	}
	for _, k := range removes {
		if err := registry.ValidateServiceKey(k); err != nil || named[k] {
			t.Fatalf("remove of %v: invalid or named twice (%v)", k, err)
		}
		named[k] = true
	}
}

func mustMarshalReplica(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
