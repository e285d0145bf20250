package hub

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/internal/pmap"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// importer keeps the clusterset's imports current for the spoke sessions
// (federation.ImportSource): it follows the state's views off the state
// goroutine, rebuilds the import of every service that changed or one of
// whose source clusters turned stale or fresh, claims clusterset IPs for
// ClusterSetIP services, and publishes an immutable set. Views that arrive
// while it works are merged into its next round.
type importer struct {
	ips *replicas.ClusterSetIPs // nil: imports carry no clusterset IPs
	log *slog.Logger
	// claimTimeout bounds one round of etcd calls for clusterset IPs.
	claimTimeout time.Duration
	// retry is how soon a service whose IP could not be claimed (or released) is tried again.
	retry time.Duration
	// Authority: the set is authoritative only once the catalog has been read
	// and every cluster it names is held, or, without a catalog (a new or
	// lost etcd), after grace (see authoritative).
	started     time.Time
	grace       time.Duration
	catalogRead atomic.Bool

	latest chan View // the newest view not yet taken (capacity 1)

	mu      sync.Mutex
	current *federation.ImportSet
	changed chan struct{} // closed when current is replaced
	// skipped are the endpoint addresses each import leaves out (loopback,
	// link-local, ...), replaced with current. Persistent, as the imports
	// are: a round changes what it rebuilt, not a copy of the whole.
	skipped pmap.Map[registry.ServiceKey, []imports.Skipped]

	// pending are the services changed since the last round, and pendingReg
	// the registry they changed in (Update); guarded by pendingMu.
	pendingMu  sync.Mutex
	pending    map[registry.ServiceKey]bool
	pendingReg *registry.Registry
	kick       chan struct{} // a change is pending

	// Owned by run's goroutine.
	reg       *registry.Registry
	rebuild   bool // a round panicked: the next one looks at every service again
	clusters  map[registry.ClusterID]ClusterStatus
	stale     map[registry.ClusterID]bool
	waiting   map[registry.ServiceKey]bool // ClusterSetIP services still without their IPs
	released  map[registry.ServiceKey]bool // services whose IPs are released (or never held)
	releasing map[registry.ServiceKey]bool // services whose IPs could not be released yet
}

// newImporter returns an importer; grace bounds how long a hub without a
// readable catalog waits for clusters before its set is authoritative.
func newImporter(ips *replicas.ClusterSetIPs, cidrs []string, grace time.Duration, log *slog.Logger) *importer {
	im := &importer{
		ips: ips, log: log.With("component", "imports"), claimTimeout: 5 * time.Second, retry: time.Second,
		started: time.Now(), grace: grace, releasing: map[registry.ServiceKey]bool{},
		latest: make(chan View, 1), kick: make(chan struct{}, 1), pending: map[registry.ServiceKey]bool{},
		current: federation.NewImportSet(federation.ImportMap{}, false, cidrs),
		changed: make(chan struct{}),
		reg:     registry.New(), stale: map[registry.ClusterID]bool{},
		waiting:  map[registry.ServiceKey]bool{},
		released: map[registry.ServiceKey]bool{},
	}
	return im
}

// Imports implements federation.ImportSource.
func (im *importer) Imports() (*federation.ImportSet, <-chan struct{}) {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.current, im.changed
}

// observe hands the importer a new view; it never blocks (the newest wins).
func (im *importer) observe(v View) {
	for {
		select {
		case im.latest <- v:
			return
		default:
		}
		select {
		case <-im.latest: // drop the older view not yet taken
		default:
		}
	}
}

// run rebuilds imports until ctx ends.
func (im *importer) run(ctx context.Context) {
	var retry <-chan time.Time
	settled := time.After(im.grace) // authority may change without any new view
	for {
		select {
		case <-ctx.Done():
			return
		case v := <-im.latest:
			im.safeRound(ctx, v)
		case <-im.kick:
			im.safeRound(ctx, View{})
		case <-retry:
			im.safeRound(ctx, View{})
		case <-settled:
			settled = nil
			im.safeRound(ctx, View{})
		}
		retry = nil
		if len(im.waiting) > 0 || len(im.releasing) > 0 || im.rebuild {
			retry = time.After(im.retry)
		}
	}
}

