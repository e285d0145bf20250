package federation

import (
	"errors"
	"math"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// validTraffic is a normalized set that passes validation and uses every
// feature of the model: a GRPCRoute and an HTTPRoute with every kind of
// match, weighted backends of both kinds, a timeout, a retry and set
// headers, and a policy with every part.
func validTraffic() *traffic.Set {
	s := &traffic.Set{
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
							{Method: &traffic.MethodMatch{Type: traffic.RegularExpression, Service: `shop\.v[0-9]+\.Checkout`, Method: "Get.*"}},
						},
						Backends: []traffic.Backend{
							{Kind: traffic.BackendService, Name: "checkout-v2", Port: 9090, Weight: 90},
							{Kind: traffic.BackendServiceImport, Name: "checkout", Weight: 10},
						},
					},
					{Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "checkout", Port: 9090, Weight: 1}}},
				},
			},
			{
				Kind: traffic.HTTPRoute, Name: "checkout-http", CreatedAt: time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC), Port: 8080,
				Rules: []traffic.Rule{
					{
						Matches: []traffic.Match{
							{Path: &traffic.PathMatch{Type: traffic.Exact, Value: "/healthz"}},
							{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/api/v1"},
								Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-version", Value: "2"}}},
							{Path: &traffic.PathMatch{Type: traffic.RegularExpression, Value: `^/items/[0-9]+$`}},
						},
						Backends:   []traffic.Backend{{Kind: traffic.BackendService, Name: "checkout", Port: 8080, Weight: 1}},
						Timeout:    30 * time.Second,
						Retry:      &traffic.Retry{Attempts: 3, Backoff: 100 * time.Millisecond, HTTPCodes: []int32{500, 502, 503}},
						SetHeaders: []traffic.Header{{Name: "x-routed-by", Value: "nave"}},
					},
				},
			},
		},
		Policy: &traffic.Policy{
			Name:         "checkout",
			LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-session"},
			Locality: &traffic.LocalityPolicy{Distribute: []traffic.Distribution{
				{From: "us-east-1/us-east-1a", To: []traffic.LocalityWeight{{Locality: "us-east-1/us-east-1a", Weight: 80}, {Locality: "*", Weight: 20}}},
			}},
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
	s.Normalize()
	return s
}

// everyTrafficField is a normalized set in which every field of every
// struct is set (it is not valid: a valid set cannot set them all at once),
// to show the wire carries each of them.
func everyTrafficField() *traffic.Set {
	retry := func() *traffic.Retry {
		return &traffic.Retry{Attempts: 4, Backoff: 3 * time.Millisecond, HTTPCodes: []int32{503, 429}, GRPCCodes: []string{"internal", "cancelled"}}
	}
	s := &traffic.Set{
		Routes: []traffic.Route{{
			Kind: "TCPRoute", Name: "every", CreatedAt: time.Unix(-86400, 0).UTC(), Port: -7,
			Rules: []traffic.Rule{{
				Matches: []traffic.Match{{
					Method:  &traffic.MethodMatch{Type: "T1", Service: "S", Method: "M"},
					Path:    &traffic.PathMatch{Type: "T2", Value: "V"},
					Headers: []traffic.HeaderMatch{{Type: "T3", Name: "n", Value: "v"}, {Type: "T4", Name: "m", Value: "w"}},
				}},
				Backends:   []traffic.Backend{{Kind: "K", Name: "b", Port: 65536, Weight: -3}},
				Timeout:    -time.Nanosecond,
				Retry:      retry(),
				SetHeaders: []traffic.Header{{Name: "h", Value: "v"}},
			}},
		}},
		Policy: &traffic.Policy{
			Name:         "p",
			LoadBalancer: &traffic.LoadBalancer{Algorithm: "A", ChoiceCount: math.MaxUint32, HashHeader: "hh"},
			Locality: &traffic.LocalityPolicy{
				Off: true, FailoverPriority: []string{"l1", "l2"},
				Failover:   []traffic.RegionFailover{{From: "f", To: "t"}},
				Distribute: []traffic.Distribution{{From: "d", To: []traffic.LocalityWeight{{Locality: "x", Weight: math.MaxUint32}}}},
			},
			OutlierDetection: &traffic.OutlierDetection{
				Interval: math.MaxInt64, BaseEjectionTime: math.MinInt64, MaxEjectionTime: 1,
				MaxEjectionPercent: 1000, ConsecutiveErrors: 1,
				FailurePercentage: &traffic.FailurePercentage{Threshold: 1, MinimumHosts: 2, RequestVolume: 3},
				SuccessRate:       &traffic.SuccessRate{StdevFactor: 4, MinimumHosts: 5, RequestVolume: 6},
			},
			MaxRequests: 7, Timeout: 8, Retry: retry(),
		},
	}
	s.Normalize()
	return s
}

