package hub

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"k8s.io/utils/clock"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// Policy is what happens to a cluster's endpoints once it has been stale
// (no live spoke at any replica) for Liveness.DropAfter.
type Policy string

const (
	// PolicyKeep keeps serving the cluster's last-known endpoints (fail-static).
	PolicyKeep Policy = "keep"
	// PolicyDrop removes them (fail-closed).
	PolicyDrop Policy = "drop"
)

// Liveness says when a cluster whose spoke is gone turns stale and what
// happens to its endpoints after.
type Liveness struct {
	// StaleAfter is the grace before a cluster with no live spoke at any
	// replica is marked stale. It keeps its endpoints.
	StaleAfter time.Duration
	// DropAfter is how long a cluster must have had no live spoke before its
	// policy applies: PolicyDrop removes its endpoints (the leader decides,
	// once for every replica).
	DropAfter time.Duration
	// DefaultPolicy applies to clusters without an entry in Policies.
	DefaultPolicy Policy
	Policies      map[registry.ClusterID]Policy
	// Clock is what the grace and the drop timers are measured by, and
	// when a spoke was last seen live (nil: the system's). Tests step a
	// fake one instead of waiting.
	Clock clock.PassiveClock
}

// now is the liveness clock's time.
func (l Liveness) now() time.Time {
	if l.Clock == nil {
		return time.Now()
	}
	return l.Clock.Now()
}

// DefaultLiveness returns the hub's defaults: stale after 30s, kept
// (fail-static) for good unless a cluster's policy says drop, which applies
// after an hour.
func DefaultLiveness() Liveness {
	return Liveness{StaleAfter: 30 * time.Second, DropAfter: time.Hour, DefaultPolicy: PolicyKeep}
}

// liveRefresh is how often the leader records, while a live spoke serves
// a cluster, that it does (ClusterRecord.LiveAt): a twentieth of DropAfter,
// between 100ms and a minute. After a full restart, a cluster whose spoke
// does not come back is dropped at most that much early.
func (l Liveness) liveRefresh() time.Duration {
	return min(max(l.DropAfter/20, 100*time.Millisecond), time.Minute)
}

func (l Liveness) policy(id registry.ClusterID) Policy {
	if p, ok := l.Policies[id]; ok {
		return p
	}
	return cmp.Or(l.DefaultPolicy, PolicyKeep)
}

// replicaView is what Replicas hands out: immutable, replaced on each change.
type replicaView struct {
	clusters map[registry.ClusterID]replicas.Cluster
	changed  chan struct{} // closed when replaced
}

// Replicas implements replicas.Store. It never waits for the state goroutine.
func (s *state) Replicas() (map[registry.ClusterID]replicas.Cluster, <-chan struct{}) {
	v := s.replicas.Load()
	return v.clusters, v.changed
}

// replicaChanged republishes the replica view of cluster id, whose shards
// changed (the registry's diff) only for the services named, each once.
// Called by run's goroutine; it costs the same however many services the
// cluster has.
func (s *state) replicaChanged(id registry.ClusterID, changed ...registry.ServiceKey) {
	old := s.replicas.Load()
	next := &replicaView{clusters: maps.Clone(old.clusters), changed: make(chan struct{})}
	if c := s.clusters[id]; c != nil && (c.Epoch != 0 || c.Version != 0) {
		stamp, shards, prev := replicas.Stamp{Epoch: c.Epoch, Version: c.Version}, s.reg.ClusterView(id), old.clusters[id]
		next.clusters[id] = replicas.Cluster{
			Stamp: stamp, Digest: replicaDigest(shards.Digest(), c.Network, c.Gateways),
			Network: c.Network, Gateways: c.Gateways, Shards: shards, Local: c.Origin == s.self, Origin: c.Origin,
			Changed: prev.Changed.Then(changed, shards.Len()),
		}
	} else {
		delete(next.clusters, id)
	}
	s.replicas.Store(next)
	close(old.changed)
}

