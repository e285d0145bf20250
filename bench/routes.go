package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/navemesh/nave/traffic"
)

// Traffic policy at scale (-routes, -policies, -route-changes): some
// services of the world carry a GRPCRoute (a weighted split between the
// service and another service of the world, and a header match sending
// canary requests to that other service), some a TrafficPolicy (least
// request, outlier detection by failure percentage, a timeout, a retry).
// Each route and each policy is carried by one cluster, its owner (the
// clusters take turns), as one cluster's GAMMA route in its Service's
// shard would be: no other cluster says anything about it, so nothing
// conflicts.
//
// A route change moves the split: the service's own weight gets a new
// value (never one its history had), and the rest goes to the other
// service. That weight is the marker: a client that receives the
// service's RouteConfiguration reads it off the weighted cluster of the
// service's own Cluster and looks it up in the route ledger (a ledger
// with one "cluster", its generations the route's states), as it looks an
// assignment's endpoints up in the endpoint ledger. Clients that watch a
// service's RDS are the gRPC clients subscribed to it; gateways watch none.

const (
	// routeWeightTotal is what a route's two weights sum to (the Gateway
	// API's largest weight): weights read as parts per million.
	routeWeightTotal = traffic.MaxWeight
	// initialRouteWeight is the service's own share at first: 90/10.
	initialRouteWeight = 900_000
	// A change draws the service's own weight from [minRouteWeight, maxRouteWeight]: 50/50 to 99/1.
	minRouteWeight = 500_000
	maxRouteWeight = 990_000
	// canaryHeader is the header whose value canaryValue sends a request
	// to the other service alone (the route's first rule).
	canaryHeader = "x-bench-canary"
	canaryValue  = "yes"
)

// trafficPlan says which services carry a route or a policy, which cluster
// carries each, and where each route's split sends its other share.
// Read-only once made.
type trafficPlan struct {
	routed   []int // services with a route, ascending
	policied []int // services with a policy, ascending
	// routeOwner and policyOwner are, by service, the cluster carrying its
	// route or policy (-1: none).
	routeOwner, policyOwner []int
	// canary is, by routed service, the other service its split sends to.
	canary []int
}

// newTrafficPlan picks routes services of the world to carry a route and
// policies to carry a policy, deterministically by seed; the clusters take
// turns carrying them.
func newTrafficPlan(clusters, services, routes, policies int, seed uint64) (*trafficPlan, error) {
	switch {
	case routes < 0 || routes > services || policies < 0 || policies > services:
		return nil, fmt.Errorf("-routes %d and -policies %d: want 0 to the %d services per cluster", routes, policies, services)
	case routes > 0 && services < 2:
		return nil, fmt.Errorf("a route splits between two services: -services must be at least 2")
	case clusters < 1:
		return nil, fmt.Errorf("no clusters")
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x7a4ff1c))
	p := &trafficPlan{routeOwner: make([]int, services), policyOwner: make([]int, services), canary: make([]int, services)}
	for s := range services {
		p.routeOwner[s], p.policyOwner[s], p.canary[s] = -1, -1, -1
	}
	for i, s := range rng.Perm(services)[:routes] {
		p.routeOwner[s] = i % clusters
		p.canary[s] = (s + 1 + rng.IntN(services-1)) % services
		p.routed = append(p.routed, s)
	}
	for i, s := range rng.Perm(services)[:policies] {
		// Offset from the routes' turns, so that a service with both
		// often has them from two clusters (they merge).
		p.policyOwner[s] = (i + clusters/2) % clusters
		p.policied = append(p.policied, s)
	}
	slices.Sort(p.routed)
	slices.Sort(p.policied)
	for _, s := range p.routed {
		set := p.set(p.routeOwner[s], s, initialRouteWeight)
		if err := set.Validate(); err != nil {
			return nil, fmt.Errorf("the route of %s: %w", serviceKey(s), err)
		}
	}
	for _, s := range p.policied {
		set := p.set(p.policyOwner[s], s, initialRouteWeight)
		if err := set.Validate(); err != nil {
			return nil, fmt.Errorf("the policy of %s: %w", serviceKey(s), err)
		}
	}
	return p, nil
}

