package hub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/xdstest"
)

func startHub(t *testing.T, dataDir string, tune ...func(*hub.Config)) (*hub.Hub, func()) {
	t.Helper()
	cfg := hub.DefaultConfig()
	cfg.ID, cfg.DataDir = "test", dataDir
	for _, f := range tune {
		f(&cfg)
	}
	cfg.FederationAddr, cfg.XDSAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	h, err := hub.Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stop := func() { cancel(); _ = h.Wait() }
	t.Cleanup(stop)
	return h, stop
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// hello opens a spoke session for cluster, which lasts until the test ends, and returns its epoch.
func hello(t *testing.T, h *hub.Hub, cluster string) uint64 {
	t.Helper()
	_, epoch := session(t, h, cluster)
	return epoch
}

// session opens a spoke session for cluster, publishes an empty full state and returns the stream.
func session(t *testing.T, h *hub.Hub, cluster string) (fedv1.Federation_PublishClient, uint64) {
	t.Helper()
	stream, welcome := rawSession(t, h, &fedv1.Hello{ClusterId: cluster, Network: "n1", SpokeId: "s1"})
	// A full state with nothing in it: the cluster is known and publishes no service.
	if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetAck() == nil {
		t.Fatalf("empty full state answered %v, %v", m, err)
	}
	return stream, welcome.GetEpoch()
}

func shard(name string) *fedv1.Shard {
	return &fedv1.Shard{
		Service: &fedv1.ServiceKey{Namespace: "default", Name: name},
		Ports:   []*fedv1.ServicePort{{Name: "grpc", Port: 8080, Protocol: "TCP"}},
	}
}

// A cluster cannot grow past its limits one delta at a time.
func TestClusterLimitsHoldAcrossDeltas(t *testing.T) {
	h, _ := startHub(t, t.TempDir(), func(c *hub.Config) { c.Federation.Limits.MaxServicesPerCluster = 2 })
	stream, _ := session(t, h, "east")
	send := func(version uint64, names ...string) *fedv1.HubMessage {
		t.Helper()
		u := &fedv1.Update{Nonce: fmt.Sprint(version), Version: version}
		for _, n := range names {
			u.Upserts = append(u.Upserts, shard(n))
		}
		if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
			t.Fatal(err)
		}
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := send(2, "a", "b"); m.GetAck() == nil {
		t.Fatalf("two services answered %v", m)
	}
	before := h.View().Registry
	m := send(3, "c")
	if m.GetNack() == nil || !strings.Contains(m.GetNack().GetRejections()[0].GetReason(), "limits") {
		t.Fatalf("a third service answered %v, want a nack about the limits", m)
	}
	if h.View().Registry != before {
		t.Fatal("an update over the limits changed the registry")
	}
	if m := send(4, "a"); m.GetAck() == nil {
		t.Fatalf("updating a held service answered %v", m)
	}
}

func TestAdminAPI(t *testing.T) {
	h, _ := startHub(t, t.TempDir())
	admin := "http://" + h.AdminAddr.String()
	hello(t, h, "east")

	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, admin+path); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
			t.Errorf("%s = %d %q", path, code, body)
		}
	}
	code, metrics := get(t, admin+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		"nave_hub_clusters_connected 1", "nave_hub_services 0", `nave_federation_updates_total{cluster="east",kind="full",result="ack"} 1`,
		"nave_xds_connected_clients", "grpc_server_started_total", "go_goroutines",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	code, body := get(t, admin+"/debug/clusters")
	var clusters []adminapi.ClusterStatus
	if code != http.StatusOK || json.Unmarshal([]byte(body), &clusters) != nil || len(clusters) != 1 ||
		clusters[0].Cluster != "east" || clusters[0].Network != "n1" || clusters[0].Epoch != 1 {
		t.Errorf("/debug/clusters = %d %s", code, body)
	}
	for _, tc := range []struct {
		query string
		code  int
	}{
		{"", http.StatusBadRequest},
		{"?service=nope", http.StatusBadRequest},
		{"?service=default/missing", http.StatusNotFound},
	} {
		if code, body := get(t, admin+"/debug/endpoints"+tc.query); code != tc.code {
			t.Errorf("/debug/endpoints%s = %d %s, want %d", tc.query, code, body, tc.code)
		}
	}
}

