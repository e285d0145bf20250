package relay

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/utils/clock"

	"github.com/navemesh/nave/internal/xdstype"
	"github.com/navemesh/nave/xds"
)

// viewFor returns the view a local stream (ctx is its) whose first request
// is first is served from, and the function to call when the stream ends.
func (r *Relay) viewFor(ctx context.Context, first *discovery.DiscoveryRequest) (*view, func(), error) {
	node := first.GetNode()
	if !isGateway(node) {
		return r.node, func() {}, nil
	}
	return r.views.acquire(ctx, node)
}

// isGateway says whether a node is a gateway: the hub serves it
// listeners, routes and clusters of its own, built from its metadata.
func isGateway(node *core.Node) bool {
	_, ok := node.GetMetadata().GetFields()[xdstype.MetadataGateway]
	return ok
}

// gatewayViews holds a view per gateway: its own upstream stream, which
// names the gateway's node, so the hub serves it what it would serve the
// gateway connected directly. Gateways are told apart by what the hub
// reads of their node (ID, cluster, locality, metadata): a restarted
// gateway, or a hot-restarted or upgraded Envoy, finds its view again. A
// view with no local stream is dropped after Config.RetainUnwanted, or
// sooner when another gateway needs its room (MaxGateways).
type gatewayViews struct {
	r *Relay
	// ctx ends every view's upstream stream (stop).
	ctx    context.Context
	cancel context.CancelFunc
	// running counts the views' upstream goroutines.
	running sync.WaitGroup

	mu    sync.Mutex
	views map[string]*gatewayView
	made  int // views made so far: each view's version prefix has its number
	// conn is the connection to the hub, set once Run opens it (and closes
	// opened): a gateway's stream waits for it.
	conn    *grpc.ClientConn
	opened  chan struct{}
	stopped bool
}

// gatewayView is one gateway's view and its use.
type gatewayView struct {
	*view
	key     string
	streams int
	// idle, while no stream uses the view (since idleSince), drops it when
	// it fires, unless the view was taken up again since it was set (gen
	// changed).
	idle      clock.Timer
	idleSince time.Time
	gen       int
	// stop ends the view's upstream stream and its local streams.
	stop context.CancelFunc
}

func newGatewayViews(r *Relay) *gatewayViews {
	ctx, cancel := context.WithCancel(context.Background())
	return &gatewayViews{r: r, ctx: ctx, cancel: cancel, views: map[string]*gatewayView{}, opened: make(chan struct{})}
}

// maxGatewayMetadata bounds a gateway's node metadata, as the hub does by
// default (xds.Config.MaxNodeMetadataBytes): the hub would refuse a larger
// one, and the view would ask again forever while the gateway waited.
const maxGatewayMetadata = 64 << 10

// acquire returns the view of the gateway node (made on first use, once
// Run runs) and the function that gives it back when the stream ends; ctx
// is the stream's.
func (g *gatewayViews) acquire(ctx context.Context, node *core.Node) (*view, func(), error) {
	limit := g.r.cfg.MaxGateways
	if limit <= 0 {
		return nil, nil, status.Error(codes.FailedPrecondition, "relay: this node agent serves no gateways: connect to the hub")
	}
	if node.GetId() == "" {
		return nil, nil, status.Error(codes.InvalidArgument, "relay: a gateway's node needs an ID")
	}
	upstream := behindRelay(node, g.r.cfg.Node)
	if field, size := xds.OversizedNodeField(upstream); field != "" {
		// The hub would refuse it, and the view would ask again forever.
		return nil, nil, status.Errorf(codes.InvalidArgument, "relay: the gateway's node %s is %d bytes; at most %d", field, size, xds.MaxNodeFieldBytes)
	}
	if size := proto.Size(upstream.GetMetadata()); size > maxGatewayMetadata {
		return nil, nil, status.Errorf(codes.InvalidArgument, "relay: the gateway's node metadata is %d bytes; at most %d", size, maxGatewayMetadata)
	}
	// What the hub reads of a node: an Envoy upgrade (another build, other
	// extensions) finds its view again.
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&core.Node{Id: node.GetId(), Cluster: node.GetCluster(),
		Locality: node.GetLocality(), Metadata: node.GetMetadata()})
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "relay: gateway node: %v", err)
	}
	key := string(b)
	select {
	case <-g.opened:
	case <-g.r.stopped:
		return nil, nil, errStopping
	case <-ctx.Done():
		return nil, nil, status.FromContextError(ctx.Err()).Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return nil, nil, errStopping
	}
	gv := g.views[key]
	if gv == nil {
		if len(g.views) >= limit && !g.retireIdlest() {
			g.r.log.Warn("too many gateways on this node; refusing another", "node", node.GetId(), "limit", limit)
			return nil, nil, status.Errorf(codes.ResourceExhausted, "relay: serving %d gateways already (the limit)", limit)
		}
		gv = g.start(key, node.GetId(), upstream)
	}
	gv.streams++
	gv.gen++
	if gv.idle != nil {
		gv.idle.Stop()
		gv.idle = nil
	}
	return gv.view, func() { g.release(gv) }, nil
}

