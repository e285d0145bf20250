package xds

import (
	"context"
	"log/slog"
	"maps"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/limits"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/syncstatus"
)

// Config is what an operator tunes of the xDS server: its bounds.
type Config struct {
	// MaxLocalityGroups bounds how many locality groups get their own EDS cache
	// (clients choose their locality, so this bounds memory). At the bound a new
	// group replaces the least recently used idle one; when every group is
	// held by an open stream, the new stream is refused (ResourceExhausted).
	MaxLocalityGroups int
	// MaxResourceNames bounds the resource names one request may name (a
	// subscription beyond it is refused and the stream ended), and
	// MaxNodeMetadataBytes the size of a node's metadata.
	MaxResourceNames     int
	MaxNodeMetadataBytes int
	// RequestsPerSecond and RequestBurst bound how fast one stream's
	// requests (subscriptions, ACKs and NACKs) are taken (0: no bound); a
	// client beyond them waits, and its pushes coalesce meanwhile.
	RequestsPerSecond float64
	RequestBurst      int
}

// DefaultConfig allows up to 1024 locality groups (a large multi-region
// fleet has tens). A bound of groups, names or metadata left zero takes its
// value here.
func DefaultConfig() Config {
	return Config{MaxLocalityGroups: 1024, MaxResourceNames: 50_000, MaxNodeMetadataBytes: 64 << 10,
		RequestsPerSecond: 200, RequestBurst: 400}
}

// Wiring is what the process hands the server at start, beside its Config:
// who the server is and what it works with. The zero value is a server of
// its own that serves every client alike and reports to no one.
type Wiring struct {
	// Replica names this server in the sync status of its clients (see Clients).
	Replica string
	// VersionPrefix starts every version the server sends. Give each hub
	// replica, and each start of it, its own, so a client that reconnects
	// to another replica never mistakes that replica's counters for the
	// ones it acknowledged.
	VersionPrefix string
	// Audience, if not nil, serves gateways resources of their own (see Audience).
	Audience Audience
	// Tracer, if not nil, is told what becomes of traced changes (see Tracer).
	Tracer Tracer
	// Restrict, when set, says for each new stream (from its context: the
	// client's TLS identity) what it may receive and who it is, for logs;
	// a nil Restriction allows everything, an error refuses the stream.
	// Every request of a restricted stream is cut down to what it allows.
	Restrict func(ctx context.Context) (allow Restriction, who string, err error)
}

// setup is a server's Config and Wiring together.
type setup struct {
	Config
	Wiring
}

// Server serves the registry over xDS (ADS and the separate LDS, RDS, CDS and
// EDS services; state of the world and delta). Listeners, routes and clusters
// live in caches shared by every client; endpoints in one cache per client
// locality group, created when the first client of the group asks. Every cache
// versions each resource separately, so a change resends only the resources it
// changed.
type Server struct {
	cfg     setup
	log     *slog.Logger
	metrics *metrics
	xds     serverv3.Server
	// refusals logs what clients send that the server refuses (and their
	// NACKs), rate-limited per reason, every string of theirs cut short.
	refusals *limits.RefusalLog

	// The shared caches. Their staged state is guarded by stateMu.
	lds, rds, cds *resourceCache
	// groups maps a locality group to its EDS cache. Copy-on-write under
	// stateMu, so a watch finds its group's cache without waiting for Update.
	groups atomic.Pointer[map[Client]*resourceCache]
	// topo is the network topology EDS is computed against (SetNetworks);
	// replaced, never modified.
	topo atomic.Pointer[topology]
	// views maps an audience group to its caches; copy-on-write under stateMu.
	views atomic.Pointer[map[string]*view]

	// stateMu guards what was last translated: Update holds it, and so does the
	// creation of a locality group's EDS cache.
	stateMu sync.Mutex
	reg     *registry.Registry
	built   bool
	// networks is what SetNetworks was last given.
	networks registry.Networks
	// ports are the service ports published per service.
	ports map[registry.ServiceKey][]registry.ServicePort
	// endpoints holds, by cluster name, the last valid xDS form of each service
	// port's endpoints, from which every locality group's assignment is derived.
	endpoints map[string]assigner
	// backends records what each route configuration sends requests to.
	backends *backendIndex

	// pushMu guards the push-latency bookkeeping.
	pushMu sync.Mutex
	// pushes holds, per cache version prefix, the latest version and when the Update that made it started.
	pushes map[string]pushStamp
	// status tracks every stream: what it asks for, was sent and acknowledged.
	status   *syncstatus.Tracker
	dispatch *dispatchCache

	restrict restrictions
	throttle *throttle
	names    *nameTable
	// table bounds the locality and gateway groups (groups.go).
	table *groupTable
}

