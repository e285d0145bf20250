package e2e

import (
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

	err := publishWithToken(t, h.FederationAddr.String(), tokens["west"], "west")
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a plaintext spoke got %v, want Unavailable", err)
	}
}