// forgetReplicaChanges starts every cluster's log of changed services
// afresh, after an operation that panicked: it may have changed the
// registry without naming what it changed, so subscribers compare what they
// were sent with what is held instead of trusting the log. Called by run's
// goroutine.
func (s *state) forgetReplicaChanges() {
	old := s.replicas.Load()
	next := &replicaView{clusters: maps.Clone(old.clusters), changed: make(chan struct{})}
	for id, c := range next.clusters {
		c.Changed = nil // reaches back to nothing; the next change starts a new lineage
		next.clusters[id] = c
	}
	s.replicas.Store(next)
	close(old.changed)
}

// ApplyReplica implements replicas.Store: a cluster's data from a
// peer replica, applied only over older data.
func (s *state) ApplyReplica(ctx context.Context, from string, u replicas.Update) error {
	var applyErr error
	err := s.do(ctx, func() {
		c := s.cluster(u.Cluster)
		held := replicas.Stamp{Epoch: c.Epoch, Version: c.Version}
		switch {
		case u.Stamp.Epoch < s.maxEpoch[u.Cluster]:
			// A newer session of the cluster has begun (here or at another replica).
			applyErr = fmt.Errorf("%w: epoch %d, newest session %d", replicas.ErrStale, u.Stamp.Epoch, s.maxEpoch[u.Cluster])
			return
		case u.Base == nil && u.Stamp.Less(held):
			applyErr = fmt.Errorf("%w: full state %s, holding %s", replicas.ErrStale, u.Stamp, held)
			return
		case u.Base != nil && !u.Stamp.Less(held) && u.Stamp != held && *u.Base != held:
			applyErr = fmt.Errorf("%w: delta over %s, holding %s", replicas.ErrBaseMismatch, *u.Base, held)
			return
		case u.Base != nil && *u.Base != held:
			applyErr = fmt.Errorf("%w: delta %s over %s, holding %s", replicas.ErrStale, u.Stamp, *u.Base, held)
			return
		}
		ch := u.Change
		ch.Cluster = u.Cluster
		// A peer under an older or another policy (each replica reads its file) may send what ours refuses.
		diff, refused, err := s.commit(ch, u.Stamp, func(c *ClusterStatus) {
			c.Origin, c.Restored, c.LastUpdate = from, false, s.liveness.now()
			// The origin's network and gateways come with its data (an update
			// from a replica that predates networks names none: keep ours).
			if u.Network != "" || c.Network == "" {
				c.Network = u.Network
			}
			c.Gateways = u.Gateways
		})
		if err != nil {
			applyErr = fmt.Errorf("replica of cluster %s from %s: %w", u.Cluster, from, err)
			return
		}
		if refused > 0 {
			// Held at the peer's stamp with another digest: the peer must not
			// be asked for it again and again (its digest will differ).
			applyErr = fmt.Errorf("%w: %d of %d services", replicas.ErrPartlyRefused, refused, len(ch.Upserts))
		}
		s.trace(u.Cluster, diff, false)
		s.publish(diff)
	})
	if err != nil {
		return err
	}
	return applyErr
}

// isDrop tells the leader's drop of a dead cluster by its stamp: an empty
// state at version 0 of a new epoch, which no spoke session produces (their
// versions start at 1).
func isDrop(st replicas.Stamp, services int) bool {
	return st.Epoch != 0 && st.Version == 0 && services == 0
}

// superseded ends the cluster's local session's claim to liveness when a
// newer epoch (a session at another replica, or the leader's drop) has
// taken over: that session can change nothing any more (its next update
// fails as superseded), so this replica is not the cluster's home.
func (s *state) superseded(id registry.ClusterID, epoch uint64) {
	if e, ok := s.session[id]; ok && e < epoch {
		delete(s.session, id)
		c := s.cluster(id)
		c.Connected, c.LastSeen = false, s.liveness.now()
		s.checkLiveness(s.liveness.now())
	}
}

