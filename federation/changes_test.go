package federation

import (
	"slices"
	"testing"

	"github.com/navemesh/nave/registry"
)

func TestChangesTakesWhatChanged(t *testing.T) {
	a, b, c := testShard("east", "a", "10.0.0.1"), testShard("east", "b", "10.0.0.2"), testShard("east", "c", "10.0.0.3")
	b2 := testShard("east", "b", "10.0.0.9")
	src := NewChanges()
	if _, ok := src.Take(); ok {
		t.Fatal("took something before the source handed anything over")
	}
	src.Set(stateOf(a, b))
	ready := func() bool {
		select {
		case <-src.Ready():
			return true
		default:
			return false
		}
	}
	if !ready() {
		t.Fatal("not ready after Set")
	}
	ch, ok := src.Take()
	if !ok || !ch.Full || len(ch.Set) != 2 {
		t.Fatalf("first take = %+v, %v; want the whole state", ch, ok)
	}
	if _, ok := src.Take(); ok {
		t.Fatal("took something twice")
	}

	// A whole state again: only what differs is taken (an equal copy of a is not).
	src.Set(stateOf(testShard("east", "a", "10.0.0.1"), b2, c))
	ch, ok = src.Take()
	if !ok || ch.Full || len(ch.Removed) != 0 || !slices.Equal(names(ch.Set), []string{"b", "c"}) || ch.Set[b.Service] != b2 {
		t.Fatalf("take after Set = %+v", ch)
	}

	// Changes in a burst are taken together; the last form of each counts.
	src.Apply(State{a.Service: nil}, nil) // withheld
	src.Apply(nil, []registry.ServiceKey{c.Service})
	src.Apply(State{b.Service: b}, nil)
	ch, ok = src.Take()
	if !ok || !slices.Equal(names(ch.Set), []string{"a", "b"}) || ch.Set[a.Service] != nil || ch.Set[b.Service] != b ||
		len(ch.Removed) != 1 || ch.Removed[0] != c.Service {
		t.Fatalf("take after a burst = %+v", ch)
	}

	// A new publisher starts from the whole state, as it now is.
	src.Restart()
	ch, ok = src.Take()
	if !ok || !ch.Full || !slices.Equal(names(ch.Set), []string{"a", "b"}) {
		t.Fatalf("take after Restart = %+v", ch)
	}
}

func names(st State) []string {
	var out []string
	for k := range st {
		out = append(out, k.Name)
	}
	slices.Sort(out)
	return out
}
