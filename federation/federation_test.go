package federation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// memStore is a Store over a real registry, for testing the protocol alone.
type memStore struct {
	mu       sync.Mutex
	reg      *registry.Registry
	held     map[registry.ClusterID]Held
	maxEpoch map[registry.ClusterID]uint64
	applied  int
	changed  chan struct{}
	// conflictsChanged is closed and replaced by every Apply: a broadcast
	// that wakes every session, whose cluster's conflicts changed or not.
	conflictsChanged chan struct{}
	// gateways holds each cluster's announced gateways; gwSets counts the announcements.
	gateways map[registry.ClusterID][]registry.Gateway
	gwSets   int
}

func newMemStore() *memStore {
	return &memStore{reg: registry.New(), held: map[registry.ClusterID]Held{}, maxEpoch: map[registry.ClusterID]uint64{},
		changed: make(chan struct{}, 1000), conflictsChanged: make(chan struct{}),
		gateways: map[registry.ClusterID][]registry.Gateway{}}
}

// Conflicts computes the cluster's conflicts from the whole registry.
func (m *memStore) Conflicts(c registry.ClusterID) (Conflicts, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := Conflicts{}
	for _, svc := range m.reg.Services() {
		if texts := ExplainConflicts(svc)[c]; len(texts) > 0 {
			set[svc.Key] = texts
		}
	}
	return set, m.conflictsChanged
}

func (m *memStore) Held(_ context.Context, c registry.ClusterID) (Held, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held[c], nil
}

func (m *memStore) Apply(_ context.Context, epoch, version uint64, ch registry.Change) (registry.Hash, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if epoch < m.maxEpoch[ch.Cluster] {
		return registry.Hash{}, ErrSuperseded
	}
	m.reg, _ = m.reg.Apply(ch)
	m.held[ch.Cluster] = Held{Epoch: epoch, Version: version, Digest: m.reg.ClusterDigest(ch.Cluster)}
	m.applied++
	m.changed <- struct{}{}
	close(m.conflictsChanged)
	m.conflictsChanged = make(chan struct{})
	return m.reg.ClusterDigest(ch.Cluster), nil
}

func (m *memStore) Begin(_ context.Context, s Session) (Held, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.Epoch < m.maxEpoch[s.Cluster] {
		return Held{}, ErrSuperseded
	}
	m.maxEpoch[s.Cluster] = s.Epoch
	if s.GatewaysKnown {
		m.gateways[s.Cluster] = s.Gateways
		m.gwSets++
	}
	held := m.held[s.Cluster]
	if s.Resumes(held) {
		h := held
		h.Epoch = s.Epoch
		m.held[s.Cluster] = h
	}
	return held, nil
}

func (m *memStore) End(Session) {}

func (m *memStore) SetGateways(_ context.Context, c registry.ClusterID, epoch uint64, gws []registry.Gateway) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if epoch < m.maxEpoch[c] {
		return ErrSuperseded
	}
	m.gateways[c] = gws
	m.gwSets++
	return nil
}

// gatewaysOf returns what the store holds of the cluster's gateways and how many announcements it took.
func (m *memStore) gatewaysOf(c registry.ClusterID) ([]registry.Gateway, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gateways[c], m.gwSets
}

func (m *memStore) appliedCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.applied
}

func (m *memStore) registry() *registry.Registry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reg
}

type counterEpochs struct {
	mu sync.Mutex
	n  map[registry.ClusterID]uint64
}

func (c *counterEpochs) NextEpoch(_ context.Context, id registry.ClusterID) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[registry.ClusterID]uint64{}
	}
	c.n[id]++
	return c.n[id], nil
}

var testTokens = Tokens{"east": "east-token-0123456789", "west": "west-token-0123456789"}

type testHub struct {
	store *memStore
	srv   *HubServer
	addr  string
}

func startHub(t *testing.T, cfg HubConfig) *testHub {
	t.Helper()
	return startWiredHub(t, cfg, HubWiring{})
}

