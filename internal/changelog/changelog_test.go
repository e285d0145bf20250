package changelog

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
)

// since is l.Since(p), its keys sorted.
func since(l *Log[string], p Position) ([]string, bool) {
	keys, ok := l.Since(p)
	keys = slices.Clone(keys)
	slices.Sort(keys)
	return keys, ok
}

// A log reaches back through its chain to the positions before it, naming
// each key once, also through changes that named nothing; not to a position
// of another lineage or a later one.
func TestLogReachesBack(t *testing.T) {
	l0 := New[string]()
	l1 := l0.Then([]string{"a"}, 10)
	l2 := l1.Then([]string{"b", "c"}, 10)
	l3 := l2.Then([]string{"c"}, 10) // c again
	l4 := l3.Then(nil, 10)           // a change that named nothing (replication: a re-stamp)
	for _, tc := range []struct {
		name string
		log  *Log[string]
		at   Position
		want []string
	}{
		{"itself", l4, l4.Position(), nil},
		{"a change that named nothing", l4, l3.Position(), nil},
		{"one change", l2, l1.Position(), []string{"b", "c"}},
		{"a key named twice", l4, l1.Position(), []string{"b", "c"}},
		{"the first", l4, l0.Position(), []string{"a", "b", "c"}},
	} {
		if got, ok := since(tc.log, tc.at); !ok || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, ok, tc.want)
		}
	}
	// Newest first; one change's keys as they were given.
	if got, _ := l4.Since(l0.Position()); !slices.Equal(got, []string{"c", "b", "a"}) {
		t.Errorf("since the first, in order: %v, want newest first", got)
	}
	if got, _ := l2.Since(l1.Position()); len(got) != 2 || &got[0] != &l2.keys[0] {
		t.Errorf("one change: %v is not the keys given", got)
	}

	// The value held anew (a log after nil) starts a lineage of its own:
	// its logs reach back to each other, never to another's.
	n1 := (*Log[string])(nil).Then([]string{"a"}, 1)
	n2 := n1.Then([]string{"b"}, 1)
	if got, ok := since(n2, n1.Position()); !ok || !slices.Equal(got, []string{"b"}) {
		t.Errorf("after nil: %v, %v", got, ok)
	}
	for name, tc := range map[string]struct {
		log *Log[string]
		at  Position
	}{
		"a later position":     {l1, l3.Position()},
		"another lineage's":    {n2, l1.Position()},
		"across the gap":       {n2, l4.Position()},
		"the zero position":    {l4, Position{}},
		"nil's position":       {n2, (*Log[string])(nil).Position()},
		"from nil":             {nil, Position{}},
		"another New's":        {l4, New[string]().Position()},
		"after another New's":  {New[string]().Then(nil, 1), l0.Position()},
		"a later one of nil's": {n1, n2.Position()},
	} {
		if keys, ok := tc.log.Since(tc.at); ok {
			t.Errorf("reaches %s: %v", name, keys)
		}
	}
}

// A chain holds at most maxLinks links: when full, it keeps its newer half,
// so older positions are out of reach and the recent ones are not.
func TestLogIsCut(t *testing.T) {
	first := New[string]()
	l := first
	var logs []*Log[string] // logs[i] follows first by i+1
	for i := range maxLinks {
		l = l.Then([]string{fmt.Sprint("s", i)}, 1000)
		logs = append(logs, l)
	}
	if keys, ok := l.Since(first.Position()); !ok || len(keys) != maxLinks {
		t.Fatalf("%d links: %d keys, %v", maxLinks, len(keys), ok)
	}
	l = l.Then([]string{"last"}, 1000)
	if _, ok := l.Since(first.Position()); ok {
		t.Errorf("reaches back %d links", maxLinks+1)
	}
	if _, ok := l.Since(logs[0].Position()); ok {
		t.Errorf("reaches back %d links", maxLinks)
	}
	if keys, ok := l.Since(logs[len(logs)-1].Position()); !ok || !slices.Equal(keys, []string{"last"}) {
		t.Errorf("the last link: %v, %v", keys, ok)
	}
	half := len(logs) - maxLinks/2 - 1 // the oldest log still reached
	if keys, ok := l.Since(logs[half].Position()); !ok || len(keys) != maxLinks/2+1 || keys[len(keys)-1] != fmt.Sprint("s", half+1) {
		t.Errorf("back to the oldest log kept: %v, %v", keys, ok)
	}
	if _, ok := l.Since(logs[half-1].Position()); ok {
		t.Errorf("reaches back past the half kept")
	}
	// The chain goes on from the half kept, until it is full again.
	for range maxLinks/2 - 1 {
		l = l.Then(nil, 1000)
	}
	if keys, ok := l.Since(logs[half].Position()); !ok || len(keys) != maxLinks/2+1 {
		t.Errorf("later, back to the oldest log kept: %d keys, %v", len(keys), ok)
	}
	if l = l.Then(nil, 1000); !l.reaches(logs[len(logs)-1]) || l.reaches(logs[half]) {
		t.Error("full again: not cut to its newer half")
	}
}

