package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

// startDemoHub runs a real hub and the demo's east and west spokes.
func startDemoHub(t *testing.T) string {
	t.Helper()
	return "http://" + startDemoHubWith(t, nil).AdminAddr.String()
}

// startDemoHubWith is startDemoHub with each spoke's configuration changed
// by tune; it returns the hub.
func startDemoHubWith(t *testing.T, tune func(*spoke.Config)) *hub.Hub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.DiscardHandler)
	cfg := hub.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.FederationAddr, cfg.XDSAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	h, err := hub.Start(ctx, cfg, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var spokes []chan error
	for _, c := range []struct{ id, region string }{{"east", "us-east"}, {"west", "us-west"}} {
		sc := spoke.DefaultConfig()
		sc.Cluster, sc.Region, sc.HubAddr = registry.ClusterID(c.id), c.region, h.FederationAddr.String()
		sc.Source = "dir:" + filepath.Join("..", "..", "deploy", "demo", c.id)
		if tune != nil {
			tune(&sc)
		}
		done := make(chan error, 1)
		go func() { done <- spoke.Run(ctx, sc, log) }()
		spokes = append(spokes, done)
	}
	t.Cleanup(func() {
		cancel()
		for _, s := range spokes {
			<-s
		}
		_ = h.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if svc := h.View().Registry.Services(); len(svc) == 1 && len(svc[0].Shards) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("demo/echo never arrived from east and west")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return h
}

// priorityRows are the rows of `navectl endpoints` output (those that start
// with a priority), their columns separated by one space.
func priorityRows(out string) []string {
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if len(l) > 1 && l[0] >= '0' && l[0] <= '9' && l[1] == ' ' {
			rows = append(rows, strings.Join(strings.Fields(l), " "))
		}
	}
	return rows
}

func navectl(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(args, &out); err != nil {
		t.Fatalf("navectl %s: %v", strings.Join(args, " "), err)
	}
	return out.String()
}

func TestNavectlAgainstARealHub(t *testing.T) {
	url := startDemoHub(t)

	clusters := navectl(t, "--hub", url, "clusters")
	for _, want := range []string{"CLUSTER", "east", "west", "connected"} {
		if !strings.Contains(clusters, want) {
			t.Errorf("clusters output lacks %q:\n%s", want, clusters)
		}
	}

	services := navectl(t, "--hub", url, "services")
	if !strings.Contains(services, "demo/echo") || !strings.Contains(services, "east,west") || !strings.Contains(services, "8080/TCP") {
		t.Errorf("services output:\n%s", services)
	}

	// Flags after the service name work too.
	eps := navectl(t, "--hub", url, "endpoints", "demo/echo", "--region", "us-east", "--zone", "us-east-1a")
	rows := priorityRows(eps)
	want := []string{
		"0 us-east/us-east-1a 1 east 127.0.1.1:50051 HEALTHY",
		"1 us-east/us-east-1b 1 east 127.0.1.2:50051 HEALTHY",
		"2 us-west/us-west-1a 1 west 127.0.2.1:50051 HEALTHY",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("endpoints rows:\n%s\nwant:\n%s\nfull output:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"), eps)
	}
	if !strings.Contains(eps, "xds:///echo.demo.svc.clusterset.local:8080") {
		t.Errorf("endpoints output does not name the xDS target:\n%s", eps)
	}

	var info adminapi.EndpointsInfo
	if err := json.Unmarshal([]byte(navectl(t, "--hub", url, "-o", "json", "endpoints", "demo/echo")), &info); err != nil {
		t.Fatalf("-o json is not JSON: %v", err)
	}
	if len(info.Ports) != 1 || len(info.Ports[0].Assignment.Priorities) != 1 {
		t.Errorf("a client without locality should get one priority: %+v", info)
	}

	// The demo has no routes: every request goes to the port's own endpoints.
	if routes := navectl(t, "--hub", url, "routes"); !strings.Contains(routes, "no service has routes or a TrafficPolicy") {
		t.Errorf("routes output:\n%s", routes)
	}
	if routes := navectl(t, "--hub", url, "routes", "demo/echo"); !strings.Contains(routes, "demo/echo: 0 routes; no TrafficPolicy") ||
		!strings.Contains(routes, "xds:///echo.demo.svc.clusterset.local:8080\n  no route: every request goes to the port's own endpoints") {
		t.Errorf("routes demo/echo output:\n%s", routes)
	}
}

