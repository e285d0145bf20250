package hub

import (
	"fmt"
	"maps"
	"slices"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// commit is the one way a cluster's data changes, on the state goroutine:
// a spoke session's update, a peer's, a restore, a drop and the export
// policy's enforcement all go through it. It applies ch as the export
// policy permits; when the cluster would then pass its limits it changes
// nothing and returns an *overLimits. Otherwise it swaps the registry,
// tracks conflicts, stamps the cluster st (which fences older sessions of
// it), sets its summary, lets set change what the path decides (its
// origin, restored flag, update time, network, gateways) and then tells
// replication. It returns the registry's diff and how many upserts the
// policy left out. Tracing and publishing are the caller's (a restore
// publishes all its clusters at once, publishMerged).
func (s *state) commit(ch registry.Change, st replicas.Stamp, set func(*ClusterStatus)) (registry.Diff, int, error) {
	permitted := s.permitted(ch)
	next, diff := s.reg.Apply(permitted)
	sum := next.Cluster(ch.Cluster)
	if sum.Services > s.limits.MaxServicesPerCluster || sum.Endpoints > s.limits.MaxEndpointsPerCluster {
		return registry.Diff{}, 0, &overLimits{cluster: ch.Cluster, services: sum.Services, endpoints: sum.Endpoints, limits: s.limits}
	}
	prev := s.reg
	s.reg = next
	s.trackConflicts(prev, diff)
	s.maxEpoch[ch.Cluster] = max(s.maxEpoch[ch.Cluster], st.Epoch)
	s.superseded(ch.Cluster, st.Epoch)
	c := s.cluster(ch.Cluster)
	c.Epoch, c.Version = st.Epoch, st.Version
	c.Digest, c.Services, c.Endpoints = sum.Digest, sum.Services, sum.Endpoints
	c.Dropped = isDrop(st, sum.Services)
	set(c)
	keys := make([]registry.ServiceKey, len(diff.Services))
	for i, d := range diff.Services {
		keys[i] = d.Key
	}
	s.replicaChanged(ch.Cluster, keys...)
	return diff, len(ch.Upserts) - len(permitted.Upserts), nil
}

// overLimits is what commit refuses: the cluster would hold more services
// or endpoints than its limits allow.
type overLimits struct {
	cluster             registry.ClusterID
	services, endpoints int
	limits              registry.Limits
}

func (e *overLimits) Error() string {
	return fmt.Sprintf("cluster %s would hold %d services and %d endpoints; the limits are %d and %d",
		e.cluster, e.services, e.endpoints, e.limits.MaxServicesPerCluster, e.limits.MaxEndpointsPerCluster)
}

// publishMerged publishes the changes of several commits as one diff: clients
// never see some of them without the others.
func (s *state) publishMerged(changed map[registry.ServiceKey]registry.ServiceDiff) {
	all := registry.Diff{Version: s.reg.Version()}
	for _, k := range slices.SortedFunc(maps.Keys(changed), registry.ServiceKey.Compare) {
		all.Services = append(all.Services, changed[k])
	}
	s.publish(all)
}
