package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
)

// SecretFiles names the PEM files one SDS secret is read from.
type SecretFiles struct {
	// Name is the secret's name: what a listener's SDS config asks for
	// (an ingress listener PORT/https:NAME).
	Name string
	// CertFile (the chain, leaf first) and KeyFile make the secret's tls_certificate.
	CertFile, KeyFile string
	// CAFile, when set, is also served, as the validation context secret
	// Name+CASecretSuffix (Istio's convention for client-certificate checks).
	CAFile string
}

// CASecretSuffix names the validation-context secret served beside a
// secret whose SecretFiles has a CAFile.
const CASecretSuffix = "-cacert"

// SDSServer serves certificates read from files to Envoy over SDS, and
// pushes them again when the files change. A change that does not load (a
// key that does not match its certificate, a file gone) is logged, and the
// last good secret stays served.
type SDSServer struct {
	secrets []SecretFiles
	// loaded is what each secret's files held, summed just before they
	// were first read: the watch starts from it.
	loaded map[string]fileSum
	watch  Watch
	cache  *cache.LinearCache
	log    *slog.Logger
}

// NewSDSServer loads every secret once: a secret that does not load at
// start is an error (a wrong --secret flag should not become a gateway
// that never serves its listener).
func NewSDSServer(secrets []SecretFiles, watch Watch, log *slog.Logger) (*SDSServer, error) {
	log = log.With("component", "sds")
	s := &SDSServer{
		secrets: secrets, loaded: map[string]fileSum{},
		watch: watch,
		cache: cache.NewLinearCache(resource.SecretType,
			cache.WithVersionPrefix(strconv.FormatInt(time.Now().UnixNano(), 36)+"-"),
			cache.WithLogger(cacheLog{log})),
		log: log,
	}
	seen := map[string]bool{}
	for _, sf := range secrets {
		names := []string{sf.Name}
		if sf.CAFile != "" {
			names = append(names, sf.Name+CASecretSuffix)
		}
		for _, n := range names {
			if seen[n] {
				return nil, fmt.Errorf("%w: secret %q is named twice (--secret)", ErrInvalidConfig, n)
			}
			seen[n] = true
		}
		if sf.Name == "" || sf.CertFile == "" || sf.KeyFile == "" {
			return nil, fmt.Errorf("%w: secret %q: want a name, a certificate file and a key file (--secret NAME=CERT,KEY[,CA])", ErrInvalidConfig, sf.Name)
		}
		sum := sumFiles(secretFileList(sf))
		if err := s.load(sf); err != nil {
			return nil, fmt.Errorf("%w: %v (--secret)", ErrInvalidConfig, err)
		}
		s.loaded[sf.Name] = sum
	}
	return s, nil
}

// Serve serves SDS on lis until ctx ends, watching the secrets' files.
func (s *SDSServer) Serve(ctx context.Context, lis net.Listener) error {
	gs := grpc.NewServer()
	secretservice.RegisterSecretDiscoveryServiceServer(gs, serverv3.NewServer(ctx, s.cache, nil))
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, sf := range s.secrets {
		wg.Go(func() {
			sum := s.loaded[sf.Name]
			watchFiles(ctx, s.watch, secretFileList(sf), &sum, s.log, func() {
				if err := s.load(sf); err != nil {
					s.log.Error("cannot load the changed certificate files; still serving the last good secret", "secret", sf.Name, "error", err)
				}
			})
		})
	}
	// Envoy's SDS streams live as long as Envoy: stop, not a graceful stop that would wait for them.
	wg.Go(func() {
		<-ctx.Done()
		gs.Stop()
	})
	s.log.Info("serving SDS", "address", lis.Addr().String(), "secrets", len(s.secrets))
	if err := gs.Serve(lis); err != nil && ctx.Err() == nil {
		return fmt.Errorf("serve SDS: %w", err)
	}
	return nil
}

func secretFileList(sf SecretFiles) []string {
	files := []string{sf.CertFile, sf.KeyFile}
	if sf.CAFile != "" {
		files = append(files, sf.CAFile)
	}
	return files
}

// load reads a secret's files, checks them and publishes the secret(s).
func (s *SDSServer) load(sf SecretFiles) error {
	res, err := loadSecret(sf)
	if err != nil {
		return err
	}
	if err := s.cache.UpdateResources(res, nil); err != nil {
		return fmt.Errorf("secret %q: %w", sf.Name, err)
	}
	s.log.Info("serving secret", "secret", sf.Name, "cert", sf.CertFile, "ca", sf.CAFile != "")
	return nil
}

// loadSecret reads and checks a secret's files: the key must match the
// certificate, and a CA file must hold at least one certificate.
func loadSecret(sf SecretFiles) (map[string]types.Resource, error) {
	certPEM, err := os.ReadFile(sf.CertFile)
	if err != nil {
		return nil, fmt.Errorf("secret %q: %w", sf.Name, err)
	}
	keyPEM, err := os.ReadFile(sf.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("secret %q: %w", sf.Name, err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("secret %q: %s and %s are not a certificate and its key: %w", sf.Name, sf.CertFile, sf.KeyFile, err)
	}
	out := map[string]types.Resource{sf.Name: &tlsv3.Secret{
		Name: sf.Name,
		Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(certPEM),
			PrivateKey:       inline(keyPEM),
		}},
	}}
	if sf.CAFile != "" {
		caPEM, err := os.ReadFile(sf.CAFile)
		if err != nil {
			return nil, fmt.Errorf("secret %q: %w", sf.Name, err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("secret %q: %s holds no PEM certificate", sf.Name, sf.CAFile)
		}
		name := sf.Name + CASecretSuffix
		out[name] = &tlsv3.Secret{
			Name: name,
			Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inline(caPEM)}},
		}
	}
	return out, nil
}

func inline(b []byte) *core.DataSource {
	return &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: b}}
}

// checkHubFiles checks the hub TLS files the bootstrap names as Envoy will
// load them: a CA file with a certificate, a client certificate matching its key.
func checkHubFiles(h Hub) error {
	if h.CAFile != "" {
		ca, err := os.ReadFile(h.CAFile)
		if err != nil {
			return fmt.Errorf("hub CA: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(ca) {
			return fmt.Errorf("hub CA: %s holds no PEM certificate", h.CAFile)
		}
	}
	if h.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(h.CertFile, h.KeyFile); err != nil {
			return fmt.Errorf("hub client certificate: %s and %s: %w", h.CertFile, h.KeyFile, err)
		}
	}
	return nil
}

// listenUnix listens on a unix socket at path, replacing a stale socket
// (from an agent that died) and letting only this user connect.
func listenUnix(path string) (net.Listener, error) {
	// A socket someone answers on is another agent's: never take it over.
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("another process serves %s (another agent with the same --work-dir?)", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, err
	}
	return lis, nil
}

// cacheLog routes go-control-plane's cache logs into slog (its Info is per watch: Debug here).
type cacheLog struct{ l *slog.Logger }

func (c cacheLog) Debugf(format string, args ...any) { c.l.Debug(fmt.Sprintf(format, args...)) }
func (c cacheLog) Infof(format string, args ...any)  { c.l.Debug(fmt.Sprintf(format, args...)) }
func (c cacheLog) Warnf(format string, args ...any)  { c.l.Warn(fmt.Sprintf(format, args...)) }
func (c cacheLog) Errorf(format string, args ...any) { c.l.Error(fmt.Sprintf(format, args...)) }