// startWiredHub is startHub with w.
func startWiredHub(t *testing.T, cfg HubConfig, w HubWiring) *testHub {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &testHub{store: newMemStore(), addr: lis.Addr().String()}
	h.srv = NewHubServer(cfg, w, h.store, &counterEpochs{}, slog.New(slog.DiscardHandler))
	g := grpc.NewServer(grpc.MaxRecvMsgSize(2*cfg.MaxMessageBytes), grpc.StreamInterceptor(AuthInterceptor(testTokens)))
	fedv1.RegisterFederationServer(g, h.srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return h
}

func dial(t *testing.T, addr, token string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(TokenCredentials{Token: token, AllowInsecure: true}))
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

func stateOf(shards ...*registry.Shard) State {
	st := State{}
	for _, s := range shards {
		st[s.Service] = s
	}
	return st
}

// publisher runs a Publisher and reports every status it passes through.
type publisher struct {
	pub    *Publisher
	states chan State
	src    *Changes // fed from states
	status chan SessionStatus
	cancel context.CancelFunc
	done   chan struct{}
}

func startPublisher(t *testing.T, conn *grpc.ClientConn, cluster registry.ClusterID, cfg spokeSetup) *publisher {
	t.Helper()
	p := &publisher{states: make(chan State, 1), status: make(chan SessionStatus, 1000), done: make(chan struct{})}
	cfg.Cluster, cfg.Status = cluster, func(s SessionStatus) { p.status <- s }
	pub := NewPublisher(cfg.SpokeConfig, cfg.SpokeWiring, conn, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.pub = cancel, pub
	src := feed(t.Context(), p.states) // outlives a restart of the publisher
	p.src = src
	go func() { defer close(p.done); _ = pub.Run(ctx, src) }()
	t.Cleanup(p.stop)
	return p
}

// feed hands every state sent on states to the Changes it returns, until ctx ends.
func feed(ctx context.Context, states <-chan State) *Changes {
	src := NewChanges()
	go func() {
		for {
			select {
			case st := <-states:
				src.Set(st)
			case <-ctx.Done():
				return
			}
		}
	}()
	return src
}

func (p *publisher) stop() {
	p.cancel()
	<-p.done
}

// awaitAcked waits until the hub has acknowledged services services.
func (p *publisher) awaitAcked(t *testing.T, services int) SessionStatus {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case s := <-p.status:
			if s.Connected && s.Services == services {
				return s
			}
		case <-timeout:
			t.Fatalf("hub never acknowledged %d services", services)
		}
	}
}

func fastSpoke() spokeSetup {
	cfg := spokeSetup{SpokeConfig: DefaultSpokeConfig()}
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	return cfg
}

func TestPublishFullStateThenDeltas(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", fastSpoke())

	a, b := testShard("east", "a", "10.0.0.1"), testShard("east", "b", "10.0.0.2")
	p.states <- stateOf(a, b)
	p.awaitAcked(t, 2)
	if got := h.store.registry().ClusterDigest("east"); got != registry.Digest(stateOf(a, b)) {
		t.Fatalf("hub digest %s, want the spoke's", got)
	}

	// A delta: b changes, a goes away, c arrives.
	b2 := testShard("east", "b", "10.0.0.2", "10.0.0.3")
	c := testShard("east", "c", "10.0.0.4")
	p.states <- stateOf(b2, c)
	p.awaitAcked(t, 2)
	waitFor(t, func() bool { return h.store.registry().ClusterDigest("east") == registry.Digest(stateOf(b2, c)) })
	reg := h.store.registry()
	if reg.Service(a.Service) != nil {
		t.Error("service a was not removed")
	}
	if got := len(reg.Service(b2.Service).Shards[0].Endpoints); got != 2 {
		t.Errorf("service b has %d endpoints, want 2", got)
	}
}

func TestFullStateIsChunkedAndAppliedAtomically(t *testing.T) {
	cfg := DefaultHubConfig()
	cfg.MaxMessageBytes = 4096 // forces many chunks
	h := startHub(t, cfg)
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", fastSpoke())
	st := State{}
	for i := range 200 {
		s := testShard("east", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
		st[s.Service] = s
	}
	p.states <- st
	p.awaitAcked(t, 200)
	if got := h.store.registry().Len(); got != 200 {
		t.Fatalf("hub holds %d services, want 200", got)
	}
	if n := h.store.appliedCount(); n != 1 {
		t.Errorf("full state was applied in %d steps, want 1 (atomic)", n)
	}
}

// rawSession opens a session by hand, to send what no well-behaved spoke would.
func rawSession(t *testing.T, conn *grpc.ClientConn, cluster string) (fedv1.Federation_PublishClient, *fedv1.Welcome) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	stream, err := fedv1.NewFederationClient(conn).Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A refused stream may already be closed: Send then says io.EOF, and Recv says why.
	if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: cluster}}}); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil {
		return stream, nil
	}
	return stream, m.GetWelcome()
}

