package xds

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// servedNow is what srv publishes (for the r1/z1 group), read under stateMu.
func servedNow(t *testing.T, srv *Server) servedSet {
	t.Helper()
	eds := srv.edsCache(nodeAt(loc("r1", "z1"), ""))
	srv.stateMu.Lock()
	defer srv.stateMu.Unlock()
	return servedSet{
		Listeners:   publishedOf[*listener.Listener](t, srv.lds),
		Routes:      publishedOf[*route.RouteConfiguration](t, srv.rds),
		Clusters:    publishedOf[*cluster.Cluster](t, srv.cds),
		Assignments: publishedOf[*endpoint.ClusterLoadAssignment](t, eds),
	}
}

// namedClusters lists every cluster a route configuration sends requests
// to, weighted clusters included (CheckConsistent looks only at
// RouteAction.cluster).
func namedClusters(rc *route.RouteConfiguration) []string {
	var out []string
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			a := r.GetRoute()
			if c := a.GetCluster(); c != "" {
				out = append(out, c)
			}
			for _, wc := range a.GetWeightedClusters().GetClusters() {
				out = append(out, wc.GetName())
			}
		}
	}
	return out
}

// checkNoDangling: every listener's route configuration and every cluster a
// route names is published, and every published cluster has an assignment.
func checkNoDangling(t *testing.T, got servedSet) {
	t.Helper()
	routes := map[string]bool{}
	for _, rc := range got.Routes {
		routes[rc.GetName()] = true
	}
	for _, l := range got.Listeners {
		if !routes[l.GetName()] {
			t.Errorf("listener %s is published, its route configuration is not", l.GetName())
		}
	}
	clusters := clusterNames(got)
	for _, rc := range got.Routes {
		for _, c := range namedClusters(rc) {
			if !slices.Contains(clusters, c) {
				t.Errorf("route configuration %s names cluster %s, which is not published", rc.GetName(), c)
			}
		}
	}
	for _, c := range clusters {
		if assignmentOf(got, c) == nil {
			t.Errorf("cluster %s is published without an assignment", c)
		}
	}
}

func emptyRegexRoute(kind string) traffic.Set {
	m := traffic.Match{Path: &traffic.PathMatch{Type: traffic.RegularExpression, Value: ""}}
	if kind == "header" {
		m = traffic.Match{Headers: []traffic.HeaderMatch{{Type: traffic.RegularExpression, Name: "x-any", Value: ""}}}
	}
	return traffic.Set{Routes: []traffic.Route{{Kind: traffic.HTTPRoute, Name: "echo-http", Port: 8080, CreatedAt: time.Unix(1000, 0),
		Rules: []traffic.Rule{{Matches: []traffic.Match{m}, Backends: []traffic.Backend{importOf("echo", 1)}}}}}}
}

// unvalidated applies a shard carrying set without validating it: what a
// route configuration Envoy's rules refuse (an empty regular expression,
// which traffic.Validate now refuses too) does to the server.
func unvalidated(t *testing.T, r *registry.Registry, s *registry.Shard, set traffic.Set) (*registry.Registry, registry.Diff) {
	t.Helper()
	s.Traffic = set
	s.Normalize()
	return r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
}

// A route configuration the server refuses (Envoy's RegexMatcher rule:
// regex min_len 1) must not leave a listener naming routes that never come:
// the port is served as if it had no routes.
func TestEmptyRegexLeavesListenerWithoutRoutes(t *testing.T) {
	for _, kind := range []string{"path", "header"} {
		t.Run(kind, func(t *testing.T) {
			set := emptyRegexRoute(kind)
			if err := set.Validate(); err == nil {
				t.Fatalf("traffic.Validate takes an empty regular expression")
			}
			r, _ := unvalidated(t, registry.New(), shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
				ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))), set)
			srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
			srv.Update(r, registry.Diff{})
			checkNoDangling(t, servedNow(t, srv))
		})
	}
}

