package spoke

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/navemesh/nave/importwriter"
	"github.com/navemesh/nave/registry"
)

var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// svc is an exported ClusterIP service in namespace "shop".
func svc(name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "shop", CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{ExportLabel: "true"},
		},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: ports},
	}
}

func port(name string, number int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: number, Protocol: corev1.ProtocolTCP}
}

// slice is an EndpointSlice of service in namespace "shop" with ports name=number pairs.
func slice(name, service string, family discoveryv1.AddressType, ports map[string]int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: family,
		Endpoints:   eps,
	}
	for n, p := range ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr(n), Port: ptr(p)})
	}
	return es
}

func ep(addr string, ready bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready)}}
}

func node(name, region, zone string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if region != "" {
		n.Labels[corev1.LabelTopologyRegion] = region
	}
	if zone != "" {
		n.Labels[corev1.LabelTopologyZone] = zone
	}
	return n
}

func ptr[T any](v T) *T { return &v }

// with returns v changed by f.
func with[T any](v T, f func(*T)) T { f(&v); return v }

// shard is the expected shard of shop/name in cluster "east".
func shard(name string, ports []registry.ServicePort, eps ...registry.Endpoint) *registry.Shard {
	if eps == nil {
		eps = []registry.Endpoint{}
	}
	s := &registry.Shard{Cluster: "east", Service: registry.ServiceKey{Namespace: "shop", Name: name}, ExportedAt: created, Ports: ports, Endpoints: eps}
	s.Normalize()
	return s
}

func rep(addr string, c registry.Conditions, loc registry.Locality, ports ...registry.EndpointPort) registry.Endpoint {
	if ports == nil {
		ports = []registry.EndpointPort{}
	}
	return registry.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, Ports: ports, Locality: loc, Conditions: c}
}

var (
	ready       = registry.Conditions{Ready: true, Serving: true}
	notReady    = registry.Conditions{}
	draining    = registry.Conditions{Serving: true, Terminating: true}
	httpPort    = []registry.ServicePort{{Name: "http", Port: 80, Protocol: registry.ProtocolTCP}}
	httpTarget  = registry.EndpointPort{Name: "http", Port: 8080}
	defaultOpts = BuildOptions{Cluster: "east", DefaultRegion: "dc1"}
	inDC1       = registry.Locality{Region: "dc1"}
)

