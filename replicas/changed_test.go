package replicas

import (
	"fmt"
	"slices"
	"testing"

	"github.com/navemesh/nave/registry"
)

func keyOf(name string) registry.ServiceKey {
	return registry.ServiceKey{Namespace: "default", Name: name}
}

func TestChangedChain(t *testing.T) {
	s := func(v uint64) Stamp { return Stamp{Epoch: 1, Version: v} }
	var c *Changed
	c = c.Then(s(0), s(1), []registry.ServiceKey{keyOf("a")}, 10)
	c = c.Then(s(1), s(2), []registry.ServiceKey{keyOf("b")}, 10)
	c = c.Then(s(2), s(2), []registry.ServiceKey{keyOf("c")}, 10) // at the same stamp: the export policy's enforcement
	c = c.Then(s(2), s(3), nil, 10)                               // a re-stamp: nothing changed
	for _, tt := range []struct {
		since Stamp
		want  []string
		ok    bool
	}{
		{s(1), []string{"b", "c"}, true},
		{s(2), []string{"c"}, true}, // whichever content at 2 the subscriber holds
		{s(3), nil, true},
		{s(0), nil, false}, // the change that made it is not in the chain
		{s(7), nil, false},
	} {
		keys, ok := c.Since(tt.since)
		var got []string
		for _, k := range keys {
			got = append(got, k.Name)
		}
		slices.Sort(got)
		if ok != tt.ok || !slices.Equal(got, tt.want) {
			t.Errorf("Since(%s) = %v, %v; want %v, %v", tt.since, got, ok, tt.want, tt.ok)
		}
	}

	// A change that does not follow the last (the cluster was held anew) starts a new chain.
	if _, ok := c.Then(s(5), s(6), nil, 10).Since(s(3)); ok {
		t.Error("a chain reaches across a gap")
	}
	// The chain is cut after maxChangedLinks links (the next starts anew)...
	long := (*Changed)(nil)
	for v := range uint64(maxChangedLinks + 1) {
		long = long.Then(s(v), s(v+1), []registry.ServiceKey{keyOf("a")}, 10)
	}
	if _, ok := long.Since(s(1)); ok {
		t.Errorf("a chain of %d links is kept", maxChangedLinks+1)
	}
	if _, ok := long.Since(s(maxChangedLinks + 1)); !ok {
		t.Error("the link after the cut is not")
	}
	// ... and once it names more services than comparing would look at.
	many := make([]registry.ServiceKey, 100)
	for i := range many {
		many[i] = keyOf(fmt.Sprint(i))
	}
	wide := (*Changed)(nil).Then(s(0), s(1), many, 10).Then(s(1), s(2), many, 10).Then(s(2), s(3), many, 10)
	if _, ok := wide.Since(s(1)); ok {
		t.Error("a chain naming 300 services of a cluster of 10 is kept")
	}
}

// A delta from the Changed chain is what comparing every shard finds, but
// for services that changed and changed back (sent again, equal).
func TestChangesSince(t *testing.T) {
	s := func(v uint64) Stamp { return Stamp{Epoch: 1, Version: v} }
	a1, a2 := testShard("east", "a", "10.0.0.1"), testShard("east", "a", "10.0.0.2")
	b1, c1, d1 := testShard("east", "b", "10.0.0.3"), testShard("east", "c", "10.0.0.4"), testShard("east", "d", "10.0.0.5")
	prev := sentCluster{stamp: s(1), shards: ShardMap{a1.Service: a1, b1.Service: b1, d1.Service: d1}}
	cur := ShardMap{a2.Service: a2, c1.Service: c1, d1.Service: d1}
	chain := (*Changed)(nil).Then(s(0), s(1), []registry.ServiceKey{a1.Service, b1.Service, d1.Service}, 3).
		Then(s(1), s(2), []registry.ServiceKey{a1.Service, d1.Service}, 3). // d changed and changed back
		Then(s(2), s(3), []registry.ServiceKey{b1.Service, c1.Service, keyOf("never")}, 3)
	names := func(up []*registry.Shard, rm []registry.ServiceKey) string {
		var u, r []string
		for _, sh := range up {
			u = append(u, sh.Service.Name)
		}
		for _, k := range rm {
			r = append(r, k.Name)
		}
		slices.Sort(u)
		slices.Sort(r)
		return fmt.Sprintf("upserts %v removes %v", u, r)
	}
	if got, want := names(changesSince(prev, Cluster{Stamp: s(3), Shards: cur, Changed: chain})), "upserts [a c d] removes [b]"; got != want {
		t.Errorf("from the chain: %s, want %s", got, want)
	}
	if got, want := names(changesSince(prev, Cluster{Stamp: s(3), Shards: cur})), "upserts [a c] removes [b]"; got != want {
		t.Errorf("by comparing: %s, want %s", got, want)
	}
}

// A change at the same stamp (the export policy's enforcement) is in the
// delta to a subscriber that holds the content from before it.
func TestChangesSinceASameStampChange(t *testing.T) {
	s := func(v uint64) Stamp { return Stamp{Epoch: 1, Version: v} }
	a1, a2, b1 := testShard("east", "a", "10.0.0.1"), testShard("east", "a", "10.0.0.2"), testShard("east", "b", "10.0.0.3")
	prev := sentCluster{stamp: s(1), shards: ShardMap{a1.Service: a1, b1.Service: b1}}
	chain := (*Changed)(nil).Then(s(0), s(1), []registry.ServiceKey{a1.Service, b1.Service}, 2).
		Then(s(1), s(1), []registry.ServiceKey{b1.Service}, 1).
		Then(s(1), s(2), []registry.ServiceKey{a1.Service}, 1)
	cur := Cluster{Stamp: s(2), Shards: ShardMap{a2.Service: a2}, Changed: chain}
	up, rm := changesSince(prev, cur)
	if len(up) != 1 || up[0] != a2 || len(rm) != 1 || rm[0] != b1.Service {
		t.Errorf("delta from the chain: upserts %v, removes %v; want a2, and b removed", up, rm)
	}
}
