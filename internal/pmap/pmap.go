// Package pmap is a persistent hash map, for values that are replaced
// rather than changed and that readers keep without locks for as long as
// they like: the registry's maps, the hub's MCS import set.
package pmap

import (
	"hash/maphash"
	"iter"
	"math/bits"
	"slices"
)

// Map is a persistent hash map: a change returns a new map that shares all
// but the changed path with the old one, which stays valid. It is what lets
// the registry's Apply and the hub's import rounds cost O(what changed)
// rather than O(what they hold): a hash array
// mapped trie of 32-way nodes, so a change copies about log32(n) nodes of
// at most 32 slots each. The zero value is an empty map.
type Map[K comparable, V any] struct {
	root *node[K, V]
	len  int
}

// Each level of the trie consumes levelBits bits of a key's 64-bit hash; keys
// whose hashes agree in all 64 share a collision node below the last level.
const (
	levelBits = 5
	levelMask = 1<<levelBits - 1
)

// hashSeed seeds the hashes: random per process, so that no peer can craft
// service names that pile up in one collision node.
var hashSeed = maphash.MakeSeed()

func hashOf[K comparable](k K) uint64 { return maphash.Comparable(hashSeed, k) }

// node holds, for each levelBits-bit chunk of the hash at its level, nothing,
// an entry or a child node: the bitmaps say which, and the slices hold only
// what is there, in chunk order. A collision node (below the last level)
// has no bitmaps, only entries. A node other than the root always holds at
// least two entries below it, so a map's shape depends only on its keys.
type node[K comparable, V any] struct {
	entryMap, childMap uint32
	entries            []*entry[K, V]
	children           []*node[K, V]
	// owner is the builder that made the node and may still change it in
	// place; nil for nodes that no one may change.
	owner *token
}

// entry is a key, its hash (so that moving it down a level or comparing
// it needs no hashing) and its value. Nodes hold entries by pointer, so
// that copying a node copies a pointer per entry, not the key and value.
type entry[K comparable, V any] struct {
	hash uint64
	key  K
	val  V
}

func (e *entry[K, V]) is(k K, h uint64) bool { return e.hash == h && e.key == k }

// token identifies a builder. It has a size so that every token is a distinct address.
type token struct{ _ byte }

func slot(h uint64, shift uint) uint32 { return 1 << (h >> shift & levelMask) }

// index is the position in a node's slice of the slot bit, given the slice's bitmap.
func index(bitmap, bit uint32) int { return bits.OnesCount32(bitmap & (bit - 1)) }

// Len is the number of entries.
func (m Map[K, V]) Len() int { return m.len }

// Get returns the value held for k.
func (m Map[K, V]) Get(k K) (V, bool) { return m.root.get(k, hashOf(k)) }

// All yields every entry, in no order.
func (m Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		if m.root != nil {
			m.root.all(yield)
		}
	}
}

// Keys yields every key, in no order.
func (m Map[K, V]) Keys() iter.Seq[K] {
	return func(yield func(K) bool) {
		for k := range m.All() {
			if !yield(k) {
				return
			}
		}
	}
}

// Values yields every value, in no order.
func (m Map[K, V]) Values() iter.Seq[V] {
	return func(yield func(V) bool) {
		for _, v := range m.All() {
			if !yield(v) {
				return
			}
		}
	}
}

// Set returns the map with k holding v.
func (m Map[K, V]) Set(k K, v V) Map[K, V] {
	b := Builder[K, V]{m: m}
	b.Set(k, v)
	return b.m
}

// Delete returns the map without k.
func (m Map[K, V]) Delete(k K) Map[K, V] {
	b := Builder[K, V]{m: m}
	b.Delete(k)
	return b.m
}

// Builder makes a batch of changes to a map, copying each node at most
// once: the nodes it copies or makes are its own, and later changes in the
// batch write them in place. The map it started from is left as it was. A
// nil owner (as Set and Delete use) copies every node it changes.
type Builder[K comparable, V any] struct {
	m     Map[K, V]
	owner *token
}

// Builder starts a batch of changes to m.
func (m Map[K, V]) Builder() *Builder[K, V] {
	return &Builder[K, V]{m: m, owner: new(token)}
}

// Get returns the value held for k.
func (b *Builder[K, V]) Get(k K) (V, bool) { return b.m.Get(k) }

// Set makes k hold v, and returns what k held before.
func (b *Builder[K, V]) Set(k K, v V) (V, bool) { return b.set(&entry[K, V]{hashOf(k), k, v}) }

// Delete removes k, and returns what it held.
func (b *Builder[K, V]) Delete(k K) (V, bool) { return b.delete(k, hashOf(k)) }

// set and delete are Set and Delete given the key's hash (tests choose hashes that collide).
func (b *Builder[K, V]) set(e *entry[K, V]) (prev V, had bool) {
	if b.m.root == nil {
		b.m.root = &node[K, V]{entryMap: slot(e.hash, 0), entries: []*entry[K, V]{e}, owner: b.owner}
		b.m.len = 1
		return prev, false
	}
	if b.m.root, prev, had = b.m.root.set(e, 0, b.owner); !had {
		b.m.len++
	}
	return prev, had
}

func (b *Builder[K, V]) delete(k K, h uint64) (prev V, had bool) {
	if b.m.root == nil {
		return prev, false
	}
	if b.m.root, prev, had = b.m.root.delete(k, h, 0, b.owner); had {
		if b.m.len--; b.m.len == 0 {
			b.m.root = nil
		}
	}
	return prev, had
}

