// Package traffic is the model of how traffic to a service flows: the routes
// that attach to it (Gateway API GRPCRoute and HTTPRoute whose parent is the
// Service, the GAMMA pattern) and the backend policy that targets it (Nave's
// TrafficPolicy, GEP-713 policy attachment).
//
// A cluster exports these beside the Service, in its shard; the hub merges
// every cluster's and translates the result into xDS. Like registry, this
// package is data in, values out: no I/O, no goroutines, the standard
// library only. Values handed on must not be changed afterwards.
package traffic

import (
	"cmp"
	"reflect"
	"slices"
	"time"
)

// Set is what one cluster says about the traffic to one of its services:
// the routes whose parent is the Service, and the policy that targets it.
// The zero Set says nothing (Kubernetes' defaults: every request to every
// endpoint, nearest first).
type Set struct {
	Routes []Route `json:"routes,omitempty"`
	Policy *Policy `json:"policy,omitempty"`
}

// IsZero reports whether the set says nothing.
func (s *Set) IsZero() bool { return len(s.Routes) == 0 && s.Policy == nil }

// Equal reports whether two normalized sets say the same thing.
func (s *Set) Equal(o *Set) bool { return reflect.DeepEqual(s, o) }

// Equal reports whether two normalized routes are the same, creation time included.
func (r *Route) Equal(o *Route) bool { return reflect.DeepEqual(r, o) }

// SameContent reports whether two normalized routes say the same thing,
// whenever each was created: one manifest applied in two clusters gets
// two creation times.
func (r *Route) SameContent(o *Route) bool {
	a, b := *r, *o
	a.CreatedAt, b.CreatedAt = time.Time{}, time.Time{}
	return reflect.DeepEqual(&a, &b)
}

// Equal reports whether two normalized policies say the same thing (nil: none).
func (p *Policy) Equal(o *Policy) bool { return reflect.DeepEqual(p, o) }

// CompareRoutes orders routes by kind, then name: a normalized set's order.
func CompareRoutes(a, b Route) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name))
}

// Route finds the route of the given kind and name.
func (s *Set) Route(kind RouteKind, name string) (Route, bool) {
	for _, r := range s.Routes {
		if r.Kind == kind && r.Name == name {
			return r, true
		}
	}
	return Route{}, false
}

// RouteKind is the Gateway API kind a route was written as.
type RouteKind string

// The route kinds.
const (
	GRPCRoute RouteKind = "GRPCRoute"
	HTTPRoute RouteKind = "HTTPRoute"
)

// Route is one GRPCRoute or HTTPRoute attached to the service (a parentRef
// naming the Service). Its namespace is the service's.
type Route struct {
	Kind RouteKind `json:"kind"`
	Name string    `json:"name"`
	// CreatedAt orders routes whose rules match alike (the older first, as
	// the Gateway API says), to the second.
	CreatedAt time.Time `json:"createdAt"`
	// Port is the service port the route attaches to (the parentRef's
	// port); 0 attaches it to every port.
	Port  int32  `json:"port,omitempty"`
	Rules []Rule `json:"rules"`
}

// Rule is one rule of a route: requests that match any of its matches go
// to its backends, split by weight.
type Rule struct {
	// Matches are ORed; a rule without matches matches every request.
	Matches []Match `json:"matches,omitempty"`
	// Backends share the rule's requests by weight. A rule without
	// backends (or whose backends all weigh 0) fails its requests
	// (UNAVAILABLE for gRPC).
	Backends []Backend `json:"backends,omitempty"`
	// Timeout is the HTTPRoute's timeouts.request (0: none).
	Timeout time.Duration `json:"timeout,omitempty"`
	// Retry is the HTTPRoute's retry (experimental channel).
	Retry *Retry `json:"retry,omitempty"`
	// SetHeaders are request headers the RequestHeaderModifier filter sets.
	SetHeaders []Header `json:"setHeaders,omitempty"`
}

// MatchType is how a string is matched.
type MatchType string

// The match types (the Gateway API's names).
const (
	Exact             MatchType = "Exact"
	PathPrefix        MatchType = "PathPrefix"
	RegularExpression MatchType = "RegularExpression"
)

// Match is one match of a rule; its parts are ANDed.
type Match struct {
	// Method matches a gRPC method (GRPCRoute only).
	Method *MethodMatch `json:"method,omitempty"`
	// Path matches the request path (HTTPRoute only).
	Path    *PathMatch    `json:"path,omitempty"`
	Headers []HeaderMatch `json:"headers,omitempty"`
}

// MethodMatch matches a gRPC service and method. An empty Service or Method
// matches any; with RegularExpression both are RE2 expressions.
type MethodMatch struct {
	Type    MatchType `json:"type"`
	Service string    `json:"service,omitempty"`
	Method  string    `json:"method,omitempty"`
}

