// Package xdstest has the real parts that tests of Nave's xDS paths share:
// gRPC backends that name themselves, grpc-go xDS clients with a locality of
// their own, and a poller that calls a client continuously and counts failures.
package xdstest

import (
	"context"
	"encoding/json"
	"fmt"
	"google.golang.org/grpc/connectivity"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/navemesh/nave/registry"
)

// BackendHeader is the response header in which a Backend says its name.
const BackendHeader = "x-backend"

// Backend is a real gRPC server answering health checks and naming itself in a response header.
type Backend struct {
	Name string
	Addr *net.TCPAddr
}

// StartBackend serves a backend on ip:0 until the test ends.
func StartBackend(t testing.TB, name, ip string) Backend {
	t.Helper()
	lis, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("backend %s: %v", name, err)
	}
	return ServeBackend(t, name, lis)
}

// ServeBackend serves a backend on lis until the test ends.
func ServeBackend(t testing.TB, name string, lis net.Listener) Backend {
	t.Helper()
	return ServeBackendWith(t, name, lis, nil)
}

// Behaviour is what a backend does with an RPC before answering it (the
// full method name): a non-nil error fails the RPC with it. It is called
// from many goroutines.
type Behaviour func(ctx context.Context, method string) error

// StartBackendWith is StartBackend for a backend that behaves as b says.
func StartBackendWith(t testing.TB, name, ip string, b Behaviour) Backend {
	t.Helper()
	lis, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("backend %s: %v", name, err)
	}
	return ServeBackendWith(t, name, lis, b)
}

// ServeBackendWith is ServeBackend for a backend that behaves as b says
// (nil: it answers every RPC). Unary and streaming RPCs alike carry the
// backend's name in their response header.
func ServeBackendWith(t testing.TB, name string, lis net.Listener, b Behaviour) Backend {
	t.Helper()
	behave := func(ctx context.Context, method string) error {
		if b != nil {
			if err := b(ctx, method); err != nil {
				// A failure sends no header first: its status travels
				// alone (Trailers-Only), so a client may retry it.
				return err
			}
		}
		return grpc.SetHeader(ctx, metadata.Pairs(BackendHeader, name))
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := behave(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}), grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := behave(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return h(srv, ss)
	}))
	healthpb.RegisterHealthServer(g, health.NewServer())
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return Backend{Name: name, Addr: lis.Addr().(*net.TCPAddr)}
}

// Bootstrap is a grpc-go xDS bootstrap for a node with the given locality (zero: none).
func Bootstrap(xdsAddr, node string, l registry.Locality) string {
	return BootstrapOn(xdsAddr, node, l, "")
}

// BootstrapOn is Bootstrap for a node that names its network in its
// metadata (NETWORK; "" names none).
func BootstrapOn(xdsAddr, node string, l registry.Locality, network registry.Network) string {
	var md map[string]string
	if network != "" {
		md = map[string]string{"NETWORK": string(network)}
	}
	return BootstrapWith(xdsAddr, node, l, md)
}

// BootstrapWith is Bootstrap for a node with the given metadata (string
// values, such as NETWORK and CLUSTER_ID).
func BootstrapWith(xdsAddr, node string, l registry.Locality, metadata map[string]string) string {
	extra := ""
	if !l.IsZero() {
		extra = fmt.Sprintf(`,"locality":{"region":%q,"zone":%q}`, l.Region, l.Zone)
	}
	if len(metadata) > 0 {
		b, _ := json.Marshal(metadata)
		extra += `,"metadata":` + string(b)
	}
	return fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":%q%s}}`,
		xdsAddr, node, extra)
}

