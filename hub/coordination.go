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

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// Coordination is what /debug/hub shows of the replicas working together.
type Coordination struct {
	ID       string `json:"id"`
	Leader   string `json:"leader"`   // as this replica last saw it ("" unknown)
	IsLeader bool   `json:"isLeader"` // this replica leads
	Degraded string `json:"degraded"` // why persistence and leader duties pause ("" when etcd answers)
	Members  []Peer `json:"members"`  // replicas in the gossip group (just this one without --join)
	Snapshot Saved  `json:"snapshot"` // the last snapshot this replica saved or restored
	Restored int    `json:"restored"` // clusters still served from the snapshot
}

// Peer is one replica as gossip shows it.
type Peer struct {
	Name        string `json:"name"`
	Federation  string `json:"federation"`
	XDS         string `json:"xds"`
	Admin       string `json:"admin"`
	Self        bool   `json:"self,omitempty"`
	HomeOf      int    `json:"homeOf"`      // clusters whose spoke it serves
	Unconverged int    `json:"unconverged"` // clusters it holds at another stamp than this replica
}

// Saved describes a persisted snapshot.
type Saved struct {
	Revision uint64    `json:"revision"`
	At       time.Time `json:"at,omitzero"`
	Bytes    int       `json:"bytes,omitempty"`
	Clusters int       `json:"clusters"`
	Restored bool      `json:"restored,omitempty"` // loaded at start, not saved by this replica
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
		fmt.Fprintf(&b, "%q %q %d %d %v;", c.Cluster, c.Network, c.Epoch, c.Version, c.Gateways)
	}
	return heldState{version: version, stamps: b.String()}
}

// held is what a snapshot of v would hold (see state.snapshot).
func (v *View) held() heldState {
	var clusters []registry.SnapshotCluster
	for _, id := range slices.Sorted(maps.Keys(v.Clusters)) {
		if c := v.Clusters[id]; c.Epoch != 0 || c.Version != 0 {
			clusters = append(clusters, registry.SnapshotCluster{Cluster: id, Network: c.Network, Gateways: c.Gateways, Epoch: c.Epoch, Version: c.Version})
		}
	}
	return heldOf(v.Registry.Version(), clusters)
}

// coordinator runs what makes replicas one hub: etcd health, leadership
// duties (snapshots, dropping dead clusters) and the glue between gossip,
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

	isLeader atomic.Bool
	mu       sync.Mutex // guards the fields below
	leader   string
	degraded string
	saved    Saved
	members  []Peer
}

// status returns what /debug/hub shows.
func (c *coordinator) status() Coordination {
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
		members = []Peer{{Name: c.id, Self: true}}
	}
	return Coordination{ID: c.id, Leader: c.leader, IsLeader: c.isLeader.Load(), Degraded: c.degraded,
		Members: members, Snapshot: c.saved, Restored: restored}
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
// etcd answered (with a snapshot or with none).
func (c *coordinator) restore(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	snap, ok, err := c.snapshots.Load(ctx)
	switch {
	case err != nil:
		c.log.Warn("cannot load the persisted registry yet; serving what peers and spokes send meanwhile", "err", err)
		return false
	case !ok:
		c.log.Info("no persisted registry yet; starting empty")
		return true
	}
	held, exact, err := c.state.restoreHeld(ctx, snap)
	if err != nil {
		c.log.Warn("cannot restore the persisted registry", "err", err)
		return false
	}
	c.mu.Lock()
	c.saved = Saved{Revision: snap.Revision, At: snap.Taken, Clusters: len(snap.Clusters), Restored: true}
	if exact {
		c.saved.held = held
	}
	c.mu.Unlock()
	c.metrics.snapshotRevision.Set(float64(snap.Revision))
	return true
}

// restoreLater retries restore until etcd answers (or ctx ends).
func (c *coordinator) restoreLater(ctx context.Context) {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
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

// lead campaigns for leadership; while leading, it persists the registry and
// drops dead clusters whose policy says so. Leadership ends the moment the
// etcd session does.
func (c *coordinator) lead(ctx context.Context) {
	err := replicas.Lead(ctx, c.etcd, c.leaderCfg, c.log, func(term context.Context) {
		c.isLeader.Store(true)
		c.metrics.leader.Set(1)
		c.mu.Lock()
		c.leader = c.id
		c.mu.Unlock()
		c.log.Info("leading: persisting the registry and collecting dead clusters")
		defer func() {
			c.isLeader.Store(false)
			c.metrics.leader.Set(0)
			c.log.Info("no longer leading")
		}()
		c.leaderDuties(term)
	})
	if err != nil && ctx.Err() == nil {
		c.log.Error("leader election failed", "err", err)
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

func (c *coordinator) leaderDuties(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	// What was restored, when nothing else was held, is saved already.
	c.mu.Lock()
	held := c.saved.held
	saved := held != heldState{}
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
			return
		case <-t.C:
		}
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
	c.saved = Saved{Revision: snap.Revision, At: snap.Taken, Bytes: n, Clusters: len(snap.Clusters)}
	c.mu.Unlock()
	c.metrics.snapshotRevision.Set(float64(snap.Revision))
	c.metrics.snapshotBytes.Set(float64(n))
	c.log.Debug("persisted the registry", "revision", snap.Revision, "bytes", n, "clusters", len(snap.Clusters))
	return heldOf(version, snap.Clusters), true
}

// collect drops the clusters whose drop policy is due, each under a new epoch.
func (c *coordinator) collect(ctx context.Context) {
	for _, id := range c.state.View().dropDue(c.liveness, time.Now()) {
		epochCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		epoch, err := c.catalog.NextEpoch(epochCtx, id)
		cancel()
		if err != nil {
			c.log.Warn("cannot drop a dead cluster yet", "cluster", id, "err", err)
			continue
		}
		dropped, err := c.state.drop(ctx, id, epoch)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("cannot drop a dead cluster", "cluster", id, "err", err)
		}
		if !dropped {
			continue
		}
		// A dropped cluster leaves the catalog: a cold start no longer waits for it.
		forgetCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := c.catalog.Forget(forgetCtx, id, epoch); err != nil {
			c.log.Warn("cannot remove a dropped cluster from the catalog; a cold start may wait for it", "cluster", id, "err", err)
		}
		cancel()
	}
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
		var view []Peer
		mine := c.state.View()
		for _, mem := range m.Members() {
			p := Peer{Name: mem.Name, Federation: mem.Meta.Federation, XDS: mem.Meta.XDS, Admin: mem.Meta.Admin, Self: mem.Self}
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