// PathMatch matches the request path: Exact, PathPrefix or RegularExpression.
type PathMatch struct {
	Type  MatchType `json:"type"`
	Value string    `json:"value"`
}

// HeaderMatch matches one request header: Exact or RegularExpression.
// Names are matched case-insensitively and held in lower case.
type HeaderMatch struct {
	Type  MatchType `json:"type"`
	Name  string    `json:"name"`
	Value string    `json:"value"`
}

// Header is a request header to set.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// BackendKind is what a backendRef names.
type BackendKind string

// The backend kinds (GEP-1748): a Service is the caller's own cluster's
// endpoints of that service; a ServiceImport is every exporting cluster's.
const (
	BackendService       BackendKind = "Service"
	BackendServiceImport BackendKind = "ServiceImport"
)

// Backend is one backendRef: a service of the route's namespace.
type Backend struct {
	Kind BackendKind `json:"kind"`
	Name string      `json:"name"`
	// Port is the backend's service port; 0 (a ServiceImport only) is the
	// port the request came to.
	Port int32 `json:"port,omitempty"`
	// Weight is the backend's share of the rule's requests (the Gateway
	// API's default is 1).
	Weight int32 `json:"weight"`
}

// Retry says when and how often a failed request is tried again.
type Retry struct {
	// Attempts is the number of retries after the first try.
	Attempts int32 `json:"attempts"`
	// Backoff is the base interval between tries (0: the client's default).
	Backoff time.Duration `json:"backoff,omitempty"`
	// HTTPCodes are the HTTP status codes retried (HTTPRoute's retry.codes).
	HTTPCodes []int32 `json:"httpCodes,omitempty"`
	// GRPCCodes are the gRPC status codes retried, as xDS names them
	// ("unavailable", "resource-exhausted", ...): a TrafficPolicy's.
	GRPCCodes []string `json:"grpcCodes,omitempty"`
}

// Policy is one TrafficPolicy targeting the service: how its clients pick
// among its endpoints. Unset parts are the clients' defaults.
type Policy struct {
	Name             string            `json:"name"`
	LoadBalancer     *LoadBalancer     `json:"loadBalancer,omitempty"`
	Locality         *LocalityPolicy   `json:"locality,omitempty"`
	OutlierDetection *OutlierDetection `json:"outlierDetection,omitempty"`
	// MaxRequests bounds each client's concurrent requests to the service
	// (a circuit breaker; 0: the client's default, 1024 in gRPC).
	MaxRequests uint32 `json:"maxRequests,omitempty"`
	// Timeout bounds every request to the service a route rule sets none
	// for (gRPC: GRPCRoute has no timeout).
	Timeout time.Duration `json:"timeout,omitempty"`
	// Retry retries requests a route rule sets no retry for, by gRPC status.
	Retry *Retry `json:"retry,omitempty"`
}

// Algorithm is a load-balancing algorithm.
type Algorithm string

// The algorithms.
const (
	RoundRobin         Algorithm = "RoundRobin"
	LeastRequest       Algorithm = "LeastRequest"
	RingHash           Algorithm = "RingHash"
	WeightedRoundRobin Algorithm = "WeightedRoundRobin"
)

// LoadBalancer says how a client picks an endpoint within a locality.
type LoadBalancer struct {
	Algorithm Algorithm `json:"algorithm"`
	// ChoiceCount is how many endpoints LeastRequest compares (0: 2).
	ChoiceCount uint32 `json:"choiceCount,omitempty"`
	// HashHeader is the request header RingHash hashes; "" hashes the
	// client's channel, keeping each client on one endpoint.
	HashHeader string `json:"hashHeader,omitempty"`
}

// The locality labels failoverPriority may name: what Nave knows of every
// endpoint and client.
const (
	LabelCluster = "nave.io/cluster"
	LabelNetwork = "nave.io/network"
	LabelRegion  = "topology.kubernetes.io/region"
	LabelZone    = "topology.kubernetes.io/zone"
)

// LocalityPolicy says how clients prefer endpoints by where they are. At
// most one of its fields is set; the zero value is Nave's default (the
// client's zone, then its region, then the rest, or what the Service's
// trafficDistribution says).
type LocalityPolicy struct {
	// Off puts every endpoint at one priority, whatever its locality.
	Off bool `json:"off,omitempty"`
	// FailoverPriority orders endpoints by how many leading labels they
	// share with the client: all of them first, then all but the last...
	FailoverPriority []string `json:"failoverPriority,omitempty"`
	// Failover names, per client region, the region to fail over to after
	// the client's own.
	Failover []RegionFailover `json:"failover,omitempty"`
	// Distribute sets, per client locality, the share of traffic each
	// endpoint locality gets.
	Distribute []Distribution `json:"distribute,omitempty"`
}

