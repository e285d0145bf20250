package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/registry"
)

// The benchmark's own certificate authority, for -mtls: the hub's server
// certificate (an IP SAN for 127.0.0.1, on both ports), each simulated
// cluster's client certificate naming it, and the ADS clients'.
// ECDSA P-256, as cert-manager issues by default in deploy/security.

// benchClientIdentity is the SPIFFE ID every ADS client presents (with one
// client identity; see clientIdentity).
const benchClientIdentity = "spiffe://" + identity.DefaultTrustDomain + "/ns/" + benchNamespace + "/sa/client"

// clientIdentity is the identity of ADS client i when the clients are
// spread over n identities (service accounts): n <= 1 is one for all.
func clientIdentity(i, n int) string {
	if n <= 1 {
		return benchClientIdentity
	}
	return fmt.Sprintf("%s-%03d", benchClientIdentity, i%n)
}

// benchCA issues the run's certificates; its files live in dir.
type benchCA struct {
	dir    string
	File   string // the CA certificate, PEM
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	roots  *x509.CertPool
	serial int64
}

// newBenchCA makes a CA valid for a day and writes its certificate to dir.
func newBenchCA(dir string) (*benchCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nave-bench-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &benchCA{dir: dir, cert: cert, key: key, roots: x509.NewCertPool(), serial: 1}
	ca.roots.AddCert(cert)
	ca.File = filepath.Join(dir, "ca.crt")
	return ca, os.WriteFile(ca.File, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// issued is one certificate and its key, in memory and as PEM.
type issued struct {
	tls             tls.Certificate
	certPEM, keyPEM []byte
}

// issue signs a certificate for the SPIFFE ID uri ("" none) and the IP
// addresses ips, for usage.
func (ca *benchCA) issue(name, uri string, ips []net.IP, usage x509.ExtKeyUsage) (*issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("key of %s: %w", name, err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
	}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			return nil, fmt.Errorf("certificate of %s: %w", name, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("certificate of %s: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	out := &issued{certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}
	if out.tls, err = tls.X509KeyPair(out.certPEM, out.keyPEM); err != nil {
		return nil, err
	}
	return out, nil
}

// write saves the certificate and key as name.crt and name.key in the CA's dir.
func (ca *benchCA) write(name string, c *issued) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(ca.dir, name+".crt"), filepath.Join(ca.dir, name+".key")
	if err := os.WriteFile(certFile, c.certPEM, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, c.keyPEM, 0o600)
}

// clientTLS is the TLS configuration of a client presenting c and trusting
// only the CA (the server name comes from the address dialled: 127.0.0.1).
func (ca *benchCA) clientTLS(c *issued) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.roots, Certificates: []tls.Certificate{c.tls}}
}

// benchPKI is every certificate of an -mtls run.
type benchPKI struct {
	ca *benchCA
	// The hub's certificate and key files (both ports).
	hubCert, hubKey string
	// spokes holds each cluster's client TLS configuration, by cluster.
	spokes map[registry.ClusterID]*tls.Config
	// clients holds the ADS clients' TLS configurations, by identity.
	clients map[string]*tls.Config
	// sanity are the files of the grpc-go clients' certificate (the first client identity).
	sanityCert, sanityKey string
}

// newBenchPKI issues the hub's certificate, one per cluster and one per
// client identity, in dir.
func newBenchPKI(dir string, clusters []registry.ClusterID, clientIdentities int) (*benchPKI, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ca, err := newBenchCA(dir)
	if err != nil {
		return nil, err
	}
	p := &benchPKI{ca: ca, spokes: map[registry.ClusterID]*tls.Config{}, clients: map[string]*tls.Config{}}
	hub, err := ca.issue("nave-hub", "", []net.IP{net.IPv4(127, 0, 0, 1)}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
	}
	if p.hubCert, p.hubKey, err = ca.write("hub", hub); err != nil {
		return nil, err
	}
	for _, c := range clusters {
		cert, err := ca.issue("spoke-"+string(c), identity.ForCluster(identity.DefaultTrustDomain, c).String(), nil, x509.ExtKeyUsageClientAuth)
		if err != nil {
			return nil, err
		}
		p.spokes[c] = ca.clientTLS(cert)
	}
	for i := range max(clientIdentities, 1) {
		id := clientIdentity(i, clientIdentities)
		cert, err := ca.issue(fmt.Sprintf("client-%03d", i), id, nil, x509.ExtKeyUsageClientAuth)
		if err != nil {
			return nil, err
		}
		p.clients[id] = ca.clientTLS(cert)
		if i == 0 {
			if p.sanityCert, p.sanityKey, err = ca.write("client", cert); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// hubArgs are the hub's flags for mTLS on both ports.
func (p *benchPKI) hubArgs() []string {
	return []string{"--tls-cert", p.hubCert, "--tls-key", p.hubKey, "--client-ca", p.ca.File,
		"--xds-tls-cert", p.hubCert, "--xds-tls-key", p.hubKey, "--xds-client-ca", p.ca.File}
}
