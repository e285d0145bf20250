package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/limits"
	"github.com/navemesh/nave/xds"
)

// credentialsReload is how often credential files are checked for changes.
const credentialsReload = time.Second

// loadCredentials reads the spokes' tokens, the peer token, the
// certificates of the federation and xDS ports and the xDS policy, and
// sets up the transport credentials of both servers and of peer replicas.
func (p *parts) loadCredentials() error {
	p.conns = identity.NewConns()
	p.sessions = identity.NewSessions(p.log.With("component", "sessions"), p.conns)
	for _, step := range []func() error{p.loadTokens, p.loadFederationTLS, p.loadPeerTLS, p.loadXDSTLS} {
		if err := step(); err != nil {
			return err
		}
	}
	if p.cfg.AdminTokenFile != "" {
		var err error
		if p.adminToken, err = newAdminToken(p.cfg.AdminTokenFile, p.log.With("component", "admin")); err != nil {
			return err
		}
	}
	return nil
}

// loadTokens reads the cluster tokens and the peer token.
func (p *parts) loadTokens() (err error) {
	cfg, log := p.cfg, p.log
	// Every version of either file: no cluster's token may be a peer token.
	if cfg.PeerTokenFile != "" {
		check := func(peers federation.PeerTokens) error { return peers.Validate(p.clusterTokens()) }
		if p.peerTokens, err = federation.OpenPeerTokens(cfg.PeerTokenFile, check); err != nil {
			return err
		}
	}
	if cfg.TokensFile != "" {
		check := func(t federation.Tokens) error { return p.currentPeerTokens().Validate(t) }
		if p.tokens, err = federation.OpenTokens(cfg.TokensFile, check); err != nil {
			return err
		}
	} else if cfg.ClientCAFile == "" {
		log.Warn("no --tokens file and no --client-ca: any spoke may publish for any cluster (development only)")
	}
	p.gossip = len(cfg.Join) > 0 || cfg.GossipAddr != ""
	if p.gossip && p.peerTokens == nil && cfg.ClientCAFile == "" {
		log.Warn("no --peer-token-file and no --client-ca: any process may replicate with this hub (development only)")
	}
	return nil
}

func (p *parts) clusterTokens() federation.Tokens {
	if p.tokens == nil {
		return nil
	}
	return p.tokens.Tokens()
}

// currentPeerTokens are the peer tokens the file holds now (none without one).
func (p *parts) currentPeerTokens() federation.PeerTokens {
	if p.peerTokens == nil {
		return nil
	}
	return p.peerTokens.Tokens()
}

// peerToken is the token this replica presents to its peers (nil: none).
func (p *parts) peerToken() func() string {
	if p.peerTokens == nil {
		return nil
	}
	return func() string { return p.peerTokens.Tokens().Present() }
}

// loadFederationTLS sets up the federation server's TLS: its certificate,
// and with --client-ca the client certificates it verifies.
func (p *parts) loadFederationTLS() (err error) {
	cfg := p.cfg
	p.fedCreds = insecure.NewCredentials()
	if cfg.TLSCertFile == "" && cfg.TLSKeyFile == "" {
		if p.tokens != nil {
			p.log.Warn("federation without TLS: spoke tokens travel in clear (set --tls-cert and --tls-key)")
		}
		return nil
	}
	if p.fedCerts, err = identity.Load(identity.Files{Cert: cfg.TLSCertFile, Key: cfg.TLSKeyFile, CA: cfg.ClientCAFile, CRL: cfg.CRLFile}, p.log); err != nil {
		return fmt.Errorf("federation TLS: %w", err)
	}
	p.fedCreds = p.conns.Creds(credentials.NewTLS(p.fedCerts.ServerConfig(identity.ServerOptions{
		TrustDomain:        cfg.TrustDomain,
		ClientCertOptional: cfg.TokensFile != "" || cfg.PeerTokenFile != "",
		Refused:            p.refusedHandshake("federation"),
	})))
	return nil
}

