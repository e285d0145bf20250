package federation

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
)

// changedSince is set.ChangedSince(older), its keys sorted.
func changedSince(set, older *ImportSet) ([]registry.ServiceKey, bool) {
	keys, ok := set.ChangedSince(older)
	keys = slices.Clone(keys)
	slices.SortFunc(keys, registry.ServiceKey.Compare)
	return keys, ok
}

// key is the key of default/name.
func key(name string) registry.ServiceKey {
	return registry.ServiceKey{Namespace: "default", Name: name}
}

// A set reaches back through the chain to the sets it follows, naming each
// service that changed once; not to a set it does not follow.
func TestImportSetChangedSince(t *testing.T) {
	a, b, c := testImport("default", "a", "10.0.0.1"), testImport("default", "b", "10.0.0.2"), testImport("default", "c", "10.0.0.3")
	s0 := NewImportSet(importMap(a), true, []string{"243.0.0.0/16"})
	s1 := s0.Then(s0.Imports.Set(b.Service, b), []registry.ServiceKey{b.Service}, true)
	s2 := s1.Then(s1.Imports.Set(c.Service, c).Delete(a.Service), []registry.ServiceKey{c.Service, a.Service}, true)
	s3 := s2.Then(s2.Imports, nil, false) // the authority alone
	if s3.Authoritative || !slices.Equal(s3.CIDRs, s0.CIDRs) || s3.Imports.Len() != 2 {
		t.Fatalf("the set after an authority change: authoritative=%v cidrs=%v %d imports", s3.Authoritative, s3.CIDRs, s3.Imports.Len())
	}
	for _, tc := range []struct {
		set, older *ImportSet
		want       []registry.ServiceKey
	}{
		{s3, s3, nil},
		{s3, s2, nil},
		{s2, s1, []registry.ServiceKey{a.Service, c.Service}},
		{s1, s0, []registry.ServiceKey{b.Service}},
		{s3, s0, []registry.ServiceKey{a.Service, b.Service, c.Service}},
	} {
		if got, ok := changedSince(tc.set, tc.older); !ok || !slices.Equal(got, tc.want) {
			t.Errorf("changed since: %v, %v; want %v", got, ok, tc.want)
		}
	}
	// Sets it does not follow: a newer one, one of another source, a literal, none.
	other := NewImportSet(s0.Imports, true, nil)
	literal := &ImportSet{Imports: s0.Imports}
	for name, older := range map[string]*ImportSet{"newer": s3, "another source's": other, "a literal": literal, "none": nil} {
		if name == "newer" {
			if _, ok := s1.ChangedSince(older); ok {
				t.Errorf("an older set reaches a newer one")
			}
			continue
		}
		if keys, ok := s3.ChangedSince(older); ok {
			t.Errorf("reaches %s set: %v", name, keys)
		}
	}
	// Changes named out of order, or more than once, are taken sorted and once.
	named := []registry.ServiceKey{c.Service, a.Service, c.Service}
	s4 := s3.Then(s3.Imports, named, false)
	if got, ok := s4.ChangedSince(s3); !ok || !slices.Equal(got, []registry.ServiceKey{a.Service, c.Service}) ||
		!slices.Equal(named, []registry.ServiceKey{c.Service, a.Service, c.Service}) {
		t.Errorf("named out of order: %v, %v (the caller's list is now %v)", got, ok, named)
	}

	// A literal's successors reach back to each other, never to it.
	l1 := literal.Then(literal.Imports.Set(c.Service, c), []registry.ServiceKey{c.Service}, false)
	l2 := l1.Then(l1.Imports.Delete(c.Service), []registry.ServiceKey{c.Service}, false)
	if got, ok := changedSince(l2, l1); !ok || !slices.Equal(got, []registry.ServiceKey{c.Service}) {
		t.Errorf("after a literal: %v, %v", got, ok)
	}
	if _, ok := l2.ChangedSince(literal); ok {
		t.Error("reaches the literal")
	}
}

// A set's chain names about twice as many keys as the set holds imports
// (internal/changelog: 2*1+64 for one), so that a session far behind
// compares whole when that costs no more.
func TestImportSetChainIsCut(t *testing.T) {
	many := func(prefix string, n int) []registry.ServiceKey {
		var out []registry.ServiceKey
		for i := range n {
			out = append(out, key(fmt.Sprint(prefix, i)))
		}
		return out
	}
	first := NewImportSet(importMap(testImport("default", "a", "10.0.0.1")), false, nil)
	second := first.Then(first.Imports, many("x", 40), false)
	if keys, ok := second.ChangedSince(first); !ok || len(keys) != 40 {
		t.Fatalf("one link of 40 keys: %d keys, %v", len(keys), ok)
	}
	third := second.Then(second.Imports, many("y", 40), false)
	if _, ok := third.ChangedSince(first); ok {
		t.Error("reaches back through 80 keys in a set of one import")
	}
	if keys, ok := third.ChangedSince(second); !ok || len(keys) != 40 {
		t.Errorf("the link after the cut: %d keys, %v", len(keys), ok)
	}
}

// The chain holds keys, not sets: an older set's imports go once no one
// holds the set, while later sets still reach back past it.
func TestImportSetChainKeepsNoOlderImports(t *testing.T) {
	gone := make(chan struct{})
	mid := func() *ImportSet { // the first set and its import are held in here only
		old := testImport("default", "old", "10.0.0.1")
		runtime.AddCleanup(old, func(ch chan struct{}) { close(ch) }, gone)
		first := NewImportSet(importMap(old), false, nil)
		return first.Then(ImportMap{}, []registry.ServiceKey{old.Service}, false) // nothing of first's map
	}()
	set := mid
	for i := range 10 {
		imp := testImport("default", fmt.Sprint("s", i), "10.0.0.2")
		set = set.Then(set.Imports.Set(imp.Service, imp), []registry.ServiceKey{imp.Service}, false)
	}
	deadline := time.Now().Add(10 * time.Second)
	for done := false; !done; {
		runtime.GC()
		select {
		case <-gone:
			done = true
		case <-time.After(10 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("a later set keeps an older set's import alive")
			}
		}
	}
	if keys, ok := set.ChangedSince(mid); !ok || len(keys) != 10 {
		t.Errorf("after the first set went: %d keys, %v", len(keys), ok)
	}
	runtime.KeepAlive(set)
}