func (im *importer) safeRound(ctx context.Context, v View) {
	defer func() {
		if r := recover(); r != nil {
			im.log.Error("panic while building imports; the last set stays, and everything is rebuilt next round",
				"panic", r, "stack", string(debug.Stack()))
			im.rebuild = true // what the round had taken in is rebuilt, not forgotten
		}
	}()
	im.round(ctx, v)
}

// Update implements Publisher: it notes the services a change of the
// registry touched, for the next round (it never blocks).
func (im *importer) Update(r *registry.Registry, d registry.Diff) {
	im.pendingMu.Lock()
	im.pendingReg = r
	for _, sd := range d.Services {
		im.pending[sd.Key] = true
	}
	im.pendingMu.Unlock()
	select {
	case im.kick <- struct{}{}:
	default:
	}
}

// round rebuilds the imports of the services the registry changes since the
// last round touched, of those whose source clusters turned stale or fresh
// (the view says), and of those waiting for their clusterset IPs or for a
// release; a zero view brings no news of the clusters.
func (im *importer) round(ctx context.Context, v View) {
	if v.Registry != nil {
		im.clusters = v.Clusters
	}
	im.pendingMu.Lock()
	touched, reg := im.pending, im.pendingReg
	im.pending, im.pendingReg = map[registry.ServiceKey]bool{}, nil
	im.pendingMu.Unlock()
	if reg == nil {
		reg = im.reg
	}
	for k := range im.waiting {
		touched[k] = true
	}
	for k := range im.releasing {
		touched[k] = true
	}
	if im.rebuild { // after a panic, what the failed round had taken is looked at again: everything
		for svc := range reg.All() {
			touched[svc.Key] = true
		}
		for k := range im.current.Imports.Keys() {
			touched[k] = true
		}
		im.rebuild = false
	}
	stale := map[registry.ClusterID]bool{}
	for id, c := range im.clusters {
		if c.Stale {
			stale[id] = true
		}
	}
	if !maps.Equal(stale, im.stale) {
		for svc := range reg.All() {
			for _, sh := range svc.Shards {
				if stale[sh.Cluster] != im.stale[sh.Cluster] {
					touched[svc.Key] = true
					break
				}
			}
		}
	}
	im.reg, im.stale = reg, stale
	if len(touched) == 0 && im.authoritative() == im.current.Authoritative {
		return
	}
	// The next set is the current one with what this round rebuilt: a
	// round costs what it touched, and the set names what changed, so that
	// each spoke's session looks at that alone.
	next := im.current.Imports.Builder()
	var changed []registry.ServiceKey
	im.mu.Lock()
	skippedNext := im.skipped.Builder()
	im.mu.Unlock()
	claimCtx, cancel := context.WithTimeout(ctx, im.claimTimeout)
	defer cancel()
	isStale := func(id registry.ClusterID) bool { return im.stale[id] }
	for _, k := range slices.SortedFunc(maps.Keys(touched), registry.ServiceKey.Compare) {
		svc := im.reg.Service(k)
		if svc == nil {
			if _, had := next.Delete(k); had {
				changed = append(changed, k)
			}
			skippedNext.Delete(k)
			delete(im.waiting, k)
			im.release(claimCtx, k)
			continue
		}
		var ips []netip.Addr
		old, _ := next.Get(k) // what the set holds: the import last built
		if !svc.Headless && im.ips != nil && old != nil && !old.Headless &&
			sameFamilies(old.IPs, im.ips.Ranged(families(svc))) {
			ips = old.IPs // claimed when the service was first built
		} else if !svc.Headless && im.ips != nil {
			delete(im.releasing, k) // back before its release went through: the claim is taken back
			got, err := im.ips.Claim(claimCtx, k, families(svc))
			if err != nil {
				// Never an import without its IP: the derived Service's IP cannot change later.
				if !im.waiting[k] {
					im.log.Warn("cannot claim the clusterset IP; the import waits", "service", k, "err", err)
				}
				im.waiting[k] = true
				continue
			}
			ips = got
			delete(im.released, k)
			if old != nil && len(old.IPs) > 0 {
				// The service's families changed: the IPs of the families it left are released.
				if err := im.ips.Release(claimCtx, k, time.Now(), im.ips.Ranged(families(svc))...); err != nil {
					im.log.Warn("cannot release the clusterset IP of a family the service left", "service", k, "err", err)
				}
			}
		} else if svc.Headless {
			im.release(claimCtx, k)
		}
		delete(im.waiting, k)
		imp, skipped := imports.Build(svc, isStale, ips)
		if held, _ := skippedNext.Get(k); len(skipped) != len(held) {
			im.log.Info("endpoint addresses not imported (an API server refuses them)", "service", k, "addresses", len(skipped))
		}
		if len(skipped) > 0 {
			skippedNext.Set(k, skipped)
		} else {
			skippedNext.Delete(k)
		}
		if old == nil || !old.Equal(imp) {
			next.Set(k, imp)
			changed = append(changed, k)
		}
	}
	im.publish(im.current.Then(next.Map(), changed, im.authoritative()), skippedNext.Map())
}

