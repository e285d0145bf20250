package backoff

import (
	"context"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/navemesh/nave/internal/nettest"
)

// never is a delay no test waits out: a wait that ends did so for another reason.
const never = time.Hour

// probes counts the probes' results of a Backoff.
type probes struct{ open, closed atomic.Int64 }

// newProbed returns a Backoff probing target every millisecond, and its probes' counts.
func newProbed(target string, conn Conn) (*Backoff, *probes) {
	b := New(Config{Min: time.Millisecond, Max: never, Target: target, Conn: conn, ProbeInterval: time.Millisecond})
	p := &probes{}
	b.probed = func(open bool) {
		if open {
			p.open.Add(1)
		} else {
			p.closed.Add(1)
		}
	}
	return b, p
}

// await polls cond until it holds, failing the test after 10 s.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never saw %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// awaitDone fails the test unless w ends within 10 s.
func awaitDone(t *testing.T, w *Wait, what string) {
	t.Helper()
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the wait did not end: %s", what)
	}
}

func isDone(w *Wait) bool {
	select {
	case <-w.Done():
		return true
	default:
		return false
	}
}

// freeAddr is a loopback address nothing listens on (until listen).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := nettest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// listen listens on addr until the test ends.
func listen(t *testing.T, addr string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	// Accept, so that the backlog never fills whatever the probes do.
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
}

func TestNextDoublesUpToMax(t *testing.T) {
	b := New(Config{Min: 100 * time.Millisecond, Max: time.Second})
	b.rand = func(n int64) int64 { return n - 1 } // the largest draw: the ceiling itself
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("largest delays %v, want %v", got, want)
	}
	b.rand = func(int64) int64 { return 0 }
	if d := b.Next(); d != 1 {
		t.Errorf("smallest delay %v, want 1ns (never none)", d)
	}
}

func TestNextIsJitteredWithinTheCeiling(t *testing.T) {
	b := New(Config{Min: time.Millisecond, Max: 64 * time.Millisecond})
	ceiling := time.Millisecond
	distinct := map[time.Duration]bool{}
	for range 1000 {
		d := b.Next()
		if d <= 0 || d > ceiling {
			t.Fatalf("delay %v outside (0, %v]", d, ceiling)
		}
		distinct[d] = true
		ceiling = min(2*ceiling, 64*time.Millisecond)
	}
	if len(distinct) < 100 {
		t.Errorf("%d distinct delays in 1000, want them spread out", len(distinct))
	}
}

func TestResetReturnsToMin(t *testing.T) {
	b := New(Config{Min: 10 * time.Millisecond, Max: time.Minute})
	b.rand = func(n int64) int64 { return n - 1 }
	for range 10 {
		b.Next()
	}
	b.open = true
	b.Reset()
	if d := b.Next(); d != 10*time.Millisecond {
		t.Errorf("after Reset the delay is %v, want Min (10ms)", d)
	}
	if b.open {
		t.Error("after Reset the port is still known to answer")
	}
}

func TestBoundsAreNormalized(t *testing.T) {
	b := New(Config{Max: -1})
	if b.min != time.Millisecond || b.max != time.Millisecond {
		t.Errorf("Min 0, Max -1 became %v, %v; want 1ms, 1ms", b.min, b.max)
	}
	b = New(Config{Min: time.Second, Max: time.Millisecond})
	if b.max != time.Second {
		t.Errorf("Max under Min became %v, want Min (1s)", b.max)
	}
	if b.interval != DefaultProbeInterval || b.timeout != DefaultProbeTimeout {
		t.Errorf("probe interval %v, timeout %v; want the defaults", b.interval, b.timeout)
	}
	// A huge Max does not overflow the ceiling.
	b = New(Config{Min: time.Hour, Max: time.Duration(1<<63 - 1)})
	for range 100 {
		if d := b.Next(); d <= 0 {
			t.Fatalf("delay %v with a huge Max", d)
		}
	}
}

