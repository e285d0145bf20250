package federation

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	fedv1 "github.com/navemesh/nave/federation/v1"
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
	var raw map[string]string
	if err := yaml.UnmarshalStrict(b, &raw); err != nil {
		return nil, fmt.Errorf("parse tokens %s: want lines of `cluster-id: token`: %w", path, err)
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

// AuthOption configures AuthInterceptor.
type AuthOption func(*authConfig)

type authConfig struct {
	peerToken string
}

// WithPeerToken makes the Replication service (hub replica to hub replica)
// admit only streams carrying token, the secret the replicas share. The peer
// token and the cluster tokens never admit each other's service: a spoke
// cannot replicate, a replica cannot publish. Without this option
// (development), Replication is open to every client.
func WithPeerToken(token string) AuthOption {
	return func(c *authConfig) { c.peerToken = token }
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

// AuthInterceptor returns a stream interceptor that admits only streams
// carrying one of tokens as "authorization: Bearer <token>" and remembers the
// cluster it belongs to. With nil tokens every stream is admitted. The
// Replication service is the exception: see WithPeerToken.
func AuthInterceptor(tokens Tokens, opts ...AuthOption) grpc.StreamServerInterceptor {
	var cfg authConfig
	for _, o := range opts {
		o(&cfg)
	}
	replication := "/" + fedv1.Replication_ServiceDesc.ServiceName + "/"
	return func(srv any, stream grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		authenticate := cfg.spoke
		if strings.HasPrefix(info.FullMethod, replication) {
			authenticate = cfg.replica
		}
		ctx, err := authenticate(stream.Context(), tokens)
		if err != nil {
			return err
		}
		wrapped := middleware.WrapServerStream(stream)
		wrapped.WrappedContext = ctx
		return handler(srv, wrapped)
	}
}

// spoke admits a stream carrying a cluster's token and remembers the cluster.
func (cfg authConfig) spoke(ctx context.Context, tokens Tokens) (context.Context, error) {
	if tokens == nil {
		return ctx, nil
	}
	tok, err := auth.AuthFromMD(ctx, "bearer")
	if err != nil {
		return nil, err
	}
	if cfg.isPeerToken(tok) {
		return nil, status.Error(codes.PermissionDenied, "the peer token cannot publish for a cluster")
	}
	c, err := tokens.Cluster(tok)
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, "unknown federation token")
	}
	return context.WithValue(ctx, authenticatedKey{}, c), nil
}

// replica admits a stream carrying the peer token; with none configured, every stream.
func (cfg authConfig) replica(ctx context.Context, tokens Tokens) (context.Context, error) {
	if cfg.peerToken == "" {
		return ctx, nil
	}
	tok, err := auth.AuthFromMD(ctx, "bearer")
	if err != nil {
		return nil, err
	}
	if cfg.isPeerToken(tok) {
		return ctx, nil
	}
	if _, err := tokens.Cluster(tok); err == nil {
		return nil, status.Error(codes.PermissionDenied, "a cluster's token cannot replicate")
	}
	return nil, status.Error(codes.Unauthenticated, "unknown peer token")
}

func (cfg authConfig) isPeerToken(tok string) bool {
	return cfg.peerToken != "" && subtle.ConstantTimeCompare([]byte(cfg.peerToken), []byte(tok)) == 1
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
