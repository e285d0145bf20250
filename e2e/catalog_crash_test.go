package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/xds"
)

// A `nave hub` (one replica, embedded etcd) killed right after a cluster's
// first session, before its leader syncs the catalog again (every second)
// and before any snapshot holds the cluster, comes back knowing the
// cluster: the session recorded it before it began. So the restarted hub
// waits for the cluster to resync before it serves xDS (--cold-start-wait),
// and a client that had the cluster's listener and clusters from the
// killed hub never has them removed (it keeps calling, and no call fails).
func TestCatalogSurvivesAHubCrashAfterAFirstSession(t *testing.T) {
	bin := buildNave(t)
	ctx := testContext(t)
	dir := t.TempDir()
	tb, _ := yaml.Marshal(tokens)
	tokensFile := filepath.Join(dir, "tokens.yaml")
	writeFile(t, tokensFile, string(tb))
	adminAddr := freeAddr(t)
	h := &hubProcess{t: t, bin: bin, fed: freeAddr(t), xds: freeAddr(t), admin: "http://" + adminAddr}
	// No snapshot but the leader's first, of the empty registry, within the
	// hour: the restart below is a cold start.
	h.args = []string{"hub", "--id=hub-0", "--data-dir=" + filepath.Join(dir, "hub"), "--tokens=" + tokensFile,
		"--federation-addr=" + h.fed, "--xds-addr=" + h.xds, "--admin-addr=" + adminAddr,
		"--snapshot-interval=1h", "--cold-start-wait=30s"}
	h.start()
	await(t, "the leader's first snapshot, of the empty registry", func() bool {
		var c adminapi.Coordination
		getJSON(t, h.admin+"/debug/hub", &c)
		return c.Snapshot.Revision != 0
	})

	backend := xdstest.StartBackend(t, "east/us-east-1a", "127.0.0.1")
	east := filepath.Join(t.TempDir(), "east")
	writeService(t, east, "echo", endpoint{backend, "us-east-1a", true})
	fed, err := net.ResolveTCPAddr("tcp", h.fed)
	if err != nil {
		t.Fatal(err)
	}
	spokeTarget := &testHub{Hub: &hub.Hub{FederationAddr: fed}}

	// The client asks for echo first, so it is served the moment east's
	// first session has published it, and the hub is killed at once, some
	// 50-100ms after the session began: the leader's sync of the catalog,
	// once a second, has most likely not run yet (without the session's own
	// record, this test failed 7 runs in 7; hub's
	// TestANewClusterIsInTheCatalogBeforeItIsServed leaves no leader to run it).
	client := xdstest.NewClient(t, h.xds, "c-east", locality("us-east", "us-east-1a"), echoTarget)
	firstCall := make(chan error, 1)
	go func() {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		firstCall <- err
	}()
	sessionStart := time.Now()
	sp := startSpoke(t, spokeTarget, "east", east, "us-east")
	if err := <-firstCall; err != nil {
		t.Fatalf("the client's first call: %v", err)
	}
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	poller := xdstest.StartPoller(pollCtx, t, "client c-east", client)
	// The spoke goes first, and comes back only when the test says: the
	// restarted hub is then seen waiting for east, instead of racing the
	// spoke's reconnection against the client's.
	sp.stop()
	h.proc.kill() // SIGKILL: no last catalog write on the way out
	t.Logf("hub killed %v after east's spoke started", time.Since(sessionStart).Round(time.Millisecond))

	h.proc = startProc(t, "hub", h.bin, h.args...)
	await(t, "the restarted hub's admin API", func() bool { return httpStatus(h.admin+"/readyz") != 0 })
	if code, body := readyz(t, h.admin); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for 1 clusters") {
		t.Errorf("the restarted hub holding nothing of east: /readyz %d %q, want waiting for east: the catalog lost east", code, body)
	}
	// Give the client the time to come back (grpc-go retries after about a
	// second): a hub serving xDS now would hand it a world without east, and
	// its calls would fail. The hub waiting for east, it cannot connect.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if metricValue(t, h.admin+"/metrics", xds.MetricConnectedClients) != 0 {
			t.Errorf("the client connected to the restarted hub before east resynced")
			break
		}
	}
	if xdstest.Answers(h.xds) {
		t.Errorf("the restarted hub serves xDS before east resynced")
	}

	restarted := time.Now()
	startSpoke(t, spokeTarget, "east", east, "us-east")
	await(t, "east resynced at the restarted hub", func() bool {
		c := h.cluster(t, "east")
		return c.Connected && c.SessionStart.After(restarted) && c.Services == 1
	})
	await(t, "the restarted hub ready", func() bool { return httpStatus(h.admin+"/readyz") == http.StatusOK })
	await(t, "the client back on the restarted hub", func() bool {
		return metricValue(t, h.admin+"/metrics", xds.MetricConnectedClients) == 1
	})
	poller.AwaitOnly(ctx, t, backend.Name)
	stopPolling()
	noFailedRPCs(t, "across a hub crash right after east's first session", poller)
}

// readyz returns the hub's readiness: the status code and the body saying why.
func readyz(t testing.TB, admin string) (int, string) {
	t.Helper()
	resp, err := http.Get(admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
