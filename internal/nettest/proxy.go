// Package nettest is a TCP proxy for tests that break the network on
// purpose: a load balancer in front of backends, which can stop sending a
// backend new connections, cut the ones it has, or black-hole all traffic.
package nettest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards each connection it accepts to the next backend that is up
// and accepts it (round robin), as a Kubernetes Service would. It lasts
// until the test ends.
type Proxy struct {
	// Addr is where clients connect (127.0.0.1:port).
	Addr string

	blackholed chan struct{} // closed by Blackhole

	mu       sync.Mutex // guards the fields below
	backends []string
	down     map[string]bool
	next     int
	open     map[net.Conn]string // client connections, by the backend they go to
	holed    bool
}

// NewProxy starts a proxy in front of backends (host:port).
func NewProxy(t testing.TB, backends ...string) *Proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: lis.Addr().String(), backends: backends, down: map[string]bool{},
		open: map[net.Conn]string{}, blackholed: make(chan struct{})}
	var conns sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); lis.Close(); conns.Wait() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			conns.Go(func() { p.serve(ctx, c) })
		}
	}()
	return p
}

// SetDown stops (or resumes) sending backend new connections, as a failing
// readiness check would.
func (p *Proxy) SetDown(backend string, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down[backend] = down
}

// Cut closes the client side of every connection to backend: clients see
// their connection end, while whatever they had sent is already in the
// backend's socket.
func (p *Proxy) Cut(backend string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, be := range p.open {
		if be == backend {
			c.Close()
		}
	}
}

// Blackhole stops forwarding in either direction without closing anything,
// as a network that drops packets would.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.holed {
		p.holed = true
		close(p.blackholed)
	}
}

func (p *Proxy) candidates() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for i := range p.backends {
		be := p.backends[(p.next+i)%len(p.backends)]
		if !p.down[be] {
			out = append(out, be)
		}
	}
	p.next++
	return out
}

func (p *Proxy) serve(ctx context.Context, client net.Conn) {
	defer client.Close()
	var up net.Conn
	var backend string
	for _, be := range p.candidates() {
		if c, err := net.DialTimeout("tcp", be, time.Second); err == nil {
			up, backend = c, be
			break
		}
	}
	if up == nil {
		return
	}
	defer up.Close()
	p.mu.Lock()
	p.open[client] = backend
	p.mu.Unlock()
	defer func() { p.mu.Lock(); delete(p.open, client); p.mu.Unlock() }()
	stop := context.AfterFunc(ctx, func() { client.Close(); up.Close() })
	defer stop()
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, client); done <- struct{}{} }()
	go func() { p.pipe(client, up); done <- struct{}{} }()
	<-done // either side ending ends both
}

func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-p.blackholed:
			continue // dropped
		default:
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}
