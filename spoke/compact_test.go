package spoke

import (
	"fmt"
	"maps"
	"reflect"
	"testing"

	"github.com/navemesh/nave/importwriter"
	"github.com/navemesh/nave/registry"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A slice as the decoder leaves it: every pointer and list allocated apart,
// the endpoint array with room to spare; endpoints with and without each
// optional field.
func decodedSlice(n int) *discoveryv1.EndpointSlice {
	eps := make([]discoveryv1.Endpoint, 0, 2*n)
	for i := range n {
		e := discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.0.%d.%d", i/250, i%250)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(i%3 != 0), Serving: ptr(true), Terminating: ptr(i%5 == 0)},
			Zone:       ptr(fmt.Sprintf("z%d", i%3)),
			NodeName:   ptr(fmt.Sprintf("node-%d", i%7)),
		}
		switch i % 4 {
		case 1:
			e.Addresses = append(e.Addresses, fmt.Sprintf("fd00::%x", i))
			e.Hostname = ptr(fmt.Sprintf("h%d", i))
		case 2:
			e.Conditions = discoveryv1.EndpointConditions{}
			e.Zone, e.NodeName = nil, nil
		case 3:
			e.Addresses = []string{} // as odd as it is, kept as it came
		}
		eps = append(eps, e)
	}
	eps = append(eps, discoveryv1.Endpoint{}) // no addresses at all
	return &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps}
}

func TestCompactEndpointsKeepsMeaningAndSharesStorage(t *testing.T) {
	es := decodedSlice(100)
	want := es.DeepCopy()
	compactEndpoints(es)
	if !reflect.DeepEqual(es, want) {
		t.Fatalf("compacting changed the slice:\n got %+v\nwant %+v", es.Endpoints, want.Endpoints)
	}
	if cap(es.Endpoints) != len(es.Endpoints) {
		t.Errorf("endpoint array: len %d, cap %d; want them equal", len(es.Endpoints), cap(es.Endpoints))
	}
	zones, nodes := map[*string]bool{}, map[*string]bool{}
	for i, e := range es.Endpoints {
		if e.Zone != nil {
			zones[e.Zone] = true
		}
		if e.NodeName != nil {
			nodes[e.NodeName] = true
		}
		for _, b := range []*bool{e.Conditions.Ready, e.Conditions.Serving, e.Conditions.Terminating} {
			if b != nil && b != &sharedTrue && b != &sharedFalse {
				t.Fatalf("endpoint %d: a condition points at its own bool", i)
			}
		}
		if cap(e.Addresses) != len(e.Addresses) {
			t.Errorf("endpoint %d: addresses len %d, cap %d (appending to one would overwrite the next)", i, len(e.Addresses), cap(e.Addresses))
		}
	}
	if len(zones) != 3 || len(nodes) != 7 {
		t.Errorf("distinct zone pointers %d (want 3), node name pointers %d (want 7)", len(zones), len(nodes))
	}
	again := es.DeepCopy()
	compactEndpoints(es)
	if !reflect.DeepEqual(es, again) {
		t.Error("compacting twice changed the slice")
	}
	empty := &discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{}}
	compactEndpoints(empty)
	if empty.Endpoints == nil {
		t.Error("an empty endpoint list became nil")
	}
}

// The source's cache of EndpointSlices compacts them (strip). (The import
// writer keeps no endpoints: see keptSlice.)
func TestCachedSlicesAreCompacted(t *testing.T) {
	out, err := strip(decodedSlice(10))
	if err != nil {
		t.Fatal(err)
	}
	got := &out.(*cachedSlice).EndpointSlice
	if cap(got.Endpoints) != len(got.Endpoints) || got.Endpoints[0].Conditions.Serving != &sharedTrue {
		t.Error("the cached slice is not compacted")
	}
}

