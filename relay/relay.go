// Package relay is a node-local xDS relay: it holds one state-of-the-world
// ADS stream to the hub and serves the proxyless gRPC clients of its node
// from caches filled by that stream, so the hub holds one stream per node
// instead of one per client; a gateway on the node gets a stream of its own
// (see Gateways below).
//
// Upstream, the relay subscribes, per type, to the union of the resource
// names its local clients ask for (wildcard when any of them asks wildcard),
// ACKs every response it can decode and NACKs the others. Locally it serves
// state-of-the-world ADS (and the separate LDS, RDS, CDS and EDS services)
// from one go-control-plane LinearCache per type.
//
// Locality: the hub computes endpoints for the relay's own node (its
// Wiring.Node: locality, NETWORK and CLUSTER_ID metadata), and every local
// client but a gateway is served exactly that, whatever locality its own
// bootstrap names.
// A node's clients share its zone, so this is what they would be served
// anyway; run one relay per node.
//
// Gateways: a local client whose node names a gateway role (NAVE_GATEWAY
// metadata: an Envoy gateway run by `nave gateway`) is served a view of its
// own: the relay opens an upstream stream in the gateway's name (its node
// as it sent it, completed with the relay's locality, CLUSTER_ID and
// NETWORK where it names none), on the same connection, and the hub serves
// it the listeners, routes and clusters it would serve the gateway
// connected directly. Its certificates come from its own agent (SDS), never
// through the relay. A gateway's view is kept RetainUnwanted after its
// last stream ends, and at most MaxGateways are served. An Envoy's first
// listener and cluster watches (and any client's first route and endpoint
// watches) wait until the relay can answer them in full: Envoy takes an
// answer without a resource as its absence, and would go live without its
// listeners (see localCache).
//
// When the hub is unreachable the relay keeps serving the last good state
// (a new local client is served from the caches) and reconnects
// with jittered exponential backoff; the caches are never cleared, the
// hub's next responses replace what they hold.
//
// A resource no local client wants any more leaves the upstream
// subscription at once and the caches after Config.RetainUnwanted, so a
// client whose stream breaks finds it again. A listener or cluster watch
// from a client that holds another server's state (the relay restarted) is
// not answered before the relay holds what it names: a state-of-the-world
// answer without them would delete them at the client.
//
// Endpoint and route entries (EDS, RDS) the hub deleted stay cached, and
// are served, while a local client still asks for them: a
// state-of-the-world response cannot say a resource of those types is
// gone, so the relay only learns it when no client wants it any more.
//
// Security: the relay speaks to the hub under its own identity (the
// caller's DialOptions), so the hub's per-client restrictions (its
// per-identity namespace policy) apply to the relay's identity only, and
// every local client may ask for, and is served, whatever the relay may
// see. The relay does no authentication of its local clients: deploy it
// where that is acceptable (a listener reachable only by the node's
// trusted workloads). Any of them may also claim to be a gateway, and
// have the relay open a stream in that name (MaxGateways at once; 0 serves
// none), as it could connecting to the hub under an identity of its own.
//
// Local clients' ACKs and NACKs are tracked per stream (Clients), and a
// NACK is reported upstream once, as a NACK of the hub's last response that
// names the client (see upstream.report), so the hub's NACK metrics and logs
// count the clients behind the relay.
//
// Not yet: delta xDS for local clients (delta streams are refused), and
// views per proxyless client (every client but a gateway gets the relay's
// node's resources).
package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"k8s.io/utils/clock"
)