// The same refusal on a later Update must not leave the old route
// configuration published while the backend index moves on (the old
// routes would name a placeholder that was deleted).
func TestRefusedRouteConfigurationDropsAPlaceholderStillNamed(t *testing.T) {
	toGhost := traffic.Set{Routes: []traffic.Route{{Kind: traffic.GRPCRoute, Name: "echo-ghost", Port: 8080, CreatedAt: time.Unix(1000, 0),
		Rules: []traffic.Rule{{Backends: []traffic.Backend{importOf("ghost", 1)}}}}}}
	r, _ := apply(t, registry.New(),
		withTraffic(t, shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
			ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))), toGhost))
	srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	srv.Update(r, registry.Diff{})
	checkNoDangling(t, servedNow(t, srv))

	r, d := unvalidated(t, r, shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))), emptyRegexRoute("path"))
	srv.Update(r, d)
	got := servedNow(t, srv)
	checkNoDangling(t, got)
	if names := namedClusters(routeOf(t, got, echo)); slices.Contains(names, ClusterName(ghost, 8080)) {
		t.Errorf("echo's published routes still send to ghost (%v) though its traffic no longer names it", names)
	}
}

// randomWorld is a small random world of services with routes and policies.
type randomWorld struct {
	rng    *rand.Rand
	noHash bool // no ring hash: leaves out the stale hash policy finding
}

var reviewKeys = []registry.ServiceKey{
	{Namespace: "default", Name: "a"}, {Namespace: "default", Name: "b"},
	{Namespace: "default", Name: "c"}, {Namespace: "default", Name: "d"},
}

func (w randomWorld) set(self registry.ServiceKey) traffic.Set {
	var set traffic.Set
	if w.rng.IntN(3) == 0 {
		algos := []traffic.Algorithm{traffic.RoundRobin, traffic.RingHash, traffic.LeastRequest, traffic.WeightedRoundRobin}
		a := algos[w.rng.IntN(len(algos))]
		if w.noHash && a == traffic.RingHash {
			a = traffic.RoundRobin
		}
		lb := &traffic.LoadBalancer{Algorithm: a}
		if a == traffic.RingHash && w.rng.IntN(2) == 0 {
			lb.HashHeader = fmt.Sprintf("x-h%d", w.rng.IntN(2))
		}
		set.Policy = &traffic.Policy{Name: self.Name, LoadBalancer: lb}
	}
	if w.rng.IntN(2) == 0 {
		var backends []traffic.Backend
		for range 1 + w.rng.IntN(3) {
			b := importOf(reviewKeys[w.rng.IntN(len(reviewKeys))].Name, int32(1+w.rng.IntN(3)))
			b.Port = []int32{0, 80, 81}[w.rng.IntN(3)]
			backends = append(backends, b)
		}
		slices.SortFunc(backends, func(x, y traffic.Backend) int {
			return cmpBackend(x, y)
		})
		backends = slices.CompactFunc(backends, func(x, y traffic.Backend) bool { return x.Name == y.Name && x.Port == y.Port })
		set.Routes = []traffic.Route{{Kind: traffic.GRPCRoute, Name: "r", Port: []int32{0, 80}[w.rng.IntN(2)], CreatedAt: time.Unix(1000, 0),
			Rules: []traffic.Rule{{Backends: backends}}}}
	}
	return set
}

func cmpBackend(x, y traffic.Backend) int {
	if x.Name != y.Name {
		if x.Name < y.Name {
			return -1
		}
		return 1
	}
	return int(x.Port - y.Port)
}

func (w randomWorld) shard(k registry.ServiceKey) *registry.Shard {
	var ports []registry.ServicePort
	var eports []registry.EndpointPort
	for _, p := range []int32{80, 81} {
		if w.rng.IntN(3) != 0 {
			ports = append(ports, tcp(fmt.Sprintf("p%d", p), p))
			eports = append(eports, eport(fmt.Sprintf("p%d", p), 9000+p))
		}
	}
	if len(ports) == 0 {
		ports = append(ports, tcp("p80", 80))
		eports = append(eports, eport("p80", 9080))
	}
	s := shard("east", k, ports, ep("10.0.0.1", loc("r1", "z1"), ready, eports...))
	s.Traffic = w.set(k)
	s.Normalize()
	return s
}

