package xds

import (
	"slices"
	"strings"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/syncstatus"
	"github.com/navemesh/nave/traffic"
)

var (
	canary = registry.ServiceKey{Namespace: echo.Namespace, Name: "echo-canary"}
	ghost  = registry.ServiceKey{Namespace: echo.Namespace, Name: "ghost"}
)

// withTraffic is s with set as its traffic, normalized and checked.
func withTraffic(t testing.TB, s *registry.Shard, set traffic.Set) *registry.Shard {
	t.Helper()
	s.Traffic = set
	s.Normalize()
	if err := s.Traffic.Validate(); err != nil {
		t.Fatalf("test traffic: %v", err)
	}
	return s
}

func importOf(name string, weight int32) traffic.Backend {
	return traffic.Backend{Kind: traffic.BackendServiceImport, Name: name, Weight: weight}
}

// trafficSet is every feature of a route and a policy on echo: a gRPC
// canary by weight, a header match, a method match, an HTTPRoute with a
// timeout and a retry, and a backend no cluster exports.
func trafficSet() traffic.Set {
	return traffic.Set{
		Routes: []traffic.Route{
			{Kind: traffic.GRPCRoute, Name: "echo-split", Port: 8080, CreatedAt: time.Unix(1000, 0), Rules: []traffic.Rule{
				{
					Matches:  []traffic.Match{{Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-canary", Value: "yes"}}}},
					Backends: []traffic.Backend{importOf("echo-canary", 1)},
				},
				{
					Matches:  []traffic.Match{{Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "grpc.health.v1.Health", Method: "Watch"}}},
					Backends: []traffic.Backend{importOf("ghost", 1)},
				},
				{Backends: []traffic.Backend{importOf("echo", 80), importOf("echo-canary", 20)}},
			}},
			{Kind: traffic.HTTPRoute, Name: "echo-http", Port: 8080, CreatedAt: time.Unix(2000, 0), Rules: []traffic.Rule{{
				Matches: []traffic.Match{
					{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/api"}},
					{Path: &traffic.PathMatch{Type: traffic.RegularExpression, Value: "/v[0-9]+/.*"}},
				},
				Backends:   []traffic.Backend{importOf("echo", 1)},
				Timeout:    250 * time.Millisecond,
				Retry:      &traffic.Retry{Attempts: 2, HTTPCodes: []int32{503}},
				SetHeaders: []traffic.Header{{Name: "x-from", Value: "nave"}},
			}}},
		},
		Policy: &traffic.Policy{
			Name:         "echo",
			LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.LeastRequest, ChoiceCount: 3},
			Timeout:      time.Second,
			Retry:        &traffic.Retry{Attempts: 3, Backoff: 10 * time.Millisecond, GRPCCodes: []string{"unavailable"}},
		},
	}
}

func canaryPolicy() traffic.Set {
	return traffic.Set{Policy: &traffic.Policy{
		Name:         "canary",
		LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-user"},
		OutlierDetection: &traffic.OutlierDetection{
			Interval: time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionPercent: 50,
			FailurePercentage: &traffic.FailurePercentage{Threshold: 50, MinimumHosts: 2, RequestVolume: 10},
		},
		MaxRequests: 100,
	}}
}

func trafficRegistry(t *testing.T) *registry.Registry {
	t.Helper()
	r, _ := apply(t, registry.New(),
		withTraffic(t, shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
			ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))), trafficSet()),
		withTraffic(t, shard("west", canary, []registry.ServicePort{tcp("grpc", 8080)},
			ep("10.1.0.1", loc("r2", "z3"), ready, eport("grpc", 9090))), canaryPolicy()),
	)
	return r
}

func TestTrafficGolden(t *testing.T) {
	res := served(t, trafficRegistry(t), loc("r1", "z1"))
	golden(t, "traffic-routes", res.Routes)
	golden(t, "traffic-clusters", res.Clusters)
	golden(t, "traffic-endpoints", res.Assignments)
	for _, m := range res.Routes {
		if err := Validate(m); err != nil {
			t.Error(err)
		}
	}
	for _, m := range res.Clusters {
		if err := Validate(m); err != nil {
			t.Error(err)
		}
	}
}

// routeOf finds the published route configuration of svc's port 8080.
func routeOf(t *testing.T, res servedSet, k registry.ServiceKey) *route.RouteConfiguration {
	t.Helper()
	for _, rc := range res.Routes {
		if rc.GetName() == ListenerName(k, 8080) {
			return rc
		}
	}
	t.Fatalf("no route configuration for %s", k)
	return nil
}

func clusterNames(res servedSet) []string {
	var out []string
	for _, c := range res.Clusters {
		out = append(out, c.GetName())
	}
	return out
}

