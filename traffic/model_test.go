package traffic_test

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/traffic"
)

func TestNormalize(t *testing.T) {
	east := time.FixedZone("UTC+3", 3*60*60)
	s := &traffic.Set{
		Routes: []traffic.Route{
			{Kind: traffic.HTTPRoute, Name: "b", CreatedAt: time.Date(2026, 1, 2, 6, 4, 5, 999_999_999, east),
				Rules: []traffic.Rule{{
					Matches: []traffic.Match{{
						Path:    &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/API"},
						Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "X-Tenant", Value: "ACME"}},
					}},
					Backends:   []traffic.Backend{},
					Retry:      &traffic.Retry{Attempts: 1, HTTPCodes: []int32{}, GRPCCodes: []string{}},
					SetHeaders: []traffic.Header{{Name: "X-Routed-By", Value: "Nave"}},
				}}},
			{Kind: traffic.HTTPRoute, Name: "a", CreatedAt: time.Unix(0, 500_000_000).In(east), Rules: []traffic.Rule{}},
			{Kind: traffic.GRPCRoute, Name: "z", Rules: []traffic.Rule{{
				Matches:    []traffic.Match{{Headers: []traffic.HeaderMatch{}}},
				SetHeaders: []traffic.Header{},
			}}},
			{Kind: traffic.GRPCRoute, Name: "a", CreatedAt: time.Unix(-1, 0)},
		},
		Policy: &traffic.Policy{
			Name:         "p",
			LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "X-Session-ID"},
			Locality: &traffic.LocalityPolicy{FailoverPriority: []string{}, Failover: []traffic.RegionFailover{},
				Distribute: []traffic.Distribution{{From: "*", To: []traffic.LocalityWeight{}}}},
			Retry: &traffic.Retry{Attempts: 1, HTTPCodes: []int32{}, GRPCCodes: []string{}},
		},
	}
	want := &traffic.Set{
		Routes: []traffic.Route{
			{Kind: traffic.GRPCRoute, Name: "a", CreatedAt: time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC)},
			{Kind: traffic.GRPCRoute, Name: "z", Rules: []traffic.Rule{{Matches: []traffic.Match{{}}}}},
			// Created within the epoch's second: unset, as the wire says it.
			{Kind: traffic.HTTPRoute, Name: "a"},
			{Kind: traffic.HTTPRoute, Name: "b", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
				Rules: []traffic.Rule{{
					Matches: []traffic.Match{{
						Path:    &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/API"},
						Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-tenant", Value: "ACME"}},
					}},
					Retry:      &traffic.Retry{Attempts: 1},
					SetHeaders: []traffic.Header{{Name: "x-routed-by", Value: "Nave"}},
				}}},
		},
		Policy: &traffic.Policy{
			Name:         "p",
			LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-session-id"},
			Locality:     &traffic.LocalityPolicy{Distribute: []traffic.Distribution{{From: "*"}}},
			Retry:        &traffic.Retry{Attempts: 1},
		},
	}
	s.Normalize()
	if !s.Equal(want) || !reflect.DeepEqual(s, want) {
		t.Fatalf("Normalize() =\n%+v\nwant\n%+v", s, want)
	}
	// Spelled out, for a readable failure should Equal go wrong too.
	for i, r := range s.Routes {
		if r.CreatedAt.Location() != time.UTC || r.CreatedAt.Nanosecond() != 0 {
			t.Errorf("route %d created at %v, want whole seconds in UTC", i, r.CreatedAt)
		}
	}
	if !s.Routes[2].CreatedAt.IsZero() {
		t.Errorf("a route created at the epoch is created at %v, want the zero time", s.Routes[2].CreatedAt)
	}
	if s.Routes[2].Rules != nil || s.Routes[0].Rules != nil {
		t.Error("empty rules are not nil")
	}
	if l := s.Policy.Locality; l.FailoverPriority != nil || l.Failover != nil || l.Distribute[0].To != nil {
		t.Errorf("empty locality lists are not nil: %+v", l)
	}

	// Normalizing again changes nothing.
	again := validSet()
	again.Normalize()
	if !again.Equal(validSet()) {
		t.Errorf("validSet is not normalized")
	}
	s.Normalize()
	if !s.Equal(want) {
		t.Errorf("Normalize() is not idempotent:\n%+v", s)
	}

	// The empty set: nil routes, still zero.
	empty := &traffic.Set{Routes: []traffic.Route{}}
	empty.Normalize()
	if empty.Routes != nil || !empty.IsZero() || !empty.Equal(&traffic.Set{}) {
		t.Errorf("normalized empty set = %+v, want the zero set", empty)
	}
}

