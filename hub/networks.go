package hub

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// NetworksPublisher is a Publisher that also takes the network topology:
// each cluster's network and the gateways announced for each network.
type NetworksPublisher interface {
	SetNetworks(n registry.Networks)
}

// SetNetworks hands n to each publisher that takes it.
func (ps publishers) SetNetworks(n registry.Networks) {
	for _, p := range ps {
		if np, ok := p.(NetworksPublisher); ok {
			np.SetNetworks(n)
		}
	}
}

// networksOf is the network topology of the clusters: every cluster that
// names a network, and the union of the gateways the clusters of each
// network announced (a stale cluster's gateways are kept with its
// endpoints; a dropped cluster has none), a gateway known by a DNS name
// also by the addresses it resolved to.
func networksOf(clusters map[registry.ClusterID]*ClusterStatus, resolved map[string][]netip.Addr) registry.Networks {
	n := registry.Networks{Clusters: map[registry.ClusterID]registry.Network{}, Gateways: map[registry.Network][]registry.Gateway{}}
	for id, c := range clusters {
		if c.Network == "" {
			continue
		}
		n.Clusters[id] = c.Network
		n.Gateways[c.Network] = append(n.Gateways[c.Network], c.Gateways...)
		for _, g := range c.Gateways {
			for _, a := range resolved[g.Address] {
				n.Gateways[c.Network] = append(n.Gateways[c.Network], registry.Gateway{Address: a.String(), Port: g.Port})
			}
		}
	}
	for network, gws := range n.Gateways {
		if len(gws) == 0 {
			delete(n.Gateways, network)
			continue
		}
		slices.SortFunc(gws, registry.Gateway.Compare)
		n.Gateways[network] = slices.Compact(gws)
	}
	return n
}

// updateNetworks recomputes the topology and reports whether it changed
// (or was never computed). Called by run's goroutine, from publish.
func (s *state) updateNetworks() bool {
	n := networksOf(s.clusters, s.resolved)
	if s.networksKnown && n.Equal(s.networks) {
		return false
	}
	s.networks, s.networksKnown = n, true
	return true
}

// Networks lists every network the view's clusters name, sorted, as
// /debug/networks shows them.
func (v *View) Networks() []adminapi.NetworkStatus {
	byNet := map[registry.Network]*adminapi.NetworkStatus{}
	gws := map[registry.Network]map[registry.Gateway][]registry.ClusterID{}
	for _, id := range slices.Sorted(maps.Keys(v.Clusters)) {
		c := v.Clusters[id]
		if c.Network == "" {
			continue
		}
		ns := byNet[c.Network]
		if ns == nil {
			ns = &adminapi.NetworkStatus{Network: c.Network}
			byNet[c.Network], gws[c.Network] = ns, map[registry.Gateway][]registry.ClusterID{}
		}
		ns.Clusters = append(ns.Clusters, id)
		ns.Services += c.Services
		ns.Endpoints += c.Endpoints
		for _, g := range c.Gateways {
			gws[c.Network][g] = append(gws[c.Network][g], id)
		}
	}
	out := make([]adminapi.NetworkStatus, 0, len(byNet))
	for _, network := range slices.Sorted(maps.Keys(byNet)) {
		ns := byNet[network]
		for _, g := range slices.SortedFunc(maps.Keys(gws[network]), registry.Gateway.Compare) {
			gs := adminapi.GatewayStatus{Gateway: g, Clusters: gws[network][g]}
			_, gs.Usable = g.IP()
			for _, a := range v.resolved[g.Address] {
				gs.Resolved = append(gs.Resolved, a.String())
				gs.Usable = true
			}
			ns.Gateways = append(ns.Gateways, gs)
			ns.Reachable = ns.Reachable || gs.Usable
		}
		out = append(out, *ns)
	}
	return out
}

// SetGateways implements federation.Store.
func (s *state) SetGateways(ctx context.Context, id registry.ClusterID, epoch uint64, gws []registry.Gateway) error {
	var setErr error
	err := s.do(ctx, func() {
		if max := s.maxEpoch[id]; epoch < max {
			setErr = fmt.Errorf("%w: gateways of epoch %d, newest is %d", federation.ErrSuperseded, epoch, max)
			return
		}
		c := s.cluster(id)
		if slices.Equal(c.Gateways, gws) {
			return
		}
		c.Gateways = gws
		s.replicaChanged(id)
		s.publish(registry.Diff{})
	})
	return errors.Join(err, setErr)
}

// Gateways known by a DNS name (a cloud load balancer's) are handed to
// clients by address: the hub resolves their names and keeps the last
// answer while a lookup fails (fail-static), so a DNS outage never takes a
// network's gateway away.
const (
	gatewayNameTTL     = 30 * time.Second // how often a name is looked up again
	gatewayNameTimeout = 5 * time.Second
)

// resolvedName is what a gateway's DNS name last resolved to, and when.
type resolvedName struct {
	addrs []netip.Addr
	at    time.Time
}

