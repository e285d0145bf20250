package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// testLog discards below Warn unless -v; tests read errors in failures, not logs.
func testLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// logRecorder keeps the messages logged, for tests that await one.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) logger(t testing.TB) *slog.Logger {
	return slog.New(recordingHandler{r, testLog(t).Handler()})
}

// await waits until a message containing s was logged.
func (r *logRecorder) await(t testing.TB, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		found := slices.ContainsFunc(r.msgs, func(m string) bool { return strings.Contains(m, s) })
		r.mu.Unlock()
		if found {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("nothing logged %q within 10s", s)
}

type recordingHandler struct {
	r *logRecorder
	slog.Handler
}

func (h recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordingHandler) Handle(ctx context.Context, rec slog.Record) error {
	h.r.mu.Lock()
	h.r.msgs = append(h.r.msgs, rec.Message)
	h.r.mu.Unlock()
	if h.Handler.Enabled(ctx, rec.Level) {
		return h.Handler.Handle(ctx, rec)
	}
	return nil
}
func (h recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recordingHandler{h.r, h.Handler.WithAttrs(as)}
}
func (h recordingHandler) WithGroup(g string) slog.Handler {
	return recordingHandler{h.r, h.Handler.WithGroup(g)}
}

func contextWithCancel(t testing.TB) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	return ctx, cancel
}

// fastWatch polls quickly so tests see changes in tens of milliseconds.
var fastWatch = Watch{Interval: 10 * time.Millisecond, Settle: 30 * time.Millisecond}

// certPair makes a self-signed certificate for cn and its key, PEM encoded.
func certPair(t testing.TB, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: cn},
		DNSNames:              []string{cn},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := writeFileAtomic(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// sdsStream is a real SDS client: Envoy's side of the stream.
type sdsStream struct {
	t      *testing.T
	stream secretservice.SecretDiscoveryService_StreamSecretsClient
	last   *discovery.DiscoveryResponse
}

func dialSDS(t *testing.T, socket string, names ...string) *sdsStream {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := secretservice.NewSecretDiscoveryServiceClient(conn).StreamSecrets(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	s := &sdsStream{t: t, stream: stream}
	s.send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "test-envoy"}, TypeUrl: resource.SecretType, ResourceNames: names})
	return s
}

func (s *sdsStream) send(req *discovery.DiscoveryRequest) {
	s.t.Helper()
	if err := s.stream.Send(req); err != nil {
		s.t.Fatal(err)
	}
}

// next receives a response, ACKs it as Envoy does, and returns its secrets by name.
func (s *sdsStream) next() map[string]*tlsv3.Secret {
	s.t.Helper()
	type result struct {
		resp *discovery.DiscoveryResponse
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := s.stream.Recv()
		got <- result{resp, err}
	}()
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		s.t.Fatal("no SDS response within 10s")
	}
	if r.err != nil {
		s.t.Fatal(r.err)
	}
	out := map[string]*tlsv3.Secret{}
	var names []string
	for _, a := range r.resp.GetResources() {
		var sec tlsv3.Secret
		if err := a.UnmarshalTo(&sec); err != nil {
			s.t.Fatal(err)
		}
		out[sec.GetName()] = &sec
		names = append(names, sec.GetName())
	}
	s.last = r.resp
	s.send(&discovery.DiscoveryRequest{TypeUrl: resource.SecretType, VersionInfo: r.resp.GetVersionInfo(),
		ResponseNonce: r.resp.GetNonce(), ResourceNames: names})
	return out
}

func TestSDSServesAndRotatesSecrets(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	cert1, key1 := certPair(t, "shop.example.com")
	ca, _ := certPair(t, "client-ca")
	writeFile(t, certFile, cert1)
	writeFile(t, keyFile, key1)
	writeFile(t, caFile, ca)

	logs := &logRecorder{}
	sds, err := NewSDSServer([]SecretFiles{{Name: "shop-cert", CertFile: certFile, KeyFile: keyFile, CAFile: caFile}}, fastWatch, logs.logger(t))
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "sds.sock")
	lis, err := listenUnix(socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("SDS socket mode %v (%v), want 0600: only Envoy's user may ask for keys", fi.Mode(), err)
	}
	ctx, cancel := contextWithCancel(t)
	served := make(chan error, 1)
	go func() { served <- sds.Serve(ctx, lis) }()

	// Envoy asks for the certificate and its CA, and gets both.
	client := dialSDS(t, socket, "shop-cert", "shop-cert"+CASecretSuffix)
	secrets := client.next()
	tlsCert := secrets["shop-cert"].GetTlsCertificate()
	if string(tlsCert.GetCertificateChain().GetInlineBytes()) != string(cert1) || string(tlsCert.GetPrivateKey().GetInlineBytes()) != string(key1) {
		t.Fatalf("first secret %v: want the files' certificate and key inline", secrets["shop-cert"])
	}
	if got := secrets["shop-cert-cacert"].GetValidationContext().GetTrustedCa().GetInlineBytes(); string(got) != string(ca) {
		t.Fatalf("CA secret %v: want the CA file inline", secrets["shop-cert-cacert"])
	}

	// A broken rotation (a key that is not the certificate's) is refused...
	cert2, key2 := certPair(t, "shop.example.com")
	writeFile(t, certFile, cert2) // the key still is key1: no pair
	logs.await(t, "cannot load the changed certificate files")
	// ...and the good pair that follows is the next response: nothing was sent in between.
	writeFile(t, keyFile, key2)
	secrets = client.next()
	tlsCert = secrets["shop-cert"].GetTlsCertificate()
	if string(tlsCert.GetCertificateChain().GetInlineBytes()) != string(cert2) || string(tlsCert.GetPrivateKey().GetInlineBytes()) != string(key2) {
		t.Fatalf("after rotation: got a certificate other than the rotated pair (the broken pair was served?)")
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve = %v, want nil after the context ended", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the context ended")
	}
}

