package relay

import (
	"context"
	"log/slog"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// view is what one upstream node is served: one ADS stream to the hub that
// names that node, the caches its responses fill, and the local streams
// served from them. The relay's node has one view; each gateway behind the
// relay has one of its own (see Relay).
type view struct {
	cfg     setup // Node is the view's node, sent upstream
	log     *slog.Logger
	metrics *metrics
	// connected counts the view's upstream stream while it is open.
	connected prometheus.Gauge
	// conn is the relay's connection to the hub, shared by every view (Run
	// sets the node's view's before it runs it).
	conn *grpc.ClientConn
	xds  serverv3.Server
	// caches hold the resources served locally, one per type URL. Written
	// only by the upstream goroutine (run).
	caches map[string]*cache.LinearCache

	// local tracks the local streams and their subscriptions.
	local *localStreams
	// cache is what the local server watches.
	cache *localCache

	// changed tells the upstream goroutine that a local subscription, or a
	// local client's rejection, changed (capacity 1: signals coalesce).
	changed chan struct{}

	// upstreamMu guards upstreamSubs, what the upstream stream last asked
	// for per type (for Subscriptions).
	upstreamMu   sync.Mutex
	upstreamSubs map[string]subscription

	// stopLocal ends the local streams (when run returns).
	stopLocal context.CancelFunc
}

// newView returns a view for node (the relay's own, or, when gateway is
// not empty, the gateway of that ID's) whose cache versions start with
// prefix (a prefix no other view of any relay process has: a local client
// that comes back to another view never matches its old versions against
// new counters).
func newView(cfg setup, node *core.Node, gateway, prefix string, conn *grpc.ClientConn, m *metrics, log *slog.Logger) *view {
	cfg.Node = node
	connected := m.upstreamConnected
	if gateway != "" {
		connected = m.gatewayUpstreams
	}
	v := &view{
		cfg:          cfg,
		log:          log,
		metrics:      m,
		connected:    connected,
		conn:         conn,
		caches:       map[string]*cache.LinearCache{},
		changed:      make(chan struct{}, 1),
		upstreamSubs: map[string]subscription{},
	}
	prefixes := map[string]string{}
	for _, t := range relayedTypes {
		prefixes[t] = prefix + typeLabel(t) + "-"
		v.caches[t] = cache.NewLinearCache(t, cache.WithVersionPrefix(prefixes[t]), cache.WithLogger(cacheLogger{log}))
	}
	v.local = newLocalStreams(m, log, cfg.MaxResourceNames, cfg.Clock, v.notify)
	v.local.gateway = gateway
	v.cache = newLocalCache(v.caches, prefixes, v.local, cfg.HoldUnknown, cfg.Clock, log)
	// The local streams end when run returns (or the gRPC server stops).
	serverCtx, stop := context.WithCancel(context.Background())
	v.stopLocal = stop
	v.xds = serverv3.NewServer(serverCtx, v.cache, v.local.callbacks(), sotw.WithLogger(cacheLogger{log}))
	return v
}

// subscriptions returns what the upstream stream last subscribed to, by type label.
func (v *view) subscriptions() map[string][]string {
	v.upstreamMu.Lock()
	defer v.upstreamMu.Unlock()
	out := make(map[string][]string, len(v.upstreamSubs))
	for t, s := range v.upstreamSubs {
		out[typeLabel(t)] = s.requestNames()
	}
	return out
}

// notify tells the upstream goroutine that a local subscription changed; it never blocks.
func (v *view) notify() {
	select {
	case v.changed <- struct{}{}:
	default:
	}
}
