package xds

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/registry"
)

// HealthStatus is what an endpoint tells a client, named as xDS names it.
type HealthStatus = string

// The health statuses Nave hands out. Excluded endpoints are never sent.
const (
	StatusHealthy  HealthStatus = "HEALTHY"
	StatusDraining HealthStatus = "DRAINING"
)

// An assignment in plain data is the admin API's JSON, the same types
// (adminapi), so that the hub serves it without converting it.
type (
	// Assignment is the endpoint assignment of one service port as seen by
	// clients of one locality group: the plain-data form of a
	// ClusterLoadAssignment, shown by the hub's admin API and navectl.
	// Shadowed endpoints are left out because grpc-go rejects an assignment
	// that repeats an address.
	Assignment = adminapi.Assignment
	// Priority is one failover tier.
	Priority = adminapi.Priority
	// LocalityEndpoints are the endpoints of one locality within a priority.
	LocalityEndpoints = adminapi.LocalityEndpoints
	// Endpoint is one address:port handed to clients.
	Endpoint = adminapi.Endpoint
	// UnreachableNetwork is a network whose healthy endpoints a client
	// cannot be handed: the network has no gateway that can be dialled.
	UnreachableNetwork = adminapi.UnreachableNetwork
)

// Priority tiers, before empty ones are skipped.
const (
	tierSameZone = iota
	tierSameRegion
	tierElsewhere
	tierCount
)

// Assign computes the endpoint assignment of svc's port for clients in the
// client locality (only its region and zone matter):
//
//   - priority 0 holds the endpoints in the client's region and zone, 1 the rest
//     of its region, 2 everything else; empty tiers are skipped so priorities
//     stay contiguous from 0 (grpc-go NACKs an assignment without priority 0).
//     A client without locality gets every endpoint at priority 0.
//   - endpoints are grouped per endpoint locality; a locality's weight is its
//     number of healthy endpoints.
//   - a locality without any healthy endpoint is left out entirely (and listed in
//     Skipped): grpc-go ignores a locality of weight 0, and a priority made only of
//     DRAINING endpoints would take the traffic and send it nowhere, so failover
//     to the next tier is what clients need. Draining endpoints of a locality that
//     still has healthy ones are kept, as DRAINING, so Envoy can finish their work.
//
// Everything is sorted: localities by region/zone/subzone, endpoints by
// cluster, address, port. Assign is pure and safe for concurrent use.
func Assign(svc *registry.Service, port registry.ServicePort, client registry.Locality) Assignment {
	return groupByLocality(svc, port, nil).assign(client)
}

// AssignFor is Assign for a client that may name its network, against the
// network topology nets (see the split-horizon rules in networks.go): a
// client without a network gets what Assign gives.
func AssignFor(svc *registry.Service, port registry.ServicePort, client Client, nets registry.Networks) Assignment {
	if client.Network == "" {
		return groupByLocality(svc, port, nil).assign(client.Locality)
	}
	t := newTopology(nets)
	return groupByLocality(svc, port, t).assignSplit(client, t)
}

// assignSplit is the assignment of a client with a network.
func (l localities) assignSplit(client Client, t *topology) Assignment {
	a := Assignment{Service: l.service, Port: l.port, ClusterName: ClusterName(l.service, l.port), Client: client.Locality,
		Network: client.Network, Skipped: l.skipped, Shadowed: l.shadowed}
	counts := make([][]networkCount, len(l.served))
	for i, le := range l.served {
		counts[i] = countByNetwork(le.Endpoints, t)
	}
	plan := planSplit(client, l.servedLocalities(), counts, t)
	defer plan.release()
	a.Unreachable = plan.unreachable
	for p := range plan.count {
		var in []LocalityEndpoints
		for i, le := range l.served {
			if plan.prio[i] != p {
				continue
			}
			if lp := plan.localities[i]; lp.weight > 0 {
				out := LocalityEndpoints{Locality: le.Locality, Weight: lp.weight}
				for _, e := range le.Endpoints {
					if reachesDirectly(client.Network, t.networkOf(e.Cluster)) {
						out.Endpoints = append(out.Endpoints, e)
					}
				}
				if len(out.Endpoints) < len(le.Endpoints) {
					// As the fast path lays out part of a locality: by network, then in endpoint order.
					slices.SortStableFunc(out.Endpoints, func(x, y Endpoint) int {
						return cmp.Compare(t.networkOf(x.Cluster), t.networkOf(y.Cluster))
					})
				}
				in = append(in, out)
			}
			for _, g := range plan.gateways {
				if g.anchor != i {
					continue
				}
				out := LocalityEndpoints{Locality: g.locality, Weight: g.weight}
				for _, e := range g.gateways {
					out.Endpoints = append(out.Endpoints, Endpoint{Address: e.addr.Addr(), Port: int32(e.addr.Port()),
						Health: StatusHealthy, Weight: e.weight, Gateway: e.network})
				}
				in = append(in, out)
			}
		}
		a.Priorities = append(a.Priorities, Priority{Priority: p, Localities: in})
	}
	return a
}