// reaches says whether l reaches back to older's position.
func (l *Log[K]) reaches(older *Log[K]) bool {
	_, ok := l.Since(older.Position())
	return ok
}

// A chain names at most 2*held+64 keys: when full, it keeps the newer links
// that fit.
func TestLogKeyBound(t *testing.T) {
	many := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprint(prefix, i))
		}
		return out
	}
	// Of one key held: 66 keys at most.
	first := New[string]()
	second := first.Then(many("x", 40), 1)
	if keys, ok := second.Since(first.Position()); !ok || len(keys) != 40 {
		t.Fatalf("one link of 40 keys: %d keys, %v", len(keys), ok)
	}
	third := second.Then(many("y", 40), 1)
	if third.reaches(first) {
		t.Error("reaches back through 80 keys of one held")
	}
	if keys, ok := third.Since(second.Position()); !ok || len(keys) != 40 {
		t.Errorf("the link after the cut: %d keys, %v", len(keys), ok)
	}
	// Of 10 held: 84 keys at most, more than any link of 100 alone.
	wide := New[string]().Then(many("a", 100), 10)
	wider := wide.Then(many("b", 100), 10).Then(many("c", 100), 10)
	if wider.reaches(wide) {
		t.Error("a chain naming 200 keys of 10 held reaches back")
	}
	// Of none held (64 keys), links of 10 keys: 6 fit; when a 7th comes, the
	// newer links that fit in half the bound with it are kept (2: 30 keys),
	// so that the next cut is 3 changes away, not the next change.
	logs := []*Log[string]{New[string]()}
	for i := range 11 {
		logs = append(logs, logs[len(logs)-1].Then(many(fmt.Sprint(i, "-"), 10), 0))
	}
	if !logs[6].reaches(logs[0]) {
		t.Error("6 links of 10 keys do not reach back, within 64")
	}
	if l := logs[7]; !l.reaches(logs[4]) || l.reaches(logs[3]) {
		t.Error("the 7th link is not cut to the two newer links that fit in half the bound")
	}
	if l := logs[10]; !l.reaches(logs[4]) || l.reaches(logs[3]) {
		t.Error("the links after a cut cut again before the bound")
	}
	if l := logs[11]; !l.reaches(logs[8]) || l.reaches(logs[7]) {
		t.Error("the cut after the bound is reached again does not keep half")
	}
}

// bigKey is a key that is not a tiny allocation, so that its cleanup runs.
type bigKey struct {
	name string
	_    [64]byte
}

// A log holds the keys of its chain only: those of links cut from it go once
// no one holds the logs before the cut.
func TestLogKeepsNoCutLinks(t *testing.T) {
	gone := make(chan struct{})
	l := func() *Log[*bigKey] { // the first key is held in here only
		k := &bigKey{name: "first"}
		runtime.AddCleanup(k, func(ch chan struct{}) { close(ch) }, gone)
		return New[*bigKey]().Then([]*bigKey{k}, 1000)
	}()
	mid := l.Position()
	for range maxLinks {
		l = l.Then([]*bigKey{{name: "later"}}, 1000)
	}
	deadline := time.Now().Add(10 * time.Second)
	for done := false; !done; {
		runtime.GC()
		select {
		case <-gone:
			done = true
		case <-time.After(10 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("a log keeps the keys of a link cut from it")
			}
		}
	}
	if keys, ok := l.Since(mid); ok {
		t.Errorf("reaches back past the cut: %d keys", len(keys))
	}
	if keys, ok := l.Since(Position{l.lineage, l.seq - maxLinks/2}); !ok || len(keys) != maxLinks/2 {
		t.Errorf("after the cut links went: %d keys, %v", len(keys), ok)
	}
}