// The source's cache keeps the service a slice belongs to, not its labels
// (a map per slice).
func TestCachedSlicesKeepTheirServiceNotTheirLabels(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   registry.ServiceKey
	}{
		{"a service's", map[string]string{discoveryv1.LabelServiceName: "web", "app": "web"}, registry.ServiceKey{Namespace: "shop", Name: "web"}},
		{"no service's", map[string]string{"app": "web"}, registry.ServiceKey{}},
		{"the import writer's", map[string]string{discoveryv1.LabelServiceName: "web", importwriter.ManagedByLabel: importwriter.ManagedByValue}, registry.ServiceKey{}},
	} {
		es := decodedSlice(3)
		es.Namespace, es.Name, es.Labels = "shop", "web-1", tc.labels
		out, err := strip(es)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := out.(*cachedSlice)
		if !ok {
			t.Fatalf("%s: cached as %T", tc.name, out)
		}
		if key, ok := c.belongs(); key != tc.want || ok != (tc.want != registry.ServiceKey{}) {
			t.Errorf("%s: belongs to %v (%v), want %v", tc.name, key, ok, tc.want)
		}
		if c.Labels != nil || c.Name != "web-1" || c.Namespace != "shop" || len(c.Endpoints) != 4 {
			t.Errorf("%s: cached %+v", tc.name, c.EndpointSlice)
		}
		if cp, ok := c.DeepCopyObject().(*cachedSlice); !ok || !reflect.DeepEqual(cp, c) || &cp.Endpoints[0] == &c.Endpoints[0] {
			t.Errorf("%s: a deep copy is %T %+v", tc.name, c.DeepCopyObject(), c.DeepCopyObject())
		}
	}
}

// Cached Services (and Nodes) with the same kept labels share one map;
// labels Nave does not read are not kept.
func TestCachedServicesShareTheirLabels(t *testing.T) {
	cached := func(labels map[string]string) map[string]string {
		out, err := strip(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Labels: labels}})
		if err != nil {
			t.Fatal(err)
		}
		return out.(*corev1.Service).Labels
	}
	same := func(a, b map[string]string) bool {
		return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
	}
	a := cached(map[string]string{ExportLabel: "true", "app": "a"})
	b := cached(map[string]string{ExportLabel: "true", "app": "b"})
	gw := cached(map[string]string{NetworkGatewayLabel: "net-1", "app": "a"})
	gw2 := cached(map[string]string{NetworkGatewayLabel: "net-2"})
	if !maps.Equal(a, map[string]string{ExportLabel: "true"}) || !maps.Equal(gw, map[string]string{NetworkGatewayLabel: "net-1"}) {
		t.Fatalf("kept labels %v and %v", a, gw)
	}
	if !same(a, b) {
		t.Error("two Services labelled for export hold a map each")
	}
	if !maps.Equal(gw2, map[string]string{NetworkGatewayLabel: "net-2"}) {
		t.Errorf("kept labels %v: another gateway's took a shared map", gw2)
	}
	if l := cached(map[string]string{"app": "a"}); l != nil {
		t.Errorf("a Service with no label Nave reads keeps %v", l)
	}
	node := func(name string) map[string]string {
		out, _ := strip(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelTopologyRegion: "r1", corev1.LabelTopologyZone: "z1", corev1.LabelHostname: name}}})
		return out.(*corev1.Node).Labels
	}
	if n1, n2 := node("n1"), node("n2"); !same(n1, n2) || len(n1) != 2 {
		t.Errorf("two Nodes of one zone keep %v and %v, not one map", n1, n2)
	}
	// Past maxLabelSets, sets are kept apart, still right.
	var s labelSets
	for i := range maxLabelSets + 2 {
		in := map[string]string{NetworkGatewayLabel: fmt.Sprint("net-", i)}
		if got := s.share(map[string]string{NetworkGatewayLabel: fmt.Sprint("net-", i)}); !maps.Equal(got, in) {
			t.Fatalf("share(%v) = %v", in, got)
		}
	}
	if len(s.sets) != maxLabelSets {
		t.Errorf("%d sets held, want at most %d", len(s.sets), maxLabelSets)
	}
}

func BenchmarkCompactEndpoints(b *testing.B) {
	src := decodedSlice(100)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		es := src.DeepCopy()
		b.StartTimer()
		compactEndpoints(es)
	}
}