// Config is what an operator tunes of a relay: its timings and bounds.
type Config struct {
	// BackoffMin and BackoffMax bound the delay between upstream
	// reconnection attempts; it doubles on each failure, with jitter. The
	// hub's port is probed meanwhile: a delay ends once it answers again.
	BackoffMin, BackoffMax time.Duration
	// RetainUnwanted is how long a resource no local client wants any more
	// stays in the caches (it leaves the upstream subscription at once). A
	// client whose stream breaks and comes back within it finds its
	// resources still there, even with the hub unreachable; so does a
	// gateway its view.
	RetainUnwanted time.Duration
	// HoldUnknown bounds how long a held watch (a client's with another
	// server's listeners or clusters, or an Envoy's first; see localCache)
	// waits for resources the relay does not hold, once the hub has answered.
	HoldUnknown time.Duration
	// MaxResourceNames bounds the resource names of one local request (a
	// stream asking for more is ended with ResourceExhausted) and of the
	// upstream subscription per type (past it the type is subscribed to as
	// a wildcard): the hub refuses requests naming more than its own bound
	// (50,000) and ends the relay's stream.
	MaxResourceNames int
	// MaxGateways bounds the gateways served a view of their own (each
	// holds an upstream stream and caches, and is kept RetainUnwanted after
	// its last stream); a further gateway's stream is ended with
	// ResourceExhausted. 0 serves no gateway (FailedPrecondition).
	MaxGateways int
}

// DefaultConfig has the backoff bounds (100 ms to 10 s), keeps unwanted
// resources (and a gateway's view) a minute, holds a watch for unknown
// resources up to 2 s, allows 50,000 resource names (the hub's bound) and
// 16 gateways. Timings and MaxResourceNames left zero take these values.
func DefaultConfig() Config {
	return Config{BackoffMin: 100 * time.Millisecond, BackoffMax: 10 * time.Second, RetainUnwanted: time.Minute, HoldUnknown: 2 * time.Second,
		MaxResourceNames: 50_000, MaxGateways: 16}
}

// Wiring is what the process hands a relay at start, beside its Config:
// the hub it relays, how to reach it, and the node it speaks for.
type Wiring struct {
	// Upstream is the hub's xDS address (a gRPC target).
	Upstream string
	// DialOptions are used to dial Upstream; the caller supplies the
	// transport credentials (TLS), since only it knows them.
	DialOptions []grpc.DialOption
	// Node is the relay's own node, sent to the hub on the first request of
	// each stream: its ID, cluster, locality and metadata (NETWORK,
	// CLUSTER_ID) decide which network and locality the hub computes
	// endpoints for, for every local client but a gateway.
	Node *core.Node
	// Clock drives retention, holds and the times the relay records; nil
	// is the system's (tests step a fake one).
	Clock clock.WithTickerAndDelayedExecution
}

// setup is a relay's Config and Wiring together; each view has its own
// copy, whose Node is the view's.
type setup struct {
	Config
	Wiring
}

// ErrNoUpstream is returned by New when Wiring.Upstream is empty.
var ErrNoUpstream = errors.New("relay: no upstream address")

// ErrNoNode is returned by New when Wiring.Node has no ID.
var ErrNoNode = errors.New("relay: no node ID")

// ErrRunTwice is returned by Run when it was called before: a relay runs once.
var ErrRunTwice = errors.New("relay: Run called twice")

// relayedTypes are the resource types relayed, in the order requests for them are
// sent upstream.
var relayedTypes = []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

// Relay relays the hub's xDS resources to the clients of one node.
type Relay struct {
	cfg     setup
	log     *slog.Logger
	metrics *metrics
	// prefix starts every cache version of this relay process.
	prefix string
	// node is the node's own view, which every local client but a gateway is served.
	node *view

	// views runs the gateways' views; it ends them when Run returns.
	views *gatewayViews

	// ran is set by the first Run; stopped is closed when it returns (a
	// local stream still to send its first request ends then).
	ran     atomic.Bool
	stopped chan struct{}
}

