package hub_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/navemesh/nave/hub"
)

// closedByServer says whether the server closes c within a deadline far
// longer than any bound the test sets (it reads, and drops, what comes).
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// The admin port holds what the gRPC ports hold: no connection that idles
// or never says what it wants, and a bounded number per peer.
func TestAdminPortClosesIdleConnections(t *testing.T) {
	h, _ := startHub(t, t.TempDir(), func(c *hub.Config) {
		c.Connections.AdminIdleTimeout = 200 * time.Millisecond
		c.Connections.HandshakeTimeout = 200 * time.Millisecond
	})
	dial := adminDialer(t, h)
	// A connection that sends no request is closed after the header timeout.
	if !closedByServer(t, dial()) {
		t.Error("a connection that sent nothing was kept open")
	}
	// A kept-alive connection is closed once idle.
	idle := dial()
	if _, err := io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %v, %v", resp, err)
	}
	resp.Body.Close()
	if !closedByServer(t, idle) {
		t.Error("an idle kept-alive connection was kept open")
	}
}

func TestAdminPortBoundsConnectionsPerPeer(t *testing.T) {
	h, _ := startHub(t, t.TempDir(), func(c *hub.Config) { c.Connections.AdminMaxConnectionsPerPeer = 4 })
	dial := adminDialer(t, h)
	// The fifth connection of one peer is closed on accept; the four stay.
	held := make([]net.Conn, 4)
	for i := range held {
		held[i] = dial()
	}
	if !closedByServer(t, dial()) {
		t.Error("a fifth connection from one peer was kept")
	}
	for _, c := range held {
		c.Close()
	}
	metrics := "http://" + h.AdminAddr.String() + "/metrics"
	awaitCond(t, "/metrics counting the admin connection refused", 10*time.Second, func() bool {
		resp, err := http.Get(metrics) // refused until the server has seen the four close
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		// At least the fifth: a scrape refused meanwhile counts too.
		return strings.Contains(string(b), `nave_refused_total{port="admin",reason="max_connections_per_peer"} `)
	})
}

// adminDialer opens raw connections to h's admin port, closed when the test ends.
func adminDialer(t *testing.T, h *hub.Hub) func() net.Conn {
	return func() net.Conn {
		c, err := net.Dial("tcp", h.AdminAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// A request's headers (gRPC metadata) are bounded on the gRPC ports: a
// client is told the bound, and 1 MiB of metadata never reaches the hub.
func TestGRPCPortsBoundRequestHeaders(t *testing.T) {
	h, _ := startHub(t, t.TempDir())
	for port, addr := range map[string]string{"xds": h.XDSAddr.String(), "federation": h.FederationAddr.String()} {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		big := metadata.AppendToOutgoingContext(ctx, "x-padding", strings.Repeat("x", 1<<20))
		// The first stream learns the server's settings; the large one follows.
		small, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatalf("%s: a stream with small headers: %v", port, err)
		}
		defer small.CloseSend()
		err = conn.Invoke(big, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
		if err == nil || !strings.Contains(err.Error(), "header list size") {
			t.Errorf("%s: 1 MiB of metadata: %v, want refused for its header list size", port, err)
		}
	}
}