// loadPeerTLS sets up how replicas dial each other's federation port:
// over TLS when it speaks TLS, trusting --peer-ca, presenting the
// replica's certificate when peers ask for one.
func (p *parts) loadPeerTLS() (err error) {
	cfg := p.cfg
	p.peerCreds = insecure.NewCredentials()
	if cfg.TLSCertFile == "" || !p.gossip {
		return nil
	}
	if p.peerCerts, err = identity.Load(identity.Files{Cert: cfg.TLSCertFile, Key: cfg.TLSKeyFile, CA: cfg.PeerCAFile}, p.log); err != nil {
		return fmt.Errorf("peer TLS: %w", err)
	}
	if cfg.ClientCAFile != "" && p.peerTokens == nil {
		// Without the peer token, replicas know each other by their certificates.
		id, err := identity.Of(p.peerCerts.Material().Leaf)
		if _, replica := id.Replica(); err != nil || !replica || id.TrustDomain != cfg.TrustDomain {
			return fmt.Errorf("--tls-cert must name this replica (spiffe://%s/nave/replica/%s) for its peers, or set --peer-token-file", cfg.TrustDomain, cfg.ID)
		}
	}
	var peerID func(identity.ID) error
	if cfg.ClientCAFile != "" {
		// Replicas know each other by their identities: a peer's server must be a replica's.
		peerID = func(id identity.ID) error {
			if _, replica := id.Replica(); !replica || id.TrustDomain != cfg.TrustDomain {
				return fmt.Errorf("peer %s is no replica of trust domain %s", id, cfg.TrustDomain)
			}
			return nil
		}
	}
	p.peerCreds = p.peerCerts.ClientCreds("", peerID)
	return nil
}

// loadXDSTLS sets up the xDS server's TLS, client certificates and policy.
func (p *parts) loadXDSTLS() (err error) {
	cfg := p.cfg
	p.xdsCreds = insecure.NewCredentials()
	if cfg.XDSTLSCertFile == "" && cfg.XDSTLSKeyFile == "" {
		return nil
	}
	crl := cfg.CRLFile
	if cfg.XDSClientCAFile == "" {
		crl = ""
	}
	if p.xdsCerts, err = identity.Load(identity.Files{Cert: cfg.XDSTLSCertFile, Key: cfg.XDSTLSKeyFile, CA: cfg.XDSClientCAFile, CRL: crl}, p.log); err != nil {
		return fmt.Errorf("xDS TLS: %w", err)
	}
	p.xdsCreds = p.conns.Creds(credentials.NewTLS(p.xdsCerts.ServerConfig(identity.ServerOptions{TrustDomain: cfg.TrustDomain, Refused: p.refusedHandshake("xds")})))
	if cfg.XDSPolicyFile != "" {
		if p.policy, err = identity.OpenPolicy(cfg.XDSPolicyFile); err != nil {
			return err
		}
	}
	return nil
}

// refusedHandshake counts and logs a client certificate refused on port.
func (p *parts) refusedHandshake(port string) func(string, error) {
	logged := limits.NewRefusalLog(p.log, 0, 0) // a handshake flood logs a few lines a minute
	return func(reason string, err error) {
		if p.metrics != nil {
			p.metrics.tlsRefused.WithLabelValues(port, reason).Inc()
		}
		logged.Warn(reason, "refused a client certificate", "port", port, "reason", reason, "err", err)
	}
}

// federationCredentials is what the federation port admits.
func (p *parts) federationCredentials() federation.Credentials {
	c := federation.Credentials{
		Tokens:     p.clusterTokens,
		PeerTokens: p.currentPeerTokens,
		Sessions:   p.sessions, TrustDomain: p.cfg.TrustDomain,
	}
	if p.cfg.ClientCAFile != "" {
		c.Certs = p.fedCerts
	}
	return c
}

