package xds

import (
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
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
	// byService: by backend service, the route configurations naming any
	// of its ports (whose hash policies follow its policy).
	byService map[registry.ServiceKey]map[string]struct{}
	// localUses counts, per service, the route configurations' uses of its
	// Service-backend Clusters (most services have none).
	localUses map[registry.ServiceKey]int
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
	return &backendIndex{routes: map[string]routeUse{}, users: map[string]map[string]struct{}{},
		byService: map[registry.ServiceKey]map[string]struct{}{}, localUses: map[registry.ServiceKey]int{}, placeholders: map[string]BackendRef{}}
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
		if x.byService[b.Key] == nil {
			x.byService[b.Key] = map[string]struct{}{}
		}
		x.byService[b.Key][name] = struct{}{}
		if b.Local {
			x.localUses[b.Key]++
		}
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
		delete(x.byService[b.Key], name)
		if len(x.byService[b.Key]) == 0 {
			delete(x.byService, b.Key)
		}
		if b.Local {
			if x.localUses[b.Key]--; x.localUses[b.Key] <= 0 {
				delete(x.localUses, b.Key)
			}
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

// rerouteUsersOf marks the route configurations naming a port of service
// k for rebuilding: its policy may have changed.
func (c *routingChanges) rerouteUsersOf(x *backendIndex, k registry.ServiceKey) {
	for name := range x.byService[k] {
		c.reroute[name] = true
	}
}

// stageShape stages the listener, routes and cluster of svc's port p, and
// records what its routes send requests to.
func (s *Server) stageShape(svc *registry.Service, p registry.ServicePort, r *registry.Registry, routing *routingChanges) {
	routing.init()
	name, cluster := ListenerName(svc.Key, p.Port), ClusterName(svc.Key, p.Port)
	s.stage(s.lds, name, Listener(svc.Key, p))
	routed := svc
	if !s.stage(s.rds, name, RouteConfiguration(svc, p, r.Service)) {
		// Its routes make an invalid resource (logged and counted): the
		// port is served as if it had none, rather than not at all.
		plain := *svc
		plain.Traffic = traffic.Set{}
		routed = &plain
		s.stage(s.rds, name, RouteConfiguration(routed, p, r.Service))
	}
	s.stage(s.cds, cluster, Cluster(svc.Key, p, svc.Traffic.Policy))
	routing.built[name] = true
	s.backends.set(name, routeUse{key: svc.Key, port: p.Port, backends: RouteBackends(routed, p.Port)}, routing.touched)
	routing.touched[cluster] = BackendRef{Key: svc.Key, Port: p.Port}
}

// touchLocal marks the Service-backend Clusters of service k's ports
// (ports, and those it had) that a route uses: their endpoints or policy
// may have changed.
func (s *Server) touchLocal(k registry.ServiceKey, ports []registry.ServicePort, routing *routingChanges) {
	if s.backends.localUses[k] == 0 {
		return // no route names it as a Service backend: an ordinary endpoint change costs nothing more here
	}
	routing.init()
	for _, list := range [][]registry.ServicePort{ports, s.ports[k]} {
		for _, p := range list {
			if name := LocalClusterName(k, p.Port); s.backends.used(name) {
				routing.touched[name] = BackendRef{Key: k, Port: p.Port, Local: true}
			}
		}
	}
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
		if b.Local {
			s.stageLocal(cluster, b, r, groups)
			continue
		}
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

// localBackend is a Service backend's endpoints: the service port's in
// each exporting cluster, a client handed its own cluster's (GEP-1748: a
// Service backendRef means the caller's cluster). A client of a cluster
// that does not export the service, or that names no cluster, is handed
// an empty assignment, and fails those requests UNAVAILABLE.
type localBackend struct {
	ref       BackendRef
	byCluster map[registry.ClusterID]*portEndpoints
	empty     *portEndpoints
}

func (l *localBackend) forClient(c Client, t *topology) (*endpoint.ClusterLoadAssignment, uint64) {
	pe := l.byCluster[c.Cluster]
	if pe == nil {
		pe = l.empty
	}
	return pe.forClient(c, t)
}

// stageLocal publishes, or withdraws once no route uses it, a Service
// backend's Cluster and every group's assignment of it.
func (s *Server) stageLocal(name string, b BackendRef, r *registry.Registry, groups map[Client]*resourceCache) {
	if !s.backends.used(name) {
		if _, held := s.endpoints[name]; held {
			s.cds.stageDelete(name)
			delete(s.endpoints, name)
			for _, eds := range groups {
				eds.stageDelete(name)
			}
		}
		return
	}
	var policy *traffic.Policy
	if svc := r.Service(b.Key); svc != nil {
		policy = svc.Traffic.Policy
	}
	s.stage(s.cds, name, clusterNamed(name, policy))
	s.stageLocalEndpoints(b, groups, false)
}

// stageLocalEndpoints builds a Service backend's endpoints per cluster
// (from scratch when rebuild: the cluster-to-network map changed) and
// stages every group's assignment. A cluster whose endpoints are invalid
// keeps its last valid ones.
func (s *Server) stageLocalEndpoints(b BackendRef, groups map[Client]*resourceCache, rebuild bool) {
	name, t := b.ClusterName(), s.topo.Load()
	port := registry.ServicePort{Port: b.Port, Protocol: registry.ProtocolTCP}
	old, _ := s.endpoints[name].(*localBackend)
	l := &localBackend{ref: b, byCluster: map[registry.ClusterID]*portEndpoints{}}
	var err error
	if l.empty, err = newPortEndpoints(&registry.Service{Key: b.Key}, port, nil, t); err != nil {
		s.invalid(typeEDS, name, err) // cannot happen: it has no endpoints
		return
	}
	l.empty = renamed(l.empty, name)
	if svc := s.reg.Service(b.Key); svc != nil {
		for _, p := range ServicePorts(svc) {
			if p.Port == b.Port {
				port = p
			}
		}
		for _, sh := range svc.Shards {
			var prev *portEndpoints
			if old != nil && !rebuild {
				prev = old.byCluster[sh.Cluster]
			}
			pe, err := newPortEndpoints(&registry.Service{Key: b.Key, Shards: []*registry.Shard{sh}}, port, prev, t)
			if err != nil {
				s.invalid(typeEDS, name, err)
				pe = prev
			}
			if pe != nil {
				l.byCluster[sh.Cluster] = renamed(pe, name)
			}
		}
	}
	s.endpoints[name] = l
	stageAll(name, l, groups, t)
}

// renamed is pe under another cluster name (its blocks shared).
func renamed(pe *portEndpoints, name string) *portEndpoints {
	if pe.clusterName == name {
		return pe
	}
	c := *pe
	c.clusterName = name
	if pe.split != nil {
		c.split = renamed(pe.split, name)
	}
	return &c
}