func TestWaitLastsItsDelay(t *testing.T) {
	b := New(Config{Min: time.Millisecond})
	w := b.Start(context.Background(), time.Millisecond)
	awaitDone(t, w, "its delay passed")
	w.Stop()
	if w.Answered() {
		t.Error("a wait that probes nothing says the port answered")
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	b, _ := newProbed(freeAddr(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	w := b.Start(ctx, never)
	cancel()
	awaitDone(t, w, "its context ended")
	w.Stop()
	if w.Answered() {
		t.Error("a wait ended by its context says the port answered")
	}
}

func TestWaitEndsWhenThePortAnswersAgain(t *testing.T) {
	addr := freeAddr(t)
	b, p := newProbed(addr, nil)
	for range 20 {
		b.Next() // the ceiling grew while the server was away
	}
	w := b.Start(context.Background(), never)
	defer w.Stop()
	await(t, "a probe finding the port closed", func() bool { return p.closed.Load() > 0 })
	if isDone(w) {
		t.Fatal("the wait ended while the port was closed")
	}
	listen(t, addr)
	awaitDone(t, w, "the port answered")
	w.Stop()
	if !w.Answered() {
		t.Error("the wait ended early but does not say the port answered")
	}
	b.rand = func(n int64) int64 { return n - 1 }
	if d := b.Next(); d != b.min {
		t.Errorf("after the port answered the next delay is up to %v, want Min (%v)", d, b.min)
	}
}

// TestWhatTheProbesFoundOutlivesTheWait: the port found closed by one wait
// and answering at the first probe of the next ends the next.
func TestWhatTheProbesFoundOutlivesTheWait(t *testing.T) {
	addr := freeAddr(t)
	b, p := newProbed(addr, nil)
	w := b.Start(context.Background(), never)
	await(t, "a probe finding the port closed", func() bool { return p.closed.Load() > 0 })
	w.Stop()
	listen(t, addr)
	w = b.Start(context.Background(), never)
	defer w.Stop()
	awaitDone(t, w, "the port answered")
	if !w.Answered() {
		t.Error("the wait ended but does not say the port answered")
	}
}

// TestAnAnswerSeenBeforeDoesNotEndTheWait: a server that answers on its
// port but fails the attempts (refused credentials, not ready, a load
// balancer in front) gets the backoff; after Reset (a healthy session) the
// first answer ends the wait again.
func TestAnAnswerSeenBeforeDoesNotEndTheWait(t *testing.T) {
	addr := freeAddr(t)
	listen(t, addr)
	b, p := newProbed(addr, nil)
	// Not known to answer: the first answer ends the wait.
	w := b.Start(context.Background(), never)
	awaitDone(t, w, "the port answered")
	w.Stop()
	if !w.Answered() {
		t.Fatal("the first wait ended but does not say the port answered")
	}

	w = b.Start(context.Background(), never)
	before := p.open.Load()
	await(t, "three more probes finding the port answering", func() bool { return p.open.Load() >= before+3 })
	if isDone(w) {
		t.Fatal("the wait ended though the port answered before it too")
	}
	w.Stop()
	if w.Answered() {
		t.Error("a stopped wait says the port answered")
	}

	b.Reset()
	w = b.Start(context.Background(), never)
	defer w.Stop()
	awaitDone(t, w, "the port answered after Reset")
}

// fakeConn is a gRPC connection whose state the test sets.
type fakeConn struct {
	mu               sync.Mutex
	state            connectivity.State
	changed          chan struct{} // closed and replaced on each change
	resets, connects int
	waiting          bool // a WaitForStateChange is blocked
}

func newFakeConn(s connectivity.State) *fakeConn {
	return &fakeConn{state: s, changed: make(chan struct{})}
}

func (c *fakeConn) set(s connectivity.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state = s
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *fakeConn) ResetConnectBackoff() { c.mu.Lock(); c.resets++; c.mu.Unlock() }
func (c *fakeConn) Connect()             { c.mu.Lock(); c.connects++; c.mu.Unlock() }

func (c *fakeConn) GetState() connectivity.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

func (c *fakeConn) WaitForStateChange(ctx context.Context, from connectivity.State) bool {
	c.mu.Lock()
	if c.state != from {
		c.mu.Unlock()
		return true
	}
	ch := c.changed
	c.waiting = true
	c.mu.Unlock()
	defer func() { c.mu.Lock(); c.waiting = false; c.mu.Unlock() }()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// TestWaitConnectsTheConnection: once the port answers, the connection is
// told to connect now, and the wait lasts until it is ready.
func TestWaitConnectsTheConnection(t *testing.T) {
	addr := freeAddr(t)
	listen(t, addr)
	conn := newFakeConn(connectivity.TransientFailure) // and in grpc's own backoff
	b, _ := newProbed(addr, conn)
	w := b.Start(context.Background(), never)
	defer w.Stop()
	await(t, "the wait awaiting the connection", func() bool {
		conn.mu.Lock()
		defer conn.mu.Unlock()
		return conn.waiting
	})
	if isDone(w) {
		t.Fatal("the wait ended before the connection was ready")
	}
	conn.mu.Lock()
	resets, connects := conn.resets, conn.connects
	conn.mu.Unlock()
	if resets != 1 || connects != 1 {
		t.Errorf("the connection's backoff was reset %d times and it was told to connect %d times, want 1 and 1", resets, connects)
	}
	conn.set(connectivity.Connecting)
	conn.set(connectivity.Ready)
	awaitDone(t, w, "the connection is ready")
	if !w.Answered() {
		t.Error("the wait ended but does not say the port answered")
	}
}

// TestWaitsLeaveNoGoroutine: the wait's goroutine ends with it, however it ends.
func TestWaitsLeaveNoGoroutine(t *testing.T) {
	closed, open := freeAddr(t), freeAddr(t)
	listen(t, open)
	for range 20 {
		// Stopped while probing a closed port.
		b, p := newProbed(closed, nil)
		w := b.Start(context.Background(), never)
		await(t, "a probe", func() bool { return p.closed.Load() > 0 })
		w.Stop()
		// Stopped while the port answers, awaiting a connection that never gets ready.
		b, _ = newProbed(open, newFakeConn(connectivity.TransientFailure))
		w = b.Start(context.Background(), never)
		w.Stop()
		// Ended by its delay, and by its context.
		b, _ = newProbed(closed, nil)
		w = b.Start(context.Background(), time.Millisecond)
		<-w.Done()
		w.Stop()
		ctx, cancel := context.WithCancel(context.Background())
		w = b.Start(ctx, never)
		cancel()
		<-w.Done()
		w.Stop()
	}
	await(t, "no wait goroutine left", func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "backoff.(*Wait).run")
	})
}

func TestProbeAddr(t *testing.T) {
	for _, tc := range []struct{ target, want string }{
		{"hub.nave.svc:15010", "hub.nave.svc:15010"},
		{"127.0.0.1:15010", "127.0.0.1:15010"},
		{"[::1]:15010", "[::1]:15010"},
		{"dns:///hub.nave.svc:15010", "hub.nave.svc:15010"},
		{"dns://8.8.8.8/hub.nave.svc:15010", "hub.nave.svc:15010"},
		{"passthrough:///10.0.0.1:15010", "10.0.0.1:15010"},
		{"dns:///hub.example.com", "hub.example.com:443"},
		{"hub.example.com", "hub.example.com:443"},
		{"unix:///run/nave.sock", ""},
		{"unix:/run/nave.sock", ""},
		{"xds:///hub", ""},
		{"hub:http", ""},
		{"hub:0", ""},
		{"", ""},
	} {
		if got := probeAddr(tc.target); got != tc.want {
			t.Errorf("probeAddr(%q) = %q, want %q", tc.target, got, tc.want)
		}
	}
}

func TestSleep(t *testing.T) {
	b := New(Config{Min: time.Millisecond})
	if !b.Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep with a live context = false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if b.Sleep(ctx, time.Hour) {
		t.Error("Sleep with an ended context = true")
	}
}
