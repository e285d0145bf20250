package imports

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
)

func TestBuildMirrorsTheMergedService(t *testing.T) {
	east := shard("east", 0, ep("10.0.0.1"), ep("10.0.0.2"))
	east.Ports = append(east.Ports, registry.ServicePort{Name: "grpc", Port: 9000, Protocol: registry.ProtocolTCP, AppProtocol: "grpc"})
	east.Properties = registry.Properties{
		SessionAffinity: registry.SessionAffinityClientIP, SessionAffinityTimeout: 60,
		IPFamilies: []registry.IPFamily{registry.IPv6, registry.IPv4},
		Labels:     map[string]string{"team": "shop"},
	}
	west := shard("west", time.Hour, ep("10.1.0.1"))
	west.Properties = east.Properties
	svc := merged(t, west, east)

	ips := []netip.Addr{addr("10.99.0.7"), addr("fd99::7"), addr("10.99.0.8")}
	imp, skipped := Build(svc, func(c registry.ClusterID) bool { return c == "west" }, ips)
	if len(skipped) != 0 {
		t.Errorf("skipped %v", skipped)
	}
	if imp.Service != web || imp.Headless || !slices.Equal(imp.Ports, svc.Ports) || !imp.Properties.Equal(&svc.Properties) {
		t.Errorf("import does not mirror the service: %+v", imp)
	}
	if want := []netip.Addr{addr("fd99::7"), addr("10.99.0.7")}; !slices.Equal(imp.IPs, want) {
		t.Errorf("IPs = %v, want %v (one per family, in the families' order)", imp.IPs, want)
	}
	if len(imp.Sources) != 2 || imp.Sources[0].Cluster != "east" || imp.Sources[1].Cluster != "west" {
		t.Fatalf("sources = %+v", imp.Sources)
	}
	if imp.Sources[0].Stale || !imp.Sources[1].Stale {
		t.Errorf("stale flags: east %t, west %t", imp.Sources[0].Stale, imp.Sources[1].Stale)
	}
	if got := imp.Sources[1].Ports; !slices.Equal(got, []registry.ServicePort{tcp("http", 80)}) {
		t.Errorf("west serves %v, want only http", got)
	}
	want := Endpoint{
		Addresses: []netip.Addr{addr("10.0.0.1")}, Ports: []registry.EndpointPort{{Name: "http", Port: 8080}},
		Zone: "eu-1a", Conditions: ready(),
	}
	if got := imp.Sources[0].Endpoints[0]; !got.Equal(&want) {
		t.Errorf("endpoint = %+v, want %+v", got, want)
	}
}

func TestBuildIPs(t *testing.T) {
	v4, v6, v4b := addr("10.99.0.1"), addr("fd99::1"), addr("10.99.0.2")
	for _, tc := range []struct {
		name     string
		headless bool
		families []registry.IPFamily
		ips      []netip.Addr
		want     []netip.Addr
	}{
		{"single stack", false, []registry.IPFamily{registry.IPv4}, []netip.Addr{v4}, []netip.Addr{v4}},
		{"families order", false, []registry.IPFamily{registry.IPv6, registry.IPv4}, []netip.Addr{v4, v6}, []netip.Addr{v6, v4}},
		{"one per family", false, []registry.IPFamily{registry.IPv4}, []netip.Addr{v4, v4b, v6}, []netip.Addr{v4}},
		{"no families stated", false, nil, []netip.Addr{v6, v4, v4b}, []netip.Addr{v6, v4}},
		{"family without IP", false, []registry.IPFamily{registry.IPv4, registry.IPv6}, []netip.Addr{v4}, []netip.Addr{v4}},
		{"mapped counts as IPv4", false, []registry.IPFamily{registry.IPv4}, []netip.Addr{addr("::ffff:10.99.0.1")}, []netip.Addr{v4}},
		{"headless has none", true, []registry.IPFamily{registry.IPv4}, []netip.Addr{v4}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := shard("east", 0, ep("10.0.0.1"))
			s.Headless = tc.headless
			s.IPFamilies = tc.families
			imp, _ := Build(merged(t, s), nil, tc.ips)
			if !slices.Equal(imp.IPs, tc.want) {
				t.Errorf("IPs = %v, want %v", imp.IPs, tc.want)
			}
		})
	}
}

