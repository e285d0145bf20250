// Package limits bounds what one peer may take of a server: connections
// per port and per address, streams per peer, how long a new stream may
// stay silent, and how much of the log its refusals take (RefusalLog,
// Truncate). Every refusal is counted by its reason, and a refused stream
// gets a gRPC status saying why.
package limits

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/internal/streams"
)

// Reasons a connection or stream is refused.
const (
	ReasonConnections        = "max_connections"
	ReasonConnectionsPerPeer = "max_connections_per_peer"
	ReasonStreamsPerPeer     = "max_streams_per_peer"
	ReasonSilent             = "no_first_message"
	// ReasonEvictedIdle: a connection without a request in progress was
	// closed to make room for a new one (see HTTPListener).
	ReasonEvictedIdle = "evicted_idle"
)

// Refused is told about each refusal, with its reason.
type Refused func(reason string)

// Listener wraps lis so that it holds at most max connections (0: no
// bound), and at most perPeer from one IP address (0: no bound). A
// connection beyond either is closed as soon as it is accepted: the
// client sees its connection reset and retries later, while the
// connections already held go on undisturbed.
func Listener(lis net.Listener, max, perPeer int, refused Refused) net.Listener {
	return &listener{Listener: lis, max: max, perPeer: perPeer, refused: refused, byPeer: map[netip.Addr]int{}}
}

// HTTPListener is a Listener for an HTTP server whose ConnState is set to
// the listener's ConnState. At the total bound, a new connection is not
// refused while a connection without a request in progress is held (kept
// alive since its last request, or accepted and silent since): one of
// those is closed to make room for it, and counted as ReasonEvictedIdle.
// It is taken from the address holding the most connections (the one
// that has waited longest among its), so peers that fill the port from a
// few addresses, or many, lose their own connections first, and a health
// probe or a scraper, with a connection or two from its address, is
// served. The per-address bound still refuses.
type HTTPListener struct{ *listener }

// NewHTTPListener wraps lis as Listener does, for an HTTP server (see HTTPListener).
func NewHTTPListener(lis net.Listener, max, perPeer int, refused Refused) HTTPListener {
	l := Listener(lis, max, perPeer, refused).(*listener)
	l.waiting = map[*conn]uint64{}
	return HTTPListener{l}
}

// ConnState is the HTTP server's ConnState hook: it learns which
// connections have no request in progress.
func (l HTTPListener) ConnState(c net.Conn, st http.ConnState) {
	lc, ok := c.(*conn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch st {
	case http.StateNew, http.StateIdle:
		if !lc.closed {
			l.seq++
			l.waiting[lc] = l.seq
		}
	default:
		delete(l.waiting, lc)
	}
}

type listener struct {
	net.Listener
	max, perPeer int
	refused      Refused

	mu      sync.Mutex // guards what follows
	open    int
	byPeer  map[netip.Addr]int
	waiting map[*conn]uint64 // HTTPListener: connections without a request in progress, by when they began to wait
	seq     uint64
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := peerAddr(c.RemoteAddr())
		if reason := l.admit(addr); reason != "" {
			// Counted before the close, so a peer that sees its
			// connection refused finds the refusal in the metrics.
			if l.refused != nil {
				l.refused(reason)
			}
			c.Close()
			continue
		}
		return &conn{Conn: c, l: l, addr: addr}, nil
	}
}

func (l *listener) admit(addr netip.Addr) string {
	l.mu.Lock()
	var evicted *conn
	defer func() {
		l.mu.Unlock()
		if evicted != nil {
			if l.refused != nil {
				l.refused(ReasonEvictedIdle)
			}
			evicted.Conn.Close() // its server sees the connection end
		}
	}()
	switch {
	case l.waiting == nil && l.max > 0 && l.open >= l.max:
		return ReasonConnections
	case l.perPeer > 0 && l.byPeer[addr] >= l.perPeer:
		return ReasonConnectionsPerPeer
	case l.max > 0 && l.open >= l.max:
		if evicted = l.evictable(addr); evicted == nil {
			return ReasonConnections
		}
		l.releaseLocked(evicted)
	}
	l.open++
	l.byPeer[addr]++
	return ""
}