func TestBuildShards(t *testing.T) {
	http := map[string]int32{"http": 8080}
	manyEndpoints := func() ([]discoveryv1.Endpoint, []registry.Endpoint) {
		var in []discoveryv1.Endpoint
		var want []registry.Endpoint
		for i := range 600 {
			addr := fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)
			in = append(in, ep(addr, i%3 != 0))
			c := ready
			if i%3 == 0 {
				c = notReady
			}
			want = append(want, rep(addr, c, inDC1, httpTarget))
		}
		return in, want
	}
	many, manyWant := manyEndpoints()

	tests := []struct {
		name        string
		objs        Objects
		opts        BuildOptions
		want        []*registry.Shard
		wantInvalid map[string]string // service name: a substring of its error
		wantErrs    []string          // substrings, one per error, in order
	}{
		{
			name: "multi-port with protocol default and appProtocol",
			objs: Objects{
				Services: []*corev1.Service{svc("web",
					corev1.ServicePort{Name: "http", Port: 80, AppProtocol: ptr("kubernetes.io/h2c")},
					corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				)},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-1", "web", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8080, "dns": 5353}, ep("10.0.0.1", true)),
				},
			},
			want: []*registry.Shard{shard("web",
				[]registry.ServicePort{
					{Name: "http", Port: 80, Protocol: registry.ProtocolTCP, AppProtocol: "kubernetes.io/h2c"},
					{Name: "dns", Port: 53, Protocol: registry.ProtocolUDP},
				},
				rep("10.0.0.1", ready, inDC1, httpTarget, registry.EndpointPort{Name: "dns", Port: 5353}),
			)},
		},
		{
			name: "headless with hostname and node",
			objs: Objects{
				Services: []*corev1.Service{ptr(with(*svc("db", port("", 5432)), func(s *corev1.Service) { s.Spec.ClusterIP = "None" }))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("db-1", "db", discoveryv1.AddressTypeIPv4, map[string]int32{"": 5432},
						with(ep("10.0.0.5", true), func(e *discoveryv1.Endpoint) { e.Hostname = ptr("db-0"); e.NodeName = ptr("node-a") })),
				},
			},
			want: []*registry.Shard{ptr(with(*shard("db", []registry.ServicePort{{Port: 5432, Protocol: registry.ProtocolTCP}},
				with(rep("10.0.0.5", ready, inDC1, registry.EndpointPort{Port: 5432}), func(e *registry.Endpoint) {
					e.Hostname, e.NodeName = "db-0", "node-a"
				})), func(s *registry.Shard) { s.Headless = true }))},
		},
		{
			name: "dual-stack slices give one endpoint per address family",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-v6", "web", discoveryv1.AddressTypeIPv6, http, ep("fd00::1", true)),
					slice("web-v4", "web", discoveryv1.AddressTypeIPv4, http, ep("10.0.0.1", true)),
				},
			},
			want: []*registry.Shard{shard("web", httpPort,
				rep("10.0.0.1", ready, inDC1, httpTarget), rep("fd00::1", ready, inDC1, httpTarget))},
		},
		{
			name: "split slices, FQDN and other services' slices ignored",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-a", "web", discoveryv1.AddressTypeIPv4, http, ep("10.0.0.1", true), ep("10.0.0.2", true)),
					slice("web-b", "web", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8081}, ep("10.0.0.3", false)),
					slice("web-fqdn", "web", discoveryv1.AddressTypeFQDN, http, ep("web.example.com", true)),
					slice("api-a", "api", discoveryv1.AddressTypeIPv4, http, ep("10.0.9.9", true)),
					ptr(with(*slice("web-elsewhere", "web", discoveryv1.AddressTypeIPv4, http, ep("10.0.8.8", true)),
						func(es *discoveryv1.EndpointSlice) { es.Namespace = "other" })),
					{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled", Namespace: "shop"}, AddressType: discoveryv1.AddressTypeIPv4,
						Endpoints: []discoveryv1.Endpoint{ep("10.0.7.7", true)}},
				},
			},
			want: []*registry.Shard{shard("web", httpPort,
				rep("10.0.0.1", ready, inDC1, httpTarget), rep("10.0.0.2", ready, inDC1, httpTarget),
				rep("10.0.0.3", notReady, inDC1, registry.EndpointPort{Name: "http", Port: 8081}))},
		},
		{
			name: "duplicate address across slices keeps the ready copy",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-a", "web", discoveryv1.AddressTypeIPv4, http, ep("10.0.0.1", false), ep("10.0.0.2", true)),
					slice("web-b", "web", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8081}, ep("10.0.0.1", true), ep("10.0.0.2", false)),
				},
			},
			want: []*registry.Shard{shard("web", httpPort,
				rep("10.0.0.1", ready, inDC1, registry.EndpointPort{Name: "http", Port: 8081}),
				rep("10.0.0.2", ready, inDC1, httpTarget))},
		},
		{
			name: "duplicate address within an endpoint and a slice",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-a", "web", discoveryv1.AddressTypeIPv4, http,
						discoveryv1.Endpoint{Addresses: []string{"10.0.0.1", "10.0.0.1"}}, ep("10.0.0.1", false)),
				},
			},
			want: []*registry.Shard{shard("web", httpPort, rep("10.0.0.1", ready, inDC1, httpTarget))},
		},
		{
			name: "nil conditions are ready and serving, not terminating",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-a", "web", discoveryv1.AddressTypeIPv4, http,
						discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}},
						discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}},
						discoveryv1.Endpoint{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Serving: ptr(false)}},
					),
				},
			},
			want: []*registry.Shard{shard("web", httpPort,
				rep("10.0.0.1", ready, inDC1, httpTarget),
				rep("10.0.0.2", notReady, inDC1, httpTarget),
				rep("10.0.0.3", registry.Conditions{Ready: true}, inDC1, httpTarget))},
		},
		{
			name: "terminating but serving",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-a", "web", discoveryv1.AddressTypeIPv4, http,
						discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{
							Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}},
						discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{
							Ready: ptr(false), Serving: ptr(false), Terminating: ptr(true)}},
					),
				},
			},
			want: []*registry.Shard{shard("web", httpPort,
				rep("10.0.0.1", draining, inDC1, httpTarget),
				rep("10.0.0.2", registry.Conditions{Terminating: true}, inDC1, httpTarget))},
		},
		{
			name: "locality from endpoint zone, node labels, or the default region",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-a", "web", discoveryv1.AddressTypeIPv4, http,
						with(ep("10.0.0.1", true), func(e *discoveryv1.Endpoint) { e.NodeName = ptr("a"); e.Zone = ptr("z-own") }),
						with(ep("10.0.0.2", true), func(e *discoveryv1.Endpoint) { e.NodeName = ptr("a") }),
						with(ep("10.0.0.3", true), func(e *discoveryv1.Endpoint) { e.NodeName = ptr("b") }),
						with(ep("10.0.0.4", true), func(e *discoveryv1.Endpoint) { e.NodeName = ptr("unknown") }),
						with(ep("10.0.0.5", true), func(e *discoveryv1.Endpoint) { e.Zone = ptr("z-own") }),
						ep("10.0.0.6", true),
					),
				},
				Nodes: []*corev1.Node{node("a", "r-node", "z-node"), node("b", "", "z-b")},
			},
			want: []*registry.Shard{shard("web", httpPort,
				with(rep("10.0.0.1", ready, registry.Locality{Region: "r-node", Zone: "z-own"}, httpTarget), func(e *registry.Endpoint) { e.NodeName = "a" }),
				with(rep("10.0.0.2", ready, registry.Locality{Region: "r-node", Zone: "z-node"}, httpTarget), func(e *registry.Endpoint) { e.NodeName = "a" }),
				with(rep("10.0.0.3", ready, registry.Locality{Region: "dc1", Zone: "z-b"}, httpTarget), func(e *registry.Endpoint) { e.NodeName = "b" }),
				with(rep("10.0.0.4", ready, inDC1, httpTarget), func(e *registry.Endpoint) { e.NodeName = "unknown" }),
				rep("10.0.0.5", ready, registry.Locality{Region: "dc1", Zone: "z-own"}, httpTarget),
				rep("10.0.0.6", ready, inDC1, httpTarget),
			)},
		},
		{
			name: "no default region leaves the region empty",
			objs: Objects{
				Services:       []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{slice("web-a", "web", discoveryv1.AddressTypeIPv4, http, ep("10.0.0.1", true))},
			},
			opts: BuildOptions{Cluster: "east"},
			want: []*registry.Shard{shard("web", httpPort, rep("10.0.0.1", ready, registry.Locality{}, httpTarget))},
		},
		{
			name: "only labelled services are exported; ExternalName never",
			objs: Objects{Services: []*corev1.Service{
				svc("web", port("http", 80)),
				ptr(with(*svc("hidden", port("http", 80)), func(s *corev1.Service) { s.Labels = nil })),
				ptr(with(*svc("off", port("http", 80)), func(s *corev1.Service) { s.Labels[ExportLabel] = "false" })),
				ptr(with(*svc("legacy", port("http", 80)), func(s *corev1.Service) {
					s.Spec.Type, s.Spec.ExternalName, s.Spec.ClusterIP = corev1.ServiceTypeExternalName, "legacy.example.com", ""
				})),
			}},
			want: []*registry.Shard{shard("web", httpPort)},
		},
		{
			name: "ExportAll exports unlabelled services but still not ExternalName",
			objs: Objects{Services: []*corev1.Service{
				ptr(with(*svc("hidden", port("http", 80)), func(s *corev1.Service) { s.Labels = nil })),
				ptr(with(*svc("legacy", port("http", 80)), func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName })),
			}},
			opts: BuildOptions{Cluster: "east", DefaultRegion: "dc1", ExportAll: true},
			want: []*registry.Shard{shard("hidden", httpPort)},
		},
		{
			name: "invalid services are reported as invalid, with no shard; the rest is built",
			objs: Objects{
				Services: []*corev1.Service{
					svc("a-noports"),
					svc("b-badport", port("Not_A_Label", 80)),
					svc("e-unnamed", port("", 80), port("", 81)),
					svc("f-dup", port("Bad_", 80)),
					svc("f-dup", port("http", 80)), // must not stand in for the invalid first definition
					svc("ok", port("http", 80)),
					svc("ok", port("http", 81)),
				},
			},
			want: []*registry.Shard{shard("ok", httpPort)},
			wantInvalid: map[string]string{
				"a-noports": "service shop/a-noports: no ports",
				"b-badport": `service shop/b-badport: port name "Not_A_Label"`,
				"e-unnamed": "service shop/e-unnamed: port 80 has no name",
				"f-dup":     `service shop/f-dup: port name "Bad_"`,
			},
			wantErrs: []string{
				"service shop/f-dup: defined twice",
				"service shop/ok: defined twice",
			},
		},
		{
			name: "an invalid endpoint is left out with an error naming it; the rest of the service stays",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-a", "web", discoveryv1.AddressTypeIPv4, http,
						ep("10.0.0.1", false),
						with(ep("10.0.0.2", true), func(e *discoveryv1.Endpoint) { e.Hostname = ptr("Web_1") }),
						ep("0.0.0.0", true),
						ep("224.0.0.1", true),
						with(ep("10.0.0.3", true), func(e *discoveryv1.Endpoint) { e.Zone = ptr("us east") }),
						ep("fd00::1", true),
						ep("10.0.0.300", true),
						ep("10.0.0.4", true),
					),
					// A ready but invalid copy of 10.0.0.1 must not replace the valid one.
					slice("web-b", "web", discoveryv1.AddressTypeIPv4, http,
						with(ep("10.0.0.1", true), func(e *discoveryv1.Endpoint) { e.NodeName = ptr("Node_A") })),
					slice("web-v6", "web", discoveryv1.AddressTypeIPv6, http, ep("::ffff:10.0.0.4", true), ep("fd00::2", true)),
				},
			},
			want: []*registry.Shard{shard("web", httpPort,
				rep("10.0.0.1", notReady, inDC1, httpTarget),
				rep("10.0.0.4", ready, inDC1, httpTarget),
				rep("fd00::2", ready, inDC1, httpTarget))},
			wantErrs: []string{
				`service shop/web: endpointslice web-a, endpoint 1 left out: 10.0.0.2: hostname "Web_1" is not a DNS label`,
				`service shop/web: endpointslice web-a, endpoint 2 left out: address "0.0.0.0" is not a unicast IP`,
				`service shop/web: endpointslice web-a, endpoint 3 left out: address "224.0.0.1" is not a unicast IP`,
				`service shop/web: endpointslice web-a, endpoint 4 left out: 10.0.0.3: locality value "us east"`,
				`service shop/web: endpointslice web-a, endpoint 5 left out: address "fd00::1" is not an IPv4 address`,
				`service shop/web: endpointslice web-a, endpoint 6 left out: address "10.0.0.300" is not an IPv4 address`,
				`service shop/web: endpointslice web-b, endpoint 0 left out: 10.0.0.1: node name "Node_A"`,
				`service shop/web: endpointslice web-v6, endpoint 0 left out: address "::ffff:10.0.0.4" is not an IPv6 address`,
			},
		},
		{
			name: "limits are enforced",
			objs: Objects{
				Services:       []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{slice("web-a", "web", discoveryv1.AddressTypeIPv4, http, many...)},
			},
			opts:        BuildOptions{Cluster: "east", Limits: registry.Limits{MaxPorts: 10, MaxEndpoints: 100, MaxAddressesPerEndpoint: 1}},
			wantInvalid: map[string]string{"web": "service shop/web: 600 endpoints, more than the limit of 100"},
		},
		{
			name: "several hundred endpoints over several slices",
			objs: Objects{
				Services: []*corev1.Service{svc("web", port("http", 80))},
				EndpointSlices: []*discoveryv1.EndpointSlice{
					slice("web-c", "web", discoveryv1.AddressTypeIPv4, http, many[400:]...),
					slice("web-a", "web", discoveryv1.AddressTypeIPv4, http, many[:100]...),
					slice("web-b", "web", discoveryv1.AddressTypeIPv4, http, many[100:400]...),
				},
			},
			want: []*registry.Shard{shard("web", httpPort, manyWant...)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			if opts.Cluster == "" {
				opts = defaultOpts
			}
			got, invalid, errs := BuildShards(tt.objs, opts)
			if len(invalid) != len(tt.wantInvalid) {
				t.Errorf("invalid = %v, want %d matching %q", invalid, len(tt.wantInvalid), tt.wantInvalid)
			}
			for name, want := range tt.wantInvalid {
				err := invalid[registry.ServiceKey{Namespace: "shop", Name: name}]
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("invalid[%s] = %v, want an error containing %q", name, err, want)
				}
				if _, built := got[registry.ServiceKey{Namespace: "shop", Name: name}]; built {
					t.Errorf("invalid service %s has a shard", name)
				}
				var ve *registry.ValidationError
				if !errors.As(err, &ve) || !errors.Is(err, registry.ErrInvalid) {
					t.Errorf("invalid[%s] = %#v, want a *registry.ValidationError", name, err)
				}
			}
			if len(errs) != len(tt.wantErrs) {
				t.Fatalf("errors = %v, want %d matching %q", errs, len(tt.wantErrs), tt.wantErrs)
			}
			for i, err := range errs {
				if !strings.Contains(err.Error(), tt.wantErrs[i]) {
					t.Errorf("error %d = %q, want it to contain %q", i, err, tt.wantErrs[i])
				}
				var ve *registry.ValidationError
				if !errors.As(err, &ve) || !errors.Is(err, registry.ErrInvalid) {
					t.Errorf("error %d = %#v, want a *registry.ValidationError", i, err)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d shards %v, want %d", len(got), keys(got), len(tt.want))
			}
			for _, w := range tt.want {
				g := got[w.Service]
				if !g.Equal(w) {
					t.Errorf("shard %s:\n got %s\nwant %s", w.Service, mustJSON(g), mustJSON(w))
				}
				if g != nil && g.Hash() != w.Hash() {
					t.Errorf("shard %s: hash differs from an equal shard's (nil vs empty slices?)", w.Service)
				}
			}
		})
	}
}

