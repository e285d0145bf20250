package registry

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/navemesh/nave/traffic"
)

// Service is the merged view of one service exported by one or more clusters.
type Service struct {
	Key ServiceKey
	// Shards holds each exporting cluster's shard, sorted by cluster ID.
	Shards []*Shard
	// Ports is the union of the clusters' ports, conflicts resolved, sorted by number and protocol.
	Ports    []ServicePort
	Headless bool
	// Properties are the oldest export's (IP families: the oldest that states any).
	Properties
	// Traffic is every cluster's routes and policy merged (see mergeTraffic).
	Traffic traffic.Set
	// RouteOwners holds, for each of Traffic.Routes (same index), the
	// cluster whose export it came from; PolicyOwner the policy's.
	RouteOwners []ClusterID
	PolicyOwner ClusterID
	// Conflicts lists every property on which clusters disagree, and who won.
	Conflicts []Conflict
	// Revision is the registry version at which anything about the service last changed.
	Revision uint64
	// ShapeRevision is the registry version at which its ports, type or conflicts last changed.
	ShapeRevision uint64
}

// Conflict reports a property two clusters export differently. Following
// the Kubernetes MCS rules, the oldest export wins (ties go to the lower
// cluster ID); the loser's value is ignored for that property. The one
// exception is a port-set conflict (see IsPortSet): the ports are the union.
type Conflict struct {
	Kind     ConflictKind `json:"kind"`
	Property string       `json:"property"`
	Winner   ClusterID    `json:"winner"`
	Loser    ClusterID    `json:"loser"`
	Reason   string       `json:"reason"`
}

func (c Conflict) String() string {
	if c.IsPortSet() {
		return fmt.Sprintf("%s: %s (the import serves the union of %s's and %s's)", c.Property, c.Reason, c.Winner, c.Loser)
	}
	return fmt.Sprintf("%s: %s (kept %s's, ignored %s's)", c.Property, c.Reason, c.Winner, c.Loser)
}

// merge computes the merged service from its shards (sorted by cluster).
func merge(k ServiceKey, shards []*Shard) *Service {
	svc := &Service{Key: k, Shards: shards}
	byAge := svc.ByAge()
	oldest := byAge[0]
	svc.Headless = oldest.Headless
	type portKey struct {
		number   int32
		protocol Protocol
	}
	owner := map[portKey]ClusterID{}
	nameOwner := map[string]ServicePort{}
	for _, s := range byAge {
		if s.Headless != oldest.Headless {
			svc.Conflicts = append(svc.Conflicts, Conflict{
				Kind: TypeConflict, Property: "type", Winner: oldest.Cluster, Loser: s.Cluster,
				Reason: fmt.Sprintf("headless is %t in %s but %t in %s", oldest.Headless, oldest.Cluster, s.Headless, s.Cluster),
			})
		}
		for _, p := range s.Ports {
			pk := portKey{p.Port, p.Protocol}
			if winner, ok := owner[pk]; ok {
				i := slices.IndexFunc(svc.Ports, func(q ServicePort) bool { return q.Port == p.Port && q.Protocol == p.Protocol })
				if w := svc.Ports[i]; w != p {
					svc.Conflicts = append(svc.Conflicts, Conflict{
						Kind: PortConflict, Property: fmt.Sprintf("port %d/%s", p.Port, p.Protocol), Winner: winner, Loser: s.Cluster,
						Reason: fmt.Sprintf("declared as %s in %s but %s in %s", describePort(w), winner, describePort(p), s.Cluster),
					})
				}
				continue
			}
			if w, ok := nameOwner[p.Name]; ok {
				svc.Conflicts = append(svc.Conflicts, Conflict{
					Kind: PortConflict, Property: fmt.Sprintf("port name %q", p.Name), Winner: owner[portKey{w.Port, w.Protocol}], Loser: s.Cluster,
					Reason: fmt.Sprintf("names port %d/%s but port %d/%s in %s", w.Port, w.Protocol, p.Port, p.Protocol, s.Cluster),
				})
				continue
			}
			owner[pk] = s.Cluster
			nameOwner[p.Name] = p
			svc.Ports = append(svc.Ports, p)
		}
	}
	slices.SortFunc(svc.Ports, func(a, b ServicePort) int {
		return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	mergePortSets(svc, byAge)
	mergeProperties(svc, byAge)
	mergeTraffic(svc, byAge)
	return svc
}

// ByAge lists the service's shards oldest export first (ties to the lower
// cluster ID): the order every merge rule takes them in.
func (s *Service) ByAge() []*Shard {
	byAge := slices.Clone(s.Shards)
	slices.SortStableFunc(byAge, func(a, b *Shard) int {
		return cmp.Or(compareTime(a.ExportedAt, b.ExportedAt), cmp.Compare(a.Cluster, b.Cluster))
	})
	return byAge
}

func describePort(p ServicePort) string {
	s := fmt.Sprintf("name=%q", p.Name)
	if p.AppProtocol != "" {
		s += fmt.Sprintf(" appProtocol=%q", p.AppProtocol)
	}
	return s
}

func compareTime(a, b time.Time) int { return a.Compare(b) }

func (s *Service) sameShape(o *Service) bool {
	return s.Headless == o.Headless && slices.Equal(s.Ports, o.Ports) && slices.Equal(s.Conflicts, o.Conflicts) &&
		s.Properties.Equal(&o.Properties) && s.Traffic.Equal(&o.Traffic)
}

// Clusters lists the clusters that export the service, sorted.
func (s *Service) Clusters() []ClusterID {
	out := make([]ClusterID, len(s.Shards))
	for i, sh := range s.Shards {
		out[i] = sh.Cluster
	}
	return out
}

// PortEndpoint is one address:port that serves a merged service port.
type PortEndpoint struct {
	Cluster  ClusterID
	Address  netip.Addr
	Port     int32
	Locality Locality
	Health   Health
}

// Endpoints lists, for the merged port p, every cluster's endpoints that
// serve it: a cluster serves p when its own shard declares the same port
// number and protocol; its endpoints' target port is looked up by the name
// that cluster gives the port. Excluded endpoints are left out. The result
// is sorted by cluster, then address.
func (s *Service) Endpoints(p ServicePort) []PortEndpoint {
	var out []PortEndpoint
	for _, sh := range s.Shards {
		own, ok := sh.Port(p.Port, p.Protocol)
		if !ok {
			continue
		}
		for i := range sh.Endpoints {
			e := &sh.Endpoints[i]
			h := e.Health()
			if h == Excluded {
				continue
			}
			target, ok := e.PortNumber(own.Name)
			if !ok {
				continue
			}
			out = append(out, PortEndpoint{Cluster: sh.Cluster, Address: e.Addresses[0], Port: target, Locality: e.Locality, Health: h})
		}
	}
	return out
}
