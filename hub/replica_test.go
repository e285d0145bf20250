package hub

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/internal/changelog"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

func stamp(e, v uint64) replicas.Stamp { return replicas.Stamp{Epoch: e, Version: v} }

// replicaUpdate is a full state of east with the api service on port name,
// or (with base) a delta upserting it.
func replicaUpdate(from string, at replicas.Stamp, base *replicas.Stamp, port string) replicas.Update {
	ch := registry.Change{Cluster: "east", Upserts: []*registry.Shard{apiShard("east", time.Unix(1, 0), port)}}
	ch.Replace = base == nil
	return replicas.Update{Cluster: "east", Stamp: at, Base: base, Change: ch, Origin: from}
}

func heldPort(s *state) string {
	svc := s.View().Registry.Service(registry.ServiceKey{Namespace: "default", Name: "api"})
	if svc == nil {
		return ""
	}
	return svc.Ports[0].Name
}

// The rules by which a replica takes a peer's data: only over older data,
// a delta only over exactly its base, nothing from a superseded epoch.
func TestApplyReplicaRules(t *testing.T) {
	ctx := context.Background()
	base := func(e, v uint64) *replicas.Stamp { s := stamp(e, v); return &s }
	for _, tt := range []struct {
		name    string
		u       replicas.Update
		wantErr error
		port    string
	}{
		{"newer full state", replicaUpdate("b", stamp(5, 11), nil, "web"), nil, "web"},
		{"equal full state (a resync)", replicaUpdate("b", stamp(5, 10), nil, "web"), nil, "web"},
		{"older full state", replicaUpdate("b", stamp(5, 9), nil, "web"), replicas.ErrStale, "grpc"},
		{"older epoch, newer version", replicaUpdate("b", stamp(4, 99), nil, "web"), replicas.ErrStale, "grpc"},
		{"delta over what is held", replicaUpdate("b", stamp(5, 11), base(5, 10), "web"), nil, "web"},
		{"delta over another base", replicaUpdate("b", stamp(5, 12), base(5, 11), "web"), replicas.ErrBaseMismatch, "grpc"},
		{"delta already held", replicaUpdate("b", stamp(5, 10), base(5, 9), "web"), replicas.ErrStale, "grpc"},
		{"delta of a newer epoch over another base", replicaUpdate("b", stamp(6, 1), base(6, 0), "web"), replicas.ErrBaseMismatch, "grpc"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startState(t)
			if err := s.ApplyReplica(ctx, "a", replicaUpdate("a", stamp(5, 10), nil, "grpc")); err != nil {
				t.Fatal(err)
			}
			err := s.ApplyReplica(ctx, "b", tt.u)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("ApplyReplica = %v, want %v", err, tt.wantErr)
			}
			if got := heldPort(s); got != tt.port {
				t.Errorf("holds port %q, want %q", got, tt.port)
			}
		})
	}
}

// A spoke that resumes at a new home re-stamps the cluster with the new
// session's epoch: the new home's peers take it, and from then on refuse
// what the old home (which has not noticed it lost the spoke) still sends.
func TestResumeFencesTheOldHomeAtEveryReplica(t *testing.T) {
	ctx := context.Background()
	b, c := startState(t), startState(t) // the new home, and a third replica
	for _, s := range []*state{b, c} {
		if err := s.ApplyReplica(ctx, "a", replicaUpdate("a", stamp(5, 10), nil, "grpc")); err != nil {
			t.Fatal(err)
		}
	}
	held, _ := b.Held(ctx, "east")
	sess := federation.Session{Cluster: "east", Epoch: 6, Started: time.Now(), Acked: held}
	got, err := b.Begin(ctx, sess)
	if err != nil || !sess.Resumes(got) {
		t.Fatalf("Begin = %+v, %v; want a resume of %+v", got, err, held)
	}
	if now, _ := b.Held(ctx, "east"); now.Epoch != 6 || now.Version != 10 || now.Digest != held.Digest {
		t.Fatalf("held after the resume = %+v, want epoch 6, version and digest unchanged", now)
	}
	// B replicates the re-stamped state; C takes it.
	rc := func(s *state) replicas.Cluster { m, _ := s.Replicas(); return m["east"] }
	if r := rc(b); !r.Local || r.Stamp != stamp(6, 10) {
		t.Fatalf("B serves %+v to its peers, want a local (6,10)", r)
	}
	full := replicaUpdate("b", stamp(6, 10), nil, "grpc")
	if err := c.ApplyReplica(ctx, "b", full); err != nil {
		t.Fatal(err)
	}
	// A's late delta of the old session, at both.
	late := replicaUpdate("a", stamp(5, 11), &replicas.Stamp{Epoch: 5, Version: 10}, "web")
	for name, s := range map[string]*state{"B": b, "C": c} {
		if err := s.ApplyReplica(ctx, "a", late); !errors.Is(err, replicas.ErrStale) {
			t.Errorf("%s took the old home's late delta: %v", name, err)
		}
		if heldPort(s) != "grpc" {
			t.Errorf("%s holds port %q, want grpc", name, heldPort(s))
		}
	}
}

