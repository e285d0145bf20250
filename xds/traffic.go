package xds

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	cswrr "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/client_side_weighted_round_robin/v3"
	leastrequest "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	ringhash "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	roundrobin "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	wrrlocality "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// Traffic policy in xDS. A service's routes become the routes of its
// ports' RouteConfigurations; its TrafficPolicy shapes its ports' Clusters
// (load balancing, outlier detection, circuit breaking) and the route
// actions that send requests to them (retries, timeouts, hash policies).
// The xDS fields are those proxyless gRPC applies (grpc-go, C-core,
// grpc-js: gRFCs A28, A31, A32, A42, A44, A48, A50, A52), which Envoy
// applies too.

// Lookup finds a merged service by key (nil: no cluster exports it).
type Lookup func(registry.ServiceKey) *registry.Service

// BackendRef is a service port a route sends requests to: its Cluster is
// ClusterName(Key, Port), or for a Service backend (Local: the client's
// own cluster's endpoints only) LocalClusterName(Key, Port).
type BackendRef struct {
	Key   registry.ServiceKey
	Port  int32
	Local bool
}

// ClusterName is the name of the backend's Cluster.
func (b BackendRef) ClusterName() string {
	if b.Local {
		return LocalClusterName(b.Key, b.Port)
	}
	return ClusterName(b.Key, b.Port)
}

// routedEntry is one match of one rule of one route, in the order clients
// try them.
type routedEntry struct {
	route      *traffic.Route
	rule       *traffic.Rule
	ruleIndex  int
	matchIndex int
	match      *traffic.Match // nil: the rule matches every request
}

// attached lists the routes of set that attach to port (a route without a
// port attaches to every port).
func attached(set *traffic.Set, port int32) []*traffic.Route {
	if set == nil {
		return nil
	}
	var out []*traffic.Route
	for i := range set.Routes {
		if r := &set.Routes[i]; r.Port == 0 || r.Port == port {
			out = append(out, r)
		}
	}
	return out
}

// entries expands routes into their matches, sorted by the Gateway API's
// precedence (see compareEntries).
func entries(routes []*traffic.Route) []routedEntry {
	var out []routedEntry
	for _, r := range routes {
		for i := range r.Rules {
			rule := &r.Rules[i]
			if len(rule.Matches) == 0 {
				out = append(out, routedEntry{route: r, rule: rule, ruleIndex: i})
				continue
			}
			for j := range rule.Matches {
				out = append(out, routedEntry{route: r, rule: rule, ruleIndex: i, matchIndex: j, match: &rule.Matches[j]})
			}
		}
	}
	slices.SortFunc(out, compareEntries)
	return out
}

// compareEntries orders matches by the Gateway API's precedence: GRPCRoute
// before HTTPRoute (GEP-1016); for HTTP, an exact path, then the longest
// prefix, then a regular expression, then the most header matches; for
// gRPC, the longest exact service, then method, then the most header
// matches. Ties go to the oldest route, then the route's name, then the
// rule's and the match's order.
func compareEntries(a, b routedEntry) int {
	return cmp.Or(
		cmp.Compare(kindRank(a.route.Kind), kindRank(b.route.Kind)),
		-slices.Compare(a.precedence(), b.precedence()),
		a.route.CreatedAt.Compare(b.route.CreatedAt),
		cmp.Compare(a.route.Name, b.route.Name),
		cmp.Compare(a.ruleIndex, b.ruleIndex),
		cmp.Compare(a.matchIndex, b.matchIndex),
	)
}

func kindRank(k traffic.RouteKind) int {
	if k == traffic.GRPCRoute {
		return 0
	}
	return 1
}

// precedence is the entry's rank within its kind; greater goes first.
func (e routedEntry) precedence() []int {
	m := e.match
	if m == nil {
		m = &traffic.Match{}
	}
	if m.Method != nil {
		if m.Method.Type == traffic.Exact {
			return []int{len(m.Method.Service), len(m.Method.Method), len(m.Headers)}
		}
		return []int{0, 0, len(m.Headers)}
	}
	pathClass, prefix := 2, 1 // no path: PathPrefix "/"
	if p := m.Path; p != nil {
		switch p.Type {
		case traffic.Exact:
			pathClass, prefix = 3, len(p.Value)
		case traffic.PathPrefix:
			prefix = max(len(strings.TrimSuffix(p.Value, "/")), 1)
		default:
			pathClass, prefix = 1, 0
		}
	}
	return []int{pathClass, prefix, len(m.Headers)}
}