// Skipped returns the addresses each import leaves out (not to be modified).
func (im *importer) Skipped() pmap.Map[registry.ServiceKey, []imports.Skipped] {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.skipped
}

// release marks a service's clusterset IPs released (once), so that the
// leader can free them after the hold-down.
func (im *importer) release(ctx context.Context, k registry.ServiceKey) {
	if im.ips == nil || im.released[k] {
		return
	}
	if err := im.ips.Release(ctx, k, time.Now()); err != nil {
		// Tried again every round: an unreleased claim would hold its IP forever.
		if !im.releasing[k] {
			im.log.Warn("cannot release the clusterset IP yet", "service", k, "err", err)
		}
		im.releasing[k] = true
		return
	}
	delete(im.releasing, k)
	im.released[k] = true
}

func (im *importer) publish(set *federation.ImportSet, skipped pmap.Map[registry.ServiceKey, []imports.Skipped]) {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.current, im.skipped = set, skipped
	close(im.changed)
	im.changed = make(chan struct{})
}

// families are the IP families a service's clusterset IPs are claimed in:
// the oldest export's, or IPv4 when no export states any.
func families(svc *registry.Service) []registry.IPFamily {
	if len(svc.IPFamilies) > 0 {
		return svc.IPFamilies
	}
	return []registry.IPFamily{registry.IPv4}
}

// sameFamilies says whether ips hold one address of each family, in order.
func sameFamilies(ips []netip.Addr, families []registry.IPFamily) bool {
	if len(ips) != len(families) {
		return false
	}
	for i, ip := range ips {
		if ip.Is4() != (families[i] == registry.IPv4) {
			return false
		}
	}
	return true
}

// authoritative says whether the set names every import there is, so that a
// spoke may delete what it does not name: no service waits for its
// clusterset IP, the hub knows which clusters there are (it read a catalog
// that names some, or, without one, grace has passed since the start) and
// it holds every one of them: each has data (live, or restored from the
// snapshot), was dropped, or went stale without any (its spoke did not come
// back within the grace). An empty or unread catalog is never trusted at
// once: a hub that lost its etcd must not tell every spoke to delete.
func (im *importer) authoritative() bool {
	if len(im.waiting) > 0 {
		return false
	}
	if !im.catalogRead.Load() && time.Since(im.started) < im.grace {
		return false
	}
	for _, c := range im.clusters {
		if !c.Restored && c.LastUpdate.IsZero() && !c.Dropped && !c.Stale {
			return false
		}
	}
	return true
}