func TestBuildPorts(t *testing.T) {
	noPort := ep("10.0.0.9")
	noPort.Ports = nil
	otherName := ep("10.0.0.8")
	otherName.Ports = []registry.EndpointPort{{Name: "metrics", Port: 9100}}

	t.Run("ClusterSetIP drops endpoints serving no port", func(t *testing.T) {
		imp, _ := Build(merged(t, shard("east", 0, ep("10.0.0.1"), noPort, otherName)), nil, nil)
		if got := len(imp.Sources[0].Endpoints); got != 1 {
			t.Errorf("%d endpoints, want 1", got)
		}
	})
	t.Run("Headless keeps them", func(t *testing.T) {
		s := shard("east", 0, ep("10.0.0.1"), noPort, otherName)
		s.Headless = true
		imp, _ := Build(merged(t, s), nil, nil)
		eps := imp.Sources[0].Endpoints
		if len(eps) != 3 || len(eps[1].Ports) != 0 || len(eps[2].Ports) != 0 {
			t.Errorf("endpoints = %+v, want all three, two without ports", eps)
		}
	})
	t.Run("Headless without ports", func(t *testing.T) {
		s := shard("east", 0, noPort)
		s.Headless, s.Ports = true, nil
		imp, _ := Build(merged(t, s), nil, nil)
		if len(imp.Ports) != 0 || len(imp.Sources[0].Endpoints) != 1 {
			t.Errorf("import = %+v", imp)
		}
	})
	t.Run("a conflict loser is listed under the import's names", func(t *testing.T) {
		east := shard("east", 0, ep("10.0.0.1"))
		westEp := ep("10.1.0.1")
		westEp.Ports = []registry.EndpointPort{{Name: "web", Port: 8081}, {Name: "http", Port: 8181}}
		west := shard("west", time.Hour, westEp)
		// 80/TCP named "web" (loses to east's "http"); "http" names 81 (loses: east has the name).
		west.Ports = []registry.ServicePort{tcp("web", 80), tcp("http", 81)}
		svc := merged(t, east, west)
		if len(svc.Conflicts) == 0 {
			t.Fatal("expected port conflicts")
		}
		imp, _ := Build(svc, nil, nil)
		src := imp.Sources[1]
		if !slices.Equal(src.Ports, []registry.ServicePort{tcp("http", 80)}) {
			t.Errorf("west serves %v, want http 80 under the import's name", src.Ports)
		}
		if want := []registry.EndpointPort{{Name: "http", Port: 8081}}; !slices.Equal(src.Endpoints[0].Ports, want) {
			t.Errorf("west endpoint ports %v, want %v", src.Endpoints[0].Ports, want)
		}
	})
}

func TestBuildSkipsAddressesTheAPIServerRefuses(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want SkipReason
	}{
		{"127.0.0.1", SkipLoopback},
		{"::1", SkipLoopback},
		{"169.254.169.254", SkipLinkLocal},
		{"fe80::1", SkipLinkLocal},
		{"0.0.0.0", SkipUnspecified},
		{"::", SkipUnspecified},
		{"224.0.0.1", SkipMulticast},
		{"ff02::1", SkipMulticast},
		{"fe80::1%eth0", SkipScoped},
		{"::ffff:127.0.0.1", SkipLoopback},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			// Built by hand: registry validation refuses some of these already.
			s := shard("east", 0, ep("10.0.0.1", tc.addr), ep(tc.addr))
			svc := &registry.Service{Key: web, Shards: []*registry.Shard{s}, Ports: s.Ports}
			imp, skipped := Build(svc, nil, nil)
			a := addr(tc.addr).Unmap()
			want := []Skipped{{"east", a, tc.want}, {"east", a, tc.want}}
			if !slices.Equal(skipped, want) {
				t.Errorf("skipped = %v, want %v", skipped, want)
			}
			eps := imp.Sources[0].Endpoints
			if len(eps) != 1 || !slices.Equal(eps[0].Addresses, []netip.Addr{addr("10.0.0.1")}) {
				t.Errorf("endpoints = %+v, want only 10.0.0.1", eps)
			}
		})
	}
}