func sendUpdate(t *testing.T, stream fedv1.Federation_PublishClient, u *fedv1.Update) *fedv1.HubMessage {
	t.Helper()
	if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil {
		t.Fatalf("await answer to update %d: %v", u.GetVersion(), err)
	}
	return m
}

func TestBadShardsAreNackedAndChangeNothing(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	conn := dial(t, h.addr, testTokens["east"])
	stream, welcome := rawSession(t, conn, "east")
	if welcome == nil || welcome.GetResume() {
		t.Fatalf("welcome = %v, want a fresh session", welcome)
	}
	good := ShardToProto(testShard("east", "good", "10.0.0.1"))
	if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "1", Version: 1, Upserts: []*fedv1.Shard{good}}); m.GetAck() == nil {
		t.Fatalf("good update answered %v", m)
	}
	before := h.store.registry()

	badIP := ShardToProto(testShard("east", "evil", "10.0.0.9"))
	badIP.Endpoints[0].Addresses[0] = "not-an-ip"
	badPort := ShardToProto(testShard("east", "evil2", "10.0.0.8"))
	badPort.Ports[0].Port = 70000
	dupAddr := ShardToProto(testShard("east", "evil3", "10.0.0.7", "10.0.0.7"))
	tooBig := ShardToProto(testShard("east", "huge"))
	for i := range registry.DefaultLimits().MaxEndpoints + 1 {
		tooBig.Endpoints = append(tooBig.Endpoints, &fedv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256)}})
	}
	badName := ShardToProto(testShard("east", "ok"))
	badName.Service.Name = "Not_A_Name"

	cases := []struct {
		name    string
		update  *fedv1.Update
		service string
		reason  string
	}{
		{"address", &fedv1.Update{Upserts: []*fedv1.Shard{good, badIP}}, "default/evil", "not an IP"},
		{"port", &fedv1.Update{Upserts: []*fedv1.Shard{badPort}}, "default/evil2", "out of range"},
		{"duplicate address", &fedv1.Update{Upserts: []*fedv1.Shard{dupAddr}}, "default/evil3", "duplicate endpoint address"},
		{"too many endpoints", &fedv1.Update{Upserts: []*fedv1.Shard{tooBig}}, "default/huge", "more than the limit"},
		{"bad name", &fedv1.Update{Upserts: []*fedv1.Shard{badName}}, "default/Not_A_Name", "DNS-1035"},
		{"service twice", &fedv1.Update{Upserts: []*fedv1.Shard{good, good}}, "default/good", "appears twice"},
		{"upsert and remove", &fedv1.Update{Upserts: []*fedv1.Shard{good}, Removes: []*fedv1.ServiceKey{good.Service}}, "default/good", "both upserted and removed"},
		{"full state that removes", &fedv1.Update{FullState: true, LastChunk: true, Removes: []*fedv1.ServiceKey{good.Service}}, "", "cannot remove"},
	}
	version := uint64(1)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			version++
			tc.update.Version, tc.update.Nonce = version, fmt.Sprint(version)
			m := sendUpdate(t, stream, tc.update)
			nack := m.GetNack()
			if nack == nil {
				t.Fatalf("answered %v, want a nack", m)
			}
			if nack.GetNonce() != tc.update.Nonce {
				t.Errorf("nack nonce %q, want %q", nack.GetNonce(), tc.update.Nonce)
			}
			rj := nack.GetRejections()[0]
			if got := KeyFromProto(rj.GetService()); tc.service != "" && got.String() != tc.service {
				t.Errorf("rejection names %s, want %s", got, tc.service)
			}
			if !strings.Contains(rj.GetReason(), tc.reason) {
				t.Errorf("reason %q does not say %q", rj.GetReason(), tc.reason)
			}
			if h.store.registry() != before {
				t.Fatal("a rejected update changed the hub's state")
			}
		})
	}

	// An old version is refused too, and the session still works afterwards.
	if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "old", Version: 1, Upserts: []*fedv1.Shard{good}}); m.GetNack() == nil {
		t.Fatalf("replayed version answered %v, want a nack", m)
	}
	other := ShardToProto(testShard("east", "other", "10.0.0.2"))
	if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "next", Version: version + 1, Upserts: []*fedv1.Shard{other}}); m.GetAck() == nil {
		t.Fatalf("good update after rejections answered %v", m)
	}
	if h.store.registry().Len() != 2 {
		t.Fatalf("hub holds %d services, want good and other", h.store.registry().Len())
	}
}

