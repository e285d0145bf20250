package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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
	// Refused is told about every client certificate refused at the
	// handshake, with Reason's label (nil: nobody is told).
	Refused func(reason string, err error)
}

// ServerConfig is a TLS server configuration presenting the store's
// current certificate. With a CA in the store it asks clients for
// certificates and verifies them against the current CA and CRL.
func (s *Store) ServerConfig(opts ServerOptions) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
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
	cfg.ClientAuth = tls.RequireAnyClientCert
	if opts.ClientCertOptional {
		cfg.ClientAuth = tls.RequestClientCert
	}
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 && opts.ClientCertOptional {
			return nil
		}
		chain, err := parseChain(raw)
		if err == nil {
			_, err = s.Material().Verify(chain, x509.ExtKeyUsageClientAuth, opts.TrustDomain, time.Now())
		}
		if err != nil && opts.Refused != nil {
			opts.Refused(Reason(err), err)
		}
		return err
	}
	return cfg
}

// ClientConfig is a TLS client configuration presenting the store's
// current certificate (if any) and verifying the server's for the name
// dialled against the current CA (the system's without one).
func (s *Store) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if m := s.Material(); m.Cert != nil {
				return m.Cert, nil
			}
			return &tls.Certificate{}, nil
		},
		// Verified below against the CA of the moment, which a static RootCAs cannot follow.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("identity: the server presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: s.Material().Roots, Intermediates: inter, DNSName: cs.ServerName,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			return err
		},
	}
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
