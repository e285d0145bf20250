package xds

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/navemesh/nave/registry"
)

// Split-horizon EDS. Clusters on one network reach each other's endpoints
// directly; a client on another network reaches them only through one of the
// network's east-west gateways. So a client that names its network gets its
// own network's endpoints as they are (and those of clusters without a
// network, reachable from everywhere), and, for each other network, that
// network's gateway addresses in place of its endpoints. A client without a
// network gets every endpoint, as before networks existed.
//
// grpc-go refuses an assignment that names one address twice, so each gateway
// appears once: in the locality, among those where its network has healthy
// endpoints, that is nearest the client (the first in locality order among
// the nearest), with the weight of the healthy endpoints of that network at
// that distance, split between the network's gateways. Failover stays
// locality-aware: when a network's nearest endpoints fail, its gateway moves
// to the next tier where the network still has healthy endpoints. The
// gateway itself chooses among its network's endpoints.

// Node metadata keys a client uses to say where it is (Istio's names, so its
// proxies and bootstraps work unchanged).
const (
	MetadataNetwork = "NETWORK"
	MetadataCluster = "CLUSTER_ID"
)

// Client is whom an assignment is computed for: a locality group (region and
// zone) and a network. Clients that agree on both share their assignments.
type Client struct {
	Network  registry.Network  `json:"network,omitempty"`
	Locality registry.Locality `json:"locality"`
	// NetworkOnly: the client is handed its own network's endpoints (and
	// those of clusters without one) and nothing of other networks, not
	// even their gateways. An east-west gateway is such a client: traffic
	// it forwards must end in its network, never loop to another gateway.
	NetworkOnly bool `json:"networkOnly,omitempty"`
}

// clientOf is the Client a node belongs to: its locality group, and the
// network its metadata names (NETWORK), or else the network of the cluster
// it names (CLUSTER_ID).
func clientOf(node *core.Node, nets *topology) Client {
	l := node.GetLocality()
	c := Client{Locality: groupOf(registry.Locality{Region: l.GetRegion(), Zone: l.GetZone()})}
	fields := node.GetMetadata().GetFields()
	c.Network = registry.Network(fields[MetadataNetwork].GetStringValue())
	if c.Network == "" && nets != nil {
		c.Network = nets.clusters[registry.ClusterID(fields[MetadataCluster].GetStringValue())]
	}
	return c
}

// topology is the network view EDS is computed against: each cluster's
// network, and each network's gateways that can be handed to clients (IP
// addresses; a gateway known only by a DNS name the hub has not resolved is
// left out). Immutable.
type topology struct {
	clusters map[registry.ClusterID]registry.Network
	gateways map[registry.Network][]netip.AddrPort
}

func newTopology(n registry.Networks) *topology {
	t := &topology{clusters: maps.Clone(n.Clusters), gateways: map[registry.Network][]netip.AddrPort{}}
	if t.clusters == nil {
		t.clusters = map[registry.ClusterID]registry.Network{}
	}
	for network, gws := range n.Gateways {
		var addrs []netip.AddrPort
		for _, g := range gws {
			if ip, ok := g.IP(); ok {
				addrs = append(addrs, netip.AddrPortFrom(ip, uint16(g.Port)))
			}
		}
		slices.SortFunc(addrs, netip.AddrPort.Compare)
		if addrs = slices.Compact(addrs); len(addrs) > 0 {
			t.gateways[network] = addrs
		}
	}
	return t
}

// networkOf is the network of an endpoint of cluster c ("" when none is known).
func (t *topology) networkOf(c registry.ClusterID) registry.Network {
	if t == nil {
		return ""
	}
	return t.clusters[c]
}

// UnreachableNetwork is a network whose healthy endpoints a client cannot be
// handed: the network has no gateway that can be dialled.
type UnreachableNetwork struct {
	Network registry.Network `json:"network"`
	// Endpoints is how many healthy endpoints it holds for the service port.
	Endpoints uint32 `json:"endpoints"`
}

