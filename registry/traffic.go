package registry

import (
	"fmt"
	"slices"

	"github.com/navemesh/nave/traffic"
)

// mergeTraffic merges the clusters' routes and policies (byAge is sorted
// oldest export first). Routes and policies add up: a cluster that exports
// none disagrees with no one.
//
//   - Routes are merged by kind and name: each comes from the oldest export
//     that has it, and a cluster that exports the same name differently
//     (creation times aside) loses, with a RouteConflict.
//   - The policy is the oldest export's that has one; a cluster whose policy
//     differs (in name or content) loses, with a PolicyConflict.
func mergeTraffic(svc *Service, byAge []*Shard) {
	if len(byAge) == 1 { // the common case: nothing to merge
		only := byAge[0]
		svc.Traffic = only.Traffic
		for range only.Traffic.Routes {
			svc.RouteOwners = append(svc.RouteOwners, only.Cluster)
		}
		if only.Traffic.Policy != nil {
			svc.PolicyOwner = only.Cluster
		}
		return
	}
	type owned struct {
		route traffic.Route
		owner ClusterID
	}
	var routes []owned
	for _, s := range byAge {
		for _, r := range s.Traffic.Routes {
			i := slices.IndexFunc(routes, func(o owned) bool { return o.route.Kind == r.Kind && o.route.Name == r.Name })
			if i < 0 {
				routes = append(routes, owned{r, s.Cluster})
				continue
			}
			if w := &routes[i]; !w.route.SameContent(&r) {
				svc.Conflicts = append(svc.Conflicts, Conflict{
					Kind: RouteConflict, Property: fmt.Sprintf("%s %q", r.Kind, r.Name), Winner: w.owner, Loser: s.Cluster,
					Reason: fmt.Sprintf("differs between %s and %s", w.owner, s.Cluster),
				})
			} else if r.CreatedAt.Before(w.route.CreatedAt) {
				w.route.CreatedAt = r.CreatedAt // the same route: the oldest creation orders it
			}
		}
	}
	var winner *Shard
	for _, s := range byAge {
		switch {
		case s.Traffic.Policy == nil:
		case winner == nil:
			winner = s
		case !winner.Traffic.Policy.Equal(s.Traffic.Policy):
			w, l := winner.Traffic.Policy, s.Traffic.Policy
			reason := fmt.Sprintf("%q in %s but %q in %s", w.Name, winner.Cluster, l.Name, s.Cluster)
			if w.Name == l.Name {
				reason = fmt.Sprintf("%q differs between %s and %s", w.Name, winner.Cluster, s.Cluster)
			}
			svc.Conflicts = append(svc.Conflicts, Conflict{
				Kind: PolicyConflict, Property: "TrafficPolicy", Winner: winner.Cluster, Loser: s.Cluster, Reason: reason,
			})
		}
	}
	slices.SortFunc(routes, func(a, b owned) int { return traffic.CompareRoutes(a.route, b.route) })
	var set traffic.Set
	for _, r := range routes {
		set.Routes = append(set.Routes, r.route)
		svc.RouteOwners = append(svc.RouteOwners, r.owner)
	}
	if winner != nil {
		set.Policy, svc.PolicyOwner = winner.Traffic.Policy, winner.Cluster
	}
	svc.Traffic = set
}