// unsetFields lists the paths of the zero fields, nil pointers and empty
// lists under v.
func unsetFields(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return []string{path}
		}
		return unsetFields(v.Elem(), path)
	case reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		var out []string
		for i := range v.Len() {
			out = append(out, unsetFields(v.Index(i), path+"["+strconv.Itoa(i)+"]")...)
		}
		return out
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			if v.Interface().(time.Time).IsZero() {
				return []string{path}
			}
			return nil
		}
		var out []string
		for i := range v.NumField() {
			out = append(out, unsetFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
		}
		return out
	}
	if v.IsZero() {
		return []string{path}
	}
	return nil
}

// wireTraffic is s through the encoder and the wire, decoded and normalized.
func wireTraffic(t *testing.T, s *traffic.Set) traffic.Set {
	t.Helper()
	p := trafficToProto(s)
	if p == nil {
		t.Fatalf("trafficToProto(%+v) = nil", s)
	}
	var back fedv1.Traffic
	if err := proto.Unmarshal(mustMarshal(t, p), &back); err != nil {
		t.Fatal(err)
	}
	got, problem := trafficFromProto(&back)
	if problem != "" {
		t.Fatalf("trafficFromProto() refused it: %s", problem)
	}
	got.Normalize()
	return got
}

func TestTrafficRoundTrip(t *testing.T) {
	if unset := unsetFields(reflect.ValueOf(everyTrafficField()), "set"); len(unset) > 0 {
		t.Fatalf("everyTrafficField leaves fields unset: %v", unset)
	}
	if err := validTraffic().Validate(); err != nil {
		t.Fatalf("validTraffic does not validate: %v", err)
	}
	tests := []struct {
		name string
		set  *traffic.Set
	}{
		{"full-featured", validTraffic()},
		{"every field", everyTrafficField()},
		{"routes only", &traffic.Set{Routes: validTraffic().Routes}},
		{"policy only", &traffic.Set{Policy: validTraffic().Policy}},
		{"empty policy", &traffic.Set{Policy: &traffic.Policy{}}},
		{"empty parts", &traffic.Set{
			Routes: []traffic.Route{{Kind: traffic.HTTPRoute, Name: "r", Rules: []traffic.Rule{{Matches: []traffic.Match{{}}, Retry: &traffic.Retry{}}}}},
			Policy: &traffic.Policy{Name: "p", LoadBalancer: &traffic.LoadBalancer{}, Locality: &traffic.LocalityPolicy{},
				OutlierDetection: &traffic.OutlierDetection{FailurePercentage: &traffic.FailurePercentage{}, SuccessRate: &traffic.SuccessRate{}},
				Retry:            &traffic.Retry{}},
		}},
		{"route without rules", &traffic.Set{Routes: []traffic.Route{{Kind: traffic.GRPCRoute, Name: "r"}}}},
		{"created before the epoch", &traffic.Set{Routes: []traffic.Route{{Kind: traffic.GRPCRoute, Name: "r", CreatedAt: time.Unix(-1, 0).UTC()}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.set.Normalize()
			got := wireTraffic(t, tt.set)
			if !got.Equal(tt.set) {
				t.Fatalf("round trip changed the set:\n got %+v\nwant %+v", got, *tt.set)
			}
		})
	}
}

// A field the wire dropped would go unnoticed by a round trip of a set
// without it: each change to the full set must survive the wire.
func TestTrafficRoundTripKeepsChanges(t *testing.T) {
	changes := map[string]func(s *traffic.Set){
		"created at":    func(s *traffic.Set) { s.Routes[0].CreatedAt = s.Routes[0].CreatedAt.Add(time.Second) },
		"port":          func(s *traffic.Set) { s.Routes[1].Port = 0 },
		"weight":        func(s *traffic.Set) { s.Routes[0].Rules[0].Backends[0].Weight = 0 },
		"timeout":       func(s *traffic.Set) { s.Routes[1].Rules[0].Timeout += time.Millisecond },
		"backoff":       func(s *traffic.Set) { s.Routes[1].Rules[0].Retry.Backoff = 0 },
		"hash header":   func(s *traffic.Set) { s.Policy.LoadBalancer.HashHeader = "" },
		"max requests":  func(s *traffic.Set) { s.Policy.MaxRequests = 0 },
		"detector gone": func(s *traffic.Set) { s.Policy.OutlierDetection.SuccessRate = nil },
		"locality gone": func(s *traffic.Set) { s.Policy.Locality = nil },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			s := validTraffic()
			change(s)
			s.Normalize()
			if s.Equal(validTraffic()) {
				t.Fatal("the change changes nothing")
			}
			if got := wireTraffic(t, s); !got.Equal(s) {
				t.Fatalf("round trip lost the change:\n got %+v\nwant %+v", got, *s)
			}
		})
	}
}

