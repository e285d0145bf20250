package hub_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/etcdtest"
	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// sharedEtcd is a real etcd for hub replicas, and a catalog reader of it.
type sharedEtcd struct {
	endpoint string
	client   *clientv3.Client
	catalog  *replicas.Catalog
}

func startSharedEtcd(t *testing.T) *sharedEtcd {
	t.Helper()
	endpoint, _ := etcdtest.Start(t, nil)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &sharedEtcd{endpoint: endpoint, client: cli, catalog: replicas.NewCatalog(cli, "/nave/")}
}

// record returns the catalog's record of id.
func (e *sharedEtcd) record(t *testing.T, id registry.ClusterID) (replicas.ClusterRecord, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := e.catalog.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list {
		if r.Cluster == id {
			return r, true
		}
	}
	return replicas.ClusterRecord{}, false
}

// candidates counts the keys of the leader election: the leader's and those
// of the replicas campaigning behind it, in the order they will lead.
func (e *sharedEtcd) candidates(t *testing.T) int64 {
	t.Helper()
	resp, err := e.client.Get(t.Context(), "/nave/leader/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// holdLeadership makes the test the hub's leader (as "outsider") until release is called.
func (e *sharedEtcd) holdLeadership(t *testing.T) (release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	leading := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := replicas.DefaultLeaderConfig()
		cfg.ID = "outsider"
		_ = replicas.Lead(ctx, e.client, cfg, slog.New(slog.DiscardHandler), func(term context.Context) {
			close(leading)
			<-term.Done()
		})
	}()
	select {
	case <-leading:
	case <-time.After(30 * time.Second):
		t.Fatal("the outsider never led")
	}
	release = func() { cancel(); <-done }
	t.Cleanup(release)
	return release
}

// replicaOf is a hub replica over the shared etcd, gossiping on gossip and joining join.
func replicaOf(e *sharedEtcd, id, gossip string, join []string, liveness hub.Liveness) func(*hub.Config) {
	return func(c *hub.Config) {
		c.ID, c.EtcdEndpoints = id, []string{e.endpoint}
		c.GossipAddr, c.AdvertiseHost, c.Join, c.FastGossip = gossip, "127.0.0.1", join, true
		c.SnapshotInterval, c.Liveness = 20*time.Millisecond, liveness
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := nettest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func awaitCond(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
	}
}

// publishAPI opens east's session at h with one service, and returns the stream and the session's epoch.
func publishAPI(t *testing.T, h *hub.Hub, cluster registry.ClusterID) (fedv1.Federation_PublishClient, uint64) {
	t.Helper()
	stream, welcome := rawSession(t, h, &fedv1.Hello{ClusterId: string(cluster), Network: "n1", SpokeId: "s1", SpokeBuild: "b1"})
	sendShards(t, stream, &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true},
		apiShard(cluster, olderExport, "grpc", "10.0.0.1"))
	if m := recv(t, stream); m.GetAck() == nil {
		t.Fatalf("%s's full state answered %v", cluster, m)
	}
	return stream, welcome.GetEpoch()
}

// Only the leader keeps the catalog: a replica that hosts a spoke's
// session while another leads creates the record of the cluster new to the
// catalog as the session begins (catalogFirst), and writes nothing more of
// it; the leader keeps it current from what replication brought it, and
// removes it once it has dropped the dead cluster.
func TestOnlyTheLeaderWritesTheCatalog(t *testing.T) {
	e := startSharedEtcd(t)
	release := e.holdLeadership(t) // neither replica leads until the test says so
	liveness := hub.Liveness{StaleAfter: 300 * time.Millisecond, DropAfter: 1500 * time.Millisecond, DefaultPolicy: hub.PolicyDrop}
	gossipA, gossipB := freeAddr(t), freeAddr(t)
	// B campaigns first, so it leads once the outsider is gone (an etcd
	// election is first come, first served); A hosts east's spoke.
	b, _ := startHub(t, t.TempDir(), replicaOf(e, "b", gossipB, []string{gossipA}, liveness))
	awaitCond(t, "b campaigning", 10*time.Second, func() bool { return e.candidates(t) == 2 })
	a, _ := startHub(t, t.TempDir(), replicaOf(e, "a", gossipA, []string{gossipB}, liveness))
	awaitCond(t, "a campaigning after b", 10*time.Second, func() bool { return e.candidates(t) == 3 })

	stream, epoch := publishAPI(t, a, "east")
	created, ok := e.record(t, "east")
	if !ok || created.Epoch != epoch || created.Network != "n1" || created.LiveAt.IsZero() || !created.FirstSeen.Equal(created.LiveAt) {
		t.Fatalf("east's record as its first session began: %+v (found %v), want epoch %d, network n1, live at its first sight", created, ok, epoch)
	}
	awaitCond(t, "east replicated to b", 10*time.Second, func() bool { return b.View().Clusters["east"].Services == 1 })
	// Let a leader's ticks pass, had either replica thought it led: a
	// leader would refresh LiveAt (liveRefresh: 100ms here) while east is live.
	time.Sleep(300 * time.Millisecond)
	if r, _ := e.record(t, "east"); !sameRecord(r, created) {
		t.Fatalf("with no hub replica leading, east's record changed from %+v to %+v: a replica that does not lead wrote it", created, r)
	}

	release()
	awaitCond(t, "b leading", 10*time.Second, func() bool { return coordination(t, b).IsLeader })
	if coordination(t, a).IsLeader {
		t.Fatal("a leads too")
	}
	var rec replicas.ClusterRecord
	awaitCond(t, "the leader recording east", 10*time.Second, func() bool {
		rec, _ = e.record(t, "east")
		return rec.LiveAt.After(created.LiveAt)
	})
	if rec.Network != "n1" || rec.Epoch != epoch || rec.LiveAt.IsZero() || rec.FirstSeen.IsZero() || rec.FirstSeen.After(rec.LiveAt) {
		t.Errorf("east's record %+v, want network n1, epoch %d, seen live", rec, epoch)
	}

	// The spoke leaves; once east's drop policy applies, the leader drops it and forgets it.
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	awaitCond(t, "east dropped at both replicas", 20*time.Second, func() bool {
		return a.View().Clusters["east"].Dropped && b.View().Clusters["east"].Dropped
	})
	awaitCond(t, "east's record removed", 10*time.Second, func() bool { _, ok := e.record(t, "east"); return !ok })
	// Removed for good: the leader does not record the dropped cluster again.
	time.Sleep(200 * time.Millisecond)
	if r, ok := e.record(t, "east"); ok {
		t.Errorf("the dropped east is back in the catalog: %+v", r)
	}
}

// A full restart does not restart a dead cluster's drop timer: it goes on
// from when a live spoke last served the cluster (the catalog's LiveAt).
// Here, east's spoke left 2.5s before the restart with a 4s drop policy:
// east is dropped 1.5s after the restart, not 4s. west's spoke served it
// until the restart; the restart gives it the grace to come back, and it
// is live again. Liveness runs on a fake clock the test steps: nothing
// here depends on how fast the machine is.
func TestRestartKeepsTheDropTimer(t *testing.T) {
	e := startSharedEtcd(t)
	ctx := t.Context()
	fake := clocktesting.NewFakePassiveClock(time.Now())
	liveness := hub.Liveness{StaleAfter: 500 * time.Millisecond, DropAfter: 4 * time.Second, DefaultPolicy: hub.PolicyDrop, Clock: fake}
	single := func(c *hub.Config) {
		c.ID, c.EtcdEndpoints, c.SnapshotInterval, c.Liveness = "solo", []string{e.endpoint}, 20*time.Millisecond, liveness
		c.ColdStartWait = 0
	}
	h, stop := startHub(t, t.TempDir(), single)
	east, _ := publishAPI(t, h, "east")
	west, _ := publishAPI(t, h, "west")
	if err := east.CloseSend(); err != nil {
		t.Fatal(err)
	}
	awaitCond(t, "east's spoke gone", time.Minute, func() bool { return !h.View().Clusters["east"].Connected })
	left := h.View().Clusters["east"].LiveAt
	fake.SetTime(left.Add(time.Second))
	if err := h.CheckLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	if !h.View().Clusters["east"].Stale {
		t.Fatalf("east a second after its spoke left: %+v, want stale", h.View().Clusters["east"])
	}
	awaitCond(t, "the catalog recording when east was last live", time.Minute, func() bool {
		r, ok := e.record(t, "east")
		return ok && r.LiveAt.Equal(left)
	})
	awaitCond(t, "a snapshot of both clusters", time.Minute, func() bool { return coordination(t, h).Snapshot.Clusters == 2 })
	fake.SetTime(left.Add(2500 * time.Millisecond))
	stop()
	_ = west.CloseSend()

	h, _ = startHub(t, t.TempDir(), single)
	if got := h.View().Clusters["east"].LiveAt; !got.Equal(left) {
		t.Errorf("after the restart east was last live at %v, want %v as before", got, left)
	}
	awaitCond(t, "the restarted replica leading", time.Minute, func() bool { return coordination(t, h).IsLeader })

	// 0.4s after the restart: west is within its grace (stale 0.5s after the
	// restart, not after its spoke left), and east's drop is not due.
	fake.SetTime(left.Add(2900 * time.Millisecond))
	if err := h.CheckLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	if w := h.View().Clusters["west"]; w.Stale || w.Dropped {
		t.Errorf("west 0.4s after the restart: %+v; a restart gives its spoke the grace to come back", w)
	}
	// 3.9s after east's spoke left: stale again (the grace has passed), not due.
	fake.SetTime(left.Add(3900 * time.Millisecond))
	if err := h.CheckLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	h.CollectDead(ctx)
	if c := h.View().Clusters["east"]; !c.Stale || c.Dropped {
		t.Fatalf("east 3.9s after its spoke left: %+v, want stale and not dropped before its drop policy applies (%v)", c, liveness.DropAfter)
	}
	// 4.1s after east's spoke left, 1.6s after the restart: east's drop is due.
	fake.SetTime(left.Add(4100 * time.Millisecond))
	if err := h.CheckLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	h.CollectDead(ctx)
	if c := h.View().Clusters["east"]; !c.Dropped {
		t.Fatalf("east 4.1s after its spoke left, 1.6s after the restart: %+v, want dropped (the restart must not restart its drop timer)", c)
	}
	if w := h.View().Clusters["west"]; w.Dropped {
		t.Errorf("west dropped 1.6s after the restart: %+v", w)
	}
	publishAPI(t, h, "west")
	awaitCond(t, "west live again", time.Minute, func() bool {
		w := h.View().Clusters["west"]
		return w.Home != "" && !w.Stale && !w.Dropped && w.Services == 1
	})
}

// sameRecord compares two records field by field (times by Equal).
func sameRecord(a, b replicas.ClusterRecord) bool {
	return a.Cluster == b.Cluster && a.Network == b.Network && a.SpokeID == b.SpokeID && a.Build == b.Build && a.Epoch == b.Epoch &&
		a.FirstSeen.Equal(b.FirstSeen) && a.LastSeen.Equal(b.LastSeen) && a.LiveAt.Equal(b.LiveAt)
}