// routeMatches is the xDS form of one entry's match: more than one when a
// Gateway API path prefix ("/foo" and "/foo/" both match "/foo" and
// "/foo/...", never "/foobar") takes two xDS matches, as proxyless gRPC
// has no path-separated prefix.
func routeMatches(m *traffic.Match) []*route.RouteMatch {
	var headers []*route.HeaderMatcher
	if m != nil {
		for _, h := range m.Headers {
			headers = append(headers, &route.HeaderMatcher{Name: h.Name,
				HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: stringMatcher(h.Type, h.Value)}})
		}
	}
	prefix := func(v string) *route.RouteMatch {
		return &route.RouteMatch{Headers: headers, PathSpecifier: &route.RouteMatch_Prefix{Prefix: v}}
	}
	exact := func(v string) *route.RouteMatch {
		return &route.RouteMatch{Headers: headers, PathSpecifier: &route.RouteMatch_Path{Path: v}}
	}
	re := func(v string) *route.RouteMatch {
		return &route.RouteMatch{Headers: headers, PathSpecifier: &route.RouteMatch_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: v}}}
	}
	switch {
	case m == nil || (m.Method == nil && m.Path == nil):
		return []*route.RouteMatch{prefix("/")}
	case m.Method != nil:
		mm := m.Method
		if mm.Type == traffic.Exact {
			switch {
			case mm.Method == "":
				return []*route.RouteMatch{prefix("/" + mm.Service + "/")}
			case mm.Service == "":
				return []*route.RouteMatch{re("/[^/]+/" + regexp.QuoteMeta(mm.Method))}
			default:
				return []*route.RouteMatch{exact("/" + mm.Service + "/" + mm.Method)}
			}
		}
		return []*route.RouteMatch{re("/" + group(mm.Service) + "/" + group(mm.Method))}
	}
	p := m.Path
	switch {
	case p.Type == traffic.Exact:
		return []*route.RouteMatch{exact(p.Value)}
	case p.Type == traffic.RegularExpression:
		return []*route.RouteMatch{re(p.Value)}
	case p.Value == "/":
		return []*route.RouteMatch{prefix("/")}
	default:
		// A trailing "/" is ignored: "/abc/" matches "/abc" too.
		v := strings.TrimSuffix(p.Value, "/")
		return []*route.RouteMatch{exact(v), prefix(v + "/")}
	}
}

// group is a method match's part as a regular expression: one path
// segment when empty.
func group(re string) string {
	if re == "" {
		return "[^/]+"
	}
	return "(?:" + re + ")"
}

func stringMatcher(t traffic.MatchType, v string) *matcher.StringMatcher {
	if t == traffic.RegularExpression {
		return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: v}}}
	}
	return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: v}}
}

// backendsOf are the service ports a rule sends requests to, with their
// weights (weight 0 left out); port is the port the request came to.
func backendsOf(k registry.ServiceKey, port int32, rule *traffic.Rule) ([]BackendRef, []uint32) {
	var refs []BackendRef
	var weights []uint32
	for _, b := range rule.Backends {
		if b.Weight == 0 {
			continue
		}
		p := b.Port
		if p == 0 {
			p = port
		}
		refs = append(refs, BackendRef{Key: registry.ServiceKey{Namespace: k.Namespace, Name: b.Name}, Port: p,
			Local: b.Kind == traffic.BackendService})
		weights = append(weights, uint32(b.Weight))
	}
	return refs, weights
}

// RouteBackends lists the service ports the routes of svc's port send
// requests to, sorted and without repeats: its own when no route attaches.
func RouteBackends(svc *registry.Service, port int32) []BackendRef {
	routes := attached(&svc.Traffic, port)
	if len(routes) == 0 {
		return []BackendRef{{Key: svc.Key, Port: port}}
	}
	var out []BackendRef
	for _, r := range routes {
		for i := range r.Rules {
			refs, _ := backendsOf(svc.Key, port, &r.Rules[i])
			out = append(out, refs...)
		}
	}
	slices.SortFunc(out, func(a, b BackendRef) int {
		return cmp.Or(a.Key.Compare(b.Key), cmp.Compare(a.Port, b.Port), compareBool(a.Local, b.Local))
	})
	return slices.Compact(out)
}