// countByNetwork counts a locality's endpoints per network, sorted by network.
func countByNetwork(eps []Endpoint, t *topology) []networkCount {
	var out []networkCount
	for _, e := range eps {
		n := t.networkOf(e.Cluster)
		i, found := slices.BinarySearchFunc(out, n, func(c networkCount, n registry.Network) int { return cmp.Compare(c.network, n) })
		if !found {
			out = slices.Insert(out, i, networkCount{network: n})
		}
		out[i].all++
		if e.Health == StatusHealthy {
			out[i].healthy++
		}
	}
	return out
}

// localities is the part of a service port's assignment that does not depend
// on the client: its endpoints grouped by locality. Every locality group's
// assignment orders the same localities into its own priorities.
type localities struct {
	service registry.ServiceKey
	port    int32
	// served are the localities with at least one healthy endpoint, sorted.
	served   []LocalityEndpoints
	skipped  []registry.Locality
	shadowed []Endpoint
}

// groupByLocality groups the endpoints of svc's port by locality. An
// address:port named twice is handed out once (see unique): across the whole
// registry when t is nil, what a client without a network sees; within each
// network otherwise, what clients on a network see (two networks may use the
// same pod addresses for different pods).
func groupByLocality(svc *registry.Service, port registry.ServicePort, t *topology) localities {
	return groupEndpoints(svc.Key, port, svc.Endpoints(port), t)
}

// groupEndpoints is groupByLocality over the port's endpoints eps.
func groupEndpoints(k registry.ServiceKey, port registry.ServicePort, eps []registry.PortEndpoint, t *topology) localities {
	l := localities{service: k, port: port.Port}
	byLocality := map[registry.Locality]*LocalityEndpoints{}
	for _, pe := range l.unique(eps, t) {
		le := byLocality[pe.Locality]
		if le == nil {
			le = &LocalityEndpoints{Locality: pe.Locality}
			byLocality[pe.Locality] = le
		}
		status := StatusDraining
		if pe.Health == registry.Healthy {
			status = StatusHealthy
			le.Weight++
		}
		le.Endpoints = append(le.Endpoints, Endpoint{Cluster: pe.Cluster, Address: pe.Address, Port: pe.Port, Health: status, Weight: 1})
	}
	for loc, le := range byLocality {
		if le.Weight == 0 {
			l.skipped = append(l.skipped, loc)
			continue
		}
		slices.SortFunc(le.Endpoints, compareEndpoints)
		l.served = append(l.served, *le)
	}
	slices.SortFunc(l.served, func(x, y LocalityEndpoints) int { return x.Locality.Compare(y.Locality) })
	slices.SortFunc(l.skipped, registry.Locality.Compare)
	return l
}

// priorities returns the priority of each of the served localities (sorted)
// for clients of the client's group, and how many priorities there are:
// tiers in order, empty ones skipped.
func priorities(client registry.Locality, served []registry.Locality) (prio []uint32, count uint32) {
	var used [tierCount]bool
	tiers := make([]int, len(served))
	for i, l := range served {
		tiers[i] = tier(client, l)
		used[tiers[i]] = true
	}
	var rank [tierCount]uint32
	for t := range tierCount {
		rank[t] = count
		if used[t] {
			count++
		}
	}
	prio = make([]uint32, len(tiers))
	for i, t := range tiers {
		prio[i] = rank[t]
	}
	return prio, count
}

