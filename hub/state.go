package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/convergence"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// Publisher receives every new registry with what changed. It is called from
// the state goroutine and must return quickly.
type Publisher interface {
	Update(r *registry.Registry, d registry.Diff)
}

// publishers hands every change to each of them, in order.
type publishers []Publisher

func (ps publishers) Update(r *registry.Registry, d registry.Diff) {
	for _, p := range ps {
		p.Update(r, d)
	}
}

// ClusterStatus is the hub's view of one cluster: what /debug/clusters
// shows of it (RefusedExports is filled in there), and what the leader
// records only of what it saw.
type ClusterStatus struct {
	adminapi.ClusterStatus

	// liveSeen: LiveAt is when this replica last saw a live spoke serve the
	// cluster, not a time it started the cluster's timer from or read from
	// the catalog (the leader records only what was seen).
	liveSeen bool
}

// View is an immutable snapshot of the hub's state for readers (admin API, metrics).
type View struct {
	Registry *registry.Registry
	Clusters map[registry.ClusterID]ClusterStatus
	// Topology is the network topology xDS computes split-horizon EDS against.
	Topology registry.Networks
	// resolved holds what gateways' DNS names resolved to.
	resolved map[string][]netip.Addr
}

// state owns the merged registry. One goroutine (run) applies every change;
// everything else sends it a closure and, where it needs one, awaits the answer.
type state struct {
	self      string // this replica's ID
	liveness  Liveness
	log       *slog.Logger
	publisher Publisher
	// tracer, if not nil, traces every change a spoke or a replica sends
	// from its application here to the clients (set before the state runs).
	tracer *convergence.Tracer
	// exportAllowed, if not nil, is the export policy (set before the
	// state runs): no change from a spoke, a peer or a snapshot makes the
	// state hold an export it refuses (see permitted).
	exportAllowed func(cluster registry.ClusterID, namespace string) bool
	limits        registry.Limits
	onChange      func(View)
	ops           chan func()
	done          chan struct{} // closed when run returns
	// started is when this replica started: every cluster's grace before it
	// turns stale starts over then (a restart is no sign of a dead spoke),
	// while its drop timer goes on from its LiveAt.
	started time.Time

	// Owned by run's goroutine.
	reg      *registry.Registry
	clusters map[registry.ClusterID]*ClusterStatus
	maxEpoch map[registry.ClusterID]uint64
	// session is the epoch of each cluster's local spoke session (the one
	// that makes the cluster Connected here), until it ends or a newer epoch
	// from anywhere supersedes it.
	session map[registry.ClusterID]uint64
	homes   map[registry.ClusterID]string // clusters whose spoke another replica serves (gossip)
	// networks is the topology last handed to the publisher, when networksKnown.
	networks      registry.Networks
	networksKnown bool
	// resolved holds what gateways' DNS names resolved to (resolveGatewayNames).
	resolved map[string][]netip.Addr

	view     atomic.Pointer[View]
	replicas atomic.Pointer[replicaView]

	// conflicts holds, per cluster, the merge conflicts that concern it. Only
	// run's goroutine replaces an entry (closing the old one's changed
	// channel); federation sessions read entries from their own goroutines.
	conflictsMu sync.Mutex
	conflicts   map[registry.ClusterID]*clusterConflicts
}

// clusterConflicts is one cluster's conflict set, immutable once published.
type clusterConflicts struct {
	set     federation.Conflicts
	changed chan struct{} // closed when the entry is replaced
}

// newState returns the state of replica self. It never waits for etcd:
// the leader keeps the catalog (see coordinator.keepCatalog), and a session
// records a new cluster before it begins, off the state (see catalogFirst).
func newState(self string, liveness Liveness, publisher Publisher, limits registry.Limits, onChange func(View), log *slog.Logger) *state {
	s := &state{
		self: self, liveness: liveness,
		log: log.With("component", "state"), publisher: publisher, limits: limits, onChange: onChange,
		ops: make(chan func()), done: make(chan struct{}), started: liveness.now(), reg: registry.New(),
		clusters: map[registry.ClusterID]*ClusterStatus{}, maxEpoch: map[registry.ClusterID]uint64{},
		session:   map[registry.ClusterID]uint64{},
		conflicts: map[registry.ClusterID]*clusterConflicts{},
	}
	s.replicas.Store(&replicaView{clusters: map[registry.ClusterID]replicas.Cluster{}, changed: make(chan struct{})})
	s.publish(registry.Diff{})
	return s
}

