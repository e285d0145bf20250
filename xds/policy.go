package xds

import (
	"context"
	"strings"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// Restriction says whether a client may receive the services of a
// namespace; nil allows everything.
type Restriction func(namespace string) bool

// restrictions remember the Restriction of every open stream, by stream
// and by the node its requests carry (a watch knows only the node).
type restrictions struct {
	mu       sync.Mutex // guards what follows
	byStream map[streamKey]*streamRestriction
	byNode   map[*core.Node]*streamRestriction
}

type streamRestriction struct {
	allow  Restriction
	who    string
	warned bool // a denial was logged for the stream
	nodes  []*core.Node
}

// NamespaceOf returns the namespace of the service a resource name names
// (a listener or route "HOST:PORT", a cluster or assignment
// "outbound|PORT||HOST", HOST being NAME.NAMESPACE.svc.clusterset.local).
func NamespaceOf(name string) (string, bool) {
	if i := strings.LastIndexByte(name, '|'); i >= 0 {
		name = name[i+1:]
	} else if i := strings.LastIndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	host, ok := strings.CutSuffix(name, ".svc.clusterset.local")
	if !ok {
		return "", false
	}
	_, ns, ok := strings.Cut(host, ".")
	return ns, ok && ns != "" && !strings.Contains(ns, ".")
}

// openStream computes a new stream's Restriction (Config.Restrict).
func (s *Server) openStream(ctx context.Context, key streamKey) error {
	if s.cfg.Restrict == nil {
		return nil
	}
	allow, who, err := s.cfg.Restrict(ctx)
	if err != nil || allow == nil {
		return err
	}
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	s.restrict.byStream[key] = &streamRestriction{allow: allow, who: who}
	return nil
}

// restrictRequest ties a restricted stream's node to its Restriction and
// counts (and logs once per stream) the names it may not receive.
func (s *Server) restrictRequest(key streamKey, node *core.Node, typeURL string, names []string) {
	if s.cfg.Restrict == nil {
		return
	}
	s.restrict.mu.Lock()
	r := s.restrict.byStream[key]
	if r == nil {
		s.restrict.mu.Unlock()
		return
	}
	if node != nil && s.restrict.byNode[node] == nil {
		s.restrict.byNode[node] = r
		r.nodes = append(r.nodes, node)
	}
	var denied []string
	for _, n := range names {
		if ns, ok := NamespaceOf(n); !ok || !r.allow(ns) {
			denied = append(denied, n)
		}
	}
	if len(names) == 0 {
		denied = append(denied, "*")
	}
	first := len(denied) > 0 && !r.warned
	r.warned = r.warned || first
	s.restrict.mu.Unlock()
	if len(denied) == 0 {
		return
	}
	s.metrics.denied.WithLabelValues(typeLabel(typeURL)).Add(float64(len(denied)))
	if first {
		s.log.Warn("a client asked for resources its identity may not receive; it gets nothing of them",
			"identity", r.who, "node", node.GetId(), "type", typeLabel(typeURL), "denied", len(denied), "example", denied[0])
	}
}

func (s *Server) closeStream(key streamKey) {
	if s.cfg.Restrict == nil {
		return
	}
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	if r := s.restrict.byStream[key]; r != nil {
		for _, n := range r.nodes {
			delete(s.restrict.byNode, n)
		}
		delete(s.restrict.byStream, key)
	}
}

// restrictionOf returns the Restriction of the stream node's requests come on.
func (s *Server) restrictionOf(node *core.Node) Restriction {
	if s.cfg.Restrict == nil {
		return nil
	}
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	if r := s.restrict.byNode[node]; r != nil {
		return r.allow
	}
	return nil
}

// restrictedSubscription is a subscription cut down to what a
// Restriction allows. A wildcard subscription becomes an empty one: a
// restricted client must name what it wants.
type restrictedSubscription struct {
	cache.Subscription
	names map[string]struct{}
}

func restrict(sub cache.Subscription, allow Restriction) cache.Subscription {
	names := map[string]struct{}{}
	if !sub.IsWildcard() {
		for n := range sub.SubscribedResources() {
			if ns, ok := NamespaceOf(n); ok && allow(ns) {
				names[n] = struct{}{}
			}
		}
	}
	return restrictedSubscription{Subscription: sub, names: names}
}

func (r restrictedSubscription) SubscribedResources() map[string]struct{} { return r.names }
func (r restrictedSubscription) IsWildcard() bool                         { return false }