func TestRejectedChunkSpoilsTheWholeFullState(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	stream, _ := rawSession(t, dial(t, h.addr, testTokens["east"]), "east")
	good := ShardToProto(testShard("east", "good", "10.0.0.1"))
	sendUpdate(t, stream, &fedv1.Update{Nonce: "1", Version: 1, Upserts: []*fedv1.Shard{good}})
	before := h.store.registry()

	other := ShardToProto(testShard("east", "other", "10.0.0.2"))
	bad := ShardToProto(testShard("east", "bad", "10.0.0.3"))
	bad.Ports = nil
	if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "2a", Version: 2, FullState: true, Upserts: []*fedv1.Shard{other}}); m.GetAck() == nil {
		t.Fatalf("first chunk answered %v", m)
	}
	if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "2b", Version: 2, FullState: true, Upserts: []*fedv1.Shard{bad}}); m.GetNack() == nil {
		t.Fatalf("bad chunk answered %v", m)
	}
	// The last chunk alone must not be taken for the whole state (that would remove "good").
	if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "2c", Version: 2, FullState: true, LastChunk: true}); m.GetNack() == nil {
		t.Fatalf("last chunk of a spoiled full state answered %v", m)
	}
	if h.store.registry() != before {
		t.Fatal("a spoiled full state changed the hub's state")
	}
}

func TestPublisherKeepsLastGoodFormOfARejectedService(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", fastSpoke())
	a := testShard("east", "a", "10.0.0.1")
	b := testShard("east", "b", "10.0.0.2")
	p.states <- stateOf(a, b)
	p.awaitAcked(t, 2)

	// The spoke's source produces a shard the hub refuses (the spoke validates
	// less than the hub does, e.g. an older spoke build).
	badB := testShard("east", "b", "10.0.0.2")
	badB.Ports[0].Protocol = "QUIC"
	c := testShard("east", "c", "10.0.0.3")
	p.states <- stateOf(a, badB, c)
	waitFor(t, func() bool { return h.store.registry().Service(c.Service) != nil })
	if got := h.store.registry().Service(b.Service); got == nil || !got.Shards[0].Equal(b) {
		t.Fatal("the hub lost the last good form of b")
	}
}

func TestWrongCredentialsAreRefused(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	for _, tc := range []struct {
		name, token, cluster string
		code                 codes.Code
	}{
		{"unknown token", "forged-token-0123456789", "east", codes.Unauthenticated},
		{"no token", "", "east", codes.Unauthenticated},
		{"another cluster's token", testTokens["west"], "east", codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conn *grpc.ClientConn
			if tc.token == "" {
				c, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				conn = c
			} else {
				conn = dial(t, h.addr, tc.token)
			}
			stream, welcome := rawSession(t, conn, tc.cluster)
			if welcome != nil {
				t.Fatal("session accepted")
			}
			_, err := stream.Recv()
			if status.Code(err) != tc.code {
				t.Fatalf("err = %v, want %s", err, tc.code)
			}
		})
	}
	if h.store.registry().Len() != 0 {
		t.Fatal("a refused spoke changed the hub's state")
	}
}

func TestValidatePeerToken(t *testing.T) {
	for tok, ok := range map[string]bool{"peer-token-0123456789": true, "short": false, testTokens["west"]: false} {
		if err := ValidatePeerToken(tok, testTokens); (err == nil) != ok {
			t.Errorf("ValidatePeerToken(%q) = %v", tok, err)
		}
	}
}

