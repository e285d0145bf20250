package main

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/registry"
)

// The bench's certificates pass the hub's own checks: a TLS handshake
// against the hub's server configuration (identity.Store, as --tls-cert
// --client-ca load it), with the server name a client dialling 127.0.0.1
// expects, and the client's identity read from its certificate.
func TestBenchPKIHandshake(t *testing.T) {
	dir := t.TempDir()
	pki, err := newBenchPKI(dir, []registry.ClusterID{"c00", "c01"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(pki.spokes) != 2 || len(pki.clients) != 3 {
		t.Fatalf("%d spoke and %d client configurations, want 2 and 3", len(pki.spokes), len(pki.clients))
	}
	store, err := identity.Load(identity.Files{Cert: pki.hubCert, Key: pki.hubKey, CA: pki.ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var refused []string
	server := store.ServerConfig(identity.ServerOptions{TrustDomain: identity.DefaultTrustDomain,
		Refused: func(reason string, _ error) { refused = append(refused, reason) }})
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
		want identity.ID
	}{
		{"spoke c01", pki.spokes["c01"], identity.ForCluster(identity.DefaultTrustDomain, "c01")},
		{"client 2", pki.clients[clientIdentity(2, 3)], mustParseID(t, clientIdentity(2, 3))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg.Clone()
			cfg.ServerName = "127.0.0.1" // what grpc-go sets from the address dialled
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			srv := tls.Server(a, server)
			errc := make(chan error, 1)
			go func() { errc <- srv.Handshake() }()
			if err := tls.Client(b, cfg).Handshake(); err != nil {
				t.Fatalf("client handshake: %v", err)
			}
			if err := <-errc; err != nil {
				t.Fatalf("server handshake: %v", err)
			}
			chain := srv.ConnectionState().PeerCertificates
			if len(chain) == 0 {
				t.Fatal("the client presented no certificate")
			}
			id, err := identity.Of(chain[0])
			if err != nil || id != tc.want {
				t.Errorf("identity %v (%v), want %v", id, err, tc.want)
			}
		})
	}
	if len(refused) > 0 {
		t.Errorf("the hub refused: %q", refused)
	}
	args := pki.hubArgs()
	if len(args) != 12 || args[0] != "--tls-cert" || args[len(args)-1] != pki.ca.File {
		t.Errorf("hub args %q", args)
	}
}

func mustParseID(t *testing.T, s string) identity.ID {
	t.Helper()
	id, err := identity.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
