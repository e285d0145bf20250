// Package e2e tests Nave end to end: real hubs (with embedded etcd), real
// spokes, real gRPC servers on loopback and real grpc-go xDS clients.
package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

func testLogger(t testing.TB, name string) *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("proc", name)
}

var tokens = federation.Tokens{
	"east":  "east-token-0123456789abcdef",
	"west":  "west-token-0123456789abcdef",
	"north": "north-token-0123456789abcdef",
}

type testHub struct {
	*hub.Hub
	admin string
}

// startHub runs a hub with its embedded etcd in a temporary data dir.
func startHub(t testing.TB, tune ...func(*hub.Config)) *testHub {
	t.Helper()
	dir := t.TempDir()
	tb, _ := yaml.Marshal(tokens)
	tokensFile := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokensFile, tb, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := hub.DefaultConfig()
	cfg.ID, cfg.DataDir, cfg.TokensFile = "test-hub", filepath.Join(dir, "data"), tokensFile
	cfg.FederationAddr, cfg.XDSAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	for _, f := range tune {
		f(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h, err := hub.Start(ctx, cfg, testLogger(t, "hub"))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = h.Wait() })
	return &testHub{Hub: h, admin: "http://" + h.AdminAddr.String()}
}

// testSpoke is a spoke publishing a directory of manifests.
type testSpoke struct {
	cluster registry.ClusterID
	dir     string
	cancel  context.CancelFunc
	done    chan error
}

// startSpoke runs a spoke for cluster over dir (created if needed).
func startSpoke(t testing.TB, h *testHub, cluster registry.ClusterID, dir, region string, tune ...func(*spoke.Config)) *testSpoke {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tokens[cluster]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := spoke.DefaultConfig()
	cfg.Cluster, cfg.Network, cfg.Region = cluster, "net1", region
	cfg.HubAddr, cfg.TokenFile, cfg.Source = h.FederationAddr.String(), tokenFile, "dir:"+dir
	cfg.PollInterval = 20 * time.Millisecond
	cfg.Federation.MinBackoff, cfg.Federation.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
	for _, f := range tune {
		f(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &testSpoke{cluster: cluster, dir: dir, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- spoke.Run(ctx, cfg, testLogger(t, "spoke-"+string(cluster))) }()
	t.Cleanup(s.stop)
	return s
}

func (s *testSpoke) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
	s.cancel = nil
}

// endpoint is one backend as an EndpointSlice names it.
type endpoint struct {
	backend xdstest.Backend
	zone    string
	ready   bool
}

// writeService writes a manifest file with an exported Service on port 8080
// and one EndpointSlice per endpoint (each backend listens on its own port).
func writeService(t testing.TB, dir, name string, eps ...endpoint) {
	t.Helper()
	svc := corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"nave.io/export": "true"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "grpc", Port: 8080, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("grpc"),
		}}},
	}
	docs := []any{svc}
	for i, e := range eps {
		port := int32(e.backend.Addr.Port)
		ready := e.ready
		docs = append(docs, discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i), Namespace: "default",
				Labels: map[string]string{"kubernetes.io/service-name": name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("grpc"), Port: &port}},
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{e.backend.Addr.IP.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready},
				Zone:       ptr(e.zone),
			}},
		})
	}
	var parts []string
	for _, d := range docs {
		b, err := yaml.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, string(b))
	}
	writeFile(t, filepath.Join(dir, name+".yaml"), strings.Join(parts, "---\n"))
}

// writeFile replaces a file atomically, so a spoke never reads half of it
// (creating its directory if needed).
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// await polls cond until it holds, failing the test after 20 seconds.
func await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	awaitFor(t, what, 20*time.Second, cond)
}

// awaitFor polls cond until it holds, failing the test after timeout.
func awaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// clustersOf returns the clusters that export service in the hub's registry.
func (h *testHub) clustersOf(service string) []registry.ClusterID {
	k, _ := registry.ParseServiceKey(service)
	if svc := h.View().Registry.Service(k); svc != nil {
		return svc.Clusters()
	}
	return nil
}

// getJSON decodes an admin API answer.
func (h *testHub) getJSON(t testing.TB, path string, v any) {
	t.Helper()
	getJSON(t, h.admin+path, v)
}

func locality(region, zone string) registry.Locality {
	return registry.Locality{Region: region, Zone: zone}
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// freeAddr returns a loopback address nothing listens on (see nettest.FreeAddr).
func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := nettest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func httpStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func httpBody(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