// streamKey names a stream: sotw and delta streams are numbered separately.
type streamKey struct {
	delta bool
	id    int64
}

// NewServer returns a server with empty caches; call Update to fill them and
// Register to serve them. Metrics are registered on reg (nil: not registered).
func NewServer(cfg Config, w Wiring, log *slog.Logger, reg prometheus.Registerer) *Server {
	def := DefaultConfig()
	if cfg.MaxLocalityGroups <= 0 {
		cfg.MaxLocalityGroups = def.MaxLocalityGroups
	}
	if cfg.MaxResourceNames <= 0 {
		cfg.MaxResourceNames = def.MaxResourceNames
	}
	if cfg.MaxNodeMetadataBytes <= 0 {
		cfg.MaxNodeMetadataBytes = def.MaxNodeMetadataBytes
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "xds")
	s := &Server{
		cfg:       setup{cfg, w},
		log:       log,
		refusals:  limits.NewRefusalLog(log, 0, 0),
		metrics:   newMetrics(reg),
		ports:     map[registry.ServiceKey][]registry.ServicePort{},
		endpoints: map[string]assigner{},
		backends:  newBackendIndex(),
		pushes:    map[string]pushStamp{},
		status:    syncstatus.New(w.Replica),
		restrict:  restrictions{byStream: map[streamKey]*streamRestriction{}, byNode: map[*core.Node]*streamRestriction{}},
		throttle:  newThrottle(cfg.RequestsPerSecond, cfg.RequestBurst),
		names:     newNameTable(maxInterned),
	}
	s.lds = newResourceCache(resource.ListenerType, w.VersionPrefix+"lds-", log, nil, nil)
	s.rds = newResourceCache(resource.RouteType, w.VersionPrefix+"rds-", log, nil, nil)
	s.cds = newResourceCache(resource.ClusterType, w.VersionPrefix+"cds-", log, nil, nil)
	s.groups.Store(&map[Client]*resourceCache{})
	s.topo.Store(newTopology(registry.Networks{}))
	s.views.Store(&map[string]*view{})
	s.table = newGroupTable(reg)
	s.dispatch = &dispatchCache{lds: s.lds, rds: s.rds, cds: s.cds, eds: s.edsCache, view: s.viewFor, restriction: s.restrictionOf, log: log}
	// The streams end when the gRPC server stops; nothing else needs to end them.
	s.xds = serverv3.NewServer(context.Background(), s.dispatch, s.callbacks(), sotw.WithLogger(cacheLogger(log)))
	return s
}

// Register registers the aggregated discovery service and the separate LDS,
// RDS, CDS and EDS services on g.
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, s.xds)
	routeservice.RegisterRouteDiscoveryServiceServer(g, s.xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, s.xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, s.xds)
}

