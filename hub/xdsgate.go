package hub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/navemesh/nave/registry"
)

// xDS is served only once the hub holds the whole world it knows of: a
// client connecting to a replica that serves less would be told that the
// services it holds are gone, and fail its RPCs. So a replica that starts
// withholds xDS (and says not ready) until
//
//  1. it has read the cluster catalog: with etcd unreachable it knows
//     neither which clusters exist nor their last persisted state, and an
//     empty registry is the worst world to serve;
//  2. etcd has answered the restore of the persisted snapshot (with one,
//     with none, or with one it cannot read);
//  3. it holds every cluster the catalog names (from the snapshot, its
//     spokes or its peers), or Config.ColdStartWait has passed (a cold
//     start: no snapshot of some clusters).
//
// Clients connected elsewhere, or reconnecting, keep their last
// configuration meanwhile. /readyz's body and nave_hub_xds_withheld say
// what it waits for.
//
// Step 3 needs every cluster served (and not dropped since) to be in the
// catalog, even when the hub dies (SIGKILL, OOM) right after the cluster's
// first session: that session creates the cluster's record before it
// begins (catalogFirst), not the leader's next sync of the catalog, up to a
// second later.

// Why xDS is withheld: the values of nave_hub_xds_withheld's reason label.
const (
	withheldCatalog  = "catalog"
	withheldSnapshot = "snapshot"
	withheldClusters = "clusters"
)

var withheldReasons = []string{withheldCatalog, withheldSnapshot, withheldClusters}

// catalogReadTimeout bounds one read of the catalog at start.
const catalogReadTimeout = 10 * time.Second

// catalogRetry is the wait between reads of a catalog that could not be read.
const catalogRetry = 500 * time.Millisecond

// withhold records why xDS is not served (reason "": it is).
func (p *parts) withhold(reason, detail string) {
	if reason == "" {
		p.withheld.Store(nil)
	} else {
		p.withheld.Store(&detail)
	}
	for _, r := range withheldReasons {
		p.metrics.xdsWithheld.WithLabelValues(r).Set(b2f(r == reason))
	}
}

func catalogUnread(err error) string {
	return fmt.Sprintf("cannot read the cluster catalog from etcd (%v): xDS is not served until it can, rather than an empty or partial registry", err)
}

// serveXDSWhenWhole serves xDS once the catalog is read, the snapshot
// restored and every cluster the catalog names is held (or ColdStartWait
// has passed); it returns without serving when ctx ends first.
func (p *parts) serveXDSWhenWhole(ctx context.Context) {
	if !p.catalogKnown && !p.awaitCatalog(ctx) {
		return
	}
	if !p.awaitRestore(ctx) {
		return
	}
	if missing := p.missingClusters(); len(missing) > 0 && p.cfg.ColdStartWait > 0 {
		p.log.Info("cold start: waiting for the clusters the catalog knows before serving xDS",
			"clusters", missing, "upTo", p.cfg.ColdStartWait)
		if !p.awaitCatalogClusters(ctx) {
			return
		}
	}
	if err := p.push.caughtUp(ctx); err != nil {
		return
	}
	p.serveXDS()
}

// awaitCatalog reads the catalog until etcd answers, then tells the state
// and the importer which clusters it names; false when ctx ended first.
func (p *parts) awaitCatalog(ctx context.Context) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(catalogRetry):
		}
		listCtx, cancel := context.WithTimeout(ctx, catalogReadTimeout)
		records, err := p.catalog.List(listCtx)
		cancel()
		if err != nil {
			p.withhold(withheldCatalog, catalogUnread(err))
			continue
		}
		p.log.Info("read the cluster catalog", "clusters", len(records))
		p.catalog0, p.catalogKnown = records, true
		// The drop timers go on from what earlier leaders saw.
		if p.state.known(ctx, records) != nil || p.state.adoptLiveAt(ctx, records) != nil {
			return false
		}
		p.imports.catalogRead.Store(len(records) > 0)
		return true
	}
}

// awaitRestore waits until etcd has answered the restore of the persisted
// snapshot (restoreLater retries it); false when ctx ended first.
func (p *parts) awaitRestore(ctx context.Context) bool {
	select {
	case <-p.coord.restoredCh:
		return true
	default:
	}
	p.withhold(withheldSnapshot, "cannot load the persisted registry from etcd yet: xDS is not served until it can, rather than an older or partial registry")
	select {
	case <-p.coord.restoredCh:
		return true
	case <-ctx.Done():
		return false
	}
}

// missingClusters are the clusters the catalog named that the state does
// not hold data of.
func (p *parts) missingClusters() []registry.ClusterID {
	v := p.state.View()
	var out []registry.ClusterID
	for _, r := range p.catalog0 {
		if c, ok := v.Clusters[r.Cluster]; !ok || (c.Epoch == 0 && c.Version == 0) {
			out = append(out, r.Cluster)
		}
	}
	slices.Sort(out)
	return out
}

// awaitCatalogClusters waits until the state holds every cluster the
// catalog named, or ColdStartWait has passed (then it says which never
// came); false when ctx ended first.
func (p *parts) awaitCatalogClusters(ctx context.Context) bool {
	start := time.Now()
	deadline := time.NewTimer(p.cfg.ColdStartWait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		left := p.missingClusters()
		if len(left) == 0 {
			p.log.Info("cold start: every cluster resynced; serving xDS", "after", time.Since(start).Round(time.Millisecond))
			return true
		}
		p.withholdForClusters(left)
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			p.log.Warn("cold start: serving xDS without clusters that did not resync in time", "missing", left, "waited", p.cfg.ColdStartWait)
			return true
		case <-tick.C:
		}
	}
}

// withholdForClusters says xDS waits for the clusters left to resync.
func (p *parts) withholdForClusters(left []registry.ClusterID) {
	p.withhold(withheldClusters, fmt.Sprintf("cold start: waiting for %d clusters the catalog knows to resync before serving xDS (up to %v)", len(left), p.cfg.ColdStartWait))
}

// xdsReady is the admin API's readiness: xDS is served.
func (p *parts) xdsReady() error {
	if p.xdsServing.Load() {
		return nil
	}
	if why := p.withheld.Load(); why != nil {
		return errors.New(*why)
	}
	return errors.New("xDS is not served yet")
}
