package hub_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/replicas"
)

// A cluster is in the catalog before anything of it is served, even when
// its hub replica does not lead and stops before a leader has synced the
// catalog (here another leads all along, so that stop writes nothing: for
// the catalog it is a crash). The replica that starts next, with no
// snapshot of the cluster, waits for it to resync before it serves xDS,
// instead of handing its clients a world without it.
func TestANewClusterIsInTheCatalogBeforeItIsServed(t *testing.T) {
	e := startSharedEtcd(t)
	release := e.holdLeadership(t)
	solo := func(c *hub.Config) {
		c.ID, c.EtcdEndpoints, c.SnapshotInterval, c.ColdStartWait = "solo", []string{e.endpoint}, 20*time.Millisecond, 20*time.Second
	}
	h, stop := startHub(t, t.TempDir(), solo)
	stream, welcome := rawSession(t, h, &fedv1.Hello{ClusterId: "east", Network: "n1", SpokeId: "s1", SpokeBuild: "b1"})
	// Welcomed, nothing sent yet: the record is there already.
	if r, ok := e.record(t, "east"); !ok || r.Epoch != welcome.GetEpoch() || r.Network != "n1" || r.SpokeID != "s1" {
		t.Fatalf("east's record once its session began: %+v (found %v), want epoch %d, network n1, spoke s1", r, ok, welcome.GetEpoch())
	}
	sendShards(t, stream, &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true},
		apiShard("east", olderExport, "grpc", "10.0.0.1"))
	if m := recv(t, stream); m.GetAck() == nil {
		t.Fatalf("east's full state answered %v", m)
	}
	awaitCond(t, "east served (else the test proves nothing)", 10*time.Second, func() bool {
		return h.View().Clusters["east"].Services == 1 && xdsServed(h)
	})
	if c := coordination(t, h); c.IsLeader || c.Snapshot.Revision != 0 {
		t.Fatalf("the hub led (%+v): its last catalog write or a snapshot may hold east, and the test proves nothing", c)
	}
	stop()
	release()

	h, _ = startHub(t, t.TempDir(), solo)
	admin := "http://" + h.AdminAddr.String()
	if code, body := get(t, admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for 1 clusters") {
		t.Fatalf("the restarted hub, holding nothing of east: /readyz %d %q, want waiting for east", code, body)
	}
	if xdsServed(h) {
		t.Fatal("the restarted hub serves xDS without east")
	}
	publishAPI(t, h, "east")
	awaitCond(t, "xDS served once east resynced", 10*time.Second, func() bool { return xdsServed(h) })
	awaitCond(t, "ready once east resynced", 5*time.Second, func() bool {
		code, _ := get(t, admin+"/readyz")
		return code == http.StatusOK
	})
}

// The leader keeps what a new cluster's session recorded and its own state
// does not know: here the leader is not the cluster's home, so it knows
// neither the spoke's ID and build nor when the session began.
func TestTheLeaderKeepsWhatANewClustersSessionRecorded(t *testing.T) {
	e := startSharedEtcd(t)
	liveness := hub.Liveness{StaleAfter: time.Second, DropAfter: 2 * time.Second, DefaultPolicy: hub.PolicyKeep} // LiveAt refreshed every 100ms
	gossipA, gossipB := freeAddr(t), freeAddr(t)
	b, _ := startHub(t, t.TempDir(), replicaOf(e, "b", gossipB, []string{gossipA}, liveness))
	awaitCond(t, "b leading", 10*time.Second, func() bool { return coordination(t, b).IsLeader })
	a, _ := startHub(t, t.TempDir(), replicaOf(e, "a", gossipA, []string{gossipB}, liveness))

	_, epoch := publishAPI(t, a, "east")
	created, ok := e.record(t, "east")
	if !ok || created.Epoch != epoch || created.SpokeID != "s1" || created.Build != "b1" {
		t.Fatalf("east's record as its session began: %+v (found %v), want epoch %d, spoke s1, build b1", created, ok, epoch)
	}
	var rec replicas.ClusterRecord
	// 30 s: the leader learns of east by replication from a, slow on a loaded machine.
	awaitCond(t, "the leader keeping east's record", 30*time.Second, func() bool {
		rec, _ = e.record(t, "east")
		return rec.LiveAt.After(created.LiveAt)
	})
	if rec.SpokeID != "s1" || rec.Build != "b1" || !rec.FirstSeen.Equal(created.FirstSeen) || rec.Network != "n1" || rec.Epoch != epoch {
		t.Errorf("east's record once the leader wrote it: %+v, want what the session recorded (%+v) with a later LiveAt", rec, created)
	}
}