// Routes are the xDS routes of svc's port: one per match of every
// rule of the routes attached to it, in precedence order, or, without
// routes, one that sends every request to the port's own Cluster. A
// request no route matches fails (grpc-go: UNAVAILABLE; Envoy: 404), as
// the Gateway API says. lookup finds the backends' policies, for their
// hash policies.
func Routes(svc *registry.Service, port int32, lookup Lookup) []*route.Route {
	own := svc.Traffic.Policy
	routes := attached(&svc.Traffic, port)
	if len(routes) == 0 {
		action := &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: ClusterName(svc.Key, port)}}
		applyPolicy(action, nil, own, []*traffic.Policy{own})
		return []*route.Route{{Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
			Action: &route.Route_Route{Route: action}}}
	}
	var out []*route.Route
	for _, e := range entries(routes) {
		act := ruleAction(svc.Key, port, e.rule, own, lookup)
		for _, m := range routeMatches(e.match) {
			r := &route.Route{Match: m, Name: e.route.Name}
			switch a := act.(type) {
			case *route.RouteAction:
				r.Action = &route.Route_Route{Route: proto.Clone(a).(*route.RouteAction)}
			case *route.DirectResponseAction:
				r.Action = &route.Route_DirectResponse{DirectResponse: a}
			}
			for _, h := range e.rule.SetHeaders {
				r.RequestHeadersToAdd = append(r.RequestHeadersToAdd, &core.HeaderValueOption{
					Header:       &core.HeaderValue{Key: h.Name, Value: h.Value},
					AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
				})
			}
			out = append(out, r)
		}
	}
	return out
}

// ruleAction is what a rule does with the requests it matches: a route
// action to its backends, or, when it has none of weight above 0, a 500
// response (the Gateway API's; gRPC fails such a request UNAVAILABLE).
func ruleAction(k registry.ServiceKey, port int32, rule *traffic.Rule, own *traffic.Policy, lookup Lookup) proto.Message {
	refs, weights := backendsOf(k, port, rule)
	if len(refs) == 0 {
		return &route.DirectResponseAction{Status: 500}
	}
	action := &route.RouteAction{}
	if len(refs) == 1 {
		action.ClusterSpecifier = &route.RouteAction_Cluster{Cluster: refs[0].ClusterName()}
	} else {
		wc := &route.WeightedCluster{}
		for i, ref := range refs {
			wc.Clusters = append(wc.Clusters, &route.WeightedCluster_ClusterWeight{Name: ref.ClusterName(), Weight: wrapperspb.UInt32(weights[i])})
		}
		action.ClusterSpecifier = &route.RouteAction_WeightedClusters{WeightedClusters: wc}
	}
	var policies []*traffic.Policy
	for _, ref := range refs {
		if svc := lookup(ref.Key); svc != nil {
			policies = append(policies, svc.Traffic.Policy)
		}
	}
	applyPolicy(action, rule, own, policies)
	return action
}

// applyPolicy sets a route action's timeout and retry (the rule's, else
// the parent service's policy's) and the hash policy the backends' ring
// hash needs.
func applyPolicy(action *route.RouteAction, rule *traffic.Rule, own *traffic.Policy, backends []*traffic.Policy) {
	var timeout time.Duration
	var retry *traffic.Retry
	if rule != nil {
		timeout, retry = rule.Timeout, rule.Retry
	}
	if own != nil {
		timeout = cmp.Or(timeout, own.Timeout)
		if retry == nil {
			retry = own.Retry
		}
	}
	if timeout > 0 {
		// gRPC applies max_stream_duration (A31); Envoy its route timeout too.
		action.MaxStreamDuration = &route.RouteAction_MaxStreamDuration{MaxStreamDuration: durationpb.New(timeout)}
		action.Timeout = durationpb.New(timeout)
	}
	if retry != nil {
		action.RetryPolicy = retryPolicy(retry)
	}
	seen := map[string]bool{}
	for _, p := range backends {
		if p == nil || p.LoadBalancer == nil || p.LoadBalancer.Algorithm != traffic.RingHash || seen[p.LoadBalancer.HashHeader] {
			continue
		}
		seen[p.LoadBalancer.HashHeader] = true
		action.HashPolicy = append(action.HashPolicy, hashPolicy(p.LoadBalancer.HashHeader))
	}
}