// isRouted reports whether service s carries a route.
func (p *trafficPlan) isRouted(s int) bool {
	return p != nil && s < len(p.routeOwner) && p.routeOwner[s] >= 0
}

// set is what cluster c says about the traffic to service s, the route's
// own weight being weight: built afresh each time (a shard's set is
// normalized in place and must not be shared).
func (p *trafficPlan) set(c, s int, weight int32) traffic.Set {
	var set traffic.Set
	if p == nil {
		return set
	}
	if p.routeOwner[s] == c {
		set.Routes = []traffic.Route{benchRoute(s, p.canary[s], weight)}
	}
	if p.policyOwner[s] == c {
		set.Policy = benchPolicy(s)
	}
	return set
}

// benchRoute is the GRPCRoute of service s: requests with the canary
// header go to service canary; the others are split, weight to s and the
// rest to canary. Both backends are ServiceImports (every cluster's endpoints).
func benchRoute(s, canary int, weight int32) traffic.Route {
	own, other := serviceKey(s).Name, serviceKey(canary).Name
	return traffic.Route{
		Kind: traffic.GRPCRoute, Name: own + "-split", CreatedAt: exportedAt, Port: servicePort,
		Rules: []traffic.Rule{
			{
				Matches:  []traffic.Match{{Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: canaryHeader, Value: canaryValue}}}},
				Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: other, Port: servicePort, Weight: 1}},
			},
			{
				Backends: []traffic.Backend{
					{Kind: traffic.BackendServiceImport, Name: own, Port: servicePort, Weight: weight},
					{Kind: traffic.BackendServiceImport, Name: other, Port: servicePort, Weight: routeWeightTotal - weight},
				},
			},
		},
	}
}

// benchPolicy is the TrafficPolicy of service s.
func benchPolicy(s int) *traffic.Policy {
	return &traffic.Policy{
		Name:         serviceKey(s).Name + "-policy",
		LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.LeastRequest, ChoiceCount: 2},
		OutlierDetection: &traffic.OutlierDetection{
			Interval: 10 * time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionPercent: 50,
			FailurePercentage: &traffic.FailurePercentage{Threshold: 50, MinimumHosts: 2, RequestVolume: 10},
		},
		Timeout: 2 * time.Second,
		Retry:   &traffic.Retry{Attempts: 2, Backoff: 25 * time.Millisecond, GRPCCodes: []string{"unavailable", "resource-exhausted"}},
	}
}

// routeMarker reads a route's marker off a RouteConfiguration: the weight
// of cluster (the service's own Cluster) in a weighted split; false when
// no route splits to it (no route, or not the bench's).
func routeMarker(rc *route.RouteConfiguration, cluster string) (uint64, bool) {
	for _, vh := range rc.GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
				if wc.GetName() == cluster {
					return uint64(wc.GetWeight().GetValue()), true
				}
			}
		}
	}
	return 0, false
}

// routeChange moves the split of a random routed service's route to a
// weight its history never had, and hands the owner's new state over. It
// returns the owner cluster.
func (w *world) routeChange() (int, error) {
	s := w.plan.routed[w.rng.IntN(len(w.plan.routed))]
	c := w.plan.routeOwner[s]
	var weight int32
	for {
		weight = int32(minRouteWeight + w.rng.IntN(maxRouteWeight-minRouteWeight+1))
		if !w.routes.seen(0, s, uint64(weight)) {
			break
		}
	}
	w.weights[s] = weight
	cl := w.clusters[c]
	sh := w.shard(cl, s, cl.shards[s].Endpoints)
	if _, err := w.routes.record(0, s, uint64(weight), kindRoute, time.Now()); err != nil {
		return c, err
	}
	w.hand(cl, s, sh)
	return c, nil
}

