package federation

import (
	"maps"
	"sync"

	"github.com/navemesh/nave/registry"
)

// A Change is what a publisher takes from its source: each changed service's
// new shard (nil: the source withholds the service, which keeps the form the
// hub last accepted) and the services gone. With Full, Set is the whole
// state and replaces whatever came before.
type Change struct {
	Full    bool
	Set     State
	Removed []registry.ServiceKey
}

// Changes carries a source's changes to a publisher. The source hands over
// its whole state (Set) or only what changed (Apply); the publisher takes
// what changed since it last took (Take), so one change costs the same
// however many services the cluster has, and changes that come while the
// publisher is busy are taken together. Safe for concurrent use; one
// publisher takes at a time, and a new one calls Restart to begin with the
// whole state.
type Changes struct {
	mu    sync.Mutex
	state State // the source's latest; owned here
	known bool  // the source has handed over a state
	full  bool  // the next Take returns the whole state
	dirty map[registry.ServiceKey]struct{}
	ready chan struct{} // holds a token while there may be something to take
}

// NewChanges returns Changes with nothing handed over yet.
func NewChanges() *Changes {
	return &Changes{full: true, dirty: map[registry.ServiceKey]struct{}{}, ready: make(chan struct{}, 1)}
}

// Set hands over the source's whole state; st is the Changes' own from now
// on. Only the services whose shard differs from the last state's are taken
// as changed, so a source that rebuilds everything may call it every time.
func (c *Changes) Set(st State) {
	if st == nil {
		st = State{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known {
		for k, old := range c.state {
			if s, ok := st[k]; !ok || !sameShard(old, s) {
				c.dirty[k] = struct{}{}
			}
		}
		for k := range st {
			if _, ok := c.state[k]; !ok {
				c.dirty[k] = struct{}{}
			}
		}
	}
	c.state, c.known = st, true
	c.signal()
}

// Apply hands over what changed: the new shard of each service in set (nil:
// withheld) and the services removed. set is not kept.
func (c *Changes) Apply(set State, removed []registry.ServiceKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == nil {
		c.state = State{}
	}
	c.known = true
	for k, s := range set {
		c.state[k] = s
		c.dirty[k] = struct{}{}
	}
	for _, k := range removed {
		delete(c.state, k)
		c.dirty[k] = struct{}{}
	}
	c.signal()
}

func (c *Changes) signal() {
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// Ready receives a token when there may be something to take.
func (c *Changes) Ready() <-chan struct{} { return c.ready }

// Restart makes the next Take return the whole state: a new publisher
// knows nothing of what an earlier one took.
func (c *Changes) Restart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.full = true
	c.signal()
}

// Take returns what changed since the last Take, or after Restart (and the
// first time) the whole state; false when there is nothing to take.
func (c *Changes) Take() (Change, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.known:
		return Change{}, false
	case c.full:
		c.full = false
		c.dirty = map[registry.ServiceKey]struct{}{} // not clear: its cost is the most it ever held
		return Change{Full: true, Set: maps.Clone(c.state)}, true
	case len(c.dirty) == 0:
		return Change{}, false
	}
	ch := Change{Set: State{}}
	for k := range c.dirty {
		if s, ok := c.state[k]; ok {
			ch.Set[k] = s
		} else {
			ch.Removed = append(ch.Removed, k)
		}
	}
	c.dirty = map[registry.ServiceKey]struct{}{} // not clear: its cost is the most it ever held
	return ch, true
}

// sameShard: a and b are the same form of a service (either may be nil: withheld).
func sameShard(a, b *registry.Shard) bool {
	return a == b || (a != nil && b != nil && a.Equal(b))
}
