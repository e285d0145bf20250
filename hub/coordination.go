package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/internal/backoff"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// Saved describes a persisted snapshot: what /debug/hub shows of it, and
// what it holds.
type Saved struct {
	adminapi.Saved
	// held is what the snapshot holds, when restored and the state holds
	// exactly that: a leader need not save it again until that changes.
	held heldState
}

// heldState identifies what a snapshot holds: the registry's version and
// every cluster's network and stamp. A spoke's resume re-stamps its cluster
// without changing the registry, and is saved too: a replica that restores
// an older stamp would make that spoke resync everything instead of resuming.
type heldState struct {
	version uint64
	stamps  string
}

func heldOf(version uint64, clusters []registry.SnapshotCluster) heldState {
	var b strings.Builder
	for _, c := range clusters {
		fmt.Fprintf(&b, "%q %q %d %d %v %v;", c.Cluster, c.Network, c.Epoch, c.Version, c.Gateways, c.Resolved)
	}
	return heldState{version: version, stamps: b.String()}
}

// held is what a snapshot of v would hold (see state.snapshot).
func (v *View) held() heldState {
	var clusters []registry.SnapshotCluster
	for _, id := range slices.Sorted(maps.Keys(v.Clusters)) {
		if c := v.Clusters[id]; c.Epoch != 0 || c.Version != 0 {
			clusters = append(clusters, registry.SnapshotCluster{Cluster: id, Network: c.Network, Gateways: c.Gateways, Epoch: c.Epoch, Version: c.Version,
				Resolved: resolvedOf(c.Gateways, v.resolved)})
		}
	}
	return heldOf(v.Registry.Version(), clusters)
}

// coordinator runs what makes replicas one hub: etcd health, leadership
// duties (snapshots, the cluster catalog, dropping dead clusters) and the glue between gossip,
// replication and the state. Its fields are written by its own goroutines
// and read by the admin API through status.
type coordinator struct {
	id        string
	state     *state
	etcd      *clientv3.Client
	catalog   *replicas.Catalog
	snapshots *replicas.SnapshotStore
	leaderCfg replicas.LeaderConfig
	interval  time.Duration // between snapshots, at most
	liveness  Liveness
	metrics   *metrics
	log       *slog.Logger
	// clustersetIPs, when set, are freed by the leader once released for ipHoldDown.
	clustersetIPs *replicas.ClusterSetIPs
	ipHoldDown    time.Duration

	isLeader     atomic.Bool
	noSaveOnStop atomic.Bool // tests: stop without a last save, as after a crash
	// restoredCh is closed once etcd has answered the restore: with a
	// snapshot, with none, or with one this replica cannot read.
	restoredCh   chan struct{}
	restoredOnce sync.Once

	mu       sync.Mutex // guards the fields below
	leader   string
	degraded string
	saved    Saved
	members  []adminapi.Peer
	self     adminapi.Peer // this replica as peers see it: its name and advertised addresses
}

// status returns what /debug/hub shows.
func (c *coordinator) status() adminapi.Coordination {
	c.mu.Lock()
	defer c.mu.Unlock()
	restored := 0
	for _, cl := range c.state.View().Clusters {
		if cl.Restored {
			restored++
		}
	}
	members := c.members
	if members == nil {
		self := c.self
		for _, cl := range c.state.View().Clusters {
			if cl.Connected {
				self.HomeOf++
			}
		}
		members = []adminapi.Peer{self} // a lone replica (no gossip)
	}
	return adminapi.Coordination{ID: c.id, Leader: c.leader, IsLeader: c.isLeader.Load(), Degraded: c.degraded,
		Members: members, Snapshot: c.saved.Saved, Restored: restored}
}

