package xds

import (
	"github.com/navemesh/nave/registry"
)

// backendIndex records which Clusters each RouteConfiguration sends
// requests to. It serves two things: a route configuration names its
// backends' hash policies, so it is rebuilt when a backend's policy
// changes; and a route may name a service port no cluster exports, whose
// Cluster is then published as a placeholder with no endpoints, so that
// the client fails those requests UNAVAILABLE at once instead of waiting
// for a Cluster that never comes (and the name is never dangling). When
// the service is exported, its own Cluster, of the same name, replaces
// the placeholder.
//
// Owned by whoever holds Server.stateMu.
type backendIndex struct {
	routes map[string]routeUse            // by route configuration (listener) name
	users  map[string]map[string]struct{} // by cluster name: the route configurations naming it
	// placeholders are the Clusters published with no service port behind them.
	placeholders map[string]BackendRef
}

// routeUse is a route configuration's service port and the backends it names.
type routeUse struct {
	key      registry.ServiceKey
	port     int32
	backends []BackendRef
}

func newBackendIndex() *backendIndex {
	return &backendIndex{routes: map[string]routeUse{}, users: map[string]map[string]struct{}{}, placeholders: map[string]BackendRef{}}
}

// set records the backends route configuration name names, and adds to
// touched every backend it names or named before.
func (x *backendIndex) set(name string, use routeUse, touched map[string]BackendRef) {
	x.drop(name, touched)
	x.routes[name] = use
	for _, b := range use.backends {
		c := b.ClusterName()
		if x.users[c] == nil {
			x.users[c] = map[string]struct{}{}
		}
		x.users[c][name] = struct{}{}
		touched[c] = b
	}
}

// drop forgets route configuration name, adding its backends to touched.
func (x *backendIndex) drop(name string, touched map[string]BackendRef) {
	for _, b := range x.routes[name].backends {
		c := b.ClusterName()
		delete(x.users[c], name)
		if len(x.users[c]) == 0 {
			delete(x.users, c)
		}
		touched[c] = b
	}
	delete(x.routes, name)
}

// used reports whether a route configuration names cluster c.
func (x *backendIndex) used(c string) bool { return len(x.users[c]) > 0 }

// routingChanges collects, during one Update, the backends whose Cluster
// may need a placeholder added or removed, and the route configurations
// to build again because a backend's policy changed.
type routingChanges struct {
	touched map[string]BackendRef
	reroute map[string]bool // route configurations (listener names) to rebuild
	built   map[string]bool // route configurations already rebuilt
}

func (c *routingChanges) init() {
	if c.touched == nil {
		c.touched, c.reroute, c.built = map[string]BackendRef{}, map[string]bool{}, map[string]bool{}
	}
}

// rerouteUsersOf marks the route configurations naming cluster for rebuilding.
func (c *routingChanges) rerouteUsersOf(x *backendIndex, cluster string) {
	for name := range x.users[cluster] {
		c.reroute[name] = true
	}
}

// stageShape stages the listener, routes and cluster of svc's port p, and
// records what its routes send requests to.
func (s *Server) stageShape(svc *registry.Service, p registry.ServicePort, r *registry.Registry, routing *routingChanges) {
	routing.init()
	name, cluster := ListenerName(svc.Key, p.Port), ClusterName(svc.Key, p.Port)
	s.stage(s.lds, name, Listener(svc.Key, p))
	s.stage(s.rds, name, RouteConfiguration(svc, p, r.Service))
	s.stage(s.cds, cluster, Cluster(svc.Key, p, svc.Traffic.Policy))
	routing.built[name] = true
	s.backends.set(name, routeUse{key: svc.Key, port: p.Port, backends: RouteBackends(svc, p.Port)}, routing.touched)
	routing.touched[cluster] = BackendRef{Key: svc.Key, Port: p.Port}
	routing.rerouteUsersOf(s.backends, cluster) // its policy may have changed
}

// stageRouting rebuilds the route configurations a backend's change
// touched, and adds or removes the placeholders of backends no cluster
// exports.
func (s *Server) stageRouting(routing *routingChanges, r *registry.Registry, groups map[Client]*resourceCache) {
	for name := range routing.reroute {
		use, ok := s.backends.routes[name]
		if !ok || routing.built[name] {
			continue
		}
		svc := r.Service(use.key)
		for _, p := range ServicePorts(svc) {
			if p.Port == use.port {
				s.stage(s.rds, name, RouteConfiguration(svc, p, r.Service))
			}
		}
	}
	for cluster, b := range routing.touched {
		real := hasPort(s.ports[b.Key], b.Port)
		_, held := s.backends.placeholders[cluster]
		switch used := s.backends.used(cluster); {
		case real:
			delete(s.backends.placeholders, cluster)
		case used && !held:
			s.stage(s.cds, cluster, Cluster(b.Key, registry.ServicePort{Port: b.Port, Protocol: registry.ProtocolTCP}, nil))
			s.stagePlaceholderEndpoints(b, groups)
			s.backends.placeholders[cluster] = b
		case !used && held:
			s.cds.stageDelete(cluster)
			delete(s.endpoints, cluster)
			for _, eds := range groups {
				eds.stageDelete(cluster)
			}
			delete(s.backends.placeholders, cluster)
		}
	}
}

// stagePlaceholderEndpoints stages the empty assignment of a backend no
// cluster exports, for every group.
func (s *Server) stagePlaceholderEndpoints(b BackendRef, groups map[Client]*resourceCache) {
	s.stageEndpoints(&registry.Service{Key: b.Key}, registry.ServicePort{Port: b.Port, Protocol: registry.ProtocolTCP}, groups)
}