func TestTrafficRoutesFollowTheGatewayAPIPrecedence(t *testing.T) {
	rc := routeOf(t, served(t, trafficRegistry(t), loc("r1", "z1")), echo)
	var got []string
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		m := r.GetMatch()
		got = append(got, r.GetName()+" "+m.GetPath()+m.GetPrefix()+m.GetSafeRegex().GetRegex())
	}
	// GRPCRoute first: the exact method (longest), then the header match
	// and the catch-all (no method: ordered by header count); then the
	// HTTPRoute's prefix, as an exact path and a prefix, then its regex.
	want := []string{
		"echo-split /grpc.health.v1.Health/Watch",
		"echo-split /",
		"echo-split /",
		"echo-http /api",
		"echo-http /api/",
		"echo-http /v[0-9]+/.*",
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes in order:\n%q\nwant\n%q", got, want)
	}
	if h := rc.GetVirtualHosts()[0].GetRoutes()[1].GetMatch().GetHeaders(); len(h) != 1 || h[0].GetName() != "x-canary" {
		t.Errorf("second route's headers = %v, want the x-canary match", h)
	}
}

func TestTrafficHashPolicyFollowsTheBackendsPolicy(t *testing.T) {
	r := trafficRegistry(t)
	rc := routeOf(t, served(t, r, loc("r1", "z1")), echo)
	split := rc.GetVirtualHosts()[0].GetRoutes()[2].GetRoute() // 80/20 to echo and the ring-hashed canary
	if hp := split.GetHashPolicy(); len(hp) != 1 || hp[0].GetHeader().GetHeaderName() != "x-user" {
		t.Fatalf("hash policy = %v, want the canary's x-user header", hp)
	}
	// The canary's policy changes to round robin: echo's routes are built
	// again, without the hash policy, though echo itself did not change.
	srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	srv.Update(r, registry.Diff{})
	plain := shard("west", canary, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.1", loc("r2", "z3"), ready, eport("grpc", 9090)))
	r2, d := apply(t, r, plain)
	srv.Update(r2, d)
	srv.stateMu.Lock()
	defer srv.stateMu.Unlock()
	for _, rc := range publishedOf[*route.RouteConfiguration](t, srv.rds) {
		if rc.GetName() != ListenerName(echo, 8080) {
			continue
		}
		if hp := rc.GetVirtualHosts()[0].GetRoutes()[2].GetRoute().GetHashPolicy(); len(hp) != 0 {
			t.Errorf("after the canary dropped ring hash, echo's split still hashes: %v", hp)
		}
	}
}

func TestTrafficBackendNoClusterExportsIsAPlaceholder(t *testing.T) {
	r := trafficRegistry(t)
	srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	srv.Update(r, registry.Diff{})
	eds := srv.edsCache(nodeAt(loc("r1", "z1"), ""))
	state := func() servedSet {
		srv.stateMu.Lock()
		defer srv.stateMu.Unlock()
		return servedSet{
			Clusters:    publishedOf[*cluster.Cluster](t, srv.cds),
			Assignments: publishedOf[*endpoint.ClusterLoadAssignment](t, eds),
		}
	}
	ghostCluster := ClusterName(ghost, 8080)
	// ghost is named by a route but exported by no one: its Cluster is
	// published, with an empty assignment, so clients fail at once.
	got := state()
	if !slices.Contains(clusterNames(got), ghostCluster) {
		t.Fatalf("clusters %v, want the placeholder %s", clusterNames(got), ghostCluster)
	}
	if cla := assignmentOf(got, ghostCluster); cla == nil || len(cla.GetEndpoints()) != 0 {
		t.Fatalf("placeholder assignment = %v, want an empty one", cla)
	}
	// Exported: its own Cluster and endpoints take the placeholder's place.
	r, d := apply(t, r, shard("west", ghost, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.9.9", loc("r2", "z3"), ready, eport("grpc", 9090))))
	srv.Update(r, d)
	if cla := assignmentOf(state(), ghostCluster); cla == nil || len(cla.GetEndpoints()) != 1 {
		t.Fatalf("exported ghost's assignment = %v, want its endpoint", cla)
	}
	// No longer exported while still named: the placeholder comes back.
	r, d = r.Apply(registry.Change{Cluster: "west", Removes: []registry.ServiceKey{ghost}})
	srv.Update(r, d)
	got = state()
	if !slices.Contains(clusterNames(got), ghostCluster) {
		t.Fatalf("after ghost left, clusters %v, want the placeholder back", clusterNames(got))
	}
	if cla := assignmentOf(got, ghostCluster); cla == nil || len(cla.GetEndpoints()) != 0 {
		t.Fatalf("placeholder assignment = %v, want an empty one", cla)
	}
	// No route names it any more: it goes.
	plain := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)))
	r, d = apply(t, r, plain)
	srv.Update(r, d)
	got = state()
	if slices.Contains(clusterNames(got), ghostCluster) || assignmentOf(got, ghostCluster) != nil {
		t.Fatalf("no route names ghost, yet %s is still published: %v", ghostCluster, clusterNames(got))
	}
}

