package limits

import (
	"container/list"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// ReasonHandshakeWait: a new connection waited longer than its handshake
// timeout for its turn to compute.
const ReasonHandshakeWait = "handshake_wait"

// errHandshakeWait ends a handshake that never got its turn.
var errHandshakeWait = errors.New("limits: no handshake slot within the handshake timeout")

// Handshakes wraps a server's transport credentials so that at most n
// handshakes compute at once (n <= 0: no bound). A TLS handshake is
// mostly CPU (key exchange, signatures, the client's chain): ten thousand
// clients reconnecting at once would otherwise each get a goroutine
// computing, and everything else the process runs (the federation's
// sessions, the embedded etcd) would wait behind them in the scheduler's
// queue. A handshake gives its slot up while it waits on its peer, so
// the bound is on computation, not on round trips: slow clients do not
// hold back fast ones. A handshake under way gets the next free slot
// before a new one, so that work begun is finished rather than abandoned
// to a timeout. A connection that cannot get a slot within wait of its
// start is closed, counted with ReasonHandshakeWait.
func Handshakes(creds credentials.TransportCredentials, n int, wait time.Duration, refused Refused) credentials.TransportCredentials {
	if n <= 0 {
		return creds
	}
	return &handshakes{TransportCredentials: creds, slots: newSlots(n), wait: wait, refused: refused}
}

type handshakes struct {
	credentials.TransportCredentials
	slots   *slots
	wait    time.Duration
	refused Refused
}

func (h *handshakes) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c := &turnConn{Conn: raw, h: h}
	if h.wait > 0 {
		c.deadline = time.Now().Add(h.wait)
	}
	if err := c.take(false); err != nil {
		return nil, nil, err
	}
	conn, info, err := h.TransportCredentials.ServerHandshake(c)
	c.finish()
	return conn, info, err
}

func (h *handshakes) Clone() credentials.TransportCredentials {
	return &handshakes{TransportCredentials: h.TransportCredentials.Clone(), slots: h.slots, wait: h.wait, refused: h.refused}
}

// turnConn is a connection in its handshake: it holds a slot while the
// handshake computes and gives it up while it reads. Once finished it
// passes everything through.
type turnConn struct {
	net.Conn
	h        *handshakes
	deadline time.Time   // zero: wait as long as it takes
	held     bool        // owned by the handshake's goroutine
	done     atomic.Bool // the handshake is over: no slot business
}

func (c *turnConn) Read(b []byte) (int, error) {
	if c.done.Load() {
		return c.Conn.Read(b)
	}
	c.give()
	n, err := c.Conn.Read(b)
	if err != nil {
		return n, err
	}
	if err := c.take(true); err != nil {
		return 0, err
	}
	return n, nil
}

// take waits for a slot until the deadline; begun says the handshake is
// under way (it goes first).
func (c *turnConn) take(begun bool) error {
	if !c.h.slots.take(begun, c.deadline) {
		if c.h.refused != nil {
			c.h.refused(ReasonHandshakeWait)
		}
		return errHandshakeWait
	}
	c.held = true
	return nil
}

func (c *turnConn) give() {
	if c.held {
		c.held = false
		c.h.slots.give()
	}
}

// finish ends the handshake: the slot goes back, and reads pass through.
func (c *turnConn) finish() {
	c.give()
	c.done.Store(true)
}

// slots is a counting semaphore with two queues, each first come first
// served: a freed slot goes to the first waiter of the first queue, else
// of the second.
type slots struct {
	mu     sync.Mutex // guards what follows
	free   int
	queues [2]list.List // of chan struct{}: [0] begun, [1] new
}

func newSlots(n int) *slots { return &slots{free: n} }

// take waits for a slot until deadline (zero: no end) and says whether it
// got one; begun waits in the first queue.
func (s *slots) take(begun bool, deadline time.Time) bool {
	s.mu.Lock()
	if s.free > 0 {
		s.free--
		s.mu.Unlock()
		return true
	}
	q := &s.queues[1]
	if begun {
		q = &s.queues[0]
	}
	ch := make(chan struct{}, 1)
	e := q.PushBack(ch)
	s.mu.Unlock()
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-ch:
		return true
	case <-expired:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-ch: // handed a slot as the timer fired: pass it on
		s.giveLocked()
	default:
		q.Remove(e)
	}
	return false
}

func (s *slots) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.giveLocked()
}

func (s *slots) giveLocked() {
	for i := range s.queues {
		if e := s.queues[i].Front(); e != nil {
			s.queues[i].Remove(e)
			e.Value.(chan struct{}) <- struct{}{}
			return
		}
	}
	s.free++
}
