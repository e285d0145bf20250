package federation

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/internal/nettest"
)

// serveHubAt serves a hub on addr over store and epochs (kept across
// restarts, as a hub's are in etcd) until stop is called or the test ends.
func serveHubAt(t *testing.T, addr string, store *memStore, epochs *counterEpochs) (stop func()) {
	t.Helper()
	var lis net.Listener
	var err error
	// A restarted hub takes its predecessor's port: retry in case it is not free yet.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultHubConfig()
	srv := NewHubServer(cfg, HubWiring{}, store, epochs, slog.New(slog.DiscardHandler))
	g := grpc.NewServer(grpc.MaxRecvMsgSize(2*cfg.MaxMessageBytes), grpc.StreamInterceptor(AuthInterceptor(testTokens)))
	fedv1.RegisterFederationServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return g.Stop
}

// awaitStatus reads the publisher's statuses until one satisfies cond,
// failing the test after within; it returns that status.
func (p *publisher) awaitStatus(t *testing.T, within time.Duration, what string, cond func(SessionStatus) bool) SessionStatus {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case s := <-p.status:
			if cond(s) {
				return s
			}
		case <-timeout:
			t.Fatalf("not within %v: %s", within, what)
		}
	}
}

// TestPublisherReconnectsSoonAfterTheHubAnswersAgain: the hub goes away
// while the publisher's backoff grows toward a minute, and its
// connection's has reached one (grpc's own grows to 120 s by default);
// the hub comes back on the same address, and the publisher's next session
// starts soon after, not when either backoff ends.
func TestPublisherReconnectsSoonAfterTheHubAnswersAgain(t *testing.T) {
	addr, err := nettest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	store, epochs := newMemStore(), &counterEpochs{}
	stop := serveHubAt(t, addr, store, epochs)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(TokenCredentials{Token: testTokens["east"], AllowInsecure: true}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: time.Minute, Multiplier: 1, MaxDelay: time.Minute}, MinConnectTimeout: 20 * time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	cfg := spokeSetup{SpokeConfig: DefaultSpokeConfig()}
	cfg.MinBackoff, cfg.MaxBackoff, cfg.HubAddr = 10*time.Millisecond, time.Minute, addr
	p := startPublisher(t, conn, "east", cfg)
	p.states <- stateOf(testShard("east", "a", "10.0.0.1"))
	p.awaitAcked(t, 1)

	stop()
	// The session's end, then failed attempts: the connection backs off a
	// minute after the first, and the publisher's ceiling reaches 1.28 s.
	failures := 0
	p.awaitStatus(t, time.Minute, "eight sessions ended with the hub away", func(s SessionStatus) bool {
		if !s.Connected {
			failures++
		}
		return failures == 8
	})

	serveHubAt(t, addr, store, epochs)
	back := time.Now()
	p.awaitStatus(t, 15*time.Second, "a session with the hub back on its address", func(s SessionStatus) bool {
		return s.Connected && s.Synced && s.Services == 1
	})
	t.Logf("reconnected %v after the hub came back", time.Since(back).Round(time.Millisecond))
}