// Whatever sequence of changes, an incrementally updated server publishes
// what a fresh server publishes for the same registry, and nothing dangles.
func TestIncrementalTrafficMatchesAFreshServer(t *testing.T) {
	t.Run("with ring hash", func(t *testing.T) { incrementalMatchesFresh(t, false) })
	t.Run("without ring hash", func(t *testing.T) { incrementalMatchesFresh(t, true) })
}

func incrementalMatchesFresh(t *testing.T, noHash bool) {
	for seed := range uint64(300) {
		w := randomWorld{rng: rand.New(rand.NewPCG(seed, 7)), noHash: noHash}
		r := registry.New()
		srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
		srv.Update(r, registry.Diff{})
		for step := range 12 {
			k := reviewKeys[w.rng.IntN(len(reviewKeys))]
			var d registry.Diff
			if w.rng.IntN(4) == 0 {
				r, d = r.Apply(registry.Change{Cluster: "east", Removes: []registry.ServiceKey{k}})
			} else {
				s := w.shard(k)
				if err := s.Validate(registry.DefaultLimits()); err != nil {
					t.Fatalf("seed %d: test shard: %v", seed, err)
				}
				r, d = r.Apply(registry.Change{Cluster: "east", Upserts: []*registry.Shard{s}})
			}
			srv.Update(r, d)
			got := servedNow(t, srv)
			fresh := NewServer(DefaultConfig(), Wiring{}, nil, nil)
			fresh.Update(r, registry.Diff{})
			want := servedNow(t, fresh)
			if diff := diffServed(got, want); diff != "" {
				t.Fatalf("seed %d step %d: the incremental server differs from a fresh one: %s", seed, step, diff)
			}
			checkNoDangling(t, got)
			if t.Failed() {
				t.Fatalf("seed %d step %d", seed, step)
			}
		}
	}
}

func diffServed(got, want servedSet) string {
	type named interface {
		proto.Message
		GetName() string
	}
	cmp := func(kind string, g, w []proto.Message, name func(proto.Message) string) string {
		gm := map[string]proto.Message{}
		for _, m := range g {
			gm[name(m)] = m
		}
		wm := map[string]proto.Message{}
		for _, m := range w {
			wm[name(m)] = m
		}
		for n, m := range wm {
			if o, ok := gm[n]; !ok {
				return fmt.Sprintf("%s %s missing", kind, n)
			} else if !proto.Equal(o, m) {
				return fmt.Sprintf("%s %s differs:\n got %v\nwant %v", kind, n, o, m)
			}
		}
		for n := range gm {
			if _, ok := wm[n]; !ok {
				return fmt.Sprintf("%s %s extra", kind, n)
			}
		}
		return ""
	}
	nameOf := func(m proto.Message) string {
		if n, ok := m.(named); ok {
			return n.GetName()
		}
		return m.(*endpoint.ClusterLoadAssignment).GetClusterName()
	}
	conv := func(xs any) []proto.Message {
		var out []proto.Message
		switch v := xs.(type) {
		case []*listener.Listener:
			for _, x := range v {
				out = append(out, x)
			}
		case []*route.RouteConfiguration:
			for _, x := range v {
				out = append(out, x)
			}
		case []*cluster.Cluster:
			for _, x := range v {
				out = append(out, x)
			}
		case []*endpoint.ClusterLoadAssignment:
			for _, x := range v {
				out = append(out, x)
			}
		}
		return out
	}
	for _, c := range []struct {
		kind string
		g, w any
	}{
		{"listener", got.Listeners, want.Listeners}, {"routes", got.Routes, want.Routes},
		{"cluster", got.Clusters, want.Clusters}, {"assignment", got.Assignments, want.Assignments},
	} {
		if d := cmp(c.kind, conv(c.g), conv(c.w), nameOf); d != "" {
			return d
		}
	}
	return ""
}

