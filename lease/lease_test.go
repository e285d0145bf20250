package lease

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/internal/kubetest"
)

// Timing of most tests: a standby waits LeaseDuration; a leader cut off stops
// after RenewDeadline.
const (
	leaseDuration = 2 * time.Second
	renewDeadline = 1 * time.Second
	retryPeriod   = 200 * time.Millisecond
	// awaitTimeout bounds every wait for something that must happen; it is
	// generous because the tests run under -race on loaded machines.
	awaitTimeout = 20 * time.Second
)

func TestRunRejectsInvalidConfig(t *testing.T) {
	valid := Config{Name: "l", Identity: "a", LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second}
	leading := func(context.Context) {}
	for _, tc := range []struct {
		name  string
		store Store
		edit  func(*Config, *Callbacks)
		want  string
	}{
		{"no store", nil, func(*Config, *Callbacks) {}, "no Store"},
		{"no name", unusedStore{t}, func(c *Config, _ *Callbacks) { c.Name = "" }, "no Lease name"},
		{"no identity", unusedStore{t}, func(c *Config, _ *Callbacks) { c.Identity = "" }, "no identity"},
		{"no Leading", unusedStore{t}, func(_ *Config, cb *Callbacks) { cb.Leading = nil }, "no Leading callback"},
		{"zero RetryPeriod", unusedStore{t}, func(c *Config, _ *Callbacks) { c.RetryPeriod = 0 }, "RetryPeriod 0s is not positive"},
		{"negative RetryPeriod", unusedStore{t}, func(c *Config, _ *Callbacks) { c.RetryPeriod = -time.Second }, "not positive"},
		{"RenewDeadline = RetryPeriod", unusedStore{t}, func(c *Config, _ *Callbacks) { c.RenewDeadline = c.RetryPeriod }, "RenewDeadline 1s is not longer than RetryPeriod 1s"},
		{"RenewDeadline = LeaseDuration", unusedStore{t}, func(c *Config, _ *Callbacks) { c.RenewDeadline = c.LeaseDuration }, "LeaseDuration 3s is not longer than RenewDeadline 3s"},
		{"RenewDeadline > LeaseDuration", unusedStore{t}, func(c *Config, _ *Callbacks) { c.LeaseDuration = time.Second }, "LeaseDuration 1s is not longer than RenewDeadline 2s"},
		{"zero value", unusedStore{t}, func(c *Config, _ *Callbacks) { *c = Config{} }, "no Lease name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, cb := valid, Callbacks{Leading: leading}
			tc.edit(&cfg, &cb)
			err := Run(t.Context(), tc.store, cfg, cb)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
	if err := validate(unusedStore{t}, DefaultConfig(), Callbacks{Leading: leading}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("DefaultConfig without a name or identity: %v, want ErrInvalidConfig", err)
	}
	def := DefaultConfig()
	def.Name, def.Identity = "l", "a"
	if err := validate(unusedStore{t}, def, Callbacks{Leading: leading}); err != nil {
		t.Errorf("DefaultConfig with a name and identity: %v", err)
	}
}

// TestRunAfterCtxEnded: a Run whose ctx has already ended sends no request
// and never calls Leading.
func TestRunAfterCtxEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	cfg := Config{Name: "l", Identity: "a", LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second}
	err := Run(ctx, unusedStore{t}, cfg, Callbacks{Leading: func(context.Context) { t.Error("Leading called after ctx ended") }})
	if err != nil {
		t.Fatalf("Run: %v, want nil", err)
	}
}

// TestRun runs candidates against a real kube-apiserver, each subtest on a
// Lease of its own.
func TestRun(t *testing.T) {
	cluster := kubetest.StartClusters(t, "east")[0]
	// The spoke's own client: its errors must mean what the API server says.
	client, err := kubeclient.New(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	leases := client.Leases("default")

	t.Run("OneOfTwoLeads", func(t *testing.T) {
		t.Parallel()
		el := newElection(t, leases, "one-of-two")
		a := el.run("a", leases, el.config("a", leaseDuration), nil)
		b := el.run("b", leases, el.config("b", leaseDuration), nil)
		var leader, follower *candidate
		select {
		case <-a.started:
			leader, follower = a, b
		case <-b.started:
			leader, follower = b, a
		case <-time.After(awaitTimeout):
			t.Fatal("no candidate leads")
		}
		// The follower knows who leads, and the leader has renewed since.
		awaitCondition(t, "the follower has seen the leader", func() bool { return slices.Contains(follower.leaders(), leader.id) })
		first := el.get()
		awaitCondition(t, "the leader renews the Lease", func() bool { return !el.get().Spec.RenewTime.Equal(first.Spec.RenewTime) })
		if follower.hasLed() {
			t.Fatalf("%s leads too", follower.id)
		}
		l := el.get()
		if got := holderOf(l); got != leader.id {
			t.Fatalf("the Lease is held by %q, want the leader %s", got, leader.id)
		}
		if got := ptrValue(l.Spec.LeaseDurationSeconds); got != 2 {
			t.Errorf("leaseDurationSeconds %d, want 2", got)
		}
		if got := ptrValue(l.Spec.LeaseTransitions); got != 0 {
			t.Errorf("leaseTransitions %d, want 0 (created by its first holder)", got)
		}
		if l.Spec.AcquireTime == nil || l.Spec.RenewTime == nil || l.Spec.RenewTime.Before(l.Spec.AcquireTime) {
			t.Errorf("acquireTime %v, renewTime %v: want both, renewed after acquired", l.Spec.AcquireTime, l.Spec.RenewTime)
		}
		if got := leader.leaders(); !slices.Equal(got, []string{leader.id}) {
			t.Errorf("the leader's NewLeader got %q, want only itself", got)
		}
	})

	t.Run("HandoverAfterLeadingReturns", func(t *testing.T) {
		t.Parallel()
		// Longer than usual, so that a handover by release (within
		// RetryPeriod) is told apart from one by expiry (LeaseDuration).
		const leaseDuration = 3 * time.Second
		el := newElection(t, leases, "handover")
		var holderAtReturn atomic.Value
		a := el.run("a", leases, el.config("a", leaseDuration), func(ctx context.Context, c *candidate) {
			<-ctx.Done()
			// Winding down takes longer than LeaseDuration: a renews meanwhile.
			time.Sleep(leaseDuration + 500*time.Millisecond)
			holderAtReturn.Store(holderOf(el.get()))
		})
		awaitClosed(t, a.started, "a leads")
		b := el.run("b", leases, el.config("b", leaseDuration), nil)
		awaitCondition(t, "b has seen a lead", func() bool { return slices.Contains(b.leaders(), "a") })

		a.cancel()
		awaitClosed(t, a.ended, "a's Leading returns")
		if got := holderAtReturn.Load(); got != "a" {
			t.Fatalf("as a's Leading returned, the Lease was held by %q, want a (released only after)", got)
		}
		awaitClosed(t, b.started, "b leads")
		aEnd, bStart := a.end(), b.start()
		if !bStart.After(aEnd) {
			t.Fatalf("b started leading at %v, before a's Leading returned at %v", bStart, aEnd)
		}
		t.Logf("b started leading %v after a's Leading returned", bStart.Sub(aEnd).Round(time.Millisecond))
		if gap := bStart.Sub(aEnd); gap > leaseDuration/2 {
			t.Errorf("b led %v after a's Leading returned, want well under LeaseDuration %v (a releases the Lease)", gap, leaseDuration)
		}
		if err := a.wait(t); err != nil {
			t.Errorf("a's Run: %v, want nil", err)
		}
		if got := b.leaders(); !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("b's NewLeader got %q, want [a b]", got)
		}
		if got := ptrValue(el.get().Spec.LeaseTransitions); got != 1 {
			t.Errorf("leaseTransitions %d, want 1", got)
		}
	})

	for _, hang := range []bool{true, false} {
		name := map[bool]string{true: "LeaderHangs", false: "LeaderFails"}[hang]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			el := newElection(t, leases, strings.ToLower(name))
			cutOff := &cutOffStore{Store: leases, hang: hang}
			a := el.run("a", cutOff, el.config("a", leaseDuration), nil)
			awaitClosed(t, a.started, "a leads")
			b := el.run("b", leases, el.config("b", leaseDuration), nil)
			awaitCondition(t, "b has seen a lead", func() bool { return slices.Contains(b.leaders(), "a") })
			awaitCondition(t, "a renews the Lease", func() bool { return cutOff.renewals() > 0 })

			cutOff.cut()
			awaitClosed(t, a.ended, "a's Leading ends")
			awaitClosed(t, b.started, "b leads")
			lastRenewal, aEnd, bStart := cutOff.lastRenewal(), a.end(), b.start()
			t.Logf("after a's last renewal: a stopped leading after %v, b started after %v",
				aEnd.Sub(lastRenewal).Round(time.Millisecond), bStart.Sub(lastRenewal).Round(time.Millisecond))
			// Run notes a renewal's time just before the Store does.
			if held := aEnd.Sub(lastRenewal); held < renewDeadline-100*time.Millisecond || held > renewDeadline+2*time.Second {
				t.Errorf("a led for %v after its last renewal, want RenewDeadline %v", held, renewDeadline)
			}
			if waited := bStart.Sub(lastRenewal); waited < leaseDuration {
				t.Errorf("b led %v after a's last renewal, want at least LeaseDuration %v", waited, leaseDuration)
			}
			if !aEnd.Before(bStart) {
				t.Errorf("a led until %v, after b started at %v", aEnd, bStart)
			}
			if err := a.wait(t); err != nil {
				t.Errorf("a's Run: %v, want nil", err)
			}
			if n := cutOff.releases.Load(); n != 0 {
				t.Errorf("a tried %d times to release a Lease it lost", n)
			}
			if got := holderOf(el.get()); got != "b" {
				t.Errorf("the Lease is held by %q, want b", got)
			}
		})
	}

	for name, leading := range map[string]func(context.Context, *candidate){
		"LeadingReturnsReleases": func(context.Context, *candidate) {},
		"LeadingPanicsReleases":  func(context.Context, *candidate) { panic("the term failed") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			el := newElection(t, leases, strings.ToLower(name))
			var holderAtReturn string
			a := el.run("a", leases, el.config("a", leaseDuration), func(ctx context.Context, c *candidate) {
				holderAtReturn = holderOf(el.get())
				leading(ctx, c)
			})
			if err := a.wait(t); err != nil { // a's ctx has not ended: Run returns on its own
				t.Fatalf("Run: %v, want nil", err)
			}
			if !a.hasLed() {
				t.Fatal("Run returned without calling Leading")
			}
			if holderAtReturn != "a" {
				t.Errorf("while a led, the Lease was held by %q", holderAtReturn)
			}
			l := el.get()
			if got := holderOf(l); got != "" {
				t.Errorf("after Run, the Lease is held by %q, want released", got)
			}
			if got := ptrValue(l.Spec.LeaseDurationSeconds); got != 1 {
				t.Errorf("released Lease: leaseDurationSeconds %d, want 1", got)
			}
		})
	}

	for name, skew := range map[string]time.Duration{"HolderClockAhead": time.Hour, "HolderClockBehind": -time.Hour} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			el := newElection(t, leases, strings.ToLower(name))
			el.create("x", time.Now().Add(skew), 3)
			started := time.Now()
			b := el.run("b", leases, el.config("b", leaseDuration), nil)
			awaitClosed(t, b.started, "b leads")
			if waited := b.start().Sub(started); waited < leaseDuration {
				t.Errorf("b took the Lease from x %v after it first could have seen it, want at least LeaseDuration %v", waited, leaseDuration)
			}
			if got := b.leaders(); !slices.Equal(got, []string{"x", "b"}) {
				t.Errorf("b's NewLeader got %q, want [x b]", got)
			}
			l := el.get()
			if got := ptrValue(l.Spec.LeaseTransitions); got != 4 {
				t.Errorf("leaseTransitions %d, want 4 (one more)", got)
			}
			if !l.Spec.AcquireTime.After(started) {
				t.Errorf("acquireTime %v, want after b started at %v", l.Spec.AcquireTime, started)
			}
		})
	}

	t.Run("RestartTakesOwnLease", func(t *testing.T) {
		t.Parallel()
		el := newElection(t, leases, "restart")
		el.create("a", time.Now(), 3)
		started := time.Now()
		a := el.run("a", leases, el.config("a", leaseDuration), nil)
		awaitClosed(t, a.started, "a leads")
		// Waiting for the Lease to expire would take at least LeaseDuration.
		if waited := a.start().Sub(started); waited >= leaseDuration {
			t.Errorf("a took its own Lease back after %v, want at once", waited)
		}
		if got := ptrValue(el.get().Spec.LeaseTransitions); got != 3 {
			t.Errorf("leaseTransitions %d, want 3 (no new holder)", got)
		}
	})

	t.Run("AnotherHolderTakesOver", func(t *testing.T) {
		t.Parallel()
		el := newElection(t, leases, "taken-over")
		a := el.run("a", leases, el.config("a", leaseDuration), nil)
		awaitClosed(t, a.started, "a leads")
		// An administrator (or a candidate with a broken clock) writes x in.
		l := el.get()
		l.Spec.HolderIdentity = ptr("x")
		l.Spec.RenewTime = ptr(metav1.NewMicroTime(time.Now()))
		if _, err := leases.Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		awaitClosed(t, a.ended, "a's Leading ends")
		if err := a.wait(t); err != nil {
			t.Errorf("Run: %v, want nil", err)
		}
		if got := holderOf(el.get()); got != "x" {
			t.Errorf("the Lease is held by %q, want x: a must not release a Lease it lost", got)
		}
		if got := a.leaders(); !slices.Equal(got, []string{"a", "x"}) {
			t.Errorf("a's NewLeader got %q, want [a x]", got)
		}
	})

	t.Run("LostReplyKeepsLeadership", func(t *testing.T) {
		t.Parallel()
		el := newElection(t, leases, "lost-reply")
		lossy := &lostReplyStore{Store: leases}
		// Recovering takes three round trips (the lost reply, a conflict and
		// a read, a renewal): a longer deadline than the others', so that a
		// slow API server on a loaded machine does not end a's leadership.
		const leaseDuration, renewDeadline = 6 * time.Second, 3 * time.Second
		a := el.run("a", lossy, el.config("a", leaseDuration), nil)
		awaitClosed(t, a.started, "a leads")
		lossy.loseNext.Store(true)
		// a's next renewal is written but its reply lost, so a's
		// resourceVersion is stale: a must read the Lease, find it still its
		// own, and renew over the newer version, past RenewDeadline.
		awaitCondition(t, "a reply is lost", func() bool { return lossy.lost.Load() != 0 })
		lostAt := time.Now()
		awaitCondition(t, "a renews past RenewDeadline", func() bool {
			if a.hasEnded() {
				t.Fatal("a stopped leading after one lost reply")
			}
			return lossy.renewedAfterLoss.Load() > 0 && time.Since(lostAt) > renewDeadline
		})
		if a.hasEnded() {
			t.Fatal("a stopped leading after one lost reply")
		}
		a.cancel()
		if err := a.wait(t); err != nil {
			t.Errorf("Run: %v, want nil", err)
		}
		if got := holderOf(el.get()); got != "" {
			t.Errorf("after Run, the Lease is held by %q, want released", got)
		}
	})

	t.Run("CtxEndsWhileWaiting", func(t *testing.T) {
		t.Parallel()
		el := newElection(t, leases, "ctx-ends-waiting")
		el.create("x", time.Now(), 3)
		b := el.run("b", leases, el.config("b", leaseDuration), nil)
		awaitCondition(t, "b has seen x lead", func() bool { return slices.Contains(b.leaders(), "x") })
		b.cancel()
		if err := b.wait(t); err != nil {
			t.Errorf("Run: %v, want nil", err)
		}
		if b.hasLed() {
			t.Error("b led")
		}
		if got := holderOf(el.get()); got != "x" {
			t.Errorf("the Lease is held by %q, want x", got)
		}
	})
}

