package federation

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/navemesh/nave/exportpolicy"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// scriptHub is a hub whose every answer the test writes.
type scriptHub struct {
	fedv1.UnimplementedFederationServer
	sessions chan *scriptSession
}

type scriptSession struct {
	stream fedv1.Federation_PublishServer
	hello  *fedv1.Hello
	msgs   chan *fedv1.SpokeMessage
	end    chan error
}

func (h *scriptHub) Publish(stream fedv1.Federation_PublishServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	s := &scriptSession{stream: stream, hello: first.GetHello(), msgs: make(chan *fedv1.SpokeMessage, 100), end: make(chan error, 1)}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			s.msgs <- m
		}
	}()
	h.sessions <- s
	select {
	case err := <-s.end:
		return err
	case <-stream.Context().Done():
		return nil
	}
}

func startScriptHub(t *testing.T) (*scriptHub, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &scriptHub{sessions: make(chan *scriptSession, 10)}
	g := grpc.NewServer()
	fedv1.RegisterFederationServer(g, h)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return h, lis.Addr().String()
}

func (h *scriptHub) next(t *testing.T) *scriptSession {
	t.Helper()
	select {
	case s := <-h.sessions:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no session")
		return nil
	}
}

func (s *scriptSession) welcome(t *testing.T, epoch uint64, resume bool) {
	t.Helper()
	s.welcomeWith(t, epoch, resume, 1<<20)
}

func (s *scriptSession) welcomeWith(t *testing.T, epoch uint64, resume bool, maxBytes uint32) {
	t.Helper()
	if err := s.stream.Send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Welcome{Welcome: &fedv1.Welcome{
		Epoch: epoch, Resume: resume, MaxMessageBytes: maxBytes}}}); err != nil {
		t.Fatal(err)
	}
}

// update returns the spoke's next update, or nil when none comes within d.
func (s *scriptSession) update(t *testing.T, d time.Duration) *fedv1.Update {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case m := <-s.msgs:
			if u := m.GetUpdate(); u != nil {
				return u
			}
		case <-timeout:
			return nil
		}
	}
}

func (s *scriptSession) mustUpdate(t *testing.T) *fedv1.Update {
	t.Helper()
	u := s.update(t, 10*time.Second)
	if u == nil {
		t.Fatal("no update from the spoke")
	}
	return u
}

func (s *scriptSession) ack(t *testing.T, u *fedv1.Update, held State) {
	t.Helper()
	if err := s.stream.Send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Ack{Ack: &fedv1.Ack{
		Nonce: u.GetNonce(), Version: u.GetVersion(), Digest: registry.Digest(held).String()}}}); err != nil {
		t.Fatal(err)
	}
}

func (s *scriptSession) send(t *testing.T, m *fedv1.HubMessage) {
	t.Helper()
	if err := s.stream.Send(m); err != nil {
		t.Fatal(err)
	}
}

func keyNames(keys []*fedv1.ServiceKey) []string {
	var out []string
	for _, k := range keys {
		out = append(out, k.GetName())
	}
	slices.Sort(out)
	return out
}

func upsertNames(u *fedv1.Update) []string {
	var out []string
	for _, s := range u.GetUpserts() {
		out = append(out, s.GetService().GetName())
	}
	slices.Sort(out)
	return out
}

// awaitTaken waits until the publisher took st from its source: what the
// hub says next is handled after it (one goroutine does both, in order).
func (p *publisher) awaitTaken(t *testing.T, st State) {
	t.Helper()
	waitFor(t, func() bool {
		p.src.mu.Lock()
		defer p.src.mu.Unlock()
		return !p.src.full && len(p.src.dirty) == 0 &&
			maps.EqualFunc(p.src.state, st, func(a, b *registry.Shard) bool { return a == b })
	})
}

// awaitRefused waits until the publisher counts n services refused.
func (p *publisher) awaitRefused(t *testing.T, n int) {
	t.Helper()
	p.awaitStatus(t, 10*time.Second, fmt.Sprintf("%d refused", n), func(s SessionStatus) bool { return s.Rejected == n })
}

