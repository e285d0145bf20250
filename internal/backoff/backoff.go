// Package backoff spaces a client's attempts to reach a server it lost: a
// full-jittered exponential delay between a minimum and a maximum, waited
// out while the server's TCP port is probed, so that the next attempt comes
// soon after the server answers again rather than at the end of a delay
// that grew while it was away.
package backoff

import (
	"context"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/connectivity"
)

// DefaultProbeInterval is how often a wait dials the server's port: a
// reconnection comes at most about this long after the port answers.
const DefaultProbeInterval = 250 * time.Millisecond

// DefaultProbeTimeout bounds one dial: long enough for a handshake with a
// server far away, short enough that a black-holed address (packets
// dropped, nothing refused) is tried again soon.
const DefaultProbeTimeout = time.Second

// Conn is what a wait needs of the client's gRPC connection to the server
// (*grpc.ClientConn has it): grpc backs off on its own between connection
// attempts (and fails calls at once meanwhile), so once the port answers
// the wait makes it connect at once and lasts until it has.
type Conn interface {
	ResetConnectBackoff()
	Connect()
	GetState() connectivity.State
	WaitForStateChange(ctx context.Context, from connectivity.State) bool
}

// Config configures a Backoff.
type Config struct {
	// Min is the first delay's ceiling, and Max the largest: each delay is
	// drawn at random up to the ceiling, which doubles on each failure.
	Min, Max time.Duration
	// Target is the server's address, probed while waiting: host:port, or
	// a gRPC target of the dns or passthrough scheme (dns:///host:port).
	// Empty, or another scheme, probes nothing: waits last their delay.
	Target string
	// Conn, if not nil, is the gRPC connection to Target: once the port
	// answers, it is told to connect at once (see Conn).
	Conn Conn
	// ProbeInterval is how often the port is dialled while waiting
	// (DefaultProbeInterval when 0); ProbeTimeout bounds each dial
	// (DefaultProbeTimeout when 0).
	ProbeInterval, ProbeTimeout time.Duration
}

// Backoff is the delay between a client's attempts to reach one server,
// and what its probes last found. It is owned by one goroutine (the
// client's loop), and waits one wait at a time.
type Backoff struct {
	min, max time.Duration
	addr     string // the probed host:port, "" for none
	conn     Conn
	interval time.Duration
	timeout  time.Duration
	ceiling  time.Duration
	// open: the last probe found the port answering. An answer then says
	// nothing new (the attempt failed for another reason: refused
	// credentials, a server not ready, a load balancer in front), so it
	// does not cut the wait short, and the backoff stands.
	open bool
	// rand returns a random number in [0, n); tests replace it.
	rand func(n int64) int64
	// probed, if not nil, is told each probe's result (tests await them).
	probed func(open bool)
}

// New returns a Backoff for cfg; a Min under a millisecond is taken as
// one, and a Max under Min as Min.
func New(cfg Config) *Backoff {
	b := &Backoff{min: max(cfg.Min, time.Millisecond), addr: probeAddr(cfg.Target), conn: cfg.Conn,
		interval: cfg.ProbeInterval, timeout: cfg.ProbeTimeout, rand: rand.Int64N}
	b.max = max(cfg.Max, b.min)
	if b.interval <= 0 {
		b.interval = DefaultProbeInterval
	}
	if b.timeout <= 0 {
		b.timeout = DefaultProbeTimeout
	}
	b.ceiling = b.min
	return b
}

// Next returns the delay before the next attempt, drawn at random in
// (0, ceiling] (full jitter: clients that failed together spread out), and
// doubles the ceiling up to Max.
func (b *Backoff) Next() time.Duration {
	d := time.Duration(b.rand(int64(b.ceiling))) + 1
	if b.ceiling > b.max/2 {
		b.ceiling = b.max
	} else {
		b.ceiling *= 2
	}
	return d
}

// Reset is for after a healthy session: the ceiling goes back to Min, and
// whether the port answers is unknown again, so the next wait ends at the
// first answer (the server that just went away may be back already).
func (b *Backoff) Reset() {
	b.ceiling, b.open = b.min, false
}

// Wait is one wait for the next attempt, started by Start.
type Wait struct {
	b      *Backoff
	cancel context.CancelFunc
	// done is closed by the wait's goroutine as it ends.
	done chan struct{}
	// Written by the wait's goroutine before done is closed.
	open, answered bool
	stopped        bool
}