// election is the candidates of one test for one Lease.
type election struct {
	t      *testing.T
	leases leaseClient
	name   string
	// leading counts the Leading calls running, over all candidates: more
	// than one at once fails the test.
	leading atomic.Int32
}

// leaseClient is the spoke's client of the test's Leases.
type leaseClient = *kubeclient.Typed[*coordinationv1.Lease, *coordinationv1.LeaseList]

func newElection(t *testing.T, leases leaseClient, name string) *election {
	return &election{t: t, leases: leases, name: name}
}

// config is the tests' timing for id: RenewDeadline half of leaseDuration.
func (el *election) config(id string, leaseDuration time.Duration) Config {
	return Config{
		Name: el.name, Identity: id,
		LeaseDuration: leaseDuration, RenewDeadline: leaseDuration / 2, RetryPeriod: retryPeriod,
		Log: slog.New(slog.NewTextHandler(el.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// get reads the Lease.
func (el *election) get() *coordinationv1.Lease {
	el.t.Helper()
	l, err := el.leases.Get(context.Background(), el.name, metav1.GetOptions{})
	if err != nil {
		el.t.Errorf("read Lease %s: %v", el.name, err)
		return &coordinationv1.Lease{}
	}
	return l
}

// create writes the Lease as held by holder, last renewed at renewed by its
// clock, after transitions changes of holder.
func (el *election) create(holder string, renewed time.Time, transitions int32) {
	el.t.Helper()
	at := metav1.NewMicroTime(renewed)
	_, err := el.leases.Create(el.t.Context(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: el.name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: &holder, LeaseDurationSeconds: ptr(int32(leaseDuration / time.Second)),
			AcquireTime: &at, RenewTime: &at, LeaseTransitions: &transitions,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		el.t.Fatal(err)
	}
}

// candidate is one Run under test and what its callbacks saw. Each Run
// calls Leading at most once.
type candidate struct {
	id      string
	cancel  context.CancelFunc
	started chan struct{} // closed when Leading starts
	ended   chan struct{} // closed when Leading returns
	done    chan struct{} // closed when Run returns
	err     error         // Run's result, once done is closed

	mu           sync.Mutex
	startedAt    time.Time
	endedAt      time.Time
	newLeaders   []string
	leadingCalls int
}

// run starts Run for id on store. leading is what Leading does (nil: wait for its ctx to end).
func (el *election) run(id string, store Store, cfg Config, leading func(context.Context, *candidate)) *candidate {
	if leading == nil {
		leading = func(ctx context.Context, _ *candidate) { <-ctx.Done() }
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{id: id, cancel: cancel, started: make(chan struct{}), ended: make(chan struct{}), done: make(chan struct{})}
	cb := Callbacks{
		Leading: func(ctx context.Context) {
			if n := el.leading.Add(1); n > 1 {
				el.t.Errorf("%s leads while another candidate does", id)
			}
			defer el.leading.Add(-1)
			c.mu.Lock()
			c.leadingCalls++
			calls := c.leadingCalls
			c.startedAt = time.Now()
			c.mu.Unlock()
			if calls > 1 {
				el.t.Errorf("Run of %s called Leading %d times", id, calls)
				return
			}
			close(c.started)
			defer close(c.ended)
			defer func() {
				c.mu.Lock()
				c.endedAt = time.Now()
				c.mu.Unlock()
			}()
			leading(ctx, c)
		},
		NewLeader: func(identity string) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.newLeaders = append(c.newLeaders, identity)
		},
	}
	go func() {
		defer close(c.done)
		c.err = Run(ctx, store, cfg, cb)
	}()
	el.t.Cleanup(func() {
		cancel()
		select {
		case <-c.done:
		case <-time.After(awaitTimeout):
			el.t.Errorf("Run of %s did not return after its ctx ended", id)
		}
	})
	return c
}

// wait returns Run's result once it has returned.
func (c *candidate) wait(t *testing.T) error {
	t.Helper()
	awaitClosed(t, c.done, "Run of "+c.id+" returns")
	select {
	case <-c.started:
		// Run returns only after Leading has.
		if !c.hasEnded() {
			t.Errorf("Run of %s returned before its Leading did", c.id)
		}
	default:
	}
	return c.err
}

func (c *candidate) leaders() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.newLeaders)
}

func (c *candidate) start() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.startedAt
}

func (c *candidate) end() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endedAt
}

func (c *candidate) hasLed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leadingCalls > 0
}

