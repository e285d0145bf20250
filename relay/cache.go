package relay

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"
)

// localCache is the cache.Cache the local go-control-plane server talks to:
// it records each stream's subscription (so the upstream asks for the union)
// and hands the watch to the LinearCache of its type.
//
// It holds back a watch it cannot answer in full (it does not hold every
// name, or, for a wildcard watch, its last answer from the hub for the
// type was not to a wildcard request) when an answer now would do harm
// (see mayHold): a listener or cluster watch (full state: a name missing
// from the answer is deleted by the client) from a client that holds
// state from another server (its version is not this relay's: the relay
// restarted, or the client moved here), and an Envoy's first watches
// (Envoy takes an answer without a resource as its absence, and goes live
// without it). The watch is answered when the relay can answer it in
// full, or, once the hub has answered that type on the current stream,
// after hold (the hub does not have them). While the hub is unreachable it
// waits: the client keeps what it has.
type localCache struct {
	caches   map[string]*cache.LinearCache
	prefixes map[string]string // each cache's version prefix, by type URL
	streams  *localStreams
	log      *slog.Logger
	hold     time.Duration
	clock    clock.PassiveClock

	// mu guards held, syncedAt, wildcardAnswered and deferred.
	mu sync.Mutex
	// held mirrors, per type URL, the names each cache holds (the upstream
	// goroutine writes both).
	held map[string]map[string]struct{}
	// syncedAt is, per type URL, when the current upstream stream first
	// answered for it (zero: not yet, or no stream).
	syncedAt map[string]time.Time
	// wildcardAnswered is, per type URL, whether an upstream response (on
	// this stream or an earlier one: while the hub is away, what the relay
	// holds is the last good state) surely answered a wildcard request, and
	// nothing was dropped since as unwanted (a wildcard watch is covered
	// only then).
	wildcardAnswered map[string]bool
	deferred         map[*deferredWatch]struct{}
}

func newLocalCache(caches map[string]*cache.LinearCache, prefixes map[string]string, streams *localStreams, hold time.Duration, clk clock.PassiveClock, log *slog.Logger) *localCache {
	c := &localCache{caches: caches, prefixes: prefixes, streams: streams, log: log, hold: hold, clock: clk,
		held: map[string]map[string]struct{}{}, syncedAt: map[string]time.Time{}, wildcardAnswered: map[string]bool{}, deferred: map[*deferredWatch]struct{}{}}
	for t := range caches {
		c.held[t] = map[string]struct{}{}
	}
	return c
}

var _ cache.Cache = (*localCache)(nil)

// deferredWatch is a watch held back until the relay can answer it.
type deferredWatch struct {
	typeURL string
	req     *cache.Request
	sub     cache.Subscription
	out     chan cache.Response
	created time.Time

	// mu guards stopped and cancel: the watch is handed to the LinearCache
	// at most once, and never after the server cancelled it (the server
	// modifies the subscription once the cancel returns).
	mu      sync.Mutex
	stopped bool
	cancel  func()
}

func (d *deferredWatch) stop(c *localCache) {
	d.mu.Lock()
	d.stopped = true
	if d.cancel != nil {
		d.cancel()
	}
	d.mu.Unlock()
	c.mu.Lock()
	delete(c.deferred, d)
	c.mu.Unlock()
}

// CreateWatch implements cache.ConfigWatcher.
func (c *localCache) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	linear := c.caches[req.GetTypeUrl()]
	if linear == nil {
		// Left open and unanswered: an error would end the whole ADS stream.
		c.log.Debug("watch for a type the relay does not serve", "type", req.GetTypeUrl())
		return func() {}, nil
	}
	if c.streams.subscribe(req, sub) {
		// A NACK of the last response: the LinearCache would answer a
		// version without its prefix ("" on first contact) at once, with
		// the same resources, and the client would reject them again. Wait
		// for a change instead (the cache only checks the prefix; what was
		// returned is in sub).
		req = proto.CloneOf(req)
		req.VersionInfo = c.prefixes[req.GetTypeUrl()]
		return linear.CreateWatch(req, sub, out)
	}
	if t := req.GetTypeUrl(); c.mayHold(t, req, sub) {
		c.mu.Lock()
		if !c.covers(t, sub) {
			d := &deferredWatch{typeURL: t, req: req, sub: sub, out: out, created: c.clock.Now()}
			c.deferred[d] = struct{}{}
			c.mu.Unlock()
			c.log.Debug("holding a watch until the relay holds what it names", "type", typeLabel(t), "node", req.GetNode().GetId())
			return func() { d.stop(c) }, nil
		}
		c.mu.Unlock()
	}
	return linear.CreateWatch(req, sub, out)
}