func assignmentOf(res servedSet, name string) *endpoint.ClusterLoadAssignment {
	for _, cla := range res.Assignments {
		if cla.GetClusterName() == name {
			return cla
		}
	}
	return nil
}

func TestLocalityPolicyMergesALocalityWithinAPriority(t *testing.T) {
	// Two clusters' endpoints in one locality, ranked alike for a client of
	// a third cluster: one locality in the priority (grpc-go refuses a
	// locality twice in one priority), weighted by both.
	svcShards := []*registry.Shard{
		shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))),
		shard("west", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)),
			ep("10.1.0.2", loc("r1", "z2"), ready, eport("grpc", 9090))),
	}
	policy := traffic.Set{Policy: &traffic.Policy{Name: "echo", Locality: &traffic.LocalityPolicy{
		FailoverPriority: []string{traffic.LabelCluster, traffic.LabelZone}}}}
	svcShards[0] = withTraffic(t, svcShards[0], policy)
	r, _ := apply(t, registry.New(), svcShards...)
	svc := r.Service(echo)
	pe := newPolicyEndpoints(ClusterName(echo, 8080), svc, tcp("grpc", 8080), localityPolicy(svc), newTopology(registry.Networks{}))
	for _, tc := range []struct {
		cluster registry.ClusterID
		want    [][]string // per priority, the localities' endpoints
	}{
		// north shares no cluster: one priority... ranked by what it does
		// not share first (the cluster), so every endpoint ranks alike.
		{"north", [][]string{{"10.0.0.1", "10.1.0.1", "10.1.0.2"}}},
		// east: its own cluster, then the rest (west's zone z1 before z2
		// only if the cluster were shared: it is not).
		{"east", [][]string{{"10.0.0.1"}, {"10.1.0.1", "10.1.0.2"}}},
		// west: its own zone z1 in its cluster, its cluster's z2, then east.
		{"west", [][]string{{"10.1.0.1"}, {"10.1.0.2"}, {"10.0.0.1"}}},
	} {
		cla, _ := pe.forClient(Client{Cluster: tc.cluster, Locality: loc("r1", "z1")}, newTopology(registry.Networks{}))
		if err := Validate(cla); err != nil {
			t.Errorf("client of %s: %v", tc.cluster, err)
		}
		var got [][]string
		for _, le := range cla.GetEndpoints() {
			for int(le.GetPriority()) >= len(got) {
				got = append(got, nil)
			}
			for _, e := range le.GetLbEndpoints() {
				got[le.GetPriority()] = append(got[le.GetPriority()], e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
			}
		}
		for _, p := range got {
			slices.Sort(p)
		}
		if !slices.EqualFunc(got, tc.want, slices.Equal) {
			t.Errorf("client of %s: priorities %v, want %v", tc.cluster, got, tc.want)
		}
	}
}

// translatedRecorder is a Tracer that records what Translated is told.
type translatedRecorder struct {
	traced registry.ServiceKey
	got    []string // typeURL + " " + resources
}

func (r *translatedRecorder) Tracing(k registry.ServiceKey) bool { return k == r.traced }
func (r *translatedRecorder) Translated(_ registry.ServiceKey, _ uint64, typeURL string, resources []string, _ map[string]uint64) {
	r.got = append(r.got, typeURL+" "+strings.Join(resources, ","))
}
func (r *translatedRecorder) Collecting() bool { return false }
func (r *translatedRecorder) Pushed(syncstatus.Stream, string, string, string, string, []string, syncstatus.Sent) {
}
func (r *translatedRecorder) Answered(syncstatus.Stream, string, string, bool) {}
func (r *translatedRecorder) Closed(syncstatus.Stream)                         {}

// A route change of a traced service is traced as what carries it: its
// route configuration (RDS), which the convergence trace then follows to
// every client's ACK like an endpoint change's assignments.
func TestTrafficRouteChangeIsTracedAsRDS(t *testing.T) {
	rec := &translatedRecorder{traced: echo}
	srv := NewServer(DefaultConfig(), Wiring{Tracer: rec}, nil, nil)
	base := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)))
	r, _ := apply(t, registry.New(), base, shard("west", canary, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.1", loc("r2", "z3"), ready, eport("grpc", 9090))))
	srv.Update(r, registry.Diff{})
	rec.got = nil
	routed := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)))
	r, d := apply(t, r, withTraffic(t, routed, traffic.Set{Routes: []traffic.Route{{Kind: traffic.GRPCRoute, Name: "split", Port: 8080,
		Rules: []traffic.Rule{{Backends: []traffic.Backend{importOf("echo", 80), importOf("echo-canary", 20)}}}}}}))
	srv.Update(r, d)
	want := []string{resource.RouteType + " " + ListenerName(echo, 8080)}
	if !slices.Equal(rec.got, want) {
		t.Errorf("a route change traced as %q, want %q", rec.got, want)
	}
}
