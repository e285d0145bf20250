package federation

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/internal/logbuf"
	"github.com/navemesh/nave/registry"
)

// countingEpochs is an EpochIssuer that counts the epochs it issued.
type countingEpochs struct {
	counterEpochs
	mu     sync.Mutex
	issued int
}

func (c *countingEpochs) NextEpoch(ctx context.Context, id registry.ClusterID) (uint64, error) {
	c.mu.Lock()
	c.issued++
	c.mu.Unlock()
	return c.counterEpochs.NextEpoch(ctx, id)
}

func (c *countingEpochs) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.issued
}

// startHubOver serves a hub over store and epochs on loopback, logging to log.
func startHubOver(t *testing.T, cfg HubConfig, store Store, epochs EpochIssuer, log *slog.Logger) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewHubServer(cfg, HubWiring{}, store, epochs, log)
	g := grpc.NewServer(grpc.MaxRecvMsgSize(2*cfg.MaxMessageBytes), grpc.StreamInterceptor(AuthInterceptor(nil)))
	fedv1.RegisterFederationServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// hello opens a session with hello and returns its welcome, or how the hub
// ended it. It calls nothing of t but Cleanup: a goroutine may call it.
func hello(t *testing.T, conn *grpc.ClientConn, h *fedv1.Hello) (fedv1.Federation_PublishClient, *fedv1.Welcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := fedv1.NewFederationClient(conn).Publish(ctx)
	if err != nil {
		return nil, nil, err
	}
	// A refused stream may already be closed: Send then says io.EOF, and Recv says why.
	if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: h}}); err != nil && err != io.EOF {
		return nil, nil, err
	}
	m, err := stream.Recv()
	return stream, m.GetWelcome(), err
}

// A hello whose strings are over their bounds is refused before an epoch
// is issued or anything is stored, with InvalidArgument naming the field
// and not repeating it; at the bounds, a session begins.
func TestHelloStringsAreBounded(t *testing.T) {
	store, epochs := newMemStore(), &countingEpochs{}
	addr := startHubOver(t, DefaultHubConfig(), store, epochs, slog.New(slog.DiscardHandler))
	conn := dial(t, addr, "")
	for _, c := range []struct {
		what  string
		hello *fedv1.Hello
		want  string
	}{
		{"a build of 1.6 MiB", &fedv1.Hello{ClusterId: "east", SpokeBuild: strings.Repeat("b", 1600<<10)}, "spoke_build"},
		{"a build of 257 bytes", &fedv1.Hello{ClusterId: "east", SpokeBuild: strings.Repeat("b", MaxSpokeBuildBytes+1)}, "spoke_build"},
		{"a spoke ID of 1 MiB", &fedv1.Hello{ClusterId: "east", SpokeId: strings.Repeat("s", 1<<20)}, "spoke_id"},
		{"a spoke ID of 257 bytes", &fedv1.Hello{ClusterId: "east", SpokeId: strings.Repeat("s", MaxSpokeIDBytes+1)}, "spoke_id"},
		{"a network of 1 MiB", &fedv1.Hello{ClusterId: "east", Network: strings.Repeat("n", 1<<20)}, "network"},
		{"a network of 64 bytes", &fedv1.Hello{ClusterId: "east", Network: strings.Repeat("n", 64)}, "network"},
		{"a network with a slash", &fedv1.Hello{ClusterId: "east", Network: "net/1"}, "network"},
		{"a cluster ID of 1 MiB", &fedv1.Hello{ClusterId: strings.Repeat("e", 1<<20)}, "cluster ID"},
	} {
		_, welcome, err := hello(t, conn, c.hello)
		if welcome != nil || status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: welcome %v, %.200v; want InvalidArgument naming %s", c.what, welcome, err, c.want)
			continue
		}
		if n := len(status.Convert(err).Message()); n > 200 {
			t.Errorf("%s: the status message repeats the hello (%d bytes)", c.what, n)
		}
	}
	if n := epochs.count(); n != 0 {
		t.Fatalf("refused hellos were issued %d epochs", n)
	}
	if held, _ := store.Held(context.Background(), "east"); held != (Held{}) {
		t.Fatalf("refused hellos left %v", held)
	}
	_, welcome, err := hello(t, conn, &fedv1.Hello{ClusterId: "east", Network: fedString('n', 63),
		SpokeId: fedString('s', MaxSpokeIDBytes), SpokeBuild: fedString('b', MaxSpokeBuildBytes)})
	if welcome == nil {
		t.Fatalf("a hello at the bounds: %v", err)
	}
}

