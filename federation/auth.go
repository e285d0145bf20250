package federation

import (
	"context"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/internal/watched"
	"github.com/navemesh/nave/registry"
)

// ErrUnauthenticated marks a credential the hub does not know.
var ErrUnauthenticated = errors.New("federation: unknown credential")

// Tokens maps each cluster ID to the bearer token its spoke presents.
// A token only ever authorizes publishing for its own cluster.
type Tokens map[registry.ClusterID]string

// LoadTokens reads a YAML file of `cluster-id: token` lines.
func LoadTokens(path string) (Tokens, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tokens: %w", err)
	}
	return parseTokens(path, b)
}

func parseTokens(path string, b []byte) (Tokens, error) {
	var raw map[string]string
	if err := yaml.UnmarshalStrict(b, &raw); err != nil {
		return nil, fmt.Errorf("parse tokens %s: want lines of `cluster-id: token`: %w", path, err)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("tokens %s: no cluster's token (without --tokens, spokes present certificates)", path)
	}
	t := make(Tokens, len(raw))
	seen := map[string]registry.ClusterID{}
	for id, tok := range raw {
		c := registry.ClusterID(id)
		if err := registry.ValidateClusterID(c); err != nil {
			return nil, fmt.Errorf("tokens %s: %w", path, err)
		}
		if len(tok) < 16 {
			return nil, fmt.Errorf("tokens %s: token of cluster %s is shorter than 16 characters", path, id)
		}
		if other, dup := seen[tok]; dup {
			return nil, fmt.Errorf("tokens %s: clusters %s and %s share a token", path, other, id)
		}
		seen[tok] = c
		t[c] = tok
	}
	return t, nil
}

// TokenFile is a tokens file (see LoadTokens) read again when it changes.
type TokenFile struct{ f *watched.File[Tokens] }

// OpenTokens reads a tokens file; check (nil: none) must accept every
// version of it, or that version is refused (the hub checks that no
// cluster's token is a peer token).
func OpenTokens(path string, check func(Tokens) error) (*TokenFile, error) {
	f, err := watched.Open("tokens", path, parseTokens, check)
	if err != nil {
		return nil, err
	}
	return &TokenFile{f}, nil
}

// Tokens returns the tokens the file last held when it read cleanly.
func (f *TokenFile) Tokens() Tokens { return f.f.Get() }

// Reload reads the file again and reports whether the tokens changed; a
// file that does not read cleanly changes nothing. Call it from one
// goroutine at a time.
func (f *TokenFile) Reload() (bool, error) { return f.f.Reload() }

// PeerTokens are the tokens hub replicas share: the first is the one a
// replica presents, and every one is accepted. Several at once let an
// operator rotate the token without a moment of refused replication:
// add the new one on a second line everywhere, then move it first
// everywhere, then remove the old one.
type PeerTokens []string

// Present is the token a replica presents to its peers.
func (p PeerTokens) Present() string {
	if len(p) == 0 {
		return ""
	}
	return p[0]
}

// Accepts reports whether tok is one of the tokens. It compares in constant time.
func (p PeerTokens) Accepts(tok string) bool {
	if tok == "" {
		return false
	}
	found := false
	for _, t := range p {
		if subtle.ConstantTimeCompare([]byte(t), []byte(tok)) == 1 {
			found = true
		}
	}
	return found
}

// Validate checks peer tokens before they are used: each long enough and
// unlike every cluster's token (a token must say what it admits).
func (p PeerTokens) Validate(tokens Tokens) error {
	for _, peer := range p {
		if err := ValidatePeerToken(peer, tokens); err != nil {
			return err
		}
	}
	return nil
}

// parsePeerTokens reads a peer token file: one token a line, blank lines
// and lines starting with # ignored.
func parsePeerTokens(path string, raw []byte) (PeerTokens, error) {
	var p PeerTokens
	for line := range strings.Lines(string(raw)) {
		tok := strings.TrimSpace(line)
		if tok == "" || strings.HasPrefix(tok, "#") {
			continue
		}
		if slices.Contains(p, tok) {
			return nil, fmt.Errorf("peer tokens %s: a token appears twice", path)
		}
		p = append(p, tok)
	}
	if len(p) == 0 {
		return nil, fmt.Errorf("peer tokens %s: no token", path)
	}
	return p, nil
}

// PeerTokenFile is a peer token file (see PeerTokens) read again when it
// changes.
type PeerTokenFile struct{ f *watched.File[PeerTokens] }

// OpenPeerTokens reads a peer token file; check (nil: none) must accept
// every version of it, or that version is refused (the hub checks that
// no cluster's token is among them).
func OpenPeerTokens(path string, check func(PeerTokens) error) (*PeerTokenFile, error) {
	f, err := watched.Open("peer tokens", path, parsePeerTokens, check)
	if err != nil {
		return nil, err
	}
	return &PeerTokenFile{f}, nil
}

// Tokens returns the tokens the file last held when it read cleanly.
func (f *PeerTokenFile) Tokens() PeerTokens { return f.f.Get() }

