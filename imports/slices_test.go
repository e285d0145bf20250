package imports

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"testing"

	"github.com/navemesh/nave/registry"
)

// importOf builds the import of one ClusterSetIP service with the given
// endpoints per cluster ("http" on 8080 unless set otherwise).
func importOf(t testing.TB, eps map[registry.ClusterID][]registry.Endpoint) *Import {
	t.Helper()
	var shards []*registry.Shard
	for c, e := range eps {
		shards = append(shards, shard(c, 0, slices.Clone(e)...))
	}
	imp, skipped := Build(merged(t, shards...), nil, nil)
	if len(skipped) != 0 {
		t.Fatalf("skipped %v", skipped)
	}
	return imp
}

// v4eps returns n endpoints 10.<b>.x.y from index from.
func v4eps(b byte, from, n int) []registry.Endpoint {
	var out []registry.Endpoint
	for i := from; i < from+n; i++ {
		out = append(out, ep(netip.AddrFrom4([4]byte{10, b, byte(i >> 8), byte(i)}).String()))
	}
	return out
}

// changed lists the names of slices created, updated or deleted from before to after.
func changed(before, after []Slice) []string {
	var names []string
	find := func(ss []Slice, name string) *Slice {
		for i := range ss {
			if ss[i].Name == name {
				return &ss[i]
			}
		}
		return nil
	}
	for i := range after {
		if b := find(before, after[i].Name); b == nil || !b.Equal(&after[i]) {
			names = append(names, after[i].Name)
		}
	}
	for i := range before {
		if find(after, before[i].Name) == nil {
			names = append(names, before[i].Name)
		}
	}
	slices.Sort(names)
	return names
}

var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// checkSlices checks what must hold of any Slices result for imp.
func checkSlices(t *testing.T, imp *Import, got []Slice) {
	t.Helper()
	names := map[string]bool{}
	placed := map[string]int{}
	for _, s := range got {
		if names[s.Name] {
			t.Errorf("slice name %s twice", s.Name)
		}
		names[s.Name] = true
		if len(s.Name) > 253 || !dnsSubdomain.MatchString(s.Name) {
			t.Errorf("slice name %q is not a DNS subdomain", s.Name)
		}
		if n := len(s.Endpoints); n == 0 || n > MaxEndpointsPerSlice {
			t.Errorf("slice %s has %d endpoints", s.Name, n)
		}
		if !slices.IsSortedFunc(s.Endpoints, compareFirstAddress) || !slices.IsSortedFunc(s.Ports, compareSlicePorts) {
			t.Errorf("slice %s is not sorted", s.Name)
		}
		src := imp.Sources[slices.IndexFunc(imp.Sources, func(x Source) bool { return x.Cluster == s.Cluster })]
		for _, e := range s.Endpoints {
			if e.Family() != s.Family {
				t.Errorf("slice %s (%s) holds %v", s.Name, s.Family, e.Addresses)
			}
			var p []SlicePort
			for _, sp := range src.Ports {
				if n, ok := (&registry.Endpoint{Ports: e.Ports}).PortNumber(sp.Name); ok {
					p = append(p, SlicePort{sp.Name, n, sp.Protocol, sp.AppProtocol})
				}
			}
			slices.SortFunc(p, compareSlicePorts)
			if !slices.Equal(p, s.Ports) {
				t.Errorf("slice %s has ports %v but holds %v with ports %v", s.Name, s.Ports, e.Addresses, p)
			}
			placed[string(s.Cluster)+"/"+e.Addresses[0].String()]++
		}
	}
	want := 0
	for _, src := range imp.Sources {
		for _, e := range src.Endpoints {
			want++
			if n := placed[string(src.Cluster)+"/"+e.Addresses[0].String()]; n != 1 {
				t.Errorf("endpoint %s/%v placed %d times", src.Cluster, e.Addresses, n)
			}
		}
	}
	if len(placed) != want {
		t.Errorf("%d endpoints placed, want %d", len(placed), want)
	}
}

func TestSlicesPacksAtMost100(t *testing.T) {
	imp := importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": v4eps(0, 0, 250), "west": v4eps(1, 0, 3)})
	got := Slices(imp, nil)
	checkSlices(t, imp, got)
	var sizes []int
	for _, s := range got {
		sizes = append(sizes, len(s.Endpoints))
	}
	if !slices.Equal(sizes, []int{100, 100, 50, 3}) {
		t.Errorf("sizes = %v", sizes)
	}
	if got[0].Name != "web-east-ipv4-"+got[0].Name[14:22]+"-0" || got[2].Name[:22] != got[0].Name[:22] || got[2].Name[22:] != "-2" {
		t.Errorf("names %s, %s: want web-east-ipv4-<hash>-<index>", got[0].Name, got[2].Name)
	}
	if again := Slices(imp, nil); !slices.EqualFunc(again, got, func(a, b Slice) bool { return a.Equal(&b) }) {
		t.Error("Slices is not deterministic")
	}
}