// Normalize leaves values alone: only header names are matched without case.
func TestNormalizeKeepsValues(t *testing.T) {
	s := validSet()
	m := &grpcRoute(s).Rules[0].Matches[0]
	m.Headers[0].Value = "AcMe"
	m.Method.Service = "Shop.V1.Checkout"
	httpRoute(s).Rules[1].SetHeaders[0].Value = "NAVE"
	httpRoute(s).Rules[0].Matches[0].Path.Value = "/HealthZ"
	s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "US-East-1", To: "US-West-2"}}}
	want := validSet()
	wm := &grpcRoute(want).Rules[0].Matches[0]
	wm.Headers[0].Value = "AcMe"
	wm.Method.Service = "Shop.V1.Checkout"
	httpRoute(want).Rules[1].SetHeaders[0].Value = "NAVE"
	httpRoute(want).Rules[0].Matches[0].Path.Value = "/HealthZ"
	want.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "US-East-1", To: "US-West-2"}}}
	s.Normalize()
	if !s.Equal(want) {
		t.Errorf("Normalize() changed a value:\n got %+v\nwant %+v", s, want)
	}
}

// differentlyBuilt is validSet as a peer might build it: routes in another
// order, header names in mixed case, empty lists, times in another zone
// and within the second.
func differentlyBuilt() *traffic.Set {
	s := validSet()
	s.Routes[0], s.Routes[1] = s.Routes[1], s.Routes[0]
	g := &s.Routes[1]
	g.CreatedAt = g.CreatedAt.In(time.FixedZone("PST", -8*60*60)).Add(750 * time.Millisecond)
	g.Rules[0].Matches[0].Headers[0].Name = "X-Tenant"
	g.Rules[0].Matches[1].Headers = []traffic.HeaderMatch{}
	g.Rules[0].SetHeaders[0].Name = "X-ROUTE"
	g.Rules[1].Matches = []traffic.Match{}
	g.Rules[1].SetHeaders = []traffic.Header{}
	h := &s.Routes[0]
	h.Rules[1].Retry.GRPCCodes = []string{}
	s.Policy.LoadBalancer.HashHeader = "X-Session"
	s.Policy.Locality.Failover = []traffic.RegionFailover{}
	s.Policy.Locality.Distribute = []traffic.Distribution{}
	return s
}

func TestSetEqual(t *testing.T) {
	a, b := validSet(), differentlyBuilt()
	if a.Equal(b) {
		t.Fatal("sets equal before normalizing: the test builds them too alike")
	}
	a.Normalize()
	b.Normalize()
	if !a.Equal(b) || !b.Equal(a) {
		t.Fatalf("sets that normalize alike are not Equal:\n%+v\n%+v", a, b)
	}

	changes := []struct {
		name   string
		change func(s *traffic.Set)
	}{
		{"weight", func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[0].Weight++ }},
		{"route created a second later", func(s *traffic.Set) { grpcRoute(s).CreatedAt = grpcRoute(s).CreatedAt.Add(time.Second) }},
		{"route port", func(s *traffic.Set) { httpRoute(s).Port = 8080 }},
		{"header value case", func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Value = "ACME" }},
		{"match order", func(s *traffic.Set) {
			m := grpcRoute(s).Rules[0].Matches
			m[1], m[2] = m[2], m[1]
		}},
		{"backend order", func(s *traffic.Set) {
			b := httpRoute(s).Rules[1].Backends
			b[0], b[1] = b[1], b[0]
		}},
		{"retry code", func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.HTTPCodes[2] = 504 }},
		{"policy timeout", func(s *traffic.Set) { s.Policy.Timeout++ }},
		{"policy gone", func(s *traffic.Set) { s.Policy = nil }},
		{"route gone", func(s *traffic.Set) { s.Routes = s.Routes[:1] }},
		{"outlier detector gone", func(s *traffic.Set) { s.Policy.OutlierDetection.SuccessRate = nil }},
	}
	for _, tt := range changes {
		t.Run(tt.name, func(t *testing.T) {
			base, changed := validSet(), validSet()
			tt.change(changed)
			base.Normalize()
			changed.Normalize()
			if base.Equal(changed) || changed.Equal(base) {
				t.Errorf("a set with another %s is Equal", tt.name)
			}
		})
	}
}

