package traffic_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/traffic"
)

// validSet is a normalized set that passes validation and uses every
// feature: a GRPCRoute (exact and regex method matches, header matches,
// weighted Service and ServiceImport backends), an HTTPRoute (Exact,
// PathPrefix and RegularExpression paths, a timeout, a retry by HTTP status,
// set headers) and a policy (ring hash, failover priority, outlier
// detection with every detector, max requests, a timeout, a gRPC retry).
// Each case below breaks one rule.
func validSet() *traffic.Set {
	return &traffic.Set{
		Routes: []traffic.Route{
			{
				Kind: traffic.GRPCRoute, Name: "checkout-grpc", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Port: 9090,
				Rules: []traffic.Rule{
					{
						Matches: []traffic.Match{
							{
								Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "shop.v1.Checkout", Method: "Pay"},
								Headers: []traffic.HeaderMatch{
									{Type: traffic.Exact, Name: "x-tenant", Value: "acme"},
									{Type: traffic.RegularExpression, Name: "x-canary", Value: "^(yes|true)$"},
								},
							},
							{Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "shop.v1.Checkout"}},
							{Method: &traffic.MethodMatch{Type: traffic.Exact, Method: "Refund"}},
							{Method: &traffic.MethodMatch{Type: traffic.RegularExpression, Service: `shop\.v[0-9]+\.Checkout`, Method: "Get.*"}},
						},
						Backends: []traffic.Backend{
							{Kind: traffic.BackendService, Name: "checkout-v2", Port: 9090, Weight: 90},
							{Kind: traffic.BackendServiceImport, Name: "checkout", Weight: 10},
						},
						SetHeaders: []traffic.Header{{Name: "x-route", Value: "grpc"}},
					},
					{Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "checkout", Port: 9090, Weight: 1}}},
				},
			},
			{
				Kind: traffic.HTTPRoute, Name: "checkout-http", CreatedAt: time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC),
				Rules: []traffic.Rule{
					{
						Matches:  []traffic.Match{{Path: &traffic.PathMatch{Type: traffic.Exact, Value: "/healthz"}}},
						Backends: []traffic.Backend{{Kind: traffic.BackendService, Name: "checkout", Port: 8080, Weight: 1}},
					},
					{
						Matches: []traffic.Match{
							{
								Path:    &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/api/v1"},
								Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-version", Value: "2"}},
							},
							{Path: &traffic.PathMatch{Type: traffic.RegularExpression, Value: `^/items/[0-9]+$`}},
						},
						Backends: []traffic.Backend{
							{Kind: traffic.BackendService, Name: "checkout-v2", Port: 8080, Weight: 3},
							{Kind: traffic.BackendServiceImport, Name: "checkout", Port: 8080, Weight: 1},
						},
						Timeout:    30 * time.Second,
						Retry:      &traffic.Retry{Attempts: 3, Backoff: 100 * time.Millisecond, HTTPCodes: []int32{500, 502, 503}},
						SetHeaders: []traffic.Header{{Name: "x-routed-by", Value: "nave"}, {Name: "x-trace", Value: "on"}},
					},
				},
			},
		},
		Policy: &traffic.Policy{
			Name:         "checkout",
			LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-session"},
			Locality:     &traffic.LocalityPolicy{FailoverPriority: []string{traffic.LabelNetwork, traffic.LabelRegion, traffic.LabelZone}},
			OutlierDetection: &traffic.OutlierDetection{
				Interval: 10 * time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 5 * time.Minute,
				MaxEjectionPercent: 50, ConsecutiveErrors: 5,
				FailurePercentage: &traffic.FailurePercentage{Threshold: 80, MinimumHosts: 3, RequestVolume: 20},
				SuccessRate:       &traffic.SuccessRate{StdevFactor: 1900, MinimumHosts: 5, RequestVolume: 100},
			},
			MaxRequests: 2048,
			Timeout:     15 * time.Second,
			Retry:       &traffic.Retry{Attempts: 2, Backoff: 25 * time.Millisecond, GRPCCodes: []string{"unavailable", "resource-exhausted"}},
		},
	}
}

// validSetRegexes is how many regular expressions validSet's routes compile
// (a method match with RegularExpression counts two).
const validSetRegexes = 4

func grpcRoute(s *traffic.Set) *traffic.Route { return &s.Routes[0] }
func httpRoute(s *traffic.Set) *traffic.Route { return &s.Routes[1] }

// extraRoute is a minimal valid HTTPRoute.
func extraRoute(name string) traffic.Route {
	return traffic.Route{Kind: traffic.HTTPRoute, Name: name,
		Rules: []traffic.Rule{{Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "checkout", Weight: 1}}}}}
}

func repeatRules(n int) []traffic.Rule {
	rules := make([]traffic.Rule, n)
	for i := range rules {
		rules[i] = traffic.Rule{Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "checkout", Weight: 1}}}
	}
	return rules
}

func emptyMatches(n int) []traffic.Match { return make([]traffic.Match, n) }

func headerMatches(n int) []traffic.HeaderMatch {
	out := make([]traffic.HeaderMatch, n)
	for i := range out {
		out[i] = traffic.HeaderMatch{Type: traffic.Exact, Name: "x-h" + strconv.Itoa(i), Value: "v"}
	}
	return out
}

func setHeaders(n int) []traffic.Header {
	out := make([]traffic.Header, n)
	for i := range out {
		out[i] = traffic.Header{Name: "x-h" + strconv.Itoa(i), Value: "v"}
	}
	return out
}

func backends(n int) []traffic.Backend {
	out := make([]traffic.Backend, n)
	for i := range out {
		out[i] = traffic.Backend{Kind: traffic.BackendService, Name: "b" + strconv.Itoa(i), Port: 80, Weight: 1}
	}
	return out
}

