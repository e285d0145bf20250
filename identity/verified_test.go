package identity

import (
	"crypto/x509"
	"runtime"
	"testing"
	"time"

	"github.com/navemesh/nave/internal/testpki"
)

// The memo holds no certificate alive: once a connection's certificate is
// collected, its entry goes.
func TestVerifiedChainsForgetCollectedCertificates(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	store, err := Load(Files{CA: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := store.Material()
	is := ca.Issue(t, "east", testpki.Cert{URI: "spiffe://td/nave/cluster/east"})
	for range 100 {
		leaf, err := Load(Files{Cert: is.CertFile, Key: is.KeyFile}, nil) // a fresh parse, as each connection has
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Verify([]*x509.Certificate{leaf.Material().Leaf}, x509.ExtKeyUsageClientAuth, "td", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	held := func() int {
		m.verified.mu.Lock()
		defer m.verified.mu.Unlock()
		return len(m.verified.m)
	}
	if n := held(); n != 100 {
		t.Fatalf("%d entries for 100 verified connections", n)
	}
	for end := time.Now().Add(10 * time.Second); held() > 0; {
		if time.Now().After(end) {
			t.Fatalf("%d entries left after their certificates were collected", held())
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}