// mayHold says whether a watch is held back while the relay cannot answer
// it in full (see localCache): one from a client with another server's
// listeners or clusters, or from a client with no state but an Envoy's
// (a wildcard listener or cluster watch, or any route or endpoint watch:
// Envoy takes an answer without them as none, and goes on without them).
// A proxyless client with no state that names listeners or clusters is
// answered at once: gRPC takes a name it never received, absent from an
// answer, as not received yet.
func (c *localCache) mayHold(t string, req *cache.Request, sub cache.Subscription) bool {
	version := req.GetVersionInfo()
	switch {
	case strings.HasPrefix(version, c.prefixes[t]):
		return false // this relay's state: the cache answers what changes
	case version != "":
		return cache.ResourceRequiresFullStateInSotw(t)
	default:
		return sub.IsWildcard() || !cache.ResourceRequiresFullStateInSotw(t)
	}
}

// covers says whether the relay can answer sub in full. Call with mu held.
func (c *localCache) covers(t string, sub cache.Subscription) bool {
	if sub.IsWildcard() {
		// An answer to a named request says nothing of the rest.
		return c.wildcardAnswered[t]
	}
	held := c.held[t]
	for name := range sub.SubscribedResources() {
		if _, ok := held[name]; !ok {
			return false
		}
	}
	return true
}

// noteHeld records what the upstream goroutine put in or took out of a cache.
func (c *localCache) noteHeld(t string, added []string, removed []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range added {
		c.held[t][name] = struct{}{}
	}
	for _, name := range removed {
		delete(c.held[t], name)
	}
}

// dropped records that the upstream goroutine dropped names from a cache
// as unwanted: it holds no longer all the hub's resources of the type.
func (c *localCache) dropped(t string, names []string) {
	c.noteHeld(t, nil, names)
	c.mu.Lock()
	c.wildcardAnswered[t] = false
	c.mu.Unlock()
}

// synced records that the current upstream stream answered type t, and
// whether that answer was to a wildcard request (an answer to a named one
// leaves what the caches hold of an earlier wildcard answer: only dropped
// takes it away); reset forgets when each type was answered (the stream
// ended).
func (c *localCache) synced(t string, at time.Time, wildcard bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.syncedAt[t].IsZero() {
		c.syncedAt[t] = at
	}
	if wildcard {
		c.wildcardAnswered[t] = true
	}
}

func (c *localCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.syncedAt)
}

// release hands the deferred watches that can now be answered to their
// LinearCache. Called by the upstream goroutine.
func (c *localCache) release(now time.Time) {
	var ready []*deferredWatch
	c.mu.Lock()
	for d := range c.deferred {
		synced := c.syncedAt[d.typeURL]
		if c.covers(d.typeURL, d.sub) || (!synced.IsZero() && now.Sub(synced) >= c.hold && now.Sub(d.created) >= c.hold) {
			delete(c.deferred, d)
			ready = append(ready, d)
		}
	}
	c.mu.Unlock()
	for _, d := range ready {
		d.mu.Lock()
		if !d.stopped {
			cancel, err := c.caches[d.typeURL].CreateWatch(d.req, d.sub, d.out)
			if err != nil {
				c.log.Error("release a held watch", "type", typeLabel(d.typeURL), "err", err)
			}
			d.cancel = cancel
		}
		d.mu.Unlock()
	}
}

// CreateDeltaWatch implements cache.ConfigWatcher; never called (localServer refuses delta streams).
func (c *localCache) CreateDeltaWatch(*cache.DeltaRequest, cache.Subscription, chan cache.DeltaResponse) (func(), error) {
	return nil, errDelta
}

// Fetch implements cache.ConfigFetcher; never called (localServer refuses fetches).
func (c *localCache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errFetch
}
