package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/etcdtest"
	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

// uiScreenshotEnv names where TestDashboard saves its screenshot (a
// relative path is taken from the repository root); without it, in the
// test's temporary directory.
const uiScreenshotEnv = "NAVE_UI_SCREENSHOT"

// TestDashboard opens the hub's dashboard (/ui) in headless Chromium: three
// replicas over one etcd, east's spoke at b through a load-balanced address,
// west's at c, and a grpc-go xDS client at a, whose page the browser shows
// (with the admin token, given in the address's fragment). The page shows
// all three replicas, both clusters with their homes, the topology, the
// synced client and the changes traced; when b stops, east's spoke moves to
// c and the page shows b gone and c east's home; when a stops, the page
// says the hub is unreachable and when it last heard from it.
func TestDashboard(t *testing.T) {
	chromium := requireChromium(t)
	start := time.Now()

	// 1. Three replicas over one etcd, gossiping; a guards its admin API with a token.
	endpoint, stopEtcd := etcdtest.Start(t, nil)
	t.Cleanup(stopEtcd)
	const adminToken = "dashboard-token-0123456789"
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(tokenFile, []byte(adminToken), 0o600); err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "c"}
	gossip := make([]string, len(ids))
	for i := range gossip {
		gossip[i] = freeAddr(t)
	}
	hubs := make([]*hub.Hub, len(ids))
	stops := make([]func(), len(ids))
	for i, id := range ids {
		cfg := hub.DefaultConfig()
		cfg.ID, cfg.DataDir, cfg.EtcdEndpoints = id, t.TempDir(), []string{endpoint}
		cfg.FederationAddr, cfg.XDSAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		cfg.GossipAddr, cfg.AdvertiseHost, cfg.FastGossip = gossip[i], "127.0.0.1", true
		cfg.Join = append(append([]string{}, gossip[:i]...), gossip[i+1:]...)
		if id == "a" {
			cfg.AdminTokenFile = tokenFile
		}
		ctx, cancel := context.WithCancel(context.Background())
		h, err := hub.Start(ctx, cfg, testLogger(t, "hub-"+id))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		stopped := false
		hubs[i], stops[i] = h, func() {
			if !stopped {
				stopped = true
				cancel()
				_ = h.Wait()
			}
		}
		t.Cleanup(stops[i])
	}
	a, b, c := hubs[0], hubs[1], hubs[2]
	// The page and its assets are open (they hold no data); the data is not.
	for path, want := range map[string]int{"/ui": http.StatusOK, "/ui/app.js": http.StatusOK, "/debug/hub": http.StatusUnauthorized} {
		if got := httpStatus("http://" + a.AdminAddr.String() + path); got != want {
			t.Errorf("GET %s without the admin token: %d, want %d", path, got, want)
		}
	}

	// 2. The spokes: east through one address in front of b and c (c held
	// back, so east's home is b), west at c.
	lb := nettest.NewProxy(t, b.FederationAddr.String(), c.FederationAddr.String())
	lb.SetDown(c.FederationAddr.String(), true)
	// East's manifests are a copy the test changes.
	eastDir := t.TempDir()
	if err := os.CopyFS(eastDir, os.DirFS(filepath.Join("..", "deploy", "demo", "east"))); err != nil {
		t.Fatal(err)
	}
	runSpoke := func(cluster registry.ClusterID, region, addr, dir string) {
		cfg := spoke.DefaultConfig()
		cfg.Cluster, cfg.Region, cfg.HubAddr = cluster, region, addr
		cfg.Source = "dir:" + dir
		cfg.PollInterval = 20 * time.Millisecond
		cfg.Federation.MinBackoff, cfg.Federation.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- spoke.Run(ctx, cfg, testLogger(t, "spoke-"+string(cluster))) }()
		t.Cleanup(func() { cancel(); <-done }) // before the replicas stop (cleanups run last first)
	}
	runSpoke("east", "us-east", lb.Addr, eastDir)
	runSpoke("west", "us-west", c.FederationAddr.String(), filepath.Join("..", "deploy", "demo", "west"))

	// 3. A grpc-go xDS client at a; a call makes it resolve (nothing answers at the demo's addresses).
	client := xdstest.NewClient(t, a.XDSAddr.String(), "dashboard-client", locality("us-east", "us-east-1a"), "echo.demo.svc.clusterset.local:8080")
	awaitFor(t, "a serving east and west's demo/echo", 30*time.Second, func() bool {
		svc := a.View().Registry.Service(registry.ServiceKey{Namespace: "demo", Name: "echo"})
		return svc != nil && len(svc.Clusters()) == 2
	})
	callCtx, callCancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	_, _ = client.Check(callCtx, &healthpb.HealthCheckRequest{})
	callCancel()

	// 4. Headless Chromium on a's dashboard, the token in the address.
	browser := startBrowser(t, chromium)
	url := "http://" + a.AdminAddr.String() + "/ui#token=" + adminToken
	open, cancelOpen := context.WithTimeout(browser, 30*time.Second) // a child of the tab: ending it leaves the tab open
	defer cancelOpen()
	if err := chromedp.Do(open, chromedp.Navigate(url), chromedp.WaitVisible("#status")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	// Once the client holds east's endpoints, one of them moves: a change a traces to the client's ACK.
	awaitPage(t, browser, "the client holding echo's endpoints", `document.querySelector(
		'[data-testid="client-row"][data-node="dashboard-client"][data-state="SYNCED"] [data-field="eds"]:not([data-acked=""])')`)
	echo := filepath.Join(eastDir, "echo.yaml")
	manifest, err := os.ReadFile(echo)
	if err != nil {
		t.Fatal(err)
	}
	// The endpoint in us-east-1b turns not ready: the topology's counts must follow.
	writeFile(t, echo, strings.Replace(string(manifest), "- addresses: [\"127.0.1.2\"]\n  conditions: {ready: true,",
		"- addresses: [\"127.0.1.2\"]\n  conditions: {ready: false,", 1))
	awaitPage(t, browser, "the page with three replicas, east at b, west at c, the client synced and east's change traced", `(() => {
		const q = (s) => document.querySelector(s), all = (s) => document.querySelectorAll(s);
		return q('#status[data-state="live"]') && location.hash === "" &&
			all('[data-testid="replica-row"]').length === 3 && q('[data-testid="replica-row"][data-replica="a"][data-self]') &&
			q('#leader').textContent !== "none" && q('#leader').textContent !== "?" &&
			q('[data-testid="cluster-row"][data-cluster="east"][data-state="connected"][data-home="b"]') &&
			q('[data-testid="cluster-row"][data-cluster="west"][data-state="connected"][data-home="c"]') &&
			q('[data-testid="topology-region"][data-region="us-east"] [data-zone="us-east-1a"] [data-cluster="east"][data-healthy="1"]') &&
			q('[data-testid="topology-region"][data-region="us-east"] [data-zone="us-east-1b"] [data-cluster="east"][data-healthy="0"][data-not-ready="1"]') &&
			q('[data-testid="topology-region"][data-region="us-west"] [data-testid="topology-cluster"][data-cluster="west"]') &&
			q('#client-counts[data-synced="1"][data-total="1"]') &&
			q('[data-testid="client-row"][data-node="dashboard-client"][data-state="SYNCED"] [data-field="eds"]').textContent === "SYNCED" &&
			q('[data-testid="trace-row"][data-service="demo/echo"][data-cluster="east"][data-acked="1"] [data-field="slowest"]').textContent.startsWith("dashboard-client ");
	})()`)
	saveScreenshot(t, browser)
	t.Logf("the page shows the three replicas after %v", time.Since(start).Round(time.Millisecond))

	// 4b. A client that rejects what it is sent: its row says NACKED, and why.
	nackCtx, stopNacker := context.WithCancel(t.Context())
	nacker := dialFrom(t, "127.0.0.1", a.XDSAddr.String())
	st, err := discovery.NewAggregatedDiscoveryServiceClient(nacker).StreamAggregatedResources(nackCtx)
	if err != nil {
		t.Fatal(err)
	}
	const eds = "outbound|8080||echo.demo.svc.clusterset.local"
	if err := st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "nacker", Locality: &core.Locality{Region: "us-east", Zone: "us-east-1a"}},
		TypeUrl: resource.EndpointType, ResourceNames: []string{eds}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil {
		t.Fatal(err)
	} else if err := st.Send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(), ResourceNames: []string{eds},
		ErrorDetail: status.New(codes.InvalidArgument, "endpoint weight out of range").Proto()}); err != nil {
		t.Fatal(err)
	}
	awaitPage(t, browser, "the NACKing client's row saying why", `(() => {
		const td = document.querySelector('[data-testid="client-row"][data-node="nacker"][data-state="NACKED"] [data-field="state"]');
		return td && td.textContent.includes("eds: endpoint weight out of range") && td.title.includes("endpoint weight out of range");
	})()`)
	stopNacker()
	awaitPage(t, browser, "the NACKing client gone", `!document.querySelector('[data-testid="client-row"][data-node="nacker"]')`)

	// 5. b stops: east's spoke reconnects through the same address, to c.
	lb.SetDown(c.FederationAddr.String(), false)
	lb.SetDown(b.FederationAddr.String(), true)
	stops[1]()
	awaitPage(t, browser, "b gone from the replicas and east's home now c", `(() => {
		const q = (s) => document.querySelector(s), all = (s) => document.querySelectorAll(s);
		return q('#status[data-state="live"]') && all('[data-testid="replica-row"]').length === 2 &&
			!q('[data-testid="replica-row"][data-replica="b"]') &&
			q('[data-testid="cluster-row"][data-cluster="east"][data-state="connected"][data-home="c"]') &&
			q('[data-testid="cluster-row"][data-cluster="west"][data-home="c"]');
	})()`)
	t.Logf("the page shows the failover after %v", time.Since(start).Round(time.Millisecond))

	// 6. a, whose page it is, stops: the page says so, and when it last heard from a.
	stops[0]()
	awaitPage(t, browser, "the page saying the hub is unreachable", `(() => {
		const s = document.querySelector('#status[data-state="unreachable"]');
		return s && s.textContent.includes("last update") && s.dataset.lastOk > 0;
	})()`)
	t.Logf("the page shows the hub unreachable after %v", time.Since(start).Round(time.Millisecond))
}

