package federation

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

func TestShardRoundTripKeepsProperties(t *testing.T) {
	in := &registry.Shard{
		Cluster: "east", Service: registry.ServiceKey{Namespace: "demo", Name: "web"},
		ExportedAt: time.Unix(1_700_000_000, 0).UTC(),
		Ports:      []registry.ServicePort{{Name: "http", Port: 80, Protocol: registry.ProtocolTCP}},
		Endpoints: []registry.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
			Ports: []registry.EndpointPort{{Name: "http", Port: 8080}}, Conditions: registry.Conditions{Ready: true, Serving: true}}},
		Properties: registry.Properties{
			SessionAffinity: registry.SessionAffinityClientIP, SessionAffinityTimeout: 300,
			InternalTrafficPolicy: registry.InternalTrafficPolicyLocal, TrafficDistribution: "PreferClose",
			IPFamilies: []registry.IPFamily{registry.IPv6, registry.IPv4},
			Labels:     map[string]string{"tier": "web"}, Annotations: map[string]string{"example.com/owner": "team a"},
		},
	}
	in.Normalize()
	out, err := ShardFromProto("east", ShardToProto(in), registry.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if !out.Equal(in) || out.Hash() != in.Hash() {
		t.Errorf("round trip changed the shard:\n got %+v\nwant %+v", out.Properties, in.Properties)
	}

	// Without properties, nothing is allocated for them (hash and equality as before).
	in.Properties = registry.Properties{}
	out, err = ShardFromProto("east", ShardToProto(in), registry.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if out.Labels != nil || out.Annotations != nil || out.IPFamilies != nil || out.Hash() != in.Hash() {
		t.Errorf("empty properties decoded as %+v", out.Properties)
	}
}

func TestShardFromProtoBoundsMetadata(t *testing.T) {
	s := &registry.Shard{Cluster: "east", Service: registry.ServiceKey{Namespace: "demo", Name: "web"},
		Ports: []registry.ServicePort{{Name: "http", Port: 80, Protocol: registry.ProtocolTCP}}}
	p := ShardToProto(s)
	p.Properties = &fedv1.ServiceProperties{Labels: map[string]string{}}
	for i := range maxExportedMetadata + 1 {
		p.Properties.Labels["l"+strconv.Itoa(i)] = "v"
	}
	if _, err := ShardFromProto("east", p, registry.DefaultLimits()); err == nil || !strings.Contains(err.Error(), "exported labels and annotations") {
		t.Fatalf("ShardFromProto() = %v, want the metadata limit", err)
	}
	p.Properties.Labels = map[string]string{"bad key!": "v"}
	if _, err := ShardFromProto("east", p, registry.DefaultLimits()); err == nil || !strings.Contains(err.Error(), "label key") {
		t.Fatalf("ShardFromProto() = %v, want an invalid label key", err)
	}
}

// The endpoints of one EndpointSlice list the same ports: decoded, they share
// one list, and an endpoint with other ports has its own.
func TestShardFromProtoSharesEqualPortLists(t *testing.T) {
	port := func(name string, n int32) *fedv1.EndpointPort { return &fedv1.EndpointPort{Name: name, Port: n} }
	ep := func(addr string, ports ...*fedv1.EndpointPort) *fedv1.Endpoint {
		return &fedv1.Endpoint{Addresses: []string{addr}, Ports: ports, Ready: true, Serving: true}
	}
	in := &fedv1.Shard{
		Service: KeyToProto(registry.ServiceKey{Namespace: "demo", Name: "web"}),
		Ports:   []*fedv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}, {Name: "metrics", Port: 9090, Protocol: "TCP"}},
		Endpoints: []*fedv1.Endpoint{
			ep("10.0.0.4"), // first, with no ports: an empty list, not nil
			// Listed unsorted: every endpoint must still read them sorted.
			ep("10.0.0.1", port("metrics", 9090), port("http", 8080)),
			ep("10.0.0.2", port("metrics", 9090), port("http", 8080)),
			ep("10.0.0.3", port("http", 8081)),
			ep("10.0.0.5"),
			ep("10.0.0.6", port("http", 8081)),
		},
	}
	s, err := ShardFromProto("east", in, registry.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string][]registry.EndpointPort{}
	for _, e := range s.Endpoints {
		ports[e.Addresses[0].String()] = e.Ports
	}
	two := []registry.EndpointPort{{Name: "http", Port: 8080}, {Name: "metrics", Port: 9090}}
	one := []registry.EndpointPort{{Name: "http", Port: 8081}}
	for addr, want := range map[string][]registry.EndpointPort{"10.0.0.1": two, "10.0.0.2": two, "10.0.0.3": one,
		"10.0.0.4": {}, "10.0.0.5": {}, "10.0.0.6": one} {
		if got := ports[addr]; got == nil || !slices.Equal(got, want) {
			t.Errorf("%s: ports %v, want %v (and not nil)", addr, got, want)
		}
	}
	if &ports["10.0.0.1"][0] != &ports["10.0.0.2"][0] {
		t.Error("two endpoints in a row with the same ports do not share one list")
	}
	if cap(ports["10.0.0.1"]) != len(ports["10.0.0.1"]) {
		t.Error("a shared list has room to append into")
	}
}
