package spoke

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/identity"
)

// minConnectTimeout is the least time a connection attempt to the hub is
// given (grpc's default): a TLS handshake far away may be slow.
const minConnectTimeout = 20 * time.Second

// credentialsReload is how often the spoke's credential files are checked for changes.
const credentialsReload = time.Second

// hubDialOptions are how the spoke connects to the hub: over TLS with
// HubCAFile, presenting CertFile when the hub asks, with the token of
// TokenFile. The files are read again when they change (until ctx ends),
// so rotating them needs no restart; the next connection uses them.
func hubDialOptions(ctx context.Context, cfg Config, log *slog.Logger) ([]grpc.DialOption, error) {
	transport := insecure.NewCredentials()
	var reloads []func() (bool, error)
	if cfg.CertFile != "" && cfg.HubCAFile == "" {
		return nil, errors.New("a client certificate (--cert) needs TLS to the hub: set --hub-ca")
	}
	if cfg.HubCAFile != "" {
		store, err := identity.Load(identity.Files{Cert: cfg.CertFile, Key: cfg.KeyFile, CA: cfg.HubCAFile}, log)
		if err != nil {
			return nil, fmt.Errorf("hub TLS: %w", err)
		}
		transport = store.ClientCreds(cfg.HubServerName, nil)
		reloads = append(reloads, store.Reload)
	}
	f := cfg.Federation
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// The connection's own backoff follows the publisher's bounds, not
		// grpc's default (1 s growing to 120 s): while it backs off, every
		// session attempt fails at once. The publisher resets it when the
		// hub's port answers again (see federation.SpokeWiring.HubAddr).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: max(f.MinBackoff, time.Millisecond), Multiplier: 2, Jitter: 0.2, MaxDelay: max(f.MaxBackoff, f.MinBackoff, time.Millisecond)},
			MinConnectTimeout: minConnectTimeout,
		}),
	}
	if cfg.TokenFile != "" {
		tok := &tokenFile{path: cfg.TokenFile, allowInsecure: cfg.HubCAFile == ""}
		if _, err := tok.Reload(); err != nil {
			return nil, err
		}
		// Over TLS the token is protected; without it, sending it anyway is the operator's choice (loopback, demos).
		opts = append(opts, grpc.WithPerRPCCredentials(tok))
		reloads = append(reloads, tok.Reload)
	}
	if len(reloads) > 0 {
		go identity.Watch(ctx, log.With("component", "credentials"), credentialsReload, nil, reloads...)
	}
	return opts, nil
}

// tokenFile sends the token its file holds with every RPC, read again when it changes.
type tokenFile struct {
	path          string
	allowInsecure bool
	token         atomic.Pointer[string]
}

func (t *tokenFile) Reload() (bool, error) {
	tok, err := federation.LoadToken(t.path)
	if err != nil {
		return false, err
	}
	if old := t.token.Load(); old != nil && *old == tok {
		return false, nil
	}
	t.token.Store(&tok)
	return true, nil
}

func (t *tokenFile) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	return federation.TokenCredentials{Token: *t.token.Load()}.GetRequestMetadata(ctx, uri...)
}

func (t *tokenFile) RequireTransportSecurity() bool { return !t.allowInsecure }