func TestSlicesSplitFamiliesAndTargetPorts(t *testing.T) {
	other := ep("10.0.0.3")
	other.Ports = []registry.EndpointPort{{Name: "http", Port: 9090}}
	imp := importOf(t, map[registry.ClusterID][]registry.Endpoint{
		"east": {ep("10.0.0.1"), ep("10.0.0.2"), other, ep("fd00::1"), ep("fd00::2", "10.0.0.4")},
	})
	got := Slices(imp, nil)
	checkSlices(t, imp, got)
	type shape struct {
		family registry.IPFamily
		target int32
		n      int
	}
	var shapes []shape
	for _, s := range got {
		shapes = append(shapes, shape{s.Family, s.Ports[0].Port, len(s.Endpoints)})
	}
	slices.SortFunc(shapes, func(a, b shape) int {
		return cmp.Or(cmp.Compare(a.family, b.family), cmp.Compare(a.target, b.target))
	})
	want := []shape{{registry.IPv4, 8080, 3}, {registry.IPv4, 9090, 1}, {registry.IPv6, 8080, 2}}
	if !slices.Equal(shapes, want) {
		t.Errorf("slices %v, want %v", shapes, want)
	}
	if p := got[0].Ports[0]; p.Name != "http" || p.Protocol != registry.ProtocolTCP {
		t.Errorf("slice port %+v", p)
	}
}

