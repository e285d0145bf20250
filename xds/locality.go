package xds

import (
	"cmp"
	"slices"
	"strings"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// assigner hands each client its ClusterLoadAssignment of one Cluster (and
// a hash of it: equal sums, equal resources). Server.endpoints holds one
// per published Cluster.
type assigner interface {
	forClient(client Client, t *topology) (*endpoint.ClusterLoadAssignment, uint64)
}

// stageAll stages a's assignment of every group. Groups that differ only
// by their clients' cluster share one computation, unless a's assignment
// depends on the cluster (a Service backend, a failoverPriority naming
// nave.io/cluster): clients that name their cluster split groups that
// would otherwise be one, and must not multiply the cost of a change.
func stageAll(name string, a assigner, groups map[Client]*resourceCache, t *topology) {
	type computed struct {
		cla *endpoint.ClusterLoadAssignment
		sum uint64
	}
	var memo map[Client]computed
	blind := clusterBlind(a)
	for client, eds := range groups {
		if client.Cluster == "" || !blind {
			cla, sum := a.forClient(client, t)
			eds.stage(name, cla, sum)
			continue
		}
		key := client
		key.Cluster = ""
		c, ok := memo[key]
		if !ok {
			if memo == nil {
				memo = map[Client]computed{}
			}
			c.cla, c.sum = a.forClient(key, t)
			memo[key] = c
		}
		eds.stage(name, c.cla, c.sum)
	}
}

// clusterBlind reports whether a's assignments ignore the client's cluster.
func clusterBlind(a assigner) bool {
	switch a := a.(type) {
	case *localBackend:
		return false
	case *policyEndpoints:
		return !slices.Contains(a.policy.FailoverPriority, traffic.LabelCluster)
	}
	return true
}

// A service's TrafficPolicy may say how its clients prefer endpoints by
// where they are (traffic.LocalityPolicy), in place of Nave's default
// (the client's zone, then its region, then the rest):
//
//   - off: every endpoint at one priority, localities weighted by their
//     healthy endpoints;
//   - failoverPriority: an ordered list of labels (nave.io/cluster,
//     nave.io/network, topology.kubernetes.io/region and .../zone); an
//     endpoint's priority is how many leading labels it fails to share
//     with the client (all shared: priority 0), as Istio's failoverPriority;
//   - failover: the client's zone, its region, then the region named for
//     its region, then the rest;
//   - distribute: for a client whose locality matches an entry's from,
//     one priority in which each endpoint locality gets the share of the
//     entry's to pattern it matches (split among that pattern's localities
//     by their healthy endpoints); localities no pattern matches get none.
//
// These are computed per client from the default assignment (so split
// horizon and its gateways are as always), re-ranked: the assignment of a
// service with such a policy costs its endpoints once per locality group on
// each change, where the default shares per-locality blocks.

// localityPolicy is svc's locality policy, or nil for Nave's default.
func localityPolicy(svc *registry.Service) *traffic.LocalityPolicy {
	if p := svc.Traffic.Policy; p != nil && p.Locality != nil {
		l := p.Locality
		if l.Off || len(l.FailoverPriority) > 0 || len(l.Failover) > 0 || len(l.Distribute) > 0 {
			return l
		}
	}
	return nil // none, or one that says nothing: the default
}

// policyEndpoints is a service port's endpoints under a locality policy.
type policyEndpoints struct {
	name   string
	policy *traffic.LocalityPolicy
	plain  localities // what clients without a network are handed, before re-ranking
	split  localities // the same, deduplicated per network (see groupByLocality)
}

func newPolicyEndpoints(name string, svc *registry.Service, port registry.ServicePort, lp *traffic.LocalityPolicy, t *topology) *policyEndpoints {
	return &policyEndpoints{name: name, policy: lp, plain: groupByLocality(svc, port, nil), split: groupByLocality(svc, port, t)}
}

func (p *policyEndpoints) forClient(c Client, t *topology) (*endpoint.ClusterLoadAssignment, uint64) {
	var a Assignment
	if c.Network == "" {
		a = p.plain.assign(registry.Locality{}) // one priority: rerank ranks it
	} else {
		a = p.split.assignSplit(c, t)
	}
	a = rerank(a, c, t, p.policy)
	cla := ClusterLoadAssignment(a)
	cla.ClusterName = p.name
	return cla, contentSum(cla)
}

// rankedEntry is one locality's endpoints and the rank (priority, before
// renumbering) the policy gives them for the client.
type rankedEntry struct {
	rank int
	le   LocalityEndpoints
}

// rerank orders the assignment's localities into priorities by the
// policy, for client c.
func rerank(a Assignment, c Client, t *topology, lp *traffic.LocalityPolicy) Assignment {
	byCluster := slices.Contains(lp.FailoverPriority, traffic.LabelCluster) || slices.Contains(lp.FailoverPriority, traffic.LabelNetwork)
	var entries []rankedEntry
	for _, p := range a.Priorities {
		for _, le := range p.Localities {
			parts := []LocalityEndpoints{le}
			if byCluster && !isGatewayEntry(le) {
				parts = splitByCluster(le)
			}
			for _, part := range parts {
				entries = append(entries, rankedEntry{rank: rankOf(part, c, t, lp), le: part})
			}
		}
	}
	if len(lp.Distribute) > 0 {
		entries = distribute(entries, c, lp.Distribute)
	}
	a.Priorities = renumber(entries)
	return a
}

// isGatewayEntry: the locality holds a network's gateways (split horizon).
func isGatewayEntry(le LocalityEndpoints) bool {
	return len(le.Endpoints) > 0 && le.Endpoints[0].Gateway != ""
}

// splitByCluster splits a locality's endpoints by cluster, each part
// weighted by its healthy endpoints. A part with none (draining endpoints
// only) joins the first part that has some: grpc-go ignores a locality of
// weight 0, and the draining endpoints are kept, as the default keeps them
// beside healthy ones, for Envoy to finish their work.
func splitByCluster(le LocalityEndpoints) []LocalityEndpoints {
	var out []LocalityEndpoints
	for _, e := range le.Endpoints {
		i := slices.IndexFunc(out, func(p LocalityEndpoints) bool { return p.Endpoints[0].Cluster == e.Cluster })
		if i < 0 {
			out = append(out, LocalityEndpoints{Locality: le.Locality})
			i = len(out) - 1
		}
		out[i].Endpoints = append(out[i].Endpoints, e)
		if e.Health == StatusHealthy {
			out[i].Weight++
		}
	}
	if len(out) == 1 {
		out[0].Weight = le.Weight // as it was: split horizon may weigh it otherwise
		return out
	}
	healthy := slices.IndexFunc(out, func(p LocalityEndpoints) bool { return p.Weight > 0 })
	if healthy < 0 {
		return nil
	}
	for i := range out {
		if out[i].Weight == 0 {
			out[healthy].Endpoints = append(out[healthy].Endpoints, out[i].Endpoints...)
		}
	}
	slices.SortFunc(out[healthy].Endpoints, compareEndpoints)
	return slices.DeleteFunc(out, func(p LocalityEndpoints) bool { return p.Weight == 0 })
}

// rankOf is the rank the policy gives a locality's endpoints for client c.
func rankOf(le LocalityEndpoints, c Client, t *topology, lp *traffic.LocalityPolicy) int {
	switch {
	case lp.Off:
		return 0
	case len(lp.FailoverPriority) > 0:
		shared := 0
		for _, label := range lp.FailoverPriority {
			mine, theirs := labelOf(label, c, le, t)
			if mine == "" || mine != theirs {
				break
			}
			shared++
		}
		return len(lp.FailoverPriority) - shared
	case len(lp.Failover) > 0:
		if c.Locality.IsZero() {
			return 0
		}
		if r := tier(c.Locality, le.Locality); r != tierElsewhere {
			return r
		}
		for _, f := range lp.Failover {
			if f.From == c.Locality.Region && f.To == le.Locality.Region {
				return tierElsewhere
			}
		}
		return tierElsewhere + 1
	}
	return tier(c.Locality, le.Locality) // distribute, for a client no entry names
}

// labelOf is a label's value for the client and for the locality's endpoints.
func labelOf(label string, c Client, le LocalityEndpoints, t *topology) (client, endpoints string) {
	var cluster registry.ClusterID
	var network registry.Network
	if len(le.Endpoints) > 0 {
		cluster = le.Endpoints[0].Cluster
		network = t.networkOf(cluster)
		if g := le.Endpoints[0].Gateway; g != "" {
			network = g
		}
	}
	switch label {
	case traffic.LabelCluster:
		return string(c.Cluster), string(cluster)
	case traffic.LabelNetwork:
		return string(c.Network), string(network)
	case traffic.LabelRegion:
		return c.Locality.Region, le.Locality.Region
	case traffic.LabelZone:
		// A zone is the same zone only within the same region; a client
		// that names no zone shares none.
		if c.Locality.Zone == "" {
			return "", ""
		}
		return c.Locality.Region + "/" + c.Locality.Zone, le.Locality.Region + "/" + le.Locality.Zone
	}
	return "", ""
}

// distribute applies the first distribution whose from matches the
// client's locality: every locality one priority, weighted by the share of
// the first to pattern it matches; localities no pattern matches are left
// out. A client no entry names keeps its ranks.
func distribute(entries []rankedEntry, c Client, ds []traffic.Distribution) []rankedEntry {
	i := slices.IndexFunc(ds, func(d traffic.Distribution) bool { return localityMatches(d.From, c.Locality) })
	if i < 0 {
		return entries
	}
	to := ds[i].To
	healthy := make([]uint32, len(to)) // per pattern, the healthy endpoints of its localities
	pattern := make([]int, len(entries))
	for j, e := range entries {
		pattern[j] = slices.IndexFunc(to, func(w traffic.LocalityWeight) bool { return localityMatches(w.Locality, e.le.Locality) })
		if pattern[j] >= 0 {
			healthy[pattern[j]] += e.le.Weight
		}
	}
	var out []rankedEntry
	for j, e := range entries {
		k := pattern[j]
		if k < 0 || healthy[k] == 0 || to[k].Weight == 0 {
			continue
		}
		// The pattern's share (percent, scaled up so that small parts keep
		// a weight), split by healthy endpoints.
		e.le.Weight = max(uint32(uint64(to[k].Weight)*10000*uint64(e.le.Weight)/uint64(healthy[k])), 1)
		e.rank = 0
		out = append(out, e)
	}
	return out
}

// localityMatches reports whether a region[/zone[/subzone]] pattern ("*"
// matches any) matches l.
func localityMatches(pattern string, l registry.Locality) bool {
	parts := strings.Split(pattern, "/")
	values := []string{l.Region, l.Zone, l.Subzone}
	for i, p := range parts {
		if p != "*" && p != values[i] {
			return false
		}
	}
	return true
}

// renumber makes priorities of ranks, contiguous from 0, merging the
// endpoints of one locality that land in one priority (grpc-go refuses a
// locality twice in a priority).
func renumber(entries []rankedEntry) []Priority {
	slices.SortStableFunc(entries, func(x, y rankedEntry) int {
		return cmp.Or(cmp.Compare(x.rank, y.rank), x.le.Locality.Compare(y.le.Locality))
	})
	var out []Priority
	for i, e := range entries {
		if i == 0 || e.rank != entries[i-1].rank {
			out = append(out, Priority{Priority: uint32(len(out))})
		}
		p := &out[len(out)-1]
		if n := len(p.Localities); n > 0 && p.Localities[n-1].Locality == e.le.Locality {
			last := &p.Localities[n-1]
			last.Weight += e.le.Weight
			last.Endpoints = append(slices.Clone(last.Endpoints), e.le.Endpoints...)
			slices.SortFunc(last.Endpoints, compareEndpoints)
			continue
		}
		p.Localities = append(p.Localities, e.le)
	}
	return out
}
