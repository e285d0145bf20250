package limits

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/navemesh/nave/internal/testpki"
)

// scripted is a stand-in for a TLS handshake, in two rounds: each reads
// a byte from the peer, then computes until the test lets it go. The
// first byte names the connection. It records every computation begun.
type scripted struct {
	credentials.TransportCredentials // only ServerHandshake and Clone are used
	mu        sync.Mutex
	events    []string
	gates     map[byte]chan struct{}
	computing atomic.Int32
	most      atomic.Int32
}

func newScripted(names string) *scripted {
	s := &scripted{gates: map[byte]chan struct{}{}}
	for i := range len(names) {
		s.gates[names[i]] = make(chan struct{})
	}
	return s
}

func (s *scripted) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	var name byte
	for round := '1'; round <= '2'; round++ {
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			return nil, nil, err
		}
		if round == '1' {
			name = b[0]
		}
		n := s.computing.Add(1)
		for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
		}
		s.mu.Lock()
		s.events = append(s.events, string([]byte{name, byte(round)}))
		s.mu.Unlock()
		<-s.gates[name]
		s.computing.Add(-1)
	}
	return c, nil, nil
}

func (s *scripted) Clone() credentials.TransportCredentials { return s }

func (s *scripted) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

// await polls until cond holds (5 s at most).
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting: %s", what)
		}
	}
}

func (s *slots) waiting(i int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queues[i].Len()
}

// A handshake waiting on its peer holds no slot; a handshake under way
// gets the freed slot before a new one; once done, reads pass through.
func TestHandshakesTakeTurns(t *testing.T) {
	s := newScripted("ABC")
	creds := Handshakes(s, 1, 0, nil).(*handshakes)
	type result struct {
		conn net.Conn
		err  error
	}
	start := func() (net.Conn, chan result) {
		server, client := net.Pipe()
		done := make(chan result, 1)
		go func() {
			conn, _, err := creds.ServerHandshake(server)
			done <- result{conn, err}
		}()
		t.Cleanup(func() { client.Close(); server.Close() })
		return client, done
	}
	send := func(c net.Conn, b ...byte) {
		go c.Write(b)
	}
	// C computes, then waits on its peer: its slot is free meanwhile.
	c, cDone := start()
	send(c, 'C')
	await(t, "C computing", func() bool { return len(s.log()) == 1 })
	s.gates['C'] <- struct{}{}
	await(t, "C reading", func() bool { return s.computing.Load() == 0 })
	a, aDone := start()
	send(a, 'A')
	await(t, "A computing while C waits on its peer", func() bool { return len(s.log()) == 2 })
	// B is new and waits; C hears from its peer and waits too, ahead of B.
	b, bDone := start()
	await(t, "B waiting", func() bool { return creds.slots.waiting(1) == 1 })
	send(c, 'x')
	await(t, "C waiting", func() bool { return creds.slots.waiting(0) == 1 })
	s.gates['A'] <- struct{}{} // A reads its second byte: C goes on, not B
	await(t, "C computing again", func() bool { return len(s.log()) == 3 })
	send(b, 'B', 'b')
	send(a, 'y')
	close(s.gates['C'])
	close(s.gates['A'])
	close(s.gates['B'])
	var cConn net.Conn
	for _, done := range []chan result{aDone, bDone, cDone} {
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		cConn = r.conn
	}
	got := s.log()
	want := []string{"C1", "A1", "C2"}
	for i, w := range want {
		if got[i] != w {
			t.Fatalf("computations in order %v, want %v first", got, want)
		}
	}
	if m := s.most.Load(); m != 1 {
		t.Errorf("%d handshakes computed at once, want 1", m)
	}
	// The slot is free again, and a finished connection's reads need none.
	if !creds.slots.take(false, time.Now().Add(time.Second)) {
		t.Fatal("the slot was not given back")
	}
	defer creds.slots.give()
	send(c, 'z')
	buf := make([]byte, 1)
	if _, err := io.ReadFull(cConn, buf); err != nil || buf[0] != 'z' {
		t.Fatalf("read %q, %v after the handshake, want z", buf, err)
	}
}

// A connection that cannot get a slot within the wait is closed and
// counted; the wait is from the connection's start.
func TestHandshakesRefuseAfterTheWait(t *testing.T) {
	s := newScripted("AB")
	var refused []string
	var mu sync.Mutex
	creds := Handshakes(s, 1, 100*time.Millisecond, func(reason string) {
		mu.Lock()
		defer mu.Unlock()
		refused = append(refused, reason)
	})
	server, client := net.Pipe()
	defer client.Close()
	go creds.ServerHandshake(server)
	go client.Write([]byte{'A'})
	await(t, "A computing", func() bool { return len(s.log()) == 1 })
	server2, client2 := net.Pipe()
	defer client2.Close()
	begin := time.Now()
	_, _, err := creds.ServerHandshake(server2)
	if !errors.Is(err, errHandshakeWait) {
		t.Fatalf("err %v, want %v", err, errHandshakeWait)
	}
	if waited := time.Since(begin); waited < 100*time.Millisecond {
		t.Errorf("refused after %s, want the 100ms wait", waited)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) != 1 || refused[0] != ReasonHandshakeWait {
		t.Errorf("refusals %v, want one %s", refused, ReasonHandshakeWait)
	}
	close(s.gates['A'])
}

// Real TLS handshakes through a gRPC server bounded to one at a time:
// every client gets in, and calls flow on the connections after.
func TestHandshakesWithTLS(t *testing.T) {
	ca := testpki.NewCA(t, "limits")
	certFile, keyFile := ca.Server(t, "server", "127.0.0.1")
	serverCert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	creds := Handshakes(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}}), 1, 10*time.Second, nil)
	srv := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	clientCreds, err := credentials.NewClientTLSFromFile(ca.File, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(clientCreds))
			if err != nil {
				errs <- err
				return
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for range 3 {
				if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