func TestTrafficZeroSetEncodesAsNothing(t *testing.T) {
	for _, s := range []*traffic.Set{{}, {Routes: []traffic.Route{}}} {
		if p := trafficToProto(s); p != nil {
			t.Errorf("trafficToProto(%+v) = %v, want nil", s, p)
		}
	}
	if p := trafficToProto(&traffic.Set{Policy: &traffic.Policy{}}); p == nil || p.GetPolicy() == nil {
		t.Errorf("a set of an empty policy encodes as %v, want the policy", p)
	}
	for _, p := range []*fedv1.Traffic{nil, {}} {
		if s, problem := trafficFromProto(p); problem != "" || !s.IsZero() || !s.Equal(&traffic.Set{}) {
			t.Errorf("trafficFromProto(%v) = %+v, %q; want the zero set", p, s, problem)
		}
	}
	// A shard without traffic sends none.
	sh := trafficShard()
	sh.Traffic = traffic.Set{}
	if p := ShardToProto(sh); p.Traffic != nil {
		t.Errorf("a shard without traffic sends %v", p.Traffic)
	}
}

// sizedTraffic is a traffic message of exactly n bytes on the wire.
func sizedTraffic(t *testing.T, n int) *fedv1.Traffic {
	t.Helper()
	h := &fedv1.TrafficHeader{Name: "x-pad"}
	p := &fedv1.Traffic{Routes: []*fedv1.TrafficRoute{{Kind: string(traffic.HTTPRoute), Name: "big",
		Rules: []*fedv1.TrafficRule{{SetHeaders: []*fedv1.TrafficHeader{h}}}}}}
	for range 10 {
		d := n - proto.Size(p)
		if d == 0 {
			return p
		}
		h.Value = strings.Repeat("a", len(h.Value)+d)
	}
	t.Fatalf("no traffic message of %d bytes", n)
	return nil
}