// restore serves a persisted snapshot until live data replaces it: each
// cluster is marked restored until a spoke session confirms it (resumes
// from it, or sends newer data) or a peer sends newer data. Clusters the
// state already holds newer data for are left alone.
func (s *state) restore(ctx context.Context, snap registry.Snapshot) error {
	_, _, err := s.restoreHeld(ctx, snap)
	return err
}

// restoreHeld restores snap and reports what it held when the state now
// holds exactly that (ok): every cluster of snap applied, and no other
// cluster known with a stamp. A leader need not save that state again;
// otherwise (a restore after peers or spokes brought newer data) it must.
func (s *state) restoreHeld(ctx context.Context, snap registry.Snapshot) (held heldState, ok bool, err error) {
	err = s.do(ctx, func() {
		ok = true
		inSnapshot := make(map[registry.ClusterID]bool, len(snap.Clusters))
		for _, sc := range snap.Clusters {
			inSnapshot[sc.Cluster] = true
		}
		for id, c := range s.clusters {
			if !inSnapshot[id] && (c.Epoch != 0 || c.Version != 0) {
				ok = false
			}
		}
		now := s.liveness.now()
		// One change for the whole snapshot: clients never see a registry
		// restored in part, with some clusters' endpoints missing.
		changed := map[registry.ServiceKey]registry.ServiceDiff{}
		for _, sc := range snap.Clusters {
			c := s.cluster(sc.Cluster)
			if !(replicas.Stamp{Epoch: c.Epoch, Version: c.Version}).Less(replicas.Stamp{Epoch: sc.Epoch, Version: sc.Version}) {
				ok = false // held at this stamp or a newer one already
				continue
			}
			diff, _, err := s.commit(registry.Change{Cluster: sc.Cluster, Replace: true, Upserts: sc.Shards}, replicas.Stamp{Epoch: sc.Epoch, Version: sc.Version},
				func(c *ClusterStatus) {
					c.Network, c.Gateways, c.Restored = sc.Network, sc.Gateways, true
					if c.LiveAt.IsZero() {
						// Neither seen live nor in the catalog: its timers start now (fail-static).
						c.LiveAt = now
					}
				})
			if err != nil {
				// Limits lowered since it was saved: its spoke's full state will be refused as much.
				s.log.Warn("not restoring a cluster over its limits", "err", err)
				ok = false
				continue
			}
			mergeDiff(changed, diff)
		}
		s.restoreResolved(snap)
		s.publishMerged(changed)
		held = s.view.Load().held()
		s.log.Info("restored the persisted registry", "revision", snap.Revision, "taken", snap.Taken, "clusters", len(snap.Clusters))
	})
	return held, ok, err
}

// snapshot returns the registry with every cluster's stamp, for persistence.
func (s *state) snapshot(ctx context.Context) (registry.Snapshot, uint64, error) {
	var snap registry.Snapshot
	var version uint64
	err := s.do(ctx, func() {
		version = s.reg.Version()
		// Every cluster with a stamp: a cluster holds shards only once stamped.
		stamps := make(map[registry.ClusterID]registry.ClusterStamp, len(s.clusters))
		for id, c := range s.clusters {
			if c.Epoch != 0 || c.Version != 0 {
				stamps[id] = registry.ClusterStamp{Network: c.Network, Gateways: c.Gateways, Epoch: c.Epoch, Version: c.Version,
					Resolved: resolvedOf(c.Gateways, s.resolved)}
			}
		}
		snap = s.reg.Snapshot(stamps)
		snap.Taken = time.Now().UTC() // the wall clock: a snapshot says when it was taken, not a liveness time
	})
	return snap, version, err
}

// setHomes records which other replicas have a live spoke of which
// clusters (from gossip), for liveness.
func (s *state) setHomes(ctx context.Context, homes map[registry.ClusterID]string) error {
	return s.do(ctx, func() {
		s.homes = homes
		s.checkLiveness(s.liveness.now())
	})
}