// forever runs fn until ctx ends, recovering panics and retrying after a pause.
func forever(ctx context.Context, log *slog.Logger, name string, fn func(context.Context)) {
	for ctx.Err() == nil {
		func() {
			defer func() {
				if r := recover(); r != nil {
					log.Error("panic; restarting", "loop", name, "panic", r, "stack", string(debug.Stack()))
				}
			}()
			fn(ctx)
		}()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// restore loads the persisted snapshot into the state; it reports whether
// etcd answered (with a snapshot, with none, or with one that cannot be read).
func (c *coordinator) restore(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	snap, ok, err := c.snapshots.Load(ctx)
	switch {
	case errors.Is(err, replicas.ErrSnapshotCorrupt):
		// Reading it again gives the same: the catalog's clusters resync instead (cold start).
		c.log.Error("the persisted registry cannot be read; starting without it", "err", err)
		c.restoreAnswered()
		return true
	case err != nil:
		c.log.Warn("cannot load the persisted registry yet; xDS waits for it", "err", err)
		return false
	case !ok:
		c.log.Info("no persisted registry yet; starting empty")
		c.restoreAnswered()
		return true
	}
	held, exact, err := c.state.restoreHeld(ctx, snap)
	if err != nil {
		c.log.Warn("cannot restore the persisted registry", "err", err)
		return false
	}
	c.mu.Lock()
	c.saved = Saved{Saved: adminapi.Saved{Revision: snap.Revision, At: snap.Taken, Clusters: len(snap.Clusters), Restored: true}}
	if exact {
		c.saved.held = held
	}
	c.mu.Unlock()
	c.metrics.snapshotRevision.Set(float64(snap.Revision))
	c.restoreAnswered()
	return true
}

func (c *coordinator) restoreAnswered() { c.restoredOnce.Do(func() { close(c.restoredCh) }) }

// restoreLater retries restore until etcd answers (or ctx ends).
func (c *coordinator) restoreLater(ctx context.Context) {
	retry := backoff.New(backoff.Config{Min: time.Second, Max: 5 * time.Second}) // xDS may wait for it
	for {
		if !retry.Sleep(ctx, retry.Next()) {
			return
		}
		if c.restore(ctx) {
			return
		}
	}
}

// watchEtcd checks etcd every second: while it does not answer, the hub
// keeps serving and replicating, and says so as degraded.
func (c *coordinator) watchEtcd(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		check, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.etcd.Get(check, "health", clientv3.WithCountOnly())
		var leader string
		if err == nil {
			leader, err = replicas.CurrentLeader(check, c.etcd, c.leaderCfg.Prefix)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		degraded := ""
		if err != nil {
			degraded = "etcd unreachable: persistence, leader duties and new spoke sessions pause (" + err.Error() + ")"
		}
		c.mu.Lock()
		if degraded != c.degraded {
			if degraded != "" {
				c.log.Warn("degraded: etcd unreachable; serving and replicating go on", "err", err)
			} else {
				c.log.Info("etcd reachable again")
			}
		}
		c.degraded = degraded
		if err == nil {
			c.leader = leader
		}
		c.mu.Unlock()
		c.metrics.etcdUp.Set(b2f(degraded == ""))
	}
}

// lead campaigns for leadership; while leading, it persists the registry,
// keeps the cluster catalog and drops dead clusters whose policy says so.
// Leadership ends the moment the etcd session does.
func (c *coordinator) lead(ctx context.Context) {
	// A replica that has not restored the persisted registry does not even
	// campaign: as leader it could do none of its duties (see
	// leaderDuties), and would keep a replica that has from doing them.
	select {
	case <-c.restoredCh:
	case <-ctx.Done():
		return
	}
	// A replica that stops as it is about to lead (no other replica does)
	// leads for a moment first: its term's last catalog write records the
	// clusters it holds (a hub that stops right after a spoke's hello has
	// recorded it), then it resigns.
	leadCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var stopping sync.WaitGroup
	defer stopping.Wait()
	defer stop()
	stopping.Go(func() {
		select {
		case <-leadCtx.Done():
			return
		case <-ctx.Done():
		}
		c.awaitLeadership(leadCtx)
		stop()
	})
	err := replicas.Lead(leadCtx, c.etcd, c.leaderCfg, c.log, func(term context.Context) {
		c.isLeader.Store(true)
		c.metrics.leader.Set(1)
		c.mu.Lock()
		c.leader = c.id
		c.mu.Unlock()
		defer func() {
			c.isLeader.Store(false)
			c.metrics.leader.Set(0)
			c.log.Info("no longer leading")
		}()
		if ctx.Err() != nil {
			// Leading only to stop: the catalog's last write and the registry's last save.
			c.log.Info("leading as this replica stops: recording what the catalog lacks")
			c.keepCatalog(term)
			c.saveOnStop(term, heldState{}, false)
			return
		}
		c.log.Info("leading: persisting the registry, keeping the catalog and collecting dead clusters")
		held, saved := c.leaderDuties(term)
		if ctx.Err() != nil {
			c.saveOnStop(term, held, saved)
		}
	})
	if err != nil && ctx.Err() == nil {
		c.log.Error("leader election failed", "err", err)
	}
}

// awaitLeadership waits, for catalogFlushTimeout at most, until this
// replica leads; it returns at once when another one does, or etcd is
// unreachable (degraded) or does not answer within a moment.
func (c *coordinator) awaitLeadership(ctx context.Context) {
	c.mu.Lock()
	degraded := c.degraded != ""
	c.mu.Unlock()
	if degraded {
		return
	}
	deadline := time.Now().Add(catalogFlushTimeout)
	for !c.isLeader.Load() && time.Now().Before(deadline) {
		check, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		leader, err := replicas.CurrentLeader(check, c.etcd, c.leaderCfg.Prefix)
		cancel()
		if err != nil || (leader != "" && leader != c.id) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// snapshotDuty bounds the share of time spent saving snapshots: after a save
// that took d, the next one waits at least snapshotDuty*d. A large registry
// under constant churn is then saved less often instead of keeping a core busy.
const snapshotDuty = 10

// nextSave is the earliest time for the save after one that started at
// start, took took and succeeded (ok) or not.
func nextSave(start time.Time, took, interval time.Duration, ok bool) time.Time {
	if !ok {
		// After a failure, wait a while before encoding the same registry again.
		return start.Add(10 * interval)
	}
	return start.Add(max(interval, snapshotDuty*took))
}

// leaderDuties runs the leader's duties until its term ends, and returns
// what the last snapshot it saved holds (saved false: none yet).
func (c *coordinator) leaderDuties(ctx context.Context) (held heldState, saved bool) {
	// Nothing is saved, kept or dropped before this replica holds what was
	// persisted: a snapshot of less (etcd was away at start) would replace
	// the whole one, under a newer revision.
	select {
	case <-c.restoredCh:
	case <-ctx.Done():
		return heldState{}, false
	}
	// The catalog is kept on a goroutine of its own: etcd writes there never
	// delay a snapshot or a drop. It ends with the term, after its last write.
	var catalog sync.WaitGroup
	defer catalog.Wait()
	catalog.Go(func() { c.keepCatalog(ctx) })
	t := time.NewTicker(c.interval)
	defer t.Stop()
	// What was restored, when nothing else was held, is saved already.
	c.mu.Lock()
	held = c.saved.held
	saved = held != heldState{}
	c.mu.Unlock()
	var next time.Time    // no save before then
	var nextIPs time.Time // no freeing of clusterset IPs before then
	for {
		if due := !saved || c.state.View().held() != held; due && !time.Now().Before(next) {
			start := time.Now()
			v, ok := c.persist(ctx)
			took := time.Since(start)
			c.metrics.snapshotSeconds.Observe(took.Seconds())
			if ok {
				held, saved = v, true
			}
			next = nextSave(start, took, c.interval, ok)
		}
		c.collect(ctx)
		if time.Now().After(nextIPs) {
			c.collectIPs(ctx)
			nextIPs = time.Now().Add(ipCollectInterval)
		}
		select {
		case <-ctx.Done():
			return held, saved
		case <-t.C:
		}
	}
}

// stopSaveTimeout bounds the last save of a stopping leader.
const stopSaveTimeout = 10 * time.Second

// saveOnStop saves the registry once more as a leader's term ends because
// the replica stops, unless the last save holds it already. The servers
// have stopped by then (see parts.stop), so no change comes after it: a
// replica restarted from this snapshot serves what this one served last,
// not a world up to a snapshot interval older. The write is fenced by the
// term, which still leads until this returns.
func (c *coordinator) saveOnStop(term context.Context, held heldState, saved bool) {
	select {
	case <-c.restoredCh:
	default:
		return // it holds less than what was persisted: saving would lose the rest
	}
	if c.noSaveOnStop.Load() || (saved && c.state.View().held() == held) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(term), stopSaveTimeout)
	defer cancel()
	if _, ok := c.persist(ctx); ok {
		c.mu.Lock()
		saved := c.saved
		c.mu.Unlock()
		c.log.Info("saved the registry as this replica stops", "revision", saved.Revision, "clusters", saved.Clusters)
	}
}

// ipCollectInterval is how often the leader frees released clusterset IPs.
const ipCollectInterval = time.Minute

// collectIPs frees the clusterset IPs released longer than the hold-down ago.
func (c *coordinator) collectIPs(ctx context.Context) {
	if c.clustersetIPs == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := c.clustersetIPs.Collect(ctx, time.Now(), c.ipHoldDown)
	switch {
	case err != nil && ctx.Err() == nil:
		c.log.Warn("cannot free released clusterset IPs", "err", err)
	case n > 0:
		c.log.Info("freed released clusterset IPs", "claims", n, "holdDown", c.ipHoldDown)
	}
}

// persist saves a snapshot of the registry; it reports what the snapshot holds.
func (c *coordinator) persist(ctx context.Context) (heldState, bool) {
	snap, version, err := c.state.snapshot(ctx)
	if err != nil {
		return heldState{}, false
	}
	c.mu.Lock()
	snap.Revision = max(c.saved.Revision+1, uint64(time.Now().UnixMilli()))
	c.mu.Unlock()
	save, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := c.snapshots.Save(save, snap)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("cannot persist the registry", "err", err)
		}
		if errors.Is(err, replicas.ErrSnapshotSuperseded) {
			if cur, ok, lerr := c.snapshots.Load(save); lerr == nil && ok {
				c.mu.Lock()
				c.saved.Revision = cur.Revision
				c.mu.Unlock()
			}
		}
		return heldState{}, false
	}
	c.mu.Lock()
	c.saved = Saved{Saved: adminapi.Saved{Revision: snap.Revision, At: snap.Taken, Bytes: n, Clusters: len(snap.Clusters)}}
	c.mu.Unlock()
	c.metrics.snapshotRevision.Set(float64(snap.Revision))
	c.metrics.snapshotBytes.Set(float64(n))
	c.log.Debug("persisted the registry", "revision", snap.Revision, "bytes", n, "clusters", len(snap.Clusters))
	return heldOf(version, snap.Clusters), true
}

// collect drops the clusters whose drop policy is due, each under a new epoch.
func (c *coordinator) collect(ctx context.Context) {
	for _, id := range c.state.View().dropDue(c.liveness, c.liveness.now()) {
		epochCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		epoch, err := c.catalog.NextEpoch(epochCtx, id)
		cancel()
		if err != nil {
			c.log.Warn("cannot drop a dead cluster yet", "cluster", id, "err", err)
			continue
		}
		// A dropped cluster leaves the catalog (keepCatalog): a cold start no longer waits for it.
		if _, err := c.state.drop(ctx, id, epoch); err != nil && ctx.Err() == nil {
			c.log.Warn("cannot drop a dead cluster", "cluster", id, "err", err)
		}
	}
}

// catalogFlushTimeout bounds the last catalog write of a term that ends (a
// hub that stops, or that etcd no longer answers).
const catalogFlushTimeout = 2 * time.Second

// keepCatalog keeps the cluster catalog in etcd current with the state
// while this replica leads: at every tick (at most a second apart), it
// records the clusters the catalog lacks or holds stale data of, and
// forgets the dropped ones. When the term ends it writes what it still
// owes, so a hub that stops right after a spoke's hello has recorded it.
func (c *coordinator) keepCatalog(ctx context.Context) {
	k := &catalogKeeper{catalog: c.catalog, state: c.state, refresh: c.liveness.liveRefresh(), log: c.log}
	t := time.NewTicker(min(c.interval, time.Second))
	defer t.Stop()
	for {
		k.sync(ctx)
		select {
		case <-ctx.Done():
			// The term's context keeps its leader fence: the last write is
			// made only while this replica still leads.
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), catalogFlushTimeout)
			k.sync(last)
			cancel()
			return
		case <-t.C:
		}
	}
}

