package replicas

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
)

// gossipTestLog is a logger that writes to t while the test runs and drops
// whatever memberlist still says afterwards.
func gossipTestLog(t *testing.T) *slog.Logger {
	w := &gossipLogWriter{t: t}
	t.Cleanup(func() { // registered first, so it runs after the replicas have stopped
		w.mu.Lock()
		w.t = nil
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type gossipLogWriter struct {
	mu sync.Mutex
	t  *testing.T
}

func (w *gossipLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t != nil {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// gossipSummaries is a replica's summaries, changed by the test.
type gossipSummaries struct {
	mu   sync.Mutex
	sums map[registry.ClusterID]ClusterSummary
}

func (b *gossipSummaries) get() map[registry.ClusterID]ClusterSummary {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.sums)
}

func (b *gossipSummaries) set(s map[registry.ClusterID]ClusterSummary) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sums = s
}

type gossipReplica struct {
	*Membership
	stop func() // stops it (gracefully unless crash was set) and waits until it has stopped
	box  *gossipSummaries
}

// crash stops the replica as if its process died: no leave is gossiped.
func (r *gossipReplica) crash(t *testing.T) {
	t.Helper()
	r.skipLeave.Store(true)
	r.stop()
}

func gossipMeta(name string) MemberMeta {
	return MemberMeta{Federation: name + ":9090", XDS: name + ":18000", Admin: name + ":8080", Replication: name + ":9091"}
}

func startGossipReplica(t *testing.T, log *slog.Logger, name, bind string, seeds ...string) *gossipReplica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	box := &gossipSummaries{}
	m, err := StartMembership(ctx, MembershipConfig{
		Name: name, BindAddr: bind, Join: seeds, Meta: gossipMeta(name), Summaries: box.get, Fast: true,
	}, log)
	if err != nil {
		cancel()
		t.Fatalf("start %s: %v", name, err)
	}
	r := &gossipReplica{Membership: m, box: box}
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-m.Done():
			case <-time.After(10 * time.Second):
				t.Errorf("%s did not stop", name)
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

func (r *gossipReplica) addr(t *testing.T) string {
	t.Helper()
	for _, mem := range r.Members() {
		if mem.Self {
			return mem.Addr
		}
	}
	t.Fatal("no self member")
	return ""
}

func memberNames(ms []Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// awaitMembers polls r's members until ok holds, waking on Changes, and fails after a deadline.
func awaitMembers(t *testing.T, r *gossipReplica, what string, ok func([]Member) bool) []Member {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		ms := r.Members()
		if ok(ms) {
			return ms
		}
		select {
		case <-r.Changes():
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%s: %s; members are %v", r.name, what, memberNames(ms))
		}
	}
}

func membersAre(want ...string) func([]Member) bool {
	return func(ms []Member) bool { return slices.Equal(memberNames(ms), want) }
}

func TestMembershipJoinSharesMeta(t *testing.T) {
	log := gossipTestLog(t)
	a := startGossipReplica(t, log, "a", "127.0.0.1:0")
	seed := a.addr(t)
	b := startGossipReplica(t, log, "b", "127.0.0.1:0", seed)
	c := startGossipReplica(t, log, "c", "127.0.0.1:0", seed)

	for _, r := range []*gossipReplica{a, b, c} {
		ms := awaitMembers(t, r, "should see a, b and c", membersAre("a", "b", "c"))
		for _, mem := range ms {
			if mem.Meta != gossipMeta(mem.Name) {
				t.Errorf("%s sees %s with meta %+v, want %+v", r.name, mem.Name, mem.Meta, gossipMeta(mem.Name))
			}
			if mem.Self != (mem.Name == r.name) {
				t.Errorf("%s sees %s with Self=%v", r.name, mem.Name, mem.Self)
			}
			if _, _, err := net.SplitHostPort(mem.Addr); err != nil {
				t.Errorf("%s sees %s at %q: %v", r.name, mem.Name, mem.Addr, err)
			}
		}
	}
}

func TestMembershipSummariesPropagate(t *testing.T) {
	log := gossipTestLog(t)
	a := startGossipReplica(t, log, "a", "127.0.0.1:0")
	eastOnA := map[registry.ClusterID]ClusterSummary{"east": {Stamp: Stamp{Epoch: 3, Version: 17}, Digest: "0123456789ab", Home: true}}
	a.box.set(eastOnA)
	b := startGossipReplica(t, log, "b", "127.0.0.1:0", a.addr(t))
	westOnB := map[registry.ClusterID]ClusterSummary{
		"west": {Stamp: Stamp{Epoch: 1, Version: 2}, Digest: "ba9876543210", Home: true},
		"east": {Stamp: Stamp{Epoch: 3, Version: 16}, Digest: "aaaaaaaaaaaa"},
	}
	b.box.set(westOnB)

	sees := func(peer string, want map[registry.ClusterID]ClusterSummary) func([]Member) bool {
		return func(ms []Member) bool {
			for _, m := range ms {
				if m.Name == peer {
					return m.Summaries != nil && maps.Equal(m.Summaries, want)
				}
			}
			return false
		}
	}
	awaitMembers(t, a, "should hold b's summaries", sees("b", westOnB))
	awaitMembers(t, b, "should hold a's summaries", sees("a", eastOnA))
	awaitMembers(t, a, "should show its own summaries", sees("a", eastOnA))

	// A change travels on UpdateSummaries (and would on the next push/pull anyway).
	caughtUp := map[registry.ClusterID]ClusterSummary{
		"west": westOnB["west"],
		"east": {Stamp: Stamp{Epoch: 3, Version: 17}, Digest: "0123456789ab"},
	}
	b.box.set(caughtUp)
	b.UpdateSummaries()
	awaitMembers(t, a, "should hold b's new summaries", sees("b", caughtUp))

	// Members hands out copies.
	for _, m := range a.Members() {
		clear(m.Summaries)
	}
	awaitMembers(t, a, "should still hold b's summaries", sees("b", caughtUp))
}

func TestMembershipLeaveAndFailure(t *testing.T) {
	log := gossipTestLog(t)
	a := startGossipReplica(t, log, "a", "127.0.0.1:0")
	b := startGossipReplica(t, log, "b", "127.0.0.1:0", a.addr(t))
	c := startGossipReplica(t, log, "c", "127.0.0.1:0", a.addr(t))
	d := startGossipReplica(t, log, "d", "127.0.0.1:0", a.addr(t))
	for _, r := range []*gossipReplica{a, b, c, d} {
		awaitMembers(t, r, "should see everyone", membersAre("a", "b", "c", "d"))
	}

	start := time.Now()
	c.stop() // leaves gracefully
	for _, r := range []*gossipReplica{a, b, d} {
		awaitMembers(t, r, "should drop c, which left", membersAre("a", "b", "d"))
	}
	t.Logf("leave seen everywhere after %v", time.Since(start))

	start = time.Now()
	d.crash(t)
	for _, r := range []*gossipReplica{a, b} {
		awaitMembers(t, r, "should drop d, which died", membersAre("a", "b"))
	}
	t.Logf("failure detected everywhere after %v", time.Since(start))
}

// A replica that dies and comes back at the same address, with no seed, is
// found again by the others' reconnect, as after a network partition: no one
// calls Join.
func TestMembershipReconnectHealsPartition(t *testing.T) {
	log := gossipTestLog(t)
	a := startGossipReplica(t, log, "a", "127.0.0.1:0")
	b := startGossipReplica(t, log, "b", "127.0.0.1:0", a.addr(t))
	c := startGossipReplica(t, log, "c", "127.0.0.1:0", a.addr(t))
	for _, r := range []*gossipReplica{a, b, c} {
		awaitMembers(t, r, "should see everyone", membersAre("a", "b", "c"))
	}
	cAddr := c.addr(t)

	c.crash(t)
	for _, r := range []*gossipReplica{a, b} {
		awaitMembers(t, r, "should drop c, which died", membersAre("a", "b"))
	}

	start := time.Now()
	c = startGossipReplica(t, log, "c", cAddr) // no seeds: alone until the others redial it
	c.box.set(map[registry.ClusterID]ClusterSummary{"north": {Stamp: Stamp{Epoch: 2, Version: 1}, Digest: "feedfeedfeed", Home: true}})
	for _, r := range []*gossipReplica{a, b, c} {
		awaitMembers(t, r, "should see everyone again", membersAre("a", "b", "c"))
	}
	t.Logf("healed after %v", time.Since(start))
	awaitMembers(t, a, "should hold the new c's summaries", func(ms []Member) bool {
		return ms[2].Name == "c" && ms[2].Summaries["north"].Home
	})
}

func TestMembershipJoinsByDNSName(t *testing.T) {
	if _, err := net.LookupHost("localhost"); err != nil {
		t.Skipf("localhost does not resolve: %v", err)
	}
	log := gossipTestLog(t)
	a := startGossipReplica(t, log, "a", "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(a.addr(t))
	b := startGossipReplica(t, log, "b", "127.0.0.1:0", "localhost:"+port)
	awaitMembers(t, a, "should see b", membersAre("a", "b"))
	awaitMembers(t, b, "should see a", membersAre("a", "b"))
}

func TestMembershipRetriesSeedsUntilOneAnswers(t *testing.T) {
	log := gossipTestLog(t)
	// Find a port nothing listens on yet, for a seed that starts late.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seed := l.Addr().String()
	l.Close()

	b := startGossipReplica(t, log, "b", "127.0.0.1:0", seed)
	awaitMembers(t, b, "should be alone", membersAre("b"))
	a := startGossipReplica(t, log, "a", seed)
	awaitMembers(t, a, "should see b", membersAre("a", "b"))
	awaitMembers(t, b, "should see a", membersAre("a", "b"))
}

func TestMembershipRejectsBadConfig(t *testing.T) {
	log := gossipTestLog(t)
	for _, tc := range []struct {
		name string
		cfg  MembershipConfig
		want string
	}{
		{"no name", MembershipConfig{BindAddr: "127.0.0.1:0"}, "name is required"},
		{"bind host", MembershipConfig{Name: "a", BindAddr: "localhost:0"}, "must be an IP"},
		{"bad seed", MembershipConfig{Name: "a", BindAddr: "127.0.0.1:0", Join: []string{"a:b:c"}}, "not host:port"},
		{"meta", MembershipConfig{Name: "a", BindAddr: "127.0.0.1:0", Meta: MemberMeta{Admin: strings.Repeat("x", 600)}}, "over memberlist's limit"},
		{"key", MembershipConfig{Name: "a", BindAddr: "127.0.0.1:0", SecretKey: []byte("short")}, "key size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, err := StartMembership(ctx, tc.cfg, log)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if tc.name == "meta" && !errors.Is(err, ErrMetaTooLarge) {
				t.Errorf("%v is not ErrMetaTooLarge", err)
			}
		})
	}
}

func TestMembershipAdvertisesResolvedName(t *testing.T) {
	if _, err := net.LookupHost("localhost"); err != nil {
		t.Skipf("localhost does not resolve: %v", err)
	}
	log := gossipTestLog(t)
	ctx, cancel := context.WithCancel(context.Background())
	m, err := StartMembership(ctx, MembershipConfig{Name: "a", BindAddr: "127.0.0.1:0", AdvertiseAddr: "localhost:0", Fast: true}, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-m.Done() })
	self := m.Members()[0]
	if host, port, _ := net.SplitHostPort(self.Addr); host != "127.0.0.1" || port == "0" {
		t.Errorf("advertised %s, want 127.0.0.1 and the bound port", self.Addr)
	}
}

func TestMembershipEncrypted(t *testing.T) {
	log := gossipTestLog(t)
	key := []byte("0123456789abcdef")
	start := func(name string, seeds ...string) *gossipReplica {
		ctx, cancel := context.WithCancel(context.Background())
		m, err := StartMembership(ctx, MembershipConfig{Name: name, BindAddr: "127.0.0.1:0", Join: seeds, SecretKey: key, Fast: true}, log)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); <-m.Done() })
		return &gossipReplica{Membership: m}
	}
	a := start("a")
	b := start("b", a.addr(t))
	awaitMembers(t, a, "should see b", membersAre("a", "b"))
	awaitMembers(t, b, "should see a", membersAre("a", "b"))
}

