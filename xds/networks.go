package xds

import (
	"maps"
	"net/netip"
	"slices"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/navemesh/nave/internal/xdstype"
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
// gateway itself chooses among its network's endpoints. A gateway in front of
// several networks goes where the nearest of them needs it, at that network's
// tier (see place): a farther network neither pulls it out of the client's
// zone nor adds its endpoints' weight there.

// Node metadata keys a client uses to say where it is (Istio's names, so its
// proxies and bootstraps work unchanged).
const (
	MetadataNetwork = xdstype.MetadataNetwork
	MetadataCluster = xdstype.MetadataCluster
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
	// Cluster is the cluster the client runs in (its node's CLUSTER_ID):
	// a route's Service backend is that cluster's endpoints of the service
	// (GEP-1748). "" (a client that does not say) is handed none of them.
	Cluster registry.ClusterID `json:"cluster,omitempty"`
}

// clientOf is the Client a node belongs to: its locality group, and the
// network its metadata names (NETWORK), or else the network of the cluster
// it names (CLUSTER_ID).
func clientOf(node *core.Node, nets *topology) Client {
	l := node.GetLocality()
	c := Client{Locality: groupOf(registry.Locality{Region: l.GetRegion(), Zone: l.GetZone()})}
	fields := node.GetMetadata().GetFields()
	c.Network = registry.Network(fields[MetadataNetwork].GetStringValue())
	c.Cluster = registry.ClusterID(fields[MetadataCluster].GetStringValue())
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
	gateways map[registry.Network][]gatewayAddr
}

// gatewayAddr is a gateway clients can be handed, and the wire form of its
// LbEndpoint's endpoint field.
type gatewayAddr struct {
	addr netip.AddrPort
	wire []byte
}

func newTopology(n registry.Networks) *topology {
	t := &topology{clusters: maps.Clone(n.Clusters), gateways: map[registry.Network][]gatewayAddr{}}
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
		for _, a := range slices.Compact(addrs) {
			t.gateways[network] = append(t.gateways[network], gatewayAddr{addr: a, wire: gatewayEndpointWire(a)})
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

// networkCount is how many endpoints of one network a locality holds.
type networkCount struct {
	network registry.Network
	healthy uint32
	all     uint32
}

// localityPlan is what one served locality contributes to a client's
// assignment: its endpoints on the client's network (or on none).
type localityPlan struct {
	direct bool   // it has such endpoints (healthy or draining)
	weight uint32 // how many of them are healthy; 0: left out
}

// gatewayLocality is where a remote network's gateways are handed out: a
// locality of its own, named after the served locality it stands in (the
// nearest where the network has healthy endpoints) with subzone
// "gateway/NETWORK". grpc-go ignores endpoint weights (round robin within a
// locality), so the share of traffic a network gets must be a locality weight.
type gatewayLocality struct {
	anchor   int // the served locality it stands in
	locality registry.Locality
	gateways []gatewayEntry
	weight   uint32 // the healthy endpoints it stands for (of every network merged into it)
}

// gatewayEntry is a gateway handed out in place of its network's endpoints.
type gatewayEntry struct {
	network registry.Network
	addr    netip.AddrPort
	wire    []byte // the endpoint field's wire form (see gatewayAddr)
	weight  uint32
}

// gatewaySubzone is the subzone of the locality in which a network's
// gateways are handed out (its region and zone are those of the network's
// nearest healthy endpoints).
func gatewaySubzone(n registry.Network) string { return "gateway/" + string(n) }

// splitPlan is a client's assignment of one service port, in outline: per
// served locality (in their order), what it contributes, and its priority;
// and the gateway localities, each after the locality it stands in.
type splitPlan struct {
	localities  []localityPlan
	prio        []uint32 // per served locality
	gateways    []gatewayLocality
	count       uint32 // priorities used
	unreachable []UnreachableNetwork
	// scratch space, kept between uses of a pooled plan
	tiers   []int8
	remote  []registry.Network
	nearest []remoteNearest
}

// remoteNearest is where another network's nearest healthy endpoints are: the
// first served locality at that tier, and how many the network has there.
type remoteNearest struct {
	network registry.Network
	anchor  int
	behind  uint32
}

// plans recycles plans: forClient runs for every client group on every
// change of a port's endpoints, and its plan is done with once it returns.
var plans = sync.Pool{New: func() any { return new(splitPlan) }}

// reachesDirectly reports whether a client on network client reaches an
// endpoint on network n without a gateway.
func reachesDirectly(client, n registry.Network) bool { return n == "" || n == client }

// planSplit outlines the assignment of a client with a network: locality
// i of localities holds counts[i] (sorted by network). It runs for every
// client group on every change of the port's endpoints, so it allocates
// little: no maps, one pass per remote network. Release the plan when done.
func planSplit(client Client, localities []registry.Locality, counts [][]networkCount, t *topology) *splitPlan {
	p := plans.Get().(*splitPlan)
	p.reset(len(localities))
	tiers, remote := p.tiers, p.remote[:0] // remote: the other networks with healthy endpoints, sorted
	defer func() { p.remote = remote }()
	for i, l := range localities {
		tiers[i] = int8(tier(client.Locality, l))
		for _, c := range counts[i] {
			if reachesDirectly(client.Network, c.network) {
				if c.all > 0 {
					p.localities[i].direct = true
				}
				p.localities[i].weight += c.healthy
			} else if c.healthy > 0 && !client.NetworkOnly {
				if at, found := slices.BinarySearch(remote, c.network); !found {
					remote = slices.Insert(remote, at, c.network)
				}
			}
		}
	}
	healthy := func(i int, network registry.Network) uint32 {
		for _, c := range counts[i] {
			if c.network == network {
				return c.healthy
			}
		}
		return 0
	}
	nearest := p.nearest[:0]
	defer func() { p.nearest = nearest }()
	for _, network := range remote {
		// The nearest tier where the network has healthy endpoints, its first
		// locality there, and how many endpoints the network has at that tier.
		best, behind := -1, uint32(0)
		for i := range localities {
			h := healthy(i, network)
			switch {
			case h == 0:
			case best < 0 || tiers[i] < tiers[best]:
				best, behind = i, h
			case tiers[i] == tiers[best]:
				behind += h
			}
		}
		if len(t.gateways[network]) == 0 {
			var n uint32
			for i := range localities {
				n += healthy(i, network)
			}
			p.unreachable = append(p.unreachable, UnreachableNetwork{Network: network, Endpoints: n})
			continue
		}
		nearest = append(nearest, remoteNearest{network: network, anchor: best, behind: behind})
	}
	// Nearest tier first, so that a gateway in front of several networks is
	// placed for the nearest of them (see place).
	for tr := range int8(tierCount) {
		for _, r := range nearest {
			if tiers[r.anchor] == tr {
				p.place(r.network, r.anchor, localities[r.anchor], t.gateways[r.network], r.behind)
			}
		}
	}
	// Priorities: the tiers that still hold a locality, contiguous from 0.
	var used [tierCount]bool
	for i, lp := range p.localities {
		if lp.weight > 0 {
			used[tiers[i]] = true
		}
	}
	for _, g := range p.gateways {
		used[tiers[g.anchor]] = true
	}
	var rank [tierCount]uint32
	for t := range tierCount {
		rank[t] = p.count
		if used[t] {
			p.count++
		}
	}
	for i := range localities {
		p.prio[i] = rank[tiers[i]]
	}
	return p
}

// place hands out a network's gateways, standing in for behind healthy
// endpoints at the served locality anchor. Networks are placed nearest tier
// first, and an assignment may name a gateway only once (grpc-go rejects an
// address twice, in any two localities, whatever their priorities), so a
// gateway in front of several networks (one address announced by each) goes
// where the nearest of them puts it:
//   - the gateways not yet handed out go into a gateway locality of the
//     network's own, at its own tier, with the weight of behind;
//   - if there are none, and one is in a gateway locality at this same tier
//     (another network's, equally near), that locality stands for both: its
//     weight, and that gateway's, grow by behind;
//   - otherwise each of them is already handed out nearer, for a nearer
//     network: they reach this network too, but its endpoints are farther
//     and add no weight there, nor may they pull the nearer network's
//     locality out to their tier.
func (p *splitPlan) place(network registry.Network, anchor int, at registry.Locality, gws []gatewayAddr, behind uint32) {
	g := gatewayLocality{anchor: anchor, weight: behind,
		locality: registry.Locality{Region: at.Region, Zone: at.Zone, Subzone: gatewaySubzone(network)}}
	same, entry := -1, -1 // a gateway of this network already handed out at this tier
	for _, gw := range gws {
		held, e := p.holding(gw.addr)
		switch {
		case held < 0:
			g.gateways = append(g.gateways, gatewayEntry{network: network, addr: gw.addr, wire: gw.wire})
		case same < 0 && p.tiers[p.gateways[held].anchor] == p.tiers[anchor]:
			same, entry = held, e
		}
	}
	switch {
	case len(g.gateways) > 0:
		share := (behind + uint32(len(g.gateways)) - 1) / uint32(len(g.gateways)) // >= 1: behind >= 1
		for i := range g.gateways {
			g.gateways[i].weight = share
		}
		p.gateways = append(p.gateways, g)
	case same >= 0:
		p.gateways[same].weight += behind
		p.gateways[same].gateways[entry].weight += behind
	}
}

// holding is the gateway locality (and its entry) that holds addr, or -1.
func (p *splitPlan) holding(addr netip.AddrPort) (int, int) {
	for i, g := range p.gateways {
		for j, e := range g.gateways {
			if e.addr == addr {
				return i, j
			}
		}
	}
	return -1, -1
}

// reset empties the plan for n served localities, keeping its memory.
func (p *splitPlan) reset(n int) {
	p.localities = slices.Grow(p.localities[:0], n)[:n]
	clear(p.localities)
	p.prio = slices.Grow(p.prio[:0], n)[:n]
	p.tiers = slices.Grow(p.tiers[:0], n)[:n]
	p.gateways = p.gateways[:0]
	p.count, p.unreachable = 0, nil
}

// release returns the plan to the pool; it must not be used afterwards.
func (p *splitPlan) release() { plans.Put(p) }
