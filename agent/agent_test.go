package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/navemesh/nave/gateways"
)

// TestRunServesAGateway runs the whole agent with the Envoy test double:
// the bootstrap it writes, SDS on the work directory's socket, readiness,
// a hot restart when the hub's CA changes, and the drain on shutdown.
func TestRunServesAGateway(t *testing.T) {
	dir := t.TempDir()
	rec := recordFile(filepath.Join(dir, "record.jsonl"))
	t.Setenv("FAKEENVOY_RECORD", string(rec))
	cert, key := certPair(t, "shop.example.com")
	hubCA, _ := certPair(t, "hub-ca")
	f := func(name string) string { return filepath.Join(dir, name) }
	writeFile(t, f("tls.crt"), cert)
	writeFile(t, f("tls.key"), key)
	writeFile(t, f("hub-ca.crt"), hubCA)

	cfg := DefaultConfig()
	cfg.Node = Node{ID: "ingress-0", Role: gateways.RoleIngress, Network: "net-a", ClusterID: "east", Region: "r1", Zone: "z1",
		Listeners: "8443/https:shop"}
	cfg.Hub = Hub{Addr: "127.0.0.1:15011", CAFile: f("hub-ca.crt")}
	cfg.AdminPort = freePort(t)
	cfg.StatusAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg.WorkDir = f("work")
	cfg.Secrets = []SecretFiles{{Name: "shop", CertFile: f("tls.crt"), KeyFile: f("tls.key")}}
	cfg.Watch = fastWatch
	cfg.Envoy.Binary = fakeEnvoy(t)
	cfg.Envoy.DrainTime, cfg.Envoy.ParentShutdown, cfg.Envoy.DrainDuration = time.Second, 2*time.Second, 100*time.Millisecond
	cfg.Envoy.Stdout, cfg.Envoy.Stderr = testWriter{t}, testWriter{t}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, testLog(t)) }()

	base := "http://" + cfg.StatusAddr
	evs := rec.await(t, "Envoy", count("start", 1))
	awaitStatus(t, base, ReadyPath, http.StatusOK)

	// The bootstrap Envoy was given is the gateway's.
	raw, err := os.ReadFile(flagValue(evs[0].Args, "-c"))
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrap.Bootstrap
	if err := protojson.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	if n, ok, err := gateways.ParseNode(b.GetNode(), gateways.Exposure{}); !ok || err != nil || n.Listeners[0].Secret != "shop" {
		t.Errorf("the bootstrap's node reads as %+v (%v, %v)", n, ok, err)
	}

	// Envoy's SDS cluster reaches the agent's SDS server.
	socket := b.GetStaticResources().GetClusters()[1].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
	if secrets := dialSDS(t, socket, "shop").next(); string(secrets["shop"].GetTlsCertificate().GetCertificateChain().GetInlineBytes()) != string(cert) {
		t.Errorf("SDS on %s served %v, want the shop certificate", socket, secrets)
	}

	// A new hub CA: hot restart.
	rotated, _ := certPair(t, "hub-ca-2")
	writeFile(t, f("hub-ca.crt"), rotated)
	evs = rec.await(t, "a hot restart", count("start", 2))
	if got := flagValue(filter(evs, "start")[1].Args, "--restart-epoch"); got != "1" {
		t.Errorf("after the CA changed: epoch %s, want 1", got)
	}
	// The new Envoy takes the admin address over from its parent (the drain
	// below goes to whichever holds it).
	rec.await(t, "epoch 1 holding the admin", epochEvent("admin", 1))

	// Shutdown: not ready at once, drained, then stopped; Run returns nil.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	evs = rec.events(t)
	if len(filter(evs, "drain")) != 1 || len(filter(evs, "exit")) != 2 {
		t.Errorf("want one drain and both Envoys gone:\n%s", dump(evs))
	}
	if _, err := http.Get(base + LivePath); err == nil {
		t.Error("the status server still answers after Run returned")
	}
}

func TestRunRefusesBadConfigBeforeStarting(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no role", func(c *Config) { c.Node.Role = "" }, "--role"},
		{"hub CA missing", func(c *Config) { c.Hub.CAFile = filepath.Join(dir, "nope.crt") }, "--hub-ca"},
		{"secret missing", func(c *Config) {
			c.Secrets = []SecretFiles{{Name: "x", CertFile: filepath.Join(dir, "x.crt"), KeyFile: filepath.Join(dir, "x.key")}}
		}, "x.crt"},
		{"no envoy", func(c *Config) { c.Envoy.Binary = filepath.Join(dir, "no-envoy") }, "--envoy"},
		{"drain time", func(c *Config) { c.Envoy.DrainTime = time.Hour }, "--parent-shutdown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Node = Node{ID: "gw", Role: gateways.RoleEastWest, Network: "net-a"}
			cfg.WorkDir = filepath.Join(dir, tc.name)
			cfg.Envoy.Binary = os.Args[0] // exists; never run, every case fails first
			tc.edit(&cfg)
			err := Run(t.Context(), cfg, testLog(t))
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run = %v, want a configuration error mentioning %q", err, tc.want)
			}
			if _, err := os.Stat(cfg.WorkDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("Run created %s before refusing", cfg.WorkDir)
			}
		})
	}
}

func TestListenersNeedTheirSecrets(t *testing.T) {
	secrets := []SecretFiles{{Name: "shop", CertFile: "c", KeyFile: "k"}}
	if err := checkListenerSecrets("8080/http,8443/https:shop,9443/passthrough", secrets); err != nil {
		t.Errorf("listeners whose secrets are served: %v", err)
	}
	if err := checkListenerSecrets("8443/https:other", secrets); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "--secret other=") {
		t.Errorf("an https listener without its secret: %v, want a clear refusal", err)
	}
}