// Update publishes registry r, which differs from the registry of the
// previous call by d. Call it from one goroutine after every registry change
// (a caller that coalesces changes must merge their diffs). The first call
// rebuilds everything whatever d says, so it may pass an empty diff.
//
// Only what d names is translated again: an endpoint change rebuilds the
// endpoints of that service once, derives the ClusterLoadAssignment of every
// locality group from them, and sends only those whose content changed;
// listeners, routes and clusters follow only shape changes. Update does not
// wait for clients.
func (s *Server) Update(r *registry.Registry, d registry.Diff) {
	start := time.Now()
	s.stateMu.Lock()
	defer s.stateMu.Unlock()

	changes := d.Services
	shapes := !s.built
	if !s.built {
		changes = s.everything(r)
		s.built = true
	}
	s.reg = r
	if len(changes) == 0 {
		return
	}
	groups := *s.groups.Load()
	var traced []registry.ServiceKey
	var routing routingChanges
	for _, c := range changes {
		if s.cfg.Tracer != nil && s.cfg.Tracer.Tracing(c.Key) {
			traced = append(traced, c.Key)
		}
		shapes = shapes || c.ShapeChanged
		svc := r.Service(c.Key)
		ports := ServicePorts(svc)
		for _, old := range s.ports[c.Key] {
			if !hasPort(ports, old.Port) {
				s.deletePort(c.Key, old.Port, groups, &routing)
			}
		}
		if c.ShapeChanged {
			for _, p := range ports {
				s.stageShape(svc, p, r, &routing)
			}
			routing.init()
			routing.rerouteUsersOf(s.backends, c.Key) // its policy may have changed
		}
		if c.ShapeChanged || c.EndpointsChanged {
			s.touchLocal(c.Key, ports, &routing)
		}
		if c.ShapeChanged || c.EndpointsChanged {
			for _, p := range ports {
				s.stageEndpoints(svc, p, groups)
			}
		}
		if len(ports) == 0 {
			delete(s.ports, c.Key)
		} else {
			s.ports[c.Key] = ports
		}
	}
	s.stageRouting(&routing, r, groups)
	// Traced changes are told what carries them before the caches publish
	// them, so that no push of them goes unseen.
	for _, k := range traced {
		typeURL, names, published := s.stagedOf(k, groups)
		s.cfg.Tracer.Translated(k, r.Version(), typeURL, names, published)
	}
	// Endpoints and clusters before routes and listeners: a client that learns of
	// a new listener finds what it points to already there.
	for _, eds := range groups {
		s.flush(eds, start)
	}
	s.flush(s.cds, start)
	s.flush(s.rds, start)
	s.flush(s.lds, start)
	if shapes {
		s.rebuildViews(start)
	}
	s.metrics.updateDuration.Observe(time.Since(start).Seconds())
}

// SetNetworks sets the network topology that split-horizon EDS is computed
// against (see networks.go) and republishes the assignments it changes: when
// a cluster changes network every service port is rebuilt, when only
// gateways change only the assignments of clients that name a network.
// Call it from the goroutine that calls Update.
func (s *Server) SetNetworks(n registry.Networks) {
	start := time.Now()
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if n.Equal(s.networks) {
		return
	}
	rebuild := !maps.Equal(n.Clusters, s.networks.Clusters)
	s.networks = n
	t := newTopology(n)
	s.topo.Store(t)
	if !s.built {
		return // the first Update builds everything against it
	}
	groups := *s.groups.Load()
	if rebuild {
		// Every block was split by the old cluster-to-network map.
		var locals []BackendRef
		for _, a := range s.endpoints {
			if l, ok := a.(*localBackend); ok {
				locals = append(locals, l.ref)
			}
		}
		clear(s.endpoints)
		for k, ports := range s.ports {
			svc := s.reg.Service(k)
			for _, p := range ports {
				s.stageEndpoints(svc, p, groups)
			}
		}
		for _, b := range s.backends.placeholders {
			s.stagePlaceholderEndpoints(b, groups)
		}
		for _, b := range locals {
			s.stageLocalEndpoints(b, groups, true)
		}
	} else {
		for name, pe := range s.endpoints {
			for client, eds := range groups {
				if client.Network != "" {
					cla, sum := pe.forClient(client, t)
					eds.stage(name, cla, sum)
				}
			}
		}
	}
	for _, eds := range groups {
		s.flush(eds, start)
	}
	s.rebuildViews(start)
	s.metrics.updateDuration.Observe(time.Since(start).Seconds())
	s.log.Info("network topology changed", "clusters", len(n.Clusters), "networks with gateways", len(t.gateways), "rebuilt", rebuild)
}

// everything is a diff that touches every service in r and every service published so far.
func (s *Server) everything(r *registry.Registry) []registry.ServiceDiff {
	var out []registry.ServiceDiff
	seen := map[registry.ServiceKey]bool{}
	for _, svc := range r.Services() {
		seen[svc.Key] = true
		out = append(out, registry.ServiceDiff{Key: svc.Key, Kind: registry.Updated, ShapeChanged: true, EndpointsChanged: true})
	}
	for k := range s.ports {
		if !seen[k] {
			out = append(out, registry.ServiceDiff{Key: k, Kind: registry.Removed, ShapeChanged: true, EndpointsChanged: true})
		}
	}
	return out
}

func hasPort(ports []registry.ServicePort, number int32) bool {
	for _, p := range ports {
		if p.Port == number {
			return true
		}
	}
	return false
}