func TestSlicesAreSticky(t *testing.T) {
	base := v4eps(0, 0, 250)
	imp := importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": base})
	prev := Slices(imp, nil)

	t.Run("remove one", func(t *testing.T) {
		eps := slices.Delete(slices.Clone(base), 120, 121)
		next := Slices(importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": eps}), prev)
		if c := changed(prev, next); len(c) != 1 || c[0] != prev[1].Name {
			t.Errorf("changed %v, want only %s", c, prev[1].Name)
		}
	})
	t.Run("add one fills a slice with room", func(t *testing.T) {
		eps := append(slices.Clone(base), v4eps(0, 1000, 1)...)
		next := Slices(importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": eps}), prev)
		if c := changed(prev, next); len(c) != 1 || c[0] != prev[2].Name {
			t.Errorf("changed %v, want only %s (the one with room)", c, prev[2].Name)
		}
	})
	t.Run("condition change", func(t *testing.T) {
		eps := slices.Clone(base)
		eps[7].Conditions = registry.Conditions{Serving: true, Terminating: true}
		next := Slices(importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": eps}), prev)
		if c := changed(prev, next); len(c) != 1 || c[0] != prev[0].Name {
			t.Errorf("changed %v, want only %s", c, prev[0].Name)
		}
	})
	t.Run("remove one, add one", func(t *testing.T) {
		eps := append(slices.Delete(slices.Clone(base), 3, 4), v4eps(0, 2000, 1)...)
		next := Slices(importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": eps}), prev)
		if c := changed(prev, next); len(c) != 1 || c[0] != prev[0].Name {
			t.Errorf("changed %v, want only %s (fill the slice that changes anyway)", c, prev[0].Name)
		}
	})
	t.Run("new slice only when all are full", func(t *testing.T) {
		full := Slices(importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": v4eps(0, 0, 200)}), nil)
		next := Slices(importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": v4eps(0, 0, 201)}), full)
		if c := changed(full, next); len(c) != 1 || slices.ContainsFunc(full, func(s Slice) bool { return s.Name == c[0] }) {
			t.Errorf("changed %v, want one new slice", c)
		}
	})
	t.Run("emptied slice is dropped", func(t *testing.T) {
		eps := slices.Clone(base[:200]) // the third slice's 50 go
		next := Slices(importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": eps}), prev)
		if c := changed(prev, next); len(c) != 1 || c[0] != prev[2].Name || len(next) != 2 {
			t.Errorf("changed %v, want %s deleted", c, prev[2].Name)
		}
	})
	t.Run("a port change reuses the names", func(t *testing.T) {
		eps := slices.Clone(base)
		for i := range eps {
			eps[i].Ports = []registry.EndpointPort{{Name: "http", Port: 9090}}
		}
		next := Slices(importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": eps}), prev)
		if len(next) != 3 || next[0].Name != prev[0].Name || next[2].Name != prev[2].Name || next[0].Ports[0].Port != 9090 {
			t.Errorf("want the three slices updated in place, got %d slices", len(next))
		}
	})
	t.Run("gone cluster", func(t *testing.T) {
		two := importOf(t, map[registry.ClusterID][]registry.Endpoint{"east": base, "west": v4eps(1, 0, 5)})
		withWest := Slices(two, prev)
		next := Slices(imp, withWest)
		if c := changed(withWest, next); len(c) != 1 || withWest[len(withWest)-1].Cluster != "west" || c[0] != withWest[len(withWest)-1].Name {
			t.Errorf("changed %v, want west's slice deleted", c)
		}
	})
	t.Run("nil import", func(t *testing.T) {
		if got := Slices(nil, prev); got != nil {
			t.Errorf("Slices(nil) = %v", got)
		}
	})
}

func TestSlicesPropertiesOnRandomInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var prev []Slice
	for i := range 30 {
		imp, _ := Build(randomService(t, rng, i%4 == 0), nil, nil)
		got := Slices(imp, prev)
		checkSlices(t, imp, got)
		if t.Failed() {
			t.Fatalf("round %d", i)
		}
		// Fixed point.
		if again := Slices(imp, got); len(changed(got, again)) != 0 {
			t.Fatalf("round %d: not a fixed point: %v changed", i, changed(got, again))
		}
		// Order of prev and of the import's lists does not matter.
		shuffledPrev := shuffle(rng, prev)
		for j := range shuffledPrev {
			shuffledPrev[j].Ports = shuffle(rng, shuffledPrev[j].Ports)
			shuffledPrev[j].Endpoints = shuffle(rng, shuffledPrev[j].Endpoints)
		}
		imp2 := *imp
		imp2.Sources = shuffle(rng, imp.Sources)
		for j := range imp2.Sources {
			imp2.Sources[j].Endpoints = shuffle(rng, imp2.Sources[j].Endpoints)
			imp2.Sources[j].Ports = shuffle(rng, imp2.Sources[j].Ports)
		}
		if again := Slices(&imp2, shuffledPrev); len(changed(got, again)) != 0 {
			t.Fatalf("round %d: order matters: %v", i, changed(got, again))
		}
		// One endpoint's conditions change: exactly one slice changes.
		if len(imp.Sources[0].Endpoints) > 0 {
			imp3 := *imp
			imp3.Sources = slices.Clone(imp.Sources)
			imp3.Sources[0].Endpoints = slices.Clone(imp.Sources[0].Endpoints)
			k := rng.IntN(len(imp3.Sources[0].Endpoints))
			imp3.Sources[0].Endpoints[k].Conditions.Ready = !imp3.Sources[0].Endpoints[k].Conditions.Ready
			if c := changed(got, Slices(&imp3, got)); len(c) != 1 {
				t.Fatalf("round %d: one endpoint changed %d slices", i, len(c))
			}
		}
		if i%3 != 2 {
			prev = got // sometimes start over
		} else {
			prev = nil
		}
	}
}

func TestSliceNames(t *testing.T) {
	// Hyphen-joined parts are ambiguous; the hash keeps them apart.
	a := slicePrefix(registry.ServiceKey{Namespace: "ns", Name: "a-b"}, "c", registry.IPv4)
	b := slicePrefix(registry.ServiceKey{Namespace: "ns", Name: "a"}, "b-c", registry.IPv4)
	if a == b {
		t.Errorf("prefixes collide: %s", a)
	}
	if want := regexp.MustCompile(`^a-b-c-ipv4-[0-9a-v]{8}-$`); !want.MatchString(a) {
		t.Errorf("prefix %q", a)
	}
	long := registry.ServiceKey{Namespace: "n", Name: "s" + fmt.Sprintf("%062d", 0)}
	name := sliceName(slicePrefix(long, registry.ClusterID(fmt.Sprintf("c%062d", 0)), registry.IPv6), 12345)
	if len(name) > 253 || !dnsSubdomain.MatchString(name) {
		t.Errorf("name %q (%d)", name, len(name))
	}
	// Invalid input still yields a valid name.
	odd := sliceName(slicePrefix(registry.ServiceKey{Namespace: "N", Name: "Web_1"}, "-East-", registry.IPv4), 0)
	if !dnsSubdomain.MatchString(odd) {
		t.Errorf("name %q", odd)
	}
	// Pinned: names must not change between releases (they are read back).
	if got, want := sliceName(slicePrefix(web, "east", registry.IPv4), 3), "web-east-ipv4-s8l280ro-3"; got != want {
		t.Errorf("name %q, pinned %q", got, want)
	}
}
