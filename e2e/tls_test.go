package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/testpki"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/spoke"
)

// With --tls-cert/--tls-key the federation server speaks only TLS: a spoke
// that trusts the hub's CA publishes, a plaintext one gets nowhere.
func TestFederationOverTLS(t *testing.T) {
	ca := testpki.NewCA(t, "nave")
	cert, key := ca.Server(t, "nave-hub", "127.0.0.1")
	h := startHub(t, func(c *hub.Config) { c.TLSCertFile, c.TLSKeyFile = cert, key })
	dir := filepath.Join(t.TempDir(), "east")
	writeService(t, dir, "echo", endpoint{xdstest.StartBackend(t, "east", "127.0.0.1"), "z1", true})
	startSpoke(t, h, "east", dir, "r1", func(c *spoke.Config) { c.HubCAFile = ca.File })
	await(t, "echo over TLS", func() bool { return len(h.clustersOf("default/echo")) == 1 })

	conn, err := grpc.NewClient(h.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: tokens["west"], AllowInsecure: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := fedv1.NewFederationClient(conn).Publish(ctx)
	if err == nil {
		_ = stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "west"}}})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a plaintext spoke got %v, want Unavailable", err)
	}
}
