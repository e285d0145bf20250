package identity_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/internal/testpki"
)

func TestParse(t *testing.T) {
	for _, s := range []string{"spiffe://cluster.local/nave/cluster/east", "spiffe://td/ns/shop/sa/web"} {
		id, err := identity.Parse(s)
		if err != nil || id.String() != s {
			t.Errorf("Parse(%q) = %v, %v", s, id, err)
		}
	}
	for _, s := range []string{"", "https://td/x", "spiffe://td", "spiffe://td/", "spiffe://TD/x", "spiffe://td:8080/x", "spiffe://td/a//b", "spiffe://td/x?y=1", "spiffe://u@td/x",
		"spiffe://td/ns/a%2Fsa%2Fb", "spiffe://td/ns/../sa/x", "spiffe://td/./x"} {
		if _, err := identity.Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
	id := identity.ForCluster("td", "east")
	if c, ok := id.Cluster(); !ok || c != "east" {
		t.Errorf("%s names cluster %q, %v", id, c, ok)
	}
	if _, ok := id.Replica(); ok {
		t.Errorf("%s names a replica", id)
	}
	if r, ok := identity.ForReplica("td", "hub-0").Replica(); !ok || r != "hub-0" {
		t.Errorf("replica %q, %v", r, ok)
	}
	if _, ok := (identity.ID{TrustDomain: "td", Path: "/nave/cluster/Not_Valid"}).Cluster(); ok {
		t.Error("an invalid cluster ID is a cluster")
	}
}

func TestPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	write(t, path, `rules:
- identity: spiffe://td/ns/ops/sa/admin
  namespaces: ["*"]
- identity: spiffe://td/ns/*
  namespaces: [$namespace, shared]
- identity: spiffe://other/*
  namespaces: [public]
`)
	f, err := identity.OpenPolicy(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id   string
		all  bool
		want []string
	}{
		{"spiffe://td/ns/ops/sa/admin", true, nil},
		{"spiffe://td/ns/shop/sa/web", false, []string{"shared", "shop"}},
		{"spiffe://other/ns/shop/sa/web", false, []string{"public"}},
		{"spiffe://td/nave/cluster/east", false, nil},
	} {
		id, _ := identity.Parse(c.id)
		all, ns := f.Policy().Allows(id)
		if all != c.all || !slices.Equal(ns, c.want) {
			t.Errorf("%s: all %v %v, want %v %v", c.id, all, ns, c.all, c.want)
		}
	}
	// A version that does not load keeps the last good policy; a good one replaces it.
	shop, _ := identity.Parse("spiffe://td/ns/shop/sa/web")
	for _, bad := range []string{"rules:\n- identity: nope\n  namespaces: [a]\n", "rules:\n- identity: '*'\n", "rule: []\n", "", "  \n", "# half written\n", "{}\n"} {
		write(t, path, bad)
		if _, err := identity.OpenPolicy(path); err == nil {
			t.Errorf("policy %q accepted", bad)
		}
		if changed, err := f.Reload(); changed || err == nil {
			t.Errorf("policy %q reloaded: %v, %v", bad, changed, err)
		}
		if _, ns := f.Policy().Allows(shop); !slices.Equal(ns, []string{"shared", "shop"}) {
			t.Fatalf("after %q the last good policy is gone: %v", bad, ns)
		}
	}
	write(t, path, "rules:\n- identity: '*'\n  namespaces: [public]\n")
	if changed, err := f.Reload(); !changed || err != nil {
		t.Fatalf("a good new policy: %v, %v", changed, err)
	}
	if _, ns := f.Policy().Allows(shop); !slices.Equal(ns, []string{"public"}) {
		t.Fatalf("the new policy grants %v, want [public]", ns)
	}
}