// A hub's export-policy resync clears the policy refusals; the session ends
// before the full state went, and the next session resumes: the service the
// policy refused must be tried again (it goes with the first delta of the resumed session).
func TestResyncLostWithTheSessionRetriesPolicyRefusals(t *testing.T) {
	h, addr := startScriptHub(t)
	p := startPublisher(t, dial(t, addr, ""), "east", fastSpoke())
	a, b := testShard("east", "a", "10.0.0.1"), testShard("east", "b", "10.0.0.2")
	p.states <- stateOf(a)

	s1 := h.next(t)
	s1.welcome(t, 1, false)
	full := s1.mustUpdate(t)
	s1.ack(t, full, stateOf(a))

	p.states <- stateOf(a, b)
	u := s1.mustUpdate(t) // upsert b
	s1.send(t, &fedv1.HubMessage{Kind: &fedv1.HubMessage_Nack{Nack: &fedv1.Nack{Nonce: u.GetNonce(), Version: u.GetVersion(),
		Rejections: []*fedv1.Rejection{{Service: KeyToProto(b.Service), Reason: exportpolicy.Refusal("east", "default")}}}}})
	p.awaitRefused(t, 1)

	a2 := testShard("east", "a", "10.0.0.1", "10.0.0.3")
	p.states <- stateOf(a2, b)
	inflight := s1.mustUpdate(t) // upsert a2, never answered
	if got := upsertNames(inflight); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("in flight: %v", got)
	}
	// The policy changed: the hub asks for a full state; the session breaks first.
	s1.send(t, &fedv1.HubMessage{Kind: &fedv1.HubMessage_Resync{Resync: &fedv1.ResyncRequest{Reason: "export policy changed"}}})
	// Whether or not the spoke saw the resync before the break, b is tried again.
	s1.end <- nil

	s2 := h.next(t)
	if s2.hello.GetAckedVersion() != full.GetVersion() {
		t.Fatalf("hello acked version %d, want %d", s2.hello.GetAckedVersion(), full.GetVersion())
	}
	s2.welcome(t, 2, true) // the hub holds exactly what the spoke acknowledged
	d := s2.mustUpdate(t)
	if got := upsertNames(d); !slices.Contains(got, "b") {
		s2.ack(t, d, stateOf(a2))
		more := s2.update(t, time.Second)
		t.Fatalf("resumed session sent upserts %v then %v; b (no longer refused) is never sent", got, more.GetUpserts())
	}
}

// A full state asked for within a session (here by the hub's resync) is lost
// with its session, and the next session resumes: a service removed from
// the cluster while the full state was prepared must still be removed at
// the hub.
func TestFullStateLostWithTheSessionKeepsARemoval(t *testing.T) {
	h, addr := startScriptHub(t)
	p := startPublisher(t, dial(t, addr, ""), "east", fastSpoke())
	a, b := testShard("east", "a", "10.0.0.1"), testShard("east", "b", "10.0.0.2")
	p.states <- stateOf(a, b)

	s1 := h.next(t)
	s1.welcome(t, 1, false)
	full := s1.mustUpdate(t)
	s1.ack(t, full, stateOf(a, b))

	a2 := testShard("east", "a", "10.0.0.1", "10.0.0.3")
	p.states <- stateOf(a2, b)
	d := s1.mustUpdate(t)   // upsert a2
	p.states <- stateOf(a2) // b goes while a2 is in flight
	p.awaitTaken(t, stateOf(a2))
	s1.send(t, &fedv1.HubMessage{Kind: &fedv1.HubMessage_Resync{Resync: &fedv1.ResyncRequest{Reason: "export policy changed"}}})
	s1.ack(t, d, stateOf(a2, b))
	f2 := s1.mustUpdate(t)
	if !f2.GetFullState() {
		t.Fatalf("want the full state, got %v", f2)
	}
	// The full state never reaches the hub: the session breaks.
	s1.end <- nil

	s2 := h.next(t)
	if s2.hello.GetAckedVersion() != d.GetVersion() {
		t.Fatalf("hello acked version %d, want %d", s2.hello.GetAckedVersion(), d.GetVersion())
	}
	s2.welcome(t, 2, true) // the hub holds a2 and b, as the spoke acknowledged
	u := s2.mustUpdate(t)
	if u == nil || !slices.Contains(keyNames(u.GetRemoves()), "b") {
		t.Fatalf("resumed session sent %v; b, gone from the cluster, is never removed from the hub", u)
	}
}