// handOut is what of a lookup's addresses clients can be handed: unicast
// ones, unmapped, sorted, each once, at most registry.MaxResolvedAddresses
// (what a snapshot keeps of a name).
func handOut(addrs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a = a.Unmap(); registry.Unicast(a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	out = slices.Compact(out)
	return out[:min(len(out), registry.MaxResolvedAddresses)]
}

// resolvedOf is what the DNS names among gws resolved to, sorted by name:
// what a snapshot keeps of a cluster's gateways, so that a restarted hub
// hands them out at once, and still when DNS fails.
func resolvedOf(gws []registry.Gateway, resolved map[string][]netip.Addr) []registry.ResolvedName {
	var out []registry.ResolvedName
	for _, g := range gws {
		if _, ip := g.IP(); ip || len(resolved[g.Address]) == 0 ||
			slices.ContainsFunc(out, func(r registry.ResolvedName) bool { return r.Name == g.Address }) {
			continue
		}
		out = append(out, registry.ResolvedName{Name: g.Address, Addresses: resolved[g.Address]})
	}
	slices.SortFunc(out, func(a, b registry.ResolvedName) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// restoreResolved adds what a snapshot's clusters' gateway names resolved
// to, for the names still announced and not resolved since. Called by
// run's goroutine, after the snapshot's clusters are held.
func (s *state) restoreResolved(snap registry.Snapshot) {
	var m map[string][]netip.Addr
	names := map[string]bool{}
	for _, c := range s.clusters {
		for _, g := range c.Gateways {
			names[g.Address] = true
		}
	}
	for _, sc := range snap.Clusters {
		for _, r := range sc.Resolved {
			if _, ok := s.resolved[r.Name]; ok || !names[r.Name] {
				continue
			}
			if m == nil {
				m = maps.Clone(s.resolved) // views share the map: never written in place
				if m == nil {
					m = map[string][]netip.Addr{}
				}
			}
			m[r.Name] = r.Addresses
		}
	}
	if m != nil {
		s.resolved = m
	}
}

// gatewayNames returns the DNS names of the gateways the view's clusters announce.
func (v *View) gatewayNames() []string {
	var out []string
	for _, c := range v.Clusters {
		for _, g := range c.Gateways {
			if _, ip := g.IP(); !ip && !slices.Contains(out, g.Address) {
				out = append(out, g.Address)
			}
		}
	}
	slices.Sort(out)
	return out
}

// resolveGatewayNames looks up the gateways' DNS names until ctx ends: a
// new name within a second, a known one every ttl.
func (s *state) resolveGatewayNames(ctx context.Context, lookup func(context.Context, string) ([]netip.Addr, error), ttl time.Duration) {
	resolved := map[string]resolvedName{}
	tick := time.NewTicker(min(time.Second, ttl))
	defer tick.Stop()
	for {
		v := s.View()
		names := v.gatewayNames()
		changed := false
		for name := range resolved {
			if !slices.Contains(names, name) {
				delete(resolved, name)
				changed = true
			}
		}
		for _, name := range names {
			if r, ok := resolved[name]; ok && time.Since(r.at) < ttl {
				continue
			}
			lctx, cancel := context.WithTimeout(ctx, gatewayNameTimeout)
			addrs, err := lookup(lctx, name)
			cancel()
			r, ok := resolved[name]
			if !ok {
				r.addrs = v.resolved[name] // restored from a snapshot: kept while DNS fails
			}
			r.at = time.Now()
			if err != nil || len(addrs) == 0 {
				s.log.Warn("cannot resolve a gateway's name; keeping what it resolved to before", "name", name, "err", err, "kept", r.addrs)
			} else if addrs = handOut(addrs); len(addrs) == 0 {
				s.log.Warn("a gateway's name resolves to no address a client could be handed; keeping what it resolved to before", "name", name, "kept", r.addrs)
			} else {
				changed = changed || !slices.Equal(addrs, r.addrs)
				r.addrs = addrs
			}
			resolved[name] = r
		}
		if changed {
			m := make(map[string][]netip.Addr, len(resolved))
			for name, r := range resolved {
				if len(r.addrs) > 0 {
					m[name] = r.addrs
				}
			}
			_ = s.do(ctx, func() {
				// A snapshot restored meanwhile may have added names this
				// loop holds no answer for (not seen yet, or DNS failing since
				// it first looked): they stay until it has one.
				current := s.View().gatewayNames()
				for name, addrs := range s.resolved {
					if len(m[name]) == 0 && slices.Contains(current, name) {
						m[name] = addrs
					}
				}
				s.resolved = m
				s.publish(registry.Diff{})
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// replicaDigest is the digest replicas compare a cluster's data by: its
// shards' digest, and its network and gateways, which change without a new
// stamp (a spoke's announcement): a peer that missed them resyncs. Without
// either it is the shards' digest, as replicas that predate networks compute it.
func replicaDigest(shards registry.Hash, network registry.Network, gws []registry.Gateway) registry.Hash {
	if network == "" && len(gws) == 0 {
		return shards
	}
	h := sha256.New()
	h.Write(shards[:])
	fmt.Fprintf(h, "%q", network)
	for _, g := range gws {
		fmt.Fprintf(h, " %q", g.String())
	}
	var out registry.Hash
	copy(out[:], h.Sum(nil))
	return out
}