// The embedded etcd keeps the catalog and the epochs across a restart.
func TestRestartKeepsCatalogAndEpochs(t *testing.T) {
	dir := t.TempDir()
	h, stop := startHub(t, dir)
	if e := hello(t, h, "east"); e != 1 {
		t.Fatalf("first epoch %d, want 1", e)
	}
	stop()

	h, _ = startHub(t, dir)
	st, ok := h.View().Clusters["east"]
	if !ok || st.Connected || st.Network != "n1" {
		t.Fatalf("after a restart east is %+v, want known and disconnected", st)
	}
	if e := hello(t, h, "east"); e != 2 {
		t.Fatalf("epoch after restart %d, want 2: epochs must never repeat", e)
	}
}

// Profiles are served only when asked for.
func TestPprofOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		h, _ := startHub(t, t.TempDir(), func(c *hub.Config) { c.Pprof = on })
		code, _ := get(t, "http://"+h.AdminAddr.String()+"/debug/pprof/heap")
		if want := map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on]; code != want {
			t.Errorf("pprof %v: /debug/pprof/heap = %d, want %d", on, code, want)
		}
	}
}

// coordination reads /debug/hub.
func coordination(t *testing.T, h *hub.Hub) adminapi.Coordination {
	t.Helper()
	_, body := get(t, "http://"+h.AdminAddr.String()+"/debug/hub")
	var c adminapi.Coordination
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatalf("/debug/hub: %v: %s", err, body)
	}
	return c
}

// A leader that restored the persisted registry does not save the same
// registry again: at 100k endpoints that save costs about half a second of
// CPU, when the replica is busiest, serving every client anew.
func TestRestoredRegistryIsNotSavedAgain(t *testing.T) {
	dir := t.TempDir()
	fast := func(c *hub.Config) { c.SnapshotInterval = 10 * time.Millisecond }
	h, stop := startHub(t, dir, fast)
	stream, _ := session(t, h, "east")
	u := &fedv1.Update{Nonce: "2", Version: 2, Upserts: []*fedv1.Shard{shard("web")}}
	if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetAck() == nil {
		t.Fatalf("web answered %v, %v", m, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c := coordination(t, h); c.Snapshot.Clusters == 1 && !c.Snapshot.Restored {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no snapshot of east was saved")
		}
	}
	// The stop may save once more (what changed since the last save); the
	// restarted replica restores whichever save was last.
	stop()

	h, _ = startHub(t, dir, fast)
	for deadline := time.Now().Add(30 * time.Second); !coordination(t, h).IsLeader; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the restarted replica never led")
		}
	}
	restored := coordination(t, h).Snapshot
	if !restored.Restored || restored.Clusters != 1 {
		t.Fatalf("the restarted leader reports %+v, want the restored snapshot of east", restored)
	}
	// A leader saves within an interval of a change; give it fifty.
	time.Sleep(50 * 10 * time.Millisecond)
	if got := coordination(t, h).Snapshot; !got.Restored || got.Revision != restored.Revision {
		t.Fatalf("after the restart the snapshot is %+v, want the restored revision %d", got, restored.Revision)
	}
}

// A spoke's new session re-stamps its cluster without changing the registry;
// the leader saves that too, so a restarted replica can let the spoke resume.
func TestNewStampIsSaved(t *testing.T) {
	h, _ := startHub(t, t.TempDir(), func(c *hub.Config) { c.SnapshotInterval = 10 * time.Millisecond })
	awaitSaved := func(what string, ok func(adminapi.Saved) bool) adminapi.Saved {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if s := coordination(t, h).Snapshot; ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("no snapshot %s", what)
			}
		}
	}
	hello(t, h, "east") // a known cluster with nothing in it: only its stamp is new
	first := awaitSaved("of east", func(s adminapi.Saved) bool { return s.Clusters == 1 })
	version := h.View().Registry.Version()
	hello(t, h, "east") // the next session: a new epoch, the same registry
	awaitSaved("after east's new session", func(s adminapi.Saved) bool { return s.Revision > first.Revision })
	if h.View().Registry.Version() != version {
		t.Fatal("the new session changed the registry: the test proves nothing")
	}
}