// A locality group created after a placeholder exists gets its assignment
// (groups.go builds a new group's EDS cache from s.endpoints).
func TestNewGroupGetsThePlaceholder(t *testing.T) {
	r := trafficRegistry(t)
	srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	srv.Update(r, registry.Diff{})
	eds := srv.edsCache(nodeAt(loc("r9", "z9"), ""))
	srv.stateMu.Lock()
	got := servedSet{Assignments: publishedOf[*endpoint.ClusterLoadAssignment](t, eds)}
	srv.stateMu.Unlock()
	if cla := assignmentOf(got, ClusterName(ghost, 8080)); cla == nil {
		t.Errorf("a group created after the placeholder has no assignment for it")
	}
}

// Request headers a rule sets are copied into every xDS route of the rule
// (one per match, two per path prefix): a set within MaxSetBytes (64 KiB)
// could become a route configuration of several MiB, more than grpc-go's
// default 4 MiB receive limit on its ADS stream (grpc-go ignores
// request_headers_to_add, but must receive the resource). Validation
// refuses it (MaxRouteBytes), and the largest set it takes stays small.
func TestRouteConfigurationSizeIsBounded(t *testing.T) {
	var matches []traffic.Match
	for i := range traffic.MaxMatches {
		matches = append(matches, traffic.Match{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: fmt.Sprintf("/p%d", i)}})
	}
	var headers []traffic.Header
	for i := range 14 {
		headers = append(headers, traffic.Header{Name: fmt.Sprintf("x-h%d", i), Value: fmt.Sprintf("%04000d", i)})
	}
	set := traffic.Set{Routes: []traffic.Route{{Kind: traffic.HTTPRoute, Name: "big", Port: 8080, CreatedAt: time.Unix(1000, 0),
		Rules: []traffic.Rule{{Matches: matches, Backends: []traffic.Backend{importOf("echo", 1)}, SetHeaders: headers}}}}}
	set.Normalize()
	if set.Validate() == nil {
		t.Fatalf("a set of %d matches, each with 14 headers of 4,000 bytes set, passes validation", len(matches))
	}
	for set.Validate() != nil { // the largest that passes
		set.Routes[0].Rules[0].Matches = set.Routes[0].Rules[0].Matches[:len(set.Routes[0].Rules[0].Matches)-1]
	}
	svc := &registry.Service{Key: echo, Traffic: set}
	rc := RouteConfiguration(svc, tcp("grpc", 8080), nil)
	if err := Validate(rc); err != nil {
		t.Fatalf("route configuration: %v", err)
	}
	n := proto.Size(rc)
	t.Logf("a set of %d held bytes becomes a route configuration of %d bytes", set.HeldBytes(), n)
	if n > 4<<20 {
		t.Errorf("route configuration of %d bytes, more than grpc-go's default 4 MiB receive limit, from a set of %d bytes", n, set.HeldBytes())
	}
}

