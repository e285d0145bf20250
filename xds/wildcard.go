package xds

import (
	"context"
	"maps"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// A restricted client's wildcard subscription (an Envoy gateway's LDS and
// CDS) receives the part of the cache it may see: the cache is watched for
// the names of the namespaces the client may receive, and watched again
// whenever a flush changes that set (a service appears or goes), until
// the watch answers or its stream cancels it.

// rewatcher is a restricted wildcard watch a cache's flush tells about.
type rewatcher interface {
	// rewatch is told the names the flush added to the cache and deleted.
	rewatch(added, deleted []string)
}

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

// rewatchAll tells every open restricted wildcard watch which names a
// flush added and deleted.
func (w *wildcards) rewatchAll(added, deleted []string) {
	w.mu.Lock()
	all := make([]rewatcher, 0, len(w.open))
	for r := range w.open {
		all = append(all, r)
	}
	w.mu.Unlock()
	for _, r := range all {
		r.rewatch(added, deleted)
	}
}

// restrictedWildcard is one restricted wildcard watch, of a sotw (R is
// cache.Response) or delta (cache.DeltaResponse) stream.
type restrictedWildcard[R any] struct {
	c     *resourceCache
	allow Restriction
	// start watches the cache for names, answering on ch.
	start func(names map[string]struct{}, ch chan R) (func(), error)
	// first answers a first request the cache leaves unanswered (a delta
	// client waits for one to initialise, even with nothing to see).
	first func() (R, bool)
	out   chan R
	// closing is closed by close before it waits for mu: an answer being
	// handed over gives up, and none is sent once close returns (the
	// stream closes out then).
	closing   chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex // guards what follows
	names  map[string]struct{}
	inner  chan R        // the current watch's channel
	stop   chan struct{} // closed when the current watch is replaced or cancelled
	cancel func()        // the current watch's (nil: none, or it answered at once)
	done   bool          // answered or cancelled
}

// watchRestrictedWildcard opens a restricted wildcard watch on c that
// answers on out; it returns its cancel function. first (nil: none)
// answers a first request the cache leaves unanswered.
func watchRestrictedWildcard[R any](c *resourceCache, allow Restriction, out chan R, start func(map[string]struct{}, chan R) (func(), error), first func() (R, bool)) (func(), error) {
	w := &restrictedWildcard[R]{c: c, allow: allow, start: start, first: first, out: out, closing: make(chan struct{})}
	// Registered first: a flush after this finds it, one before is in the names it reads.
	c.wildcards.add(w)
	w.mu.Lock()
	defer w.mu.Unlock()
	answered, err := w.watchLocked(w.allowedNames())
	if err != nil {
		c.wildcards.remove(w)
		return nil, err
	}
	if !answered && first != nil {
		if r, ok := first(); ok {
			if w.cancel != nil {
				w.cancel()
				w.cancel = nil
			}
			select {
			case w.inner <- r: // handed over by the forwarder, as the cache's answer would be
			default: // the cache answered meanwhile
			}
		}
	}
	return w.close, nil
}

// allowedNames are the names in the cache the client may see.
func (w *restrictedWildcard[R]) allowedNames() map[string]struct{} {
	names := map[string]struct{}{}
	for n := range w.c.linear.GetResources() {
		if w.allowed(n) {
			names[n] = struct{}{}
		}
	}
	return names
}

func (w *restrictedWildcard[R]) allowed(name string) bool {
	ns, ok := NamespaceOf(name)
	return ok && w.allow(ns)
}

// watchLocked replaces the current watch by one for names and says
// whether the cache answered it at once; if the cache refuses it, the
// current one stays.
func (w *restrictedWildcard[R]) watchLocked(names map[string]struct{}) (bool, error) {
	inner, stop := make(chan R, 1), make(chan struct{})
	cancel, err := w.start(names, inner)
	if err != nil {
		return false, err
	}
	answered := len(inner) > 0
	if w.stop != nil {
		if w.cancel != nil {
			w.cancel()
		}
		close(w.stop)
	}
	w.names, w.inner, w.stop, w.cancel = names, inner, stop, cancel
	go w.forward(inner, stop)
	return answered, nil
}

// forward hands the answer of the watch on inner to the stream, unless
// the watch was replaced or cancelled first.
func (w *restrictedWildcard[R]) forward(inner chan R, stop chan struct{}) {
	select {
	case r := <-inner:
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.inner != inner || w.done {
			return // a watch replaced meanwhile answers with what is current
		}
		w.done = true
		w.c.wildcards.remove(w)
		// Sent under mu, so that none is sent once close returns. It never
		// waits: go-control-plane's response channels hold an answer per
		// type (sotw ADS, delta) or are one's own (sotw per type), and a
		// stream has one watch per type open.
		select {
		case w.out <- r:
		case <-w.closing:
		}
	case <-stop:
	}
}

// rewatch watches again if the names the client may see changed, unless
// the current watch has answered already.
func (w *restrictedWildcard[R]) rewatch(added, deleted []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || len(w.inner) > 0 {
		return
	}
	var next map[string]struct{} // nil until something changes
	change := func() {
		if next == nil {
			next = maps.Clone(w.names)
		}
	}
	for _, n := range added {
		if _, ok := w.names[n]; !ok && w.allowed(n) {
			change()
			next[n] = struct{}{}
		}
	}
	for _, n := range deleted {
		if _, ok := w.names[n]; ok {
			change()
			delete(next, n)
		}
	}
	if next != nil {
		_, _ = w.watchLocked(next) // refused: the current watch goes on (the cache refuses only a foreign type)
	}
}

func (w *restrictedWildcard[R]) close() {
	w.closeOnce.Do(func() { close(w.closing) })
	w.mu.Lock()
	if !w.done {
		w.done = true
		if w.cancel != nil {
			w.cancel()
			w.cancel = nil
		}
		if w.stop != nil {
			close(w.stop)
		}
	}
	w.mu.Unlock()
	w.c.wildcards.remove(w)
}

// emptyDeltaResponse answers a delta client's first wildcard request when
// it may see nothing new: no resource, what it knows unchanged.
type emptyDeltaResponse struct {
	req      *cache.DeltaRequest
	returned map[string]string
}

func newEmptyDeltaResponse(req *cache.DeltaRequest, sub cache.Subscription) *emptyDeltaResponse {
	returned := make(map[string]string, len(sub.ReturnedResources())) // never nil: the server writes into it
	maps.Copy(returned, sub.ReturnedResources())
	return &emptyDeltaResponse{req: req, returned: returned}
}

func (r *emptyDeltaResponse) GetDeltaDiscoveryResponse() (*discovery.DeltaDiscoveryResponse, error) {
	return &discovery.DeltaDiscoveryResponse{TypeUrl: r.req.GetTypeUrl()}, nil
}
func (r *emptyDeltaResponse) GetDeltaRequest() *discovery.DeltaDiscoveryRequest { return r.req }
func (r *emptyDeltaResponse) GetSystemVersion() (string, error)                 { return "", nil }
func (r *emptyDeltaResponse) GetResponseVersion() string                        { return "" }
func (r *emptyDeltaResponse) GetNextVersionMap() map[string]string              { return r.returned }
func (r *emptyDeltaResponse) GetReturnedResources() map[string]string           { return r.returned }
func (r *emptyDeltaResponse) GetContext() context.Context                       { return context.Background() }

var (
	_ rewatcher           = (*restrictedWildcard[cache.Response])(nil)
	_ rewatcher           = (*restrictedWildcard[cache.DeltaResponse])(nil)
	_ cache.DeltaResponse = (*emptyDeltaResponse)(nil)
)