// TestBuildShardsCanonical checks what the hub will compare with: shards are
// normalized, empty lists are empty (not nil) slices like the wire decoder
// makes, and the input order does not matter.
func TestBuildShardsCanonical(t *testing.T) {
	objs := Objects{
		Services: []*corev1.Service{svc("empty", port("http", 80)), svc("web", port("http", 80), port("grpc", 90))},
		EndpointSlices: []*discoveryv1.EndpointSlice{
			slice("web-b", "web", discoveryv1.AddressTypeIPv4, nil, ep("10.0.0.9", true), ep("10.0.0.1", false)),
			slice("web-a", "web", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 1, "grpc": 2}, ep("10.0.0.1", false), ep("10.0.0.5", true)),
		},
	}
	reversed := Objects{Services: []*corev1.Service{objs.Services[1], objs.Services[0]},
		EndpointSlices: []*discoveryv1.EndpointSlice{objs.EndpointSlices[1], objs.EndpointSlices[0]}}
	a, invalid, errs := BuildShards(objs, defaultOpts)
	if len(invalid) != 0 || errs != nil {
		t.Fatal(invalid, errs)
	}
	b, _, _ := BuildShards(reversed, defaultOpts)
	for k, s := range a {
		if !s.Equal(b[k]) || s.Hash() != b[k].Hash() {
			t.Errorf("%s depends on input order:\n%s\n%s", k, mustJSON(s), mustJSON(b[k]))
		}
		if s.Ports == nil || s.Endpoints == nil {
			t.Errorf("%s: nil ports or endpoints", k)
		}
		for _, e := range s.Endpoints {
			if e.Addresses == nil || e.Ports == nil {
				t.Errorf("%s: endpoint %v has nil addresses or ports", k, e.Addresses)
			}
		}
		c := *s
		c.Ports = append([]registry.ServicePort(nil), s.Ports...)
		c.Endpoints = append([]registry.Endpoint(nil), s.Endpoints...)
		c.Normalize()
		if !c.Equal(s) {
			t.Errorf("%s is not normalized", k)
		}
	}
	if got := a[registry.ServiceKey{Namespace: "shop", Name: "web"}].Endpoints; len(got) != 3 || got[0].Ports == nil {
		t.Errorf("web endpoints = %v", got)
	}
	// The input objects are not modified.
	if objs.EndpointSlices[0].Name != "web-b" || objs.Services[0].Name != "empty" {
		t.Error("input reordered")
	}
}