// NewClientWith is NewClient for a node with the given metadata (see
// BootstrapWith), with more dial options.
func NewClientWith(t testing.TB, xdsAddr, node string, l registry.Locality, metadata map[string]string, target string, opts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	resolver, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(BootstrapWith(xdsAddr, node, l, metadata)))
	if err != nil {
		t.Fatalf("xDS resolver: %v", err)
	}
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver)}, opts...)
	conn, err := grpc.NewClient("xds:///"+target, opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// TLSFiles are the PEM files a grpc-go xDS client connects to its xDS
// server with: the CA it trusts and, for mTLS, its certificate and key.
type TLSFiles struct{ CA, Cert, Key string }

// NewClientTLS is NewClient for a client whose bootstrap connects to the
// xDS server over TLS (channel_creds type "tls", gRFC A65).
func NewClientTLS(t testing.TB, xdsAddr, node string, l registry.Locality, target string, files TLSFiles) healthpb.HealthClient {
	t.Helper()
	bootstrap := strings.Replace(Bootstrap(xdsAddr, node, l), `"channel_creds":[{"type":"insecure"}]`,
		fmt.Sprintf(`"channel_creds":[{"type":"tls","config":{"ca_certificate_file":%q,"certificate_file":%q,"private_key_file":%q}}]`, files.CA, files.Cert, files.Key), 1)
	resolver, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatalf("xDS resolver: %v", err)
	}
	conn, err := grpc.NewClient("xds:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// NewClient dials xds:///target through its own grpc-go xDS client, whose node has locality l.
func NewClient(t testing.TB, xdsAddr, node string, l registry.Locality, target string) healthpb.HealthClient {
	t.Helper()
	return NewClientOn(t, xdsAddr, node, l, "", target)
}

// NewClientOn is NewClient for a node on network (see BootstrapOn), with
// more dial options (a dialer that connects from another namespace, say).
func NewClientOn(t testing.TB, xdsAddr, node string, l registry.Locality, network registry.Network, target string, opts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	var md map[string]string
	if network != "" {
		md = map[string]string{"NETWORK": string(network)}
	}
	return NewClientWith(t, xdsAddr, node, l, md, target, opts...)
}

// Streak is how many consecutive answers AwaitOnly wants to see.
const Streak = 10

// Poller calls a client continuously and remembers who answered and what failed.
type Poller struct {
	name   string
	mu     sync.Mutex
	cond   *sync.Cond
	recent []string // the last answers, newest last
	seen   map[string]bool
	calls  int
	failed []error
	done   chan struct{}
}

// StartPoller waits for the client's first answer, then calls it in a loop
// until ctx ends. Failures count from the first answer on.
func StartPoller(ctx context.Context, t testing.TB, name string, c healthpb.HealthClient) *Poller {
	t.Helper()
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("%s: first call: %v", name, err)
	}
	p := &Poller{name: name, seen: map[string]bool{}, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	go func() {
		defer close(p.done)
		defer p.cond.Broadcast()
		for ctx.Err() == nil {
			var md metadata.MD
			_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.calls++
			if err != nil {
				p.failed = append(p.failed, err)
			} else if v := md.Get(BackendHeader); len(v) == 1 {
				p.seen[v[0]] = true
				p.recent = append(p.recent, v[0])
				if len(p.recent) > Streak {
					p.recent = p.recent[1:]
				}
			}
			p.mu.Unlock()
			p.cond.Broadcast()
		}
	}()
	t.Cleanup(func() { <-p.done })
	return p
}

// Await blocks until cond holds over what the poller saw; it fails the test when ctx ends first.
func (p *Poller) Await(ctx context.Context, t testing.TB, what string, cond func(recent []string, seen map[string]bool) bool) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for !cond(p.recent, p.seen) {
		if ctx.Err() != nil {
			t.Fatalf("%s: never saw %s; last answers %v", p.name, what, p.recent)
		}
		p.cond.Wait()
	}
}

// AwaitOnly waits until the last Streak answers all came from the given backends.
func (p *Poller) AwaitOnly(ctx context.Context, t testing.TB, backends ...string) {
	t.Helper()
	p.Await(ctx, t, "only "+strings.Join(backends, ","), func(recent []string, _ map[string]bool) bool {
		if len(recent) < Streak {
			return false
		}
		for _, b := range recent {
			if !slices.Contains(backends, b) {
				return false
			}
		}
		return true
	})
}

// Failures returns how many calls were made and the errors of those that failed.
func (p *Poller) Failures() (int, []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, slices.Clone(p.failed)
}

// Name is the name the poller was started with.
func (p *Poller) Name() string { return p.name }

// Answers says whether a gRPC server (an xDS server) answers at addr within
// 300ms: a hub that listens but does not serve xDS yet leaves gRPC's
// preface unanswered.
func Answers(addr string) bool {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			return false
		}
	}
	return true
}
