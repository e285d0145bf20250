package xds

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/limits"
)

// resourceCache is one LinearCache (one type, one audience) plus what we
// published in it. LinearCache versions every resource separately, answers a
// sotw EDS/RDS watch with only the changed resources and serves delta xDS.
//
// Its fields other than linear are owned by whoever holds Server.stateMu.
type resourceCache struct {
	typeURL string
	label   string
	prefix  string
	linear  *cache.LinearCache
	// published holds, for each resource the LinearCache holds, a content
	// hash, to skip no-op updates (with sotw, re-setting an equal resource
	// would still bump its version and resend it), and the version that
	// last changed it, to tell what a client holds (see holdings).
	published map[string]publishedResource
	// version mirrors the LinearCache's version counter (we are its only writer).
	version uint64
	// staged changes, flushed together in one UpdateResources call.
	upserts map[string]stagedResource
	deletes map[string]bool
	// wildcards are the restricted wildcard watches on this cache, told
	// about every flush that adds or deletes names.
	wildcards wildcards
}

type publishedResource struct {
	sum     uint64
	version uint64 // 0: held from the start
}

type stagedResource struct {
	res types.Resource
	sum uint64
}

// newResourceCache returns a cache holding initial, whose content hashes are sums.
func newResourceCache(typeURL, prefix string, logger *slog.Logger, initial map[string]types.Resource, sums map[string]uint64) *resourceCache {
	published := make(map[string]publishedResource, len(sums))
	for name, sum := range sums {
		published[name] = publishedResource{sum: sum}
	}
	return &resourceCache{
		typeURL:   typeURL,
		label:     typeLabel(typeURL),
		prefix:    prefix,
		linear:    cache.NewLinearCache(typeURL, cache.WithVersionPrefix(prefix), cache.WithInitialResources(initial), cache.WithLogger(cacheLogger(logger))),
		published: published,
		upserts:   map[string]stagedResource{},
		deletes:   map[string]bool{},
	}
}

// stage records that name should hold res, whose content hash is sum, unless
// that is what is published.
func (c *resourceCache) stage(name string, res types.Resource, sum uint64) {
	delete(c.deletes, name)
	if old, ok := c.published[name]; ok && old.sum == sum {
		delete(c.upserts, name)
		return
	}
	c.upserts[name] = stagedResource{res: res, sum: sum}
}

// stageDelete records that name should go.
func (c *resourceCache) stageDelete(name string) {
	delete(c.upserts, name)
	if _, ok := c.published[name]; ok {
		c.deletes[name] = true
	}
}

// flush publishes the staged changes in one cache update and returns the new
// version, or "" when nothing changed.
func (c *resourceCache) flush() (version string, changed int, err error) {
	if len(c.upserts) == 0 && len(c.deletes) == 0 {
		return "", 0, nil
	}
	deletes := make([]string, 0, len(c.deletes))
	for name := range c.deletes {
		deletes = append(deletes, name)
		delete(c.published, name)
	}
	upserts := make(map[string]types.Resource, len(c.upserts))
	var added []string // names the cache did not hold
	c.version++
	for name, staged := range c.upserts {
		if _, held := c.published[name]; !held {
			added = append(added, name)
		}
		c.published[name] = publishedResource{sum: staged.sum, version: c.version}
		upserts[name] = staged.res
	}
	changed = len(upserts) + len(deletes)
	clear(c.upserts)
	c.deletes = map[string]bool{}
	if err := c.linear.UpdateResources(upserts, deletes); err != nil {
		return "", changed, fmt.Errorf("update %s cache: %w", c.label, err)
	}
	if len(added) > 0 || len(deletes) > 0 {
		c.wildcards.rewatchAll(added, deletes)
	}
	return c.prefix + strconv.FormatUint(c.version, 10), changed, nil
}

// contentSum is a hash of what res puts on the wire (for resources that are
// not built from shared blocks: listeners, routes, clusters).
func contentSum(res types.Resource) uint64 {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(res)
	if err != nil {
		// Never equal to anything published: the resource is staged, and the cache reports the error.
		return 0
	}
	return maphash.Bytes(seed, b)
}

// errFetchUnsupported answers REST fetches: Nave serves streams only.
var errFetchUnsupported = errors.New("xds: fetch is not supported, use a stream")