func TestSetIsZero(t *testing.T) {
	tests := []struct {
		name string
		set  traffic.Set
		want bool
	}{
		{"zero", traffic.Set{}, true},
		{"empty routes", traffic.Set{Routes: []traffic.Route{}}, true},
		{"one route", traffic.Set{Routes: []traffic.Route{extraRoute("a")}}, false},
		{"empty policy", traffic.Set{Policy: &traffic.Policy{}}, false},
		{"full", *validSet(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.set.IsZero(); got != tt.want {
				t.Errorf("IsZero() = %t, want %t", got, tt.want)
			}
		})
	}
}

func TestRouteEqual(t *testing.T) {
	a, b := validSet(), validSet()
	if !grpcRoute(a).Equal(grpcRoute(b)) || !httpRoute(a).Equal(httpRoute(b)) {
		t.Fatal("equal routes are not Equal")
	}
	if grpcRoute(a).Equal(httpRoute(a)) {
		t.Error("two different routes are Equal")
	}
	for name, change := range map[string]func(r *traffic.Route){
		"kind":       func(r *traffic.Route) { r.Kind = traffic.HTTPRoute },
		"name":       func(r *traffic.Route) { r.Name = "other" },
		"created at": func(r *traffic.Route) { r.CreatedAt = r.CreatedAt.Add(time.Second) },
		"port":       func(r *traffic.Route) { r.Port = 9091 },
		"weight":     func(r *traffic.Route) { r.Rules[0].Backends[1].Weight = 11 },
		"method":     func(r *traffic.Route) { r.Rules[0].Matches[2].Method.Method = "Refunds" },
		"rule gone":  func(r *traffic.Route) { r.Rules = r.Rules[:1] },
	} {
		t.Run(name, func(t *testing.T) {
			r := grpcRoute(validSet())
			change(r)
			if r.Equal(grpcRoute(a)) || grpcRoute(a).Equal(r) {
				t.Errorf("a route with another %s is Equal", name)
			}
		})
	}
}

func TestPolicyEqual(t *testing.T) {
	var none *traffic.Policy
	if !none.Equal(nil) {
		t.Error("nil policy is not Equal to nil")
	}
	p := validSet().Policy
	if none.Equal(p) || p.Equal(nil) {
		t.Error("nil policy is Equal to a policy")
	}
	if !p.Equal(validSet().Policy) {
		t.Error("equal policies are not Equal")
	}
	if (&traffic.Policy{Name: "p"}).Equal(&traffic.Policy{Name: "p", Locality: &traffic.LocalityPolicy{}}) {
		t.Error("a policy with a default locality is Equal to one with none")
	}
	for name, change := range map[string]func(p *traffic.Policy){
		"name":        func(p *traffic.Policy) { p.Name = "other" },
		"algorithm":   func(p *traffic.Policy) { p.LoadBalancer.Algorithm = traffic.RoundRobin },
		"hash header": func(p *traffic.Policy) { p.LoadBalancer.HashHeader = "x-user" },
		"label order": func(p *traffic.Policy) {
			p.Locality.FailoverPriority[0], p.Locality.FailoverPriority[1] = p.Locality.FailoverPriority[1], p.Locality.FailoverPriority[0]
		},
		"threshold":      func(p *traffic.Policy) { p.OutlierDetection.FailurePercentage.Threshold = 81 },
		"max requests":   func(p *traffic.Policy) { p.MaxRequests = 0 },
		"retry codes":    func(p *traffic.Policy) { p.Retry.GRPCCodes = p.Retry.GRPCCodes[:1] },
		"retry attempts": func(p *traffic.Policy) { p.Retry.Attempts = 3 },
	} {
		t.Run(name, func(t *testing.T) {
			q := validSet().Policy
			change(q)
			if q.Equal(p) || p.Equal(q) {
				t.Errorf("a policy with another %s is Equal", name)
			}
		})
	}
}

