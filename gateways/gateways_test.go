package gateways

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	goldenfile "github.com/navemesh/nave/internal/golden"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

var (
	echo = registry.ServiceKey{Namespace: "default", Name: "echo"}
	cart = registry.ServiceKey{Namespace: "shop", Name: "cart"}
	db   = registry.ServiceKey{Namespace: "shop", Name: "db"}
)

func shard(cluster registry.ClusterID, k registry.ServiceKey, props registry.Properties, ports []registry.ServicePort, addrs ...string) *registry.Shard {
	s := &registry.Shard{Cluster: cluster, Service: k, ExportedAt: time.Unix(1_700_000_000, 0), Ports: ports, Properties: props}
	for _, a := range addrs {
		var eps []registry.EndpointPort
		for _, p := range ports {
			eps = append(eps, registry.EndpointPort{Name: p.Name, Port: p.Port + 1000})
		}
		s.Endpoints = append(s.Endpoints, registry.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(a)}, Ports: eps,
			Locality: registry.Locality{Region: "r1", Zone: "z1"}, Conditions: registry.Conditions{Ready: true, Serving: true}})
	}
	s.Normalize()
	return s
}

// goldenRegistry: echo (gRPC and metrics ports) in east and west; cart
// (HTTP, labelled public, with an alias) in west; db (TCP, not public).
func goldenRegistry(t testing.TB) *registry.Registry {
	t.Helper()
	grpc := []registry.ServicePort{{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}, {Name: "metrics", Port: 9000, Protocol: registry.ProtocolTCP}}
	public := registry.Properties{Labels: map[string]string{"public": "true"}, Annotations: map[string]string{HostsAnnotation: "cart.example.com, CART.example.com, not a host"}}
	r := registry.New()
	for _, s := range []*registry.Shard{
		shard("east", echo, registry.Properties{Labels: map[string]string{"public": "true"}}, grpc, "10.0.0.1"),
		shard("west", echo, registry.Properties{Labels: map[string]string{"public": "true"}}, grpc, "10.1.0.1"),
		shard("west", cart, public, []registry.ServicePort{{Name: "http", Port: 80, Protocol: registry.ProtocolTCP}}, "10.1.0.2"),
		shard("west", db, registry.Properties{}, []registry.ServicePort{{Name: "tcp", Port: 5432, Protocol: registry.ProtocolTCP}}, "10.1.0.3"),
	} {
		if err := s.Validate(registry.DefaultLimits()); err != nil {
			t.Fatal(err)
		}
		r, _ = r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
	}
	return r
}

func gatewayNode(role, network string, meta map[string]string) *core.Node {
	fields := map[string]*structpb.Value{MetadataRole: structpb.NewStringValue(role)}
	if network != "" {
		fields[MetadataNetwork] = structpb.NewStringValue(network)
	}
	for k, v := range meta {
		fields[k] = structpb.NewStringValue(v)
	}
	return &core.Node{Id: "gw", Locality: &core.Locality{Region: "r1", Zone: "z1"}, Metadata: &structpb.Struct{Fields: fields}}
}

// check runs every resource through ValidateDeep and the set through
// CheckConsistent, against the assignments of r's service ports and the
// others named (placeholders and Service backends the hub publishes).
func check(t testing.TB, r *registry.Registry, res xds.Resources, others ...string) {
	t.Helper()
	var all []proto.Message
	for _, l := range res.Listeners {
		all = append(all, l)
	}
	for _, rc := range res.Routes {
		all = append(all, rc)
	}
	for _, c := range res.Clusters {
		all = append(all, c)
	}
	for _, m := range all {
		if err := xds.ValidateDeep(m); err != nil {
			t.Fatal(err)
		}
	}
	assignments := map[string]bool{}
	for _, name := range others {
		assignments[name] = true
	}
	for _, svc := range r.Services() {
		for _, p := range xds.ServicePorts(svc) {
			assignments[xds.ClusterName(svc.Key, p.Port)] = true
		}
	}
	if err := xds.CheckConsistent(res, func(n string) bool { return assignments[n] }); err != nil {
		t.Fatal(err)
	}
}

func TestGatewayResourcesGolden(t *testing.T) {
	r := goldenRegistry(t)
	for _, tc := range []struct {
		name string
		node *core.Node
	}{
		{"eastwest", gatewayNode(RoleEastWest, "net-a", nil)},
		{"ingress", gatewayNode(RoleIngress, "net-a", map[string]string{
			MetadataExposeNamespaces: "default,shop", MetadataExposeSelector: "public=true",
			MetadataListeners: "8080/http,8443/https:ingress-cert,9443/passthrough",
		})},
	} {
		n, ok, err := ParseNode(tc.node, Exposure{})
		if !ok || err != nil {
			t.Fatalf("%s: %v %v", tc.name, ok, err)
		}
		var res xds.Resources
		if n.Role == RoleEastWest {
			res = EastWest(r)
		} else {
			res = Ingress(r, n)
		}
		check(t, r, res)
		golden(t, tc.name, res)
	}
}

