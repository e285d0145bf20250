package xds

import (
	"net/netip"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/registry"
)

var exportedAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func loc(region, zone string) registry.Locality { return registry.Locality{Region: region, Zone: zone} }

// Endpoint states as EndpointSlice conditions.
var (
	ready    = registry.Conditions{Ready: true, Serving: true}
	draining = registry.Conditions{Serving: true, Terminating: true}
	notReady = registry.Conditions{}
)

func ep(addr string, l registry.Locality, c registry.Conditions, ports ...registry.EndpointPort) registry.Endpoint {
	return registry.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, Ports: ports, Locality: l, Conditions: c}
}

func eport(name string, port int32) registry.EndpointPort {
	return registry.EndpointPort{Name: name, Port: port}
}

func tcp(name string, port int32) registry.ServicePort {
	return registry.ServicePort{Name: name, Port: port, Protocol: registry.ProtocolTCP}
}

func shard(cluster registry.ClusterID, key registry.ServiceKey, ports []registry.ServicePort, eps ...registry.Endpoint) *registry.Shard {
	s := &registry.Shard{Cluster: cluster, Service: key, ExportedAt: exportedAt, Ports: ports, Endpoints: eps}
	s.Normalize()
	return s
}

// apply applies each shard as its cluster's upsert, checking it is valid first.
func apply(t testing.TB, r *registry.Registry, shards ...*registry.Shard) (*registry.Registry, registry.Diff) {
	t.Helper()
	var last registry.Diff
	var all registry.Diff
	for _, s := range shards {
		if err := s.Validate(registry.DefaultLimits()); err != nil {
			t.Fatalf("test shard: %v", err)
		}
		r, last = r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
		all.Version = last.Version
		all.Services = append(all.Services, last.Services...)
	}
	return r, all
}

// nodeAt is a client node in locality l that names network (none when "").
func nodeAt(l registry.Locality, network registry.Network) *core.Node {
	n := &core.Node{Id: "test", Locality: &core.Locality{Region: l.Region, Zone: l.Zone, SubZone: l.Subzone}}
	if network != "" {
		n.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{MetadataNetwork: structpb.NewStringValue(string(network))}}
	}
	return n
}