func (s *Server) deletePort(k registry.ServiceKey, port int32, groups map[Client]*resourceCache, routing *routingChanges) {
	name, cluster := ListenerName(k, port), ClusterName(k, port)
	s.lds.stageDelete(name)
	s.rds.stageDelete(name)
	s.cds.stageDelete(cluster)
	delete(s.endpoints, cluster)
	for _, eds := range groups {
		eds.stageDelete(cluster)
	}
	routing.init()
	s.backends.drop(name, routing.touched)
	routing.touched[cluster] = BackendRef{Key: k, Port: port}
	routing.rerouteUsersOf(s.backends, k)
}

// stage validates res and stages it; an invalid resource is logged, counted
// and not published (the last valid version, if any, stays served), and
// stage reports false.
func (s *Server) stage(c *resourceCache, name string, res types.Resource) bool {
	if err := Validate(res); err != nil {
		s.invalid(c.label, name, err)
		return false
	}
	c.stage(name, res, contentSum(res))
	return true
}

// stageEndpoints rebuilds the endpoints of svc's port once and stages the
// assignment of every locality group; if they are invalid, every group keeps
// the last valid assignment.
func (s *Server) stageEndpoints(svc *registry.Service, p registry.ServicePort, groups map[Client]*resourceCache) {
	t, name := s.topo.Load(), ClusterName(svc.Key, p.Port)
	var a assigner
	if lp := localityPolicy(svc); lp != nil {
		a = newPolicyEndpoints(name, svc, p, lp, t)
	} else {
		prev, _ := s.endpoints[name].(*portEndpoints)
		pe, err := newPortEndpoints(svc, p, prev, t)
		if err != nil {
			s.invalid(typeEDS, name, err)
			return
		}
		a = pe
	}
	s.endpoints[name] = a
	stageAll(name, a, groups, t)
}

func (s *Server) invalid(label, name string, err error) {
	s.metrics.invalid.WithLabelValues(label).Inc()
	s.log.Warn("generated resource is invalid; not publishing it", "type", label, "name", name, "err", err)
}

func (s *Server) flush(c *resourceCache, start time.Time) {
	version, changed, err := c.flush()
	if changed > 0 {
		s.metrics.updates.WithLabelValues(c.label).Add(float64(changed))
	}
	if err != nil {
		s.log.Error("publish resources", "type", c.label, "err", err)
		return
	}
	if version == "" {
		return
	}
	s.pushMu.Lock()
	s.pushes[c.prefix] = pushStamp{version: version, at: start}
	s.pushMu.Unlock()
}