// requireChromium returns the path of Debian's chromium (`make chromium`
// installs it); without it the test skips, or fails under NAVE_E2E_REQUIRE=1.
func requireChromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	toolMissing(t, "chromium is not installed: run `make chromium`")
	return ""
}

// startBrowser runs headless Chromium for the rest of the test and returns its tab.
func startBrowser(t *testing.T, chromium string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1440, 1000), chromedp.UserDataDir(t.TempDir()))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	if _, err := chromedp.Run(tab, chromedp.Navigate("about:blank")); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return tab
}

// awaitPage waits up to 30 s for the page's predicate (a JavaScript
// expression) to hold; when it does not, it reports what the page shows.
// A poll the page's execution context outlived (as the page loads) is run
// again.
func awaitPage(t *testing.T, tab context.Context, what, predicate string) {
	t.Helper()
	const within = 30 * time.Second
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		_, err = chromedp.Run(tab, chromedp.Poll[bool]("!!"+predicate,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(time.Until(deadline))))
		if err == nil {
			return
		}
		if errors.Is(err, chromedp.ErrPollingTimeout) || tab.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the page's context is being replaced: poll the new one
	}
	show, cancel := context.WithTimeout(tab, 10*time.Second)
	defer cancel()
	shown, _ := chromedp.Run(show, chromedp.Evaluate[string](`document.querySelector("header").innerText + "\n" + document.querySelector("main").innerText`))
	t.Fatalf("the dashboard did not show %s within %v (%v); it shows:\n%s", what, within, err, shown)
}

// saveScreenshot saves a PNG of the whole page where uiScreenshotEnv says.
func saveScreenshot(t *testing.T, tab context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := os.Getenv(uiScreenshotEnv)
	switch {
	case path == "":
		path = filepath.Join(t.TempDir(), "ui.png")
	case !filepath.IsAbs(path):
		path = filepath.Join("..", path) // go test runs in e2e/
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot (%d bytes): %s", len(png), path)
}
