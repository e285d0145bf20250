package kubetest

import (
	"net/url"
	"testing"

	"github.com/navemesh/nave/internal/etcdtest"
	"github.com/navemesh/nave/internal/nettest"
)

// startEtcd runs an in-process single-node etcd until the test ends and
// returns its client URL. API servers share it, each under its own --etcd-prefix.
func startEtcd(t testing.TB) string {
	t.Helper()
	endpoint, _ := etcdtest.Start(t, nil)
	return endpoint
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
