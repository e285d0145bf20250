package xds

import (
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/registry"
)

// fuzzNets: east on net-a, west on net-b (reachable through a gateway),
// north on net-c (no gateway).
var fuzzNets = registry.Networks{
	Clusters: map[registry.ClusterID]registry.Network{"east": "net-a", "west": "net-b", "north": "net-c"},
	Gateways: map[registry.Network][]registry.Gateway{"net-b": {{Address: "192.0.2.20", Port: 15443}}},
}

// fuzzAddressNetworks is the network of each address fuzzServer's service has.
var fuzzAddressNetworks = map[string]registry.Network{
	"10.0.0.1": "net-a", "10.0.0.2": "net-a", "10.1.0.1": "net-b", "10.2.0.1": "net-c", "192.0.2.20": "gateway",
}

// fuzzMetadataLimit is the node metadata the fuzzed server admits.
const fuzzMetadataLimit = 512

// fuzzServer is a server with echo in three clusters on three networks.
func fuzzServer(t *testing.T) *Server {
	t.Helper()
	s := NewServer(Config{MaxLocalityGroups: 8, MaxResourceNames: 10, MaxNodeMetadataBytes: fuzzMetadataLimit}, Wiring{VersionPrefix: "fuzz-"}, nil, nil)
	s.SetNetworks(fuzzNets)
	port := []registry.ServicePort{tcp("grpc", 8080)}
	r, d := apply(t, registry.New(),
		shard("east", echo, port, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)), ep("10.0.0.2", loc("r1", "z2"), draining, eport("grpc", 9090))),
		shard("west", echo, port, ep("10.1.0.1", loc("r2", "z3"), ready, eport("grpc", 9090))),
		shard("north", echo, port, ep("10.2.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))))
	s.Update(r, d)
	return s
}

// FuzzNodeMetadata: the node of an xDS request, as the server admits it and
// places it. A node is admitted exactly when its metadata is within the
// limit; an admitted node's client group is its region and zone (nothing
// else of its locality or identity) and the network its metadata names, or
// that of the cluster it names; nodes of one group share one EDS cache; and
// every assignment a client is handed is a valid resource.
func FuzzNodeMetadata(f *testing.F) {
	meta := func(kv ...string) *structpb.Struct {
		m := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		for i := 0; i+1 < len(kv); i += 2 {
			m.Fields[kv[i]] = structpb.NewStringValue(kv[i+1])
		}
		return m
	}
	for _, n := range []*core.Node{
		nodeAt(loc("r1", "z1"), "net-a"),
		{Id: "proxyless-1", Cluster: "echo-client", Locality: &core.Locality{Region: "r2", Zone: "z3", SubZone: "rack-2"},
			Metadata: meta(MetadataCluster, "west", "ISTIO_VERSION", "1.24.0"), UserAgentName: "gRPC Go", UserAgentVersionType: &core.Node_UserAgentVersion{UserAgentVersion: "1.70.0"}},
		{Id: "nowhere"},
		{Id: "unknown-cluster", Metadata: meta(MetadataCluster, "south")},
		{Id: "both", Locality: &core.Locality{Region: "r1"}, Metadata: meta(MetadataNetwork, "net-c", MetadataCluster, "east")},
		{Id: "fat", Metadata: meta("blob", strings.Repeat("x", fuzzMetadataLimit))},
		{Id: "typed", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{MetadataNetwork: structpb.NewNumberValue(7)}}},
	} {
		b, err := proto.Marshal(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		var node core.Node
		if err := proto.Unmarshal(b, &node); err != nil {
			return
		}
		s := fuzzServer(t)
		if err := s.admit(&node, s.cfg.MaxResourceNames+1); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a request naming too many resources: %v", err)
		}
		err := s.admit(&node, s.cfg.MaxResourceNames)
		admit := node.GetMetadata() == nil || proto.Size(node.GetMetadata()) <= fuzzMetadataLimit
		if (err == nil) != admit || err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("metadata of %d bytes: admitted %v (%v)", proto.Size(node.GetMetadata()), err == nil, err)
		}
		if err != nil {
			return
		}

		c := s.clientFor(&node)
		l := node.GetLocality()
		if c.Locality != (registry.Locality{Region: l.GetRegion(), Zone: l.GetZone()}) || c.NetworkOnly {
			t.Fatalf("node in %v is client %+v", l, c)
		}
		fields := node.GetMetadata().GetFields()
		network := registry.Network(fields[MetadataNetwork].GetStringValue())
		if network == "" {
			network = fuzzNets.Clusters[registry.ClusterID(fields[MetadataCluster].GetStringValue())]
		}
		if c.Network != network {
			t.Fatalf("client network %q, want %q", c.Network, network)
		}

		// A node that differs only in what groups ignore shares the group and its cache.
		twin := proto.Clone(&node).(*core.Node)
		twin.Id, twin.Cluster, twin.UserAgentName = "twin", "other", "envoy"
		twin.Locality = &core.Locality{Region: l.GetRegion(), Zone: l.GetZone(), SubZone: l.GetSubZone() + "-twin"}
		if got := s.clientFor(twin); got != c {
			t.Fatalf("twin node is client %+v, want %+v", got, c)
		}
		if s.edsCache(&node) != s.edsCache(twin) {
			t.Fatal("nodes of one group have different EDS caches")
		}

		topo := s.topo.Load()
		if len(s.endpoints) == 0 {
			t.Fatal("no endpoints built")
		}
		for name, pe := range s.endpoints {
			cla, _ := pe.forClient(c, topo)
			// What the client decodes (blocks are shared as wire bytes).
			wire, err := proto.Marshal(cla)
			if err != nil {
				t.Fatal(err)
			}
			var got endpoint.ClusterLoadAssignment
			if err := proto.Unmarshal(wire, &got); err != nil {
				t.Fatal(err)
			}
			if got.GetClusterName() != name {
				t.Fatalf("assignment %q for cluster %q", got.GetClusterName(), name)
			}
			if err := Validate(&got); err != nil {
				t.Fatalf("client %+v is handed an invalid assignment: %v", c, err)
			}
			// Split horizon: a client on a network is handed its network's
			// endpoints and other networks' gateways, nothing else.
			for _, l := range got.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					addr := e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
					at, known := fuzzAddressNetworks[addr]
					switch {
					case !known:
						t.Fatalf("client %+v is handed unknown address %s", c, addr)
					case c.Network == "" && at == "gateway":
						t.Fatalf("a client without a network is handed gateway %s", addr)
					case c.Network != "" && at != "gateway" && at != c.Network:
						t.Fatalf("client on %q is handed %s of %s", c.Network, addr, at)
					}
				}
			}
		}
	})
}