// dispatchCache is the cache.Cache the go-control-plane server talks to. It
// sends listeners, routes and clusters to shared caches (they do not depend on
// the client's locality) and endpoints to the cache of the client's locality
// group, created on first use.
type dispatchCache struct {
	lds, rds, cds *resourceCache
	// eds returns the EDS cache of a node's Client, creating it if needed.
	eds func(*core.Node) *resourceCache
	// view returns the caches of a node's audience group, and whether it
	// belongs to an audience (its caches are nil beyond MaxAudienceGroups).
	view func(*core.Node) (*view, bool)
	// restriction returns what the stream of a node's requests may receive (nil: everything).
	restriction func(*core.Node) Restriction
	log         *slog.Logger
}

var _ cache.Cache = (*dispatchCache)(nil)

// CreateWatch implements cache.ConfigWatcher.
func (d *dispatchCache) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	c := d.cacheFor(req.GetTypeUrl(), req.GetNode())
	if c == nil {
		return d.unknownType(req.GetTypeUrl()), nil
	}
	if allow := d.restriction(req.GetNode()); allow != nil {
		if sub.IsWildcard() {
			return watchRestrictedWildcard(c, allow, out, func(names map[string]struct{}, ch chan cache.Response) (func(), error) {
				return c.linear.CreateWatch(req, restrictedSubscription{Subscription: sub, names: names}, ch)
			}, nil)
		}
		sub = restrict(sub, allow)
	}
	return c.linear.CreateWatch(req, sub, out)
}

// CreateDeltaWatch implements cache.ConfigWatcher.
func (d *dispatchCache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	c := d.cacheFor(req.GetTypeUrl(), req.GetNode())
	if c == nil {
		return d.unknownType(req.GetTypeUrl()), nil
	}
	if allow := d.restriction(req.GetNode()); allow != nil {
		if sub.IsWildcard() {
			first := func() (cache.DeltaResponse, bool) {
				return newEmptyDeltaResponse(req, sub), req.GetResponseNonce() == ""
			}
			return watchRestrictedWildcard(c, allow, out, func(names map[string]struct{}, ch chan cache.DeltaResponse) (func(), error) {
				return c.linear.CreateDeltaWatch(req, restrictedSubscription{Subscription: sub, names: names}, ch)
			}, first)
		}
		sub = restrict(sub, allow)
	}
	return c.linear.CreateDeltaWatch(req, sub, out)
}

// Fetch implements cache.ConfigFetcher.
func (d *dispatchCache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errFetchUnsupported
}

func (d *dispatchCache) cacheFor(typeURL string, node *core.Node) *resourceCache {
	if typeURL == resource.EndpointType {
		return d.eds(node)
	}
	lds, rds, cds := d.lds, d.rds, d.cds
	if v, member := d.view(node); member {
		if v == nil {
			return nil // a gateway of a group beyond the limit: nothing, never the proxyless resources
		}
		lds, rds, cds = v.lds, v.rds, v.cds
	}
	switch typeURL {
	case resource.ListenerType:
		return lds
	case resource.RouteType:
		return rds
	case resource.ClusterType:
		return cds
	default:
		return nil
	}
}

// unknownType leaves a watch for a type Nave does not serve (secrets, runtime,
// ...) open and unanswered: an error would end the whole ADS stream.
func (d *dispatchCache) unknownType(typeURL string) func() {
	d.log.Debug("watch for a type Nave does not serve", "type", limits.Truncate(typeURL))
	return func() {}
}

// cacheLogger routes go-control-plane's cache logs into slog; its Info is chatty per watch, so it becomes Debug.
func cacheLogger(l *slog.Logger) logFuncs {
	return logFuncs{l: l}
}

type logFuncs struct{ l *slog.Logger }

func (f logFuncs) Debugf(format string, args ...any) { f.log(slog.LevelDebug, format, args...) }
func (f logFuncs) Infof(format string, args ...any)  { f.log(slog.LevelDebug, format, args...) }
func (f logFuncs) Warnf(format string, args ...any)  { f.log(slog.LevelWarn, format, args...) }
func (f logFuncs) Errorf(format string, args ...any) { f.log(slog.LevelError, format, args...) }

// log formats what go-control-plane logs, its strings (type URLs, node
// IDs: the clients') cut short.
func (f logFuncs) log(level slog.Level, format string, args ...any) {
	if !f.l.Enabled(context.Background(), level) {
		return
	}
	cut := make([]any, len(args)) // args may be the caller's slice
	for i, a := range args {
		if s, ok := a.(string); ok {
			a = limits.Truncate(s)
		}
		cut[i] = a
	}
	f.l.Log(context.Background(), level, fmt.Sprintf(format, cut...))
}

// pushStamp is when the Update that produced a cache version started.
type pushStamp struct {
	version string
	at      time.Time
}
