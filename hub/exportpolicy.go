package hub

import (
	"context"
	"maps"
	"slices"

	"github.com/navemesh/nave/exportpolicy"
	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// loadExportPolicy reads --export-policy, when set: which clusters may
// export into which namespaces (without it, every cluster everywhere).
func (p *parts) loadExportPolicy() (err error) {
	if p.cfg.ExportPolicyFile == "" {
		return nil
	}
	p.exportPolicy, err = exportpolicy.Open(p.cfg.ExportPolicyFile)
	return err
}

// exportAllowed is the export policy's word on an export (nil: no policy).
func (p *parts) exportAllowed() func(registry.ClusterID, string) bool {
	if p.exportPolicy == nil {
		return nil
	}
	return func(c registry.ClusterID, ns string) bool { return p.exportPolicy.Policy().Allows(c, ns) }
}

// watchExportPolicy reads the export policy file again once a second. When
// it changed, the state drops what the new policy refuses (at once, whatever
// the spokes do), and the sessions of the clusters whose grant changed are
// asked for a full state: their spokes stop sending what is refused now and
// send again what they were refused before.
func (p *parts) watchExportPolicy(ctx context.Context) {
	log := p.log.With("component", "export-policy")
	prev := p.exportPolicy.Policy()
	pending := false // a policy read that the state could not apply yet: tried again at the next tick
	reload := func() (bool, error) {
		changed, err := p.exportPolicy.Reload()
		if changed {
			now := p.exportPolicy.Policy()
			log.Info("reloaded the export policy", "rules", len(now.Rules))
			p.hubFed.Resync(func(c registry.ClusterID) bool { return !prev.Same(now, c) }, "the hub's export policy changed")
			prev, pending = now, true
		}
		if pending {
			if err := p.state.enforceExportPolicy(ctx); err != nil {
				log.Warn("cannot apply the export policy to the state yet", "err", err)
			} else {
				pending = false
			}
		}
		return changed, err
	}
	identity.Watch(ctx, log, credentialsReload, nil, reload)
}

// permitted is ch without what the export policy refuses: a refused upsert
// becomes a remove (no form of it is held), a refused retain goes. Called
// by run's goroutine on every change a peer or a snapshot brings.
func (s *state) permitted(ch registry.Change) registry.Change {
	if s.exportAllowed == nil {
		return ch
	}
	allowed := func(k registry.ServiceKey) bool { return s.exportAllowed(ch.Cluster, k.Namespace) }
	out := ch
	out.Upserts, out.Removes = nil, slices.Clone(ch.Removes)
	for _, sh := range ch.Upserts {
		if allowed(sh.Service) {
			out.Upserts = append(out.Upserts, sh)
		} else if !ch.Replace {
			out.Removes = append(out.Removes, sh.Service)
		}
	}
	out.Retain = slices.DeleteFunc(slices.Clone(ch.Retain), func(k registry.ServiceKey) bool { return !allowed(k) })
	if len(out.Upserts) != len(ch.Upserts) {
		s.log.Warn("left out exports the export policy refuses", "cluster", ch.Cluster, "refused", len(ch.Upserts)-len(out.Upserts))
	}
	return out
}

// enforceExportPolicy removes every held export the export policy refuses,
// from every cluster. Each cluster keeps its stamp: its spoke learns of the
// change by the resync the hub asks for (or, at the latest, by its next
// digest), and every peer replica, which reads the same policy file, makes
// the same change.
func (s *state) enforceExportPolicy(ctx context.Context) error {
	return s.do(ctx, func() {
		if s.exportAllowed == nil {
			return
		}
		changed := map[registry.ServiceKey]registry.ServiceDiff{}
		for _, id := range slices.Sorted(maps.Keys(s.clusters)) {
			var refused []registry.ServiceKey
			for k := range s.reg.ClusterView(id).All() {
				if !s.exportAllowed(id, k.Namespace) {
					refused = append(refused, k)
				}
			}
			if len(refused) == 0 {
				continue
			}
			c := s.clusters[id]
			diff, _, err := s.commit(registry.Change{Cluster: id, Removes: refused}, replicas.Stamp{Epoch: c.Epoch, Version: c.Version},
				func(c *ClusterStatus) { c.LastUpdate = s.liveness.now() })
			if err != nil {
				s.log.Error("cannot remove the exports the export policy refuses", "cluster", id, "err", err) // removing is over no limit: not reached
				continue
			}
			s.log.Warn("removed exports the export policy now refuses", "cluster", id, "services", len(refused))
			mergeDiff(changed, diff)
		}
		if len(changed) > 0 {
			s.publishMerged(changed)
		}
	})
}