// hashPolicy hashes a header, or, without one, the client's channel (what
// gRPC names io.grpc.channel_id; Envoy ignores it and hashes nothing).
func hashPolicy(header string) *route.RouteAction_HashPolicy {
	if header == "" {
		return &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_FilterState_{
			FilterState: &route.RouteAction_HashPolicy_FilterState{Key: "io.grpc.channel_id"}}}
	}
	return &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_Header_{
		Header: &route.RouteAction_HashPolicy_Header{HeaderName: header}}}
}

// retryPolicy: by gRPC status for a TrafficPolicy (A44), by HTTP status for
// an HTTPRoute (which gRPC clients do not apply: their responses carry
// HTTP 200).
func retryPolicy(r *traffic.Retry) *route.RetryPolicy {
	rp := &route.RetryPolicy{NumRetries: wrapperspb.UInt32(uint32(r.Attempts))}
	if len(r.GRPCCodes) > 0 {
		rp.RetryOn = strings.Join(r.GRPCCodes, ",")
	} else {
		rp.RetryOn = "retriable-status-codes"
		for _, c := range r.HTTPCodes {
			rp.RetriableStatusCodes = append(rp.RetriableStatusCodes, uint32(c))
		}
	}
	if r.Backoff > 0 {
		// A44 requires a base interval and a maximum at least as long;
		// Envoy's default maximum is ten times the base.
		rp.RetryBackOff = &route.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(r.Backoff), MaxInterval: durationpb.New(10 * r.Backoff)}
	}
	return rp
}

// Ring sizes gRPC accepts (A42) and Envoy's defaults.
const (
	minRingSize = 1024
	maxRingSize = 8 << 20
)

// ApplyClusterPolicy shapes a Cluster by the service's policy: its load
// balancing, outlier detection and circuit breaker.
func ApplyClusterPolicy(c *cluster.Cluster, p *traffic.Policy) {
	if p == nil {
		return
	}
	if lb := p.LoadBalancer; lb != nil {
		applyLoadBalancer(c, lb)
	}
	if o := p.OutlierDetection; o != nil {
		c.OutlierDetection = outlierDetection(o)
	}
	if p.MaxRequests > 0 {
		c.CircuitBreakers = &cluster.CircuitBreakers{Thresholds: []*cluster.CircuitBreakers_Thresholds{{
			Priority: core.RoutingPriority_DEFAULT, MaxRequests: wrapperspb.UInt32(p.MaxRequests),
		}}}
	}
}

