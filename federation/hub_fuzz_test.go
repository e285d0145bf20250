package federation

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// recordingStore is a memStore that keeps every change applied to it.
type recordingStore struct {
	*memStore
	changes []registry.Change
}

func (s *recordingStore) Apply(ctx context.Context, epoch, version uint64, ch registry.Change) (registry.Hash, error) {
	s.changes = append(s.changes, ch)
	return s.memStore.Apply(ctx, epoch, version, ch)
}

// sessionStream is the hub's end of a session's stream: it keeps what the hub sends.
type sessionStream struct {
	grpc.ServerStream
	sent []*fedv1.HubMessage
}

func (s *sessionStream) Send(m *fedv1.HubMessage) error { s.sent = append(s.sent, m); return nil }

func (s *sessionStream) Recv() (*fedv1.SpokeMessage, error) { return nil, io.EOF }

// fuzzSession is a hub session of cluster east (epoch 1, nothing applied
// yet) that takes the import stream of namespace shop, whose first import
// update (version 1, nonce "import-1.0") is in flight.
func fuzzSession(t *testing.T) (*hubSession, *recordingStore, *sessionStream) {
	t.Helper()
	store := &recordingStore{memStore: newMemStore()}
	cfg := DefaultHubConfig()
	cfg.Limits = tightLimits
	cfg.MaxFullStateBytes = 4 << 10
	log := slog.New(slog.DiscardHandler)
	h := NewHubServer(cfg, HubWiring{}, store, nil, log)
	h.ServeImports(newImportSource(false, testImport("shop", "web", "10.0.0.1"), testImport("shop", "db", "10.0.0.2")))
	stream := &sessionStream{}
	s := &hubSession{h: h, cluster: "east", epoch: 1, log: log, stream: stream}
	s.imports = newHubImports(s, []string{"shop"})
	if err := s.imports.next(); err != nil {
		t.Fatal(err)
	}
	stream.sent = nil
	return s, store, stream
}

// FuzzHubSession: a message a spoke sends, as a hub session takes it. A
// hello is checked as Publish checks it; every other kind is handled by a
// session that has just begun. An update is acked (and applied, when whole)
// or nacked with nothing applied; what is applied is valid and is what the
// ack's digest says.
func FuzzHubSession(f *testing.F) {
	shards := fuzzShards()
	spoke := func(m *fedv1.SpokeMessage) { f.Add(mustMarshal(f, m)) }
	upserts := func(ss ...*registry.Shard) (out []*fedv1.Shard) {
		for _, s := range ss {
			out = append(out, ShardToProto(s))
		}
		return out
	}
	key := func(ns, name string) *fedv1.ServiceKey { return &fedv1.ServiceKey{Namespace: ns, Name: name} }
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{
		ClusterId: "east", Network: "net-east", SpokeId: "spoke-0", SpokeBuild: "v1.2.3",
		Capabilities: []string{CapabilityImports, CapabilityServiceConflicts}, Namespaces: []string{"shop"},
		AckedEpoch: 3, AckedVersion: 12, AckedDigest: strings.Repeat("0f", 16),
		Gateways: &fedv1.NetworkGateways{Gateways: []*fedv1.NetworkGateway{{Address: "192.0.2.10", Port: 15443}}},
	}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "East_1", AckedDigest: "XYZ"}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "east", Network: "net/1",
		SpokeId: strings.Repeat("s", MaxSpokeIDBytes+1), SpokeBuild: strings.Repeat("b", MaxSpokeBuildBytes+1)}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{
		Nonce: "1", Version: 1, FullState: true, LastChunk: true, Upserts: upserts(shards[0], shards[1]),
		Retain: []*fedv1.ServiceKey{key("shop", "cart")}}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{
		Nonce: "2", Version: 2, FullState: true, Upserts: upserts(shards[2])}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{
		Nonce: "3", Version: 3, Upserts: upserts(shards[1]), Removes: []*fedv1.ServiceKey{key("shop", "cart")}}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{
		Nonce: "4", Version: 4, Upserts: upserts(shards[1]), Removes: []*fedv1.ServiceKey{key("shop", "db")}}}}) // twice: refused
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{
		Nonce: "5", Version: 5, FullState: true, LastChunk: true, Upserts: upserts(shards...)}}}) // over the tight limit
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Digest{Digest: &fedv1.Digest{Digest: registry.ZeroHash.String()}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Digest{Digest: &fedv1.Digest{Digest: strings.Repeat("ab", 16), Services: 2}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{Gateways: []*fedv1.NetworkGateway{
		{Address: "gw.east.example.com", Port: 15443}, {Address: "192.0.2.10", Port: 15443}}}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{Gateways: []*fedv1.NetworkGateway{
		{Address: "0.0.0.0", Port: 15443}}}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportAck{ImportAck: &fedv1.Ack{Nonce: "import-1.0", Version: 1}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportNack{ImportNack: &fedv1.Nack{Nonce: "import-1.0", Version: 1,
		Rejections: []*fedv1.Rejection{{Service: key("shop", "web"), Reason: "clusterset IP taken"}}}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportsWritten{ImportsWritten: &fedv1.ImportsWritten{Version: 1}}})
	spoke(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Namespaces{Namespaces: &fedv1.Namespaces{Names: []string{"shop", "default"}}}})

	f.Fuzz(func(t *testing.T, b []byte) {
		var m fedv1.SpokeMessage
		if err := proto.Unmarshal(b, &m); err != nil {
			return
		}
		ctx := t.Context()
		s, store, stream := fuzzSession(t)
		switch k := m.GetKind().(type) {
		case *fedv1.SpokeMessage_Hello:
			fuzzHello(t, s.h, k.Hello)
		case *fedv1.SpokeMessage_Update:
			fuzzUpdate(t, s, store, stream, k.Update)
		case *fedv1.SpokeMessage_Digest:
			if err := s.digest(ctx, k.Digest); err != nil {
				t.Fatal(err)
			}
			// Nothing is applied: the hub holds the zero digest at version 0.
			mismatch := k.Digest.GetVersion() == 0 && k.Digest.GetDigest() != registry.ZeroHash.String()
			if got := len(stream.sent) == 1 && stream.sent[0].GetResync() != nil; got != mismatch || len(stream.sent) > 1 {
				t.Fatalf("digest %q at version %d: sent %v", k.Digest.GetDigest(), k.Digest.GetVersion(), stream.sent)
			}
		case *fedv1.SpokeMessage_Gateways:
			if err := s.gateways(ctx, k.Gateways); err != nil {
				t.Fatal(err)
			}
			held, sets := store.gatewaysOf("east")
			want, err := GatewaysFromProto(k.Gateways.GetGateways())
			switch {
			case err != nil && sets != 0:
				t.Fatalf("invalid gateways (%v) were recorded: %v", err, held)
			case err == nil && (sets != 1 || !slices.Equal(held, want)):
				t.Fatalf("gateways recorded %v (%d times), want %v", held, sets, want)
			}
			if err == nil {
				checkGateways(t, held)
			}
		case *fedv1.SpokeMessage_Namespaces, *fedv1.SpokeMessage_ImportAck, *fedv1.SpokeMessage_ImportNack, *fedv1.SpokeMessage_ImportsWritten:
			fuzzImportAnswer(t, s, stream, &m)
		}
	})
}

