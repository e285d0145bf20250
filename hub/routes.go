package hub

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
	"github.com/navemesh/nave/xds"
)

// Routes describes the traffic of every service with routes or a policy,
// sorted by service.
func Routes(r *registry.Registry) []adminapi.RoutesInfo {
	var routed []*registry.Service
	for svc := range r.All() {
		if !svc.Traffic.IsZero() {
			routed = append(routed, svc)
		}
	}
	slices.SortFunc(routed, func(a, b *registry.Service) int { return a.Key.Compare(b.Key) })
	out := make([]adminapi.RoutesInfo, 0, len(routed))
	for _, svc := range routed {
		out = append(out, routesOf(r, svc))
	}
	return out
}

// ServiceRoutes describes the traffic of service ("ns/name"), routes or not.
func ServiceRoutes(r *registry.Registry, service string) (adminapi.RoutesInfo, error) {
	key, err := registry.ParseServiceKey(service)
	if err != nil {
		return adminapi.RoutesInfo{}, err
	}
	svc := r.Service(key)
	if svc == nil {
		return adminapi.RoutesInfo{}, fmt.Errorf("service %s is not federated", key)
	}
	return routesOf(r, svc), nil
}

// routesOf describes svc's merged traffic, each route and the policy with
// the cluster it came from (as the merge recorded it).
func routesOf(r *registry.Registry, svc *registry.Service) adminapi.RoutesInfo {
	info := adminapi.RoutesInfo{Service: svc.Key, RouteCount: len(svc.Traffic.Routes), Ports: []adminapi.PortRoutes{},
		Policy: svc.Traffic.Policy, PolicyCluster: svc.PolicyOwner, Exports: []adminapi.TrafficExport{}}
	for _, sh := range svc.ByAge() {
		e := adminapi.TrafficExport{Cluster: sh.Cluster, ExportedAt: sh.ExportedAt}
		for _, rt := range sh.Traffic.Routes {
			e.Routes = append(e.Routes, adminapi.RouteName{Kind: rt.Kind, Name: rt.Name})
		}
		if p := sh.Traffic.Policy; p != nil {
			e.Policy = p.Name
		}
		info.Exports = append(info.Exports, e)
	}
	for _, c := range svc.Conflicts {
		if c.Kind == registry.RouteConflict || c.Kind == registry.PolicyConflict {
			info.Conflicts = append(info.Conflicts, c)
		}
	}
	ports := xds.ServicePorts(svc)
	for _, p := range ports {
		pr := adminapi.PortRoutes{Port: p, Target: "xds:///" + xds.ListenerName(svc.Key, p.Port)}
		for i := range svc.Traffic.Routes {
			if rt := &svc.Traffic.Routes[i]; rt.Port == 0 || rt.Port == p.Port {
				pr.Routes = append(pr.Routes, routeInfo(r, svc.Key, p.Port, rt, svc.RouteOwners[i]))
			}
		}
		if len(pr.Routes) > 0 {
			// The hub serves a port whose routes make an invalid resource as if it had none.
			if err := xds.Validate(xds.RouteConfiguration(svc, p, r.Service)); err != nil {
				pr.Invalid = err.Error()
			}
		}
		info.Ports = append(info.Ports, pr)
	}
	for i := range svc.Traffic.Routes {
		rt := &svc.Traffic.Routes[i]
		if rt.Port != 0 && !slices.ContainsFunc(ports, func(p registry.ServicePort) bool { return p.Port == rt.Port }) {
			info.Unattached = append(info.Unattached, routeInfo(r, svc.Key, rt.Port, rt, svc.RouteOwners[i]))
		}
	}
	return info
}

// routeInfo is route rt of service k as requests to port take it.
func routeInfo(r *registry.Registry, k registry.ServiceKey, port int32, rt *traffic.Route, owner registry.ClusterID) adminapi.RouteInfo {
	ri := adminapi.RouteInfo{Kind: rt.Kind, Name: rt.Name, Cluster: owner, CreatedAt: rt.CreatedAt, Port: rt.Port,
		Rules: make([]adminapi.RuleInfo, 0, len(rt.Rules))}
	for _, rule := range rt.Rules {
		info := adminapi.RuleInfo{Matches: rule.Matches, Timeout: rule.Timeout, Retry: rule.Retry, SetHeaders: rule.SetHeaders}
		for _, b := range rule.Backends {
			ref := xds.BackendRef{Key: registry.ServiceKey{Namespace: k.Namespace, Name: b.Name}, Port: cmp.Or(b.Port, port),
				Local: b.Kind == traffic.BackendService}
			bi := adminapi.BackendInfo{Kind: b.Kind, Name: b.Name, Port: ref.Port, Weight: b.Weight, XDSCluster: ref.ClusterName()}
			// A port no cluster exports is a placeholder Cluster (see xds.RouteBackends).
			if target := r.Service(ref.Key); target != nil {
				bi.Exported = slices.ContainsFunc(xds.ServicePorts(target), func(p registry.ServicePort) bool { return p.Port == ref.Port })
				for _, sh := range target.Shards {
					if _, ok := sh.Port(ref.Port, registry.ProtocolTCP); ok {
						bi.Clusters = append(bi.Clusters, sh.Cluster)
					}
				}
			}
			info.Backends = append(info.Backends, bi)
		}
		ri.Rules = append(ri.Rules, info)
	}
	return ri
}
