package kubetest

import (
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/navemesh/nave/internal/nettest"
)

// startEtcd runs an in-process single-node etcd on free loopback ports until
// the test ends and returns its client URL. API servers share it, each under
// its own --etcd-prefix.
func startEtcd(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	clientURL, peerURL := freeLoopbackURL(t), freeLoopbackURL(t)
	cfg := embed.NewConfig()
	cfg.Name = "kubetest"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*clientURL}, []url.URL{*clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peerURL}, []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	// etcd logs through zap: keep it out of the test output.
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("etcd: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("etcd not ready after 60s")
	}
	return clientURL.String()
}

// freeLoopbackURL is an http URL on a free loopback port (see nettest.FreeAddr).
func freeLoopbackURL(t testing.TB) *url.URL {
	t.Helper()
	addr, err := nettest.FreeAddr()
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	return &url.URL{Scheme: "http", Host: addr}
}

// freePort is a free loopback TCP port, as freeLoopbackURL.
func freePort(t testing.TB) string {
	t.Helper()
	return freeLoopbackURL(t).Port()
}