// fuzzHello checks a hello as Publish does: its strings, the gateways and
// the acked state. A hello ValidateHello accepts is within every bound;
// the error of one it refuses never repeats a long value.
func fuzzHello(t *testing.T, h *HubServer, hello *fedv1.Hello) {
	cluster := registry.ClusterID(hello.GetClusterId())
	if err := ValidateHello(hello); err != nil {
		if len(err.Error()) > 400 { // at most a 63-byte value, quoted, and the words around it
			t.Fatalf("the refusal repeats the hello (%d bytes): %.400s", len(err.Error()), err)
		}
		return // Publish refuses the session
	}
	if len(hello.GetSpokeId()) > MaxSpokeIDBytes || len(hello.GetSpokeBuild()) > MaxSpokeBuildBytes || len(hello.GetNetwork()) > 63 {
		t.Fatalf("a hello over its bounds was accepted: %d, %d, %d bytes", len(hello.GetSpokeId()), len(hello.GetSpokeBuild()), len(hello.GetNetwork()))
	}
	sess := Session{Cluster: cluster}
	h.sessionGateways(&sess, hello)
	want, err := GatewaysFromProto(hello.GetGateways().GetGateways())
	if known := hello.GetGateways() != nil && err == nil; sess.GatewaysKnown != known {
		t.Fatalf("gateways known %v, want %v (%v)", sess.GatewaysKnown, known, err)
	}
	if sess.GatewaysKnown {
		checkGateways(t, sess.Gateways)
		if !slices.Equal(sess.Gateways, want) {
			t.Fatalf("session gateways %v, want %v", sess.Gateways, want)
		}
	}
	var acked registry.Hash
	if err := acked.UnmarshalText([]byte(hello.GetAckedDigest())); err == nil && acked.String() != strings.ToLower(hello.GetAckedDigest()) {
		t.Fatalf("acked digest %q parsed as %s", hello.GetAckedDigest(), acked)
	}
}