func TestBuildSplitsFamiliesAndUnmaps(t *testing.T) {
	s := shard("east", 0, ep("fd00::2", "10.0.0.2", "10.0.0.1"), ep("::ffff:10.0.0.3"))
	svc := &registry.Service{Key: web, Shards: []*registry.Shard{s}, Ports: s.Ports}
	imp, skipped := Build(svc, nil, nil)
	if len(skipped) != 0 {
		t.Errorf("skipped %v", skipped)
	}
	var got [][]netip.Addr
	for _, e := range imp.Sources[0].Endpoints {
		got = append(got, e.Addresses)
	}
	want := [][]netip.Addr{{addr("10.0.0.1"), addr("10.0.0.2")}, {addr("10.0.0.3")}, {addr("fd00::2")}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("addresses = %v, want %v", got, want)
	}
}

func TestBuildDuplicateFirstAddress(t *testing.T) {
	a, b := ep("10.0.0.1"), ep("10.0.0.1", "10.0.0.5")
	svc := &registry.Service{Key: web, Shards: []*registry.Shard{shard("east", 0, b, a)}, Ports: []registry.ServicePort{tcp("http", 80)}}
	imp, skipped := Build(svc, nil, nil)
	if n := len(imp.Sources[0].Endpoints); n != 1 {
		t.Errorf("%d endpoints, want 1", n)
	}
	if len(skipped) != 2 || skipped[0].Reason != SkipDuplicate {
		t.Errorf("skipped = %v", skipped)
	}
}

func TestBuildNil(t *testing.T) {
	if imp, skipped := Build(nil, nil, nil); imp != nil || skipped != nil {
		t.Error("Build(nil) is not nil")
	}
	if (*Import)(nil).Hash() != registry.ZeroHash || !(*Import)(nil).Equal(nil) {
		t.Error("nil import")
	}
}

func TestBuildIsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		svc := randomService(t, rng, i%3 == 0)
		stale := func(c registry.ClusterID) bool { return c == "c1" }
		ips := []netip.Addr{addr("10.99.0.1")}
		want, wantSkipped := Build(svc, stale, ips)
		for range 3 {
			got, gotSkipped := Build(shuffled(rng, svc), stale, ips)
			if !got.Equal(want) || got.Hash() != want.Hash() || !slices.Equal(gotSkipped, wantSkipped) {
				t.Fatalf("service %d: a shuffled service gives another import", i)
			}
		}
	}
}

func TestHashAndEqualSeeEveryChange(t *testing.T) {
	base := func() *Import {
		s := shard("east", 0, ep("10.0.0.1"), ep("10.0.0.2"))
		s.Labels = map[string]string{"a": "1"}
		s.IPFamilies = []registry.IPFamily{registry.IPv4}
		imp, _ := Build(merged(t, s), nil, []netip.Addr{addr("10.99.0.1")})
		return imp
	}
	ref := base()
	if !base().Equal(ref) || base().Hash() != ref.Hash() {
		t.Fatal("equal imports differ")
	}
	for _, tc := range []struct {
		name   string
		change func(*Import)
	}{
		{"service", func(i *Import) { i.Service.Name = "api" }},
		{"namespace", func(i *Import) { i.Service.Namespace = "ops" }},
		{"type", func(i *Import) { i.Headless = true }},
		{"port number", func(i *Import) { i.Ports = []registry.ServicePort{tcp("http", 81)} }},
		{"appProtocol", func(i *Import) {
			i.Ports = []registry.ServicePort{{Name: "http", Port: 80, Protocol: "TCP", AppProtocol: "h2c"}}
		}},
		{"IP", func(i *Import) { i.IPs = []netip.Addr{addr("10.99.0.2")} }},
		{"no IP", func(i *Import) { i.IPs = nil }},
		{"affinity", func(i *Import) { i.Properties.SessionAffinity = registry.SessionAffinityClientIP }},
		{"traffic policy", func(i *Import) { i.Properties.InternalTrafficPolicy = registry.InternalTrafficPolicyLocal }},
		{"traffic distribution", func(i *Import) { i.Properties.TrafficDistribution = "PreferClose" }},
		{"families", func(i *Import) { i.Properties.IPFamilies = []registry.IPFamily{registry.IPv6} }},
		{"label value", func(i *Import) { i.Properties.Labels = map[string]string{"a": "2"} }},
		{"annotation", func(i *Import) { i.Properties.Annotations = map[string]string{"a": "1"} }},
		{"stale", func(i *Import) { i.Sources[0].Stale = true }},
		{"cluster", func(i *Import) { i.Sources[0].Cluster = "west" }},
		{"source ports", func(i *Import) { i.Sources[0].Ports = nil }},
		{"endpoint gone", func(i *Import) { i.Sources[0].Endpoints = i.Sources[0].Endpoints[:1] }},
		{"address", func(i *Import) { i.Sources[0].Endpoints[0].Addresses = []netip.Addr{addr("10.0.0.3")} }},
		{"target port", func(i *Import) { i.Sources[0].Endpoints[0].Ports = []registry.EndpointPort{{Name: "http", Port: 1}} }},
		{"hostname", func(i *Import) { i.Sources[0].Endpoints[0].Hostname = "h" }},
		{"zone", func(i *Import) { i.Sources[0].Endpoints[0].Zone = "eu-1b" }},
		{"ready", func(i *Import) { i.Sources[0].Endpoints[0].Conditions.Ready = false }},
		{"serving", func(i *Import) { i.Sources[0].Endpoints[0].Conditions.Serving = false }},
		{"terminating", func(i *Import) { i.Sources[0].Endpoints[0].Conditions.Terminating = true }},
		{"no source", func(i *Import) { i.Sources = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			imp := base()
			tc.change(imp)
			if imp.Equal(ref) || ref.Equal(imp) {
				t.Error("Equal misses the change")
			}
			if imp.Hash() == ref.Hash() {
				t.Error("Hash misses the change")
			}
		})
	}
	// The hash is stable across processes and releases: pin it.
	if got, want := ref.Hash().String(), "a70c60c1fcbd14bb28dce1d2e8485ffd"; got != want {
		t.Logf("Hash = %s (pinned %s): if the encoding changed on purpose, bump its version and the pin", got, want)
		t.Fail()
	}
}

