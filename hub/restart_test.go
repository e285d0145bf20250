package hub_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/etcdtest"
)

// A hub restarted while its etcd is down (stopped, not lost) cannot read
// its catalog nor its snapshot: it withholds xDS and says why, rather than
// serving an empty registry that would tell every client its services are
// gone. Once etcd answers, it serves the restored registry.
func TestARestartWithEtcdDownServesNothingUntilEtcdAnswers(t *testing.T) {
	e := etcdtest.StartServer(t, nil)
	external := func(c *hub.Config) {
		c.EtcdEndpoints, c.SnapshotInterval, c.ColdStartWait = []string{e.Endpoint}, 20*time.Millisecond, 30*time.Second
	}
	h, stop := startHub(t, t.TempDir(), external)
	publishAPI(t, h, "east")
	awaitCond(t, "a snapshot holding east", 10*time.Second, func() bool { return coordination(t, h).Snapshot.Clusters == 1 })
	stop()
	e.Stop()

	h, _ = startHub(t, t.TempDir(), external)
	admin := "http://" + h.AdminAddr.String()
	if code, body := get(t, admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot read the cluster catalog") {
		t.Errorf("/readyz with etcd down: %d %q, want not ready, saying the catalog cannot be read", code, body)
	}
	if _, body := get(t, admin+"/metrics"); !strings.Contains(body, `nave_hub_xds_withheld{reason="catalog"} 1`) {
		t.Errorf("/metrics with etcd down does not say xDS is withheld for the catalog")
	}
	if xdsServed(h) {
		t.Fatalf("xDS is served with etcd down: a registry of %d services", h.View().Registry.Len())
	}

	e.Restart(t)
	awaitCond(t, "xDS served once etcd answers", 30*time.Second, func() bool { return xdsServed(h) })
	if east := h.View().Clusters["east"]; east.Services != 1 || !east.Restored {
		t.Errorf("east as xDS is first served: %+v, want its service, restored from the snapshot", east)
	}
	awaitCond(t, "ready once serving", 5*time.Second, func() bool {
		code, _ := get(t, admin+"/readyz")
		return code == http.StatusOK
	})
	// Leading again, it saved nothing of less than the snapshot it restored.
	if s := coordination(t, h).Snapshot; s.Clusters != 1 {
		t.Errorf("the snapshot once etcd answered: %+v, want east still in it", s)
	}
	if _, body := get(t, admin+"/metrics"); !strings.Contains(body, `nave_hub_xds_withheld{reason="catalog"} 0`) {
		t.Errorf("/metrics once serving still says xDS is withheld for the catalog")
	}
}

// A hub stopped gracefully saves the registry once more, so a change made
// a moment before the stop is what the restarted hub serves, not the world
// of the last periodic snapshot (here an hour old).
func TestAGracefulStopSavesTheRegistry(t *testing.T) {
	dir := t.TempDir()
	hourly := func(c *hub.Config) { c.SnapshotInterval, c.ColdStartWait = time.Hour, 30*time.Second }
	h, stop := startHub(t, dir, hourly)
	awaitFirstSave(t, h)
	publishAPI(t, h, "east")
	if s := coordination(t, h).Snapshot; s.Clusters != 0 {
		t.Fatalf("a periodic snapshot holds east (%+v): the test proves nothing", s)
	}
	stop()

	h, _ = startHub(t, dir, hourly)
	if !xdsServed(h) {
		t.Fatal("the restarted hub withholds xDS: its snapshot lacks east")
	}
	if east := h.View().Clusters["east"]; east.Services != 1 || !east.Restored {
		t.Errorf("east after the restart: %+v, want its service, restored from the snapshot saved on stop", east)
	}
}
