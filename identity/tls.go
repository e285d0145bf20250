package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ServerOptions configure ServerConfig.
type ServerOptions struct {
	// TrustDomain is the trust domain client identities must belong to ("": any).
	TrustDomain string
	// ClientCertOptional lets a client without a certificate through the
	// handshake (it then authenticates otherwise, with a token). A client
	// that presents one is verified all the same.
	ClientCertOptional bool
	// Refused is told about every handshake refused for its client
	// certificate (none where one is required, "no_client_certificate",
	// included), with Reason's label (nil: nobody is told). It is called
	// once per refused handshake: a caller that logs must rate-limit (see
	// limits.RefusalLog).
	Refused func(reason string, err error)
}

// ServerConfig is a TLS server configuration presenting the store's
// current certificate. With a CA in the store it asks clients for
// certificates and verifies them against the current CA and CRL.
func (s *Store) ServerConfig(opts ServerOptions) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// No resumption: every connection proves it holds its
		// certificate's key, and is verified against the CA and CRL of the moment.
		SessionTicketsDisabled: true,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if m := s.Material(); m.Cert != nil {
				return m.Cert, nil
			}
			return nil, errors.New("identity: no server certificate")
		},
	}
	if s.Material().Roots == nil {
		return cfg
	}
	// Requested, never required of crypto/tls: a client that presents
	// none would be refused inside the handshake, before VerifyConnection,
	// so nobody would count or log it. VerifyConnection refuses it
	// (ErrNoClientCert) where a certificate is required.
	cfg.ClientAuth = tls.RequestClientCert
	// VerifyConnection sees the chain the connection keeps (PeerChain):
	// Verify remembers it, so the connection's streams need not verify it again.
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		chain := cs.PeerCertificates
		if len(chain) == 0 && opts.ClientCertOptional {
			return nil
		}
		_, err := s.Material().Verify(chain, x509.ExtKeyUsageClientAuth, opts.TrustDomain, time.Now())
		if err != nil && opts.Refused != nil {
			opts.Refused(Reason(err), err)
		}
		return err
	}
	return cfg
}

// ClientCreds are gRPC transport credentials that present the store's
// current certificate (if any) and verify the server's for the name
// dialled (serverName, else the target's host, IP addresses included)
// against the current CA (the system's without one). Each handshake
// reads the store again, so renewals and a new CA take effect at the
// next connection. serverID, when set, must also accept the server
// certificate's SPIFFE ID.
func (s *Store) ClientCreds(serverName string, serverID func(ID) error) credentials.TransportCredentials {
	return &clientCreds{store: s, serverName: serverName, serverID: serverID}
}

type clientCreds struct {
	store      *Store
	serverName string
	serverID   func(ID) error
}

// config is the TLS configuration of one handshake: standard
// verification (chain, usages, host name or IP) with the current roots.
func (c *clientCreds) config() *tls.Config {
	m := c.store.Material()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: m.Roots, ServerName: c.serverName}
	if m.Cert != nil {
		cfg.Certificates = []tls.Certificate{*m.Cert}
	}
	if c.serverID != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			id, err := Of(cs.PeerCertificates[0])
			if err != nil {
				return fmt.Errorf("the server's certificate: %w", err)
			}
			return c.serverID(id)
		}
	}
	return cfg
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.config()).ClientHandshake(ctx, authority, raw)
}

func (c *clientCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("identity: client credentials cannot serve")
}

func (c *clientCreds) Info() credentials.ProtocolInfo { return credentials.NewTLS(c.config()).Info() }

func (c *clientCreds) Clone() credentials.TransportCredentials {
	clone := *c
	return &clone
}

//nolint:staticcheck // part of the interface, deprecated
func (c *clientCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}

// PeerChain returns the certificate chain the peer of a gRPC call
// presented over TLS (nil: none, or no TLS).
func PeerChain(ctx context.Context) []*x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	return info.State.PeerCertificates
}