func TestTrafficFromProtoBoundsWireBytes(t *testing.T) {
	at := sizedTraffic(t, maxTrafficWireBytes)
	s, problem := trafficFromProto(at)
	if problem != "" || len(s.Routes) != 1 || len(s.Routes[0].Rules[0].SetHeaders[0].Value) < maxTrafficWireBytes-100 {
		t.Fatalf("traffic of maxTrafficWireBytes: %q, want it decoded", problem)
	}

	over := sizedTraffic(t, maxTrafficWireBytes+1)
	s, problem = trafficFromProto(over)
	if want := "its routes and policy take 65537 bytes, more than the limit of 65536"; problem != want {
		t.Errorf("traffic of maxTrafficWireBytes+1: problem %q, want %q", problem, want)
	}
	if !s.IsZero() {
		t.Errorf("refused traffic was decoded: %d routes", len(s.Routes))
	}

	// In a shard: refused for its wire size, or (at the limit) for what it holds.
	for _, tt := range []struct {
		name string
		p    *fedv1.Traffic
		want string
	}{
		{"over the wire limit", over, "its routes and policy take 65537 bytes, more than the limit of 65536"},
		{"at the wire limit", at, "bytes (at most 65536)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := ShardToProto(trafficShard())
			p.Traffic = tt.p
			_, err := ShardFromProto("east", p, registry.DefaultLimits())
			var ve *registry.ValidationError
			if !errors.As(err, &ve) || !strings.Contains(ve.Reason, tt.want) {
				t.Fatalf("ShardFromProto() = %v, want a ValidationError containing %q", err, tt.want)
			}
		})
	}
}

// trafficShard is a valid normalized shard with validTraffic.
func trafficShard() *registry.Shard {
	s := &registry.Shard{
		Cluster: "east", Service: registry.ServiceKey{Namespace: "shop", Name: "checkout"},
		ExportedAt: time.Unix(1_767_323_045, 0).UTC(),
		Ports: []registry.ServicePort{
			{Name: "grpc", Port: 9090, Protocol: registry.ProtocolTCP, AppProtocol: "kubernetes.io/h2c"},
			{Name: "http", Port: 8080, Protocol: registry.ProtocolTCP},
		},
		Endpoints: []registry.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
			Ports:      []registry.EndpointPort{{Name: "grpc", Port: 9090}, {Name: "http", Port: 8080}},
			Locality:   registry.Locality{Region: "us-east-1", Zone: "us-east-1a"},
			Conditions: registry.Conditions{Ready: true, Serving: true}}},
		Traffic: *validTraffic(),
	}
	s.Normalize()
	return s
}