// A chunked full state asked for within a session is lost with it after its
// first chunk was acknowledged, and the next session resumes: a service
// whose new form was in that chunk must still reach the hub (the old
// publisher's delta sent it).
func TestChunkedFullStateLostWithTheSessionKeepsAnUpsert(t *testing.T) {
	h, addr := startScriptHub(t)
	p := startPublisher(t, dial(t, addr, ""), "east", fastSpoke())
	a, b := testShard("east", "a", "10.0.0.1"), testShard("east", "b", "10.0.0.2")
	c, d := testShard("east", "c", "10.0.0.3"), testShard("east", "d", "10.0.0.4")
	a2 := testShard("east", "a", "10.0.0.1", "10.0.0.8")
	b2 := testShard("east", "b", "10.0.0.2", "10.0.0.9")
	n := ItemBytes(ShardToProto(a2))
	budget := uint32(envelopeBytes + 2*n + n/2) // a2 and b2 fill a chunk
	p.states <- stateOf(a, b, c, d)

	s1 := h.next(t)
	s1.welcomeWith(t, 1, false, budget)
	for {
		u := s1.mustUpdate(t)
		s1.ack(t, u, stateOf(a, b, c, d))
		if u.GetLastChunk() {
			break
		}
	}
	p.states <- stateOf(a, b2, c, d)
	d1 := s1.mustUpdate(t)            // upsert b2
	p.states <- stateOf(a2, b2, c, d) // a changes while b2 is in flight
	p.awaitTaken(t, stateOf(a2, b2, c, d))
	s1.send(t, &fedv1.HubMessage{Kind: &fedv1.HubMessage_Resync{Resync: &fedv1.ResyncRequest{Reason: "export policy changed"}}})
	s1.ack(t, d1, stateOf(a, b2, c, d))
	first := s1.mustUpdate(t)
	if !first.GetFullState() || first.GetLastChunk() || !slices.Equal(upsertNames(first), []string{"a", "b"}) {
		t.Fatalf("want the full state's first chunk with a and b, got %v", first)
	}
	s1.ack(t, first, nil) // the hub takes the first chunk; the session breaks before the rest
	// Whether or not the spoke saw that ack before the break, a must reach the hub.
	s1.end <- nil

	s2 := h.next(t)
	if s2.hello.GetAckedVersion() != d1.GetVersion() {
		t.Fatalf("hello acked version %d, want %d", s2.hello.GetAckedVersion(), d1.GetVersion())
	}
	s2.welcomeWith(t, 2, true, budget) // the hub holds a, b2, c, d: a full state applies at its last chunk
	u := s2.mustUpdate(t)
	if u == nil || !slices.Contains(upsertNames(u), "a") {
		t.Fatalf("resumed session sent %v; a's new form never reaches the hub", u)
	}
}

// refusedAfterItLeft runs a publisher whose hub acknowledged a, was sent k,
// and refused k after k left the cluster (the publisher has seen both).
func refusedAfterItLeft(t *testing.T, cfg spokeSetup) (p *publisher, s1 *scriptSession, a, k *registry.Shard) {
	t.Helper()
	h, addr := startScriptHub(t)
	p = startPublisher(t, dial(t, addr, ""), "east", cfg)
	a, k = testShard("east", "a", "10.0.0.1"), testShard("east", "k", "10.0.0.2")
	p.states <- stateOf(a)
	s1 = h.next(t)
	s1.welcome(t, 1, false)
	full := s1.mustUpdate(t)
	s1.ack(t, full, stateOf(a))

	p.states <- stateOf(a, k)
	u := s1.mustUpdate(t)  // upsert k
	p.states <- stateOf(a) // k goes while in flight
	p.awaitTaken(t, stateOf(a))
	s1.send(t, &fedv1.HubMessage{Kind: &fedv1.HubMessage_Nack{Nack: &fedv1.Nack{Nonce: u.GetNonce(), Version: u.GetVersion(),
		Rejections: []*fedv1.Rejection{{Service: KeyToProto(k.Service), Reason: "invalid"}}}}})
	p.awaitRefused(t, 1)
	return p, s1, a, k
}

// The hub refuses the form of a service that left the cluster while it was
// in flight: the refusal must not outlive the service (SessionStatus.Rejected goes
// back to 0).
func TestRefusalOfAServiceGoneInFlightIsForgotten(t *testing.T) {
	p, s1, _, _ := refusedAfterItLeft(t, fastSpoke())
	a2 := testShard("east", "a", "10.0.0.1", "10.0.0.3")
	p.states <- stateOf(a2)
	d := s1.mustUpdate(t)
	s1.ack(t, d, stateOf(a2))
	st := p.awaitStatus(t, 5*time.Second, "a2 acknowledged", func(s SessionStatus) bool { return s.AckedVersion == d.GetVersion() })
	if st.Rejected != 0 {
		t.Fatalf("status %+v: a service no longer in the cluster is still counted as refused", st)
	}
}

// ... and when the service comes back in the same form, it is sent again
// (not withheld silently, with no report).
func TestServiceBackInTheFormRefusedAfterItLeftIsSentAgain(t *testing.T) {
	var reports []Reports
	var mu sync.Mutex
	cfg := fastSpoke()
	cfg.OnReport = func(r Reports) { mu.Lock(); reports = append(reports, r); mu.Unlock() }
	p, s1, a, k := refusedAfterItLeft(t, cfg)
	p.states <- stateOf(a, k) // k is back, as it was
	if u := s1.update(t, 10*time.Second); u == nil {
		mu.Lock()
		var last Reports
		if len(reports) > 0 {
			last = reports[len(reports)-1]
		}
		mu.Unlock()
		t.Fatalf("k never sent again; the last report: %+v (nothing refused)", last)
	}
}