// The same, with a real grpc-go client: the largest route configuration
// validation lets through reaches it.
func TestLargeRouteConfigurationReachesAGRPCClient(t *testing.T) {
	g := newTrafficRig(t)
	a := xdstest.StartBackend(t, "a", "127.0.0.1")
	matches := []traffic.Match{{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/grpc.health.v1.Health"}}}
	for i := range traffic.MaxMatches - 1 {
		matches = append(matches, traffic.Match{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: fmt.Sprintf("/p%d", i)}})
	}
	var headers []traffic.Header
	for i := range 14 {
		headers = append(headers, traffic.Header{Name: fmt.Sprintf("x-h%d", i), Value: fmt.Sprintf("%04000d", i)})
	}
	set := traffic.Set{Routes: []traffic.Route{{Kind: traffic.HTTPRoute, Name: "big", Port: 8080, CreatedAt: time.Unix(1000, 0),
		Rules: []traffic.Rule{{Matches: matches, Backends: []traffic.Backend{importOf("echo", 1)}, SetHeaders: headers}}}}}
	s := backendShard("east", echo, a, set)
	for s.Traffic.Validate() != nil { // the largest that passes
		s.Traffic.Routes[0].Rules[0].Matches = s.Traffic.Routes[0].Rules[0].Matches[:len(s.Traffic.Routes[0].Rules[0].Matches)-1]
	}
	g.apply(s)
	ctx, cancel := context.WithTimeout(g.ctx, 10*time.Second)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		var who string
		if who, err = g.call(ctx); err == nil && who == "a" {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("the client never reached its backend through a route configuration built from a valid set: %v", err)
}

// A shard with MaxPorts ports and a route attached to every port whose
// backends name the request's port would make a placeholder Cluster, and an
// assignment in every locality group, per backend name per port: the
// shard's validation bounds them (traffic.MaxBackendRefs).
func TestPlaceholdersPerShardAreBounded(t *testing.T) {
	var routes []traffic.Route
	n := 0
	for i := range traffic.MaxRoutes {
		var rules []traffic.Rule
		for range traffic.MaxRules {
			var backends []traffic.Backend
			for range traffic.MaxBackends {
				backends = append(backends, importOf(fmt.Sprintf("g%d", n), 1))
				n++
			}
			rules = append(rules, traffic.Rule{Backends: backends})
		}
		routes = append(routes, traffic.Route{Kind: traffic.GRPCRoute, Name: fmt.Sprintf("r%d", i), CreatedAt: time.Unix(1000, 0), Rules: rules})
	}
	set := traffic.Set{Routes: routes}
	var ports []registry.ServicePort
	var eports []registry.EndpointPort
	for p := range int32(registry.DefaultLimits().MaxPorts) {
		ports = append(ports, tcp(fmt.Sprintf("p%d", p), 8000+p))
		eports = append(eports, eport(fmt.Sprintf("p%d", p), 9000+p))
	}
	s := shard("east", echo, ports, ep("10.0.0.1", loc("r1", "z1"), ready, eports...))
	for { // the largest the shard's validation passes
		s.Traffic = set
		s.Normalize()
		if s.Validate(registry.DefaultLimits()) == nil {
			break
		}
		last := &set.Routes[len(set.Routes)-1]
		if len(last.Rules) > 1 {
			last.Rules = last.Rules[:len(last.Rules)-1]
		} else {
			set.Routes = set.Routes[:len(set.Routes)-1]
		}
	}
	r, _ := apply(t, registry.New(), s)
	srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	start := time.Now()
	srv.Update(r, registry.Diff{})
	srv.stateMu.Lock()
	held := len(srv.backends.placeholders)
	srv.stateMu.Unlock()
	t.Logf("one shard (%d routes, %d traffic bytes held, %d ports): %d placeholder clusters in %v", len(set.Routes), set.HeldBytes(), len(ports), held, time.Since(start))
	if held > 10*len(ports) {
		t.Errorf("one valid shard makes %d placeholder clusters (each with an assignment in every locality group)", held)
	}
}

// The Gateway API's PathPrefix ignores a trailing "/": "/abc/" matches
// "/abc" as "/abc" does.
func TestPathPrefixIgnoresATrailingSlash(t *testing.T) {
	got := routeMatches(&traffic.Match{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/abc/"}})
	matchesABC := false
	for _, m := range got {
		if m.GetPath() == "/abc" || (m.GetPrefix() != "" && len(m.GetPrefix()) <= len("/abc") && "/abc"[:len(m.GetPrefix())] == m.GetPrefix()) {
			matchesABC = true
		}
	}
	if !matchesABC {
		t.Errorf("PathPrefix %q translates to %v, which does not match %q", "/abc/", got, "/abc")
	}
}