// A local session that a newer epoch supersedes (the spoke moved on) does not
// keep the cluster "connected" here, and its end changes nothing.
func TestSupersededSessionIsNotConnected(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	sess := federation.Session{Cluster: "east", Epoch: 5, Started: time.Now()}
	if _, err := s.Begin(ctx, sess); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, 5, 1, replicaUpdate("", stamp(5, 1), nil, "grpc").Change); err != nil {
		t.Fatal(err)
	}
	if c := s.View().Clusters["east"]; !c.Connected || c.Home != "hub-test" {
		t.Fatalf("east = %+v, want connected here", c)
	}
	if err := s.ApplyReplica(ctx, "b", replicaUpdate("b", stamp(6, 1), nil, "web")); err != nil {
		t.Fatal(err)
	}
	if c := s.View().Clusters["east"]; c.Connected || c.Home == "hub-test" {
		t.Errorf("east after a newer epoch from b = connected %v, home %q; want neither here", c.Connected, c.Home)
	}
	if _, err := s.Apply(ctx, 5, 2, replicaUpdate("", stamp(5, 2), nil, "grpc").Change); !errors.Is(err, federation.ErrSuperseded) {
		t.Errorf("the superseded session's update: %v, want ErrSuperseded", err)
	}
	s.End(sess)
	if c := s.View().Clusters["east"]; c.Connected || heldPort(s) != "web" {
		t.Errorf("after the old session ended: %+v, port %q", c, heldPort(s))
	}
}