// New returns a relay for cfg and w. Its metrics are registered on reg (nil: not registered).
func New(cfg Config, w Wiring, log *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	if w.Upstream == "" {
		return nil, ErrNoUpstream
	}
	if w.Node.GetId() == "" {
		return nil, ErrNoNode
	}
	def := DefaultConfig()
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = def.BackoffMin
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(def.BackoffMax, cfg.BackoffMin)
	}
	if cfg.RetainUnwanted <= 0 {
		cfg.RetainUnwanted = def.RetainUnwanted
	}
	if cfg.HoldUnknown <= 0 {
		cfg.HoldUnknown = def.HoldUnknown
	}
	if cfg.MaxResourceNames <= 0 {
		cfg.MaxResourceNames = def.MaxResourceNames
	}
	if w.Clock == nil {
		w.Clock = clock.RealClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "relay")
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	// A prefix of its own per relay process: a local client that comes back
	// to a restarted relay never matches its old versions against new counters.
	token := make([]byte, 4)
	_, _ = rand.Read(token)
	r := &Relay{cfg: setup{cfg, w}, log: log, metrics: m, prefix: "relay-" + hex.EncodeToString(token) + "-", stopped: make(chan struct{})}
	r.node = newView(r.cfg, w.Node, "", r.prefix, nil, m, log)
	r.views = newGatewayViews(r)
	return r, nil
}

// Register registers the aggregated discovery service and the separate LDS,
// RDS, CDS and EDS services on g. The local streams end when Run returns
// (or g stops).
func (r *Relay) Register(g *grpc.Server) {
	l := localServer{r}
	discovery.RegisterAggregatedDiscoveryServiceServer(g, l)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, l)
	routeservice.RegisterRouteDiscoveryServiceServer(g, l)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, l)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, l)
}

// Run keeps the node's ADS stream to the hub, and one per gateway served,
// on one connection, until ctx ends, reconnecting with jittered
// exponential backoff; it returns nil when ctx ends, or an error if the
// upstream cannot be dialled at all (a bad address or options). Gateways
// are served once it runs.
//
// Run may be called once: the local streams end when it returns.
func (r *Relay) Run(ctx context.Context) error {
	if !r.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	defer close(r.stopped)
	defer r.node.stopLocal()
	conn, err := dial(r.cfg)
	if err != nil {
		r.views.stop()
		return err
	}
	defer func() { _ = conn.Close() }()
	r.views.open(conn)
	defer r.views.stop() // before the connection closes
	r.node.conn = conn   // before the node's view runs: only its run reads it
	r.node.run(ctx)
	return nil
}

// Clients returns the status of every local stream, oldest first.
func (r *Relay) Clients() []ClientStatus {
	out := r.node.local.status()
	for _, v := range r.views.all() {
		out = append(out, v.local.status()...)
	}
	slices.SortStableFunc(out, func(a, b ClientStatus) int { return a.ConnectedSince.Compare(b.ConnectedSince) })
	return out
}

// Subscriptions returns what the node's upstream stream last subscribed
// to, by type label (lds, rds, cds, eds): sorted names, or ["*"] for
// wildcard. Types never subscribed on the current stream are absent.
func (r *Relay) Subscriptions() map[string][]string {
	return r.node.subscriptions()
}

// GatewayStatus is one gateway's view: what the relay asks the hub for in
// its name.
type GatewayStatus struct {
	// NodeID is the gateway's node ID, as it named itself (and the hub sees it).
	NodeID string `json:"nodeID"`
	// Streams counts its open local streams (0: the view is kept for a
	// while in case it comes back).
	Streams int `json:"streams"`
	// Upstream is what its upstream stream last subscribed to, as Subscriptions.
	Upstream map[string][]string `json:"upstream"`
}

// Gateways returns the gateways' views, by node ID.
func (r *Relay) Gateways() []GatewayStatus {
	return r.views.status()
}

// cacheLogger routes go-control-plane's logs into slog; its Info is chatty per watch, so it becomes Debug.
type cacheLogger struct{ l *slog.Logger }

func (f cacheLogger) Debugf(format string, args ...any) { f.log(slog.LevelDebug, format, args...) }
func (f cacheLogger) Infof(format string, args ...any)  { f.log(slog.LevelDebug, format, args...) }
func (f cacheLogger) Warnf(format string, args ...any)  { f.log(slog.LevelWarn, format, args...) }
func (f cacheLogger) Errorf(format string, args ...any) { f.log(slog.LevelError, format, args...) }

func (f cacheLogger) log(level slog.Level, format string, args ...any) {
	if !f.l.Enabled(context.Background(), level) {
		return
	}
	f.l.Log(context.Background(), level, fmt.Sprintf(format, args...))
}