func TestSDSRefusesSecretsThatDoNotLoad(t *testing.T) {
	dir := t.TempDir()
	cert, key := certPair(t, "a")
	_, otherKey := certPair(t, "b")
	writeFile(t, filepath.Join(dir, "a.crt"), cert)
	writeFile(t, filepath.Join(dir, "a.key"), key)
	writeFile(t, filepath.Join(dir, "b.key"), otherKey)
	writeFile(t, filepath.Join(dir, "empty"), nil)
	f := func(name string) string { return filepath.Join(dir, name) }
	for _, tc := range []struct {
		name    string
		secrets []SecretFiles
		want    string
	}{
		{"key of another certificate", []SecretFiles{{Name: "a", CertFile: f("a.crt"), KeyFile: f("b.key")}}, "not a certificate and its key"},
		{"missing file", []SecretFiles{{Name: "a", CertFile: f("nope.crt"), KeyFile: f("a.key")}}, "nope.crt"},
		{"CA without certificates", []SecretFiles{{Name: "a", CertFile: f("a.crt"), KeyFile: f("a.key"), CAFile: f("empty")}}, "no PEM certificate"},
		{"twice", []SecretFiles{{Name: "a", CertFile: f("a.crt"), KeyFile: f("a.key")}, {Name: "a", CertFile: f("a.crt"), KeyFile: f("a.key")}}, "named twice"},
		{"no key", []SecretFiles{{Name: "a", CertFile: f("a.crt")}}, "--secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSDSServer(tc.secrets, fastWatch, testLog(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewSDSServer = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	if err := checkHubFiles(Hub{CertFile: f("a.crt"), KeyFile: f("b.key")}); err == nil {
		t.Error("checkHubFiles accepted a key that is not the certificate's")
	}
	if err := checkHubFiles(Hub{CAFile: f("empty")}); err == nil {
		t.Error("checkHubFiles accepted an empty CA file")
	}
	if err := checkHubFiles(Hub{CAFile: f("a.crt"), CertFile: f("a.crt"), KeyFile: f("a.key")}); err != nil {
		t.Errorf("checkHubFiles(good files) = %v", err)
	}
	var notExist *os.PathError
	if err := checkHubFiles(Hub{CAFile: f("gone")}); !errors.As(err, &notExist) {
		t.Errorf("checkHubFiles(missing CA) = %v, want the file's error", err)
	}
}

// A rotation between loading the secrets and serving them (the agent's
// start) is not lost: the watch starts from what was loaded.
func TestSDSServesARotationFromBeforeItServed(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	cert1, key1 := certPair(t, "shop.example.com")
	writeFile(t, certFile, cert1)
	writeFile(t, keyFile, key1)
	sds, err := NewSDSServer([]SecretFiles{{Name: "shop-cert", CertFile: certFile, KeyFile: keyFile}}, fastWatch, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	cert2, key2 := certPair(t, "shop.example.com")
	writeFile(t, certFile, cert2)
	writeFile(t, keyFile, key2)
	socket := filepath.Join(dir, "sds.sock")
	lis, err := listenUnix(socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := contextWithCancel(t)
	defer cancel()
	go func() { _ = sds.Serve(ctx, lis) }()
	client := dialSDS(t, socket, "shop-cert")
	for range 3 {
		if got := client.next()["shop-cert"].GetTlsCertificate().GetCertificateChain().GetInlineBytes(); string(got) == string(cert2) {
			return
		}
	}
	t.Fatal("the certificate rotated before SDS served was never pushed")
}