// Reload reads the file again and reports whether the tokens changed; a
// file that does not read cleanly changes nothing. Call it from one
// goroutine at a time.
func (f *PeerTokenFile) Reload() (bool, error) { return f.f.Reload() }

// Cluster returns the cluster a token belongs to. It compares in constant time.
func (t Tokens) Cluster(token string) (registry.ClusterID, error) {
	var found registry.ClusterID
	for id, tok := range t {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(token)) == 1 {
			found = id
		}
	}
	if found == "" {
		return "", ErrUnauthenticated
	}
	return found, nil
}

type authenticatedKey struct{}

// authenticatedCluster returns the cluster the stream's credential was issued
// for, and false when the hub runs without credentials.
func authenticatedCluster(ctx context.Context) (registry.ClusterID, bool) {
	c, ok := ctx.Value(authenticatedKey{}).(registry.ClusterID)
	return c, ok
}

// Credentials are what the federation port admits: cluster tokens,
// client certificates naming a cluster or a replica (SPIFFE IDs, see
// package identity), and the peer token replicas share. Its functions
// return what holds now, so that files reloaded behind them take effect
// for new streams at once, and, through Sessions, end open streams
// whose credential no longer holds.
type Credentials struct {
	// Tokens returns the cluster tokens (nil: none; with no certificates
	// either, every spoke is admitted: development only).
	Tokens func() Tokens
	// PeerTokens returns the tokens replicas share (none: with no
	// certificates either, replication is open: development only).
	PeerTokens func() PeerTokens
	// Certs verifies the client certificates peers present (nil: none are
	// asked for); TrustDomain is the trust domain their identities belong to.
	Certs       *identity.Store
	TrustDomain string
	// Sessions, when set, holds every admitted stream, so that it ends
	// once its token is withdrawn or its certificate expires, is revoked
	// or is no longer trusted.
	Sessions *identity.Sessions
}

// AuthOption configures AuthInterceptor.
type AuthOption func(*Credentials)

// WithPeerToken makes the Replication service (hub replica to hub replica)
// admit only streams carrying token, the secret the replicas share. The peer
// token and the cluster tokens never admit each other's service: a spoke
// cannot replicate, a replica cannot publish. Without this option
// (development), Replication is open to every client.
func WithPeerToken(token string) AuthOption {
	return func(c *Credentials) {
		c.PeerTokens = func() PeerTokens {
			if token == "" {
				return nil
			}
			return PeerTokens{token}
		}
	}
}

// ValidatePeerToken checks a peer token before it is used: long enough, and
// unlike every cluster's token (a token must say what it admits).
func ValidatePeerToken(peer string, tokens Tokens) error {
	if len(peer) < 16 {
		return errors.New("peer token is shorter than 16 characters")
	}
	if c, err := tokens.Cluster(peer); err == nil {
		return fmt.Errorf("peer token is the token of cluster %s", c)
	}
	return nil
}

// AuthInterceptor returns the interceptor of Credentials holding tokens
// (nil: none) and what opts add.
func AuthInterceptor(tokens Tokens, opts ...AuthOption) grpc.StreamServerInterceptor {
	c := Credentials{Tokens: func() Tokens { return tokens }}
	for _, o := range opts {
		o(&c)
	}
	return c.Interceptor()
}

// admitted is a stream's credential: whom it admits, and while what holds.
type admitted struct {
	ctx   context.Context
	who   string
	leaf  *x509.Certificate // the client certificate; nil: a token
	holds func() error      // nil: always
}

// Interceptor returns a stream interceptor that admits a Federation
// stream carrying a cluster's credential (a client certificate naming the
// cluster, or "authorization: Bearer <token>") and remembers the cluster,
// and a Replication stream carrying a replica's (its certificate, or the
// peer token). A credential never admits the other service.
func (c Credentials) Interceptor() grpc.StreamServerInterceptor {
	if c.Tokens == nil {
		c.Tokens = func() Tokens { return nil }
	}
	if c.PeerTokens == nil {
		c.PeerTokens = func() PeerTokens { return nil }
	}
	replication := "/" + fedv1.Replication_ServiceDesc.ServiceName + "/"
	return func(srv any, stream grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		authenticate := c.spoke
		if strings.HasPrefix(info.FullMethod, replication) {
			authenticate = c.replica
		}
		a, err := authenticate(stream.Context())
		if err != nil {
			return err
		}
		ctx := a.ctx
		if c.Sessions != nil {
			var release func()
			if ctx, release, err = c.Sessions.Hold(ctx, a.who, a.leaf, a.holds); err != nil {
				return err
			}
			defer release()
		} else if a.holds != nil {
			if err := a.holds(); err != nil {
				return status.Error(codes.Unauthenticated, err.Error())
			}
		}
		return identity.Stream(ctx, srv, stream, handler)
	}
}