func (c *candidate) hasEnded() bool {
	select {
	case <-c.ended:
		return true
	default:
		return false
	}
}

// cutOffStore is a Store that works until cut, and then fails every call,
// or (hang) blocks it until its ctx ends, as if its candidate's node lost the
// API server.
type cutOffStore struct {
	Store
	hang     bool
	isCut    atomic.Bool
	releases atomic.Int32 // Updates that cleared the holder after the cut

	mu          sync.Mutex
	renewed     int       // successful Updates
	lastRenewed time.Time // when the last successful Update was called
}

func (s *cutOffStore) cut() { s.isCut.Store(true) }

func (s *cutOffStore) renewals() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewed
}

func (s *cutOffStore) lastRenewal() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastRenewed
}

func (s *cutOffStore) fail(ctx context.Context) error {
	if s.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return errors.New("cutOffStore: connection refused")
}

func (s *cutOffStore) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if s.isCut.Load() {
		return nil, s.fail(ctx)
	}
	return s.Store.Get(ctx, name, opts)
}

func (s *cutOffStore) Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if s.isCut.Load() {
		return nil, s.fail(ctx)
	}
	return s.Store.Create(ctx, l, opts)
}

func (s *cutOffStore) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	called := time.Now()
	if s.isCut.Load() {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			s.releases.Add(1)
		}
		return nil, s.fail(ctx)
	}
	got, err := s.Store.Update(ctx, l, opts)
	if err == nil {
		s.mu.Lock()
		s.renewed++
		s.lastRenewed = called
		s.mu.Unlock()
	}
	return got, err
}

