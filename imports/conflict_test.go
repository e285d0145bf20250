package imports_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// These tests sit outside the package so that they can check the import the
// way a spoke receives it (federation.ImportFromProto validates every source).

var (
	dnsKey = registry.ServiceKey{Namespace: "kube-system", Name: "dns"}
	dnsT0  = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

func dnsShard(cluster registry.ClusterID, age time.Duration, headless bool, ports []registry.ServicePort, eps ...registry.Endpoint) *registry.Shard {
	return &registry.Shard{Cluster: cluster, Service: dnsKey, ExportedAt: dnsT0.Add(age), Headless: headless,
		Ports: ports, Endpoints: eps}
}

func dnsEndpoint(a string, ready bool, ports ...registry.EndpointPort) registry.Endpoint {
	return registry.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(a)}, Ports: ports,
		Conditions: registry.Conditions{Ready: ready, Serving: ready}}
}

func mergedDNS(t *testing.T, shards ...*registry.Shard) *registry.Service {
	t.Helper()
	r := registry.New()
	for _, s := range shards {
		s.Normalize()
		if err := s.Validate(registry.DefaultLimits()); err != nil {
			t.Fatalf("shard %s: %v", s.Cluster, err)
		}
		r, _ = r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
	}
	return r.Service(dnsKey)
}

// received is the import as a spoke decodes and validates it.
func received(t *testing.T, imp *imports.Import) *imports.Import {
	t.Helper()
	got, err := federation.ImportFromProto(federation.ImportToProto(imp), registry.DefaultLimits())
	if err != nil {
		t.Fatalf("a spoke refuses the import: %v", err)
	}
	return got
}

func sourceClusters(imp *imports.Import) []registry.ClusterID {
	var out []registry.ClusterID
	for _, s := range imp.Sources {
		out = append(out, s.Cluster)
	}
	return out
}

// Issue 24: c1 exports dns 53/UDP, c3 a second later dns 53/TCP. c3 loses
// every port; it must be left out, not sent as a source with no ports
// (every spoke refused the import, which then froze everywhere).
func TestBuildLeavesOutAClusterWhosePortsAllLost(t *testing.T) {
	udp := registry.ServicePort{Name: "dns", Port: 53, Protocol: registry.ProtocolUDP}
	tcp := registry.ServicePort{Name: "dns", Port: 53, Protocol: registry.ProtocolTCP}
	c1 := dnsShard("c1", 0, false, []registry.ServicePort{udp},
		dnsEndpoint("10.0.0.1", true, registry.EndpointPort{Name: "dns", Port: 5353}))
	c3 := dnsShard("c3", time.Second, false, []registry.ServicePort{tcp},
		dnsEndpoint("10.3.0.1", true, registry.EndpointPort{Name: "dns", Port: 5353}))
	svc := mergedDNS(t, c1, c3)
	if len(svc.Conflicts) == 0 {
		t.Fatal("fixture: expected a port conflict")
	}
	imp, _ := imports.Build(svc, nil, nil)
	if got := sourceClusters(imp); !slices.Equal(got, []registry.ClusterID{"c1"}) {
		t.Errorf("sources = %v, want only c1 (c3 serves none of the import's ports)", got)
	}
	got := received(t, imp)
	if !slices.Equal(got.Ports, []registry.ServicePort{udp}) {
		t.Errorf("ports = %v, want only the winner's", got.Ports)
	}

	// The import stays live: the winner's endpoint turning not ready is seen.
	c1 = dnsShard("c1", 0, false, []registry.ServicePort{udp},
		dnsEndpoint("10.0.0.1", false, registry.EndpointPort{Name: "dns", Port: 5353}))
	c3 = dnsShard("c3", time.Second, false, []registry.ServicePort{tcp},
		dnsEndpoint("10.3.0.1", true, registry.EndpointPort{Name: "dns", Port: 5353}))
	got = received(t, must(imports.Build(mergedDNS(t, c1, c3), nil, nil)))
	if len(got.Sources) != 1 || len(got.Sources[0].Endpoints) != 1 || got.Sources[0].Endpoints[0].Conditions.Ready {
		t.Errorf("sources = %+v, want c1's endpoint not ready", got.Sources)
	}
}

// A cluster that keeps some of its ports stays a source, with those only.
func TestBuildKeepsALoserThatServesAPort(t *testing.T) {
	udp := registry.ServicePort{Name: "dns", Port: 53, Protocol: registry.ProtocolUDP}
	tcp := registry.ServicePort{Name: "dns", Port: 53, Protocol: registry.ProtocolTCP}
	metrics := registry.ServicePort{Name: "metrics", Port: 9153, Protocol: registry.ProtocolTCP}
	c1 := dnsShard("c1", 0, false, []registry.ServicePort{udp},
		dnsEndpoint("10.0.0.1", true, registry.EndpointPort{Name: "dns", Port: 5353}))
	c3 := dnsShard("c3", time.Second, false, []registry.ServicePort{tcp, metrics},
		dnsEndpoint("10.3.0.1", true, registry.EndpointPort{Name: "dns", Port: 5353}, registry.EndpointPort{Name: "metrics", Port: 9153}),
		dnsEndpoint("10.3.0.2", true, registry.EndpointPort{Name: "dns", Port: 5353})) // only on the lost port
	got := received(t, must(imports.Build(mergedDNS(t, c1, c3), nil, nil)))
	if ids := sourceClusters(got); !slices.Equal(ids, []registry.ClusterID{"c1", "c3"}) {
		t.Fatalf("sources = %v, want c1 and c3", ids)
	}
	src := got.Sources[1]
	if !slices.Equal(src.Ports, []registry.ServicePort{metrics}) {
		t.Errorf("c3 serves %v, want only metrics", src.Ports)
	}
	if len(src.Endpoints) != 1 || src.Endpoints[0].Addresses[0] != netip.MustParseAddr("10.3.0.1") {
		t.Errorf("c3 endpoints = %+v, want only the one serving metrics", src.Endpoints)
	}
}

// A port-less headless export that loses the type to a ClusterSetIP one
// would be a ClusterSetIP source with no ports; a headless import keeps it.
func TestBuildPortlessHeadlessSources(t *testing.T) {
	http := registry.ServicePort{Name: "http", Port: 80, Protocol: registry.ProtocolTCP}
	pod := dnsEndpoint("10.2.0.1", true)
	pod.Hostname = "pod-0"

	imp := must(imports.Build(mergedDNS(t,
		dnsShard("c1", 0, false, []registry.ServicePort{http}, dnsEndpoint("10.0.0.1", true, registry.EndpointPort{Name: "http", Port: 8080})),
		dnsShard("c2", time.Second, true, nil, pod)), nil, nil))
	if got := sourceClusters(received(t, imp)); !slices.Equal(got, []registry.ClusterID{"c1"}) {
		t.Errorf("ClusterSetIP import: sources = %v, want only c1", got)
	}

	imp = must(imports.Build(mergedDNS(t,
		dnsShard("c1", 0, true, []registry.ServicePort{http}, dnsEndpoint("10.0.0.1", true, registry.EndpointPort{Name: "http", Port: 8080})),
		dnsShard("c2", time.Second, true, nil, pod)), nil, nil))
	if got := sourceClusters(received(t, imp)); !slices.Equal(got, []registry.ClusterID{"c1", "c2"}) {
		t.Errorf("Headless import: sources = %v, want c1 and c2 (headless DNS names c2's pods)", got)
	}
}

func must(imp *imports.Import, _ []imports.Skipped) *imports.Import { return imp }
