package replicas

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/navemesh/nave/internal/etcdtest"
	"github.com/navemesh/nave/internal/nettest"
)

// embeddedEtcd starts a single-node etcd, and returns a function that stops
// it and its endpoint. It is stopped when the test ends, if not earlier.
func embeddedEtcd(t *testing.T) (stop func(), endpoint string) {
	t.Helper()
	endpoint, stop = etcdtest.Start(t, nil)
	return stop, endpoint
}

// dialEtcd returns a client of endpoint, closed when the test ends.
func dialEtcd(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// leaderTerms records the terms of several Lead loops, and any two that overlap.
type leaderTerms struct {
	mu       sync.Mutex
	leading  string // the replica in a term, "" for none
	overlaps []string
	events   chan termEvent
}

type termEvent struct {
	id    string
	start bool
	at    time.Time
	why   error // why the term ended
}

func newLeaderTerms() *leaderTerms { return &leaderTerms{events: make(chan termEvent, 1000)} }

// term is the term function of replica id: it leads until its context ends.
func (l *leaderTerms) term(id string) func(context.Context) {
	return func(ctx context.Context) {
		l.begin(id)
		<-ctx.Done()
		l.end(id, context.Cause(ctx))
	}
}

func (l *leaderTerms) begin(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leading != "" {
		l.overlaps = append(l.overlaps, fmt.Sprintf("%s began while %s led", id, l.leading))
	}
	l.leading = id
	l.events <- termEvent{id: id, start: true, at: time.Now()}
}

func (l *leaderTerms) end(id string, why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leading == id {
		l.leading = ""
	}
	l.events <- termEvent{id: id, at: time.Now(), why: why}
}

// await returns the next term event, failing the test after timeout.
func (l *leaderTerms) await(t *testing.T, timeout time.Duration, what string) termEvent {
	t.Helper()
	select {
	case ev := <-l.events:
		return ev
	case <-time.After(timeout):
		t.Fatalf("no term event after %v: %s", timeout, what)
		return termEvent{}
	}
}

func (l *leaderTerms) checkNoOverlap(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.overlaps {
		t.Errorf("terms overlapped: %s", o)
	}
}

// replica is one Lead loop in a test.
type replica struct {
	id     string
	cancel context.CancelFunc
	done   chan error
}

func startReplica(t *testing.T, cli *clientv3.Client, cfg LeaderConfig, id string, term func(context.Context)) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{id: id, cancel: cancel, done: make(chan error, 1)}
	cfg.ID = id
	go func() { r.done <- Lead(ctx, cli, cfg, quietLog(), term) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the replica and waits for Lead to return; it fails the test
// unless Lead returns (a minute at most: a failure is a hang).
func (r *replica) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(time.Minute):
		t.Fatalf("Lead of %s did not return a minute after its context ended", r.id)
		return nil
	}
}

