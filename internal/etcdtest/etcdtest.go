// Package etcdtest runs real, in-process, single-node etcd servers for tests.
package etcdtest

import (
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/navemesh/nave/internal/nettest"
)

// Start runs an etcd on free loopback ports until the test ends, or stop is
// called, and returns its client URL. With tls, clients reach it over TLS
// only (tls.ClientCertAuth: with a certificate its CA signed).
func Start(t testing.TB, tls *transport.TLSInfo) (endpoint string, stop func()) {
	t.Helper()
	s := StartServer(t, tls)
	return s.Endpoint, s.Stop
}

// Server is an etcd that can be stopped and started again on the same
// ports and data: an etcd that is down for a while, not lost.
type Server struct {
	Endpoint string
	cfg      *embed.Config
	mu       sync.Mutex
	etcd     *embed.Etcd // nil while stopped
}

// StartServer runs an etcd as Start does, until the test ends.
func StartServer(t testing.TB, tls *transport.TLSInfo) *Server {
	t.Helper()
	return StartTuned(t, tls, nil)
}

// StartTuned runs an etcd as StartServer does, with tune (when not nil)
// changing its configuration first (a smaller --max-request-bytes, say).
func StartTuned(t testing.TB, tls *transport.TLSInfo, tune func(*embed.Config)) *Server {
	t.Helper()
	dir := t.TempDir()
	clientURL, peerURL := freeURL(t), freeURL(t)
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = filepath.Join(dir, "data")
	if tls != nil {
		clientURL.Scheme = "https"
		cfg.ClientTLSInfo = *tls
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	// etcd logs through zap: keep it out of the test output.
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	if tune != nil {
		tune(cfg)
	}
	s := &Server{Endpoint: clientURL.String(), cfg: cfg}
	s.Restart(t)
	t.Cleanup(s.Stop)
	return s
}

// Stop stops the etcd; its data stays for Restart. Stopping a stopped etcd does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		s.etcd.Close()
		s.etcd = nil
	}
}

// Restart starts the etcd again on its ports and data, and returns once it
// is ready. Restarting a running etcd does nothing.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		return
	}
	e, err := embed.StartEtcd(s.cfg)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		t.Fatalf("etcd: %v", err)
	case <-time.After(60 * time.Second):
		e.Close()
		t.Fatal("etcd not ready after 60s")
	}
	s.etcd = e
}

// freeURL is an http URL on a free loopback port (see nettest.FreeAddr).
func freeURL(t testing.TB) url.URL {
	t.Helper()
	addr, err := nettest.FreeAddr()
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	return url.URL{Scheme: "http", Host: addr}
}