func (s *Server) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, id int64, typeURL string) error {
			s.metrics.connected.Inc()
			s.status.Open(syncstatus.Stream{ID: id}, typeURL)
			return s.openStream(ctx, streamKey{false, id})
		},
		StreamClosedFunc: func(id int64, _ *core.Node) {
			s.metrics.connected.Dec()
			s.forgetStream(false, id)
			s.closeStream(streamKey{false, id})
			s.releaseGroups(streamKey{false, id})
		},
		DeltaStreamOpenFunc: func(ctx context.Context, id int64, typeURL string) error {
			s.metrics.connected.Inc()
			s.status.Open(syncstatus.Stream{Delta: true, ID: id}, typeURL)
			return s.openStream(ctx, streamKey{true, id})
		},
		DeltaStreamClosedFunc: func(id int64, _ *core.Node) {
			s.metrics.connected.Dec()
			s.forgetStream(true, id)
			s.closeStream(streamKey{true, id})
			s.releaseGroups(streamKey{true, id})
		},
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			if err := s.admit(req.GetNode(), len(req.GetResourceNames())); err != nil {
				return err
			}
			s.names.intern(req.ResourceNames)
			if s.throttle.wait(streamKey{false, id}) {
				s.metrics.throttled.Inc()
			}
			if s.cfg.Restrict != nil {
				s.restrictRequest(streamKey{false, id}, &req.Node, req.GetTypeUrl(), req.GetResourceNames())
			}
			if err := s.holdGroups(streamKey{false, id}, &req.Node); err != nil {
				return err
			}
			if a := s.status.Request(id, req); a.Nonce != "" && s.cfg.Tracer != nil {
				s.cfg.Tracer.Answered(syncstatus.Stream{ID: id}, a.TypeURL, a.Nonce, a.ACK)
			}
			s.onRequest(false, id, req.GetTypeUrl(), req.GetNode(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil, req.GetResponseNonce())
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, req *discovery.DeltaDiscoveryRequest) error {
			if err := s.admit(req.GetNode(), len(req.GetResourceNamesSubscribe())); err != nil {
				return err
			}
			s.names.intern(req.ResourceNamesSubscribe)
			if s.throttle.wait(streamKey{true, id}) {
				s.metrics.throttled.Inc()
			}
			if s.cfg.Restrict != nil {
				s.restrictRequest(streamKey{true, id}, &req.Node, req.GetTypeUrl(), req.GetResourceNamesSubscribe())
			}
			if err := s.holdGroups(streamKey{true, id}, &req.Node); err != nil {
				return err
			}
			if a := s.status.DeltaRequest(id, req); a.Nonce != "" && s.cfg.Tracer != nil {
				s.cfg.Tracer.Answered(syncstatus.Stream{Delta: true, ID: id}, a.TypeURL, a.Nonce, a.ACK)
			}
			s.onRequest(true, id, req.GetTypeUrl(), req.GetNode(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil, req.GetResponseNonce())
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			before := s.status.Response(id, req.GetTypeUrl(), resp)
			if t := s.cfg.Tracer; t != nil && before.Acked != "" && t.Collecting() {
				t.Pushed(syncstatus.Stream{ID: id}, req.GetNode().GetId(), req.GetTypeUrl(), resp.GetNonce(), resp.GetVersionInfo(), responseNames(resp), before)
			}
			s.onResponse(req.GetTypeUrl(), resp.GetVersionInfo(), before.Asked)
		},
		StreamDeltaResponseFunc: func(id int64, req *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
			before := s.status.DeltaResponse(id, req.GetTypeUrl(), resp)
			if t := s.cfg.Tracer; t != nil && before.Acked != "" && t.Collecting() {
				stream := syncstatus.Stream{Delta: true, ID: id}
				t.Pushed(stream, s.status.Node(stream).GetId(), req.GetTypeUrl(), resp.GetNonce(), resp.GetSystemVersionInfo(), deltaResponseNames(resp), before)
			}
			s.onResponse(req.GetTypeUrl(), resp.GetSystemVersionInfo(), before.Asked)
		},
	}
}

func (s *Server) onRequest(delta bool, id int64, typeURL string, node *core.Node, nackDetail string, nack bool, nonce string) {
	now := time.Now()
	if nack {
		s.metrics.nacks.WithLabelValues(typeLabel(typeURL)).Inc()
		if !s.throttle.logNACK(streamKey{delta, id}, now) {
			return
		}
		// Every string here is the client's: the log cuts them short.
		s.refusals.Warn(logNACK, "client rejected a response (NACK)", "type", typeLabel(typeURL), "node", node.GetId(),
			"locality", node.GetLocality().String(), "nonce", nonce, "delta", delta, "detail", nackDetail)
	}
}

// onResponse counts a response and, when it is a push, its latency; asked
// is when its stream last asked for the type.
func (s *Server) onResponse(typeURL, version string, asked time.Time) {
	label := typeLabel(typeURL)
	s.metrics.responses.WithLabelValues(label).Inc()
	prefix := strings.TrimRight(version, "0123456789")
	s.pushMu.Lock()
	stamp, ok := s.pushes[prefix]
	s.pushMu.Unlock()
	// A push is a response to a change made after the client last asked; a reply
	// to a fresh request measures the client, not the push, and is not counted.
	if ok && stamp.version == version && asked.Before(stamp.at) {
		s.metrics.pushLatency.WithLabelValues(label).Observe(time.Since(stamp.at).Seconds())
	}
}

func (s *Server) forgetStream(delta bool, id int64) {
	s.throttle.forget(streamKey{delta, id})
	s.status.Close(syncstatus.Stream{Delta: delta, ID: id})
	if s.cfg.Tracer != nil {
		s.cfg.Tracer.Closed(syncstatus.Stream{Delta: delta, ID: id})
	}
}

// Reasons a request is refused.
const (
	reasonTooManyNames      = "too_many_names"
	reasonMetadataTooLarge  = "metadata_too_large"
	reasonNodeFieldTooLarge = "node_field_too_large"
)

// Reasons the server logs what clients send, besides refusals, rate-limited.
const (
	logNACK   = "nack"
	logDenied = "denied"
)