// catalogKeeper is keepCatalog's state during one term. The leader is the
// only writer of the records it holds, so what it read at the start of its
// term, and wrote since, is what the catalog holds of them. Other records
// are those sessions created since (catalogFirst), which it reads when its
// state holds a cluster it has no record of (readCreated).
type catalogKeeper struct {
	catalog *replicas.Catalog
	state   *state
	refresh time.Duration // see Liveness.liveRefresh
	log     *slog.Logger
	held    map[registry.ClusterID]replicas.ClusterRecord // nil until read
}

// sync brings the catalog up to date with the state; an error (or a
// panic) is logged, and the next sync tries again.
func (k *catalogKeeper) sync(ctx context.Context) {
	defer func() {
		if r := recover(); r != nil {
			k.log.Error("panic keeping the cluster catalog", "panic", r, "stack", string(debug.Stack()))
			k.held = nil // read again
		}
	}()
	if err := k.syncOnce(ctx); err != nil && ctx.Err() == nil {
		if errors.Is(err, replicas.ErrNotLeader) {
			k.log.Debug("catalog not written: no longer leading", "err", err)
			return
		}
		k.log.Warn("cannot keep the cluster catalog current; trying again", "err", err)
	}
}

func (k *catalogKeeper) syncOnce(ctx context.Context) error {
	if k.held == nil {
		listCtx, cancel := context.WithTimeout(ctx, etcdTimeout)
		records, err := k.catalog.List(listCtx)
		cancel()
		if err != nil {
			return err
		}
		k.held = make(map[registry.ClusterID]replicas.ClusterRecord, len(records))
		for _, r := range records {
			k.held[r.Cluster] = r
		}
		// The drop timers of the clusters this replica has not seen live go
		// on from when the previous leaders saw them live. (A state that has
		// stopped, as the hub does, has no timers left to set.)
		if err := k.state.adoptLiveAt(ctx, records); err != nil && !errors.Is(err, errStopped) {
			return err
		}
	}
	v := k.state.View()
	if k.lacksRecords(v) {
		if err := k.readCreated(ctx); err != nil {
			return err
		}
	}
	now := k.state.liveness.now()
	var writes []replicas.ClusterRecord
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(v.Clusters)) {
		cl := v.Clusters[id]
		old, has := k.held[id]
		if cl.Dropped {
			if has {
				if err := k.forget(ctx, id, cl.Epoch); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		if r, ok := catalogRecord(cl, old, has, k.refresh, now); ok {
			writes = append(writes, r)
		}
	}
	if len(writes) > 0 {
		writeCtx, cancel := context.WithTimeout(ctx, etcdTimeout)
		written, err := k.catalog.RecordAll(writeCtx, writes)
		cancel()
		for _, r := range written {
			k.held[r.Cluster] = r
		}
		if len(written) > 0 {
			k.log.Debug("recorded clusters in the catalog", "clusters", len(written))
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// lacksRecords says whether v holds a cluster to record that the keeper
// holds no record of: a session may have created one since (catalogFirst).
func (k *catalogKeeper) lacksRecords(v *View) bool {
	for id, cl := range v.Clusters {
		if _, has := k.held[id]; !has && !cl.Dropped && (cl.Epoch != 0 || cl.Version != 0 || cl.Home != "") {
			return true
		}
	}
	return false
}

// readCreated reads the records sessions created since the keeper read the
// catalog: the leader's write then keeps what they say that its state may
// not know (the spoke's ID and build at a replica that is not its home, when
// the cluster was first seen).
func (k *catalogKeeper) readCreated(ctx context.Context) error {
	listCtx, cancel := context.WithTimeout(ctx, etcdTimeout)
	records, err := k.catalog.List(listCtx)
	cancel()
	if err != nil {
		return err
	}
	for _, r := range records {
		if _, has := k.held[r.Cluster]; !has {
			k.held[r.Cluster] = r
		}
	}
	return nil
}

// forget removes a dropped cluster's record.
func (k *catalogKeeper) forget(ctx context.Context, id registry.ClusterID, dropEpoch uint64) error {
	forgetCtx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	if _, err := k.catalog.Forget(forgetCtx, id, dropEpoch); err != nil {
		return fmt.Errorf("remove dropped cluster %s from the catalog (a cold start may wait for it): %w", id, err)
	}
	delete(k.held, id) // gone, or newer than the drop (then the next read finds it)
	k.log.Info("removed a dropped cluster from the catalog", "cluster", id, "epoch", dropEpoch)
	return nil
}

// catalogRecord is the record the catalog should hold of cluster cl, and
// whether that differs from what it holds (old, when has). Only what the
// state knows for sure replaces what the record says:
//   - the spoke's ID and build only while its session is here (replication
//     does not carry them), the network and epoch always;
//   - LiveAt, while a live spoke serves the cluster somewhere, once it is
//     refresh old (a restart then takes at most that off its drop timer);
//     else when this replica saw it live later than the record says. A
//     time this replica only started a timer from is written only where
//     the record has none.
func catalogRecord(cl ClusterStatus, old replicas.ClusterRecord, has bool, refresh time.Duration, now time.Time) (replicas.ClusterRecord, bool) {
	if !has && cl.Epoch == 0 && cl.Version == 0 && cl.Home == "" {
		return old, false // nothing held, no spoke: nothing to record yet
	}
	r := old
	r.Cluster = cl.Cluster
	if !has || cl.Connected {
		r.SpokeID, r.Build = cl.SpokeID, cl.Build
	}
	if cl.Network != "" {
		r.Network = cl.Network
	}
	if cl.Epoch > r.Epoch {
		r.Epoch = cl.Epoch // never back: a replica may not hold a cluster's newest data yet
	}
	if !cl.LiveAt.IsZero() {
		switch {
		case old.LiveAt.IsZero(),
			cl.Home != "" && cl.LiveAt.Sub(old.LiveAt) >= refresh,
			cl.Home == "" && cl.liveSeen && cl.LiveAt.After(old.LiveAt):
			r.LiveAt = cl.LiveAt.UTC()
			r.LastSeen = r.LiveAt
		}
	}
	if r.FirstSeen.IsZero() {
		r.FirstSeen = now.UTC()
		for _, t := range []time.Time{cl.SessionStart, cl.LiveAt} {
			if !t.IsZero() && t.Before(r.FirstSeen) {
				r.FirstSeen = t.UTC()
			}
		}
	}
	if r.LastSeen.IsZero() {
		r.LastSeen = r.FirstSeen
	}
	return r, !has || !sameRecord(r, old)
}

func sameRecord(a, b replicas.ClusterRecord) bool {
	return a.Cluster == b.Cluster && a.Network == b.Network && a.SpokeID == b.SpokeID && a.Build == b.Build && a.Epoch == b.Epoch &&
		a.FirstSeen.Equal(b.FirstSeen) && a.LastSeen.Equal(b.LastSeen) && a.LiveAt.Equal(b.LiveAt)
}

// catalogFirst is the state as spoke sessions see it: a session of a
// cluster the catalog has no record of creates the record before it begins,
// so nothing of a cluster is served (to xDS clients, or to peers, which
// serve it too) before a replica that restarts knows to wait for it (see
// coldstart.go). The leader keeps the record current from then on
// (keepCatalog). A session of a cluster the catalog holds costs one etcd
// read; updates cost none.
//
// With etcd unreachable (or not answering within etcdTimeout), the session
// is refused (Unavailable) and its spoke tries again after its backoff, as it
// does when no epoch can be drawn: a session needs etcd to begin, never to
// go on. Sessions that began go on, and a cluster whose record cannot be
// written is never served.
type catalogFirst struct {
	*state
	catalog *replicas.Catalog
	log     *slog.Logger
}

// Begin implements federation.Store.
func (s catalogFirst) Begin(ctx context.Context, sess federation.Session) (federation.Held, error) {
	at := sess.Started
	if at.IsZero() {
		at = s.liveness.now()
	}
	at = at.UTC()
	recordCtx, cancel := context.WithTimeout(ctx, etcdTimeout)
	created, err := s.catalog.RecordNew(recordCtx, replicas.ClusterRecord{
		Cluster: sess.Cluster, Network: sess.Network, SpokeID: sess.SpokeID, Build: sess.Build, Epoch: sess.Epoch,
		FirstSeen: at, LastSeen: at, LiveAt: at,
	})
	cancel()
	switch {
	case errors.Is(err, replicas.ErrEpochPassed):
		// A newer session of the cluster, or its drop, began meanwhile.
		return federation.Held{}, fmt.Errorf("%w: %v", federation.ErrSuperseded, err)
	case err != nil:
		return federation.Held{}, fmt.Errorf("the cluster must be in the catalog before it is served: %w", err)
	case created:
		s.log.Info("new cluster recorded in the catalog", "cluster", sess.Cluster, "epoch", sess.Epoch)
	}
	return s.state.Begin(ctx, sess)
}

// tickLiveness re-evaluates cluster liveness every second.
func (c *coordinator) tickLiveness(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = c.state.tick(ctx)
		}
	}
}

// follow turns gossip into peers to replicate from and into the clusters
// other replicas serve, whenever membership changes.
func (c *coordinator) follow(ctx context.Context, m *replicas.Membership, r *replicas.Replicator) {
	for {
		peers := map[string]string{}
		homes := map[registry.ClusterID]string{}
		var view []adminapi.Peer
		mine := c.state.View()
		for _, mem := range m.Members() {
			p := adminapi.Peer{Name: mem.Name, Federation: mem.Meta.Federation, XDS: mem.Meta.XDS, Admin: mem.Meta.Admin, Self: mem.Self}
			for id, sum := range mem.Summaries {
				if sum.Home {
					p.HomeOf++
					if !mem.Self {
						homes[id] = mem.Name
					}
				}
				if cl, ok := mine.Clusters[id]; !mem.Self && ok && (replicas.Stamp{Epoch: cl.Epoch, Version: cl.Version}) != sum.Stamp {
					p.Unconverged++
				}
			}
			if !mem.Self && mem.Meta.Replication != "" {
				peers[mem.Name] = mem.Meta.Replication
			}
			view = append(view, p)
		}
		r.SetPeers(peers)
		_ = c.state.setHomes(ctx, homes)
		c.mu.Lock()
		c.members = view
		c.mu.Unlock()
		c.metrics.members.Set(float64(len(view)))
		select {
		case <-ctx.Done():
			return
		case <-m.Changes():
		case <-time.After(2 * time.Second):
		}
	}
}

// summaries is the gossip delegate's view of this replica's clusters.
func (c *coordinator) summaries() map[registry.ClusterID]replicas.ClusterSummary {
	return c.state.View().summaries(c.id)
}
