package hub_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/etcdtest"
	"github.com/navemesh/nave/internal/testpki"
)

// startTLSEtcd runs a real etcd that speaks only TLS and requires client
// certificates signed by ca.
func startTLSEtcd(t *testing.T, ca *testpki.CA) string {
	t.Helper()
	cert, key := ca.Server(t, "etcd", "127.0.0.1", "localhost")
	endpoint, _ := etcdtest.Start(t, &transport.TLSInfo{CertFile: cert, KeyFile: key, TrustedCAFile: ca.File, ClientCertAuth: true})
	return endpoint
}

// The hub reaches an external etcd over TLS with a client certificate
// (--etcd-ca, --etcd-cert, --etcd-key): the catalog records a spoke, and a
// cold start finds it there.
func TestHubOverEtcdWithTLS(t *testing.T) {
	ca := testpki.NewCA(t, "etcd")
	endpoint := startTLSEtcd(t, ca)
	cert, key := ca.Client(t, "nave-hub")
	tlsEtcd := func(c *hub.Config) {
		c.EtcdEndpoints = []string{endpoint}
		c.EtcdTLS = hub.EtcdTLS{CAFile: ca.File, CertFile: cert, KeyFile: key}
		c.SnapshotInterval = time.Hour // no snapshot of the cluster but the first, of the empty registry
		c.ColdStartWait = 30 * time.Second
	}
	h, stop := startHub(t, t.TempDir(), tlsEtcd)
	awaitFirstSave(t, h)
	hello(t, h, "east")
	h.NoSaveOnStop() // as after a crash: the restart is a cold start
	stop()
	// The catalog, in the TLS etcd, names east: the new hub waits for it before serving xDS.
	h, _ = startHub(t, t.TempDir(), tlsEtcd)
	if code, body := get(t, "http://"+h.AdminAddr.String()+"/readyz"); code != 503 || !strings.Contains(body, "waiting for 1 clusters") {
		t.Errorf("a hub whose TLS etcd's catalog names east: /readyz %d %q, want waiting for it", code, body)
	}

	// Half a client certificate is refused at start, with the reason.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := hub.DefaultConfig()
	cfg.DataDir, cfg.EtcdEndpoints = t.TempDir(), []string{endpoint}
	cfg.FederationAddr, cfg.XDSAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.EtcdTLS = hub.EtcdTLS{CAFile: ca.File, CertFile: cert}
	if _, err := hub.Start(ctx, cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--etcd-cert and --etcd-key go together") {
		t.Errorf("a client certificate without its key: %v, want refused", err)
	}
}
