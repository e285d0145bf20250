package identity

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"runtime"
	"sync"
	"time"
	"weak"
)

// Files are the PEM files of an identity and of what it trusts. Every one
// is optional, but Key goes with Cert and CRL with CA.
type Files struct {
	// Cert and Key are the certificate this process presents (its chain
	// first) and its private key.
	Cert, Key string
	// CA holds the certificates of the authorities peers' certificates
	// must chain to.
	CA string
	// CRL is a revocation list signed by one of the CAs (PEM or DER).
	CRL string
}

func (f Files) paths() []string { return []string{f.Cert, f.Key, f.CA, f.CRL} }

// Material is what Files held when last read successfully.
type Material struct {
	Cert    *tls.Certificate // nil without Files.Cert
	Leaf    *x509.Certificate
	Roots   *x509.CertPool  // nil without Files.CA
	revoked map[string]bool // by revocationKey
	// crlNextUpdate is when the CRL's issuer promised the next one (zero: no CRL, or no promise).
	crlNextUpdate time.Time
	// verified remembers the chains Verify accepted, by their leaf: a
	// stream on a connection whose chain the handshake verified against
	// this material need not verify it again.
	verified verifiedChains
}

// verifiedChains is a memo of chains accepted, keyed weakly by leaf (the
// certificate a connection parsed at its handshake: an entry goes when
// its connection's certificate is collected) and what they were verified
// for. Only success is remembered, with the chain presented (a hit must
// present the same certificates) and the span of time the whole chain
// verified up to its root is valid in. It is bounded besides: past
// maxVerified entries it starts over.
type verifiedChains struct {
	mu sync.Mutex
	m  map[verifiedKey]verifiedChain
}

type verifiedKey struct {
	leaf        weak.Pointer[x509.Certificate]
	usage       x509.ExtKeyUsage
	trustDomain string
}

type verifiedChain struct {
	id                  ID
	intermediates       []weak.Pointer[x509.Certificate]
	notBefore, notAfter time.Time
}

// maxVerified bounds the memo.
const maxVerified = 65_536

func keyOf(chain []*x509.Certificate, usage x509.ExtKeyUsage, trustDomain string) verifiedKey {
	return verifiedKey{leaf: weak.Make(chain[0]), usage: usage, trustDomain: trustDomain}
}

func (v *verifiedChains) get(chain []*x509.Certificate, k verifiedKey, now time.Time) (ID, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	c, ok := v.m[k]
	if !ok || now.Before(c.notBefore) || now.After(c.notAfter) || len(c.intermediates) != len(chain)-1 {
		return ID{}, false
	}
	for i, p := range c.intermediates {
		if p != weak.Make(chain[i+1]) {
			return ID{}, false
		}
	}
	return c.id, true
}

// put remembers that chain, presented, verified as verified (leaf to root).
func (v *verifiedChains) put(k verifiedKey, chain, verified []*x509.Certificate, id ID) {
	c := verifiedChain{id: id, notBefore: verified[0].NotBefore, notAfter: verified[0].NotAfter}
	for _, cert := range verified[1:] {
		if cert.NotBefore.After(c.notBefore) {
			c.notBefore = cert.NotBefore
		}
		if cert.NotAfter.Before(c.notAfter) {
			c.notAfter = cert.NotAfter
		}
	}
	for _, cert := range chain[1:] {
		c.intermediates = append(c.intermediates, weak.Make(cert))
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= maxVerified {
		v.m = map[verifiedKey]verifiedChain{}
	}
	if _, known := v.m[k]; !known {
		runtime.AddCleanup(chain[0], v.forget, k)
	}
	v.m[k] = c
}

// forget drops the entry of a leaf that was collected.
func (v *verifiedChains) forget(k verifiedKey) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.m, k)
}

// Store holds an identity's material and reloads it when its files change:
// new handshakes use the new material at once, and open sessions are
// checked again (see Sessions). Files that no longer load keep the last
// good material (Watch logs the error).
type Store struct {
	files Files
	log   *slog.Logger

	mu       sync.Mutex // guards what follows
	cur      *Material
	contents [][]byte // the files' bytes the material was read from
}

// Load reads files into a new Store.
func Load(files Files, log *slog.Logger) (*Store, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, errors.New("identity: a certificate needs its key, and a key its certificate")
	}
	if files.CRL != "" && files.CA == "" {
		return nil, errors.New("identity: a CRL needs the CA that signed it")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{files: files, log: log}
	contents, err := s.read()
	if err != nil {
		return nil, err
	}
	m, err := parse(files, contents)
	if err != nil {
		return nil, err
	}
	s.cur, s.contents = m, contents
	s.warnStaleCRL(m)
	return s, nil
}

// warnStaleCRL warns when a CRL is past the next update its issuer
// promised: revocations since may be missing from it.
func (s *Store) warnStaleCRL(m *Material) {
	if !m.crlNextUpdate.IsZero() && time.Now().After(m.crlNextUpdate) {
		s.log.Warn("the CRL is past its next update: renew it, or revocations issued since are not enforced",
			"crl", s.files.CRL, "nextUpdate", m.crlNextUpdate)
	}
}

