package identity_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/internal/testpki"
)

// handshakes serves TLS handshakes under the store's ServerConfig and
// tells each refusal to refused; it returns the address.
func handshakes(t *testing.T, store *identity.Store, opts identity.ServerOptions) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", store.ServerConfig(opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				if conn.(*tls.Conn).Handshake() == nil {
					_, _ = conn.Write([]byte("ok"))
				}
			}()
		}
	}()
	return lis.Addr().String()
}

// dialTLS completes a handshake with the CA's roots, presenting certs, and
// reads the server's first bytes: with TLS 1.3 a refusal of the client's
// certificate shows only then.
func dialTLS(addr string, roots *x509.CertPool, certs []tls.Certificate) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr,
		&tls.Config{RootCAs: roots, Certificates: certs, ServerName: "127.0.0.1"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 2)
	_, err = conn.Read(buf)
	return err
}

// refusals records what ServerOptions.Refused is told.
type refusals struct {
	mu      sync.Mutex
	reasons []string
	errs    []error
	told    chan struct{}
}

func newRefusals() *refusals { return &refusals{told: make(chan struct{}, 100)} }

func (r *refusals) refused(reason string, err error) {
	r.mu.Lock()
	r.reasons, r.errs = append(r.reasons, reason), append(r.errs, err)
	r.mu.Unlock()
	r.told <- struct{}{}
}

func (r *refusals) get() ([]string, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reasons...), append([]error(nil), r.errs...)
}

// A real TLS client that presents no certificate where one is required
// is refused, and the refusal is told (so counted and logged) with reason
// no_client_certificate; where certificates are optional it goes through
// untold, and a client with a good certificate goes through everywhere.
func TestHandshakeWithoutClientCertificateIsTold(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	server := ca.Issue(t, "server", testpki.Cert{Hosts: []string{"127.0.0.1"}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	store, err := identity.Load(identity.Files{Cert: server.CertFile, Key: server.KeyFile, CA: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	roots := store.Material().Roots
	client := ca.Issue(t, "client", testpki.Cert{URI: "spiffe://td/ns/default/sa/client"})
	pair, err := tls.LoadX509KeyPair(client.CertFile, client.KeyFile)
	if err != nil {
		t.Fatal(err)
	}

	required := newRefusals()
	addr := handshakes(t, store, identity.ServerOptions{TrustDomain: "td", Refused: required.refused})
	if err := dialTLS(addr, roots, nil); err == nil {
		t.Fatal("a client without a certificate was let through where one is required")
	}
	select {
	case <-required.told:
	case <-time.After(30 * time.Second):
		t.Fatal("the handshake without a client certificate was refused untold")
	}
	reasons, errs := required.get()
	if len(reasons) != 1 || reasons[0] != "no_client_certificate" || !errors.Is(errs[0], identity.ErrNoClientCert) {
		t.Fatalf("told %v (%v), want one no_client_certificate", reasons, errs)
	}
	if err := dialTLS(addr, roots, []tls.Certificate{pair}); err != nil {
		t.Fatalf("a client with a good certificate: %v", err)
	}

	optional := newRefusals()
	addr = handshakes(t, store, identity.ServerOptions{TrustDomain: "td", ClientCertOptional: true, Refused: optional.refused})
	if err := dialTLS(addr, roots, nil); err != nil {
		t.Fatalf("a client without a certificate where it is optional: %v", err)
	}
	if err := dialTLS(addr, roots, []tls.Certificate{pair}); err != nil {
		t.Fatalf("a client with a good certificate where it is optional: %v", err)
	}
	if reasons, _ := optional.get(); len(reasons) != 0 {
		t.Fatalf("handshakes where certificates are optional were told refused: %v", reasons)
	}
	if reasons, _ := required.get(); len(reasons) != 1 {
		t.Fatalf("a good handshake was told refused: %v", reasons)
	}
}
