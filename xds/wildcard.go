package xds

import (
	"maps"
	"sync"

	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// A restricted client's wildcard subscription (an Envoy gateway's LDS and
// CDS) receives the part of the cache it may see: the cache is watched for
// the names of the namespaces the client may receive, and watched again
// whenever a flush changes that set (a service appears or goes), until
// the watch answers or its stream cancels it.

// rewatcher is a restricted wildcard watch a cache's flush tells about.
type rewatcher interface{ rewatch() }

// wildcards are the restricted wildcard watches open on one cache.
type wildcards struct {
	mu   sync.Mutex
	open map[rewatcher]struct{}
}

func (w *wildcards) add(r rewatcher) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open == nil {
		w.open = map[rewatcher]struct{}{}
	}
	w.open[r] = struct{}{}
}

func (w *wildcards) remove(r rewatcher) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.open, r)
}

// rewatchAll tells every open restricted wildcard watch that the cache changed.
func (w *wildcards) rewatchAll() {
	w.mu.Lock()
	all := make([]rewatcher, 0, len(w.open))
	for r := range w.open {
		all = append(all, r)
	}
	w.mu.Unlock()
	for _, r := range all {
		r.rewatch()
	}
}

// restrictedWildcard is one restricted wildcard watch, of a sotw (R is
// cache.Response) or delta (cache.DeltaResponse) stream.
type restrictedWildcard[R any] struct {
	c     *resourceCache
	allow Restriction
	// start watches the cache for names, answering on ch.
	start func(names map[string]struct{}, ch chan R) (func(), error)
	out   chan R

	mu     sync.Mutex // guards what follows
	names  map[string]struct{}
	inner  chan R        // the current watch's channel
	stop   chan struct{} // closed when the current watch is replaced or cancelled
	cancel func()
	done   bool // answered or cancelled
}

// watchRestrictedWildcard opens a restricted wildcard watch on c that
// answers on out; it returns its cancel function.
func watchRestrictedWildcard[R any](c *resourceCache, allow Restriction, out chan R, start func(map[string]struct{}, chan R) (func(), error)) (func(), error) {
	w := &restrictedWildcard[R]{c: c, allow: allow, start: start, out: out}
	// Registered first: a flush after this finds it, one before is in the names it reads.
	c.wildcards.add(w)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.watchLocked(w.allowedNames()); err != nil {
		c.wildcards.remove(w)
		return nil, err
	}
	return w.close, nil
}

// allowedNames are the names in the cache the client may see.
func (w *restrictedWildcard[R]) allowedNames() map[string]struct{} {
	names := map[string]struct{}{}
	for n := range w.c.linear.GetResources() {
		if ns, ok := NamespaceOf(n); ok && w.allow(ns) {
			names[n] = struct{}{}
		}
	}
	return names
}

// watchLocked replaces the current watch by one for names; if the cache
// refuses the new one, the current one stays.
func (w *restrictedWildcard[R]) watchLocked(names map[string]struct{}) error {
	inner, stop := make(chan R, 1), make(chan struct{})
	cancel, err := w.start(names, inner)
	if err != nil {
		return err
	}
	if w.cancel != nil {
		w.cancel()
		close(w.stop)
	}
	w.names, w.inner, w.stop, w.cancel = names, inner, stop, cancel
	go w.forward(inner, stop)
	return nil
}

// forward hands the answer of the watch on inner to the stream, unless
// the watch was replaced or cancelled first.
func (w *restrictedWildcard[R]) forward(inner chan R, stop chan struct{}) {
	select {
	case r := <-inner:
		w.mu.Lock()
		current := w.inner == inner && !w.done
		if current {
			w.done = true
		}
		w.mu.Unlock()
		if !current {
			return // a watch replaced meanwhile answers with what is current
		}
		w.c.wildcards.remove(w)
		w.out <- r
	case <-stop:
	}
}

// rewatch watches again if the names the client may see changed, unless
// the current watch has answered already.
func (w *restrictedWildcard[R]) rewatch() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || len(w.inner) > 0 {
		return
	}
	names := w.allowedNames()
	if maps.Equal(names, w.names) {
		return
	}
	_ = w.watchLocked(names) // refused: the current watch goes on (the cache refuses only a foreign type)
}

func (w *restrictedWildcard[R]) close() {
	w.mu.Lock()
	if !w.done {
		w.done = true
		if w.cancel != nil {
			w.cancel()
			close(w.stop)
			w.cancel = nil
		}
	}
	w.mu.Unlock()
	w.c.wildcards.remove(w)
}

var (
	_ rewatcher = (*restrictedWildcard[cache.Response])(nil)
	_ rewatcher = (*restrictedWildcard[cache.DeltaResponse])(nil)
)