// Material returns the current material.
func (s *Store) Material() *Material {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Reload reads the files again; it reports whether the material changed.
// Files that do not load leave the material as it was and return the error.
func (s *Store) Reload() (bool, error) {
	contents, err := s.read()
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	same := true
	for i := range contents {
		same = same && bytes.Equal(contents[i], s.contents[i])
	}
	s.mu.Unlock()
	if same {
		return false, nil
	}
	m, err := parse(s.files, contents)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	s.cur, s.contents = m, contents
	s.mu.Unlock()
	s.log.Info("reloaded certificates", "cert", s.files.Cert, "ca", s.files.CA, "crl", s.files.CRL, "notAfter", leafNotAfter(m))
	s.warnStaleCRL(m)
	return true, nil
}

func leafNotAfter(m *Material) time.Time {
	if m.Leaf == nil {
		return time.Time{}
	}
	return m.Leaf.NotAfter
}

func (s *Store) read() ([][]byte, error) {
	out := make([][]byte, len(s.files.paths()))
	for i, p := range s.files.paths() {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("identity: %w", err)
		}
		out[i] = b
	}
	return out, nil
}

func parse(files Files, contents [][]byte) (*Material, error) {
	m := &Material{}
	if files.Cert != "" {
		cert, err := tls.X509KeyPair(contents[0], contents[1])
		if err != nil {
			return nil, fmt.Errorf("identity: certificate %s and key %s: %w", files.Cert, files.Key, err)
		}
		m.Cert, m.Leaf = &cert, cert.Leaf
	}
	if files.CA == "" {
		return m, nil
	}
	var cas []*x509.Certificate
	for rest := contents[2]; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("identity: CA file %s: %w", files.CA, err)
		}
		cas = append(cas, c)
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("identity: CA file %s holds no certificate", files.CA)
	}
	m.Roots = x509.NewCertPool()
	for _, c := range cas {
		m.Roots.AddCert(c)
	}
	if files.CRL == "" {
		return m, nil
	}
	der := contents[3]
	if block, _ := pem.Decode(der); block != nil {
		der = block.Bytes
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("identity: CRL %s: %w", files.CRL, err)
	}
	signed := false
	for _, c := range cas {
		signed = signed || crl.CheckSignatureFrom(c) == nil
	}
	if !signed {
		return nil, fmt.Errorf("identity: CRL %s is not signed by a CA of %s", files.CRL, files.CA)
	}
	m.revoked = map[string]bool{}
	for _, e := range crl.RevokedCertificateEntries {
		m.revoked[revocationKey(crl.RawIssuer, e.SerialNumber)] = true
	}
	m.crlNextUpdate = crl.NextUpdate
	return m, nil
}

// revocationKey names a certificate in a CRL: serial numbers are unique
// per issuer only (a CA file may hold several CAs, as in a rotation).
func revocationKey(issuer []byte, serial *big.Int) string {
	return string(issuer) + "\x00" + serial.String()
}

// Verify checks a peer's chain (leaf first) at now against the material:
// signed by a CA for usage, valid, not revoked, and naming one SPIFFE ID
// of trustDomain ("" accepts any). It returns that identity.
func (m *Material) Verify(chain []*x509.Certificate, usage x509.ExtKeyUsage, trustDomain string, now time.Time) (ID, error) {
	if len(chain) == 0 {
		return ID{}, ErrNoClientCert
	}
	leaf := chain[0]
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return ID{}, fmt.Errorf("%w (valid %s to %s)", ErrExpired, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if m.Roots == nil {
		return ID{}, fmt.Errorf("%w: no CA configured", ErrUntrusted)
	}
	key := keyOf(chain, usage, trustDomain)
	if id, ok := m.verified.get(chain, key, now); ok {
		return id, nil
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	verified, err := leaf.Verify(x509.VerifyOptions{Roots: m.Roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return ID{}, fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	for _, c := range chain {
		if m.revoked[revocationKey(c.RawIssuer, c.SerialNumber)] {
			return ID{}, fmt.Errorf("%w (serial %s)", ErrRevoked, c.SerialNumber)
		}
	}
	id, err := Of(leaf)
	if err != nil {
		return ID{}, err
	}
	if trustDomain != "" && id.TrustDomain != trustDomain {
		return ID{}, fmt.Errorf("%w: %s is not in %s", ErrForeign, id, trustDomain)
	}
	m.verified.put(key, chain, verified[0], id)
	return id, nil
}

// Watch calls every reload once per interval until ctx ends. A reload
// that fails is logged once per distinct error (what was loaded before
// stays in use); one that changes something calls changed.
func Watch(ctx context.Context, log *slog.Logger, interval time.Duration, changed func(), reloads ...func() (bool, error)) {
	last := make([]string, len(reloads))
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		any := false
		for i, reload := range reloads {
			ok, err := reload()
			switch {
			case err != nil && err.Error() != last[i]:
				log.Error("cannot reload credentials; the last good ones stay in use", "err", err)
				last[i] = err.Error()
			case err == nil:
				last[i] = ""
				any = any || ok
			}
		}
		if any && changed != nil {
			changed()
		}
	}
}