// Start waits d (usually Next's delay) in a goroutine of its own, probing
// the port meanwhile: the wait ends when d has passed, when ctx ends, or
// as soon as the port answers, unless the last probe before found it
// answering already. Then, with a Conn, it tells the connection to connect
// at once and ends once it is ready (or d has passed). The caller selects
// on Done beside its own channels, then must call Stop.
func (b *Backoff) Start(ctx context.Context, d time.Duration) *Wait {
	ctx, cancel := context.WithTimeout(ctx, d)
	w := &Wait{b: b, cancel: cancel, done: make(chan struct{}), open: b.open}
	go w.run(ctx)
	return w
}

// Sleep waits as Start does and returns whether ctx is still live.
func (b *Backoff) Sleep(ctx context.Context, d time.Duration) bool {
	w := b.Start(ctx, d)
	<-w.Done()
	w.Stop()
	return ctx.Err() == nil
}

// Done is closed when the wait is over (its goroutine has ended then).
func (w *Wait) Done() <-chan struct{} { return w.done }

// Answered says the wait ended early because the port answered; valid
// once Done is closed.
func (w *Wait) Answered() bool {
	<-w.done
	return w.answered
}

// Stop ends the wait if it is not over, returns once its goroutine has
// ended, and records in the Backoff what the probes found: after the port
// answered the ceiling goes back to Min, since the server's failures while
// it was away say nothing of it now. Called from the Backoff's goroutine.
func (w *Wait) Stop() {
	w.cancel()
	<-w.done
	if w.stopped {
		return
	}
	w.stopped = true
	w.b.open = w.open
	if w.answered {
		w.b.ceiling = w.b.min
	}
}

// run probes the port, one dial at a time, until ctx (which ends with the
// delay) ends or the port answers anew.
func (w *Wait) run(ctx context.Context) {
	defer close(w.done)
	b := w.b
	if b.addr == "" {
		<-ctx.Done()
		return
	}
	// The first probe comes at a random point of the first interval: clients
	// that lost the server together do not probe (or return) in step.
	next := time.NewTimer(time.Duration(b.rand(int64(b.interval))))
	defer next.Stop()
	dialer := net.Dialer{Timeout: b.timeout}
	for {
		select {
		case <-ctx.Done():
			return
		case <-next.C:
		}
		c, err := dialer.DialContext(ctx, "tcp", b.addr)
		if ctx.Err() != nil {
			if err == nil {
				_ = c.Close()
			}
			return
		}
		wasOpen := w.open
		w.open = err == nil
		if b.probed != nil {
			b.probed(w.open)
		}
		if err == nil {
			_ = c.Close()
			if !wasOpen {
				w.answered = true
				w.connect(ctx)
				return
			}
		}
		next.Reset(b.interval)
	}
}

// connect makes the gRPC connection, if any, connect now rather than after
// its own backoff (meanwhile it fails calls at once), and returns once it
// is ready, closed, or ctx ends.
func (w *Wait) connect(ctx context.Context) {
	conn := w.b.conn
	if conn == nil {
		return
	}
	conn.ResetConnectBackoff()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready && s != connectivity.Shutdown; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

// probeAddr returns the host:port a TCP dial reaches the gRPC target at,
// or "" when there is none: a target of a scheme other than dns or
// passthrough (unix, xds) or with a port that is not a number. Without a
// port, grpc's dns resolver connects to 443.
func probeAddr(target string) string {
	rest := target
	if scheme, after, ok := strings.Cut(target, "://"); ok {
		if scheme != "dns" && scheme != "passthrough" {
			return ""
		}
		// Drop the authority (the DNS server to ask, for dns).
		if _, rest, ok = strings.Cut(after, "/"); !ok {
			return ""
		}
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		host, port = strings.TrimSuffix(strings.TrimPrefix(rest, "["), "]"), "443"
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 || !validHost(host) {
		return ""
	}
	return net.JoinHostPort(host, port)
}

// validHost says whether host is a name or an IP address (not what is left
// of a target of another scheme, such as unix:/path).
func validHost(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return true
	}
	return host != "" && !strings.ContainsAny(host, "/:[]")
}