// Restored data stays marked until a live spoke confirms it by resuming.
func TestRestoredUntilASpokeResumes(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	snap := registry.Snapshot{Revision: 1, Clusters: []registry.SnapshotCluster{{Cluster: "east", Epoch: 5, Version: 10,
		Shards: []*registry.Shard{apiShard("east", time.Unix(1, 0), "grpc")}}}}
	if err := s.restore(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if c := s.View().Clusters["east"]; !c.Restored || heldPort(s) != "grpc" {
		t.Fatalf("after restore: %+v", c)
	}
	held, _ := s.Held(ctx, "east")
	if _, err := s.Begin(ctx, federation.Session{Cluster: "east", Epoch: 6, Started: time.Now(), Acked: held}); err != nil {
		t.Fatal(err)
	}
	if c := s.View().Clusters["east"]; c.Restored || c.Origin != "hub-test" {
		t.Errorf("after a resume: restored %v, origin %q; want confirmed here", c.Restored, c.Origin)
	}
}

// The leader's drop of a dead cluster empties it under a newer epoch, as
// this replica's own change, so peers take it too.
func TestDropIsReplicated(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	if err := s.ApplyReplica(ctx, "a", replicaUpdate("a", stamp(5, 10), nil, "grpc")); err != nil {
		t.Fatal(err)
	}
	// Not stale (its spoke came back, say): not dropped.
	if dropped, err := s.drop(ctx, "east", 7); err != nil || dropped {
		t.Fatalf("drop of a live cluster = %v, %v; want not dropped", dropped, err)
	}
	_ = s.do(ctx, func() { s.clusters["east"].Stale = true })
	if dropped, err := s.drop(ctx, "east", 7); err != nil || !dropped {
		t.Fatal(dropped, err)
	}
	m, _ := s.Replicas()
	if r := m["east"]; !r.Local || r.Stamp != stamp(7, 0) || r.Shards.Len() != 0 {
		t.Errorf("replica of east after the drop = %+v, want a local, empty (7,0)", r)
	}
	if c := s.View().Clusters["east"]; !c.Dropped || c.Services != 0 {
		t.Errorf("east after the drop = %+v", c)
	}
	// A peer takes the drop as newer data.
	peer := startState(t)
	_ = peer.ApplyReplica(ctx, "a", replicaUpdate("a", stamp(5, 10), nil, "grpc"))
	if err := peer.ApplyReplica(ctx, "leader", replicas.Update{Cluster: "east", Stamp: stamp(7, 0),
		Change: registry.Change{Cluster: "east", Replace: true}}); err != nil {
		t.Fatal(err)
	}
	if heldPort(peer) != "" {
		t.Error("the peer still serves the dropped cluster")
	}
}

// Once a newer session of a cluster has begun here, nothing of an older
// epoch is taken from peers, even before that session has sent anything.
func TestNewerLocalSessionFencesOlderReplicas(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	if err := s.ApplyReplica(ctx, "a", replicaUpdate("a", stamp(5, 10), nil, "grpc")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, federation.Session{Cluster: "east", Epoch: 6, Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyReplica(ctx, "a", replicaUpdate("a", stamp(5, 11), nil, "web")); !errors.Is(err, replicas.ErrStale) {
		t.Errorf("took a full state of epoch 5 after a session of epoch 6 began: %v", err)
	}
}

// A drop arriving as a delta (the peer had been sent the cluster before) is
// still a drop, and a restored snapshot keeps it one.
func TestDropArrivingAsADelta(t *testing.T) {
	ctx := context.Background()
	peer := startState(t)
	if err := peer.ApplyReplica(ctx, "leader", replicaUpdate("leader", stamp(5, 10), nil, "grpc")); err != nil {
		t.Fatal(err)
	}
	base := stamp(5, 10)
	if err := peer.ApplyReplica(ctx, "leader", replicas.Update{Cluster: "east", Stamp: stamp(7, 0), Base: &base,
		Change: registry.Change{Cluster: "east", Removes: []registry.ServiceKey{{Namespace: "default", Name: "api"}}}}); err != nil {
		t.Fatal(err)
	}
	if c := peer.View().Clusters["east"]; !c.Dropped {
		t.Errorf("east after the leader's drop as a delta = %+v, want dropped", c)
	}
	restarted := startState(t)
	if err := restarted.restore(ctx, registry.Snapshot{Revision: 1, Clusters: []registry.SnapshotCluster{{Cluster: "east", Epoch: 7}}}); err != nil {
		t.Fatal(err)
	}
	if c := restarted.View().Clusters["east"]; !c.Dropped {
		t.Errorf("east restored from a snapshot taken after the drop = %+v, want dropped", c)
	}
}

// A restore tells the leader whether the state now holds exactly the
// snapshot: only then may it skip saving. A restore that comes late (etcd
// was down at start) finds newer data from peers, which must be saved.
func TestRestoreReportsWhetherTheSnapshotIsAllThereIs(t *testing.T) {
	ctx := context.Background()
	snap := registry.Snapshot{Revision: 1, Clusters: []registry.SnapshotCluster{{Cluster: "east", Epoch: 5, Version: 10,
		Shards: []*registry.Shard{apiShard("east", time.Unix(1, 0), "grpc")}}}}

	fresh := startState(t)
	held, exact, err := fresh.restoreHeld(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	if !exact || held != fresh.View().held() {
		t.Errorf("restore into an empty state: exact %v, held %+v, view %+v; want exact and equal", exact, held, fresh.View().held())
	}

	newer := startState(t)
	if err := newer.ApplyReplica(ctx, "peer", replicaUpdate("peer", stamp(6, 1), nil, "http")); err != nil {
		t.Fatal(err)
	}
	if _, exact, err := newer.restoreHeld(ctx, snap); err != nil || exact {
		t.Errorf("restore under newer data from a peer: exact %v, err %v; want not exact", exact, err)
	}
	if heldPort(newer) != "http" {
		t.Errorf("the restore replaced newer data: port %q", heldPort(newer))
	}

	other := startState(t)
	west := replicas.Update{Cluster: "west", Stamp: stamp(2, 1), Origin: "peer",
		Change: registry.Change{Cluster: "west", Replace: true, Upserts: []*registry.Shard{apiShard("west", time.Unix(1, 0), "grpc")}}}
	if err := other.ApplyReplica(ctx, "peer", west); err != nil {
		t.Fatal(err)
	}
	if _, exact, err := other.restoreHeld(ctx, snap); err != nil || exact {
		t.Errorf("restore beside another cluster: exact %v, err %v; want not exact", exact, err)
	}
}

// updates records every registry a publisher is handed.
type updates struct {
	mu   sync.Mutex
	regs []*registry.Registry
}

func (u *updates) Update(r *registry.Registry, _ registry.Diff) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.regs = append(u.regs, r)
}

// A restore reaches xDS as one change: a client that connects while it
// runs never gets a registry restored in part (a few clusters' endpoints,
// the others missing), which a warm restart of the benchmark caught.
func TestRestoreIsPublishedWhole(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pub := &updates{}
	s := newState("hub-test", DefaultLiveness(), pub, registry.DefaultLimits(), nil, slog.New(slog.DiscardHandler))
	go s.run(ctx)
	t.Cleanup(func() { cancel(); <-s.done })
	snap := registry.Snapshot{Revision: 1}
	for _, id := range []registry.ClusterID{"east", "north", "west"} {
		snap.Clusters = append(snap.Clusters, registry.SnapshotCluster{Cluster: id, Epoch: 1, Version: 1,
			Shards: []*registry.Shard{apiShard(id, time.Unix(1, 0), "grpc")}})
	}
	if err := s.restore(ctx, snap); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.regs) != 1 {
		t.Fatalf("the restore was published in %d parts, want 1", len(pub.regs))
	}
	if got := len(pub.regs[0].Service(registry.ServiceKey{Namespace: "default", Name: "api"}).Shards); got != 3 {
		t.Fatalf("the published registry holds api in %d clusters, want 3", got)
	}
}

// A full restart keeps a dead cluster's drop timer: the catalog says when a
// live spoke last served it, 50 minutes ago; with DropAfter an hour, it is
// dropped 10 minutes after the restart, not 60. The restart still gives it
// the grace to come back before it turns stale.
func TestRestartKeepsWhenAClusterWasLastLive(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	l := Liveness{StaleAfter: 30 * time.Second, DropAfter: time.Hour, DefaultPolicy: PolicyDrop}
	restart := time.Now()
	lastLive := restart.Add(-50 * time.Minute)
	_ = s.do(ctx, func() { s.liveness, s.started = l, restart })
	if err := s.known(ctx, []replicas.ClusterRecord{{Cluster: "east", Network: "n1", LiveAt: lastLive, LastSeen: lastLive}}); err != nil {
		t.Fatal(err)
	}
	snap := registry.Snapshot{Revision: 1, Clusters: []registry.SnapshotCluster{{Cluster: "east", Epoch: 5, Version: 10,
		Shards: []*registry.Shard{apiShard("east", time.Unix(1, 0), "grpc")}}}}
	if err := s.restore(ctx, snap); err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) ClusterStatus {
		_ = s.do(ctx, func() { s.checkLiveness(restart.Add(d)) })
		return s.View().Clusters["east"]
	}
	if c := at(time.Second); c.Stale || !c.LiveAt.Equal(lastLive) {
		t.Fatalf("east just after the restart: stale %v, last live %v; want within its grace, last live %v", c.Stale, c.LiveAt, lastLive)
	}
	if c := at(31 * time.Second); !c.Stale {
		t.Fatal("east not stale once the restart's grace has passed")
	}
	v := s.View()
	if due := v.dropDue(l, restart.Add(9*time.Minute)); len(due) != 0 {
		t.Errorf("drops due 9 minutes after the restart: %v, want none", due)
	}
	if due := v.dropDue(l, restart.Add(10*time.Minute+time.Second)); len(due) != 1 || due[0] != "east" {
		t.Errorf("drops due 10 minutes after the restart: %v, want east", due)
	}
	// Its spoke comes back: live again, and its last-live time is new.
	if _, err := s.Begin(ctx, federation.Session{Cluster: "east", Epoch: 6, Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if c := s.View().Clusters["east"]; c.Stale || !c.LiveAt.After(restart) || len(s.View().dropDue(l, restart.Add(11*time.Minute))) != 0 {
		t.Errorf("east with its spoke back: %+v, want live", c)
	}
}

// A restarted hub's restored cluster whose spoke resumes is held: the
// import set can be authoritative again, so that spokes delete the imports
// of a cluster dropped meanwhile (seen in TestImportsEndToEnd: a resumed
// east never got north's dropped import removed).
func TestResumedClusterCountsAsHeld(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	snap := registry.Snapshot{Revision: 1, Clusters: []registry.SnapshotCluster{{Cluster: "east", Epoch: 5, Version: 10,
		Shards: []*registry.Shard{apiShard("east", time.Unix(1, 0), "grpc")}}}}
	if err := s.restore(ctx, snap); err != nil {
		t.Fatal(err)
	}
	held, _ := s.Held(ctx, "east")
	sess := federation.Session{Cluster: "east", Epoch: 6, Started: time.Now(), Acked: held}
	got, err := s.Begin(ctx, sess)
	if err != nil || !sess.Resumes(got) {
		t.Fatalf("Begin = %+v, %v; want a resume of %+v", got, err, held)
	}
	c := s.View().Clusters["east"]
	if c.Restored || c.LastUpdate.IsZero() {
		t.Fatalf("after the resume: restored %v, last update %v; want confirmed now", c.Restored, c.LastUpdate)
	}
	im := newImporter(nil, nil, time.Hour, slog.New(slog.DiscardHandler))
	im.catalogRead.Store(true)
	importerRound(t, im, s.View().Clusters, apiShard("east", time.Unix(1, 0), "grpc"))
	if set, _ := im.Imports(); !set.Authoritative {
		t.Fatal("the import set is not authoritative with the only cluster resumed")
	}
}

// The replica view says which services each change touched (the registry's
// diff), so a peer is sent just those: a change costs the same however many
// services the cluster has.
func TestReplicaViewNamesWhatChanged(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	named := func(name, port string) *registry.Shard {
		sh := apiShard("east", time.Unix(1, 0), port)
		sh.Service.Name = name
		return sh
	}
	apply := func(at replicas.Stamp, base *replicas.Stamp, ch registry.Change) {
		t.Helper()
		ch.Cluster, ch.Replace = "east", base == nil
		if err := s.ApplyReplica(ctx, "a", replicas.Update{Cluster: "east", Stamp: at, Base: base, Change: ch, Origin: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	// at is where the view's log is: what a subscription keeps of what it sent.
	at := func() changelog.Position {
		m, _ := s.Replicas()
		return m["east"].Changed.Position()
	}
	since := func(from changelog.Position) []string {
		t.Helper()
		m, _ := s.Replicas()
		keys, ok := m["east"].Changed.Since(from)
		if !ok {
			t.Fatalf("the replica view does not reach back to %v", from)
		}
		var out []string
		for _, k := range keys {
			out = append(out, k.Name)
		}
		slices.Sort(out)
		return out
	}
	first, second, third := stamp(1, 1), stamp(1, 2), stamp(1, 3)
	apply(first, nil, registry.Change{Upserts: []*registry.Shard{named("a", "grpc"), named("b", "grpc"), named("c", "grpc")}})
	atFirst := at()
	apply(second, &first, registry.Change{Upserts: []*registry.Shard{named("a", "http"), named("b", "grpc")}}) // b as it was
	atSecond := at()
	if got := since(atFirst); !slices.Equal(got, []string{"a"}) {
		t.Errorf("changed since the full state: %v, want [a]", got)
	}
	apply(third, &second, registry.Change{Removes: []registry.ServiceKey{named("c", "grpc").Service}})
	if got := since(atFirst); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("changed since the full state: %v, want [a c]", got)
	}
	if got := since(atSecond); !slices.Equal(got, []string{"c"}) {
		t.Errorf("changed since the first delta: %v, want [c]", got)
	}
	m, _ := s.Replicas()
	if v := m["east"].Shards; v.Len() != 2 {
		t.Errorf("the view holds %d services, want a and b", v.Len())
	}
}

// The export policy's enforcement changes a cluster at the stamp it holds:
// a peer sent that stamp before it must still hear of it with the next delta.
func TestReplicaViewNamesAChangeAtTheSameStamp(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	shard := func(ns, name, port string) *registry.Shard {
		sh := apiShard("east", time.Unix(1, 0), port)
		sh.Service = registry.ServiceKey{Namespace: ns, Name: name}
		return sh
	}
	if _, err := s.Apply(ctx, 1, 1, registry.Change{Cluster: "east", Replace: true,
		Upserts: []*registry.Shard{shard("a", "x", "http"), shard("b", "y", "http")}}); err != nil {
		t.Fatal(err)
	}
	m, _ := s.Replicas()
	sent := m["east"] // what a subscription sent at (1,1)
	if err := s.do(ctx, func() { s.exportAllowed = func(_ registry.ClusterID, ns string) bool { return ns != "b" } }); err != nil {
		t.Fatal(err)
	}
	if err := s.enforceExportPolicy(ctx); err != nil { // at the same stamp, (1,1)
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, 1, 2, registry.Change{Cluster: "east", Upserts: []*registry.Shard{shard("a", "x", "grpc")}}); err != nil {
		t.Fatal(err)
	}
	m, _ = s.Replicas()
	cur := m["east"]
	keys, ok := cur.Changed.Since(sent.Changed.Position())
	if !ok {
		t.Fatalf("the replica view does not reach back to %s", sent.Stamp)
	}
	named := map[registry.ServiceKey]bool{}
	for _, k := range keys {
		named[k] = true
	}
	for k, sh := range sent.Shards.All() {
		if now, _ := cur.Shards.Get(k); !sh.Equal(now) && !named[k] {
			t.Errorf("%s differs between what was sent at %s and what is held at %s, but Since = %v does not name it", k, sent.Stamp, cur.Stamp, keys)
		}
	}
}

// After a state operation panics, the replica view's logs of changed
// services start afresh: the operation may have changed the registry without
// naming what it changed, so the next delta to a peer is found by comparing
// what it was sent, not from the log.
func TestAPanicStartsTheReplicaLogsAfresh(t *testing.T) {
	ctx := context.Background()
	s := startState(t)
	if err := s.ApplyReplica(ctx, "a", replicas.Update{Cluster: "east", Stamp: stamp(1, 1), Origin: "a",
		Change: registry.Change{Cluster: "east", Replace: true, Upserts: []*registry.Shard{apiShard("east", time.Unix(1, 0), "http")}}}); err != nil {
		t.Fatal(err)
	}
	m, replaced := s.Replicas()
	sent := m["east"].Changed.Position() // what a subscription sent
	if _, ok := m["east"].Changed.Since(sent); !ok {
		t.Fatal("the log does not reach its own position")
	}
	if err := s.do(ctx, func() { panic("in the middle of a change") }); !errors.Is(err, errPanicked) {
		t.Fatalf("a panicking operation: %v", err)
	}
	// The operation's caller hears of the panic as it unwinds; the view is
	// replaced once it is recovered, as a subscription would see it.
	select {
	case <-replaced:
	case <-time.After(time.Minute):
		t.Fatal("the replica view was not replaced after the panic")
	}
	m, _ = s.Replicas()
	if _, ok := m["east"].Changed.Since(sent); ok {
		t.Error("after a panic, the log still reaches back to what was sent before it")
	}
	if m["east"].Stamp != stamp(1, 1) || m["east"].Shards.Len() != 1 {
		t.Errorf("the view after a panic: %+v", m["east"])
	}
}