func TestVerifyReasons(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	good := ca.Issue(t, "good", testpki.Cert{URI: "spiffe://td/nave/cluster/east"})
	revoked := ca.Issue(t, "revoked", testpki.Cert{URI: "spiffe://td/nave/cluster/east"})
	store, err := identity.Load(identity.Files{CA: ca.File, CRL: ca.CRL(t, 1, revoked.Serial)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := testpki.NewCA(t, "other")
	for _, c := range []struct {
		name   string
		cert   testpki.Issued
		reason string
	}{
		{"good", good, ""},
		{"revoked", revoked, "revoked"},
		{"expired", ca.Issue(t, "old", testpki.Cert{URI: "spiffe://td/x", NotAfter: time.Now().Add(-time.Minute)}), "expired"},
		{"untrusted", other.Issue(t, "x", testpki.Cert{URI: "spiffe://td/x"}), "untrusted"},
		{"no identity", ca.Issue(t, "anon", testpki.Cert{}), "no_identity"},
		{"foreign", ca.Issue(t, "foreign", testpki.Cert{URI: "spiffe://elsewhere/x"}), "foreign_trust_domain"},
	} {
		_, err := store.Material().Verify(chain(t, c.cert), x509.ExtKeyUsageClientAuth, "td", time.Now())
		if (err == nil) != (c.reason == "") || (err != nil && identity.Reason(err) != c.reason) {
			t.Errorf("%s: %v, want reason %q", c.name, err, c.reason)
		}
	}
}

// A chain verified once is remembered by the certificate the connection
// parsed (its streams need not verify it again), but only for the usage,
// trust domain and time it was verified for, and never past a reload.
func TestVerifyRemembers(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	is := ca.Issue(t, "east", testpki.Cert{URI: "spiffe://td/nave/cluster/east"})
	crl := filepath.Join(t.TempDir(), "crl.pem")
	copyFile(t, ca.CRL(t, 1), crl)
	store, err := identity.Load(identity.Files{CA: ca.File, CRL: crl}, nil)
	if err != nil {
		t.Fatal(err)
	}
	verified := chain(t, is)
	now := time.Now()
	if _, err := store.Material().Verify(verified, x509.ExtKeyUsageClientAuth, "td", now); err != nil {
		t.Fatal(err)
	}
	// Spoil the signature of the parsed certificate: only a remembered verdict passes it.
	verified[0].Signature[len(verified[0].Signature)/2] ^= 0xff
	if id, err := store.Material().Verify(verified, x509.ExtKeyUsageClientAuth, "td", now); err != nil || id.String() != "spiffe://td/nave/cluster/east" {
		t.Fatalf("the verified chain again: %v, %v", id, err)
	}
	spoiled := chain(t, is)
	spoiled[0].Signature[len(spoiled[0].Signature)/2] ^= 0xff
	withOthers := []*x509.Certificate{verified[0], chain(t, ca.Issue(t, "other", testpki.Cert{URI: "spiffe://td/x"}))[0]}
	for _, c := range []struct {
		name   string
		chain  []*x509.Certificate
		usage  x509.ExtKeyUsage
		td     string
		at     time.Time
		reason string
	}{
		{"another parse of a spoiled certificate", spoiled, x509.ExtKeyUsageClientAuth, "td", now, "untrusted"},
		{"the leaf with other certificates", withOthers, x509.ExtKeyUsageClientAuth, "td", now, "untrusted"},
		{"another usage", verified, x509.ExtKeyUsageCodeSigning, "td", now, "untrusted"},
		{"another trust domain", verified, x509.ExtKeyUsageClientAuth, "elsewhere", now, "untrusted"},
		{"after it expired", verified, x509.ExtKeyUsageClientAuth, "td", verified[0].NotAfter.Add(time.Second), "expired"},
	} {
		if _, err := store.Material().Verify(c.chain, c.usage, c.td, c.at); identity.Reason(err) != c.reason {
			t.Errorf("%s: %v, want reason %q", c.name, err, c.reason)
		}
	}
	// A leaf outliving its CA: remembered only while the CA is valid too.
	long := chain(t, ca.Issue(t, "long", testpki.Cert{URI: "spiffe://td/nave/cluster/east", NotAfter: now.Add(72 * time.Hour)}))
	if _, err := store.Material().Verify(long, x509.ExtKeyUsageClientAuth, "td", now); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Material().Verify(long, x509.ExtKeyUsageClientAuth, "td", now.Add(48*time.Hour)); identity.Reason(err) != "untrusted" {
		t.Errorf("after the CA expired: %v, want untrusted", err)
	}
	copyFile(t, ca.CRL(t, 2, is.Serial), crl)
	if changed, err := store.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v, %v", changed, err)
	}
	if _, err := store.Material().Verify(chain(t, is), x509.ExtKeyUsageClientAuth, "td", now); identity.Reason(err) != "revoked" {
		t.Errorf("after the CRL revoked it: %v, want revoked", err)
	}
	if _, err := store.Material().Verify(verified, x509.ExtKeyUsageClientAuth, "td", now); identity.Reason(err) != "untrusted" {
		t.Errorf("the spoiled chain after a reload: %v, want untrusted (nothing remembered)", err)
	}
}

// A CRL revokes the serial numbers of its own issuer only: with two CAs
// trusted (a rotation), the other CA's certificate of the same serial
// number stays good.
func TestRevocationIsPerIssuer(t *testing.T) {
	old, next := testpki.NewCA(t, "old"), testpki.NewCA(t, "next")
	serial := big.NewInt(4242)
	revoked := old.Issue(t, "east-old", testpki.Cert{URI: "spiffe://td/nave/cluster/east", Serial: serial})
	same := next.Issue(t, "east-next", testpki.Cert{URI: "spiffe://td/nave/cluster/east", Serial: serial})
	cas := filepath.Join(t.TempDir(), "ca.pem")
	write(t, cas, read(t, old.File)+read(t, next.File))
	store, err := identity.Load(identity.Files{CA: cas, CRL: old.CRL(t, 1, serial)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Material().Verify(chain(t, revoked), x509.ExtKeyUsageClientAuth, "td", time.Now()); identity.Reason(err) != "revoked" {
		t.Errorf("the old CA's revoked certificate: %v, want revoked", err)
	}
	if _, err := store.Material().Verify(chain(t, same), x509.ExtKeyUsageClientAuth, "td", time.Now()); err != nil {
		t.Errorf("the next CA's certificate of the same serial: %v, want good", err)
	}
}

// A CRL past the next update its issuer promised is loaded, with a
// warning: revocations issued since may be missing.
func TestStaleCRLWarned(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	for _, c := range []struct {
		name  string
		next  time.Time
		warns bool
	}{{"fresh", time.Now().Add(time.Hour), false}, {"stale", time.Now().Add(-time.Minute), true}} {
		var logged bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logged, nil))
		if _, err := identity.Load(identity.Files{CA: ca.File, CRL: ca.CRLUntil(t, 1, c.next)}, log); err != nil {
			t.Fatal(err)
		}
		if warned := strings.Contains(logged.String(), "past its next update"); warned != c.warns {
			t.Errorf("%s CRL: warned %v, want %v (log %q)", c.name, warned, c.warns, logged.String())
		}
	}
}

// A file that no longer loads keeps the last good material.
func TestReloadKeepsTheLastGood(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	first := ca.Issue(t, "first", testpki.Cert{URI: "spiffe://td/a"})
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyFile(t, first.CertFile, cert)
	copyFile(t, first.KeyFile, key)
	store, err := identity.Load(identity.Files{Cert: cert, Key: key, CA: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := store.Reload(); changed || err != nil {
		t.Fatalf("unchanged files reloaded: %v, %v", changed, err)
	}
	write(t, cert, "garbage")
	if changed, err := store.Reload(); changed || err == nil {
		t.Fatalf("a broken certificate: %v, %v", changed, err)
	}
	if store.Material().Leaf.SerialNumber.Cmp(first.Serial) != 0 {
		t.Fatal("the broken file replaced the good certificate")
	}
	second := ca.Issue(t, "second", testpki.Cert{URI: "spiffe://td/a"})
	copyFile(t, second.CertFile, cert)
	copyFile(t, second.KeyFile, key)
	if changed, err := store.Reload(); !changed || err != nil {
		t.Fatalf("a new certificate: %v, %v", changed, err)
	}
	if store.Material().Leaf.SerialNumber.Cmp(second.Serial) != 0 {
		t.Fatal("the new certificate is not in use")
	}
}

// Recheck ends the sessions whose check fails, and only those.
func TestSessionsRecheck(t *testing.T) {
	s := identity.NewSessions(nil, nil)
	bad := errors.New("withdrawn")
	var failing error
	ok, releaseOK, err := s.Hold(context.Background(), "ok", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseOK()
	gone, releaseGone, err := s.Hold(context.Background(), "gone", nil, func() error { return failing })
	if err != nil {
		t.Fatal(err)
	}
	defer releaseGone()
	s.Recheck()
	if ok.Err() != nil || gone.Err() != nil {
		t.Fatal("a session ended while its credential holds")
	}
	failing = bad
	s.Recheck()
	if ok.Err() != nil || gone.Err() == nil || !errors.Is(context.Cause(gone), bad) {
		t.Fatalf("after the withdrawal: ok %v, gone %v", ok.Err(), context.Cause(gone))
	}
	if _, _, err := s.Hold(context.Background(), "late", nil, func() error { return bad }); err == nil {
		t.Fatal("a session whose credential fails already was held")
	}
	if s.Len() != 1 {
		t.Fatalf("%d sessions held, want 1", s.Len())
	}
}

// A credential withdrawn while a new session is being checked still ends
// it: the session is held before its check runs.
func TestSessionsHoldBeforeTheCheck(t *testing.T) {
	s := identity.NewSessions(nil, nil)
	withdrawn := false
	ctx, release, err := s.Hold(context.Background(), "racing", nil, func() error {
		if withdrawn {
			return errors.New("withdrawn")
		}
		// The check passes; meanwhile the credential is withdrawn and rechecked.
		withdrawn = true
		s.Recheck()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if ctx.Err() == nil {
		t.Fatal("a session whose credential was withdrawn during its check goes on")
	}
}

// A grant that changed ends its session with Unavailable, for the client
// to reconnect, and does not count as a failed credential.
func TestSessionsReconnectOnAChangedGrant(t *testing.T) {
	s := identity.NewSessions(nil, nil)
	changed := false
	ctx, release, err := s.Hold(context.Background(), "granted", nil, func() error {
		if changed {
			return fmt.Errorf("%w: the grant changed", identity.ErrReconnect)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	changed = true
	s.Recheck()
	if ctx.Err() == nil {
		t.Fatal("the session goes on")
	}
	if code := status.Code(identity.Ended(ctx, nil)); code != codes.Unavailable {
		t.Errorf("ended with %s, want Unavailable", code)
	}
	if _, _, err := s.Hold(context.Background(), "late", nil, func() error { return fmt.Errorf("%w: changed", identity.ErrReconnect) }); status.Code(err) != codes.Unavailable {
		t.Errorf("a new session whose grant changed at once: %v, want Unavailable", err)
	}
}

func chain(t *testing.T, is testpki.Issued) []*x509.Certificate {
	t.Helper()
	store, err := identity.Load(identity.Files{Cert: is.CertFile, Key: is.KeyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return []*x509.Certificate{store.Material().Leaf}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	write(t, dst, string(b))
}

// The client verifies the server's certificate as the standard library
// does: for the host dialled, an IP address included.
func TestClientCredsVerifyTheHostDialled(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	for _, c := range []struct {
		hosts []string
		ok    bool
	}{{[]string{"127.0.0.1"}, true}, {[]string{"not-this-host.example"}, false}} {
		server := ca.Issue(t, "server", testpki.Cert{Hosts: c.hosts, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		pair, err := tls.LoadX509KeyPair(server.CertFile, server.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				conn, err := lis.Accept()
				if err != nil {
					return
				}
				_ = conn.(*tls.Conn).Handshake()
				conn.Close()
			}
		}()
		store, err := identity.Load(identity.Files{CA: ca.File}, nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = store.ClientCreds("", nil).ClientHandshake(context.Background(), lis.Addr().String(), raw)
		if (err == nil) != c.ok {
			t.Errorf("a server certificate for %v dialled at 127.0.0.1: %v", c.hosts, err)
		}
		raw.Close()
		lis.Close()
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
