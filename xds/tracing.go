package xds

import (
	"slices"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/navemesh/nave/internal/xdstype"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/syncstatus"
)

// Tracer traces changes to the clients that hold them (package
// convergence implements it). Its methods must not block.
type Tracer interface {
	// Tracing says whether a change of a service awaits translation.
	Tracing(registry.ServiceKey) bool
	// Translated says what a client must be sent to hold the service's
	// changes up to registry version upTo: a response of typeURL carrying
	// one of resources, of a cache version at or above published's for its
	// cache's prefix ("" and none: nothing a client is sent changed).
	Translated(key registry.ServiceKey, upTo uint64, typeURL string, resources []string, published map[string]uint64)
	// Collecting says whether Pushed has anything to do.
	Collecting() bool
	// Pushed: a response with nonce and version carrying names is about
	// to be sent to a stream that holds an earlier state of its type (a
	// stream's first response of a type answers its fetch: it is not a
	// push); before is the stream's sync status before it.
	Pushed(s syncstatus.Stream, node, typeURL, nonce, version string, names []string, before syncstatus.Sent)
	// Answered: a stream accepted (ok) or rejected a response.
	Answered(s syncstatus.Stream, typeURL, nonce string, ok bool)
	// Closed: a stream ended.
	Closed(s syncstatus.Stream)
}

// stagedOf says what a client must be sent to hold what this Update staged
// for a service: its assignments if any locality group's changed, else its
// clusters, else its routes, else its listeners ("": nothing staged but
// deletions, which no response carries), and, by cache version prefix, the
// version of each cache that will first hold them (the next: every cache
// with something staged flushes once). Call it with stateMu held, before
// the caches flush. Gateways' own views are not traced.
func (s *Server) stagedOf(k registry.ServiceKey, groups map[Client]*resourceCache) (typeURL string, names []string, published map[string]uint64) {
	staged := func(c *resourceCache, name string) bool { _, ok := c.upserts[name]; return ok }
	next := func(cs ...*resourceCache) map[string]uint64 {
		out := make(map[string]uint64, len(cs))
		for _, c := range cs {
			out[c.prefix] = c.version + 1
		}
		return out
	}
	var eds, cds, rds, lds []string
	var edsCaches []*resourceCache
	for _, p := range s.ports[k] {
		cluster, listener := ClusterName(k, p.Port), ListenerName(k, p.Port)
		found := false
		for _, g := range groups {
			if staged(g, cluster) {
				found = true
				if !slices.Contains(edsCaches, g) {
					edsCaches = append(edsCaches, g)
				}
			}
		}
		if found {
			eds = append(eds, cluster)
		}
		if staged(s.cds, cluster) {
			cds = append(cds, cluster)
		}
		if staged(s.rds, listener) {
			rds = append(rds, listener)
		}
		if staged(s.lds, listener) {
			lds = append(lds, listener)
		}
	}
	switch {
	case len(eds) > 0:
		return resource.EndpointType, eds, next(edsCaches...)
	case len(cds) > 0:
		return resource.ClusterType, cds, next(s.cds)
	case len(rds) > 0:
		return resource.RouteType, rds, next(s.rds)
	case len(lds) > 0:
		return resource.ListenerType, lds, next(s.lds)
	}
	return "", nil, nil
}

// responseNames reads the names of a response's resources from their encoding.
func responseNames(resp *discovery.DiscoveryResponse) []string {
	names := make([]string, 0, len(resp.GetResources()))
	for _, a := range resp.GetResources() {
		if name, err := xdstype.WireName(a.GetValue()); err == nil {
			names = append(names, name)
		}
	}
	return names
}

func deltaResponseNames(resp *discovery.DeltaDiscoveryResponse) []string {
	names := make([]string, 0, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		names = append(names, r.GetName())
	}
	return names
}