func keys(m map[registry.ServiceKey]*registry.Shard) []string {
	var out []string
	for k := range m {
		out = append(out, k.String())
	}
	return out
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// What the import writer made (a derived Service, imported EndpointSlices)
// is another cluster's service: it is never exported back, even with ExportAll.
func TestImportedObjectsAreNeverExported(t *testing.T) {
	derived := svc("derived-abc", port("grpc", 8080))
	derived.Labels = map[string]string{importwriter.ManagedByLabel: importwriter.ManagedByValue}
	local := svc("web", port("http", 80))
	imported := slice("web-east-ipv4-x-0", "web", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8080}, ep("10.9.0.1", true))
	imported.Labels[importwriter.ManagedByLabel] = importwriter.ManagedByValue
	own := slice("web-1", "web", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8080}, ep("10.0.0.1", true))
	shards, _, _ := BuildShards(Objects{Services: []*corev1.Service{derived, local},
		EndpointSlices: []*discoveryv1.EndpointSlice{imported, own}}, BuildOptions{Cluster: "east", ExportAll: true})
	if got := keys(shards); len(got) != 1 || got[0] != "shop/web" {
		t.Fatalf("shards = %v, want only shop/web", got)
	}
	if eps := shards[registry.ServiceKey{Namespace: "shop", Name: "web"}].Endpoints; len(eps) != 1 || eps[0].Addresses[0].String() != "10.0.0.1" {
		t.Errorf("web's endpoints = %+v, want only the cluster's own", eps)
	}
}