// Ingress exposes nothing unless told; the hub's default applies to
// gateways that name no exposure of their own.
func TestIngressExposesNothingByDefault(t *testing.T) {
	r := goldenRegistry(t)
	n, _, err := ParseNode(gatewayNode(RoleIngress, "net-a", nil), Exposure{})
	if err != nil {
		t.Fatal(err)
	}
	res := Ingress(r, n)
	check(t, r, res)
	if len(res.Clusters) != 0 || len(res.Routes) != 1 || len(res.Routes[0].GetVirtualHosts()) != 0 {
		t.Errorf("an ingress gateway with no exposure serves %d clusters and routes %v", len(res.Clusters), res.Routes)
	}
	n, _, _ = ParseNode(gatewayNode(RoleIngress, "net-a", nil), Exposure{Namespaces: []string{"shop"}})
	res = Ingress(r, n)
	var hosts []string
	for _, vh := range res.Routes[0].GetVirtualHosts() {
		hosts = append(hosts, vh.GetDomains()...)
	}
	if want := "cart.shop.svc.clusterset.local cart.example.com db.shop.svc.clusterset.local"; strings.Join(hosts, " ") != want {
		t.Errorf("hub default exposure (namespace shop): hosts %v, want %s", hosts, want)
	}
}

func TestParseNodeRefusesBadMetadata(t *testing.T) {
	if _, ok, _ := ParseNode(&core.Node{Id: "plain"}, Exposure{}); ok {
		t.Error("a node without NAVE_GATEWAY is a gateway")
	}
	for _, tc := range []struct {
		node *core.Node
		want string
	}{
		{gatewayNode("sidecar", "net-a", nil), "want"},
		{gatewayNode(RoleEastWest, "", nil), "network"},
		{gatewayNode(RoleIngress, "", map[string]string{MetadataListeners: "8443/https"}), "SDS secret"},
		{gatewayNode(RoleIngress, "", map[string]string{MetadataListeners: "0/http"}), "port"},
		{gatewayNode(RoleIngress, "", map[string]string{MetadataListeners: "80/http,80/passthrough"}), "twice"},
		{gatewayNode(RoleIngress, "", map[string]string{MetadataListeners: "80/quic"}), "mode"},
		{gatewayNode(RoleIngress, "", map[string]string{MetadataExposeNamespaces: "a", MetadataExposeSelector: "novalue"}), "key=value"},
		{gatewayNode(RoleIngress, "", map[string]string{MetadataExposeSelector: "public=true"}), "needs"},
	} {
		_, ok, err := ParseNode(tc.node, Exposure{})
		if !ok || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseNode(%v) = %v, %v; want an error about %q", tc.node.GetMetadata(), ok, err, tc.want)
		}
	}
}

// For random registries and gateways, every resource set validates and is consistent.
func TestRandomRegistriesGiveValidConsistentResources(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		r := registry.New()
		for range 1 + rng.IntN(12) {
			k := registry.ServiceKey{Namespace: []string{"default", "shop", "ops"}[rng.IntN(3)], Name: fmt.Sprintf("svc%d", rng.IntN(8))}
			var ports []registry.ServicePort
			for i := range 1 + rng.IntN(3) {
				ports = append(ports, registry.ServicePort{Name: []string{"grpc", "http", "tcp"}[i], Port: int32(80 + rng.IntN(4)*1000 + i),
					Protocol: []registry.Protocol{registry.ProtocolTCP, registry.ProtocolTCP, registry.ProtocolUDP}[rng.IntN(3)]})
			}
			props := registry.Properties{Labels: map[string]string{"public": fmt.Sprint(rng.IntN(2) == 0)}}
			if rng.IntN(3) == 0 {
				props.Annotations = map[string]string{HostsAnnotation: fmt.Sprintf("a%d.example.com,b.example.com", rng.IntN(3))}
			}
			s := shard(registry.ClusterID([]string{"east", "west"}[rng.IntN(2)]), k, props, ports, fmt.Sprintf("10.0.%d.%d", rng.IntN(4), 1+rng.IntN(200)))
			if s.Validate(registry.DefaultLimits()) != nil {
				continue
			}
			r, _ = r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
		}
		check(t, r, EastWest(r))
		n, _, err := ParseNode(gatewayNode(RoleIngress, "net-a", map[string]string{
			MetadataExposeNamespaces: []string{"*", "shop", "default,ops"}[rng.IntN(3)],
			MetadataExposeSelector:   []string{"", "public=true"}[rng.IntN(2)],
			MetadataListeners:        []string{"80/http", "80/http,443/https:c,8443/passthrough", "3000/passthrough"}[rng.IntN(3)],
		}), Exposure{})
		if err != nil {
			t.Fatal(err)
		}
		check(t, r, Ingress(r, n))
		if t.Failed() {
			t.Fatalf("round %d", round)
		}
	}
}

// golden compares the resources, as sorted, indented JSON, with testdata/NAME.golden.
func golden(t *testing.T, name string, res xds.Resources) {
	t.Helper()
	var out struct {
		Listeners, Routes, Clusters []any
	}
	for _, l := range res.Listeners {
		out.Listeners = append(out.Listeners, goldenfile.Proto(t, l))
	}
	for _, r := range res.Routes {
		out.Routes = append(out.Routes, goldenfile.Proto(t, r))
	}
	for _, c := range res.Clusters {
		out.Clusters = append(out.Clusters, goldenfile.Proto(t, c))
	}
	goldenfile.Check(t, name+".golden", goldenfile.JSON(t, out))
}
