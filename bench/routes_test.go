package main

import (
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

func TestTrafficPlan(t *testing.T) {
	const clusters, services = 4, 50
	p, err := newTrafficPlan(clusters, services, 20, 30, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.routed) != 20 || len(p.policied) != 30 {
		t.Fatalf("%d routed, %d with a policy; want 20 and 30", len(p.routed), len(p.policied))
	}
	again, _ := newTrafficPlan(clusters, services, 20, 30, 7)
	other, _ := newTrafficPlan(clusters, services, 20, 30, 8)
	if !slices.Equal(p.routed, again.routed) || !slices.Equal(p.canary, again.canary) || !slices.Equal(p.policyOwner, again.policyOwner) {
		t.Error("the same seed made another plan")
	}
	if slices.Equal(p.routed, other.routed) && slices.Equal(p.policied, other.policied) {
		t.Error("another seed made the same plan")
	}
	// The clusters take turns carrying routes and policies.
	routesBy, policiesBy := make([]int, clusters), make([]int, clusters)
	for s := range services {
		if c := p.routeOwner[s]; c >= 0 {
			routesBy[c]++
			if cn := p.canary[s]; cn == s || cn < 0 || cn >= services {
				t.Errorf("%s splits with service %d", serviceKey(s), cn)
			}
		} else if p.isRouted(s) || p.canary[s] != -1 {
			t.Errorf("%s has no route but a canary %d", serviceKey(s), p.canary[s])
		}
		if c := p.policyOwner[s]; c >= 0 {
			policiesBy[c]++
		}
	}
	if !slices.Equal(routesBy, []int{5, 5, 5, 5}) || slices.Min(policiesBy) < 7 || slices.Max(policiesBy) > 8 {
		t.Errorf("routes per cluster %v, policies per cluster %v: not spread", routesBy, policiesBy)
	}
	// Every set any cluster says about any service is valid.
	for c := range clusters {
		for s := range services {
			set := p.set(c, s, maxRouteWeight)
			if err := set.Validate(); err != nil {
				t.Fatalf("cluster %d, %s: %v", c, serviceKey(s), err)
			}
			if (len(set.Routes) > 0) != (p.routeOwner[s] == c) || (set.Policy != nil) != (p.policyOwner[s] == c) {
				t.Fatalf("cluster %d, %s: %+v", c, serviceKey(s), set)
			}
		}
	}
	for _, bad := range [][4]int{{2, 10, 11, 0}, {2, 10, 0, 11}, {2, 1, 1, 0}, {2, 10, -1, 0}} {
		if _, err := newTrafficPlan(bad[0], bad[1], bad[2], bad[3], 1); err == nil {
			t.Errorf("plan %v accepted", bad)
		}
	}
	if _, err := newTrafficPlan(2, 1, 0, 1, 1); err != nil {
		t.Errorf("a policy on the only service: %v", err)
	}
}

// TestRouteChangesReachTheRouteConfiguration builds the world's shards into
// a registry, as the hub merges them, and reads each route's marker off
// the RouteConfiguration the hub's translation makes: the initial split,
// then each route change's.
func TestRouteChangesReachTheRouteConfiguration(t *testing.T) {
	sc := scaleConfig{Clusters: 3, Services: 12, Endpoints: 2, Rate: 1000, Duration: time.Second, Routes: 6, Policies: 6, RouteChanges: 1}
	l := newLedger(time.Now(), sc.Clusters, sc.Services)
	w, err := newWorld(sc, l, 3, netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.New()
	apply := func(c int) {
		t.Helper()
		cl := w.clusters[c]
		for _, sh := range cl.shards {
			if err := sh.Validate(registry.DefaultLimits()); err != nil {
				t.Fatalf("cluster %s: %v", cl.id, err)
			}
		}
		reg, _ = reg.Apply(registry.Change{Cluster: cl.id, Replace: true, Upserts: slices.Clone(cl.shards)})
	}
	for c := range sc.Clusters {
		apply(c)
	}
	marker := func(s int) (uint64, bool) {
		t.Helper()
		svc := reg.Service(serviceKey(s))
		if len(svc.Conflicts) > 0 {
			t.Fatalf("%s: conflicts %v", svc.Key, svc.Conflicts)
		}
		if (svc.Traffic.Policy != nil) != (w.plan.policyOwner[s] >= 0) {
			t.Fatalf("%s: policy %+v, planned in cluster %d", svc.Key, svc.Traffic.Policy, w.plan.policyOwner[s])
		}
		rc := xds.RouteConfiguration(svc, servicePorts[0], reg.Service)
		if rc.GetName() != w.names().listener[s] {
			t.Fatalf("%s: route configuration %q", svc.Key, rc.GetName())
		}
		return routeMarker(rc, xds.ClusterName(serviceKey(s), servicePort))
	}
	for s := range sc.Services {
		fp, ok := marker(s)
		if ok != w.plan.isRouted(s) {
			t.Fatalf("%s: marker found %v, routed %v", serviceKey(s), ok, w.plan.isRouted(s))
		}
		if ok && (fp != initialRouteWeight || fp != w.routes.latest(0, s)) {
			t.Fatalf("%s: marker %d, want %d (ledger %d)", serviceKey(s), fp, initialRouteWeight, w.routes.latest(0, s))
		}
	}
	endpointChanges := l.changes.Load()
	for i := range 50 {
		c, err := w.routeChange()
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		apply(c)
		for _, s := range w.plan.routed {
			fp, ok := marker(s)
			if !ok || fp != w.routes.latest(0, s) || fp != uint64(w.weights[s]) {
				t.Fatalf("change %d, %s: marker %d (%v), ledger %d", i, serviceKey(s), fp, ok, w.routes.latest(0, s))
			}
			if fp < minRouteWeight || fp > maxRouteWeight {
				t.Fatalf("change %d, %s: weight %d out of range", i, serviceKey(s), fp)
			}
		}
	}
	if got := w.routes.changes.Load(); got != 50 {
		t.Errorf("%d route changes recorded, want 50", got)
	}
	if l.changes.Load() != endpointChanges {
		t.Error("route changes recorded endpoint changes")
	}
	// A client sees the canary's Cluster too (the header rule and the split).
	s := w.plan.routed[0]
	rc := xds.RouteConfiguration(reg.Service(serviceKey(s)), servicePorts[0], reg.Service)
	var clusters []string
	for _, rt := range rc.GetVirtualHosts()[0].GetRoutes() {
		clusters = append(clusters, rt.GetRoute().GetCluster())
		for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
			clusters = append(clusters, wc.GetName())
		}
	}
	if want := xds.ClusterName(serviceKey(w.plan.canary[s]), servicePort); !slices.Contains(clusters, want) {
		t.Errorf("%s's routes name %v, not the canary %s", serviceKey(s), clusters, want)
	}
	// An endpoint change of the route's owner keeps the route.
	owner := w.plan.routeOwner[s]
	if _, err := w.randomChange(owner, s); err != nil {
		t.Fatal(err)
	}
	apply(owner)
	if fp, ok := marker(s); !ok || fp != w.routes.latest(0, s) {
		t.Errorf("an endpoint change lost the route: marker %d (%v)", fp, ok)
	}
}

// names is the xDS names of the world's services.
func (w *world) names() *resourceNames { return newResourceNames(w.services) }

func TestRouteTurn(t *testing.T) {
	cycle := 2 * time.Second
	count := func(fraction float64) int {
		n := 0
		for i := range 1000 {
			if routeTurn(time.Duration(i)*20*time.Millisecond, cycle, fraction) {
				n++
			}
		}
		return n
	}
	for _, tc := range []struct {
		fraction float64
		want     int
	}{{0, 0}, {1, 1000}, {0.5, 500}, {0.25, 250}, {-1, 0}, {2, 1000}} {
		if got := count(tc.fraction); got != tc.want {
			t.Errorf("fraction %v: %d route turns of 1000, want %d", tc.fraction, got, tc.want)
		}
	}
	// Each cycle starts with its route changes.
	if !routeTurn(0, cycle, 0.5) || !routeTurn(2*time.Second, cycle, 0.5) || routeTurn(time.Second, cycle, 0.5) || routeTurn(1999*time.Millisecond, cycle, 0.5) {
		t.Error("a cycle does not start with its route share")
	}
	for _, tc := range []struct{ d, want time.Duration }{{20 * time.Second, 2 * time.Second}, {60 * time.Second, 5 * time.Second}, {5 * time.Second, time.Second}} {
		if got := routeCycle(tc.d); got != tc.want {
			t.Errorf("routeCycle(%v) = %v, want %v", tc.d, got, tc.want)
		}
	}
}

func TestAttributeCPU(t *testing.T) {
	marks := []cpuMark{{true, 10}, {false, 10.5}, {true, 12.5}, {false, 13}}
	e, r, seg := attributeCPU(marks, 15.25)
	if math.Abs(e-4.25) > 1e-9 || math.Abs(r-1) > 1e-9 || seg != [2]int{2, 2} {
		t.Errorf("endpoint %v s, route %v s, segments %v; want 4.25, 1, [2 2]", e, r, seg)
	}
	c := cpuByKindOf(marks, 15.25, 85, 20)
	if math.Abs(c.EndpointCPUMsPerChange-50) > 1e-9 || math.Abs(c.RouteCPUMsPerChange-50) > 1e-9 {
		t.Errorf("per change: %+v", c)
	}
	// Route changes only: one segment, no endpoint changes.
	c = cpuByKindOf([]cpuMark{{true, 1}}, 3, 0, 400)
	if c.RouteCPUMsPerChange != 5 || c.EndpointCPUMsPerChange != 0 || c.RouteSegments != 1 || c.EndpointSegments != 0 {
		t.Errorf("route changes only: %+v", c)
	}
	if cpuByKindOf(nil, 3, 1, 1) != nil {
		t.Error("no marks, yet a split")
	}
	// A counter that went backwards (a restarted process) attributes nothing.
	if e, r, _ := attributeCPU([]cpuMark{{false, 5}}, 1); e != 0 || r != 0 {
		t.Errorf("backwards: %v, %v", e, r)
	}
}

func TestParseTrafficFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-scale", "large", "-routes", "200", "-policies", "200", "-route-changes", "0.5"})
	if err != nil {
		t.Fatal(err)
	}
	if sc := cfg.scale; sc.Routes != 200 || sc.Policies != 200 || sc.RouteChanges != 0.5 || sc.RestartOver != 0 || sc.RestartEndpoints != 0 {
		t.Errorf("large with routes: %+v (route changes turn the rolling restart off)", sc)
	}
	if cfg, err := parseFlags([]string{"-routes", "20", "-policies", "20"}); err != nil || cfg.scale.RestartOver == 0 {
		t.Errorf("routes without route changes keep the rolling restart: %+v, %v", cfg.scale, err)
	}
	for _, bad := range [][]string{
		{"-routes", "101"}, {"-policies", "-1"}, {"-route-changes", "0.5"}, {"-routes", "5", "-route-changes", "1.5"},
		{"-routes", "5", "-route-changes", "1", "-restart-over", "5s"}, {"-storm", "-routes", "5"}, {"-routes", "1", "-services", "1"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