// applyLoadBalancer sets both the load_balancing_policy a client walks to
// its first known entry (A52) and, for clients older than that, the
// legacy lb_policy. Least request and weighted round robin fall back to
// round robin for a client without them (grpc-js has neither by
// default); ring hash has no fallback, since a client that hashed
// nothing would break the affinity it promises.
func applyLoadBalancer(c *cluster.Cluster, lb *traffic.LoadBalancer) {
	policy := func(name string, m proto.Message) *cluster.LoadBalancingPolicy_Policy {
		return &cluster.LoadBalancingPolicy_Policy{TypedExtensionConfig: &core.TypedExtensionConfig{Name: name, TypedConfig: mustAny(m)}}
	}
	rr := policy("envoy.load_balancing_policies.round_robin", &roundrobin.RoundRobin{})
	// perLocality wraps endpoint picking so that localities keep their
	// weights (A52: the control plane asks for wrr_locality explicitly).
	perLocality := func(picking ...*cluster.LoadBalancingPolicy_Policy) *cluster.LoadBalancingPolicy {
		return &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{
			policy("envoy.load_balancing_policies.wrr_locality", &wrrlocality.WrrLocality{
				EndpointPickingPolicy: &cluster.LoadBalancingPolicy{Policies: picking},
			}),
		}}
	}
	switch lb.Algorithm {
	case traffic.RoundRobin:
		c.LbPolicy = cluster.Cluster_ROUND_ROBIN
	case traffic.LeastRequest:
		choices := cmp.Or(lb.ChoiceCount, 2)
		c.LbPolicy = cluster.Cluster_LEAST_REQUEST
		c.LbConfig = &cluster.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &cluster.Cluster_LeastRequestLbConfig{
			ChoiceCount: wrapperspb.UInt32(choices)}}
		c.LoadBalancingPolicy = perLocality(
			policy("envoy.load_balancing_policies.least_request", &leastrequest.LeastRequest{ChoiceCount: wrapperspb.UInt32(choices)}), rr)
	case traffic.RingHash:
		c.LbPolicy = cluster.Cluster_RING_HASH
		c.LbConfig = &cluster.Cluster_RingHashLbConfig_{RingHashLbConfig: &cluster.Cluster_RingHashLbConfig{
			HashFunction:    cluster.Cluster_RingHashLbConfig_XX_HASH,
			MinimumRingSize: wrapperspb.UInt64(minRingSize), MaximumRingSize: wrapperspb.UInt64(maxRingSize)}}
		c.LoadBalancingPolicy = &cluster.LoadBalancingPolicy{Policies: []*cluster.LoadBalancingPolicy_Policy{
			policy("envoy.load_balancing_policies.ring_hash", &ringhash.RingHash{
				HashFunction:    ringhash.RingHash_XX_HASH,
				MinimumRingSize: wrapperspb.UInt64(minRingSize), MaximumRingSize: wrapperspb.UInt64(maxRingSize)}),
		}}
	case traffic.WeightedRoundRobin:
		c.LbPolicy = cluster.Cluster_ROUND_ROBIN
		c.LoadBalancingPolicy = perLocality(
			policy("envoy.load_balancing_policies.client_side_weighted_round_robin", &cswrr.ClientSideWeightedRoundRobin{}), rr)
	}
}

// outlierDetection is the xDS form of o. Each detector Nave was not asked
// for is off (its enforcement 0): Envoy would otherwise eject after five
// consecutive 5xx by default.
func outlierDetection(o *traffic.OutlierDetection) *cluster.OutlierDetection {
	dur := func(d time.Duration) *durationpb.Duration {
		if d == 0 {
			return nil
		}
		return durationpb.New(d)
	}
	u32 := func(v uint32) *wrapperspb.UInt32Value {
		if v == 0 {
			return nil
		}
		return wrapperspb.UInt32(v)
	}
	od := &cluster.OutlierDetection{
		Interval: dur(o.Interval), BaseEjectionTime: dur(o.BaseEjectionTime), MaxEjectionTime: dur(o.MaxEjectionTime),
		MaxEjectionPercent:                     u32(o.MaxEjectionPercent),
		EnforcingConsecutive_5Xx:               wrapperspb.UInt32(0),
		EnforcingConsecutiveGatewayFailure:     wrapperspb.UInt32(0),
		EnforcingConsecutiveLocalOriginFailure: wrapperspb.UInt32(0),
		EnforcingSuccessRate:                   wrapperspb.UInt32(0),
		EnforcingFailurePercentage:             wrapperspb.UInt32(0),
	}
	if o.ConsecutiveErrors > 0 {
		od.Consecutive_5Xx, od.EnforcingConsecutive_5Xx = wrapperspb.UInt32(o.ConsecutiveErrors), wrapperspb.UInt32(100)
	}
	if s := o.SuccessRate; s != nil {
		od.EnforcingSuccessRate = wrapperspb.UInt32(100)
		od.SuccessRateStdevFactor, od.SuccessRateMinimumHosts, od.SuccessRateRequestVolume = u32(s.StdevFactor), u32(s.MinimumHosts), u32(s.RequestVolume)
	}
	if f := o.FailurePercentage; f != nil {
		od.EnforcingFailurePercentage = wrapperspb.UInt32(100)
		od.FailurePercentageThreshold = wrapperspb.UInt32(f.Threshold)
		od.FailurePercentageMinimumHosts, od.FailurePercentageRequestVolume = u32(f.MinimumHosts), u32(f.RequestVolume)
	}
	return od
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case b:
		return -1
	}
	return 1
}
