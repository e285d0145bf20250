package federation

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// The fuzz targets here feed what a peer can send (a spoke's shards and
// gateways, the hub's imports) through the decoders that turn the wire
// into registry values. Whatever a decoder accepts must be valid by the
// registry's own rules and usable by it: it validates again, survives the
// round trip through the encoder unchanged, and a registry can apply it.

// tightLimits are small enough for the fuzzer to reach every limit.
var tightLimits = registry.Limits{MaxPorts: 2, MaxEndpoints: 3, MaxAddressesPerEndpoint: 2,
	MaxServicesPerCluster: 2, MaxEndpointsPerCluster: 4}

// fuzzShards are realistic shards for seeds: a ClusterSetIP service with
// properties and endpoints in two families, a headless one, and a minimal one.
func fuzzShards() []*registry.Shard {
	web := &registry.Shard{
		Cluster: "east", Service: registry.ServiceKey{Namespace: "shop", Name: "web"},
		ExportedAt: time.Unix(1_767_323_045, 0).UTC(),
		Ports: []registry.ServicePort{
			{Name: "http", Port: 80, Protocol: registry.ProtocolTCP, AppProtocol: "http"},
			{Name: "grpc", Port: 9090, Protocol: registry.ProtocolTCP},
		},
		Endpoints: []registry.Endpoint{
			{Addresses: []netip.Addr{netip.MustParseAddr("10.0.1.1")}, Ports: []registry.EndpointPort{{Name: "http", Port: 8080}, {Name: "grpc", Port: 9090}},
				Locality: registry.Locality{Region: "us-east-1", Zone: "us-east-1a"}, NodeName: "node-a.example.internal",
				Conditions: registry.Conditions{Ready: true, Serving: true}},
			{Addresses: []netip.Addr{netip.MustParseAddr("fd00::1:2")}, Ports: []registry.EndpointPort{{Name: "http", Port: 8080}},
				Locality:   registry.Locality{Region: "us-east-1", Zone: "us-east-1b", Subzone: "rack-7"},
				Conditions: registry.Conditions{Serving: true, Terminating: true}},
		},
		Properties: registry.Properties{
			SessionAffinity: registry.SessionAffinityClientIP, SessionAffinityTimeout: 300,
			InternalTrafficPolicy: registry.InternalTrafficPolicyLocal, TrafficDistribution: "PreferClose",
			IPFamilies: []registry.IPFamily{registry.IPv4, registry.IPv6},
			Labels:     map[string]string{"tier": "web"}, Annotations: map[string]string{"example.com/owner": "team a"},
		},
	}
	db := &registry.Shard{
		Cluster: "east", Service: registry.ServiceKey{Namespace: "shop", Name: "db"}, Headless: true,
		Endpoints: []registry.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.0.3.1")}, Hostname: "db-0",
			Ports: []registry.EndpointPort{{Port: 5432}}, Conditions: registry.Conditions{Ready: true, Serving: true}}},
	}
	udp := &registry.Shard{
		Cluster: "east", Service: registry.ServiceKey{Namespace: "kube-system", Name: "dns"},
		Ports: []registry.ServicePort{{Port: 53, Protocol: registry.ProtocolUDP}},
	}
	out := []*registry.Shard{web, db, udp}
	for _, s := range out {
		s.Normalize()
	}
	return out
}

func mustMarshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// checkAcceptedShard fails unless s, accepted from cluster under lim, is
// valid, survives the wire round trip, and is what a registry holds once
// it applies it.
func checkAcceptedShard(t *testing.T, cluster registry.ClusterID, s *registry.Shard, lim registry.Limits) {
	t.Helper()
	if s.Cluster != cluster {
		t.Fatalf("accepted a shard of cluster %q from %q", s.Cluster, cluster)
	}
	if err := s.Validate(lim); err != nil {
		t.Fatalf("accepted shard does not validate: %v", err)
	}
	back, err := ShardFromProto(cluster, ShardToProto(s), lim)
	if err != nil {
		t.Fatalf("accepted shard does not decode after encoding: %v", err)
	}
	// back is normalized; equal means s was too (Equal compares in order).
	if !back.Equal(s) {
		t.Fatalf("round trip changed the shard:\n got %+v\nwant %+v", back, s)
	}
	h := s.Hash()
	if back.Hash() != h {
		t.Fatalf("round trip changed the shard's hash")
	}
	r, d := registry.New().Apply(registry.Change{Cluster: cluster, Upserts: []*registry.Shard{s}})
	if r.ClusterDigest(cluster) != h || r.Service(s.Service) == nil || len(d.Services) != 1 {
		t.Fatalf("the registry does not hold the accepted shard as it is (digest %s, want %s)", r.ClusterDigest(cluster), h)
	}
}