func TestShardRoundTripKeepsTraffic(t *testing.T) {
	in := trafficShard()
	if err := in.Validate(registry.DefaultLimits()); err != nil {
		t.Fatalf("trafficShard does not validate: %v", err)
	}
	p := ShardToProto(in)
	if p.GetTraffic() == nil {
		t.Fatal("ShardToProto sends no traffic")
	}
	var wire fedv1.Shard
	if err := proto.Unmarshal(mustMarshal(t, p), &wire); err != nil {
		t.Fatal(err)
	}
	out, err := ShardFromProto("east", &wire, registry.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if !out.Traffic.Equal(&in.Traffic) {
		t.Fatalf("round trip changed the traffic:\n got %+v\nwant %+v", out.Traffic, in.Traffic)
	}
	if !out.Equal(in) || out.Hash() != in.Hash() {
		t.Errorf("round trip changed the shard or its hash")
	}

	// The traffic is part of the shard's hash: the wire must keep it exactly.
	bare := *in
	bare.Traffic = traffic.Set{}
	if bare.Hash() == in.Hash() {
		t.Error("a shard hashes alike with and without its traffic")
	}

	// Traffic sent unnormalized (routes out of order, header names in
	// upper case) is normalized on decoding, to the same shard and hash.
	messy := ShardToProto(in)
	r := messy.Traffic.Routes
	r[0], r[1] = r[1], r[0]
	r[1].Rules[0].Matches[0].Headers[0].Name = "X-Tenant"
	r[0].Rules[0].SetHeaders[0].Name = "X-Routed-By"
	messy.Traffic.Policy.LoadBalancer.HashHeader = "X-Session"
	out, err = ShardFromProto("east", messy, registry.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if !out.Equal(in) || out.Hash() != in.Hash() {
		t.Errorf("unnormalized traffic decoded as\n%+v\nwant\n%+v", out.Traffic, in.Traffic)
	}
}

func TestShardFromProtoRefusesInvalidTraffic(t *testing.T) {
	tests := []struct {
		name   string
		change func(p *fedv1.Traffic)
		want   string
	}{
		{"unknown route kind", func(p *fedv1.Traffic) { p.Routes[1].Kind = "TCPRoute" }, `TCPRoute "checkout-http": unknown route kind`},
		{"weight out of range", func(p *fedv1.Traffic) { p.Routes[0].Rules[0].Backends[1].Weight = -1 },
			`GRPCRoute "checkout-grpc": rule 1: backend 2: weight -1 is out of range`},
		{"GRPCRoute with a timeout", func(p *fedv1.Traffic) { p.Routes[0].Rules[1].TimeoutNanos = int64(time.Second) },
			"a GRPCRoute has no timeout or retry"},
		{"retry on ok", func(p *fedv1.Traffic) { p.Policy.Retry.GrpcCodes = []string{"ok"} },
			`TrafficPolicy "checkout": retry: gRPC status "ok" cannot be retried on`},
		{"duplicate route", func(p *fedv1.Traffic) { p.Routes = append(p.Routes, p.Routes[0]) },
			`GRPCRoute "checkout-grpc" appears twice`},
		// Decoding normalizes before it validates: names that differ in
		// case only are one header.
		{"header matched twice in two cases", func(p *fedv1.Traffic) {
			m := p.Routes[0].Rules[0].Matches[0]
			m.Headers = append(m.Headers, &fedv1.TrafficHeaderMatch{Type: "Exact", Name: "X-Tenant", Value: "other"})
		}, `header "x-tenant" is matched twice`},
		{"more than MaxRegexes", func(p *fedv1.Traffic) {
			rule := p.Routes[0].Rules[1]
			for i := range traffic.MaxRegexes {
				rule.Matches = append(rule.Matches, &fedv1.TrafficMatch{Headers: []*fedv1.TrafficHeaderMatch{
					{Type: "RegularExpression", Name: "x-r", Value: strconv.Itoa(i)}}})
			}
		}, "regular expressions (at most 64)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := trafficShard()
			p := ShardToProto(in)
			tt.change(p.Traffic)
			_, err := ShardFromProto("east", p, registry.DefaultLimits())
			var ve *registry.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ShardFromProto() = %v, want a *registry.ValidationError", err)
			}
			if !errors.Is(err, registry.ErrInvalid) || ve.Service != in.Service {
				t.Errorf("ShardFromProto() = %v, want ErrInvalid naming %v", err, in.Service)
			}
			if !strings.Contains(ve.Reason, tt.want) {
				t.Errorf("reason %q does not contain %q", ve.Reason, tt.want)
			}
			if strings.Contains(ve.Reason, traffic.ErrInvalid.Error()) {
				t.Errorf("reason %q repeats %q", ve.Reason, traffic.ErrInvalid)
			}
			// Decoded alone, the shard is taken as it came.
			if _, err := ShardFromProtoUnvalidated("east", p, registry.DefaultLimits()); err != nil {
				t.Errorf("ShardFromProtoUnvalidated() = %v", err)
			}
		})
	}
}

// A route's creation time is part of the shard's hash, which encodes it as
// RFC 3339 (years 0 to 9999, as for the export time): a shard that
// ShardFromProto accepts must hash, or a spoke could crash the hub's
// digest with one route.
func TestShardFromProtoRouteCreatedOutsideRFC3339Years(t *testing.T) {
	for _, unix := range []int64{
		253402300800,      // 10000-01-01
		-62167219201,      // the last second of the year -1
		math.MaxInt64,     // beyond every year
		math.MinInt64 + 1, // and before
	} {
		t.Run(strconv.FormatInt(unix, 10), func(t *testing.T) {
			p := ShardToProto(trafficShard())
			p.Traffic.Routes[0].CreatedAtUnix = unix
			s, err := ShardFromProto("east", p, registry.DefaultLimits())
			if err != nil {
				var ve *registry.ValidationError
				if !errors.As(err, &ve) {
					t.Fatalf("ShardFromProto() = %v, want a *registry.ValidationError", err)
				}
				return
			}
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("ShardFromProto() accepted a route created at %v, and the shard's Hash panics: %v", s.Traffic.Routes[0].CreatedAt, r)
				}
			}()
			s.Hash()
		})
	}
}