// open lets gateways be served, their streams on conn.
func (g *gatewayViews) open(conn *grpc.ClientConn) {
	g.mu.Lock()
	g.conn = conn
	g.mu.Unlock()
	close(g.opened)
}

// start makes a gateway's view, upstream in the name of the node
// upstream, and runs its upstream stream. Called with mu held.
func (g *gatewayViews) start(key, id string, upstream *core.Node) *gatewayView {
	r := g.r
	g.made++
	log := r.log.With("gateway", id)
	v := newView(r.cfg, upstream, id, fmt.Sprintf("%sgw%d-", r.prefix, g.made), g.conn, r.metrics, log)
	ctx, stop := context.WithCancel(g.ctx)
	gv := &gatewayView{view: v, key: key, stop: stop}
	g.views[key] = gv
	r.metrics.gateways.Set(float64(len(g.views)))
	g.running.Go(func() { v.run(ctx) })
	log.Info("serving a gateway a view of its own", "locality", upstream.GetLocality().String())
	return gv
}

// release gives back a stream's use of gv; the view is dropped once no
// stream has used it for RetainUnwanted.
func (g *gatewayViews) release(gv *gatewayView) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gv.streams--
	if gv.streams > 0 || g.stopped {
		return
	}
	gen := gv.gen
	gv.idleSince = g.r.cfg.Clock.Now()
	// The callback only starts the retirement: a clock may run it holding
	// its own lock (a fake clock's Step does), which retire takes again.
	gv.idle = g.r.cfg.Clock.AfterFunc(g.r.cfg.RetainUnwanted, func() { go g.idleExpired(gv, gen) })
}

// idleExpired drops gv if it is still unused since generation gen went idle.
func (g *gatewayViews) idleExpired(gv *gatewayView, gen int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.stopped && gv.gen == gen && gv.streams == 0 && g.views[gv.key] == gv {
		g.retire(gv, "gateway gone; its view is dropped")
	}
}

// retireIdlest drops the view unused the longest, if one is unused, to
// make room for another. Called with mu held.
func (g *gatewayViews) retireIdlest() bool {
	var idlest *gatewayView
	for _, gv := range g.views {
		if gv.streams == 0 && (idlest == nil || gv.idleSince.Before(idlest.idleSince)) {
			idlest = gv
		}
	}
	if idlest == nil {
		return false
	}
	idlest.idle.Stop()
	g.retire(idlest, "another gateway needs room; the view unused the longest is dropped")
	return true
}

// retire drops gv, unused. Called with mu held.
func (g *gatewayViews) retire(gv *gatewayView, why string) {
	delete(g.views, gv.key)
	g.r.metrics.gateways.Set(float64(len(g.views)))
	gv.stop()
	gv.log.Info(why, "unused for", g.r.cfg.Clock.Since(gv.idleSince).Round(time.Millisecond))
}

// stop ends every view and waits for their upstream goroutines.
func (g *gatewayViews) stop() {
	g.mu.Lock()
	g.stopped = true
	for _, gv := range g.views {
		if gv.idle != nil {
			gv.idle.Stop()
		}
	}
	clear(g.views)
	g.r.metrics.gateways.Set(0)
	g.mu.Unlock()
	g.cancel()
	g.running.Wait()
}

// all returns the views.
func (g *gatewayViews) all() []*view {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*view, 0, len(g.views))
	for _, gv := range g.views {
		out = append(out, gv.view)
	}
	return out
}

// status returns the views' status, by node ID.
func (g *gatewayViews) status() []GatewayStatus {
	g.mu.Lock()
	out := make([]GatewayStatus, 0, len(g.views))
	views := make([]*view, 0, len(g.views))
	for _, gv := range g.views {
		out = append(out, GatewayStatus{NodeID: gv.cfg.Node.GetId(), Streams: gv.streams})
		views = append(views, gv.view)
	}
	g.mu.Unlock()
	for i, v := range views {
		out[i].Upstream = v.subscriptions()
	}
	slices.SortFunc(out, func(a, b GatewayStatus) int { return cmp.Compare(a.NodeID, b.NodeID) })
	return out
}

// behindRelay is the node a gateway's view names upstream: the gateway's
// own, completed from the relay's node (the node it runs on) where it says
// nothing: its locality, and its cluster and network metadata.
func behindRelay(gateway, relay *core.Node) *core.Node {
	n := proto.CloneOf(gateway)
	if n.GetLocality().GetRegion() == "" && n.GetLocality().GetZone() == "" && n.GetLocality().GetSubZone() == "" {
		n.Locality = proto.CloneOf(relay.GetLocality())
	}
	if n.Cluster == "" {
		n.Cluster = relay.GetCluster()
	}
	if n.Metadata == nil {
		n.Metadata = &structpb.Struct{}
	}
	if n.Metadata.Fields == nil {
		n.Metadata.Fields = map[string]*structpb.Value{}
	}
	for _, k := range []string{xdstype.MetadataCluster, xdstype.MetadataNetwork} {
		if _, ok := n.Metadata.Fields[k]; !ok {
			if v, ok := relay.GetMetadata().GetFields()[k]; ok {
				n.Metadata.Fields[k] = proto.CloneOf(v)
			}
		}
	}
	return n
}