// lostReplyStore is a Store whose next Update, once loseNext is set, is
// written but answered with a timeout, as when a reply is lost on the way.
type lostReplyStore struct {
	Store
	loseNext         atomic.Bool
	lost             atomic.Int32 // Updates written whose reply was lost
	renewedAfterLoss atomic.Int32 // successful Updates answered after a lost reply
}

func (s *lostReplyStore) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	got, err := s.Store.Update(ctx, l, opts)
	if err == nil && s.loseNext.CompareAndSwap(true, false) {
		s.lost.Add(1)
		return nil, apierrors.NewTimeoutError("lostReplyStore: the reply was lost", 0)
	}
	if err == nil && s.lost.Load() > 0 {
		s.renewedAfterLoss.Add(1)
	}
	return got, err
}

// unusedStore fails the test if Run sends it any request.
type unusedStore struct{ t *testing.T }

func (s unusedStore) Get(context.Context, string, metav1.GetOptions) (*coordinationv1.Lease, error) {
	s.t.Error("unexpected Get")
	return nil, errors.New("unusedStore")
}

func (s unusedStore) Create(context.Context, *coordinationv1.Lease, metav1.CreateOptions) (*coordinationv1.Lease, error) {
	s.t.Error("unexpected Create")
	return nil, errors.New("unusedStore")
}

func (s unusedStore) Update(context.Context, *coordinationv1.Lease, metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	s.t.Error("unexpected Update")
	return nil, errors.New("unusedStore")
}

func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(awaitTimeout):
		t.Fatalf("timed out after %v waiting until %s", awaitTimeout, what)
	}
}

func awaitCondition(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(awaitTimeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", awaitTimeout, what)
		}
	}
}