func testLeaderConfig(t *testing.T, ttl int) LeaderConfig {
	return LeaderConfig{Prefix: "/" + strings.ReplaceAll(t.Name(), "/", "_") + "/", SessionTTL: ttl,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
}

func currentLeader(t *testing.T, cli *clientv3.Client, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id, err := CurrentLeader(ctx, cli, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestLeadElectsOneAndHandsOverAtOnceWhenTheLeaderStops(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	cli := dialEtcd(t, endpoint)
	// A lease of a minute: a replica that leads within half of it leads
	// because the last leader resigned, not because its lease expired.
	cfg := testLeaderConfig(t, 60)
	if id := currentLeader(t, cli, cfg.Prefix); id != "" {
		t.Fatalf("CurrentLeader before any campaign = %q", id)
	}
	terms := newLeaderTerms()
	replicas := map[string]*replica{}
	for _, id := range []string{"hub-a", "hub-b", "hub-c"} {
		replicas[id] = startReplica(t, dialEtcd(t, endpoint), cfg, id, terms.term(id))
	}

	// Hand leadership over a few times: each time the leader stops, the next
	// one leads at once (it resigned), well within the TTL.
	first := terms.await(t, 10*time.Second, "first leader")
	if !first.start {
		t.Fatalf("first event %+v is not a term start", first)
	}
	leader := first.id
	for round := range 4 {
		if got := currentLeader(t, cli, cfg.Prefix); got != leader {
			t.Fatalf("round %d: CurrentLeader = %q, want %q", round, got, leader)
		}
		if err := replicas[leader].stop(t); err != nil {
			t.Errorf("Lead of %s returned %v after its context ended, want nil", leader, err)
		}
		end := terms.await(t, 30*time.Second, "the stopped leader's term ends")
		if end.start || end.id != leader {
			t.Fatalf("round %d: event %+v, want the end of %s's term", round, end, leader)
		}
		next := terms.await(t, 30*time.Second, "another replica leads before the stopped leader's lease could expire")
		if !next.start || next.id == leader {
			t.Fatalf("round %d: event %+v, want another replica's term to start", round, next)
		}
		// The stopped replica comes back, and campaigns like the others.
		replicas[leader] = startReplica(t, dialEtcd(t, endpoint), cfg, leader, terms.term(leader))
		leader = next.id
	}
	terms.checkNoOverlap(t)

	for _, r := range replicas {
		r.stop(t)
	}
	if id := currentLeader(t, cli, cfg.Prefix); id != "" {
		t.Errorf("CurrentLeader after every replica stopped = %q, want none", id)
	}
}

func TestLeaderTermEndsAtOnceWhenItsLeaseIsRevoked(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	admin := dialEtcd(t, endpoint)
	cfg := testLeaderConfig(t, 60) // the term must end long before the lease could expire
	terms := newLeaderTerms()
	startReplica(t, dialEtcd(t, endpoint), cfg, "hub-a", terms.term("hub-a"))
	if ev := terms.await(t, 10*time.Second, "hub-a leads"); !ev.start {
		t.Fatalf("event %+v, want a term start", ev)
	}

	// An operator (or etcd) revokes the leader's lease: the leader key goes, and the term with it.
	resp, err := admin.Get(context.Background(), electionPrefix(cfg.Prefix)+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("leader keys: %v, %v", resp, err)
	}
	revoked := time.Now()
	if _, err := admin.Revoke(context.Background(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	end := terms.await(t, 30*time.Second, "the term ends")
	if end.start {
		t.Fatalf("event %+v, want the term to end", end)
	}
	t.Logf("term ended %v after the revoke: %v", end.at.Sub(revoked), end.why)

	// hub-a campaigns again with a new session and leads again.
	if ev := terms.await(t, 10*time.Second, "hub-a leads again"); !ev.start {
		t.Fatalf("event %+v, want a new term", ev)
	}
	terms.checkNoOverlap(t)
}

func TestLeaderCutOffFromEtcdEndsItsTermBeforeAnotherLeads(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	const ttl = 2
	cfg := testLeaderConfig(t, ttl)
	terms := newLeaderTerms()
	target := strings.TrimPrefix(endpoint, "http://")
	proxy := nettest.NewProxy(t, target)
	startReplica(t, dialEtcd(t, "http://"+proxy.Addr), cfg, "hub-a", terms.term("hub-a"))
	if ev := terms.await(t, 10*time.Second, "hub-a leads"); !ev.start || ev.id != "hub-a" {
		t.Fatalf("event %+v, want hub-a to lead", ev)
	}
	startReplica(t, dialEtcd(t, endpoint), cfg, "hub-b", terms.term("hub-b"))

	// hub-a loses etcd; its lease expires in etcd within the TTL and hub-b
	// takes over. hub-a's term must have ended by then: terms never overlap.
	cut := time.Now()
	// hub-a loses etcd (its connections break, new ones are refused); the rest of the world keeps it.
	proxy.SetDown(target, true)
	proxy.Cut(target)
	end := terms.await(t, 30*time.Second, "hub-a's term ends")
	if end.start || end.id != "hub-a" {
		t.Fatalf("event %+v, want hub-a's term to end, before hub-b's began", end)
	}
	next := terms.await(t, 30*time.Second, "hub-b leads")
	if !next.start || next.id != "hub-b" {
		t.Fatalf("event %+v, want hub-b to lead", next)
	}
	t.Logf("hub-a's term ended %v after the cut (%v); hub-b led %v after the cut",
		end.at.Sub(cut), end.why, next.at.Sub(cut))
	terms.checkNoOverlap(t)
}

func TestLeaderTermEndsWhenEtcdStopsAndLeadStillReturns(t *testing.T) {
	stopEtcd, endpoint := embeddedEtcd(t)
	const ttl = 2
	terms := newLeaderTerms()
	r := startReplica(t, dialEtcd(t, endpoint), testLeaderConfig(t, ttl), "hub-a", terms.term("hub-a"))
	if ev := terms.await(t, 10*time.Second, "hub-a leads"); !ev.start {
		t.Fatalf("event %+v, want a term start", ev)
	}
	stopped := time.Now()
	go stopEtcd() // a graceful stop takes seconds; the term must not wait for it
	end := terms.await(t, 30*time.Second, "the term ends")
	if end.start {
		t.Fatalf("event %+v, want the term to end", end)
	}
	t.Logf("the term ended %v after etcd stopped: %v", end.at.Sub(stopped), end.why)
	// With etcd gone, Lead keeps campaigning (and failing) until told to stop, then returns promptly.
	if err := r.stop(t); err != nil {
		t.Errorf("Lead returned %v, want nil", err)
	}
}

func TestLeaderTermEndsWhenItsEtcdClientCloses(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	admin := dialEtcd(t, endpoint)
	cfg := testLeaderConfig(t, 60) // the term must end long before the lease could expire
	terms := newLeaderTerms()
	cli := dialEtcd(t, endpoint)
	a := startReplica(t, cli, cfg, "hub-a", terms.term("hub-a"))
	if ev := terms.await(t, 10*time.Second, "hub-a leads"); !ev.start {
		t.Fatalf("event %+v, want a term start", ev)
	}
	resp, err := admin.Get(context.Background(), electionPrefix(cfg.Prefix)+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("leader keys: %v, %v", resp, err)
	}
	startReplica(t, dialEtcd(t, endpoint), cfg, "hub-b", terms.term("hub-b"))

	closed := time.Now()
	cli.Close()
	end := terms.await(t, 30*time.Second, "hub-a's term ends")
	if end.start || end.id != "hub-a" {
		t.Fatalf("event %+v, want hub-a's term to end", end)
	}
	t.Logf("the term ended %v after the client closed: %v", end.at.Sub(closed), end.why)
	select {
	case err := <-a.done:
		if err == nil || !strings.Contains(err.Error(), "etcd client is closed") {
			t.Errorf("Lead returned %v, want an error saying the client is closed", err)
		}
		a.done <- err
	case <-time.After(time.Minute):
		t.Fatal("Lead did not return after its etcd client closed")
	}
	// hub-a could not revoke its lease; as it would expire, the operator's
	// revoke lets hub-b lead now, after hub-a's term ended.
	if _, err := admin.Revoke(context.Background(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	if ev := terms.await(t, 30*time.Second, "hub-b leads"); !ev.start || ev.id != "hub-b" {
		t.Fatalf("event %+v, want hub-b to lead", ev)
	}
	terms.checkNoOverlap(t)
}

func TestLeaderTermThatPanicsOrReturnsIsFollowedByANewCampaign(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	cfg := testLeaderConfig(t, 5)
	var mu sync.Mutex
	calls := 0
	started := make(chan int, 10)
	startReplica(t, dialEtcd(t, endpoint), cfg, "hub-a", func(ctx context.Context) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		started <- n
		switch n {
		case 1:
			panic("leader duty failed")
		case 2:
			return // a term that ends by itself: Lead resigns and campaigns again
		}
		<-ctx.Done()
	})
	for want := 1; want <= 3; want++ {
		select {
		case n := <-started:
			if n != want {
				t.Fatalf("term %d started, want %d", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("term %d did not start", want)
		}
	}
	if id := currentLeader(t, dialEtcd(t, endpoint), cfg.Prefix); id != "hub-a" {
		t.Errorf("CurrentLeader = %q, want hub-a", id)
	}
}

func TestLeadNeedsAnID(t *testing.T) {
	err := Lead(context.Background(), nil, LeaderConfig{}, quietLog(), func(context.Context) {})
	if err == nil || !strings.Contains(err.Error(), "ID is empty") {
		t.Errorf("Lead without an ID returned %v", err)
	}
}

func TestLeaderFenceHoldsExactlyWhileTheTermLeads(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	admin := dialEtcd(t, endpoint)
	if _, ok := LeaderFence(context.Background()); ok {
		t.Fatal("a context outside any term has a fence")
	}
	cfg := testLeaderConfig(t, 5)
	termCtxs := make(chan context.Context, 10)
	startReplica(t, dialEtcd(t, endpoint), cfg, "hub-a", func(ctx context.Context) {
		termCtxs <- ctx
		<-ctx.Done()
	})
	var term context.Context
	select {
	case term = <-termCtxs:
	case <-time.After(10 * time.Second):
		t.Fatal("no term")
	}
	fence, ok := LeaderFence(term)
	if !ok {
		t.Fatal("the term's context has no fence")
	}
	fencedPut := func() bool {
		resp, err := admin.Txn(context.Background()).If(fence).Then(clientv3.OpPut("/fenced", "x")).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	if !fencedPut() {
		t.Error("a fenced write failed while the term leads")
	}
	resp, err := admin.Get(context.Background(), electionPrefix(cfg.Prefix)+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("leader keys: %v, %v", resp, err)
	}
	if _, err := admin.Revoke(context.Background(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	<-term.Done()
	if fencedPut() {
		t.Error("a fenced write of an ended term succeeded")
	}
	// The next term has a fence of its own.
	select {
	case next := <-termCtxs:
		f2, _ := LeaderFence(next)
		fence = f2
		if !fencedPut() {
			t.Error("a fenced write of the next term failed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no next term")
	}
}