// evictable is the connection without a request in progress to close for
// a new one from addr: of the address holding the most connections (addr's
// count including the new one), the one that has waited longest; nil when
// none waits, or when making room would leave addr holding more than the
// address it takes from. Called with mu held.
func (l *listener) evictable(addr netip.Addr) *conn {
	held := func(a netip.Addr) int {
		if a == addr {
			return l.byPeer[a] + 1
		}
		return l.byPeer[a]
	}
	var pick *conn
	for c, since := range l.waiting {
		if pick == nil || held(c.addr) > held(pick.addr) || held(c.addr) == held(pick.addr) && since < l.waiting[pick] {
			pick = c
		}
	}
	if pick == nil || pick.addr != addr && held(pick.addr) < held(addr) {
		return nil
	}
	return pick
}

// releaseLocked lets c's place go, once. Called with mu held.
func (l *listener) releaseLocked(c *conn) {
	if c.closed {
		return
	}
	c.closed = true
	delete(l.waiting, c)
	l.open--
	if l.byPeer[c.addr]--; l.byPeer[c.addr] <= 0 {
		delete(l.byPeer, c.addr)
	}
}

type conn struct {
	net.Conn
	l      *listener
	addr   netip.Addr
	closed bool // its place is released; guarded by l.mu
}

func (c *conn) Close() error {
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

func peerAddr(a net.Addr) netip.Addr {
	if tcp, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(tcp.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// PeerKey names the peer of a stream for StreamsPerPeer: its address.
func PeerKey(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		return peerAddr(p.Addr).String()
	}
	return ""
}

// StreamsPerPeer returns an interceptor that refuses a stream when its
// peer (as key names it) already has max streams open, with
// ResourceExhausted saying so. max <= 0 bounds nothing.
func StreamsPerPeer(max int, key func(context.Context) string, refused Refused) grpc.StreamServerInterceptor {
	var mu sync.Mutex
	open := map[string]int{}
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if max <= 0 {
			return handler(srv, ss)
		}
		k := key(ss.Context())
		mu.Lock()
		if open[k] >= max {
			mu.Unlock()
			if refused != nil {
				refused(ReasonStreamsPerPeer)
			}
			return status.Errorf(codes.ResourceExhausted, "%s has %d streams open; at most %d per peer", k, max, max)
		}
		open[k]++
		mu.Unlock()
		defer func() {
			mu.Lock()
			if open[k]--; open[k] <= 0 {
				delete(open, k)
			}
			mu.Unlock()
		}()
		return handler(srv, ss)
	}
}

// FirstMessageWithin returns an interceptor that ends a stream whose
// client sends nothing within d of opening it, with DeadlineExceeded (its
// reads fail, so any handler ends). d <= 0 waits forever.
func FirstMessageWithin(d time.Duration, refused Refused) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if d <= 0 {
			return handler(srv, ss)
		}
		ctx, cancel := context.WithCancelCause(ss.Context())
		defer cancel(nil)
		w := &firstMessage{ServerStream: streams.WithContext(ss, ctx), raw: ss, got: make(chan struct{})}
		timer := time.AfterFunc(d, func() {
			select {
			case <-w.got:
			default:
				cancel(errSilent)
			}
		})
		defer timer.Stop()
		err := handler(srv, w)
		if context.Cause(ctx) == errSilent {
			if refused != nil {
				refused(ReasonSilent)
			}
			return status.Errorf(codes.DeadlineExceeded, "no request within %v of opening the stream", d)
		}
		return err
	}
}

var errSilent = errors.New("limits: no first message")

// firstMessage guards the first read; later ones go straight to the raw stream.
type firstMessage struct {
	grpc.ServerStream                   // reads end with the interceptor's context
	raw               grpc.ServerStream // what it wraps
	got               chan struct{}     // closed once a message arrived
	once              sync.Once
}

func (f *firstMessage) RecvMsg(m any) error {
	select {
	case <-f.got:
		return f.raw.RecvMsg(m)
	default:
	}
	err := f.ServerStream.RecvMsg(m)
	if err == nil {
		f.once.Do(func() { close(f.got) })
	}
	return err
}