func fedString(c byte, n int) string { return strings.Repeat(string(c), n) }

// What spokes send that the hub refuses is logged with every value cut
// short, and a flood of refusals logs a few lines, not one per refusal.
func TestRefusalsLogLittle(t *testing.T) {
	var out logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	store := newMemStore()
	addr := startHubOver(t, DefaultHubConfig(), store, &counterEpochs{}, log)
	conn := dial(t, addr, "")
	huge := strings.Repeat("x", 100<<10)
	for range 50 {
		if _, _, err := hello(t, conn, &fedv1.Hello{ClusterId: "east", SpokeBuild: huge}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a hello with a 100 KiB build: %v", err)
		}
	}
	stream, welcome, err := hello(t, conn, &fedv1.Hello{ClusterId: "east"})
	if welcome == nil {
		t.Fatal(err)
	}
	for v := range uint64(50) {
		bad := ShardToProto(testShard("east", "ok", "10.0.0.1"))
		bad.Service.Name = huge // refused, named in the NACK and in the log
		m := sendUpdate(t, stream, &fedv1.Update{Nonce: "n", Version: v + 1, Upserts: []*fedv1.Shard{bad}})
		if m.GetNack() == nil {
			t.Fatalf("an update with a 100 KiB name answered %v", m)
		}
	}
	logged := out.String()
	if len(logged) > 32<<10 {
		t.Fatalf("100 refusals of 100 KiB values logged %d bytes", len(logged))
	}
	if n := strings.Count(logged, "refused a spoke's hello"); n == 0 || n > 10 {
		t.Errorf("50 refused hellos logged %d lines, want a few", n)
	}
	if n := strings.Count(logged, "update rejected"); n == 0 || n > 10 {
		t.Errorf("50 rejected updates logged %d lines, want a few", n)
	}
}

// beginBlocker is a store whose first Begin waits (as a store waiting for
// etcd does) until its context ends, and then fails with the context's error.
type beginBlocker struct {
	*memStore
	once    sync.Once
	waiting chan struct{} // closed once the first Begin waits
}

func (b *beginBlocker) Begin(ctx context.Context, s Session) (Held, error) {
	first := false
	b.once.Do(func() { first = true })
	if !first {
		return b.memStore.Begin(ctx, s)
	}
	close(b.waiting)
	<-ctx.Done()
	return Held{}, ctx.Err()
}

// A session superseded while it begins ends with Aborted saying so, as
// one superseded later does.
func TestSessionSupersededWhileItBegins(t *testing.T) {
	store := &beginBlocker{memStore: newMemStore(), waiting: make(chan struct{})}
	addr := startHubOver(t, DefaultHubConfig(), store, &counterEpochs{}, slog.New(slog.DiscardHandler))
	ended := make(chan error, 1)
	first := dial(t, addr, "")
	go func() {
		_, _, err := hello(t, first, &fedv1.Hello{ClusterId: "east", SpokeId: "old"})
		ended <- err
	}()
	select {
	case <-store.waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the first session never began")
	}
	if _, welcome, err := hello(t, dial(t, addr, ""), &fedv1.Hello{ClusterId: "east", SpokeId: "new"}); welcome == nil {
		t.Fatalf("the newer session: %v", err)
	}
	err := <-ended
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "superseded") {
		t.Fatalf("the session superseded while it began ended with %v, want Aborted saying it was superseded", err)
	}
}