// certificate returns the identity of the peer's verified client
// certificate, and how to check it still holds.
func (c Credentials) certificate(ctx context.Context) (identity.ID, admitted, bool) {
	chain := identity.PeerChain(ctx)
	if c.Certs == nil || len(chain) == 0 {
		return identity.ID{}, admitted{}, false
	}
	// The handshake verified the chain; what is checked again is whether it still holds.
	id, err := identity.Of(chain[0])
	if err != nil {
		return identity.ID{}, admitted{}, false
	}
	return id, admitted{ctx: ctx, who: id.String(), leaf: chain[0], holds: func() error {
		_, err := c.Certs.Material().Verify(chain, x509.ExtKeyUsageClientAuth, c.TrustDomain, time.Now())
		return err
	}}, true
}

// spoke admits a stream carrying a cluster's credential and remembers the cluster.
func (c Credentials) spoke(ctx context.Context) (admitted, error) {
	tok, tokErr := auth.AuthFromMD(ctx, "bearer")
	if id, a, ok := c.certificate(ctx); ok {
		if _, replica := id.Replica(); replica {
			return admitted{}, status.Errorf(codes.PermissionDenied, "the identity of replica %s cannot publish for a cluster", id)
		}
		cluster, ok := id.Cluster()
		if !ok {
			return admitted{}, status.Errorf(codes.PermissionDenied, "identity %s names no cluster (want spiffe://%s/nave/cluster/CLUSTER-ID)", id, c.TrustDomain)
		}
		if tokErr == nil {
			if other, err := c.Tokens().Cluster(tok); err != nil || other != cluster {
				return admitted{}, status.Errorf(codes.PermissionDenied, "the token does not belong to the certificate's cluster %s", cluster)
			}
		}
		a.ctx = context.WithValue(ctx, authenticatedKey{}, cluster)
		return a, nil
	}
	if c.Tokens() == nil && c.Certs == nil {
		return admitted{ctx: ctx}, nil
	}
	if tokErr != nil {
		if c.Certs != nil {
			return admitted{}, status.Error(codes.Unauthenticated, "present a client certificate naming your cluster, or a token")
		}
		return admitted{}, tokErr
	}
	if c.PeerTokens().Accepts(tok) {
		return admitted{}, status.Error(codes.PermissionDenied, "the peer token cannot publish for a cluster")
	}
	cluster, err := c.Tokens().Cluster(tok)
	if err != nil {
		return admitted{}, status.Error(codes.Unauthenticated, "unknown federation token")
	}
	return admitted{ctx: context.WithValue(ctx, authenticatedKey{}, cluster), who: "token of cluster " + string(cluster), holds: func() error {
		if now, err := c.Tokens().Cluster(tok); err != nil || now != cluster {
			return fmt.Errorf("the token of cluster %s was withdrawn", cluster)
		}
		return nil
	}}, nil
}

// replica admits a stream carrying a replica's credential; with none configured, every stream.
func (c Credentials) replica(ctx context.Context) (admitted, error) {
	if id, a, ok := c.certificate(ctx); ok {
		if _, replica := id.Replica(); !replica {
			return admitted{}, status.Errorf(codes.PermissionDenied, "identity %s is no replica's and cannot replicate", id)
		}
		return a, nil
	}
	if len(c.PeerTokens()) == 0 && c.Certs == nil {
		return admitted{ctx: ctx}, nil
	}
	tok, err := auth.AuthFromMD(ctx, "bearer")
	if err != nil {
		if c.Certs != nil {
			return admitted{}, status.Error(codes.Unauthenticated, "present a replica's client certificate, or the peer token")
		}
		return admitted{}, err
	}
	if c.PeerTokens().Accepts(tok) {
		return admitted{ctx: ctx, who: "peer token", holds: func() error {
			if !c.PeerTokens().Accepts(tok) {
				return errors.New("the peer token was withdrawn")
			}
			return nil
		}}, nil
	}
	if _, err := c.Tokens().Cluster(tok); err == nil {
		return admitted{}, status.Error(codes.PermissionDenied, "a cluster's token cannot replicate")
	}
	return admitted{}, status.Error(codes.Unauthenticated, "unknown peer token")
}

// TokenCredentials sends a bearer token with every RPC.
type TokenCredentials struct {
	Token string
	// AllowInsecure lets the token travel over a connection without TLS (loopback, tests, demos).
	AllowInsecure bool
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (c TokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + c.Token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (c TokenCredentials) RequireTransportSecurity() bool { return !c.AllowInsecure }

var _ credentials.PerRPCCredentials = TokenCredentials{}

// TokenFunc sends the token Get returns with every RPC: read each time,
// so that a token file reloaded behind it takes effect at once.
type TokenFunc struct {
	Get func() string
	// AllowInsecure lets the token travel over a connection without TLS (loopback, tests, demos).
	AllowInsecure bool
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (c TokenFunc) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	return TokenCredentials{Token: c.Get()}.GetRequestMetadata(ctx, uri...)
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (c TokenFunc) RequireTransportSecurity() bool { return !c.AllowInsecure }

// LoadToken reads a spoke's token file (the token, surrounding space ignored).
func LoadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}
