package kubetest

import (
	"net"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
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

// freeLoopbackURL finds a free loopback port. Another process could take it
// before the server binds it; the server then fails with a clear error.
func freeLoopbackURL(t testing.TB) *url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return &url.URL{Scheme: "http", Host: l.Addr().String()}
}

// freePort is a free loopback TCP port, as freeLoopbackURL.
func freePort(t testing.TB) string {
	t.Helper()
	return freeLoopbackURL(t).Port()
}