// The endpoints of one EndpointSlice share one port list in the shard (a
// slice's ports are the same for all its endpoints), read sorted by each,
// with no room to append into; another slice's endpoints have their own.
func TestBuildShardsShareASlicesPorts(t *testing.T) {
	a := slice("web-a", "web", discoveryv1.AddressTypeIPv4, nil, ep("10.0.0.1", true), ep("10.0.0.2", true), ep("10.0.0.3", false))
	// Unsorted, with an "all ports" entry that is left out.
	a.Ports = []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr(int32(9090))}, {Name: ptr("all")}, {Name: ptr("http"), Port: ptr(int32(8080))}}
	b := slice("web-b", "web", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8081}, ep("10.0.0.4", true))
	shards, invalid, errs := BuildShards(Objects{Services: []*corev1.Service{svc("web", port("http", 80))},
		EndpointSlices: []*discoveryv1.EndpointSlice{a, b}}, BuildOptions{Cluster: "east"})
	if len(invalid) > 0 || len(errs) > 0 {
		t.Fatalf("invalid %v, errors %v", invalid, errs)
	}
	eps := shards[registry.ServiceKey{Namespace: "shop", Name: "web"}].Endpoints
	if len(eps) != 4 {
		t.Fatalf("%d endpoints, want 4", len(eps))
	}
	fromA := []registry.EndpointPort{{Name: "http", Port: 8080}, {Name: "metrics", Port: 9090}}
	for i, e := range eps[:3] {
		if !slices.Equal(e.Ports, fromA) || cap(e.Ports) != len(e.Ports) {
			t.Errorf("endpoint %d: ports %v (capacity %d), want %v with no room", i, e.Ports, cap(e.Ports), fromA)
		}
		if &e.Ports[0] != &eps[0].Ports[0] {
			t.Errorf("endpoint %d does not share its slice's port list", i)
		}
	}
	if want := []registry.EndpointPort{{Name: "http", Port: 8081}}; !slices.Equal(eps[3].Ports, want) {
		t.Errorf("the other slice's endpoint: ports %v, want %v", eps[3].Ports, want)
	}
	if *a.Ports[0].Name != "metrics" {
		t.Error("building changed the EndpointSlice's ports")
	}
}
