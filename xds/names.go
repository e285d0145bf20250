package xds

import "sync"

// maxInterned bounds the names a nameTable holds: far more than a catalog
// has resources, so that only clients asking for names that do not exist
// can fill it. Names longer than maxInternedName are left alone (no name
// Nave serves is: the longest, a cluster's, is 164 bytes), so a full table
// holds at most 16 MiB of names, about 22 MiB with its entries.
const (
	maxInterned     = 1 << 16
	maxInternedName = 256
)

// nameTable interns the resource names clients ask for. Every stream keeps
// the names of its last request of each type (in its subscription, its
// watches and its sync status), decoded afresh from every request: a node
// agent's stream asks for hundreds, the same names as every other agent's.
// Interned, a stream holds a string header per name instead of a copy.
type nameTable struct {
	names sync.Map // name -> the same name, held once; read without mu
	mu    sync.Mutex
	n     int // names held; guarded by mu, as are additions
	max   int
}

func newNameTable(max int) *nameTable { return &nameTable{max: max} }

// intern replaces each of names by the copy the table holds, adding those
// it lacks. A full table starts again empty: names interned before stay
// valid (they are ordinary strings), they are only shared no more.
func (t *nameTable) intern(names []string) {
	for i, name := range names {
		if len(name) > maxInternedName {
			continue
		}
		if held, ok := t.names.Load(name); ok {
			names[i] = held.(string)
			continue
		}
		names[i] = t.add(name)
	}
}

// add holds name, unless another stream added it meanwhile, and returns
// the copy held.
func (t *nameTable) add(name string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if held, ok := t.names.Load(name); ok {
		return held.(string)
	}
	if t.n >= t.max {
		t.names.Clear()
		t.n = 0
	}
	t.names.Store(name, name)
	t.n++
	return name
}
