package spoke

import (
	"maps"
	"sync"

	"github.com/navemesh/nave/registry"
)

// stateSink is a Sink that keeps the whole state a source handed over and
// calls fn with a copy of it after each hand-over (from the source's goroutine).
type stateSink struct {
	st State
	fn func(State)
}

func sinkFunc(fn func(State)) *stateSink { return &stateSink{fn: fn} }

func (s *stateSink) Set(st State) {
	s.st = maps.Clone(st)
	s.fn(maps.Clone(s.st))
}

func (s *stateSink) Apply(set State, removed []registry.ServiceKey) {
	if s.st == nil {
		s.st = State{}
	}
	maps.Copy(s.st, set)
	for _, k := range removed {
		delete(s.st, k)
	}
	s.fn(maps.Clone(s.st))
}

// latestState holds the newest whole state a source handed over, for tests
// that await a condition on it.
type latestState struct {
	mu      sync.Mutex
	state   State
	has     bool
	changed chan struct{} // closed by the next set
}

func newLatestState() *latestState { return &latestState{changed: make(chan struct{})} }

func (l *latestState) set(st State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state, l.has = st, true
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *latestState) get() (State, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state, l.has, l.changed
}
