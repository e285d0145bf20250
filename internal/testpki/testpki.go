// Package testpki issues certificates for tests: a CA, and server and
// client certificates it signs, written as PEM files.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// CA is a certificate authority for one test.
type CA struct {
	// File is the CA certificate's PEM file.
	File string
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA whose files live in a temporary directory of the test.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{dir: t.TempDir(), cert: cert, key: key}
	ca.File = ca.write(t, name+"-ca.crt", "CERTIFICATE", der)
	return ca
}

// Server issues a server certificate for the host names and IP addresses
// in hosts; it returns the certificate and key files.
func (ca *CA) Server(t testing.TB, name string, hosts ...string) (certFile, keyFile string) {
	t.Helper()
	tmpl := ca.template(t, name, x509.ExtKeyUsageServerAuth)
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(t, name, tmpl)
}

// Client issues a client certificate named name.
func (ca *CA) Client(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	return ca.issue(t, name, ca.template(t, name, x509.ExtKeyUsageClientAuth))
}

// Cert describes a certificate Issue makes: its SPIFFE ID (a URI SAN),
// host names and IP addresses, usages (default: client and server) and
// validity (default: from an hour ago for a day).
type Cert struct {
	URI       string
	Hosts     []string
	Usages    []x509.ExtKeyUsage
	NotBefore time.Time
	NotAfter  time.Time
	Serial    *big.Int // nil: a random one
}

// Issued is a certificate Issue made: its files and serial number.
type Issued struct {
	CertFile, KeyFile string
	Serial            *big.Int
}

// Issue issues the certificate c describes, named name.
func (ca *CA) Issue(t testing.TB, name string, c Cert) Issued {
	t.Helper()
	tmpl := ca.template(t, name, x509.ExtKeyUsageClientAuth)
	tmpl.ExtKeyUsage = c.Usages
	if len(c.Usages) == 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}
	}
	if c.URI != "" {
		u, err := url.Parse(c.URI)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	for _, h := range c.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if !c.NotBefore.IsZero() {
		tmpl.NotBefore = c.NotBefore
	}
	if !c.NotAfter.IsZero() {
		tmpl.NotAfter = c.NotAfter
	}
	if c.Serial != nil {
		tmpl.SerialNumber = c.Serial
	}
	cert, key := ca.issue(t, name, tmpl)
	return Issued{CertFile: cert, KeyFile: key, Serial: tmpl.SerialNumber}
}

// CRL writes a revocation list signed by the CA that revokes serials, and
// returns its PEM file; number orders the lists the CA issued.
func (ca *CA) CRL(t testing.TB, number int64, serials ...*big.Int) string {
	t.Helper()
	return ca.CRLUntil(t, number, time.Now().Add(time.Hour), serials...)
}

// CRLUntil is CRL with the next update its issuer promises.
func (ca *CA) CRLUntil(t testing.TB, number int64, nextUpdate time.Time, serials ...*big.Int) string {
	t.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(number), ThisUpdate: nextUpdate.Add(-2 * time.Hour), NextUpdate: nextUpdate}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.cert, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return ca.write(t, "crl-"+strconv.FormatInt(number, 10)+".pem", "X509 CRL", der)
}

func (ca *CA) template(t testing.TB, name string, usage x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
}

func (ca *CA) issue(t testing.TB, name string, tmpl *x509.Certificate) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return ca.write(t, name+".crt", "CERTIFICATE", der), ca.write(t, name+".key", "EC PRIVATE KEY", keyDER)
}

func (ca *CA) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(ca.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