// run applies operations until ctx ends. A panicking operation is logged and
// the loop goes on with the state as it was before that operation.
func (s *state) run(ctx context.Context) {
	defer close(s.done)
	for {
		select {
		case <-ctx.Done():
			return
		case op := <-s.ops:
			s.safely(op)
		}
	}
}

func (s *state) safely(op func()) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic in state operation", "panic", r, "stack", string(debug.Stack()))
			s.forgetReplicaChanges()
		}
	}()
	op()
}

// errStopped is returned by operations sent after the state stopped.
var errStopped = errors.New("hub state stopped")

// errPanicked is returned by an operation that panicked: it did not
// complete, and whoever asked for it must not act as if it had (a spoke's
// update is not acknowledged).
var errPanicked = errors.New("hub state: the operation failed (a panic, logged)")

// do runs op on the state goroutine and waits for it. Once the state
// goroutine has taken op, do waits for its end whatever ctx does: op is
// short (operations never block), and its caller reads what op wrote.
func (s *state) do(ctx context.Context, op func()) error {
	done := make(chan struct{})
	completed := false // written before done closes
	select {
	case s.ops <- func() { defer close(done); op(); completed = true }:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return errStopped
	}
	<-done // closed even when op panics; run takes nothing else meanwhile
	if !completed {
		return errPanicked
	}
	return nil
}

// View returns the latest snapshot.
func (s *state) View() *View { return s.view.Load() }

func (s *state) publish(d registry.Diff) {
	netsChanged := s.updateNetworks()
	v := &View{Registry: s.reg, Clusters: make(map[registry.ClusterID]ClusterStatus, len(s.clusters)), Topology: s.networks, resolved: s.resolved}
	for id, c := range s.clusters {
		v.Clusters[id] = *c
	}
	s.view.Store(v)
	if s.publisher != nil {
		// The topology first: a change's endpoints are placed by the networks of its time.
		if np, ok := s.publisher.(NetworksPublisher); ok && netsChanged {
			np.SetNetworks(s.networks)
		}
		if !d.Empty() {
			s.publisher.Update(s.reg, d)
		}
	}
	if s.onChange != nil {
		s.onChange(*v)
	}
}

func (s *state) cluster(id registry.ClusterID) *ClusterStatus {
	c := s.clusters[id]
	if c == nil {
		c = &ClusterStatus{ClusterStatus: adminapi.ClusterStatus{Cluster: id}}
		s.clusters[id] = c
	}
	return c
}

// Held implements federation.Store.
func (s *state) Held(ctx context.Context, id registry.ClusterID) (federation.Held, error) {
	var h federation.Held
	err := s.do(ctx, func() {
		if c := s.clusters[id]; c != nil {
			h = federation.Held{Epoch: c.Epoch, Version: c.Version, Digest: s.reg.ClusterDigest(id)}
		}
	})
	return h, err
}

// Apply implements federation.Store.
func (s *state) Apply(ctx context.Context, epoch, version uint64, ch registry.Change) (registry.Hash, error) {
	var digest registry.Hash
	var applyErr error
	err := s.do(ctx, func() {
		if max := s.maxEpoch[ch.Cluster]; epoch < max {
			applyErr = fmt.Errorf("%w: update of epoch %d, newest is %d", federation.ErrSuperseded, epoch, max)
			return
		}
		// The federation edge refused what the policy refuses already, under the policy of its time.
		diff, _, err := s.commit(ch, replicas.Stamp{Epoch: epoch, Version: version}, func(c *ClusterStatus) {
			c.Origin, c.Restored, c.LastUpdate = s.self, false, s.liveness.now()
			digest = c.Digest
		})
		if err != nil {
			// commit changed nothing: what the cluster holds is as before.
			applyErr = &federation.LimitError{Services: growing(s.reg.ClusterView(ch.Cluster), ch.Upserts), Reason: err.Error()}
			return
		}
		if !diff.Empty() {
			s.log.Debug("registry changed", "cluster", ch.Cluster, "version", diff.Version, "services", len(diff.Services))
		}
		s.trace(ch.Cluster, diff, true)
		s.publish(diff)
	})
	if err != nil {
		return digest, err
	}
	return digest, applyErr
}

