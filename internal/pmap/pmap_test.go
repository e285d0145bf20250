package pmap

import (
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkMap fails unless m holds exactly want, and its trie is well formed.
func checkMap[K comparable, V comparable](t *testing.T, m Map[K, V], want map[K]V) {
	t.Helper()
	if m.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", m.Len(), len(want))
	}
	got := maps.Collect(m.All())
	if !maps.Equal(got, want) {
		t.Fatalf("All = %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := m.Get(k); !ok || g != v {
			t.Fatalf("Get(%v) = %v, %t; want %v", k, g, ok, v)
		}
	}
	// Keys and Values walk the trie as All does, in the same order.
	ks, vs := slices.Collect(m.Keys()), slices.Collect(m.Values())
	if len(ks) != len(want) || len(vs) != len(want) {
		t.Fatalf("%d keys and %d values, want %d", len(ks), len(vs), len(want))
	}
	for i, k := range ks {
		if want[k] != vs[i] {
			t.Fatalf("Keys and Values pair %v with %v, want %v", k, vs[i], want[k])
		}
	}
	for stop := range min(len(want), 40) { // a loop that breaks must stop the walk
		n := 0
		for range m.Keys() {
			if n++; n > stop {
				break
			}
		}
		for range m.Values() {
			if n--; n == 0 {
				break
			}
		}
	}
	if m.root != nil {
		if n := checkNode(t, m.root, 0, 0, 0); n != len(want) {
			t.Fatalf("trie holds %d entries, Len %d", n, len(want))
		}
	}
}

// checkNode checks that n's bitmaps match its slices, that every entry sits
// in the slot its hash names, and that a node below the root holds at least
// two entries; it returns how many n holds.
func checkNode[K comparable, V any](t *testing.T, n *node[K, V], shift uint, prefix uint64, depth int) int {
	t.Helper()
	if shift >= 64 {
		for _, e := range n.entries {
			if e.hash != prefix {
				t.Fatalf("collision node holds hash %x under %x", e.hash, prefix)
			}
		}
		if n.entryMap != 0 || n.childMap != 0 || len(n.children) != 0 || len(n.entries) < 2 {
			t.Fatalf("malformed collision node %+v", n)
		}
		return len(n.entries)
	}
	if bits.OnesCount32(n.entryMap) != len(n.entries) || bits.OnesCount32(n.childMap) != len(n.children) || n.entryMap&n.childMap != 0 {
		t.Fatalf("node at shift %d: bitmaps %b/%b for %d entries and %d children", shift, n.entryMap, n.childMap, len(n.entries), len(n.children))
	}
	low := uint64(1)<<shift - 1
	for i, e := range n.entries {
		if e.hash&low != prefix || slot(e.hash, shift) != nth(n.entryMap, i) {
			t.Fatalf("entry %v (hash %x) in the wrong slot at shift %d", e.key, e.hash, shift)
		}
	}
	count := len(n.entries)
	for i, c := range n.children {
		chunk := uint64(bits.TrailingZeros32(nth(n.childMap, i)))
		count += checkNode(t, c, shift+levelBits, prefix|chunk<<shift, depth+1)
	}
	if depth > 0 && count < 2 {
		t.Fatalf("node at shift %d holds %d entries", shift, count)
	}
	return count
}

// nth is the i-th set bit of bitmap.
func nth(bitmap uint32, i int) uint32 {
	for range i {
		bitmap &= bitmap - 1
	}
	return bitmap & -bitmap
}

// TestMapAgainstGoMap changes a Map and a Go map alike, and checks that
// every version of the Map still holds what it held when made.
func TestMapAgainstGoMap(t *testing.T) {
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 7))
		m := Map[string, int]{}
		model := map[string]int{}
		type version struct {
			m    Map[string, int]
			want map[string]int
		}
		var history []version
		for step := range 3000 {
			k := fmt.Sprint("k", rng.IntN(500))
			switch op := rng.IntN(10); {
			case op < 5:
				m = m.Set(k, step)
				model[k] = step
			case op < 8:
				m = m.Delete(k)
				delete(model, k)
			default: // a batch through a builder
				b := m.Builder()
				for range rng.IntN(50) {
					k := fmt.Sprint("k", rng.IntN(500))
					want, held := model[k]
					var prev int
					var had bool
					if rng.IntN(3) == 0 {
						prev, had = b.Delete(k)
						delete(model, k)
					} else {
						prev, had = b.Set(k, step)
						model[k] = step
					}
					if prev != want || had != held {
						t.Fatalf("step %d: %s held %d, %t; the builder says %d, %t", step, k, want, held, prev, had)
					}
					if v, ok := b.Get(k); ok != (model[k] == step) || ok && v != step {
						t.Fatalf("step %d: builder Get(%s) = %d, %t", step, k, v, ok)
					}
				}
				m = b.Map()
				b.Set("after", 1) // must not show in the map already made
			}
			if step%100 == 0 {
				checkMap(t, m, model)
				history = append(history, version{m, maps.Clone(model)})
			}
		}
		for _, v := range history {
			checkMap(t, v.m, v.want)
		}
	}
}