func TestCompareRoutes(t *testing.T) {
	route := func(kind traffic.RouteKind, name string) traffic.Route { return traffic.Route{Kind: kind, Name: name} }
	tests := []struct {
		a, b traffic.Route
		want int
	}{
		{route(traffic.GRPCRoute, "a"), route(traffic.GRPCRoute, "a"), 0},
		{route(traffic.GRPCRoute, "a"), route(traffic.GRPCRoute, "b"), -1},
		{route(traffic.GRPCRoute, "a.b"), route(traffic.GRPCRoute, "a-b"), 1},
		// The kind first, whatever the names.
		{route(traffic.GRPCRoute, "z"), route(traffic.HTTPRoute, "a"), -1},
		{route(traffic.HTTPRoute, "a"), route(traffic.GRPCRoute, "z"), 1},
		// Only kind and name: other fields do not order routes.
		{traffic.Route{Kind: traffic.HTTPRoute, Name: "a", Port: 80}, traffic.Route{Kind: traffic.HTTPRoute, Name: "a", Port: 8080,
			CreatedAt: time.Unix(1, 0)}, 0},
	}
	for _, tt := range tests {
		t.Run(string(tt.a.Kind)+"/"+tt.a.Name+" vs "+string(tt.b.Kind)+"/"+tt.b.Name, func(t *testing.T) {
			if got := traffic.CompareRoutes(tt.a, tt.b); got != tt.want {
				t.Errorf("CompareRoutes() = %d, want %d", got, tt.want)
			}
			if got := traffic.CompareRoutes(tt.b, tt.a); got != -tt.want {
				t.Errorf("CompareRoutes() reversed = %d, want %d", got, -tt.want)
			}
		})
	}
}

func TestSetRoute(t *testing.T) {
	s := validSet()
	s.Routes = append(s.Routes, extraRoute("checkout-grpc")) // an HTTPRoute named like the GRPCRoute
	tests := []struct {
		kind traffic.RouteKind
		name string
		want *traffic.Route // nil: not found
	}{
		{traffic.GRPCRoute, "checkout-grpc", grpcRoute(s)},
		{traffic.HTTPRoute, "checkout-http", httpRoute(s)},
		{traffic.HTTPRoute, "checkout-grpc", &s.Routes[2]},
		{traffic.GRPCRoute, "checkout-http", nil},
		{traffic.HTTPRoute, "checkout", nil},
		{"", "checkout-http", nil},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind)+"/"+tt.name, func(t *testing.T) {
			got, ok := s.Route(tt.kind, tt.name)
			if tt.want == nil {
				if ok || !reflect.DeepEqual(got, traffic.Route{}) {
					t.Errorf("Route() = %+v, %t; want nothing", got, ok)
				}
				return
			}
			if !ok || !got.Equal(tt.want) {
				t.Errorf("Route() = %+v, %t; want %+v", got, ok, *tt.want)
			}
		})
	}
	var empty traffic.Set
	if _, ok := empty.Route(traffic.HTTPRoute, "checkout-http"); ok {
		t.Error("the empty set has a route")
	}
}

