package main

import (
	"net/netip"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
)

func TestAddrLayoutRoundTrip(t *testing.T) {
	for _, clusters := range []int{1, 2, 3, 10, 256} {
		l := newAddrLayout(clusters)
		for _, c := range []int{0, clusters - 1} {
			for _, n := range []uint32{1, l.capacity()} {
				a := l.addr(c, n)
				ip, ok := ipv4(a)
				if !ok {
					t.Fatalf("%d clusters: %s is not IPv4", clusters, a)
				}
				if got, ok := l.cluster(ip); !ok || got != c {
					t.Errorf("%d clusters: %s decodes to cluster %d (%v), want %d", clusters, a, got, ok, c)
				}
			}
		}
	}
	if _, ok := newAddrLayout(3).cluster(127<<24 | 1); ok {
		t.Error("127.0.0.1 decoded to a bench cluster")
	}
}

func TestLedgerObserve(t *testing.T) {
	start := time.Now()
	l := newLedger(start, 2, 3)
	l.subscribers[1] = 4
	record := func(fp uint64, at time.Duration) int32 {
		t.Helper()
		g, err := l.record(1, 1, fp, kindFlip, start.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if g := record(100, 0); g != 0 {
		t.Fatalf("initial state is generation %d", g)
	}
	if l.pending.Load() != 0 || l.changes.Load() != 0 {
		t.Fatalf("the initial state counts as a change: pending %d, changes %d", l.pending.Load(), l.changes.Load())
	}
	record(101, 10*time.Millisecond)
	record(102, 20*time.Millisecond)
	if _, err := l.record(1, 1, 101, kindFlip, start); err == nil {
		t.Error("a repeated state was recorded")
	}
	if got := l.pending.Load(); got != 8 {
		t.Fatalf("pending after 2 changes of a service with 4 subscribers: %d, want 8", got)
	}

	var held int32
	// Seeing generation 2 while holding 0 converges both changes, each from its own handover.
	conv, obs := l.observe(1, 1, 102, &held, start.Add(25*time.Millisecond), nil)
	if obs != obsNewer || held != 2 || len(conv) != 2 {
		t.Fatalf("observe gen 2: %v, held %d, %d pairs", obs, held, len(conv))
	}
	if conv[0].latency != 15*time.Millisecond || conv[1].latency != 5*time.Millisecond {
		t.Errorf("latencies %v, %v; want 15ms, 5ms", conv[0].latency, conv[1].latency)
	}
	if conv[0].handed != 10*time.Millisecond || conv[0].kind != kindFlip {
		t.Errorf("first pair: %+v", conv[0])
	}
	if got := l.pending.Load(); got != 6 {
		t.Errorf("pending after one client converged: %d, want 6", got)
	}
	if _, obs := l.observe(1, 1, 102, &held, start, nil); obs != obsSame {
		t.Errorf("the same state again: %v", obs)
	}
	if _, obs := l.observe(1, 1, 101, &held, start, nil); obs != obsOlder || held != 2 {
		t.Errorf("an older state: %v, held %d", obs, held)
	}
	if _, obs := l.observe(1, 1, 999, &held, start, nil); obs != obsUnknown {
		t.Errorf("an unknown state: %v", obs)
	}
	if got := l.latest(1, 1); got != 102 {
		t.Errorf("latest %d, want 102", got)
	}
}

// TestChurnMakesNewValidStates runs the churn's change generator without a
// hub: every change must be valid, visible to clients, and new.
func TestChurnMakesNewValidStates(t *testing.T) {
	sc := scaleConfig{Clusters: 2, Services: 3, Endpoints: 2, Rate: 1000, Duration: time.Second}
	l := newLedger(time.Now(), sc.Clusters, sc.Services)
	w, err := newWorld(sc, l, 7, netip.MustParseAddrPort("127.0.0.1:5000"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := w.endpointCount(), sc.Clusters*sc.Services*sc.Endpoints+1; got != want {
		t.Fatalf("%d endpoints, want %d", got, want)
	}
	for i := range 600 {
		c, s := i%sc.Clusters, i%sc.Services
		before := l.latest(c, s)
		if _, err := w.randomChange(c, s); err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		sh := w.clusters[c].shards[s]
		if err := sh.Validate(registry.DefaultLimits()); err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		fp := fingerprint(w.layout, sh.Endpoints)
		if fp == before || fp != l.latest(c, s) {
			t.Fatalf("change %d: fingerprint %x, before %x, ledger %x", i, fp, before, l.latest(c, s))
		}
		if n, h := len(sh.Endpoints), healthy(sh.Endpoints); n < 1 || n > 2*sc.Endpoints || h < 1 {
			t.Fatalf("change %d: %d endpoints, %d healthy", i, n, h)
		}
		if got := w.clusters[c].state[serviceKey(s)]; got != sh {
			t.Fatalf("change %d: the cluster's state does not hold the new shard", i)
		}
	}
	// The publisher would take the newest state of each cluster.
	for _, cl := range w.clusters {
		if ch, ok := cl.out.Take(); !ok || ch.Set[serviceKey(0)] != cl.shards[0] {
			t.Errorf("cluster %s: the handed state is not the newest", cl.id)
		}
	}
	// A rolling restart step replaces a present address and is a new state.
	old := w.addresses(0, 1)[0]
	if ok, err := w.restartStep(0, 1, old); !ok || err != nil {
		t.Fatalf("restart step: %v, %v", ok, err)
	}
	if ok, _ := w.restartStep(0, 1, old); ok {
		t.Error("a replaced address was restarted twice")
	}
}