// tick re-evaluates liveness (called every second or so).
func (s *state) tick(ctx context.Context) error {
	return s.do(ctx, func() { s.checkLiveness(s.liveness.now()) })
}

// checkLiveness marks clusters live, or stale once no replica has had their
// spoke for the grace period. Called by run's goroutine.
func (s *state) checkLiveness(now time.Time) {
	changed, aging := false, false
	for id, c := range s.clusters {
		home := ""
		if c.Connected {
			home = s.self
		} else {
			home = s.homes[id]
		}
		if c.Home != home {
			c.Home, changed = home, true
		}
		if home == "" && (c.Services > 0 || c.Restored) {
			aging = true
		}
		if home != "" {
			c.LiveAt, c.liveSeen = now, true
			if c.Stale || c.Dropped {
				c.Stale, c.Dropped, changed = false, false, true
				s.log.Info("cluster live again", "cluster", id, "home", home)
			}
			continue
		}
		if c.LiveAt.IsZero() {
			c.LiveAt = now // first known without a spoke, nor a time one was last live: the grace starts now
		}
		// A restart gives every cluster its grace again (fail-static: spokes
		// need a moment to reconnect); its drop timer goes on from LiveAt.
		if !c.Stale && now.Sub(later(c.LiveAt, s.started)) > s.liveness.StaleAfter {
			c.Stale, changed = true, true
			s.log.Warn("cluster stale: no live spoke at any replica; keeping its endpoints", "cluster", id,
				"since", c.LiveAt, "policy", s.liveness.policy(id))
		}
	}
	if changed || aging {
		s.publish(registry.Diff{}) // also keeps the data-age metric current
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// dropDue returns the clusters whose drop policy applies now.
func (v *View) dropDue(l Liveness, now time.Time) []registry.ClusterID {
	var out []registry.ClusterID
	for id, c := range v.Clusters {
		if c.Stale && !c.Dropped && c.Services > 0 && l.policy(id) == PolicyDrop && now.Sub(c.LiveAt) > l.DropAfter {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// drop removes a dead cluster's endpoints under a new epoch (which fences
// any session of it that might still be alive somewhere), as this replica's
// own change, so it is replicated to every peer. It reports whether it
// dropped the cluster (not when it came back meanwhile).
func (s *state) drop(ctx context.Context, id registry.ClusterID, epoch uint64) (dropped bool, err error) {
	err = s.do(ctx, func() {
		c := s.clusters[id]
		if c == nil || !c.Stale || epoch <= s.maxEpoch[id] {
			return // came back, or someone newer spoke for it meanwhile
		}
		diff, _, err := s.commit(registry.Change{Cluster: id, Replace: true}, replicas.Stamp{Epoch: epoch}, func(c *ClusterStatus) {
			c.Origin, c.Restored, c.LastUpdate = s.self, false, s.liveness.now()
			c.Gateways = nil // a dead cluster vouches for no gateway
		})
		if err != nil {
			s.log.Error("cannot drop a dead cluster", "cluster", id, "err", err) // an empty cluster is over no limit: not reached
			return
		}
		s.log.Warn("dropped a dead cluster's endpoints (policy drop)", "cluster", id, "noSpokeSince", c.LiveAt, "epoch", epoch)
		s.publish(diff)
		dropped = true
	})
	return dropped, err
}

// summaries is this replica's compact view of every cluster, for gossip.
func (v *View) summaries(self string) map[registry.ClusterID]replicas.ClusterSummary {
	out := make(map[registry.ClusterID]replicas.ClusterSummary, len(v.Clusters))
	for id, c := range v.Clusters {
		out[id] = replicas.ClusterSummary{
			Stamp:  replicas.Stamp{Epoch: c.Epoch, Version: c.Version},
			Digest: c.Digest.String()[:12],
			Home:   c.Connected && c.Home == self,
		}
	}
	return out
}