// logRecords keeps the records it is given.
type logRecords struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r)
	return nil
}
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecords) WithGroup(string) slog.Handler      { return h }

func TestMembershipLogLevels(t *testing.T) {
	for _, tc := range []struct {
		line  string
		level slog.Level
		msg   string
	}{
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:1234\n", slog.LevelDebug, "Stream connection from=127.0.0.1:1234"},
		{"[INFO] memberlist: Suspect b has failed, no acks received\n", slog.LevelInfo, "Suspect b has failed, no acks received"},
		{"[WARN] memberlist: Refuting a dead message (from: a)\n", slog.LevelWarn, "Refuting a dead message (from: a)"},
		{"[ERR] memberlist: Push/Pull with b failed: EOF\n", slog.LevelError, "Push/Pull with b failed: EOF"},
		{"[ERR] Failed to shutdown transport: x\n", slog.LevelError, "Failed to shutdown transport: x"},
		{"[TRACE] memberlist: x\n", slog.LevelDebug, "x"},
		{"no level at all\n", slog.LevelInfo, "no level at all"},
		{"[ERR] memberlist: Failed to send gossip to 127.0.0.1:1: write udp: use of closed network connection\n", slog.LevelDebug,
			"Failed to send gossip to 127.0.0.1:1: write udp: use of closed network connection"},
	} {
		h := &logRecords{}
		newMemberlistLogger(slog.New(h)).Print(tc.line)
		if len(h.records) != 1 {
			t.Fatalf("%q: %d records", tc.line, len(h.records))
		}
		if r := h.records[0]; r.Level != tc.level || r.Message != tc.msg {
			t.Errorf("%q: got %v %q, want %v %q", tc.line, r.Level, r.Message, tc.level, tc.msg)
		}
	}
}