// regexMatches are n matches of one regex header each.
func regexMatches(n int) []traffic.Match {
	out := make([]traffic.Match, n)
	for i := range out {
		out[i] = traffic.Match{Headers: []traffic.HeaderMatch{{Type: traffic.RegularExpression, Name: "x-r", Value: "^v" + strconv.Itoa(i) + "$"}}}
	}
	return out
}

func failovers(n int) []traffic.RegionFailover {
	out := make([]traffic.RegionFailover, n)
	for i := range out {
		out[i] = traffic.RegionFailover{From: "r" + strconv.Itoa(i), To: "elsewhere"}
	}
	return out
}

func distributions(n int) []traffic.Distribution {
	out := make([]traffic.Distribution, n)
	for i := range out {
		out[i] = traffic.Distribution{From: "r" + strconv.Itoa(i), To: []traffic.LocalityWeight{{Locality: "*", Weight: 100}}}
	}
	return out
}

func long(n int) string { return strings.Repeat("a", n) }

func TestSetValidate(t *testing.T) {
	const (
		grpc   = `GRPCRoute "checkout-grpc": `
		http   = `HTTPRoute "checkout-http": `
		policy = `TrafficPolicy "checkout": `
	)
	// A DNS subdomain of 253 bytes: three 63-byte labels and a 61-byte one.
	name253 := long(63) + "." + long(63) + "." + long(63) + "." + long(61)
	tests := []struct {
		name   string
		change func(s *traffic.Set)
		// want is a substring of the error; empty means the set is valid.
		want string
		// also is another substring, for a message whose words vary.
		also string
		// whole: the rule is about the set as a whole, so its routes and
		// policy may each pass Route.Validate and Policy.Validate alone.
		whole bool
	}{
		{name: "valid", change: func(s *traffic.Set) {}},
		{name: "valid zero set", change: func(s *traffic.Set) { *s = traffic.Set{} }},
		{name: "valid policy only", change: func(s *traffic.Set) { s.Routes = nil }},
		{name: "valid routes only", change: func(s *traffic.Set) { s.Policy = nil }},
		{name: "valid empty policy", change: func(s *traffic.Set) { s.Policy = &traffic.Policy{Name: "p"} }},
		{name: "valid rule without matches or backends", change: func(s *traffic.Set) {
			httpRoute(s).Rules = append(httpRoute(s).Rules, traffic.Rule{})
		}},
		{name: "valid same name as another kind", change: func(s *traffic.Set) {
			r := extraRoute("checkout-grpc")
			s.Routes = append(s.Routes, r)
		}},
		{name: "valid MaxRoutes routes", change: func(s *traffic.Set) {
			for i := len(s.Routes); i < traffic.MaxRoutes; i++ {
				s.Routes = append(s.Routes, extraRoute("extra-"+strconv.Itoa(i)))
			}
		}},
		{name: "valid MaxRules rules", change: func(s *traffic.Set) { httpRoute(s).Rules = repeatRules(traffic.MaxRules) }},
		{name: "valid MaxMatches matches", change: func(s *traffic.Set) { httpRoute(s).Rules[0].Matches = emptyMatches(traffic.MaxMatches) }},
		{name: "valid MaxMatchesPerRoute matches", change: func(s *traffic.Set) {
			r := httpRoute(s)
			r.Rules = repeatRules(2)
			r.Rules[0].Matches = emptyMatches(traffic.MaxMatches)
			r.Rules[1].Matches = emptyMatches(traffic.MaxMatchesPerRoute - traffic.MaxMatches)
		}},
		{name: "valid MaxBackends backends", change: func(s *traffic.Set) { httpRoute(s).Rules[0].Backends = backends(traffic.MaxBackends) }},
		{name: "valid MaxHeaders header matches", change: func(s *traffic.Set) {
			httpRoute(s).Rules[0].Matches[0].Headers = headerMatches(traffic.MaxHeaders)
		}},
		{name: "valid MaxHeaders headers set", change: func(s *traffic.Set) { httpRoute(s).Rules[0].SetHeaders = setHeaders(traffic.MaxHeaders) }},
		{name: "valid MaxRegexes regular expressions", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[1].Matches = regexMatches(traffic.MaxRegexes - validSetRegexes)
		}},
		{name: "valid route name of 253 bytes", change: func(s *traffic.Set) { s.Routes = []traffic.Route{extraRoute(name253)} }},
		{name: "valid dotted route name", change: func(s *traffic.Set) { httpRoute(s).Name = "checkout.v2" }},
		{name: "valid route ports", change: func(s *traffic.Set) { grpcRoute(s).Port, httpRoute(s).Port = 65535, 1 }},
		{name: "valid weights 0 and MaxWeight", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Backends[0].Weight = 0
			grpcRoute(s).Rules[0].Backends[1].Weight = traffic.MaxWeight
		}},
		{name: "valid backend port bounds", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Backends[0].Port = 1
			grpcRoute(s).Rules[0].Backends[1].Port = 65535
		}},
		{name: "valid duration bounds", change: func(s *traffic.Set) {
			httpRoute(s).Rules[1].Timeout = time.Millisecond
			httpRoute(s).Rules[1].Retry.Backoff = traffic.MaxDuration
			s.Policy.Timeout = traffic.MaxDuration
			s.Policy.OutlierDetection.Interval = time.Millisecond
		}},
		{name: "valid retry attempts 1 and 10", change: func(s *traffic.Set) {
			httpRoute(s).Rules[1].Retry.Attempts = 1
			s.Policy.Retry.Attempts = traffic.MaxRetryAttempts
		}},
		{name: "valid HTTP codes 400 and 599", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.HTTPCodes = []int32{400, 599} }},
		{name: "valid HTTP retry without codes", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.HTTPCodes = nil }},
		{name: "valid every retryable gRPC code", change: func(s *traffic.Set) {
			s.Policy.Retry.GRPCCodes = []string{"cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable"}
		}},
		{name: "valid header value of MaxValueBytes", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[0].Headers[0].Value = long(traffic.MaxValueBytes)
			httpRoute(s).Rules[1].SetHeaders[0].Value = long(traffic.MaxValueBytes)
		}},
		{name: "valid header name of MaxHeaderNameBytes", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[0].Headers[0].Name = long(traffic.MaxHeaderNameBytes)
		}},
		{name: "valid header token characters", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[0].Headers[0].Name = "x-a!#$%&'*+.^_`|~9"
		}},
		{name: "valid path of MaxPatternBytes", change: func(s *traffic.Set) {
			httpRoute(s).Rules[0].Matches[0].Path.Value = "/" + long(traffic.MaxPatternBytes-1)
		}},
		{name: "valid root path prefix", change: func(s *traffic.Set) {
			httpRoute(s).Rules[1].Matches[0].Path.Value = "/"
		}},
		{name: "valid regex method match of one part", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[3].Method.Service = ""
		}},
		{name: "valid RoundRobin", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.RoundRobin}
		}},
		{name: "valid LeastRequest", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.LeastRequest}
		}},
		{name: "valid LeastRequest choiceCount 2", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.LeastRequest, ChoiceCount: 2}
		}},
		{name: "valid LeastRequest choiceCount 10", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.LeastRequest, ChoiceCount: 10}
		}},
		{name: "valid RingHash on the channel", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.RingHash}
		}},
		{name: "valid WeightedRoundRobin", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.WeightedRoundRobin}
		}},
		{name: "valid locality default", change: func(s *traffic.Set) { s.Policy.Locality = &traffic.LocalityPolicy{} }},
		{name: "valid locality off", change: func(s *traffic.Set) { s.Policy.Locality = &traffic.LocalityPolicy{Off: true} }},
		{name: "valid failoverPriority of every label", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{FailoverPriority: []string{
				traffic.LabelCluster, traffic.LabelNetwork, traffic.LabelRegion, traffic.LabelZone}}
		}},
		{name: "valid failover", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{
				{From: "us-east-1", To: "us-west-2"}, {From: "us-west-2", To: "us-east-1"}}}
		}},
		{name: "valid MaxLocalityRules failovers", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: failovers(traffic.MaxLocalityRules)}
		}},
		{name: "valid distribute", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: []traffic.Distribution{
				{From: "us-east-1/us-east-1a", To: []traffic.LocalityWeight{
					{Locality: "us-east-1/us-east-1a", Weight: 80}, {Locality: "us-east-1/*", Weight: 15}, {Locality: "*", Weight: 5}}},
				{From: "*", To: []traffic.LocalityWeight{{Locality: "us-west-2/us-west-2b/rack-1", Weight: 100}}},
			}}
		}},
		{name: "valid locality of MaxLocalityBytes", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: long(traffic.MaxLocalityBytes), To: "b"}}}
		}},
		{name: "valid consecutive errors alone", change: func(s *traffic.Set) {
			s.Policy.OutlierDetection = &traffic.OutlierDetection{ConsecutiveErrors: 3}
		}},
		{name: "valid failure percentage alone", change: func(s *traffic.Set) {
			s.Policy.OutlierDetection = &traffic.OutlierDetection{FailurePercentage: &traffic.FailurePercentage{Threshold: 100}}
		}},
		{name: "valid success rate alone", change: func(s *traffic.Set) {
			s.Policy.OutlierDetection = &traffic.OutlierDetection{SuccessRate: &traffic.SuccessRate{}}
		}},
		{name: "valid maxEjectionPercent 100", change: func(s *traffic.Set) { s.Policy.OutlierDetection.MaxEjectionPercent = 100 }},

		// The set as a whole.
		{name: "more than MaxRoutes routes", whole: true, change: func(s *traffic.Set) {
			for i := len(s.Routes); i <= traffic.MaxRoutes; i++ {
				s.Routes = append(s.Routes, extraRoute("extra-"+strconv.Itoa(i)))
			}
		}, want: "17 routes attach to the service (at most 16)"},
		{name: "more than MaxSetBytes", whole: true, change: func(s *traffic.Set) {
			r := httpRoute(s)
			r.Rules = repeatRules(traffic.MaxRules)
			for i := range r.Rules {
				r.Rules[i].SetHeaders = []traffic.Header{{Name: "x-pad", Value: long(traffic.MaxValueBytes)}}
			}
		}, want: "bytes (at most 65536)"},
		{name: "more than MaxRegexes", whole: true, change: func(s *traffic.Set) {
			grpcRoute(s).Rules[1].Matches = regexMatches(traffic.MaxRegexes - validSetRegexes + 1)
		}, want: "the routes hold 65 regular expressions (at most 64)"},
		{name: "method regexes count two each", whole: true, change: func(s *traffic.Set) {
			ms := make([]traffic.Match, traffic.MaxRegexes/2)
			for i := range ms {
				ms[i].Method = &traffic.MethodMatch{Type: traffic.RegularExpression, Method: "M" + strconv.Itoa(i)}
			}
			grpcRoute(s).Rules[1].Matches = ms
		}, want: "regular expressions (at most 64)"},
		{name: "duplicate route", whole: true, change: func(s *traffic.Set) {
			s.Routes = append(s.Routes, extraRoute("extra"), s.Routes[1])
		}, want: `HTTPRoute "checkout-http" appears twice`},

		// Routes.
		{name: "unknown route kind", change: func(s *traffic.Set) { httpRoute(s).Kind = "TCPRoute" },
			want: `TCPRoute "checkout-http": unknown route kind`},
		{name: "empty route kind", change: func(s *traffic.Set) { httpRoute(s).Kind = "" }, want: "unknown route kind"},
		{name: "lower-case route kind", change: func(s *traffic.Set) { httpRoute(s).Kind = "httproute" }, want: "unknown route kind"},
		{name: "route name empty", change: func(s *traffic.Set) { httpRoute(s).Name = "" }, want: `HTTPRoute "": name is not a DNS subdomain`},
		{name: "route name upper case", change: func(s *traffic.Set) { httpRoute(s).Name = "Checkout" }, want: "name is not a DNS subdomain"},
		{name: "route name underscore", change: func(s *traffic.Set) { httpRoute(s).Name = "check_out" }, want: "name is not a DNS subdomain"},
		{name: "route name empty label", change: func(s *traffic.Set) { httpRoute(s).Name = "a..b" }, want: "name is not a DNS subdomain"},
		{name: "route name of 254 bytes", change: func(s *traffic.Set) { httpRoute(s).Name = name253 + "a" }, want: "name is not a DNS subdomain"},
		{name: "route port negative", change: func(s *traffic.Set) { httpRoute(s).Port = -1 }, want: http + "port -1 is out of range"},
		{name: "route port above 65535", change: func(s *traffic.Set) { httpRoute(s).Port = 65536 }, want: http + "port 65536 is out of range"},
		{name: "route without rules", change: func(s *traffic.Set) { httpRoute(s).Rules = nil }, want: http + "no rules"},
		{name: "more than MaxRules rules", change: func(s *traffic.Set) { httpRoute(s).Rules = repeatRules(traffic.MaxRules + 1) },
			want: http + "17 rules (at most 16)"},
		{name: "more than MaxMatchesPerRoute matches", change: func(s *traffic.Set) {
			r := httpRoute(s)
			r.Rules = repeatRules(3)
			for i := range r.Rules {
				r.Rules[i].Matches = emptyMatches(43)
			}
		}, want: http + "129 matches across the rules (at most 128)"},

		// Rules.
		{name: "more than MaxMatches matches", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Matches = emptyMatches(traffic.MaxMatches + 1) },
			want: http + "rule 2: 65 matches (at most 64)"},
		{name: "more than MaxBackends backends", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Backends = backends(traffic.MaxBackends + 1) },
			want: http + "rule 2: 17 backends (at most 16)"},
		{name: "GRPCRoute with a timeout", change: func(s *traffic.Set) { grpcRoute(s).Rules[1].Timeout = time.Second },
			want: grpc + "rule 2: a GRPCRoute has no timeout or retry"},
		{name: "GRPCRoute with a retry", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Retry = &traffic.Retry{Attempts: 1, GRPCCodes: []string{"unavailable"}}
		}, want: grpc + "rule 1: a GRPCRoute has no timeout or retry"},
		{name: "timeout negative", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Timeout = -time.Second },
			want: http + "rule 2: timeout is negative"},
		{name: "timeout below 1ms", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Timeout = time.Millisecond - 1 },
			want: "rule 2: timeout 999.999µs is shorter than 1ms"},
		{name: "timeout of 1ns", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Timeout = 1 },
			want: "timeout 1ns is shorter than 1ms"},
		{name: "timeout above 24h", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Timeout = traffic.MaxDuration + 1 },
			want: "rule 2: timeout 24h0m0.000000001s is longer than 24h0m0s"},
		{name: "more than MaxHeaders headers set", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders = setHeaders(traffic.MaxHeaders + 1) },
			want: http + "rule 2: 17 headers set (at most 16)"},
		{name: "set header :path", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[1].Name = ":path" },
			want: http + `rule 2: set header: header`, also: `":path" is`},
		{name: "set header grpc-timeout", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[0].Name = "grpc-timeout" },
			want: `set header: header "grpc-timeout" is reserved`},
		{name: "set header Grpc-Timeout", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[0].Name = "Grpc-Timeout" },
			want: `set header: header "Grpc-Timeout" is reserved`},
		{name: "set header without name", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[0].Name = "" },
			want: "set header: header name must be 1-256 bytes"},
		{name: "set header name too long", change: func(s *traffic.Set) {
			httpRoute(s).Rules[1].SetHeaders[0].Name = long(traffic.MaxHeaderNameBytes + 1)
		}, want: "set header: header name must be 1-256 bytes"},
		{name: "set header name with space", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[0].Name = "x routed" },
			want: `set header: header name "x routed" is not an HTTP token`},
		{name: "set header name with colon inside", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[0].Name = "x:y" },
			want: "is not an HTTP token"},
		{name: "set header value too long", change: func(s *traffic.Set) {
			httpRoute(s).Rules[1].SetHeaders[0].Value = long(traffic.MaxValueBytes + 1)
		}, want: "set header: header value longer than 4096 bytes"},
		{name: "set header value with newline", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[0].Value = "a\r\nb: c" },
			want: "set header: header value has control characters"},
		{name: "set header value with DEL", change: func(s *traffic.Set) { httpRoute(s).Rules[1].SetHeaders[0].Value = "a\x7f" },
			want: "header value has control characters"},

		// Matches.
		{name: "GRPCRoute with a path", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[1].Path = &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/"}
		}, want: grpc + "rule 1: match 2: a GRPCRoute matches methods, not paths"},
		{name: "HTTPRoute with a method", change: func(s *traffic.Set) {
			httpRoute(s).Rules[0].Matches[0].Method = &traffic.MethodMatch{Type: traffic.Exact, Method: "Pay"}
		}, want: http + "rule 1: match 1: an HTTPRoute matches paths, not gRPC methods"},
		{name: "method service too long", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[1].Method.Service = long(traffic.MaxPatternBytes + 1)
		}, want: "match 2: method: longer than 1024 bytes"},
		{name: "method name too long", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[3].Method.Method = long(traffic.MaxPatternBytes + 1)
		}, want: "match 4: method: longer than 1024 bytes"},
		{name: "exact method match naming nothing", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[1].Method.Service = ""
		}, want: "match 2: method: names neither a service nor a method"},
		{name: "exact method match bad service", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[1].Method.Service = "shop/v1.Checkout"
		}, want: `method: service "shop/v1.Checkout" is not a gRPC service name`},
		{name: "exact method match service with empty part", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[1].Method.Service = "shop..Checkout"
		}, want: "is not a gRPC service name"},
		{name: "exact method match bad method", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[2].Method.Method = "Re.fund"
		}, want: `match 3: method: method "Re.fund" is not a gRPC method name`},
		{name: "exact method match method starting with a digit", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[2].Method.Method = "1Refund"
		}, want: "is not a gRPC method name"},
		{name: "regex method match naming nothing", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[3].Method = &traffic.MethodMatch{Type: traffic.RegularExpression}
		}, want: "match 4: method: names neither a service nor a method"},
		{name: "regex method match bad service", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[3].Method.Service = "shop.(v1"
		}, want: `match 4: method: regular expression "shop.(v1": missing closing )`},
		{name: "regex method match bad method", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[3].Method.Method = "Get[a-"
		}, want: `method: regular expression "Get[a-"`},
		{name: "method match of unknown type", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[1].Method.Type = traffic.PathPrefix
		}, want: `match 2: method: unknown match type "PathPrefix"`},
		{name: "method match without type", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[1].Method.Type = ""
		}, want: `method: unknown match type ""`},
		{name: "path too long", change: func(s *traffic.Set) {
			httpRoute(s).Rules[0].Matches[0].Path.Value = "/" + long(traffic.MaxPatternBytes)
		}, want: http + "rule 1: match 1: path: longer than 1024 bytes"},
		{name: "exact path without slash", change: func(s *traffic.Set) { httpRoute(s).Rules[0].Matches[0].Path.Value = "healthz" },
			want: `path: "healthz" does not start with /`},
		{name: "empty path prefix", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Matches[0].Path.Value = "" },
			want: `rule 2: match 1: path: "" does not start with /`},
		{name: "path with double slash", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Matches[0].Path.Value = "/api//v1" },
			want: `path: "/api//v1" is not a plain path`},
		{name: "path with query", change: func(s *traffic.Set) { httpRoute(s).Rules[0].Matches[0].Path.Value = "/healthz?full" },
			want: "is not a plain path"},
		{name: "path with fragment", change: func(s *traffic.Set) { httpRoute(s).Rules[0].Matches[0].Path.Value = "/healthz#top" },
			want: "is not a plain path"},
		{name: "path with control character", change: func(s *traffic.Set) { httpRoute(s).Rules[0].Matches[0].Path.Value = "/health\nz" },
			want: "is not a plain path"},
		{name: "path regex invalid", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Matches[1].Path.Value = "^/items/[0-9+$" },
			want: `rule 2: match 2: path: regular expression "^/items/[0-9+$"`},
		{name: "path regex too long", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Matches[1].Path.Value = long(traffic.MaxPatternBytes + 1) },
			want: "path: longer than 1024 bytes"},
		{name: "path match of unknown type", change: func(s *traffic.Set) { httpRoute(s).Rules[0].Matches[0].Path.Type = "Prefix" },
			want: `path: unknown match type "Prefix"`},
		{name: "more than MaxHeaders header matches", change: func(s *traffic.Set) {
			httpRoute(s).Rules[0].Matches[0].Headers = headerMatches(traffic.MaxHeaders + 1)
		}, want: http + "rule 1: match 1: 17 header matches (at most 16)"},
		{name: "header matched twice", change: func(s *traffic.Set) {
			m := &grpcRoute(s).Rules[0].Matches[0]
			m.Headers = append(m.Headers, traffic.HeaderMatch{Type: traffic.Exact, Name: "x-tenant", Value: "other"})
		}, want: grpc + `rule 1: match 1: header "x-tenant" is matched twice`},
		{name: "header matched twice in two cases, normalized", change: func(s *traffic.Set) {
			m := &grpcRoute(s).Rules[0].Matches[0]
			m.Headers = append(m.Headers, traffic.HeaderMatch{Type: traffic.Exact, Name: "X-Tenant", Value: "other"})
			s.Normalize()
		}, want: `header "x-tenant" is matched twice`},
		{name: "header match :path", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Name = ":path" },
			want: grpc + `rule 1: match 1: header 1: header`, also: `":path" is`},
		{name: "header match grpc-timeout", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Name = "grpc-timeout" },
			want: `header 1: header "grpc-timeout" is reserved`},
		{name: "regex header match :authority", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[1].Name = ":authority" },
			want: `header 2: header`, also: `":authority" is`},
		{name: "header match without name", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Name = "" },
			want: "header 1: header name must be 1-256 bytes"},
		{name: "header match name not a token", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Name = "x/tenant" },
			want: `header 1: header name "x/tenant" is not an HTTP token`},
		{name: "header match name not ASCII", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Name = "x-tenänt" },
			want: "is not an HTTP token"},
		{name: "exact header match value too long", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[0].Headers[0].Value = long(traffic.MaxValueBytes + 1)
		}, want: "header 1: header value longer than 4096 bytes"},
		{name: "exact header match value with control character", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[0].Headers[0].Value = "ac\x00me"
		}, want: "header 1: header value has control characters"},
		{name: "regex header match invalid", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[1].Value = "^(yes|true$" },
			want: `header 2: regular expression "^(yes|true$"`},
		{name: "regex header match too long", change: func(s *traffic.Set) {
			grpcRoute(s).Rules[0].Matches[0].Headers[1].Value = long(traffic.MaxPatternBytes + 1)
		}, want: "header 2: longer than 1024 bytes"},
		{name: "header match of unknown type", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Matches[0].Headers[0].Type = traffic.PathPrefix },
			want: `header 1: unknown match type "PathPrefix"`},

		// Backends.
		{name: "unknown backend kind", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[1].Kind = "Pod" },
			want: grpc + `rule 1: backend 2: kind "Pod" is neither a Service nor a ServiceImport`},
		{name: "empty backend kind", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[1].Kind = "" },
			want: `backend 2: kind "" is neither a Service nor a ServiceImport`},
		{name: "backend name empty", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[0].Name = "" },
			want: `backend 1: name "" is not a service name`},
		{name: "backend name upper case", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[0].Name = "Checkout" },
			want: `backend 1: name "Checkout" is not a service name`},
		{name: "backend name dotted", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[0].Name = "checkout.shop" },
			want: "is not a service name"},
		{name: "backend name too long", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[0].Name = long(64) },
			want: "is not a service name"},
		{name: "backend port negative", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[1].Port = -1 },
			want: "backend 2: port -1 is out of range"},
		{name: "backend port above 65535", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[0].Port = 65536 },
			want: "backend 1: port 65536 is out of range"},
		{name: "Service backend without port", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[0].Port = 0 },
			want: grpc + "rule 1: backend 1: a Service backend needs a port"},
		{name: "backend weight negative", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[0].Weight = -1 },
			want: "backend 1: weight -1 is out of range 0-1000000"},
		{name: "backend weight above MaxWeight", change: func(s *traffic.Set) { grpcRoute(s).Rules[0].Backends[1].Weight = traffic.MaxWeight + 1 },
			want: "backend 2: weight 1000001 is out of range 0-1000000"},

		// Route retries.
		{name: "retry attempts 0", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.Attempts = 0 },
			want: http + "rule 2: retry: attempts 0 is out of range 1-10"},
		{name: "retry attempts 11", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.Attempts = 11 },
			want: "retry: attempts 11 is out of range 1-10"},
		{name: "retry attempts negative", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.Attempts = -1 },
			want: "retry: attempts -1 is out of range 1-10"},
		{name: "retry backoff negative", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.Backoff = -time.Millisecond },
			want: "rule 2: retry: backoff is negative"},
		{name: "retry backoff below 1ms", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.Backoff = time.Microsecond },
			want: "retry: backoff 1µs is shorter than 1ms"},
		{name: "retry backoff above 24h", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.Backoff = 25 * time.Hour },
			want: "retry: backoff 25h0m0s is longer than 24h0m0s"},
		{name: "HTTP retry by gRPC status", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.GRPCCodes = []string{"unavailable"} },
			want: "rule 2: retry: an HTTPRoute retries by HTTP status"},
		{name: "HTTP code 399", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.HTTPCodes = []int32{500, 399} },
			want: "retry: HTTP status 399 is out of range 400-599"},
		{name: "HTTP code 600", change: func(s *traffic.Set) { httpRoute(s).Rules[1].Retry.HTTPCodes = []int32{600} },
			want: "retry: HTTP status 600 is out of range 400-599"},
		{name: "more than 100 HTTP codes", change: func(s *traffic.Set) {
			codes := make([]int32, 101)
			for i := range codes {
				codes[i] = 400 + int32(i)
			}
			httpRoute(s).Rules[1].Retry.HTTPCodes = codes
		}, want: "retry: more than 100 status codes"},

		// The policy.
		{name: "policy name empty", change: func(s *traffic.Set) { s.Policy.Name = "" }, want: `TrafficPolicy "": name is not a DNS subdomain`},
		{name: "policy name upper case", change: func(s *traffic.Set) { s.Policy.Name = "Checkout" },
			want: `TrafficPolicy "Checkout": name is not a DNS subdomain`},
		{name: "policy name of 254 bytes", change: func(s *traffic.Set) { s.Policy.Name = name253 + "a" }, want: "name is not a DNS subdomain"},
		{name: "unknown algorithm", change: func(s *traffic.Set) { s.Policy.LoadBalancer.Algorithm = "Random" },
			want: policy + `loadBalancer: unknown algorithm "Random"`},
		{name: "empty algorithm", change: func(s *traffic.Set) { s.Policy.LoadBalancer = &traffic.LoadBalancer{} },
			want: `loadBalancer: unknown algorithm ""`},
		{name: "choiceCount for RoundRobin", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.RoundRobin, ChoiceCount: 2}
		}, want: policy + "loadBalancer: choiceCount is for LeastRequest"},
		{name: "choiceCount 1", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.LeastRequest, ChoiceCount: 1}
		}, want: "loadBalancer: choiceCount 1 is out of range 2-10"},
		{name: "choiceCount 11", change: func(s *traffic.Set) {
			s.Policy.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.LeastRequest, ChoiceCount: 11}
		}, want: "loadBalancer: choiceCount 11 is out of range 2-10"},
		{name: "hashHeader for LeastRequest", change: func(s *traffic.Set) { s.Policy.LoadBalancer.Algorithm = traffic.LeastRequest },
			want: policy + "loadBalancer: hashHeader is for RingHash"},
		{name: "hashHeader :authority", change: func(s *traffic.Set) { s.Policy.LoadBalancer.HashHeader = ":authority" },
			want: policy + `loadBalancer: hashHeader: header`, also: `":authority" is`},
		{name: "hashHeader grpc-timeout", change: func(s *traffic.Set) { s.Policy.LoadBalancer.HashHeader = "grpc-timeout" },
			want: `hashHeader: header "grpc-timeout" is reserved`},
		{name: "hashHeader not a token", change: func(s *traffic.Set) { s.Policy.LoadBalancer.HashHeader = "x session" },
			want: `hashHeader: header name "x session" is not an HTTP token`},
		{name: "hashHeader too long", change: func(s *traffic.Set) { s.Policy.LoadBalancer.HashHeader = long(traffic.MaxHeaderNameBytes + 1) },
			want: "hashHeader: header name must be 1-256 bytes"},
		{name: "locality off and failoverPriority", change: func(s *traffic.Set) { s.Policy.Locality.Off = true },
			want: policy + "locality: at most one of off, failoverPriority, failover and distribute"},
		{name: "locality failover and distribute", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: failovers(1), Distribute: distributions(1)}
		}, want: "locality: at most one of off, failoverPriority, failover and distribute"},
		{name: "more than 4 failoverPriority labels", change: func(s *traffic.Set) {
			s.Policy.Locality.FailoverPriority = []string{traffic.LabelCluster, traffic.LabelNetwork, traffic.LabelRegion, traffic.LabelZone, traffic.LabelZone}
		}, want: "locality: 5 failoverPriority labels (at most 4)"},
		{name: "failoverPriority unknown label", change: func(s *traffic.Set) {
			s.Policy.Locality.FailoverPriority = []string{traffic.LabelRegion, "kubernetes.io/hostname"}
		}, want: policy + `locality: failoverPriority label "kubernetes.io/hostname" is not one Nave knows of every endpoint`},
		{name: "failoverPriority empty label", change: func(s *traffic.Set) { s.Policy.Locality.FailoverPriority = []string{""} },
			want: `failoverPriority label "" is not one Nave knows`},
		{name: "failoverPriority repeated label", change: func(s *traffic.Set) {
			s.Policy.Locality.FailoverPriority = []string{traffic.LabelZone, traffic.LabelRegion, traffic.LabelZone}
		}, want: policy + `locality: failoverPriority names "topology.kubernetes.io/zone" twice`},
		{name: "more than MaxLocalityRules failovers", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: failovers(traffic.MaxLocalityRules + 1)}
		}, want: "locality: more than 16 failover or distribute entries"},
		{name: "more than MaxLocalityRules distributions", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(traffic.MaxLocalityRules + 1)}
		}, want: "locality: more than 16 failover or distribute entries"},
		{name: "failover from empty", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "a", To: "b"}, {To: "b"}}}
		}, want: "locality: failover 2: regions must be non-empty names of at most 200 bytes"},
		{name: "failover to a zone", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "a", To: "b/b1"}}}
		}, want: "failover 1: regions must be non-empty names"},
		{name: "failover from any", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "*", To: "b"}}}
		}, want: "failover 1: regions must be non-empty names"},
		{name: "failover region with space", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "us east", To: "b"}}}
		}, want: "failover 1: regions must be non-empty names"},
		{name: "failover region too long", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "a", To: long(traffic.MaxLocalityBytes + 1)}}}
		}, want: "failover 1: regions must be non-empty names"},
		{name: "failover to itself", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "us-east-1", To: "us-east-1"}}}
		}, want: `locality: failover 1: from and to are both "us-east-1"`},
		{name: "failover from twice", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{
				{From: "us-east-1", To: "us-west-2"}, {From: "eu-west-1", To: "us-west-2"}, {From: "us-east-1", To: "eu-west-1"}}}
		}, want: `locality: failover from "us-east-1" is given twice`},
		{name: "distribute from of four parts", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			s.Policy.Locality.Distribute[0].From = "a/b/c/d"
		}, want: policy + `locality: distribute 1: from "a/b/c/d" is not region[/zone[/subzone]] (each a name or *)`},
		{name: "distribute from empty", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			s.Policy.Locality.Distribute[0].From = ""
		}, want: `distribute 1: from "" is not region[/zone[/subzone]]`},
		{name: "distribute from with empty zone", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			s.Policy.Locality.Distribute[0].From = "us-east-1/"
		}, want: `distribute 1: from "us-east-1/" is not region[/zone[/subzone]]`},
		{name: "distribute to nothing", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(2)}
			s.Policy.Locality.Distribute[1].To = nil
		}, want: "locality: distribute 2: to lists 0 localities (1-16)"},
		{name: "distribute to more than MaxLocalityRules", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			to := make([]traffic.LocalityWeight, traffic.MaxLocalityRules+1)
			for i := range to {
				to[i] = traffic.LocalityWeight{Locality: "r" + strconv.Itoa(i), Weight: 1}
			}
			to[0].Weight = 100 - traffic.MaxLocalityRules
			s.Policy.Locality.Distribute[0].To = to
		}, want: "distribute 1: to lists 17 localities (1-16)"},
		{name: "distribute to a bad locality", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			s.Policy.Locality.Distribute[0].To = []traffic.LocalityWeight{{Locality: "a", Weight: 50}, {Locality: "b c", Weight: 50}}
		}, want: `distribute 1: to "b c" is not region[/zone[/subzone]]`},
		{name: "distribute to a locality twice", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			s.Policy.Locality.Distribute[0].To = []traffic.LocalityWeight{{Locality: "a/*", Weight: 50}, {Locality: "a/*", Weight: 50}}
		}, want: `distribute 1: to names "a/*" twice`},
		{name: "distribute weights sum below 100", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			s.Policy.Locality.Distribute[0].To = []traffic.LocalityWeight{{Locality: "a", Weight: 50}, {Locality: "b", Weight: 49}}
		}, want: policy + "locality: distribute 1: weights sum to 99, not 100"},
		{name: "distribute weights sum above 100", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			s.Policy.Locality.Distribute[0].To = []traffic.LocalityWeight{{Locality: "a", Weight: 101}}
		}, want: "distribute 1: weights sum to 101, not 100"},
		{name: "distribute weights that wrap a uint32 to 100", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(1)}
			s.Policy.Locality.Distribute[0].To = []traffic.LocalityWeight{{Locality: "a", Weight: 1<<32 - 1}, {Locality: "b", Weight: 101}}
		}, want: "distribute 1: weights sum to 4294967396, not 100"},
		{name: "distribute from twice", change: func(s *traffic.Set) {
			s.Policy.Locality = &traffic.LocalityPolicy{Distribute: distributions(3)}
			s.Policy.Locality.Distribute[2].From = "r0"
		}, want: `locality: distribute from "r0" is given twice`},
		{name: "outlier detection without a detector", change: func(s *traffic.Set) {
			s.Policy.OutlierDetection = &traffic.OutlierDetection{Interval: time.Second, MaxEjectionPercent: 10}
		}, want: policy + "outlierDetection: names no detector (consecutiveErrors, failurePercentage or successRate)"},
		{name: "failure percentage threshold 101", change: func(s *traffic.Set) { s.Policy.OutlierDetection.FailurePercentage.Threshold = 101 },
			want: policy + "outlierDetection: failurePercentage threshold 101 is above 100"},
		{name: "maxEjectionPercent 101", change: func(s *traffic.Set) { s.Policy.OutlierDetection.MaxEjectionPercent = 101 },
			want: "outlierDetection: maxEjectionPercent 101 is above 100"},
		{name: "outlier interval negative", change: func(s *traffic.Set) { s.Policy.OutlierDetection.Interval = -1 },
			want: "outlierDetection: interval is negative"},
		{name: "outlier base ejection time below 1ms", change: func(s *traffic.Set) { s.Policy.OutlierDetection.BaseEjectionTime = 500 * time.Microsecond },
			want: "outlierDetection: baseEjectionTime 500µs is shorter than 1ms"},
		{name: "outlier max ejection time above 24h", change: func(s *traffic.Set) { s.Policy.OutlierDetection.MaxEjectionTime = 48 * time.Hour },
			want: "outlierDetection: maxEjectionTime 48h0m0s is longer than 24h0m0s"},
		{name: "policy timeout negative", change: func(s *traffic.Set) { s.Policy.Timeout = -time.Second },
			want: policy + "timeout is negative"},
		{name: "policy timeout below 1ms", change: func(s *traffic.Set) { s.Policy.Timeout = 999 * time.Microsecond },
			want: policy + "timeout 999µs is shorter than 1ms"},
		{name: "policy timeout above 24h", change: func(s *traffic.Set) { s.Policy.Timeout = traffic.MaxDuration + time.Millisecond },
			want: policy + "timeout 24h0m0.001s is longer than 24h0m0s"},
		{name: "policy retry attempts 0", change: func(s *traffic.Set) { s.Policy.Retry.Attempts = 0 },
			want: policy + "retry: attempts 0 is out of range 1-10"},
		{name: "policy retry attempts 11", change: func(s *traffic.Set) { s.Policy.Retry.Attempts = 11 },
			want: policy + "retry: attempts 11 is out of range 1-10"},
		{name: "policy retry backoff above 24h", change: func(s *traffic.Set) { s.Policy.Retry.Backoff = traffic.MaxDuration + 1 },
			want: policy + "retry: backoff 24h0m0.000000001s is longer than 24h0m0s"},
		{name: "policy retry by HTTP status", change: func(s *traffic.Set) { s.Policy.Retry.HTTPCodes = []int32{503} },
			want: policy + "retry: retries by gRPC status, not HTTP status"},
		{name: "policy retry without codes", change: func(s *traffic.Set) { s.Policy.Retry.GRPCCodes = nil },
			want: policy + "retry: names no gRPC status to retry on"},
		{name: "policy retry on ok", change: func(s *traffic.Set) { s.Policy.Retry.GRPCCodes = []string{"unavailable", "ok"} },
			want: policy + `retry: gRPC status "ok" cannot be retried on (one of cancelled, deadline-exceeded, internal, resource-exhausted, unavailable)`},
		{name: "policy retry on upper-case code", change: func(s *traffic.Set) { s.Policy.Retry.GRPCCodes = []string{"UNAVAILABLE"} },
			want: `retry: gRPC status "UNAVAILABLE" cannot be retried on`},
		{name: "policy retry on a code twice", change: func(s *traffic.Set) {
			s.Policy.Retry.GRPCCodes = []string{"unavailable", "internal", "unavailable"}
		}, want: policy + `retry: gRPC status "unavailable" is named twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSet()
			tt.change(s)
			err := s.Validate()
			// Route.Validate and Policy.Validate check each part alone:
			// partErr is the first part's error, in the order Set.Validate
			// checks them.
			var partErr error
			for i := range s.Routes {
				if partErr = s.Routes[i].Validate(); partErr != nil {
					break
				}
			}
			if partErr == nil && s.Policy != nil {
				partErr = s.Policy.Validate()
			}
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if partErr != nil {
					t.Fatalf("Set.Validate() passes, but a part does not: %v", partErr)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error containing %q", tt.want)
			}
			if !errors.Is(err, traffic.ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.also) {
				t.Errorf("Validate() = %q, want it to contain %q and %q", err, tt.want, tt.also)
			}
			if tt.whole {
				return
			}
			if partErr == nil {
				t.Fatalf("Set.Validate() = %v, but every route and the policy pass alone", err)
			}
			if !errors.Is(partErr, traffic.ErrInvalid) || partErr.Error() != err.Error() {
				t.Errorf("the part's Validate() = %v, want what Set.Validate says: %v", partErr, err)
			}
		})
	}
}

// The set-wide rules apply to the set as a whole: the same routes pass
// Route.Validate alone.
func TestSetValidateWholeRulesPassPartsAlone(t *testing.T) {
	s := validSet()
	s.Routes = append(s.Routes, s.Routes[0])
	grpcRoute(s).Rules[1].Matches = regexMatches(traffic.MaxRegexes)
	for i := range s.Routes {
		if err := s.Routes[i].Validate(); err != nil {
			t.Fatalf("route %d: %v", i, err)
		}
	}
	if err := s.Validate(); err == nil || !errors.Is(err, traffic.ErrInvalid) {
		t.Fatalf("Validate() = %v, want an error", err)
	}
}

// A message quotes what it names, cut to 64 bytes, so a peer cannot make an
// error (and a log line) as long as what it sent.
func TestValidateQuotesBriefly(t *testing.T) {
	s := validSet()
	grpcRoute(s).Rules[0].Matches[3].Method.Service = "(" + long(traffic.MaxPatternBytes-1)
	err := s.Validate()
	if err == nil || !strings.Contains(err.Error(), `"(`+long(63)+`..."`) {
		t.Fatalf("Validate() = %v, want the regular expression quoted and cut to 64 bytes", err)
	}
	if len(err.Error()) > 400 {
		t.Errorf("error of %d bytes", len(err.Error()))
	}
}