// checkGateways fails unless gws is what NormalizeGateways makes of it:
// valid, sorted, without duplicates, nil when empty.
func checkGateways(t *testing.T, gws []registry.Gateway) {
	t.Helper()
	again, err := registry.NormalizeGateways(gws)
	if err != nil {
		t.Fatalf("accepted gateways do not validate: %v", err)
	}
	if !slices.Equal(again, gws) || (gws != nil && len(gws) == 0) {
		t.Fatalf("accepted gateways are not normalized: %v, normalized %v", gws, again)
	}
}

// FuzzShardFromProto: a spoke's (or a peer replica's) shard off the wire.
func FuzzShardFromProto(f *testing.F) {
	for _, s := range fuzzShards() {
		f.Add(mustMarshal(f, ShardToProto(s)))
	}
	// Edge cases: a shard without a key, an address that is not an IP, a
	// duplicate address, and more ports than the tight limits.
	f.Add([]byte{})
	bad := ShardToProto(fuzzShards()[0])
	bad.Endpoints[0].Addresses = []string{"10.0.0.1%eth0"}
	f.Add(mustMarshal(f, bad))
	dup := ShardToProto(fuzzShards()[0])
	dup.Endpoints[1].Addresses = dup.Endpoints[0].Addresses
	f.Add(mustMarshal(f, dup))
	many := ShardToProto(fuzzShards()[0])
	many.Ports = append(many.Ports, &fedv1.ServicePort{Name: "metrics", Port: 9100, Protocol: "TCP"})
	f.Add(mustMarshal(f, many))
	late := fuzzShards()[2]
	late.ExportedAt = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC) // the last second RFC 3339 can write
	f.Add(mustMarshal(f, ShardToProto(late)))

	f.Fuzz(func(t *testing.T, b []byte) {
		var p fedv1.Shard
		if err := proto.Unmarshal(b, &p); err != nil {
			return
		}
		for _, lim := range []registry.Limits{registry.DefaultLimits(), tightLimits} {
			s, err := ShardFromProto("east", &p, lim)
			u, uerr := ShardFromProtoUnvalidated("east", &p, lim)
			if err != nil {
				var ve *registry.ValidationError
				if !errors.As(err, &ve) || ve.Service != KeyFromProto(p.GetService()) {
					t.Fatalf("error %v is not a ValidationError naming service %v", err, KeyFromProto(p.GetService()))
				}
				if uerr == nil && u.Validate(lim) == nil {
					t.Fatalf("refused (%v), yet its unvalidated form validates", err)
				}
				continue
			}
			if uerr != nil || !u.Equal(s) {
				t.Fatalf("accepted, but the unvalidated decoding differs: %v", uerr)
			}
			checkAcceptedShard(t, "east", s, lim)
		}
	})
}

// FuzzGatewaysFromProto: the east-west gateways a spoke announces.
func FuzzGatewaysFromProto(f *testing.F) {
	for _, gws := range [][]*fedv1.NetworkGateway{
		{{Address: "192.0.2.10", Port: 15443}},
		{{Address: "gw.east.example.com", Port: 15443}, {Address: "2001:db8::1", Port: 15444}, {Address: "192.0.2.10", Port: 15443}},
		{{Address: "::ffff:192.0.2.10", Port: 15443}, {Address: "192.0.2.10", Port: 15443}}, // one address, two spellings
		{{Address: "fe80::1%eth0", Port: 15443}},
		{{Address: "gw.example.com", Port: 70000}},
		nil,
	} {
		f.Add(mustMarshal(f, &fedv1.NetworkGateways{Gateways: gws}))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p fedv1.NetworkGateways
		if err := proto.Unmarshal(b, &p); err != nil {
			return
		}
		gws, err := GatewaysFromProto(p.GetGateways())
		if err != nil {
			if !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("error %v does not wrap registry.ErrInvalid", err)
			}
			return
		}
		checkGateways(t, gws)
		if len(gws) > len(p.GetGateways()) {
			t.Fatalf("%d gateways from %d", len(gws), len(p.GetGateways()))
		}
		for _, g := range gws {
			if _, err := registry.ParseGateway(g.String()); err != nil {
				t.Fatalf("accepted gateway %s does not parse back: %v", g, err)
			}
		}
		back, err := GatewaysFromProto(GatewaysToProto(gws))
		if err != nil || !slices.Equal(back, gws) {
			t.Fatalf("round trip: %v, %v; want %v", back, err, gws)
		}
	})
}

