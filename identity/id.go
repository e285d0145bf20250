// Package identity is who a peer is: SPIFFE IDs carried in X.509
// certificates, certificate files reloaded without a restart, and the
// sessions an identity holds, ended once it no longer holds (expired,
// revoked, no longer trusted, or its token taken away).
package identity

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/navemesh/nave/registry"
)

// DefaultTrustDomain is the trust domain identities belong to unless
// configured otherwise (Istio's default, so its workload identities fit).
const DefaultTrustDomain = "cluster.local"

// ID is a SPIFFE ID: spiffe://TRUST-DOMAIN/PATH.
type ID struct {
	TrustDomain string
	Path        string // begins with "/"
}

// Parse reads a SPIFFE ID.
func Parse(s string) (ID, error) {
	u, err := url.Parse(s)
	if err != nil {
		return ID{}, fmt.Errorf("identity: %q is no SPIFFE ID: %w", s, err)
	}
	switch {
	case u.Scheme != "spiffe":
		return ID{}, fmt.Errorf("identity: %q is no SPIFFE ID: the scheme is not spiffe", s)
	case u.Host == "" || u.Port() != "" || u.User != nil:
		return ID{}, fmt.Errorf("identity: %q is no SPIFFE ID: want spiffe://TRUST-DOMAIN/PATH", s)
	case u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return ID{}, fmt.Errorf("identity: %q is no SPIFFE ID: it has a query or fragment", s)
	case u.Host != strings.ToLower(u.Host):
		return ID{}, fmt.Errorf("identity: %q is no SPIFFE ID: the trust domain must be lower case", s)
	case strings.Contains(s, "%"):
		return ID{}, fmt.Errorf("identity: %q is no SPIFFE ID: percent-encoding is not allowed", s)
	case len(u.Path) < 2 || strings.HasSuffix(u.Path, "/") || strings.Contains(u.Path, "//"):
		return ID{}, fmt.Errorf("identity: %q is no SPIFFE ID: the path is empty or has an empty segment", s)
	}
	for _, seg := range strings.Split(u.Path[1:], "/") {
		if seg == "." || seg == ".." {
			return ID{}, fmt.Errorf("identity: %q is no SPIFFE ID: the path has a %q segment", s, seg)
		}
	}
	return ID{TrustDomain: u.Host, Path: u.Path}, nil
}

func (id ID) String() string { return "spiffe://" + id.TrustDomain + id.Path }

// IsZero reports whether id names nothing.
func (id ID) IsZero() bool { return id == ID{} }

const (
	clusterPath = "/nave/cluster/"
	replicaPath = "/nave/replica/"
)

// ForCluster is the identity of a cluster's spoke: it publishes for that
// cluster only.
func ForCluster(trustDomain string, c registry.ClusterID) ID {
	return ID{TrustDomain: trustDomain, Path: clusterPath + string(c)}
}

// ForReplica is the identity of a hub replica: it replicates, and
// publishes for no cluster.
func ForReplica(trustDomain, replica string) ID {
	return ID{TrustDomain: trustDomain, Path: replicaPath + replica}
}

// Cluster returns the cluster a spoke identity publishes for.
func (id ID) Cluster() (registry.ClusterID, bool) {
	c, ok := strings.CutPrefix(id.Path, clusterPath)
	if !ok || registry.ValidateClusterID(registry.ClusterID(c)) != nil {
		return "", false
	}
	return registry.ClusterID(c), true
}

// Replica returns the replica a hub replica's identity names.
func (id ID) Replica() (string, bool) {
	r, ok := strings.CutPrefix(id.Path, replicaPath)
	return r, ok && r != "" && !strings.Contains(r, "/")
}

// Errors a peer's certificate is refused with.
var (
	ErrNoIdentity   = errors.New("identity: the certificate carries no SPIFFE ID")
	ErrForeign      = errors.New("identity: the identity belongs to another trust domain")
	ErrExpired      = errors.New("identity: the certificate has expired or is not valid yet")
	ErrUntrusted    = errors.New("identity: the certificate is not signed by a trusted CA")
	ErrRevoked      = errors.New("identity: the certificate is revoked")
	ErrNoClientCert = errors.New("identity: no client certificate")
)

// Reason is a short label for why a certificate was refused, for metrics.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrNoIdentity):
		return "no_identity"
	case errors.Is(err, ErrForeign):
		return "foreign_trust_domain"
	case errors.Is(err, ErrExpired):
		return "expired"
	case errors.Is(err, ErrUntrusted):
		return "untrusted"
	case errors.Is(err, ErrRevoked):
		return "revoked"
	case errors.Is(err, ErrNoClientCert):
		return "no_client_certificate"
	default:
		return "invalid"
	}
}

// Of returns the SPIFFE ID a certificate carries: its one spiffe URI SAN.
func Of(cert *x509.Certificate) (ID, error) {
	var found []ID
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		id, err := Parse(u.String())
		if err != nil {
			return ID{}, fmt.Errorf("%w: %w", ErrNoIdentity, err)
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return ID{}, ErrNoIdentity
	case 1:
		return found[0], nil
	default:
		return ID{}, fmt.Errorf("%w: it carries %d SPIFFE IDs, want one", ErrNoIdentity, len(found))
	}
}