func TestWanted(t *testing.T) {
	has := func(ns ...string) func(string) bool { return func(n string) bool { return slices.Contains(ns, n) } }
	if !Wanted(web, has("shop", "ops")) {
		t.Error("a cluster with the namespace must import")
	}
	if Wanted(web, has("ops")) {
		t.Error("a cluster without the namespace must not")
	}
}

// A slice known only by what Prev keeps packs as the slice itself does:
// Sum must change with everything Equal compares, and only with that.
func TestEndpointSumFollowsEqual(t *testing.T) {
	base := Endpoint{Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")},
		Ports: []registry.EndpointPort{{Name: "grpc", Port: 9000}, {Name: "http", Port: 8080}}, Hostname: "web-0", Zone: "z1",
		Conditions: registry.Conditions{Ready: true, Serving: true}}
	variants := map[string]func(e *Endpoint){
		"same":             func(*Endpoint) {},
		"an address":       func(e *Endpoint) { e.Addresses[1] = netip.MustParseAddr("10.0.0.3") },
		"an address less":  func(e *Endpoint) { e.Addresses = e.Addresses[:1] },
		"IPv4-mapped":      func(e *Endpoint) { e.Addresses[0] = netip.MustParseAddr("::ffff:10.0.0.1") },
		"a port number":    func(e *Endpoint) { e.Ports[0].Port = 9001 },
		"a port name":      func(e *Endpoint) { e.Ports[0].Name = "grpcs" },
		"a port less":      func(e *Endpoint) { e.Ports = e.Ports[:1] },
		"hostname":         func(e *Endpoint) { e.Hostname = "web-1" },
		"hostname to zone": func(e *Endpoint) { e.Hostname, e.Zone = "", "web-0z1" },
		"zone":             func(e *Endpoint) { e.Zone = "z2" },
		"ready":            func(e *Endpoint) { e.Conditions.Ready = false },
		"serving":          func(e *Endpoint) { e.Conditions.Serving = false },
		"terminating":      func(e *Endpoint) { e.Conditions.Terminating = true },
	}
	for name, change := range variants {
		e := base
		e.Addresses, e.Ports = slices.Clone(base.Addresses), slices.Clone(base.Ports)
		change(&e)
		if equal, same := e.Equal(&base), e.Sum() == base.Sum(); equal != same {
			t.Errorf("%s: Equal %v, same Sum %v", name, equal, same)
		}
	}
	eth0 := Endpoint{Addresses: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}}
	eth1 := Endpoint{Addresses: []netip.Addr{netip.MustParseAddr("fe80::1%eth1")}}
	if eth0.Sum() == eth1.Sum() {
		t.Error("addresses of two zones have the same Sum")
	}
}