func TestReconnectResumesWithoutFullState(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	conn := dial(t, h.addr, testTokens["east"])
	p := startPublisher(t, conn, "east", fastSpoke())
	p.states <- stateOf(testShard("east", "a", "10.0.0.1"))
	first := p.awaitAcked(t, 1)
	applied := h.store.appliedCount()

	// Break the session from the hub side: a newer session of the same
	// cluster supersedes it, then goes away; the publisher reconnects.
	stream, welcome := rawSession(t, dial(t, h.addr, testTokens["east"]), "east")
	if welcome == nil {
		t.Fatal("second session refused")
	}
	_ = stream.CloseSend()
	next := p.awaitAcked(t, 1)
	for next.Epoch <= welcome.GetEpoch() {
		next = p.awaitAcked(t, 1)
	}
	if next.Epoch <= first.Epoch {
		t.Fatalf("epoch went from %d to %d", first.Epoch, next.Epoch)
	}
	if !next.Resumed {
		t.Error("the session did not resume")
	}
	// Resumed: the hub's state was what the spoke had acknowledged, so nothing was sent again.
	if n := h.store.appliedCount(); n != applied {
		t.Errorf("the hub applied %d more updates after a resume, want 0", n-applied)
	}

	// And again: a resumed session that sent nothing can be resumed too.
	stream, welcome = rawSession(t, dial(t, h.addr, testTokens["east"]), "east")
	_ = stream.CloseSend()
	again := p.awaitAcked(t, 1)
	for again.Epoch <= welcome.GetEpoch() {
		again = p.awaitAcked(t, 1)
	}
	if !again.Resumed {
		t.Error("the second reconnect did not resume")
	}
	if n := h.store.appliedCount(); n != applied {
		t.Errorf("the second resume applied %d updates, want 0", n-applied)
	}
}

func TestNewestSessionWinsARace(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	newer := false
	if err := h.srv.supersede("east", 8, func(error) { newer = true }, nil); err != nil {
		t.Fatal(err)
	}
	// The older session arrives late: it is refused, and the newer one lives on.
	if err := h.srv.supersede("east", 7, func(error) {}, nil); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("late older session: %v, want ErrSuperseded", err)
	}
	if newer {
		t.Fatal("the newer session was cancelled by an older one")
	}
	h.srv.release("east", 7)
	if err := h.srv.supersede("east", 9, func(error) {}, nil); err != nil || !newer {
		t.Fatalf("a newest session must end epoch 8: err %v, cancelled %v", err, newer)
	}
}

func TestOversizedShardKeepsItsLastGoodFormAndNothingStalls(t *testing.T) {
	cfg := DefaultHubConfig()
	cfg.MaxMessageBytes = 8 << 10
	h := startHub(t, cfg)
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", fastSpoke())
	small := testShard("east", "big", "10.0.0.1")
	p.states <- stateOf(small)
	first := p.awaitAcked(t, 1)

	var addrs []string
	for i := range 500 {
		addrs = append(addrs, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1))
	}
	huge := testShard("east", "big", addrs...)
	other := testShard("east", "other", "10.0.0.2")
	p.states <- stateOf(huge, other)
	for st := p.awaitAcked(t, 2); st.Rejected != 1; st = p.awaitAcked(t, 2) {
		if st.Epoch != first.Epoch {
			t.Fatalf("the session broke (epoch %d -> %d): an oversized shard was sent", first.Epoch, st.Epoch)
		}
	}
	if h.store.registry().Service(other.Service) == nil {
		t.Fatal("the other service never arrived")
	}
	if got := h.store.registry().Service(small.Service); got == nil || !got.Shards[0].Equal(small) {
		t.Fatal("the hub lost the last good form of the oversized service")
	}
}

func TestRefusedShardInAChunkedFullStateNeedsNoReconnect(t *testing.T) {
	cfg := DefaultHubConfig()
	cfg.MaxMessageBytes = 4 << 10 // several chunks
	h := startHub(t, cfg)
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", fastSpoke())
	st := State{}
	for i := range 60 {
		s := testShard("east", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.0.0.%d", i+1))
		st[s.Service] = s
	}
	bad := testShard("east", "aaa-first", "10.0.0.200") // sorts first: its chunk is not the last
	bad.Ports[0].Protocol = "QUIC"
	st[bad.Service] = bad
	p.states <- st
	got := p.awaitAcked(t, 60)
	if got.Epoch != 1 || got.Rejected != 1 {
		t.Fatalf("status %+v, want the first session with one refused service", got)
	}
}

func TestDigestMismatchTriggersResync(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	cfg := fastSpoke()
	cfg.DigestInterval = 20 * time.Millisecond
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", cfg)
	a := testShard("east", "a", "10.0.0.1")
	p.states <- stateOf(a)
	p.awaitAcked(t, 1)

	// Something changes the hub's copy behind the session's back.
	h.store.mu.Lock()
	h.store.reg, _ = h.store.reg.Apply(registry.Change{Cluster: "east", Removes: []registry.ServiceKey{a.Service}})
	held := h.store.held["east"]
	held.Digest = h.store.reg.ClusterDigest("east")
	h.store.held["east"] = held
	h.store.mu.Unlock()

	waitFor(t, func() bool { return h.store.registry().Service(a.Service) != nil })
}

func TestOlderSessionIsSuperseded(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	old, _ := rawSession(t, dial(t, h.addr, testTokens["east"]), "east")
	_, welcome := rawSession(t, dial(t, h.addr, testTokens["east"]), "east")
	if welcome == nil {
		t.Fatal("newer session refused")
	}
	_, err := old.Recv()
	if status.Code(err) != codes.Aborted {
		t.Fatalf("older session ended with %v, want Aborted", err)
	}
	if err == io.EOF {
		t.Fatal("older session ended cleanly")
	}
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

func TestSessionWithoutHelloTimesOut(t *testing.T) {
	cfg := DefaultHubConfig()
	cfg.HelloTimeout = 50 * time.Millisecond
	h := startHub(t, cfg)
	stream, err := fedv1.NewFederationClient(dial(t, h.addr, testTokens["east"])).Publish(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a silent stream ended with %v, want DeadlineExceeded", err)
	}
	// An update before the hello is refused too.
	stream, err = fedv1.NewFederationClient(dial(t, h.addr, testTokens["east"])).Publish(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{Version: 1}}})
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an update before the hello ended with %v, want InvalidArgument", err)
	}
}