// restrictXDS is what an xDS client may receive under the policy: what
// its stream was granted (policyGrant), nothing without a rule.
func (p *parts) restrictXDS(ctx context.Context) (xds.Restriction, string, error) {
	g, ok := ctx.Value(grantKey{}).(grant)
	if !ok { // not held under the policy (no client certificate): nothing
		g = p.grantUnder(p.policy.Policy(), ctx)
	}
	if g.all {
		return nil, g.who, nil
	}
	allowed := make(map[string]bool, len(g.namespaces))
	for _, ns := range g.namespaces {
		allowed[ns] = true
	}
	return func(ns string) bool { return allowed[ns] }, g.who, nil
}

// grant is what the policy grants a client identity.
type grant struct {
	who        string
	all        bool
	namespaces []string // sorted
}

type grantKey struct{}

func (g grant) equal(o grant) bool { return g.all == o.all && slices.Equal(g.namespaces, o.namespaces) }

// grantUnder is what policy grants the identity of a stream's peer.
func (p *parts) grantUnder(policy *identity.Policy, ctx context.Context) grant {
	chain := identity.PeerChain(ctx)
	if len(chain) == 0 {
		return grant{who: "no identity"}
	}
	id, err := identity.Of(chain[0])
	if err != nil {
		return grant{who: chain[0].Subject.String()}
	}
	all, namespaces := policy.Allows(id)
	return grant{who: id.String(), all: all, namespaces: namespaces}
}

// policyGrant decides what the policy grants a new xDS stream, once: the
// stream is restricted to it (restrictXDS reads it from the context), and
// its session ends, for its client to reconnect, when a reloaded policy
// grants it otherwise. Streams whose grant is unchanged go on.
func (p *parts) policyGrant(ctx context.Context) (context.Context, func() error) {
	var seen atomic.Pointer[identity.Policy] // the last policy the grant was checked under
	seen.Store(p.policy.Policy())
	granted := p.grantUnder(seen.Load(), ctx)
	return context.WithValue(ctx, grantKey{}, granted), func() error {
		now := p.policy.Policy()
		if seen.Load() == now {
			return nil
		}
		if !p.grantUnder(now, ctx).equal(granted) {
			return fmt.Errorf("%w: the xDS policy changed what it grants %s", identity.ErrReconnect, granted.who)
		}
		seen.Store(now)
		return nil
	}
}

// watchCredentials reloads every credential file once a second; when one
// changed, open sessions are checked again and those whose credential no
// longer holds end. It also ends sessions as their certificates expire.
func (p *parts) watchCredentials(ctx context.Context) {
	var reloads []func() (bool, error)
	for _, s := range []*identity.Store{p.fedCerts, p.peerCerts, p.xdsCerts} {
		if s != nil {
			reloads = append(reloads, s.Reload)
		}
	}
	if p.tokens != nil {
		reloads = append(reloads, p.tokens.Reload)
	}
	if p.peerTokens != nil {
		reloads = append(reloads, logged(p.log, "reloaded the peer tokens", p.peerTokens.Reload, func() []any {
			t := p.peerTokens.Tokens()
			sum := sha256.Sum256([]byte(t.Present()))
			return []any{"tokens", len(t), "presented", hex.EncodeToString(sum[:4])}
		}))
	}
	if p.policy != nil {
		reloads = append(reloads, logged(p.log, "reloaded the xDS policy", p.policy.Reload, func() []any {
			return []any{"rules", len(p.policy.Policy().Rules)}
		}))
	}
	identity.Watch(ctx, p.log.With("component", "credentials"), credentialsReload, p.sessions.Recheck, reloads...)
}

// logged is reload, logging msg with what attrs says when it changed something.
func logged(log *slog.Logger, msg string, reload func() (bool, error), attrs func() []any) func() (bool, error) {
	return func() (bool, error) {
		changed, err := reload()
		if changed {
			log.Info(msg, attrs()...)
		}
		return changed, err
	}
}