// trace starts tracing the changes of diff, which came from cluster's
// spoke (fromSpoke) or a replica.
func (s *state) trace(cluster registry.ClusterID, diff registry.Diff, fromSpoke bool) {
	if s.tracer == nil || diff.Empty() {
		return
	}
	keys := make([]registry.ServiceKey, len(diff.Services))
	for i, sd := range diff.Services {
		keys[i] = sd.Key
	}
	s.tracer.Received(cluster, keys, diff.Version, fromSpoke)
}

// Begin implements federation.Store. The catalog holds the cluster
// already (catalogFirst); the leader records what the replicas hold of it
// (coordinator.keepCatalog).
func (s *state) Begin(ctx context.Context, sess federation.Session) (federation.Held, error) {
	var held federation.Held
	var beginErr error
	err := s.do(ctx, func() {
		if max := s.maxEpoch[sess.Cluster]; sess.Epoch < max {
			beginErr = fmt.Errorf("%w: session of epoch %d, newest is %d", federation.ErrSuperseded, sess.Epoch, max)
			return
		}
		s.maxEpoch[sess.Cluster] = sess.Epoch
		s.session[sess.Cluster] = sess.Epoch
		c := s.cluster(sess.Cluster)
		c.Connected, c.Network, c.SpokeID, c.Build, c.Remote = true, sess.Network, sess.SpokeID, sess.Build, sess.RemoteIP
		c.SessionStart, c.LastSeen = sess.Started, s.liveness.now()
		held = federation.Held{Epoch: c.Epoch, Version: c.Version, Digest: s.reg.ClusterDigest(sess.Cluster)}
		if sess.GatewaysKnown {
			c.Gateways = sess.Gateways
		}
		// Peers learn a new network or gateways with the cluster's data (a
		// full state at the same stamp when that is all that changed).
		s.replicaChanged(sess.Cluster)
		if sess.Resumes(held) {
			// The live spoke confirms what the hub holds: this replica now
			// speaks for it. Re-stamped with the session's epoch, the data
			// reaches every peer as newer than anything an older session (at
			// a home that has not noticed it lost the spoke) may still send.
			// Its data is the spoke's current state as of now: the cluster
			// counts as held (an import set needs every cluster held to be
			// authoritative, and a resumed session sends no update).
			c.Epoch, c.Restored, c.Origin, c.LastUpdate = sess.Epoch, false, s.self, s.liveness.now()
			s.replicaChanged(sess.Cluster)
		}
		s.checkLiveness(s.liveness.now())
		s.publish(registry.Diff{})
	})
	return held, errors.Join(err, beginErr)
}

// growing names the upserts that add a service or endpoints to what the cluster holds.
func growing(held registry.ClusterView, upserts []*registry.Shard) []registry.ServiceKey {
	var out []registry.ServiceKey
	for _, sh := range upserts {
		if old, ok := held.Get(sh.Service); !ok || len(sh.Endpoints) > len(old.Endpoints) {
			out = append(out, sh.Service)
		}
	}
	return out
}

// End implements federation.Store.
func (s *state) End(sess federation.Session) {
	_ = s.do(context.Background(), func() {
		// A session whose Begin failed left nothing, and must leave nothing
		// (an empty cluster would hold the import set non-authoritative).
		if s.session[sess.Cluster] == sess.Epoch {
			c := s.cluster(sess.Cluster)
			// Only the newest local session speaks for the cluster's liveness:
			// its spoke was live until now.
			delete(s.session, sess.Cluster)
			now := s.liveness.now()
			c.Connected, c.LastSeen, c.LiveAt, c.liveSeen = false, now, now, true
			s.checkLiveness(now)
			s.publish(registry.Diff{})
		}
	})
}

// known adds catalog entries of clusters this hub has not seen a session
// of, with when a live spoke last served them (their drop timer goes on
// from then; see state.started for the grace before they turn stale).
func (s *state) known(ctx context.Context, records []replicas.ClusterRecord) error {
	return s.do(ctx, func() {
		for _, r := range records {
			if _, ok := s.clusters[r.Cluster]; ok {
				continue
			}
			c := s.cluster(r.Cluster)
			c.Network, c.SpokeID, c.Build, c.LastSeen, c.LiveAt = r.Network, r.SpokeID, r.Build, r.LastSeen, r.LiveAt
		}
		s.publish(registry.Diff{})
	})
}