// networkCount is how many endpoints of one network a locality holds.
type networkCount struct {
	network registry.Network
	healthy uint32
	all     uint32
}

// localityPlan is what one served locality contributes to a client's assignment.
type localityPlan struct {
	direct   bool // its endpoints on the client's network (or on none) are included
	gateways []gatewayEntry
	weight   uint32 // healthy direct endpoints plus the gateways' weights; 0: left out
}

// gatewayEntry is a gateway handed out in place of its network's endpoints.
type gatewayEntry struct {
	network registry.Network
	addr    netip.AddrPort
	weight  uint32
}

// splitPlan is a client's assignment of one service port, in outline: per
// served locality (in their order), what it contributes, and its priority.
type splitPlan struct {
	localities  []localityPlan
	prio        []uint32 // per locality; meaningful where weight > 0
	count       uint32   // priorities used
	unreachable []UnreachableNetwork
}

// reachesDirectly reports whether a client on network client reaches an
// endpoint on network n without a gateway.
func reachesDirectly(client, n registry.Network) bool { return n == "" || n == client }

// planSplit outlines the assignment of a client with a network: locality
// i of localities holds counts[i] (sorted by network).
func planSplit(client Client, localities []registry.Locality, counts [][]networkCount, t *topology) splitPlan {
	p := splitPlan{localities: make([]localityPlan, len(localities))}
	tiers := make([]int, len(localities))
	for i, l := range localities {
		tiers[i] = tier(client.Locality, l)
	}
	// The remote networks and where each has healthy endpoints.
	remote := map[registry.Network][]int{}
	for i, cs := range counts {
		for _, c := range cs {
			if reachesDirectly(client.Network, c.network) {
				if c.all > 0 {
					p.localities[i].direct = true
				}
				p.localities[i].weight += c.healthy
			} else if c.healthy > 0 && !client.NetworkOnly {
				remote[c.network] = append(remote[c.network], i)
			}
		}
	}
	placed := map[netip.AddrPort][2]int{} // gateway -> locality, entry
	for _, network := range slices.Sorted(maps.Keys(remote)) {
		at := remote[network]
		healthy := func(i int) uint32 {
			for _, c := range counts[i] {
				if c.network == network {
					return c.healthy
				}
			}
			return 0
		}
		gws := t.gateways[network]
		if len(gws) == 0 {
			var n uint32
			for _, i := range at {
				n += healthy(i)
			}
			p.unreachable = append(p.unreachable, UnreachableNetwork{Network: network, Endpoints: n})
			continue
		}
		best := slices.MinFunc(at, func(x, y int) int { return cmp.Or(cmp.Compare(tiers[x], tiers[y]), cmp.Compare(x, y)) })
		var behind uint32
		for _, i := range at {
			if tiers[i] == tiers[best] {
				behind += healthy(i)
			}
		}
		share := (behind + uint32(len(gws)) - 1) / uint32(len(gws)) // >= 1: behind >= 1
		for _, gw := range gws {
			if where, ok := placed[gw]; ok {
				// One gateway serving several networks: one entry, their weights summed.
				p.localities[where[0]].gateways[where[1]].weight += share
				p.localities[where[0]].weight += share
				continue
			}
			lp := &p.localities[best]
			placed[gw] = [2]int{best, len(lp.gateways)}
			lp.gateways = append(lp.gateways, gatewayEntry{network: network, addr: gw, weight: share})
			lp.weight += share
		}
	}
	// Priorities: the tiers that still hold a locality, contiguous from 0.
	var used [tierCount]bool
	for i, lp := range p.localities {
		if lp.weight > 0 {
			used[tiers[i]] = true
		}
	}
	var rank [tierCount]uint32
	for t := range tierCount {
		rank[t] = p.count
		if used[t] {
			p.count++
		}
	}
	p.prio = make([]uint32, len(localities))
	for i := range localities {
		p.prio[i] = rank[tiers[i]]
	}
	return p
}