// TestMapCollisions gives keys chosen hashes: equal in all 64 bits
// (collision nodes) or in a long prefix (deep paths), then removes them.
func TestMapCollisions(t *testing.T) {
	hashes := map[string]uint64{
		"a": 0x1234, "b": 0x1234, "c": 0x1234, // collide fully
		"d": 0x1234 | 1<<63, // agrees with a, b, c up to the last level
		"e": 0x34, "f": 0x0,
	}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 3))
		keys := []string{"a", "b", "c", "d", "e", "f"}
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		b := Map[string, int]{}.Builder()
		want := map[string]int{}
		for _, k := range keys {
			v := int(k[0] - 'a')
			if _, had := b.set(&entry[string, int]{hashes[k], k, v + 10}); had {
				t.Fatalf("%s held something before it was set", k)
			}
			if prev, had := b.set(&entry[string, int]{hashes[k], k, v}); prev != v+10 || !had {
				t.Fatalf("%s held %d, %t; want %d", k, prev, had, v+10)
			}
			want[k] = v
		}
		check := func(m Map[string, int], want map[string]int) {
			t.Helper()
			if m.Len() != len(want) || !maps.Equal(maps.Collect(m.All()), want) {
				t.Fatalf("holds %v, want %v", maps.Collect(m.All()), want)
			}
			for k, h := range hashes {
				v, ok := m.root.get(k, h)
				if w, held := want[k]; ok != held || v != w {
					t.Fatalf("get(%s) = %d, %t; want %d, %t", k, v, ok, w, held)
				}
			}
			if m.root != nil {
				checkNode(t, m.root, 0, 0, 0)
			}
		}
		full, fullWant := b.Map(), maps.Clone(want)
		check(full, want)
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for _, k := range keys {
			if prev, had := b.delete(k, hashes[k]); prev != want[k] || !had {
				t.Fatalf("delete(%s) = %d, %t; want %d", k, prev, had, want[k])
			}
			if _, had := b.delete(k, hashes[k]); had { // gone already: changes nothing
				t.Fatalf("%s deleted twice", k)
			}
			delete(want, k)
			check(b.Map(), want)
		}
		if b.Map().root != nil {
			t.Fatal("an empty map keeps a root")
		}
		check(full, fullWant) // the map made before the deletes is as it was
	}
}

// TestMapCopiesOnlyThePath checks that a change copies only the nodes on
// the changed key's path and shares every other node.
func TestMapCopiesOnlyThePath(t *testing.T) {
	m := Map[int, int]{}.Builder()
	for i := range 10_000 {
		m.Set(i, i)
	}
	before := m.Map()
	after := before.Set(42, -1)
	path := 0 // nodes from the root to 42's entry
	for n, shift := before.root, uint(0); n != nil; shift += levelBits {
		path++
		bit := slot(hashOf(42), shift)
		if n.childMap&bit == 0 {
			break
		}
		n = n.children[index(n.childMap, bit)]
	}
	if shared, total := sharedNodes(before.root, after.root); total-shared != path {
		t.Errorf("one change copied %d of %d nodes, want the %d on its path", total-shared, total, path)
	}
	if v, _ := before.Get(42); v != 42 {
		t.Errorf("the old map holds %d for 42", v)
	}
}

// sharedNodes counts the nodes of b that a holds too, at the same place, and all of b's nodes.
func sharedNodes[K comparable, V any](a, b *node[K, V]) (shared, total int) {
	if a == b {
		return countNodes(b), countNodes(b)
	}
	total = 1
	for i, c := range b.children {
		var s, n int
		if a != nil && i < len(a.children) {
			s, n = sharedNodes(a.children[i], c)
		} else {
			s, n = sharedNodes(nil, c)
		}
		shared, total = shared+s, total+n
	}
	return shared, total
}

func countNodes[K comparable, V any](n *node[K, V]) int {
	total := 1
	for _, c := range n.children {
		total += countNodes(c)
	}
	return total
}