// HeldBytes counts every string and list a set holds: adding one grows it
// by at least its length (or, for a list element, by something).
func TestHeldBytesGrowsWithEverything(t *testing.T) {
	k := long(1000)
	tests := []struct {
		name   string
		change func(s *traffic.Set)
		min    int
	}{
		{"route", func(s *traffic.Set) { s.Routes = append(s.Routes, traffic.Route{}) }, 1},
		{"route kind", func(s *traffic.Set) { httpRoute(s).Kind += traffic.RouteKind(k) }, 1000},
		{"route name", func(s *traffic.Set) { httpRoute(s).Name += k }, 1000},
		{"rule", func(s *traffic.Set) { httpRoute(s).Rules = append(httpRoute(s).Rules, traffic.Rule{}) }, 1},
		{"match", func(s *traffic.Set) {
			httpRoute(s).Rules[0].Matches = append(httpRoute(s).Rules[0].Matches, traffic.Match{})
		}, 1},
		{"method match", func(s *traffic.Set) {
			grpcRoute(s).Rules[1].Matches = []traffic.Match{{Method: &traffic.MethodMatch{}}}
		}, 1},
		{"method type", func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[1].Method.Type += traffic.MatchType(k) }, 1000},
		{"method service", func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[1].Method.Service += k }, 1000},
		{"method method", func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[2].Method.Method += k }, 1000},
		{"path match", func(s *traffic.Set) {
			httpRoute(s).Rules[0].Matches = append(httpRoute(s).Rules[0].Matches, traffic.Match{Path: &traffic.PathMatch{}})
		}, 1},
		{"path type", func(s *traffic.Set) { httpRoute(s).Rules[0].Matches[0].Path.Type += traffic.MatchType(k) }, 1000},
		{"path value", func(s *traffic.Set) { httpRoute(s).Rules[0].Matches[0].Path.Value += k }, 1000},
		{"header match of a 1000-byte value", func(s *traffic.Set) {
			m := &httpRoute(s).Rules[0].Matches[0]
			m.Headers = append(m.Headers, traffic.HeaderMatch{Type: traffic.Exact, Name: "x", Value: k})
		}, 1000},
		{"header match type", func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Type += traffic.MatchType(k) }, 1000},
		{"header match name", func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Name += k }, 1000},
		{"header match value", func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[1].Value += k }, 1000},
		{"backend", func(s *traffic.Set) {
			httpRoute(s).Rules[0].Backends = append(httpRoute(s).Rules[0].Backends, traffic.Backend{})
		}, 1},
		{"backend kind", func(s *traffic.Set) { httpRoute(s).Rules[0].Backends[0].Kind += traffic.BackendKind(k) }, 1000},
		{"backend name", func(s *traffic.Set) { httpRoute(s).Rules[0].Backends[0].Name += k }, 1000},
		{"set header", func(s *traffic.Set) { httpRoute(s).Rules[0].SetHeaders = []traffic.Header{{}} }, 1},
		{"set header name", func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[0].Name += k }, 1000},
		{"set header value", func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[1].Value += k }, 1000},
		{"rule retry", func(s *traffic.Set) { httpRoute(s).Rules[0].Retry = &traffic.Retry{} }, 1},
		{"retry HTTP code", func(s *traffic.Set) {
			r := httpRoute(s).Rules[1].Retry
			r.HTTPCodes = append(r.HTTPCodes, 504)
		}, 4},
		{"retry gRPC code", func(s *traffic.Set) {
			r := httpRoute(s).Rules[1].Retry
			r.GRPCCodes = append(r.GRPCCodes, k)
		}, 1000},
		{"policy", func(s *traffic.Set) { s.Policy = nil }, -1}, // see below: removing it shrinks the set
		{"policy name", func(s *traffic.Set) { s.Policy.Name += k }, 1000},
		{"algorithm", func(s *traffic.Set) { s.Policy.LoadBalancer.Algorithm += traffic.Algorithm(k) }, 1000},
		{"hash header", func(s *traffic.Set) { s.Policy.LoadBalancer.HashHeader += k }, 1000},
		{"failoverPriority label", func(s *traffic.Set) {
			s.Policy.Locality.FailoverPriority = append(s.Policy.Locality.FailoverPriority, k)
		}, 1000},
		{"failover", func(s *traffic.Set) { s.Policy.Locality.Failover = []traffic.RegionFailover{{}} }, 1},
		{"failover from", func(s *traffic.Set) { s.Policy.Locality.Failover = []traffic.RegionFailover{{From: k}} }, 1000},
		{"failover to", func(s *traffic.Set) { s.Policy.Locality.Failover = []traffic.RegionFailover{{To: k}} }, 1000},
		{"distribution", func(s *traffic.Set) { s.Policy.Locality.Distribute = []traffic.Distribution{{}} }, 1},
		{"distribution from", func(s *traffic.Set) { s.Policy.Locality.Distribute = []traffic.Distribution{{From: k}} }, 1000},
		{"distribution to", func(s *traffic.Set) {
			s.Policy.Locality.Distribute = []traffic.Distribution{{To: []traffic.LocalityWeight{{}}}}
		}, 1},
		{"distribution to locality", func(s *traffic.Set) {
			s.Policy.Locality.Distribute = []traffic.Distribution{{To: []traffic.LocalityWeight{{Locality: k}}}}
		}, 1000},
		{"policy retry gRPC code", func(s *traffic.Set) { s.Policy.Retry.GRPCCodes = append(s.Policy.Retry.GRPCCodes, k) }, 1000},
		{"policy retry", func(s *traffic.Set) { s.Policy.Retry = nil }, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSet()
			before := s.HeldBytes()
			tt.change(s)
			after := s.HeldBytes()
			if tt.min < 0 { // a removal
				if after >= before {
					t.Errorf("HeldBytes() = %d after removing the %s, was %d", after, tt.name, before)
				}
				return
			}
			if after-before < tt.min {
				t.Errorf("HeldBytes() grew by %d (from %d to %d) with the %s, want at least %d", after-before, before, after, tt.name, tt.min)
			}
		})
	}
	var zero traffic.Set
	if n := zero.HeldBytes(); n != 0 {
		t.Errorf("the zero set holds %d bytes", n)
	}
}

