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

// restrictions remember, when Wiring.Restrict is set, what every open
// stream may receive, by stream and by the node its requests carry (a
// watch knows only its request, whose node is the stream's).
type restrictions struct {
	mu       sync.Mutex // guards what follows
	byStream map[streamKey]*streamRestriction
	byNode   map[*core.Node]*streamRestriction
}

type streamRestriction struct {
	allow  Restriction // nil: everything
	who    string
	node   *core.Node      // the node the stream's requests carry now
	judged map[string]bool // type and name of the names already counted, up to maxJudged
	warned bool            // a denial was logged for the stream
}

// maxJudged bounds the names a stream's denials are deduplicated over.
const maxJudged = 4096

// denyAll is the Restriction of a request on no known stream.
func denyAll(string) bool { return false }

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

// openStream computes a new stream's Restriction (Wiring.Restrict).
func (s *Server) openStream(ctx context.Context, key streamKey) error {
	if s.cfg.Restrict == nil {
		return nil
	}
	allow, who, err := s.cfg.Restrict(ctx)
	if err != nil {
		return err
	}
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	s.restrict.byStream[key] = &streamRestriction{allow: allow, who: who, judged: map[string]bool{}}
	return nil
}

// restrictRequest ties a stream's node to its Restriction, and counts
// (and logs once per stream) what it asks for and may not receive. A
// delta request without a node is given the stream's (go-control-plane
// fills it in only after this callback), so that every watch of the
// stream finds its Restriction.
func (s *Server) restrictRequest(key streamKey, node **core.Node, typeURL string, names []string) {
	if s.cfg.Restrict == nil {
		return
	}
	s.restrict.mu.Lock()
	r := s.restrict.byStream[key]
	if r == nil {
		s.restrict.mu.Unlock()
		return
	}
	switch {
	case *node == nil && r.node == nil:
		*node = &core.Node{} // what go-control-plane would use
		fallthrough
	case *node != nil && *node != r.node:
		if r.node != nil {
			delete(s.restrict.byNode, r.node)
		}
		r.node = *node
		s.restrict.byNode[r.node] = r
	case *node == nil:
		*node = r.node
	}
	if r.allow == nil {
		s.restrict.mu.Unlock()
		return
	}
	var denied []string
	judge := func(name string, ok bool) {
		key := typeURL + " " + name // CDS and EDS share names
		if r.judged[key] {
			return
		}
		if len(r.judged) < maxJudged {
			r.judged[key] = true
		}
		if !ok {
			denied = append(denied, name)
		}
	}
	for _, n := range names {
		if n == "*" {
			continue // a wildcard receives what it may see (watchRestrictedWildcard)
		}
		ns, ok := NamespaceOf(n)
		judge(n, ok && r.allow(ns))
	}
	first := len(denied) > 0 && !r.warned
	r.warned = r.warned || first
	s.restrict.mu.Unlock()
	if len(denied) == 0 {
		return
	}
	s.metrics.denied.WithLabelValues(typeLabel(typeURL)).Add(float64(len(denied)))
	if first {
		s.refusals.Warn(logDenied, "a client asked for resources its identity may not receive; it gets nothing of them",
			"identity", r.who, "node", (*node).GetId(), "type", typeLabel(typeURL), "denied", len(denied), "example", denied[0])
	}
}

func (s *Server) closeStream(key streamKey) {
	if s.cfg.Restrict == nil {
		return
	}
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	if r := s.restrict.byStream[key]; r != nil {
		if r.node != nil {
			delete(s.restrict.byNode, r.node)
		}
		delete(s.restrict.byStream, key)
	}
}

// restrictionOf returns the Restriction of the stream node's requests
// come on: nil allows everything; a node of no open stream gets nothing.
func (s *Server) restrictionOf(node *core.Node) Restriction {
	if s.cfg.Restrict == nil {
		return nil
	}
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	r := s.restrict.byNode[node]
	if r == nil {
		return denyAll
	}
	return r.allow
}

// restrictedSubscription is a subscription cut down to names (see
// restrict; a wildcard one, see watchRestrictedWildcard).
type restrictedSubscription struct {
	cache.Subscription
	names map[string]struct{}
}

// restrict cuts a subscription that names its resources down to those a
// Restriction allows.
func restrict(sub cache.Subscription, allow Restriction) cache.Subscription {
	names := map[string]struct{}{}
	for n := range sub.SubscribedResources() {
		if ns, ok := NamespaceOf(n); ok && allow(ns) {
			names[n] = struct{}{}
		}
	}
	return restrictedSubscription{Subscription: sub, names: names}
}

func (r restrictedSubscription) SubscribedResources() map[string]struct{} { return r.names }
func (r restrictedSubscription) IsWildcard() bool                         { return false }