func TestNavectlErrors(t *testing.T) {
	url := startDemoHub(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--hub", url, "endpoints", "demo/missing"}, "not federated"},
		{[]string{"--hub", url, "endpoints", "not-a-key"}, "not namespace/name"},
		{[]string{"--hub", url, "routes", "demo/missing"}, "hub answered 404 Not Found: service demo/missing is not federated"},
		{[]string{"--hub", url, "frobnicate"}, "unknown command"},
		{[]string{"--hub", url, "-o", "yaml", "clusters"}, "want table or json"},
		{[]string{"--hub", "http://127.0.0.1:1", "clusters"}, "ask the hub"},
	} {
		var out bytes.Buffer
		err := run(tc.args, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("navectl %v: err %v, want one saying %q", tc.args, err, tc.want)
		}
	}
}

func TestClusterState(t *testing.T) {
	for _, tt := range []struct {
		cl   adminapi.ClusterStatus
		want string
	}{
		{adminapi.ClusterStatus{Connected: true, Home: "hub-0"}, "connected"},
		{adminapi.ClusterStatus{Home: "hub-1"}, "live"},
		{adminapi.ClusterStatus{}, "waiting"},
		{adminapi.ClusterStatus{Stale: true, Restored: true}, "stale,restored"},
		{adminapi.ClusterStatus{Stale: true, Dropped: true}, "dropped"},
	} {
		if got := clusterState(tt.cl); got != tt.want {
			t.Errorf("clusterState(%+v) = %q, want %q", tt.cl, got, tt.want)
		}
	}
}

func TestNavectlImports(t *testing.T) {
	url := startDemoHub(t)
	var info adminapi.ImportsInfo
	// The hub builds imports off its state goroutine, and claims the IP in etcd: await them.
	for deadline := time.Now().Add(10 * time.Second); ; {
		info = adminapi.ImportsInfo{}
		if err := json.Unmarshal([]byte(navectl(t, "--hub", url, "-o", "json", "imports")), &info); err != nil {
			t.Fatalf("-o json is not JSON: %v", err)
		}
		if len(info.Imports) > 0 && len(info.Imports[0].Sources) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(info.Imports) != 1 || info.Imports[0].Service.String() != "demo/echo" || len(info.Imports[0].IPs) != 1 ||
		!strings.HasPrefix(info.Imports[0].IPs[0], "243.0.") || len(info.Imports[0].Sources) != 2 {
		t.Errorf("imports: %+v, want demo/echo from east and west with a clusterset IP of the default range", info.Imports)
	} else if sk := info.Imports[0].Skipped; len(sk) == 0 || !strings.Contains(sk[0], "127.0.1.") || !strings.Contains(sk[0], "loopback") {
		// The demo's backends listen on loopback: no cluster could import them, and the hub says so.
		t.Errorf("skipped addresses: %v, want the demo's loopback endpoints", sk)
	}
	out := navectl(t, "--hub", url, "imports")
	if !strings.Contains(out, "1 imports") || !strings.Contains(out, "no spoke takes imports") {
		t.Errorf("imports output:\n%s", out)
	}
	var buf bytes.Buffer
	if err := run([]string{"--hub", url, "imports", "east"}, &buf); err == nil || !strings.Contains(err.Error(), "no spoke of cluster \"east\" takes imports") {
		t.Errorf("imports east = %v, want that no spoke of east takes imports", err)
	}
}

// Two networks: east's has no gateway, west's has one. A client on east's
// network reaches west through west's gateway; one on west's cannot reach
// east at all, and says so.
func TestNavectlNetworks(t *testing.T) {
	h := startDemoHubWith(t, func(sc *spoke.Config) {
		sc.Network = registry.Network("net-" + string(sc.Cluster))
		if sc.Cluster == "west" {
			sc.NetworkGateways = []registry.Gateway{{Address: "192.0.2.50", Port: 15444}, {Address: "gw.west.example.com", Port: 15444}}
		}
	})
	url := "http://" + h.AdminAddr.String()
	deadline := time.Now().Add(10 * time.Second)
	var nets string
	for {
		nets = navectl(t, "--hub", url, "networks")
		if strings.Contains(nets, "192.0.2.50") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rows := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(nets), "\n")[1:] {
		f := strings.Fields(l)
		rows[f[0]] = strings.Join(f[1:], " ")
	}
	if want := "east 1 2 - no: no gateway"; rows["net-east"] != want {
		t.Errorf("net-east row %q, want %q\n%s", rows["net-east"], want, nets)
	}
	if want := "west 1 1 192.0.2.50:15444,gw.west.example.com:15444 (name not resolved) yes"; rows["net-west"] != want {
		t.Errorf("net-west row %q, want %q\n%s", rows["net-west"], want, nets)
	}

	eps := navectl(t, "--hub", url, "endpoints", "demo/echo", "--region", "us-east", "--zone", "us-east-1a", "--network", "net-east")
	got := priorityRows(eps)
	want := []string{
		"0 us-east/us-east-1a 1 east 127.0.1.1:50051 HEALTHY",
		"1 us-east/us-east-1b 1 east 127.0.1.2:50051 HEALTHY",
		"2 us-west/us-west-1a/gateway/net-west 1 gateway of net-west (for 1 endpoints) 192.0.2.50:15444 HEALTHY",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("endpoints on net-east:\n%s\nwant:\n%s\nfull output:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), eps)
	}
	if !strings.Contains(eps, "on network net-east") {
		t.Errorf("the output does not name the client's network:\n%s", eps)
	}

	eps = navectl(t, "--hub", url, "endpoints", "demo/echo", "--region", "us-west", "--zone", "us-west-1a", "--network", "net-west")
	if !strings.Contains(eps, "left out: network net-east (2 healthy endpoints) has no gateway this client can reach") ||
		strings.Contains(eps, "127.0.1.1") {
		t.Errorf("endpoints on net-west should leave net-east out and say why:\n%s", eps)
	}
}

// A hub whose admin API needs a token: navectl says so without one, and
// works with --token-file (or $NAVE_HUB_TOKEN_FILE).
func TestNavectlWithAnAdminToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tokenFile, []byte("navectl-admin-token-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := hub.DefaultConfig()
	cfg.DataDir, cfg.AdminTokenFile = filepath.Join(dir, "data"), tokenFile
	cfg.FederationAddr, cfg.XDSAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	h, err := hub.Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = h.Wait() })
	url := "http://" + h.AdminAddr.String()
	var out bytes.Buffer
	if err := run([]string{"--hub", url, "clusters"}, &out); err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "token") {
		t.Errorf("without the token: %v, want the hub's 401 saying a token is needed", err)
	}
	if got := navectl(t, "--hub", url, "--token-file", tokenFile, "clusters"); !strings.Contains(got, "CLUSTER") {
		t.Errorf("with --token-file:\n%s", got)
	}
	t.Setenv("NAVE_HUB_TOKEN_FILE", tokenFile)
	if got := navectl(t, "--hub", url, "networks"); !strings.Contains(got, "NETWORK") {
		t.Errorf("with $NAVE_HUB_TOKEN_FILE:\n%s", got)
	}
}