// servedLocalities lists the localities of l.served.
func (l localities) servedLocalities() []registry.Locality {
	out := make([]registry.Locality, len(l.served))
	for i, le := range l.served {
		out[i] = le.Locality
	}
	return out
}

func (l localities) assign(client registry.Locality) Assignment {
	a := Assignment{Service: l.service, Port: l.port, ClusterName: ClusterName(l.service, l.port), Client: client,
		Skipped: l.skipped, Shadowed: l.shadowed}
	prio, count := priorities(client, l.servedLocalities())
	for p := range count {
		var in []LocalityEndpoints
		for i, le := range l.served {
			if prio[i] == p {
				in = append(in, le)
			}
		}
		a.Priorities = append(a.Priorities, Priority{Priority: p, Localities: in})
	}
	return a
}

// unique keeps one endpoint per address:port, recording the others in
// l.shadowed: the healthiest, then the first (eps come sorted by cluster, so
// the lowest cluster ID). With a topology, one per address:port and network,
// and an endpoint of a cluster without a network (reachable from every
// network) gives way to any network's endpoint of the same address.
func (l *localities) unique(eps []registry.PortEndpoint, t *topology) []registry.PortEndpoint {
	type key struct {
		network registry.Network
		addr    netip.AddrPort
	}
	at := make(map[key]int, len(eps))
	out := eps[:0:0]
	shadow := func(pe registry.PortEndpoint) {
		status := StatusDraining
		if pe.Health == registry.Healthy {
			status = StatusHealthy
		}
		l.shadowed = append(l.shadowed, Endpoint{Cluster: pe.Cluster, Address: pe.Address, Port: pe.Port, Health: status, Weight: 1})
	}
	networked := false
	for _, pe := range eps {
		k := key{network: t.networkOf(pe.Cluster), addr: netip.AddrPortFrom(pe.Address.Unmap(), uint16(pe.Port))}
		networked = networked || k.network != ""
		i, dup := at[k]
		switch {
		case !dup:
			at[k] = len(out)
			out = append(out, pe)
		case pe.Health < out[i].Health: // healthier wins
			shadow(out[i])
			out[i] = pe
		default:
			shadow(pe)
		}
	}
	if !networked {
		return out
	}
	taken := make(map[netip.AddrPort]bool, len(out))
	for k := range at {
		if k.network != "" {
			taken[k.addr] = true
		}
	}
	kept := out[:0]
	for _, pe := range out {
		if t.networkOf(pe.Cluster) == "" && taken[netip.AddrPortFrom(pe.Address.Unmap(), uint16(pe.Port))] {
			shadow(pe)
			continue
		}
		kept = append(kept, pe)
	}
	return kept
}

// overlapsAcrossNetworks reports whether two networks' endpoints of the
// port share an address:port: only then do clients on a network need an
// endpoint grouping of their own (see groupByLocality).
func overlapsAcrossNetworks(eps []registry.PortEndpoint, t *topology) bool {
	if t == nil || len(t.clusters) == 0 {
		return false
	}
	seen := make(map[netip.AddrPort]registry.Network, len(eps))
	for _, pe := range eps {
		a, n := netip.AddrPortFrom(pe.Address.Unmap(), uint16(pe.Port)), t.networkOf(pe.Cluster)
		if other, ok := seen[a]; ok && other != n {
			return true
		}
		seen[a] = n
	}
	return false
}

func tier(client, endpoint registry.Locality) int {
	switch {
	case client.IsZero():
		return tierSameZone
	case client.Region == endpoint.Region && client.Zone == endpoint.Zone:
		return tierSameZone
	case client.Region == endpoint.Region:
		return tierSameRegion
	default:
		return tierElsewhere
	}
}

func compareEndpoints(x, y Endpoint) int {
	return cmp.Or(cmp.Compare(x.Cluster, y.Cluster), x.Address.Compare(y.Address), cmp.Compare(x.Port, y.Port))
}

// groupOf is the locality group of a client locality: the region and zone
// that Assign looks at. Clients of one group share their assignments.
func groupOf(l registry.Locality) registry.Locality {
	return registry.Locality{Region: l.Region, Zone: l.Zone}
}
