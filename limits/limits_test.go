package limits_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/limits"
)

type counts struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counts) refused(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[reason]++
}

func (c *counts) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.m)
}

func (c *counts) get(reason string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[reason]
}

// A peer over its share of connections is closed on accept; the others,
// and a connection freed, are served.
func TestListenerBoundsConnections(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &counts{m: map[string]int{}}
	lis := limits.Listener(raw, 3, 2, c.refused)
	defer lis.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			accepted <- conn
		}
	}()
	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		conn, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	closedByServer := func(conn net.Conn) bool {
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := conn.Read(make([]byte, 1))
		return err != nil && !isTimeout(err)
	}
	a1, a2 := dial("127.0.0.1"), dial("127.0.0.1")
	held := []net.Conn{<-accepted, <-accepted}
	a3 := dial("127.0.0.1") // a third from one peer
	if !closedByServer(a3) || c.get(limits.ReasonConnectionsPerPeer) != 1 {
		t.Fatalf("a peer's third connection was not refused (%v)", c)
	}
	dial("127.0.0.2")
	held = append(held, <-accepted)
	b2 := dial("127.0.0.2") // a fourth on the port
	if !closedByServer(b2) || c.get(limits.ReasonConnections) != 1 {
		t.Fatalf("the port's fourth connection was not refused (%v)", c)
	}
	held[0].Close() // one of 127.0.0.1's ends: it may connect again
	dial("127.0.0.1")
	select {
	case <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("a freed slot was not reused")
	}
	_, _ = a1, a2
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func serve(t *testing.T, opts ...grpc.ServerOption) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func TestStreamsPerPeer(t *testing.T) {
	c := &counts{m: map[string]int{}}
	client := serve(t, grpc.StreamInterceptor(limits.StreamsPerPeer(2, limits.PeerKey, c.refused)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted || c.get(limits.ReasonStreamsPerPeer) != 1 {
		t.Fatalf("a third stream: %v (%v)", err, c)
	}
}

// A stream whose first message does not come in time ends with
// DeadlineExceeded; one that sent it goes on.
func TestFirstMessageWithin(t *testing.T) {
	c := &counts{m: map[string]int{}}
	var done sync.WaitGroup
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.StreamInterceptor(limits.FirstMessageWithin(200*time.Millisecond, c.refused)))
	desc := grpc.ServiceDesc{ServiceName: "t.Echo", HandlerType: (*any)(nil), Streams: []grpc.StreamDesc{{
		StreamName: "Echo", ClientStreams: true, ServerStreams: true,
		// Like go-control-plane's: it reads requests and never looks at
		// the stream's context.
		Handler: func(_ any, ss grpc.ServerStream) error {
			done.Add(1)
			defer done.Done()
			for {
				var m healthpb.HealthCheckRequest
				if err := ss.RecvMsg(&m); err != nil {
					return nil // as go-control-plane does when its requests end
				}
				if err := ss.SendMsg(&healthpb.HealthCheckResponse{}); err != nil {
					return err
				}
			}
		},
	}}}
	s.RegisterService(&desc, nil)
	go func() { _ = s.Serve(lis) }()
	defer s.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	open := func() grpc.ClientStream {
		st, err := conn.NewStream(context.Background(), &desc.Streams[0], "/t.Echo/Echo")
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	silent := open()
	if err := silent.RecvMsg(&healthpb.HealthCheckResponse{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a silent stream: %v, want DeadlineExceeded", err)
	}
	talking := open()
	if err := talking.SendMsg(&healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // past the deadline
	if err := talking.SendMsg(&healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := talking.RecvMsg(&healthpb.HealthCheckResponse{}); err != nil {
			t.Fatalf("a stream that spoke in time was ended: %v", err)
		}
	}
	if c.get(limits.ReasonSilent) != 1 {
		t.Fatalf("refusals %v", c)
	}
}

// At its bound, an HTTP listener closes the connection that has waited
// longest without a request in progress for a new one (a probe is never
// kept out by idle connections, from however many addresses); with every
// connection busy with a request, a new one is refused.
func TestHTTPListenerMakesRoomByClosingAWaitingConnection(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &counts{m: map[string]int{}}
	lis := limits.NewHTTPListener(raw, 3, 0, c.refused)
	busy, release, idled := make(chan struct{}, 10), make(chan struct{}), make(chan struct{}, 10)
	connState := func(c net.Conn, st http.ConnState) {
		lis.ConnState(c, st)
		if st == http.StateIdle {
			idled <- struct{}{}
		}
	}
	srv := &http.Server{ConnState: connState, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/busy" {
			busy <- struct{}{}
			<-release
		}
		fmt.Fprint(w, "ok")
	})}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close() })

	type client struct {
		net.Conn
		r *bufio.Reader
	}
	dial := func() client {
		t.Helper()
		conn, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return client{conn, bufio.NewReader(conn)}
	}
	get := func(cl client, path string) error {
		if _, err := fmt.Fprintf(cl, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
			return err
		}
		resp, err := http.ReadResponse(cl.r, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}

	// Three kept-alive connections, idle after a request each, one after another.
	var idle []client
	for range 3 {
		cl := dial()
		if err := get(cl, "/"); err != nil {
			t.Fatal(err)
		}
		<-idled
		idle = append(idle, cl)
	}
	// A fourth is served: the one idle longest makes room.
	probe := dial()
	if err := get(probe, "/"); err != nil {
		t.Fatalf("a new connection at the bound, with idle ones held: %v", err)
	}
	if _, err := idle[0].r.ReadByte(); err == nil {
		t.Error("the connection idle longest is still open")
	}
	if err := get(idle[1], "/"); err != nil {
		t.Errorf("the second idle connection was closed too: %v", err)
	}
	if n := c.get(limits.ReasonEvictedIdle); n != 1 {
		t.Errorf("%d connections evicted (%v), want 1", n, c)
	}

	// Every connection busy with a request: a new one is refused.
	for _, cl := range []client{idle[1], idle[2], probe} {
		if _, err := fmt.Fprint(cl, "GET /busy HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		<-busy
	}
	late := dial()
	if err := get(late, "/"); err == nil {
		t.Error("a connection beyond the bound, with every held one busy, was served")
	}
	if n := c.get(limits.ReasonConnections); n != 1 {
		t.Errorf("%d refused at the bound (%v), want 1", n, c)
	}
	close(release)
}

// The connection closed for a new one is of the address holding the most:
// a peer that fills the port loses its own connections, not one kept by a
// peer with a single connection, however long that one has waited.
func TestHTTPListenerEvictsFromTheAddressHoldingTheMost(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &counts{m: map[string]int{}}
	lis := limits.NewHTTPListener(raw, 3, 0, c.refused)
	idled := make(chan struct{}, 10)
	srv := &http.Server{ConnState: func(conn net.Conn, st http.ConnState) {
		lis.ConnState(conn, st)
		if st == http.StateIdle {
			idled <- struct{}{}
		}
	}, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close() })
	type client struct {
		net.Conn
		r *bufio.Reader
	}
	get := func(cl client) error {
		if _, err := fmt.Fprint(cl, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(cl.r, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-idled
		return err
	}
	keptAlive := func(from string) client {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		conn, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		cl := client{conn, bufio.NewReader(conn)}
		if err := get(cl); err != nil {
			t.Fatalf("from %s: %v", from, err)
		}
		return cl
	}
	lone := keptAlive("127.0.0.2") // waits longest
	heavy := []client{keptAlive("127.0.0.3"), keptAlive("127.0.0.3")}
	keptAlive("127.0.0.4") // a probe: room is made
	if _, err := heavy[0].r.ReadByte(); err == nil {
		t.Error("the heavier address's older connection is still open")
	}
	if n := c.get(limits.ReasonEvictedIdle); n != 1 {
		t.Fatalf("%d evicted (%v), want 1", n, c)
	}
	if err := get(lone); err != nil {
		t.Errorf("the lone connection that waited longest was closed: %v", err)
	}
}