// routeTurn reports whether the churn's change scheduled at elapsed (since
// the churn's start) is a route change: each cycle starts with the route
// changes' share of it, then endpoint changes. Fractions 0 and 1 never
// and always are.
func routeTurn(elapsed, cycle time.Duration, fraction float64) bool {
	switch {
	case fraction <= 0:
		return false
	case fraction >= 1:
		return true
	case cycle <= 0:
		return false
	}
	return float64(elapsed%cycle) < fraction*float64(cycle)
}

// routeCycle is how long one cycle of route and endpoint changes lasts in
// a churn of d: a tenth of it, from 1 to 5 s. Long enough that a segment's
// work mostly ends within it (convergence takes tens of milliseconds),
// short enough that both kinds see the whole churn.
func routeCycle(d time.Duration) time.Duration {
	return min(max(d/10, time.Second), 5*time.Second)
}

// cpuMark is the hub's CPU time when a segment of the churn began.
type cpuMark struct {
	route      bool    // the segment's changes are route changes
	cpuSeconds float64 // the hub's CPU time at its start
}

// attributeCPU adds up the hub's CPU time over the segments of each kind:
// each segment runs from its mark to the next one's, the last to end
// (the hub's CPU time once every client converged).
func attributeCPU(marks []cpuMark, end float64) (endpoint, route float64, segments [2]int) {
	for i, m := range marks {
		next := end
		if i+1 < len(marks) {
			next = marks[i+1].cpuSeconds
		}
		d := max(next-m.cpuSeconds, 0)
		if m.route {
			route += d
			segments[1]++
		} else {
			endpoint += d
			segments[0]++
		}
	}
	return endpoint, route, segments
}

// routeChurn is what the churn measured of route changes.
type routeChurn struct {
	Routes   int `json:"routes"`   // services with a route
	Policies int `json:"policies"` // services with a policy
	// Fraction is the share of the churn's time (and changes) given to
	// route changes; CycleS the length of one cycle of both.
	Fraction float64 `json:"fraction"`
	CycleS   float64 `json:"cycleS,omitempty"`
	Changes  int     `json:"changes"`
	// Latency: a route change handed to its spoke's publisher -> a gRPC
	// client subscribed to the service received a RouteConfiguration
	// holding it (or a later state), per (client, change) pair.
	Latency      latencySummary `json:"latency"`
	Windows      []window       `json:"windows"`
	Pairs        int64          `json:"pairs"`
	Converged    int            `json:"converged"`
	Unconverged  int64          `json:"unconverged"`
	PendingAtEnd int64          `json:"pendingAtEnd"`
	// StaleStates and UnknownStates are RouteConfigurations older than
	// what a client held, or with a split no route ever had, during the churn.
	StaleStates   int64 `json:"staleStates"`
	UnknownStates int64 `json:"unknownStates"`
	// What the gRPC clients received: RDS responses and bytes, per route
	// change and per (client, route change) pair.
	RDSResponses             int64   `json:"rdsResponses"`
	RDSPushesPerClientChange float64 `json:"rdsPushesPerClientChange"`
	RDSBytesPerChange        float64 `json:"rdsBytesPerChange"`
	// HubRDSResponsesPerChange: the hub's own count of RDS responses, per route change.
	HubRDSResponsesPerChange float64 `json:"hubRdsResponsesPerChange"`
	// CPU is the hub's CPU by kind of change (nil: no marks were taken).
	CPU *cpuByKind `json:"cpu,omitempty"`
}

