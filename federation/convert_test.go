package federation

import (
	"net/netip"
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