// fuzzImport is an import of shop/web from two clusters.
func fuzzImport() *imports.Import {
	web := fuzzShards()[0]
	imp := &imports.Import{Service: web.Service, Ports: web.Ports, Properties: web.Properties,
		IPs: []netip.Addr{netip.MustParseAddr("243.0.0.10"), netip.MustParseAddr("fd43::10")}}
	for _, c := range []registry.ClusterID{"east", "west"} {
		src := imports.Source{Cluster: c, Stale: c == "west", Ports: web.Ports}
		for _, e := range web.Endpoints {
			src.Endpoints = append(src.Endpoints, imports.Endpoint{Addresses: e.Addresses, Ports: e.Ports, Hostname: e.Hostname,
				Zone: e.Locality.Zone, Conditions: e.Conditions})
		}
		imp.Sources = append(imp.Sources, src)
	}
	return imp
}

// FuzzImportFromProto: an import the hub sends a spoke (the spoke's decoder).
func FuzzImportFromProto(f *testing.F) {
	f.Add(mustMarshal(f, ImportToProto(fuzzImport())))
	headless := fuzzImport()
	headless.Headless, headless.IPs, headless.Ports = true, nil, nil
	headless.Sources = headless.Sources[:1]
	headless.Sources[0].Ports = nil
	f.Add(mustMarshal(f, ImportToProto(headless)))
	unsorted := ImportToProto(fuzzImport())
	unsorted.Sources[0], unsorted.Sources[1] = unsorted.Sources[1], unsorted.Sources[0]
	f.Add(mustMarshal(f, unsorted))
	zoned := ImportToProto(fuzzImport())
	zoned.Ips = []string{"fe80::1%eth0"}
	f.Add(mustMarshal(f, zoned))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, b []byte) {
		var p fedv1.Import
		if err := proto.Unmarshal(b, &p); err != nil {
			return
		}
		for _, lim := range []registry.Limits{registry.DefaultLimits(), tightLimits} {
			imp, err := ImportFromProto(&p, lim)
			if err != nil {
				if !errors.Is(err, registry.ErrInvalid) {
					t.Fatalf("error %v does not wrap registry.ErrInvalid", err)
				}
				continue
			}
			checkImport(t, imp, lim)
			back, err := ImportFromProto(ImportToProto(imp), lim)
			if err != nil {
				t.Fatalf("accepted import does not decode after encoding: %v", err)
			}
			if !back.Equal(imp) || back.Hash() != imp.Hash() {
				t.Fatalf("round trip changed the import:\n got %+v\nwant %+v", back, imp)
			}
		}
	})
}

// checkImport fails unless imp holds what the import's rules allow.
func checkImport(t *testing.T, imp *imports.Import, lim registry.Limits) {
	t.Helper()
	merged := &registry.Shard{Cluster: "hub", Service: imp.Service, Headless: imp.Headless, Ports: imp.Ports, Properties: imp.Properties}
	if err := merged.Validate(lim); err != nil {
		t.Fatalf("accepted import's service does not validate: %v", err)
	}
	if len(imp.IPs) > 2 || imp.Headless && len(imp.IPs) > 0 {
		t.Fatalf("accepted import has clusterset IPs %v (headless %v)", imp.IPs, imp.Headless)
	}
	for _, ip := range imp.IPs {
		if !ip.IsValid() || ip.Zone() != "" {
			t.Fatalf("accepted clusterset IP %v", ip)
		}
	}
	for i, src := range imp.Sources {
		if i > 0 && src.Cluster <= imp.Sources[i-1].Cluster {
			t.Fatalf("sources not sorted and unique: %s after %s", src.Cluster, imp.Sources[i-1].Cluster)
		}
		sh := &registry.Shard{Cluster: src.Cluster, Service: imp.Service, Headless: imp.Headless, Ports: src.Ports}
		for _, e := range src.Endpoints {
			sh.Endpoints = append(sh.Endpoints, registry.Endpoint{Addresses: e.Addresses, Ports: e.Ports, Hostname: e.Hostname,
				Locality: registry.Locality{Zone: e.Zone}, Conditions: e.Conditions})
		}
		if err := sh.Validate(lim); err != nil {
			t.Fatalf("accepted source %s does not validate as a shard: %v", src.Cluster, err)
		}
	}
}