// cpuByKind is the hub's CPU time split by the churn's segments: each
// segment's CPU, up to the next segment's start (the last: until every
// client converged), goes to its kind.
type cpuByKind struct {
	EndpointSegments       int     `json:"endpointSegments"`
	RouteSegments          int     `json:"routeSegments"`
	EndpointChanges        int     `json:"endpointChanges"`
	RouteChanges           int     `json:"routeChanges"`
	EndpointCPUSeconds     float64 `json:"endpointCpuSeconds"`
	RouteCPUSeconds        float64 `json:"routeCpuSeconds"`
	EndpointCPUMsPerChange float64 `json:"endpointCpuMsPerChange"`
	RouteCPUMsPerChange    float64 `json:"routeCpuMsPerChange"`
}

// cpuByKindOf divides the segments' CPU by the changes of each kind.
func cpuByKindOf(marks []cpuMark, end float64, endpointChanges, routeChanges int) *cpuByKind {
	if len(marks) == 0 {
		return nil
	}
	e, r, seg := attributeCPU(marks, end)
	out := &cpuByKind{EndpointSegments: seg[0], RouteSegments: seg[1], EndpointChanges: endpointChanges, RouteChanges: routeChanges,
		EndpointCPUSeconds: e, RouteCPUSeconds: r}
	if endpointChanges > 0 {
		out.EndpointCPUMsPerChange = 1000 * e / float64(endpointChanges)
	}
	if routeChanges > 0 {
		out.RouteCPUMsPerChange = 1000 * r / float64(routeChanges)
	}
	return out
}

// routeResults computes what the churn measured of route changes: their
// convergence at the gRPC clients watching the routed services, the RDS
// traffic, and the hub's CPU by kind of change (marks: see attributeCPU;
// endCPU is the hub's CPU time once every client converged).
func (b *bench) routeResults(cr churnResult, start, end time.Duration, pendingAtEnd int64, beforeM, afterM promText,
	traffic trafficSnapshot, marks []cpuMark, endCPU float64) *routeChurn {
	sc, f, l, plan := b.cfg.scale, b.fleet, b.world.routes, b.world.plan
	samples := slices.DeleteFunc(f.takeSamples(), func(s sample) bool { return s.kind != kindRoute })
	routeChanges := cr.kinds[kindRoute]
	rc := &routeChurn{Routes: len(plan.routed), Policies: len(plan.policied), Fraction: sc.RouteChanges, Changes: routeChanges,
		Latency: summarize(latencies(samples, 0, 1<<62, nil)), Windows: windowsOf(samples, start, end, 6),
		Converged: len(samples), Unconverged: l.pending.Load(), PendingAtEnd: pendingAtEnd,
		StaleStates: f.routeObserved[phaseChurn][0].Load(), UnknownStates: f.routeObserved[phaseChurn][1].Load(),
		RDSResponses: traffic.Responses[profileGRPC][typeRDS],
	}
	if sc.RouteChanges > 0 && sc.RouteChanges < 1 {
		rc.CycleS = routeCycle(sc.Duration).Seconds()
	}
	for s := range sc.Services {
		h := l.at(0, s)
		h.mu.Lock()
		changes := max(len(h.fps)-1, 0)
		h.mu.Unlock()
		rc.Pairs += int64(changes) * int64(l.subscribers[s])
	}
	if rc.Pairs > 0 {
		rc.RDSPushesPerClientChange = float64(rc.RDSResponses) / float64(rc.Pairs)
	}
	if routeChanges > 0 {
		rc.RDSBytesPerChange = float64(traffic.Bytes[profileGRPC][typeRDS]) / float64(routeChanges)
		rc.HubRDSResponsesPerChange = delta(beforeM, afterM, "nave_xds_responses_total", `type="rds"`) / float64(routeChanges)
	}
	rc.CPU = cpuByKindOf(marks, endCPU, cr.Changes-routeChanges, routeChanges)
	if len(plan.routed) > 0 {
		b.res.Notes = append(b.res.Notes, "with -routes, gRPC clients also watch the Clusters and assignments of their routes' other services: "+
			"their EDS pushes per (client, change) count those too")
	}
	return rc
}
