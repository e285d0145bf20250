package federation

import (
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// hubProxy forwards TCP connections to addr; kick severs every one, so
// that the spoke's Publisher (the same one: its acknowledged state kept)
// starts a new session, which may resume.
type hubProxy struct {
	lis   net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startHubProxy(t *testing.T, addr string) *hubProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &hubProxy{lis: lis}
	t.Cleanup(func() { lis.Close(); p.kick() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *hubProxy) kick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// versionedHub is a real hub whose welcome leaves out CapabilityTraffic
// while old is set (a hub of before the commit, as far as the spoke can
// tell), and that records whether traffic reached it while old.
type versionedHub struct {
	old            atomic.Bool
	sessions       atomic.Int32
	trafficWhenOld atomic.Int32
	digests        atomic.Int32 // digests received
}

type versionedStream struct {
	grpc.ServerStream
	h   *versionedHub
	old bool
}

func (s *versionedStream) SendMsg(m any) error {
	if hm, ok := m.(*fedv1.HubMessage); ok && hm.GetWelcome() != nil {
		s.h.sessions.Add(1)
		if s.old {
			hm = proto.Clone(hm).(*fedv1.HubMessage)
			w := hm.GetWelcome()
			w.Capabilities = slices.DeleteFunc(w.Capabilities, func(c string) bool { return c == CapabilityTraffic })
			m = hm
		}
	}
	return s.ServerStream.SendMsg(m)
}

func (s *versionedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if sm, ok := m.(*fedv1.SpokeMessage); ok && err == nil && sm.GetDigest() != nil {
		s.h.digests.Add(1)
	}
	if sm, ok := m.(*fedv1.SpokeMessage); ok && err == nil && s.old {
		for _, u := range sm.GetUpdate().GetUpserts() {
			if u.GetTraffic() != nil {
				s.h.trafficWhenOld.Add(1)
			}
		}
	}
	return err
}

func (h *versionedHub) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &versionedStream{ServerStream: ss, h: h, old: h.old.Load()})
}

func hubTrafficShard(name string, addr string, route string) *registry.Shard {
	s := testShard("east", name, addr)
	if route != "" {
		s.Traffic = traffic.Set{Routes: []traffic.Route{{Kind: traffic.GRPCRoute, Name: route, CreatedAt: time.Unix(1000, 0).UTC(),
			Rules: []traffic.Rule{{Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: name, Weight: 1}}}}}}}
	}
	s.Normalize()
	return s
}