func TestMembershipSplitHostPort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		host string
		port int
	}{
		{":7946", "", 7946},
		{"10.0.0.1:7946", "10.0.0.1", 7946},
		{"10.0.0.1", "10.0.0.1", 0},
		{"[::1]:7946", "::1", 7946},
		{"::1", "::1", 0},
	} {
		host, port, err := splitHostPort(tc.in, "addr")
		if err != nil || host != tc.host || port != tc.port {
			t.Errorf("%q: got %q %d %v", tc.in, host, port, err)
		}
	}
	for in, want := range map[string]string{"hub": "hub:7946", "hub:1": "hub:1", "10.0.0.1": "10.0.0.1:7946", "::1": "[::1]:7946", "[::1]": "[::1]:7946", "[::1]:1": "[::1]:1"} {
		if got, err := seedAddr(in, 7946); got != want || err != nil {
			t.Errorf("seedAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"a:b:c", ":7946", "hub:0", "hub:x"} {
		if got, err := seedAddr(in, 7946); err == nil {
			t.Errorf("seedAddr(%q) = %q, want an error", in, got)
		}
	}
}

// A push/pull encoded before a change may arrive after the push of the
// change: it must not undo it. A restarted peer starts its numbering over.
func TestMembershipIgnoresStaleSummaries(t *testing.T) {
	m := &Membership{name: "a", log: slog.New(slog.DiscardHandler), changes: make(chan struct{}, 1),
		members: map[string]memberState{"b": {Member: Member{Name: "b"}}}}
	wire := func(boot, seq uint64, version uint64) []byte {
		b, _ := json.Marshal(summariesWire{Node: "b", Boot: boot, Seq: seq,
			Clusters: map[registry.ClusterID]summaryWireRow{"east": {Epoch: 1, Version: version}}})
		return b
	}
	held := func() uint64 { return m.Members()[0].Summaries["east"].Stamp.Version }
	for _, step := range []struct {
		name     string
		buf      []byte
		want     uint64
		signaled bool
	}{
		{"first", wire(7, 5, 50), 50, true},
		{"newer", wire(7, 6, 60), 60, true},
		{"stale", wire(7, 4, 40), 60, false},
		{"same again", wire(7, 7, 60), 60, false},
		{"restarted peer", wire(8, 1, 10), 10, true},
		{"from someone unknown", []byte(`{"n":"z","b":1,"s":1}`), 10, false},
		{"undecodable", []byte(`{`), 10, false},
	} {
		m.mergeSummaries(step.buf)
		if got := held(); got != step.want {
			t.Errorf("%s: holding version %d, want %d", step.name, got, step.want)
		}
		select {
		case <-m.changes:
			if !step.signaled {
				t.Errorf("%s: signaled a change", step.name)
			}
		default:
			if step.signaled {
				t.Errorf("%s: no change signaled", step.name)
			}
		}
	}
}

func TestMembershipSummariesEncodeCompactly(t *testing.T) {
	m := &Membership{name: "hub-0", boot: 1, summaries: func() map[registry.ClusterID]ClusterSummary {
		return map[registry.ClusterID]ClusterSummary{"east": {Stamp: Stamp{Epoch: 3, Version: 17}, Digest: "0123456789ab", Home: true}}
	}}
	got := string(m.encodeSummaries())
	if want := `{"n":"hub-0","b":1,"s":1,"c":{"east":{"e":3,"v":17,"d":"0123456789ab","h":true}}}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	meta, _ := json.Marshal(metaWire(gossipMeta("hub-0")))
	if want := `{"f":"hub-0:9090","x":"hub-0:18000","a":"hub-0:8080","r":"hub-0:9091"}`; string(meta) != want {
		t.Errorf("meta %s, want %s", meta, want)
	}
}

// A peer that dies and comes back under the same name at a new address is
// pushed to at its new address. Memberlist rewrites the address of the node
// it holds for that name (aliveNode, under its own lock), so the pusher must
// send to its own copy of the address: with memberlist's node, -race flags
// the push's read against that rewrite.
func TestMembershipPushesToAPeerThatCameBack(t *testing.T) {
	log := gossipTestLog(t)
	a := startGossipReplica(t, log, "a", "127.0.0.1:0")
	b := startGossipReplica(t, log, "b", "127.0.0.1:0", a.addr(t))
	for _, r := range []*gossipReplica{a, b} {
		awaitMembers(t, r, "should see a and b", membersAre("a", "b"))
	}
	sees := func(peer string, digest string) func([]Member) bool {
		return func(ms []Member) bool {
			for _, m := range ms {
				if m.Name == peer {
					return m.Summaries["east"].Digest == digest
				}
			}
			return false
		}
	}
	push := func(digest string) {
		a.box.set(map[registry.ClusterID]ClusterSummary{"east": {Stamp: Stamp{Epoch: 1, Version: 1}, Digest: digest, Home: true}})
		a.UpdateSummaries()
	}
	push("000000000001")
	awaitMembers(t, b, "should hold a's first summaries", sees("a", "000000000001"))

	oldAddr := b.addr(t)
	b.crash(t)
	awaitMembers(t, a, "should drop b, which died", membersAre("a"))
	b = startGossipReplica(t, log, "b", "127.0.0.1:0", a.addr(t))
	if b.addr(t) == oldAddr {
		t.Fatalf("b came back at its old address %s", oldAddr)
	}
	awaitMembers(t, a, "should see b again", membersAre("a", "b"))
	push("000000000002")
	awaitMembers(t, b, "should hold a's summaries at its new address", sees("a", "000000000002"))
	awaitMembers(t, a, "should know b's new address", func(ms []Member) bool {
		return len(ms) == 2 && ms[1].Addr == b.addr(t)
	})
}

// Pushes run while memberlist rewrites a peer's node: every re-advertisement
// of b (a new incarnation) makes a's memberlist assign b's address fields
// again. Reading memberlist's node outside its lock raced with that (-race
// caught it in three runs of three); the pusher reads its own copy.
func TestMembershipPushesWhilePeersReadvertise(t *testing.T) {
	log := gossipTestLog(t)
	a := startGossipReplica(t, log, "a", "127.0.0.1:0")
	b := startGossipReplica(t, log, "b", "127.0.0.1:0", a.addr(t))
	awaitMembers(t, a, "should see a and b", membersAre("a", "b"))
	const rounds = 150
	for i := range rounds {
		a.box.set(map[registry.ClusterID]ClusterSummary{"east": {Stamp: Stamp{Epoch: 1, Version: uint64(i + 1)}, Home: true}})
		a.UpdateSummaries()
		// Returns once the new incarnation is gossiped; a timeout only
		// means no gossip round took it yet (a queued one is replaced).
		_ = b.list.UpdateNode(time.Second)
	}
	awaitMembers(t, b, "should hold a's last summaries", func(ms []Member) bool {
		return ms[0].Name == "a" && ms[0].Summaries["east"].Stamp.Version == rounds
	})
}
