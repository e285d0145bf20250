package xds

import (
	"maps"
	"slices"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/navemesh/nave/registry"
)

// Audience is a kind of node that is served listeners, routes and clusters
// of its own (Envoy gateways) instead of the API listeners every proxyless
// gRPC client shares. Its nodes fall into groups; the nodes of one group
// share their resources, and each group's resources are rebuilt whenever a
// service's shape or the network topology changes. Their endpoints come
// from the EDS cache of the Client that Classify names, like any client's.
type Audience interface {
	// Classify says whether node belongs to the audience, and if so the key
	// of its group and the Client its endpoints are computed for. It is
	// called on every request, from many goroutines.
	Classify(node *core.Node) (key string, client Client, ok bool)
	// Build returns the resources of the group key for registry r and
	// topology nets. Every resource must pass ValidateDeep and the set
	// CheckConsistent, or none of it is published (the group keeps what
	// it had). Its EDS clusters are named by ClusterName.
	Build(key string, r *registry.Registry, nets registry.Networks) Resources
}

// MaxAudienceGroups bounds how many groups of an audience get resources of
// their own (their nodes choose their group, so this bounds memory). At
// the bound a new group takes the place of the least recently used idle
// one; when every group is held by open streams, a stream of a new group
// is refused (ResourceExhausted). See groups.go.
const MaxAudienceGroups = 256

// view is one audience group's caches.
type view struct {
	key           string
	lds, rds, cds *resourceCache
}

// classify returns a node's audience group key and Client, if it has one.
func (s *Server) classify(node *core.Node) (string, Client, bool) {
	if s.cfg.Audience == nil {
		return "", Client{}, false
	}
	return s.cfg.Audience.Classify(node)
}

// clientFor is the Client whose endpoints a node is served. A gateway
// that names only its cluster is on that cluster's network, as any client.
func (s *Server) clientFor(node *core.Node) Client {
	t := s.topo.Load()
	if _, c, ok := s.classify(node); ok {
		if c.Network == "" {
			c.Network = clientOf(node, t).Network
		}
		return c
	}
	return clientOf(node, t)
}

// viewFor returns the caches of a node's audience group, and whether the
// node belongs to an audience: the group its stream holds (see
// holdGroups); for a node of no open stream (tests), the group's, made
// idle if the table admits it. Nil caches: the node may not have a group,
// and is served nothing (never the proxyless resources).
func (s *Server) viewFor(node *core.Node) (*view, bool) {
	key, _, ok := s.classify(node)
	if !ok {
		return nil, false
	}
	if h := s.heldFor(node); h != nil {
		if h.view == nil {
			return nil, true
		}
		return h.view.view, true
	}
	if v := (*s.views.Load())[key]; v != nil {
		return v, true
	}
	vk := groupKey{gateway: true, view: key}
	if vk.keyBytes() > MaxGroupKeyBytes || s.restrictionOf(node) != nil {
		return nil, true
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	e, err := s.take(vk, "")
	if err != nil {
		return nil, true
	}
	s.drop(e, "")
	s.publishGroupMetrics()
	return e.view, true
}

// rebuildViews rebuilds every audience group's resources. Called with stateMu held.
func (s *Server) rebuildViews(start time.Time) {
	for _, v := range *s.views.Load() {
		s.buildView(v, start)
	}
}

// buildView builds a group's resources, checks them whole, and publishes
// what changed; an invalid or inconsistent set is not published at all.
// A resource whose content is what the group already publishes was
// validated when it was first published: only new and changed ones are
// validated again (a thousand services' listener, routes and clusters take
// tens of milliseconds to validate deeply). Called with stateMu held.
func (s *Server) buildView(v *view, start time.Time) {
	res := s.cfg.Audience.Build(v.key, s.reg, s.networks)
	clusters, err := validated(v.cds, res.Clusters)
	if err == nil {
		var routes, listeners []stagedNamed
		if routes, err = validated(v.rds, res.Routes); err == nil {
			if listeners, err = validated(v.lds, res.Listeners); err == nil {
				err = CheckConsistent(res, func(name string) bool { return s.endpoints[name] != nil })
			}
		}
		if err == nil {
			replace(v.cds, clusters)
			replace(v.rds, routes)
			replace(v.lds, listeners)
		}
	}
	if err != nil {
		s.invalid("gateway", v.key, err)
		return
	}
	// Clusters before the routes and listeners that name them.
	s.flush(v.cds, start)
	s.flush(v.rds, start)
	s.flush(v.lds, start)
}

// stagedNamed is a resource, its name and its content hash.
type stagedNamed struct {
	name string
	res  types.Resource
	sum  uint64
}

// validated hashes resources and validates those whose content c does not
// already publish.
func validated[T interface {
	types.Resource
	GetName() string
}](c *resourceCache, resources []T) ([]stagedNamed, error) {
	out := make([]stagedNamed, len(resources))
	for i, r := range resources {
		out[i] = stagedNamed{name: r.GetName(), res: r, sum: contentSum(r)}
		if old, ok := c.published[out[i].name]; ok && old.sum == out[i].sum {
			continue
		}
		if err := ValidateDeep(r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// replace stages c to hold exactly resources (by name).
func replace(c *resourceCache, resources []stagedNamed) {
	keep := make(map[string]bool, len(resources))
	for _, r := range resources {
		keep[r.name] = true
		c.stage(r.name, r.res, r.sum)
	}
	for _, name := range slices.Collect(maps.Keys(c.published)) {
		if !keep[name] {
			c.stageDelete(name)
		}
	}
}