// adoptLiveAt takes the catalog's LiveAt of each cluster that this replica
// has not seen live, and that it knows no earlier time for: the leader's
// drop timers then go on from what the previous leaders saw, even when this
// replica could not read the catalog at start.
func (s *state) adoptLiveAt(ctx context.Context, records []replicas.ClusterRecord) error {
	return s.do(ctx, func() {
		for _, r := range records {
			c := s.clusters[r.Cluster]
			if c == nil || c.liveSeen || c.Home != "" || r.LiveAt.IsZero() || !r.LiveAt.Before(c.LiveAt) {
				continue
			}
			s.log.Info("cluster last live earlier than this replica knew, says the catalog", "cluster", r.Cluster, "liveAt", r.LiveAt)
			c.LiveAt = r.LiveAt
		}
		s.checkLiveness(s.liveness.now())
	})
}

// Conflicts implements federation.Store. It never waits for the state
// goroutine: only a lock held for map accesses.
func (s *state) Conflicts(id registry.ClusterID) (federation.Conflicts, <-chan struct{}) {
	s.conflictsMu.Lock()
	defer s.conflictsMu.Unlock()
	e := s.conflicts[id]
	if e == nil {
		// A cluster without conflicts gets an entry too: its channel is what
		// tells the session about the first one.
		e = &clusterConflicts{changed: make(chan struct{})}
		s.conflicts[id] = e
	}
	return e.set, e.changed
}

// trackConflicts updates the conflict sets of the clusters concerned by the
// services that changed from prev to s.reg: those in a conflict before or
// after, winner or loser, so an update of one cluster also tells the other
// cluster of a conflict it created or resolved. Each set that changed is
// replaced at once, waking the sessions that watch it. Called by run's goroutine.
func (s *state) trackConflicts(prev *registry.Registry, d registry.Diff) {
	var changed map[registry.ClusterID]federation.Conflicts // copies of the sets that change
	for _, sd := range d.Services {
		before, after := prev.Service(sd.Key), s.reg.Service(sd.Key)
		if (before == nil || len(before.Conflicts) == 0) && (after == nil || len(after.Conflicts) == 0) {
			continue
		}
		texts := federation.ExplainConflicts(after)
		concerned := map[registry.ClusterID]bool{}
		for _, svc := range []*registry.Service{before, after} {
			if svc != nil {
				for _, c := range svc.Conflicts {
					concerned[c.Winner], concerned[c.Loser] = true, true
				}
			}
		}
		for id := range concerned {
			set, ok := changed[id]
			if !ok {
				set = s.conflictSet(id)
			}
			if slices.Equal(set[sd.Key], texts[id]) {
				continue
			}
			if !ok {
				set = maps.Clone(set)
				if set == nil {
					set = federation.Conflicts{}
				}
				if changed == nil {
					changed = map[registry.ClusterID]federation.Conflicts{}
				}
				changed[id] = set
			}
			if len(texts[id]) == 0 {
				delete(set, sd.Key)
			} else {
				set[sd.Key] = texts[id]
			}
		}
	}
	if len(changed) == 0 {
		return
	}
	s.conflictsMu.Lock()
	defer s.conflictsMu.Unlock()
	for id, set := range changed {
		if old := s.conflicts[id]; old != nil {
			close(old.changed)
		}
		s.conflicts[id] = &clusterConflicts{set: set, changed: make(chan struct{})}
		s.log.Debug("conflicts changed", "cluster", id, "services", len(set))
	}
}

// conflictSet returns the cluster's published conflict set (not to be modified).
func (s *state) conflictSet(id registry.ClusterID) federation.Conflicts {
	s.conflictsMu.Lock()
	defer s.conflictsMu.Unlock()
	if e := s.conflicts[id]; e != nil {
		return e.set
	}
	return nil
}

var _ federation.Store = (*state)(nil)

// clustersSorted returns the view's clusters in ID order.
func (v *View) clustersSorted() []ClusterStatus {
	ids := slices.Sorted(maps.Keys(v.Clusters))
	out := make([]ClusterStatus, 0, len(ids))
	for _, id := range ids {
		out = append(out, v.Clusters[id])
	}
	return out
}