// A tokens file is read again when it changes; a version that does not
// load, or that its check refuses, changes nothing.
func TestTokenFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("east: east-token-0123456789abcdef\n")
	peer := "peer-token-0123456789abcdef"
	f, err := OpenTokens(path, func(tk Tokens) error { return ValidatePeerToken(peer, tk) })
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Reload(); changed || err != nil {
		t.Fatalf("an unchanged file: %v, %v", changed, err)
	}
	for _, bad := range []string{"east: short\n", "east: " + peer + "\n", "not yaml: [\n", "", "\n", "# half written\n", "{}\n"} {
		write(bad)
		if changed, err := f.Reload(); changed || err == nil {
			t.Errorf("%q: %v, %v", bad, changed, err)
		}
		if c, err := f.Tokens().Cluster("east-token-0123456789abcdef"); err != nil || c != "east" {
			t.Fatalf("after %q the last good tokens are gone: %v %v", bad, c, err)
		}
	}
	write("west: west-token-0123456789abcdef\n")
	if changed, err := f.Reload(); !changed || err != nil {
		t.Fatalf("a good new version: %v, %v", changed, err)
	}
	if _, err := f.Tokens().Cluster("east-token-0123456789abcdef"); err == nil {
		t.Fatal("a withdrawn token still admits")
	}
}

// A peer token file holds one or more tokens: the first is presented,
// every one is accepted. A version that does not load, or that its check
// refuses, changes nothing.
func TestPeerTokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peer-token")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const old, next = "peer-old-0123456789abcdef", "peer-new-0123456789abcdef"
	write(old + "\n")
	f, err := OpenPeerTokens(path, func(p PeerTokens) error { return p.Validate(testTokens) })
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Tokens(); got.Present() != old || !got.Accepts(old) || got.Accepts(next) {
		t.Fatalf("one token: present %q, accepts old %v, new %v", got.Present(), got.Accepts(old), got.Accepts(next))
	}
	write("# rotating\n" + old + "\n\n  " + next + "  \n")
	if changed, err := f.Reload(); !changed || err != nil {
		t.Fatalf("a second token: %v, %v", changed, err)
	}
	if got := f.Tokens(); got.Present() != old || !got.Accepts(old) || !got.Accepts(next) || got.Accepts("") {
		t.Fatalf("two tokens: present %q, accepts old %v, new %v, empty %v", got.Present(), got.Accepts(old), got.Accepts(next), got.Accepts(""))
	}
	for _, bad := range []string{"", "# nothing\n\n", "short\n", old + "\n" + old + "\n", testTokens["east"] + "\n"} {
		write(bad)
		if changed, err := f.Reload(); changed || err == nil {
			t.Errorf("%q: %v, %v", bad, changed, err)
		}
		if got := f.Tokens(); got.Present() != old || !got.Accepts(next) {
			t.Fatalf("after %q the last good tokens are gone: %v", bad, got)
		}
	}
	write(next + "\n")
	if changed, err := f.Reload(); !changed || err != nil {
		t.Fatalf("the old token removed: %v, %v", changed, err)
	}
	if got := f.Tokens(); got.Present() != next || got.Accepts(old) {
		t.Fatalf("rotated: present %q, accepts old %v", got.Present(), got.Accepts(old))
	}
}