// navectl imports shows what blocks a cluster's imports (a user's own object
// holding a name Nave would write): the cluster is not written, and the
// import says why, in the summary and the cluster's list.
func TestNavectlImportsShowsBlocked(t *testing.T) {
	web := registry.ServiceKey{Namespace: "shop", Name: "web"}
	info := adminapi.ImportsInfo{
		Authoritative: true,
		Imports:       []adminapi.ImportInfo{{Service: web, Type: "ClusterSetIP"}},
		Sessions: []adminapi.ImportStatus{{Cluster: "east", Epoch: 1, Namespaces: 1, Imports: 1, Acked: 1,
			NamespaceNames: []string{"shop"}, SentVersion: 2, AckedVersion: 2, WrittenVersion: 2, Authoritative: true,
			BlockedCount: 1, Blocked: []adminapi.ImportProblem{{Service: web, Reason: federation.ReasonBlockedByServiceImport,
				Message: "ServiceImport web exists and is not managed by Nave"}}}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/imports" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(info)
	}))
	t.Cleanup(srv.Close)
	out := navectl(t, "--hub", srv.URL, "imports")
	if !strings.Contains(out, "BLOCKED") || !strings.Contains(out, "east: shop/web blocked: BlockedByServiceImport: ServiceImport web") {
		t.Errorf("imports output:\n%s", out)
	}
	if fields := strings.Fields(strings.Split(out, "\n")[3]); len(fields) < 7 || fields[5] != "1" || fields[6] != "no" {
		t.Errorf("east's row (blocked 1, written no): %v\n%s", fields, out)
	}
	out = navectl(t, "--hub", srv.URL, "imports", "east")
	if !strings.Contains(out, "written: no; 1 blocked") || !strings.Contains(out, "blocked: BlockedByServiceImport: ServiceImport web") {
		t.Errorf("imports east output:\n%s", out)
	}
}