// Map returns the map as changed so far. Later changes copy what they
// change, so the map returned never changes.
func (b *Builder[K, V]) Map() Map[K, V] {
	b.owner = nil
	return b.m
}

// editable returns n itself if owner may change it, else a copy that owner may change.
func (n *node[K, V]) editable(owner *token) *node[K, V] {
	if owner != nil && n.owner == owner {
		return n
	}
	return &node[K, V]{entryMap: n.entryMap, childMap: n.childMap,
		entries: slices.Clone(n.entries), children: slices.Clone(n.children), owner: owner}
}

// find returns the index of k among a collision node's entries, or -1.
func (n *node[K, V]) find(k K, h uint64) int {
	return slices.IndexFunc(n.entries, func(e *entry[K, V]) bool { return e.is(k, h) })
}

// get returns the value held for k, whose hash is h, below n (the root, or nil).
func (n *node[K, V]) get(k K, h uint64) (V, bool) {
	for shift := uint(0); n != nil; shift += levelBits {
		if shift >= 64 {
			if i := n.find(k, h); i >= 0 {
				return n.entries[i].val, true
			}
			break
		}
		bit := slot(h, shift)
		if n.entryMap&bit != 0 {
			if e := n.entries[index(n.entryMap, bit)]; e.is(k, h) {
				return e.val, true
			}
			break
		}
		if n.childMap&bit == 0 {
			break
		}
		n = n.children[index(n.childMap, bit)]
	}
	var zero V
	return zero, false
}

// set returns n (or its copy) with e set, at the level of shift; and what
// e's key held before.
func (n *node[K, V]) set(e *entry[K, V], shift uint, owner *token) (_ *node[K, V], prev V, had bool) {
	if shift >= 64 {
		i := n.find(e.key, e.hash)
		n = n.editable(owner)
		if i >= 0 {
			prev, n.entries[i] = n.entries[i].val, e
			return n, prev, true
		}
		n.entries = append(n.entries, e)
		return n, prev, false
	}
	bit := slot(e.hash, shift)
	switch {
	case n.entryMap&bit != 0:
		i := index(n.entryMap, bit)
		held := n.entries[i]
		n = n.editable(owner)
		if held.is(e.key, e.hash) {
			n.entries[i] = e
			return n, held.val, true
		}
		// Two keys share the slot: both move one level down.
		child := pair(held, e, shift+levelBits, owner)
		n.entries = slices.Delete(n.entries, i, i+1)
		n.entryMap ^= bit
		n.children = slices.Insert(n.children, index(n.childMap, bit), child)
		n.childMap |= bit
		return n, prev, false
	case n.childMap&bit != 0:
		i := index(n.childMap, bit)
		child, prev, had := n.children[i].set(e, shift+levelBits, owner)
		if child != n.children[i] {
			n = n.editable(owner)
			n.children[i] = child
		}
		return n, prev, had
	default:
		n = n.editable(owner)
		n.entries = slices.Insert(n.entries, index(n.entryMap, bit), e)
		n.entryMap |= bit
		return n, prev, false
	}
}

// pair makes the node at the level of shift that holds just a and b.
func pair[K comparable, V any](a, b *entry[K, V], shift uint, owner *token) *node[K, V] {
	if shift >= 64 {
		return &node[K, V]{entries: []*entry[K, V]{a, b}, owner: owner}
	}
	ba, bb := slot(a.hash, shift), slot(b.hash, shift)
	if ba == bb {
		return &node[K, V]{childMap: ba, children: []*node[K, V]{pair(a, b, shift+levelBits, owner)}, owner: owner}
	}
	if ba > bb {
		a, b = b, a
	}
	return &node[K, V]{entryMap: ba | bb, entries: []*entry[K, V]{a, b}, owner: owner}
}

// delete returns n (or its copy) without k, whose hash is h, at the level
// of shift; and what k held. A child left with a single entry is replaced
// by that entry, so every node keeps at least two below it.
func (n *node[K, V]) delete(k K, h uint64, shift uint, owner *token) (_ *node[K, V], prev V, had bool) {
	if shift >= 64 {
		i := n.find(k, h)
		if i < 0 {
			return n, prev, false
		}
		prev = n.entries[i].val
		n = n.editable(owner)
		n.entries = slices.Delete(n.entries, i, i+1)
		return n, prev, true
	}
	bit := slot(h, shift)
	switch {
	case n.entryMap&bit != 0:
		i := index(n.entryMap, bit)
		if !n.entries[i].is(k, h) {
			return n, prev, false
		}
		prev = n.entries[i].val
		n = n.editable(owner)
		n.entries = slices.Delete(n.entries, i, i+1)
		n.entryMap ^= bit
		return n, prev, true
	case n.childMap&bit != 0:
		i := index(n.childMap, bit)
		child, prev, had := n.children[i].delete(k, h, shift+levelBits, owner)
		if !had {
			return n, prev, false
		}
		n = n.editable(owner)
		if len(child.children) == 0 && len(child.entries) == 1 {
			n.children = slices.Delete(n.children, i, i+1)
			n.childMap ^= bit
			n.entries = slices.Insert(n.entries, index(n.entryMap, bit), child.entries[0])
			n.entryMap |= bit
		} else {
			n.children[i] = child
		}
		return n, prev, true
	}
	return n, prev, false
}

func (n *node[K, V]) all(yield func(K, V) bool) bool {
	for _, e := range n.entries {
		if !yield(e.key, e.val) {
			return false
		}
	}
	for _, c := range n.children {
		if !c.all(yield) {
			return false
		}
	}
	return true
}
