// Package changelog says which keys changed between the version of a value
// a consumer last saw and the current one, so that the consumer looks at
// those keys only instead of comparing the whole value: replication's view
// of a cluster, the hub's MCS import set.
package changelog

import "slices"

// Log is the change that made one version of a value, naming the keys it
// touched, with the changes before it back to where the chain was cut. It
// is immutable and safe to share between goroutines; it holds keys only, so
// a consumer that keeps a version keeps no older version alive through it.
// The versions are a sequence: Then is called once on each log (the owner
// of the value makes them in turn), since a position names a version by its
// number in the lineage.
type Log[K comparable] struct {
	lineage *lineage
	seq     uint64 // the version's: New's is 0, each Then adds 1
	keys    []K
	prev    *Log[K] // the change to seq-1; nil where the chain was cut
	links   int     // in the chain, this one included; 0 for New's
	named   int     // keys named in the chain
}

// lineage identifies the logs that follow one first log. It has a size so
// that every lineage is a distinct address.
type lineage struct{ _ byte }

// Position is what a consumer keeps of the version it last saw, to ask the
// log what changed since (Since). The zero value is no log's: nothing
// reaches back to it.
type Position struct {
	lineage *lineage
	seq     uint64
}

// maxLinks bounds a chain's length.
const maxLinks = 64

// New returns a first log, of a version no change made: the logs that
// follow it (Then) reach back to it.
func New[K comparable]() *Log[K] { return &Log[K]{lineage: new(lineage)} }

// Position returns where l is; that of nil is the zero Position.
func (l *Log[K]) Position() Position {
	if l == nil {
		return Position{}
	}
	return Position{l.lineage, l.seq}
}

// Then returns the log of the version after l's, made by a change that
// touched keys (each named once; kept, not to be modified). After nil it
// starts a lineage of its own, which reaches back to no earlier version.
// held is how many keys the new version holds: a chain names at most
// 2*held+64 keys (or what one change names, if more), and holds at most
// maxLinks links. When l's is full, the new link follows a copy of its
// newer links, up to half of either bound (the keys are shared), so that a
// consumer a few versions behind still reaches back at any time, and the
// next cut is as many changes away; one further behind than that compares
// whole, which then costs no more.
func (l *Log[K]) Then(keys []K, held int) *Log[K] {
	if l == nil {
		l = New[K]()
	}
	next := &Log[K]{lineage: l.lineage, seq: l.seq + 1, keys: keys, links: 1, named: len(keys)}
	bound := 2*held + 64
	switch {
	case l.links == 0: // New's: no change before
	case l.links < maxLinks && l.named+len(keys) <= bound:
		next.prev, next.links, next.named = l, l.links+1, l.named+len(keys)
	default:
		var kept []*Log[K]
		for n := l; n != nil && len(kept) < maxLinks/2 && next.named+len(n.keys) <= bound/2; n = n.prev {
			kept = append(kept, n)
			next.named += len(n.keys)
		}
		for _, n := range slices.Backward(kept) {
			copied := &Log[K]{lineage: n.lineage, seq: n.seq, keys: n.keys, prev: next.prev, links: next.links, named: len(n.keys)}
			if copied.prev != nil {
				copied.named += copied.prev.named
			}
			next.prev, next.links = copied, next.links+1
		}
	}
	return next
}

// Since returns the keys the changes after position p named, newest first,
// each once; not to be modified. False when l does not reach back to p (p
// is another lineage's, or later than l, or the chain was cut since): the
// caller compares whole.
func (l *Log[K]) Since(p Position) ([]K, bool) {
	if l == nil || p.lineage != l.lineage || p.seq > l.seq {
		return nil, false
	}
	if p.seq == l.seq {
		return nil, true
	}
	// The chain is contiguous: it holds the change to p.seq+1 unless cut since.
	first := l
	for first != nil && first.seq > p.seq+1 {
		first = first.prev
	}
	if first == nil {
		return nil, false
	}
	if first == l {
		return l.keys, true
	}
	var out []K
	seen := make(map[K]bool)
	for n := l; n != first.prev; n = n.prev {
		for _, k := range n.keys {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out, true
}