// RegionFailover: clients in From fail over to To after From.
type RegionFailover struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Distribution: clients in From (region, region/zone or region/zone/subzone;
// "*" matches any) send each locality in To its weight's share (weights
// sum to 100).
type Distribution struct {
	From string           `json:"from"`
	To   []LocalityWeight `json:"to"`
}

// LocalityWeight is one locality (a pattern like Distribution.From) and its weight.
type LocalityWeight struct {
	Locality string `json:"locality"`
	Weight   uint32 `json:"weight"`
}

// OutlierDetection ejects endpoints that fail (gRFC A50 for proxyless gRPC).
// Zero durations and counts are the clients' defaults.
type OutlierDetection struct {
	Interval           time.Duration `json:"interval,omitempty"`
	BaseEjectionTime   time.Duration `json:"baseEjectionTime,omitempty"`
	MaxEjectionTime    time.Duration `json:"maxEjectionTime,omitempty"`
	MaxEjectionPercent uint32        `json:"maxEjectionPercent,omitempty"`
	// ConsecutiveErrors ejects after this many errors in a row. Envoy
	// applies it; proxyless gRPC does not (A50 has no such detector).
	ConsecutiveErrors uint32             `json:"consecutiveErrors,omitempty"`
	FailurePercentage *FailurePercentage `json:"failurePercentage,omitempty"`
	SuccessRate       *SuccessRate       `json:"successRate,omitempty"`
}

// FailurePercentage ejects an endpoint whose share of failed requests in an
// interval reaches Threshold percent.
type FailurePercentage struct {
	Threshold     uint32 `json:"threshold"`
	MinimumHosts  uint32 `json:"minimumHosts,omitempty"`
	RequestVolume uint32 `json:"requestVolume,omitempty"`
}

// SuccessRate ejects an endpoint whose success rate is StdevFactor/1000
// standard deviations below the mean of its peers'.
type SuccessRate struct {
	StdevFactor   uint32 `json:"stdevFactor,omitempty"`
	MinimumHosts  uint32 `json:"minimumHosts,omitempty"`
	RequestVolume uint32 `json:"requestVolume,omitempty"`
}

// Normalize puts a set in its canonical form, so that sets that say the same
// thing compare and encode equally: routes sorted by kind and name, empty
// lists nil, header names in lower case, times to the second in UTC. It
// changes s in place.
func (s *Set) Normalize() {
	if len(s.Routes) == 0 {
		s.Routes = nil
	}
	slices.SortFunc(s.Routes, CompareRoutes)
	for i := range s.Routes {
		s.Routes[i].normalize()
	}
	if p := s.Policy; p != nil {
		p.normalize()
	}
}

func (r *Route) normalize() {
	r.CreatedAt = r.CreatedAt.UTC().Truncate(time.Second)
	if r.CreatedAt.Unix() == 0 {
		r.CreatedAt = time.Time{} // the epoch is "unset" on the wire
	}
	r.Rules = nilIfEmpty(r.Rules)
	for i := range r.Rules {
		rule := &r.Rules[i]
		rule.Matches = nilIfEmpty(rule.Matches)
		rule.Backends = nilIfEmpty(rule.Backends)
		rule.SetHeaders = nilIfEmpty(rule.SetHeaders)
		for j := range rule.SetHeaders {
			rule.SetHeaders[j].Name = lower(rule.SetHeaders[j].Name)
		}
		for j := range rule.Matches {
			m := &rule.Matches[j]
			m.Headers = nilIfEmpty(m.Headers)
			for k := range m.Headers {
				m.Headers[k].Name = lower(m.Headers[k].Name)
			}
		}
		rule.Retry.normalize()
	}
}

func (r *Retry) normalize() {
	if r == nil {
		return
	}
	r.HTTPCodes = nilIfEmpty(r.HTTPCodes)
	r.GRPCCodes = nilIfEmpty(r.GRPCCodes)
}

func (p *Policy) normalize() {
	if l := p.Locality; l != nil {
		l.FailoverPriority = nilIfEmpty(l.FailoverPriority)
		l.Failover = nilIfEmpty(l.Failover)
		l.Distribute = nilIfEmpty(l.Distribute)
		for i := range l.Distribute {
			l.Distribute[i].To = nilIfEmpty(l.Distribute[i].To)
		}
	}
	p.Retry.normalize()
	if h := p.LoadBalancer; h != nil {
		h.HashHeader = lower(h.HashHeader)
	}
}

func nilIfEmpty[S ~[]E, E any](s S) S {
	if len(s) == 0 {
		return nil
	}
	return s
}

// lower is strings.ToLower for the ASCII header names validation admits.
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
