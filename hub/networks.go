package hub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

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
// endpoints; a dropped cluster has none).
func networksOf(clusters map[registry.ClusterID]*ClusterStatus) registry.Networks {
	n := registry.Networks{Clusters: map[registry.ClusterID]registry.Network{}, Gateways: map[registry.Network][]registry.Gateway{}}
	for id, c := range clusters {
		if c.Network == "" {
			continue
		}
		n.Clusters[id] = c.Network
		n.Gateways[c.Network] = append(n.Gateways[c.Network], c.Gateways...)
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
	n := networksOf(s.clusters)
	if s.networksKnown && n.Equal(s.networks) {
		return false
	}
	s.networks, s.networksKnown = n, true
	return true
}

// NetworkStatus is the hub's view of one network, for operators.
type NetworkStatus struct {
	Network registry.Network `json:"network"`
	// Clusters are the clusters on the network.
	Clusters []registry.ClusterID `json:"clusters"`
	// Gateways are the gateways announced for it, with who announced each.
	Gateways []GatewayStatus `json:"gateways,omitempty"`
	// Reachable: another network's clients can be handed a gateway of this
	// one (an IP address). Without one, its endpoints reach only clients on
	// the network itself.
	Reachable bool `json:"reachable"`
	// Services and Endpoints count what the network's clusters export.
	Services  int `json:"services"`
	Endpoints int `json:"endpoints"`
}

// GatewayStatus is one announced gateway.
type GatewayStatus struct {
	registry.Gateway
	// Clusters announced it.
	Clusters []registry.ClusterID `json:"clusters"`
	// Usable: an IP address, handed to clients; a DNS name is shown but not
	// yet resolved by the hub.
	Usable bool `json:"usable"`
}

// Networks lists every network the view's clusters name, sorted.
func (v *View) Networks() []NetworkStatus {
	byNet := map[registry.Network]*NetworkStatus{}
	gws := map[registry.Network]map[registry.Gateway][]registry.ClusterID{}
	for _, id := range slices.Sorted(maps.Keys(v.Clusters)) {
		c := v.Clusters[id]
		if c.Network == "" {
			continue
		}
		ns := byNet[c.Network]
		if ns == nil {
			ns = &NetworkStatus{Network: c.Network}
			byNet[c.Network], gws[c.Network] = ns, map[registry.Gateway][]registry.ClusterID{}
		}
		ns.Clusters = append(ns.Clusters, id)
		ns.Services += c.Services
		ns.Endpoints += c.Endpoints
		for _, g := range c.Gateways {
			gws[c.Network][g] = append(gws[c.Network][g], id)
		}
	}
	out := make([]NetworkStatus, 0, len(byNet))
	for _, network := range slices.Sorted(maps.Keys(byNet)) {
		ns := byNet[network]
		for _, g := range slices.SortedFunc(maps.Keys(gws[network]), registry.Gateway.Compare) {
			_, usable := g.IP()
			ns.Gateways = append(ns.Gateways, GatewayStatus{Gateway: g, Clusters: gws[network][g], Usable: usable})
			ns.Reachable = ns.Reachable || usable
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
