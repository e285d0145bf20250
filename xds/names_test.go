package xds

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/navemesh/nave/internal/xdstype"
)

// Streams asking for the same resources, state-of-the-world or delta, hold
// one copy of each name: what each keeps of its request points at the
// same bytes.
func TestStreamsShareTheNamesTheyAskFor(t *testing.T) {
	s, _, addr := startXDS(t)
	r, d := twoServices(t, ready)
	s.Update(r, d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := []string{ClusterName(echo, 8080), ClusterName(otherKey, 8080)}
	for _, node := range []string{"a", "b"} {
		stream, err := dialADS(ctx, t, addr).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: resource.EndpointType, ResourceNames: names}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	delta, err := dialADS(ctx, t, addr).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := delta.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "c"}, TypeUrl: resource.EndpointType, ResourceNamesSubscribe: names}); err != nil {
		t.Fatal(err)
	}
	if _, err := delta.Recv(); err != nil {
		t.Fatal(err)
	}
	held := func(node string) []string {
		for _, c := range s.Clients(node) {
			return c.Types[xdstype.EDS].Names
		}
		t.Fatalf("no stream of node %s", node)
		return nil
	}
	a := slices.Sorted(slices.Values(held("a"))) // a delta stream's come sorted
	for _, node := range []string{"b", "c"} {
		b := slices.Sorted(slices.Values(held(node)))
		if len(a) != len(names) || len(b) != len(names) {
			t.Fatalf("streams of a and %s hold %q and %q, want %q each", node, a, b, names)
		}
		for i := range a {
			if a[i] != b[i] || unsafe.StringData(a[i]) != unsafe.StringData(b[i]) {
				t.Errorf("name %d: streams of a and %s hold %q and %q in two copies", i, node, a[i], b[i])
			}
		}
	}
}

// A full table starts again: it never holds more than its bound, names
// keep their values, and it shares again what it is asked for after. A
// name longer than any Nave serves is not held.
func TestNameTableIsBounded(t *testing.T) {
	table := newNameTable(2)
	intern := func(name string) string {
		names := []string{strings.Clone(name)} // as a request decodes it: a copy of its own
		table.intern(names)
		return names[0]
	}
	shared := func(a, b string) bool { return a == b && unsafe.StringData(a) == unsafe.StringData(b) }
	x, _ := intern("x"), intern("y")
	if !shared(intern("x"), x) {
		t.Error("x asked for twice is held twice")
	}
	held := func() (n int) {
		table.names.Range(func(_, _ any) bool { n++; return true })
		return n
	}
	if z := intern("z"); z != "z" || held() > 2 {
		t.Errorf("a third name reads %q and the table holds %d names, at most 2", z, held())
	}
	if x2 := intern("x"); !shared(intern("x"), x2) {
		t.Error("x is not shared after the table started again")
	}
	long, before := strings.Repeat("n", maxInternedName+1), held()
	if got := intern(long); got != long || held() != before {
		t.Errorf("a name of %d bytes reads %d bytes and the table holds %d names; want it left alone", len(long), len(got), held())
	}
}

// Streams intern at once: the table stays within its bound, and every name
// keeps its value.
func TestNameTableUnderConcurrentStreams(t *testing.T) {
	table := newNameTable(8)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				want := fmt.Sprintf("svc-%d", (g+i)%20)
				names := []string{strings.Clone(want)}
				table.intern(names)
				if names[0] != want {
					t.Errorf("%s interned as %s", want, names[0])
					return
				}
			}
		})
	}
	wg.Wait()
	n := 0
	table.names.Range(func(_, _ any) bool { n++; return true })
	if n > 8 || table.n != n {
		t.Errorf("the table holds %d names and counts %d, at most 8", n, table.n)
	}
}