// padToHeldBytes adds matches of one exact header each to the HTTPRoute's
// first rule until s holds exactly n bytes.
func padToHeldBytes(t *testing.T, s *traffic.Set, n int) {
	t.Helper()
	rule := &httpRoute(s).Rules[0]
	for i := 0; ; i++ {
		rule.Matches = append(rule.Matches, traffic.Match{Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-pad" + strconv.Itoa(i)}}})
		h := &rule.Matches[len(rule.Matches)-1].Headers[0]
		room := n - s.HeldBytes()
		if room < 0 {
			t.Fatalf("padding overshot %d bytes", n)
		}
		if room <= traffic.MaxValueBytes {
			h.Value = long(room)
			break
		}
		// Leave room for the next match, so as not to overshoot.
		h.Value = long(min(traffic.MaxValueBytes, room-512))
	}
	if got := s.HeldBytes(); got != n {
		t.Fatalf("padded to %d bytes, want %d", got, n)
	}
}

func TestValidateMaxSetBytes(t *testing.T) {
	s := validSet()
	padToHeldBytes(t, s, traffic.MaxSetBytes)
	if err := s.Validate(); err != nil {
		t.Fatalf("a set of MaxSetBytes: Validate() = %v, want nil", err)
	}
	s = validSet()
	padToHeldBytes(t, s, traffic.MaxSetBytes+1)
	err := s.Validate()
	if !errors.Is(err, traffic.ErrInvalid) || !strings.Contains(err.Error(), "hold 65537 bytes (at most 65536)") {
		t.Fatalf("a set of MaxSetBytes+1: Validate() = %v, want one about its 65537 bytes", err)
	}
}

// Validate bounds what a set holds before it compiles a regular expression:
// a set over MaxSetBytes whose regular expressions are invalid is refused
// for its size.
func TestValidateBoundsBytesBeforeRegexes(t *testing.T) {
	build := func(padding int) *traffic.Set {
		s := validSet()
		g := grpcRoute(s)
		g.Rules[0].Matches[3].Method = &traffic.MethodMatch{Type: traffic.RegularExpression, Service: "(" + long(traffic.MaxPatternBytes-1), Method: "[" + long(traffic.MaxPatternBytes-1)}
		g.Rules[0].Matches[0].Headers[1].Value = "*" + long(traffic.MaxPatternBytes-1)
		httpRoute(s).Rules[1].Matches[1].Path.Value = "[" + long(traffic.MaxPatternBytes-1)
		for _, r := range []*traffic.Route{grpcRoute(s), httpRoute(s)} {
			for i := 0; i < padding; i++ {
				r.Rules = append(r.Rules, traffic.Rule{SetHeaders: []traffic.Header{{Name: "x-pad", Value: long(traffic.MaxValueBytes)}}})
			}
		}
		return s
	}
	small := build(0)
	if err := small.Validate(); err == nil || !strings.Contains(err.Error(), "regular expression") {
		t.Fatalf("the regular expressions are valid: Validate() = %v", err)
	}
	big := build(traffic.MaxRules - 2)
	if n := big.HeldBytes(); n <= traffic.MaxSetBytes {
		t.Fatalf("the set holds %d bytes, not more than MaxSetBytes", n)
	}
	err := big.Validate()
	if !errors.Is(err, traffic.ErrInvalid) || !strings.Contains(err.Error(), "bytes (at most 65536)") {
		t.Fatalf("Validate() = %v, want an error about bytes", err)
	}
	if strings.Contains(err.Error(), "regular expression") {
		t.Errorf("Validate() = %v, about a regular expression", err)
	}
}

// Validate counts regular expressions before it compiles one: more than
// MaxRegexes invalid ones are refused for their number.
func TestValidateCountsRegexesBeforeCompiling(t *testing.T) {
	s := validSet()
	ms := regexMatches(traffic.MaxRegexes)
	for i := range ms {
		ms[i].Headers[0].Value = "(" + strconv.Itoa(i)
	}
	grpcRoute(s).Rules[1].Matches = ms
	err := s.Validate()
	if !errors.Is(err, traffic.ErrInvalid) || !strings.Contains(err.Error(), "68 regular expressions (at most 64)") {
		t.Fatalf("Validate() = %v, want an error about the number of regular expressions", err)
	}
}