// fuzzUpdate checks that a session's first update is answered once: a nack
// that applied nothing, an ack without digest for a buffered chunk, or an
// ack whose digest is that of the valid change applied.
func fuzzUpdate(t *testing.T, s *hubSession, store *recordingStore, stream *sessionStream, u *fedv1.Update) {
	ctx := t.Context()
	if err := s.update(ctx, u, time.Now()); err != nil {
		t.Fatalf("update: %v", err)
	}
	if len(stream.sent) != 1 {
		t.Fatalf("update answered with %d messages", len(stream.sent))
	}
	answer := stream.sent[0]
	if nack := answer.GetNack(); nack != nil {
		if nack.GetVersion() != u.GetVersion() || nack.GetNonce() != u.GetNonce() || len(nack.GetRejections()) == 0 {
			t.Fatalf("nack %v does not answer the update", nack)
		}
		for _, rj := range nack.GetRejections() {
			if rj.GetReason() == "" {
				t.Fatalf("rejection without a reason: %v", rj)
			}
		}
		if len(store.changes) != 0 || s.version != 0 {
			t.Fatalf("a nacked update applied %d changes", len(store.changes))
		}
		return
	}
	ack := answer.GetAck()
	if ack == nil || ack.GetVersion() != u.GetVersion() || ack.GetNonce() != u.GetNonce() {
		t.Fatalf("answered %v", answer)
	}
	if ack.GetDigest() == "" {
		if !u.GetFullState() || u.GetLastChunk() || len(store.changes) != 0 || len(s.full) != len(u.GetUpserts()) {
			t.Fatalf("acked without applying: full %v, last %v, %d changes, %d buffered", u.GetFullState(), u.GetLastChunk(), len(store.changes), len(s.full))
		}
		return
	}
	if len(store.changes) != 1 || s.version != u.GetVersion() {
		t.Fatalf("acked with a digest after %d changes, at version %d", len(store.changes), s.version)
	}
	ch := store.changes[0]
	if ch.Cluster != "east" || ch.Replace != u.GetFullState() {
		t.Fatalf("change of cluster %q, replace %v", ch.Cluster, ch.Replace)
	}
	named := map[registry.ServiceKey]bool{}
	name := func(k registry.ServiceKey) {
		if err := registry.ValidateServiceKey(k); err != nil || named[k] {
			t.Fatalf("change names %v invalidly or twice (%v)", k, err)
		}
		named[k] = true
	}
	for _, sh := range ch.Upserts {
		name(sh.Service)
		checkAcceptedShard(t, "east", sh, s.h.cfg.Limits)
	}
	for _, k := range ch.Removes {
		name(k)
	}
	for _, k := range ch.Retain {
		name(k)
	}
	if len(ch.Upserts) > s.h.cfg.Limits.MaxServicesPerCluster && ch.Replace {
		t.Fatalf("a full state of %d services was applied", len(ch.Upserts))
	}
	reg := store.registry()
	if want := registry.Digest(reg.ClusterShards("east")); ack.GetDigest() != want.String() {
		t.Fatalf("acked digest %s, the cluster's is %s", ack.GetDigest(), want)
	}
	// The same version again is refused and changes nothing.
	stream.sent = nil
	if err := s.update(ctx, u, time.Now()); err != nil || len(stream.sent) != 1 || stream.sent[0].GetNack() == nil || len(store.changes) != 1 {
		t.Fatalf("the same update again: %v, answered %v", err, stream.sent)
	}
}

// fuzzImportAnswer checks that what the spoke says of the import stream
// leaves the stream's status consistent.
func fuzzImportAnswer(t *testing.T, s *hubSession, stream *sessionStream, m *fedv1.SpokeMessage) {
	err := s.imports.handle(m)
	sts := s.h.ImportStatuses()
	if len(sts) != 1 {
		t.Fatalf("%d import statuses", len(sts))
	}
	st := sts[0]
	if st.AckedVersion > st.SentVersion || st.WrittenVersion > st.SentVersion {
		t.Fatalf("status acked %d, written %d, beyond sent %d", st.AckedVersion, st.WrittenVersion, st.SentVersion)
	}
	if st.Acked+st.Pending < st.Imports || len(st.PendingServices) > min(st.Pending, maxListed) {
		t.Fatalf("status counts %d imports, %d acked, %d pending (%d named)", st.Imports, st.Acked, st.Pending, len(st.PendingServices))
	}
	for _, msg := range stream.sent {
		if msg.GetImports() == nil {
			t.Fatalf("the import stream sent %v", msg)
		}
		for _, imp := range msg.GetImports().GetUpserts() {
			if _, err := ImportFromProto(imp, registry.DefaultLimits()); err != nil {
				t.Fatalf("the hub sent an import a spoke refuses: %v", err)
			}
		}
	}
	if ack := m.GetImportAck(); ack != nil && ack.GetNonce() == "import-1.0" && ack.GetVersion() == 1 {
		if err != nil || st.AckedVersion != 1 || st.Pending != 0 || st.Acked != 2 {
			t.Fatalf("acked the update in flight: %v, status %+v", err, st)
		}
	}
	// The hub holds back only services it sent, for the reasons the spoke gave.
	for k, why := range st.Refused {
		key, perr := registry.ParseServiceKey(k)
		if perr != nil || !heldIn(s.imports.set, key) || !slices.ContainsFunc(m.GetImportNack().GetRejections(), func(r *fedv1.Rejection) bool {
			return KeyFromProto(r.GetService()) == key && r.GetReason() == why
		}) {
			t.Fatalf("refused %q (%q), which the hub did not send or the spoke did not refuse", k, why)
		}
	}
}