// A replica that starts knowing clusters (its catalog) it holds no data of
// waits for them to resync before it serves xDS: no client is handed a
// world in part. /readyz says what it waits for.
func TestColdStartWaitsForTheCatalogsClusters(t *testing.T) {
	dir := t.TempDir()
	// No snapshot with the clusters: the first save, of an empty registry,
	// is the only one within the hour.
	noSnapshots := func(c *hub.Config) { c.SnapshotInterval = time.Hour; c.ColdStartWait = 20 * time.Second }
	h, stop := startHub(t, dir, noSnapshots)
	awaitFirstSave(t, h)
	hello(t, h, "east")
	hello(t, h, "west")
	if s := coordination(t, h).Snapshot; s.Clusters != 0 {
		t.Fatalf("the snapshot holds %d clusters: the test proves nothing", s.Clusters)
	}
	h.NoSaveOnStop()
	stop()

	h, _ = startHub(t, dir, noSnapshots)
	admin := "http://" + h.AdminAddr.String()
	if code, body := get(t, admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for 2 clusters") {
		t.Errorf("/readyz while no cluster resynced: %d %q", code, body)
	}
	if xdsServed(h) {
		t.Fatal("xDS is served before any cluster the catalog knows resynced")
	}
	hello(t, h, "east")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		code, body := get(t, admin+"/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for 1 clusters") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz with east back: %d %q, want waiting for 1", code, body)
		}
	}
	if xdsServed(h) {
		t.Fatal("xDS is served with west still missing")
	}
	hello(t, h, "west")
	deadline := time.Now().Add(10 * time.Second)
	for !xdsServed(h) {
		if time.Now().After(deadline) {
			t.Fatal("xDS is not served after every cluster resynced")
		}
	}
	// Ready follows serving at once (xDS answers a moment before the flag is set).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		code, body := get(t, admin+"/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz once serving: %d %q", code, body)
		}
	}
}

// xdsServed says whether h serves xDS: it answers a gRPC connection within
// 300ms (listening but not yet serving, it leaves the preface unanswered).
func xdsServed(h *hub.Hub) bool { return xdstest.Answers(h.XDSAddr.String()) }

// awaitFirstSave waits for a new replica's first snapshot, of its empty
// registry: it is saved when the replica first leads, so clusters that say
// hello before it would be in it (and a restart would be a warm one).
func awaitFirstSave(t *testing.T, h *hub.Hub) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); coordination(t, h).Snapshot.Revision == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the empty registry was never saved")
		}
	}
}

// A lone replica (no gossip) lists itself in /debug/hub with the addresses
// it serves on, as a replica of a group does (the dashboard's replica table
// showed blanks), and counts the clusters whose spoke it serves.
func TestALoneReplicaShowsItsAddresses(t *testing.T) {
	h, _ := startHub(t, t.TempDir())
	session(t, h, "east")
	port := func(a net.Addr) string { _, p, _ := net.SplitHostPort(a.String()); return p }
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		c := coordination(t, h)
		if len(c.Members) != 1 {
			t.Fatalf("members %+v, want this replica alone", c.Members)
		}
		m := c.Members[0]
		for what, got := range map[string][2]string{
			"federation": {m.Federation, port(h.FederationAddr)}, "xds": {m.XDS, port(h.XDSAddr)}, "admin": {m.Admin, port(h.AdminAddr)},
		} {
			if _, p, err := net.SplitHostPort(got[0]); err != nil || p != got[1] {
				t.Fatalf("its %s address %q, want one of port %s", what, got[0], got[1])
			}
		}
		if !m.Self || m.Name != "test" {
			t.Fatalf("member %+v, want itself, test", m)
		}
		if m.HomeOf == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("member %+v: home of %d clusters, want east's", m, m.HomeOf)
		}
	}
}
