package federation

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

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

// AuthInterceptor returns a stream interceptor that admits only streams
// carrying one of tokens as "authorization: Bearer <token>" and remembers the
// cluster it belongs to. With nil tokens every stream is admitted.
func AuthInterceptor(tokens Tokens) grpc.StreamServerInterceptor {
	return auth.StreamServerInterceptor(func(ctx context.Context) (context.Context, error) {
		if tokens == nil {
			return ctx, nil
		}
		tok, err := auth.AuthFromMD(ctx, "bearer")
		if err != nil {
			return nil, err
		}
		c, err := tokens.Cluster(tok)
		if err != nil {
			return nil, status.Error(codes.Unauthenticated, "unknown federation token")
		}
		return context.WithValue(ctx, authenticatedKey{}, c), nil
	})
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