// MaxNodeFieldBytes bounds each string of a client's node that the
// server keeps, shows or groups clients by: its ID and cluster, its
// locality's region, zone and sub-zone, its user agent's name and
// version, and the NETWORK and CLUSTER_ID of its metadata. It leaves room
// for a node agent's ID ("nave-node~" and a 253-byte node name) and
// Istio's sidecar IDs.
const MaxNodeFieldBytes = 512

// admit refuses a request that names more resources than MaxResourceNames,
// or carries a node with a string longer than MaxNodeFieldBytes or
// metadata larger than MaxNodeMetadataBytes: the stream ends with a status
// saying why, before anything of the node is kept, and the refusal is
// counted (and logged, rate-limited). A client holds what it was sent before.
func (s *Server) admit(node *core.Node, names int) error {
	if names > s.cfg.MaxResourceNames {
		s.metrics.refused.WithLabelValues(reasonTooManyNames).Inc()
		s.refusals.Warn(reasonTooManyNames, "refused an xDS request naming too many resources", "node", node.GetId(), "names", names, "limit", s.cfg.MaxResourceNames)
		return status.Errorf(codes.ResourceExhausted, "the request names %d resources; at most %d per request", names, s.cfg.MaxResourceNames)
	}
	if field, size := OversizedNodeField(node); field != "" {
		s.metrics.refused.WithLabelValues(reasonNodeFieldTooLarge).Inc()
		s.refusals.Warn(reasonNodeFieldTooLarge, "refused an xDS request whose node has a string too long", "node", node.GetId(),
			"field", field, "bytes", size, "limit", MaxNodeFieldBytes)
		return status.Errorf(codes.InvalidArgument, "the node's %s is %d bytes; at most %d", field, size, MaxNodeFieldBytes)
	}
	if md := node.GetMetadata(); md != nil {
		if size := proto.Size(md); size > s.cfg.MaxNodeMetadataBytes {
			s.metrics.refused.WithLabelValues(reasonMetadataTooLarge).Inc()
			s.refusals.Warn(reasonMetadataTooLarge, "refused an xDS request whose node metadata is too large", "node", node.GetId(), "bytes", size, "limit", s.cfg.MaxNodeMetadataBytes)
			return status.Errorf(codes.InvalidArgument, "the node's metadata is %d bytes; at most %d", size, s.cfg.MaxNodeMetadataBytes)
		}
	}
	return nil
}

// OversizedNodeField names the first of node's strings (see
// MaxNodeFieldBytes) longer than MaxNodeFieldBytes, and its size; "" when
// none is.
func OversizedNodeField(node *core.Node) (string, int) {
	if node == nil {
		return "", 0
	}
	l, md := node.GetLocality(), node.GetMetadata().GetFields()
	for _, f := range [...]struct {
		name  string
		value string
	}{
		{"id", node.GetId()},
		{"cluster", node.GetCluster()},
		{"locality region", l.GetRegion()},
		{"locality zone", l.GetZone()},
		{"locality sub_zone", l.GetSubZone()},
		{"user_agent_name", node.GetUserAgentName()},
		{"user_agent_version", node.GetUserAgentVersion()},
		{"metadata " + MetadataNetwork, md[MetadataNetwork].GetStringValue()},
		{"metadata " + MetadataCluster, md[MetadataCluster].GetStringValue()},
	} {
		if len(f.value) > MaxNodeFieldBytes {
			return f.name, len(f.value)
		}
	}
	return "", 0
}

// edsPrefix is the version prefix of a locality group's EDS cache: unique
// per group, so that no two caches' versions can be taken for each other
// (the group's names are escaped: "/" and "|" separate them).
func edsPrefix(group Client) string {
	esc := url.PathEscape
	prefix := "eds-" + esc(group.Locality.Region) + "/" + esc(group.Locality.Zone) + "-"
	if group.Network != "" {
		only := ""
		if group.NetworkOnly {
			only = "|only"
		}
		prefix = "eds-" + esc(string(group.Network)) + only + "/" + esc(group.Locality.Region) + "/" + esc(group.Locality.Zone) + "-"
	}
	if group.Cluster != "" {
		prefix = strings.TrimSuffix(prefix, "-") + "|" + esc(string(group.Cluster)) + "-"
	}
	return prefix
}
