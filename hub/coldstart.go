package hub

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/navemesh/nave/registry"
)

// A replica that starts without some of the clusters its catalog knows (no
// persisted snapshot, or one older than a cluster) would hand its first
// xDS clients a world in part: some clusters' endpoints and not others'.
// So it waits, up to Config.ColdStartWait, for those clusters to resync
// (from their spokes, or from peers) before it serves xDS. Clients connected
// elsewhere, or reconnecting, keep their last configuration meanwhile; the
// admin API's /readyz says what it waits for.
//
// That needs every cluster served (and not dropped since) to be in the
// catalog, even when the hub dies (SIGKILL, OOM) right after the cluster's
// first session: that session creates the cluster's record before it
// begins (catalogFirst), not the leader's next sync of the catalog, up to a
// second later.

// missingClusters are the clusters the catalog named at start that the
// state does not hold data of.
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

// serveXDSAfterColdStart serves xDS once every cluster of missing is held,
// or ColdStartWait has passed.
func (p *parts) serveXDSAfterColdStart(ctx context.Context, missing []registry.ClusterID) {
	p.log.Info("cold start: waiting for the clusters the catalog knows before serving xDS",
		"clusters", missing, "upTo", p.cfg.ColdStartWait)
	if !p.awaitCatalogClusters(ctx) {
		return
	}
	if err := p.push.caughtUp(ctx); err != nil {
		return
	}
	p.serveXDS()
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
		p.coldWaiting.Store(int64(len(left)))
		if len(left) == 0 {
			p.log.Info("cold start: every cluster resynced; serving xDS", "after", time.Since(start).Round(time.Millisecond))
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			p.log.Warn("cold start: serving xDS without clusters that did not resync in time", "missing", left, "waited", p.cfg.ColdStartWait)
			p.coldWaiting.Store(0)
			return true
		case <-tick.C:
		}
	}
}

// xdsReady is the admin API's readiness: xDS is served.
func (p *parts) xdsReady() error {
	if p.xdsServing.Load() {
		return nil
	}
	if n := p.coldWaiting.Load(); n > 0 {
		return fmt.Errorf("cold start: waiting for %d clusters the catalog knows to resync before serving xDS (up to %v)", n, p.cfg.ColdStartWait)
	}
	return fmt.Errorf("xDS is not served yet")
}