// awaitHubHolds waits until the hub holds exactly want for east.
func awaitHubHolds(t *testing.T, store *memStore, want State, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := store.registry().ClusterShards("east")
		ok := len(got) == len(want)
		for k, s := range want {
			if g := got[k]; g == nil || !g.Equal(s) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			for k, s := range want {
				t.Logf("%s: hub holds traffic %+v, want %+v", k, got[k].Traffic, s.Traffic)
			}
			t.Fatalf("%s: the hub never held the spoke's state", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func bareOf(st State) State {
	out := State{}
	for k, s := range st {
		c := *s
		c.Traffic = traffic.Set{}
		out[k] = &c
	}
	return out
}

// A spoke moves between an older hub (no "traffic") and a newer one, with
// resume: the older hub never receives traffic and digests what it holds
// (no resync loop), and the newer one gets every service's traffic.
func TestSpokeMovesBetweenOlderAndNewerHubs(t *testing.T) {
	h := &versionedHub{}
	h.old.Store(true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	store := newMemStore()
	cfg := DefaultHubConfig()
	srv := NewHubServer(cfg, HubWiring{}, store, &counterEpochs{}, slog.New(slog.DiscardHandler))
	g := grpc.NewServer(grpc.MaxRecvMsgSize(2*cfg.MaxMessageBytes), grpc.ChainStreamInterceptor(AuthInterceptor(testTokens), h.intercept))
	fedv1.RegisterFederationServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	proxy := startHubProxy(t, lis.Addr().String())

	sc := fastSpoke()
	sc.DigestInterval = 20 * time.Millisecond
	p := startPublisher(t, dial(t, proxy.lis.Addr().String(), testTokens["east"]), "east", sc)

	st := stateOf(hubTrafficShard("a", "10.0.0.1", "a-route"), hubTrafficShard("b", "10.0.0.2", ""))
	p.states <- st
	awaitHubHolds(t, store, bareOf(st), "older hub")
	// Ten digests checked by the older hub: none may have ended the session.
	for since := h.digests.Load(); h.digests.Load() < since+10; {
		time.Sleep(5 * time.Millisecond) // awaiting the count, not a window
	}
	if n := h.sessions.Load(); n != 1 {
		t.Errorf("%d sessions with the older hub, want 1 (a digest it cannot match ends in resyncs)", n)
	}

	// A change while with the older hub.
	st = stateOf(hubTrafficShard("a", "10.0.0.1", "a-route2"), hubTrafficShard("b", "10.0.0.2", "b-route"),
		hubTrafficShard("c", "10.0.0.3", "c-route"))
	p.states <- st
	awaitHubHolds(t, store, bareOf(st), "older hub, changed")

	// Upgraded: a new session (it resumes) to a hub that takes traffic.
	h.old.Store(false)
	proxy.kick()
	awaitHubHolds(t, store, st, "newer hub")

	// And back (a rollback), with a change in between.
	h.old.Store(true)
	proxy.kick()
	awaitHubHolds(t, store, bareOf(st), "older hub again")
	st = stateOf(hubTrafficShard("a", "10.0.0.1", "a-route3"), hubTrafficShard("c", "10.0.0.3", "c-route"))
	p.states <- st
	awaitHubHolds(t, store, bareOf(st), "older hub again, changed")
	h.old.Store(false)
	proxy.kick()
	awaitHubHolds(t, store, st, "newer hub again")
	if n := h.trafficWhenOld.Load(); n != 0 {
		t.Errorf("the older hub was sent %d shards with traffic", n)
	}
	resumed := 0
	for len(p.status) > 0 {
		if s := <-p.status; s.Connected && s.Resumed {
			resumed++
		}
	}
	t.Logf("%d sessions; statuses of resumed sessions: %d", h.sessions.Load(), resumed)
	if resumed == 0 {
		t.Errorf("no session resumed: the test did not exercise resume")
	}
}

// bare holds a shard beside its form without traffic, for a hub without
// "traffic"; a service that leaves while a full state is due (a new session
// that does not resume, a resync) is never looked at by publishableOf again
// (the full state walks desired and clears dirty): the full state itself
// frees its entry, which holds the whole shard.
func TestBareIsFreedWhenAServiceLeavesBeforeAFullState(t *testing.T) {
	p := NewPublisher(fastSpoke().SpokeConfig, SpokeWiring{}, nil, slog.New(slog.DiscardHandler))
	p.trafficTaken, p.maxBytes = false, 1<<20
	var shards []*registry.Shard
	for _, name := range []string{"a", "b", "c"} {
		shards = append(shards, hubTrafficShard(name, "10.0.0.1", name+"-route"))
	}
	p.desired = stateOf(shards...)
	markAll(p.dirty, p.desired)
	full := p.fullState()
	acked := State{}
	for _, u := range full {
		for _, w := range u.upserts {
			acked[w.shard.Service] = w.shard
		}
	}
	p.resetAcked(acked)
	if len(p.bare) != 3 {
		t.Fatalf("bare holds %d entries, want 3", len(p.bare))
	}
	// Two services leave (the source's take: forget, delete), then the
	// session ends and the next does not resume: a full state.
	for _, s := range shards[:2] {
		p.forget(s.Service)
		delete(p.desired, s.Service)
	}
	p.fullState()
	p.delta()
	if len(p.bare) != 1 {
		t.Errorf("after two of three services left, bare holds %d entries (%v), want 1", len(p.bare), reviewKeysOf(p.bare))
	}
}

func reviewKeysOf[V any](m map[registry.ServiceKey]V) []registry.ServiceKey {
	var out []registry.ServiceKey
	for k := range m {
		out = append(out, k)
	}
	return out
}
