// Package hub is the hub process: it wires the federation server, the merged
// registry, the xDS server, etcd and the admin HTTP API together.
package hub

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/convergence"
	"github.com/navemesh/nave/exportpolicy"
	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/gateways"
	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/limits"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
	"github.com/navemesh/nave/xds"
)

// Config configures a hub replica.
type Config struct {
	// ID names this replica (default: the host name).
	ID string
	// DataDir holds the embedded etcd's data.
	DataDir string
	// FederationAddr, XDSAddr and AdminAddr are listen addresses (port 0 picks one).
	FederationAddr, XDSAddr, AdminAddr string
	// EtcdEndpoints of an external etcd; empty runs an embedded one in DataDir.
	EtcdEndpoints []string
	// EtcdPrefix is where the hub's keys live in etcd.
	EtcdPrefix string
	// TokensFile maps cluster IDs to spoke tokens; empty admits every spoke (development only).
	TokensFile string
	// TLSCertFile and TLSKeyFile make the federation server speak TLS (PEM
	// files); without them spokes connect in plaintext and tokens travel in clear.
	TLSCertFile, TLSKeyFile string
	// Join names peer replicas to form one hub with (host:port of their
	// gossip address, or a DNS name that resolves to all of them, such as a
	// headless Service). Replicas need a shared etcd (EtcdEndpoints).
	Join []string
	// GossipAddr is this replica's gossip listen address (TCP and UDP); gossip
	// runs when it or Join is set. AdvertiseHost is the host peers reach this
	// replica's servers at (default: the gossip address's host, or the
	// first non-loopback address).
	GossipAddr, AdvertiseHost string
	// EtcdTLS authenticates an external etcd (--etcd-endpoints) over TLS.
	EtcdTLS EtcdTLS
	// ColdStartWait bounds how long a replica that starts without some of
	// the clusters its catalog knows (no snapshot, or an older one) waits
	// for them to resync before it serves xDS, so that no client is
	// handed a world in part (clients keep their last configuration
	// meanwhile). 0 serves at once.
	ColdStartWait time.Duration
	// AdminTokenFile, when set, holds the bearer token the admin address
	// requires for everything but /healthz and /readyz (re-read when the
	// file changes); empty leaves the admin API open (bind it to localhost).
	AdminTokenFile string
	// PeerTokenFile holds the token replicas present to each other; empty
	// leaves replication open (development only).
	PeerTokenFile string
	// PeerCAFile is the CA that signed the replicas' federation certificates
	// (with TLSCertFile): replicas verify each other with it.
	PeerCAFile string
	// ClientCAFile (with TLSCertFile) makes the federation port ask peers
	// for client certificates signed by this CA: a spoke's names its
	// cluster (spiffe://TRUST-DOMAIN/nave/cluster/ID) and publishes for it
	// only; a replica's names the replica (.../nave/replica/ID, which
	// TLSCertFile must then carry) and replicates only. Without tokens, a
	// certificate is required.
	ClientCAFile string
	// TrustDomain is the trust domain of every identity (required; DefaultConfig sets cluster.local).
	TrustDomain string
	// CRLFile is a revocation list signed by ClientCAFile's (or
	// XDSClientCAFile's) CA: a revoked certificate is refused, and its
	// open sessions end when the list is reloaded.
	CRLFile string
	// XDSTLSCertFile and XDSTLSKeyFile make the xDS port speak TLS;
	// XDSClientCAFile makes it require client certificates signed by that
	// CA (mTLS). XDSPolicyFile (with mTLS) restricts what each client
	// identity may receive to some namespaces (see identity.Policy).
	XDSTLSCertFile, XDSTLSKeyFile, XDSClientCAFile, XDSPolicyFile string
	// ExportPolicyFile says which clusters may export into which namespaces
	// (see exportpolicy.Policy); empty: every cluster everywhere.
	ExportPolicyFile string
	// Connections bounds each port's connections and each peer's share of them.
	Connections ConnectionLimits
	// Liveness: when a cluster without a live spoke turns stale, and its policy.
	Liveness Liveness
	// SnapshotInterval is the least time between two persisted snapshots of
	// the registry (the leader saves one after changes); MaxSnapshotBytes
	// bounds one.
	SnapshotInterval time.Duration
	MaxSnapshotBytes int
	// SnapshotFormat is the format snapshots are written in: 2 (protobuf) or
	// 1 (JSON, what versions before format 2 read; for a downgrade).
	SnapshotFormat int
	// FastGossip uses test timings for gossip (failure detection in ~1s).
	FastGossip bool
	// ClustersetCIDRs are the ranges (at most one IPv4, one IPv6) clusterset
	// IPs of ClusterSetIP imports come from; none: imports carry no IPs and
	// each cluster allocates its own. A released IP is reused only after
	// ClustersetIPHoldDown (0: --drop-after plus five minutes, which is
	// longer than any DNS TTL).
	ClustersetCIDRs      []netip.Prefix
	ClustersetIPHoldDown time.Duration
	// IngressExposure is what an ingress gateway that names no exposure of
	// its own in its metadata exposes (the zero value: nothing).
	IngressExposure gateways.Exposure
	// Pprof serves Go's profiles at /debug/pprof on the admin address.
	Pprof       bool
	Federation  federation.HubConfig
	Replication replicas.ReplicationConfig
	XDS         xds.Config
}

// DefaultConfig returns the configuration `nave hub` starts with.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		ID:               host,
		DataDir:          "nave-data",
		FederationAddr:   ":15010",
		XDSAddr:          ":15011",
		AdminAddr:        ":15012",
		EtcdPrefix:       "/nave/",
		Liveness:         DefaultLiveness(),
		SnapshotInterval: 2 * time.Second,
		ColdStartWait:    30 * time.Second,
		TrustDomain:      identity.DefaultTrustDomain,
		MaxSnapshotBytes: 64 << 20,
		SnapshotFormat:   2,
		ClustersetCIDRs:  []netip.Prefix{netip.MustParsePrefix(DefaultClustersetCIDR)},
		Connections:      DefaultConnectionLimits(),
		Federation:       federation.DefaultHubConfig(),
		Replication:      replicas.DefaultReplicationConfig(),
		XDS:              xds.DefaultConfig(),
	}
}

// DefaultClustersetCIDR is where clusterset IPs come from by default: a
// range no cluster's own Service or pod range is likely to use.
const DefaultClustersetCIDR = "243.0.0.0/16"

// Hub is a running hub replica.
type Hub struct {
	// The addresses the hub listens on.
	FederationAddr, XDSAddr, AdminAddr net.Addr

	state *state
	coord *coordinator
	done  chan struct{}
	err   error
}

// Run runs a hub until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	h, err := Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	return h.Wait()
}

// Wait blocks until the hub has stopped (its context ended) and everything is released.
func (h *Hub) Wait() error {
	<-h.done
	return h.err
}

// View is the hub's current state.
func (h *Hub) View() *View { return h.state.View() }

// Start brings a hub up and returns once every server listens. The hub stops
// when ctx ends; Wait reports when it is done.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (_ *Hub, err error) {
	// 0. The configuration, every problem at once, before anything starts.
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &parts{cfg: cfg, log: log.With("hub", cfg.ID)}
	defer func() {
		if err != nil {
			p.stop() // whatever started stops, and whatever was acquired is released in reverse
		}
	}()
	// 1. Credentials: a spoke may only publish for the cluster its token names.
	if err := p.loadCredentials(); err != nil {
		return nil, err
	}
	// 1b. The export policy: which clusters may export into which namespaces.
	if err := p.loadExportPolicy(); err != nil {
		return nil, err
	}
	// 2. etcd: external, or embedded in the data dir.
	if err := p.connectEtcd(ctx); err != nil {
		return nil, err
	}
	// 3. Metrics, on a registry of the hub's own.
	p.registerMetrics()
	// 4. The xDS server and the state that feeds it.
	p.buildState()
	// 5. Servers: federation (authenticated) and xDS over gRPC, admin over HTTP.
	p.buildServers()
	// 6. Listen everywhere before serving anything, so a bad address fails fast.
	if err := p.listen(); err != nil {
		return nil, err
	}
	// 7. Catalog: clusters seen before show up (disconnected) until their spokes return.
	records, catalogKnown := p.readCatalog(ctx)
	// 8. Run: the state goroutine first, then the servers. Everything ends with ctx.
	if err := p.runState(ctx, records); err != nil {
		return nil, err
	}
	// 9. Warm start: serve the last persisted registry until live data
	// replaces it. With etcd unreachable, it goes on trying in the background
	// (it only ever fills in clusters older than what the hub holds).
	restored := catalogKnown && p.coord.restore(ctx)
	// 10. Coordination: etcd health, leadership, liveness.
	p.coordinate(restored)
	// 11. With peers: gossip and replication.
	if p.gossip {
		if err := p.joinReplicas(); err != nil {
			return nil, err
		}
	}
	// 12. Serve: federation at once, xDS once the restored registry is
	// translated (and, after a start without the catalog or the snapshot, once
	// both are read and the clusters they name are held), then admin.
	if err := p.serve(ctx, catalogKnown && restored); err != nil {
		return nil, err
	}
	p.log.Info("hub serving", "federation", p.fedLis.Addr(), "xds", p.xdsLis.Addr(), "admin", p.adminLis.Addr(), "etcd", p.endpoints)

	// 13. When ctx ends, stop: coordination, both gRPC servers together, admin,
	// the state; then release etcd and the listeners (parts.stop).
	h := &Hub{FederationAddr: p.fedLis.Addr(), XDSAddr: p.xdsLis.Addr(), AdminAddr: p.adminLis.Addr(), state: p.state, coord: p.coord, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		<-ctx.Done()
		p.log.Info("hub stopping")
		p.stop()
		p.log.Info("hub stopped")
	}()
	return h, nil
}

// parts are the pieces of a hub replica, in the order Start assembles them,
// and what stop needs to stop and release them.
type parts struct {
	cfg Config
	log *slog.Logger

	// Credentials (see credentials.go).
	tokens              *federation.TokenFile     // nil: no tokens
	peerTokens          *federation.PeerTokenFile // nil: none
	fedCerts, peerCerts *identity.Store           // nil without TLS on the federation port
	xdsCerts            *identity.Store           // nil without TLS on the xDS port
	policy              *identity.PolicyFile
	exportPolicy        *exportpolicy.File // nil: every cluster may export everywhere
	sessions            *identity.Sessions
	conns               *identity.Conns // the TLS connections, by client certificate
	adminToken          *adminToken     // nil: the admin API is open
	fedCreds, peerCreds credentials.TransportCredentials
	xdsCreds            credentials.TransportCredentials
	gossip              bool // with peer replicas (--join, --gossip-addr)

	// etcd.
	endpoints     []string
	etcd          *clientv3.Client
	catalog       *replicas.Catalog
	snapshots     *replicas.SnapshotStore
	clustersetIPs *replicas.ClusterSetIPs  // nil without clusterset CIDRs
	catalogKnown  bool                     // the catalog has been read (at start, or once etcd answered)
	catalog0      []replicas.ClusterRecord // what the catalog named when first read

	// Metrics.
	metricsReg  *prometheus.Registry
	metrics     *metrics
	grpcMetrics *grpcprom.ServerMetrics

	// The state, what it feeds, and what coordinates it with peers.
	xdsServer *xds.Server
	tracer    *convergence.Tracer
	gossipNow atomic.Pointer[replicas.Membership] // nil until gossip runs
	// xdsServing: xDS is served; withheld: why not yet (see withhold).
	xdsServing atomic.Bool
	withheld   atomic.Pointer[string]
	push       *pusher
	imports    *importer
	state      *state
	coord      *coordinator

	// Servers and their listeners.
	fedServer, xdsGRPC       *grpc.Server
	hubFed                   *federation.HubServer
	replWiring               replicas.ReplicationWiring // what both sides of replication work with
	adminServer              *http.Server
	fedLis, xdsLis, adminLis net.Listener

	// What runs, and how it stops: nil, empty or false until started.
	wg           sync.WaitGroup
	coordWG      sync.WaitGroup // coordination's goroutines: they end before the state stops
	stopState    context.CancelFunc
	coordCtx     context.Context
	stopCoord    context.CancelFunc
	servingMu    sync.Mutex     // guards serving and stopping: xDS may start serving after a cold start's wait
	serving      []*grpc.Server // the gRPC servers serving, stopped together
	stopping     bool           // stop has begun: nothing starts serving
	adminServing bool
	cleanup      []func() // run in reverse on failure or shutdown
}

// connectEtcd starts the embedded etcd when no endpoints are configured,
// connects to etcd, and opens the catalog and the snapshot store in it.
func (p *parts) connectEtcd(ctx context.Context) error {
	p.endpoints = p.cfg.EtcdEndpoints
	if len(p.endpoints) == 0 {
		if err := os.MkdirAll(p.cfg.DataDir, 0o700); err != nil {
			return fmt.Errorf("create data dir: %w", err)
		}
		e, endpoint, err := startEmbeddedEtcd(ctx, p.cfg.DataDir, p.log)
		if err != nil {
			return err
		}
		p.cleanup = append(p.cleanup, e.Close)
		p.endpoints = []string{endpoint}
	}
	var tlsCfg *tls.Config
	if p.cfg.EtcdTLS.enabled() {
		var err error
		if tlsCfg, err = p.cfg.EtcdTLS.clientConfig(); err != nil {
			return err
		}
	}
	etcd, err := newEtcdClient(p.endpoints, tlsCfg)
	if err != nil {
		return err
	}
	p.cleanup = append(p.cleanup, func() { etcd.Close() })
	p.etcd = etcd
	p.catalog = replicas.NewCatalog(etcd, p.cfg.EtcdPrefix)
	p.snapshots = replicas.NewSnapshotStore(etcd, p.cfg.EtcdPrefix, p.cfg.MaxSnapshotBytes)
	if err := p.snapshots.WriteFormat(p.cfg.SnapshotFormat); err != nil {
		return err
	}
	if len(p.cfg.ClustersetCIDRs) > 0 {
		if p.clustersetIPs, err = replicas.NewClusterSetIPs(etcd, p.cfg.EtcdPrefix, p.cfg.ClustersetCIDRs); err != nil {
			return err
		}
		// Known claims say which IPs are taken, so a new claim rarely collides; with etcd unreachable, they are learnt as needed.
		loadCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := p.clustersetIPs.Load(loadCtx); err != nil {
			p.log.Warn("cannot read the clusterset IPs yet", "err", err)
		}
	}
	return nil
}

// registerMetrics makes the hub's metrics registry: Go runtime, process,
// the hub's own and gRPC server metrics.
func (p *parts) registerMetrics() {
	p.metricsReg = prometheus.NewRegistry()
	p.metricsReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p.metrics = newMetrics(p.metricsReg)
	p.grpcMetrics = grpcprom.NewServerMetrics()
	p.metricsReg.MustRegister(p.grpcMetrics)
}

// buildState makes the xDS server, the state that feeds it through the
// pusher, and the coordinator.
func (p *parts) buildState() {
	cfg := p.cfg
	tc := convergence.DefaultConfig()
	tc.Replica = cfg.ID
	p.tracer = convergence.New(tc, p.metricsReg)
	w := xds.Wiring{
		Replica: cfg.ID,
		// Versions unique to this process: a client that reconnects after a
		// restart, or to another replica, never takes new content for what it acked.
		VersionPrefix: cfg.ID + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-",
		// Envoy gateways are served listeners of their own.
		Audience: gateways.NewAudience(cfg.IngressExposure, p.log),
		Tracer:   p.tracer,
	}
	if p.policy != nil {
		w.Restrict = p.restrictXDS
	}
	p.xdsServer = xds.NewServer(cfg.XDS, w, p.log, p.metricsReg)
	// Gossip hears about every change of the state (summaries: who is home, at which stamp).
	// Imports follow every change too, off the state goroutine.
	var cidrs []string
	for _, c := range cfg.ClustersetCIDRs {
		cidrs = append(cidrs, c.String())
	}
	p.imports = newImporter(p.clustersetIPs, cidrs, cfg.Liveness.StaleAfter, p.log)
	onChange := func(v View) {
		p.metrics.observe(v, cfg.Liveness.now())
		p.imports.observe(v)
		if g := p.gossipNow.Load(); g != nil {
			g.UpdateSummaries() // never blocks; pushes at most once a second
		}
	}
	// xDS translation runs off the state goroutine, coalescing what arrives meanwhile.
	p.push = newPusher(p.xdsServer, p.log)
	p.state = newState(cfg.ID, cfg.Liveness, publishers{p.push, p.imports}, cfg.Federation.Limits, onChange, p.log)
	p.state.tracer = p.tracer
	p.state.exportAllowed = p.exportAllowed()
	ipHoldDown := cfg.ClustersetIPHoldDown
	if ipHoldDown <= 0 {
		ipHoldDown = cfg.Liveness.DropAfter + 5*time.Minute // longer than any DNS TTL
	}
	p.coord = &coordinator{
		id: cfg.ID, state: p.state, etcd: p.etcd, catalog: p.catalog, snapshots: p.snapshots,
		leaderCfg: leaderConfig(cfg),
		interval:  cfg.SnapshotInterval, liveness: cfg.Liveness, metrics: p.metrics, log: p.log.With("component", "coordination"),
		clustersetIPs: p.clustersetIPs, ipHoldDown: ipHoldDown,
		restoredCh: make(chan struct{}),
	}
}

// buildServers makes the gRPC servers, federation (authenticated) and xDS,
// with recovery, logging and metrics, and the admin HTTP server.
func (p *parts) buildServers() {
	cfg, log := p.cfg, p.log
	recoveryOpt := recovery.WithRecoveryHandler(func(r any) error {
		log.Error("panic in gRPC handler", "panic", r)
		return status.Errorf(codes.Internal, "internal error")
	})
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall)}
	p.fedServer = grpc.NewServer(
		grpc.Creds(p.fedCreds),
		grpc.ConnectionTimeout(cfg.Connections.HandshakeTimeout),
		grpc.MaxConcurrentStreams(uint32(cfg.Connections.MaxStreamsPerConnection)),
		grpc.MaxRecvMsgSize(2*cfg.Federation.MaxMessageBytes), // a chunk, plus the removes that ride with it
		maxHeaderList(cfg.Connections),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionIdle: cfg.Connections.IdleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainStreamInterceptor(
			p.grpcMetrics.StreamServerInterceptor(),
			// Refusals are counted, not logged one by one: a flood must not flood the log.
			limits.StreamsPerPeer(cfg.Connections.FederationStreamsPerPeer, limits.PeerKey, p.refused("federation")),
			logging.StreamServerInterceptor(grpcLogger(log.With("component", "federation-grpc")), logOpts...),
			recovery.StreamServerInterceptor(recoveryOpt),
			p.federationCredentials().Interceptor(),
		),
	)
	// A cluster new to the catalog is recorded before its first session begins (see catalogFirst).
	sessions := catalogFirst{state: p.state, catalog: p.catalog, log: log.With("component", "catalog")}
	fw := federation.HubWiring{
		HubID: cfg.ID,
		Clock: cfg.Liveness.Clock, // a session's start is a liveness time
		Origins: func(cluster registry.ClusterID, link time.Duration, received []federation.ReceivedOrigin) {
			// Where each change began: the trace's first stages.
			origins := make([]convergence.SpokeOrigin, len(received))
			for i, o := range received {
				origins[i] = convergence.SpokeOrigin{Service: o.Service, ResourceVersion: o.ResourceVersion, Source: o.Source, Spoke: o.Spoke}
			}
			p.tracer.Origins(cluster, link, origins)
		},
		ExportAllowed: p.exportAllowed(),
		Metrics:       p.metrics.federationHooks(),
	}
	p.hubFed = federation.NewHubServer(cfg.Federation, fw, sessions, catalogEpochs{catalog: p.catalog}, log)
	p.hubFed.ServeImports(p.imports)
	fedv1.RegisterFederationServer(p.fedServer, p.hubFed)
	// Replicas replicate over the federation port, authenticated by the peer
	// token, with the bounds and validation of the spokes' sessions.
	p.replWiring = replicas.ReplicationWiring{ReplicaID: cfg.ID, PeerToken: p.peerToken(),
		MaxMessageBytes: cfg.Federation.MaxMessageBytes, Limits: cfg.Federation.Limits, Hooks: p.metrics.replicationHooks()}
	fedv1.RegisterReplicationServer(p.fedServer, replicas.NewReplicationServer(p.state, cfg.Replication, p.replWiring, log))

	xdsInterceptors := []grpc.StreamServerInterceptor{
		p.grpcMetrics.StreamServerInterceptor(),
		limits.StreamsPerPeer(cfg.Connections.XDSStreamsPerPeer, limits.PeerKey, p.refused("xds")),
		logging.StreamServerInterceptor(grpcLogger(log.With("component", "xds-grpc")), logOpts...),
		recovery.StreamServerInterceptor(recoveryOpt),
		limits.FirstMessageWithin(cfg.Connections.FirstRequestTimeout, p.refused("xds")),
	}
	if p.policy != nil {
		xdsInterceptors = append(xdsInterceptors, p.sessions.StreamInterceptor(p.xdsCerts, cfg.TrustDomain, p.policyGrant))
	} else {
		xdsInterceptors = append(xdsInterceptors, p.sessions.StreamInterceptor(p.xdsCerts, cfg.TrustDomain))
	}
	p.xdsGRPC = grpc.NewServer(
		grpc.Creds(p.xdsCreds),
		grpc.ReadBufferSize(xdsReadBuffer),
		maxHeaderList(cfg.Connections),
		grpc.ConnectionTimeout(cfg.Connections.HandshakeTimeout),
		grpc.MaxConcurrentStreams(uint32(cfg.Connections.MaxStreamsPerConnection)),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.Connections.IdleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainStreamInterceptor(xdsInterceptors...),
		grpc.ChainUnaryInterceptor(p.grpcMetrics.UnaryServerInterceptor(), recovery.UnaryServerInterceptor(recoveryOpt)),
	)
	p.xdsServer.Register(p.xdsGRPC)

	// Ready once started: every listener is up, the state runs and holds the
	// persisted registry (so a full restart never serves an empty one). An
	// unreachable etcd degrades the hub but leaves it ready: it serves and replicates.
	adm := &admin{pprof: cfg.Pprof, state: p.state, coord: p.coord, imports: p.imports, fed: p.hubFed, xds: p.xdsServer, tracer: p.tracer,
		metrics: p.metricsReg, log: log.With("component", "admin"), ready: p.xdsReady, token: p.adminToken}
	p.adminServer = &http.Server{Handler: adm.handler(), ReadHeaderTimeout: cfg.Connections.HandshakeTimeout,
		IdleTimeout: cfg.Connections.AdminIdleTimeout, MaxHeaderBytes: cfg.Connections.MaxHeaderListBytes}
}

// listen opens every listener.
func (p *parts) listen() (err error) {
	if p.fedLis, err = p.listenOn("federation", p.cfg.FederationAddr); err != nil {
		return err
	}
	if p.xdsLis, err = p.listenOn("xds", p.cfg.XDSAddr); err != nil {
		return err
	}
	// At its bound, the admin port closes a connection without a request in
	// progress for a new one: idle connections never keep a probe out.
	raw, err := p.listenOn("admin", p.cfg.AdminAddr)
	if err != nil {
		return err
	}
	c := p.cfg.Connections
	lis := limits.NewHTTPListener(raw, c.AdminMaxConnections, c.AdminMaxConnectionsPerPeer, p.refused("admin"))
	p.adminServer.ConnState = lis.ConnState
	p.adminLis = lis
	// What this replica advertises: to its peers, and in /debug/hub.
	host := advertiseHost(p.cfg)
	p.coord.mu.Lock()
	p.coord.self = adminapi.Peer{Name: p.cfg.ID, Self: true, Federation: advertise(host, p.fedLis.Addr()),
		XDS: advertise(host, p.xdsLis.Addr()), Admin: advertise(host, p.adminLis.Addr())}
	p.coord.mu.Unlock()
	return nil
}

// listenOn opens a listener on addr, bounded by the gRPC ports' limits
// except for the admin port's (see listen).
func (p *parts) listenOn(name, addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", name, err)
	}
	p.cleanup = append(p.cleanup, func() { lis.Close() })
	if name == "admin" {
		return lis, nil
	}
	c := p.cfg.Connections
	return limits.Listener(lis, c.MaxConnections, c.MaxConnectionsPerPeer, p.refused(name)), nil
}

// readCatalog returns the clusters in the catalog; with etcd unreachable,
// none, and false: xDS then waits until it can be read (see awaitCatalog).
func (p *parts) readCatalog(ctx context.Context) ([]replicas.ClusterRecord, bool) {
	listCtx, cancelList := context.WithTimeout(ctx, catalogReadTimeout)
	records, err := p.catalog.List(listCtx)
	cancelList()
	if err != nil {
		p.log.Warn("cannot read the cluster catalog; xDS waits until it can", "err", err)
		p.withhold(withheldCatalog, catalogUnread(err))
		return nil, false
	}
	p.catalog0, p.catalogKnown = records, true
	return records, true
}

// runState starts the state goroutine and the pusher, which run until stop,
// and tells the state which clusters the catalog knows.
func (p *parts) runState(ctx context.Context, records []replicas.ClusterRecord) error {
	stateCtx, stopState := context.WithCancel(context.Background())
	p.stopState = stopState
	p.wg.Go(func() { p.state.run(stateCtx) })
	p.wg.Go(func() { p.push.run(stateCtx) })
	p.wg.Go(func() { p.imports.run(stateCtx) })
	p.wg.Go(func() {
		forever(stateCtx, p.log, "gateway-names", func(ctx context.Context) {
			p.state.resolveGatewayNames(ctx, func(ctx context.Context, host string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			}, gatewayNameTTL)
		})
	})
	if err := p.state.known(ctx, records); err != nil {
		return err
	}
	// The importer may trust the clusters the state now knows (see importer.authoritative).
	p.imports.catalogRead.Store(len(p.catalog0) > 0) // an empty catalog may be a lost etcd
	p.imports.observe(*p.state.View())               // authority may follow at once
	return nil
}

// coordinate starts the coordinator's loops, which run until stop; without
// a restored snapshot, also the one that restores it once etcd answers.
func (p *parts) coordinate(restored bool) {
	p.coordCtx, p.stopCoord = context.WithCancel(context.Background())
	if !restored {
		p.coordWG.Go(func() { p.coord.restoreLater(p.coordCtx) })
	}
	p.loop("credentials", p.watchCredentials)
	if p.exportPolicy != nil {
		p.loop("export-policy", p.watchExportPolicy)
	}
	p.loop("sessions", p.sessions.Run)
	p.loop("etcd-health", p.coord.watchEtcd)
	p.loop("leader", p.coord.lead)
	p.loop("liveness", p.coord.tickLiveness)
}

// loop runs fn for as long as coordination runs, again after it returns or panics.
func (p *parts) loop(name string, fn func(context.Context)) {
	p.coordWG.Go(func() { forever(p.coordCtx, p.log, name, fn) })
}

// joinReplicas starts gossip with the peer replicas, and replication from
// each member gossip finds.
func (p *parts) joinReplicas() error {
	cfg := p.cfg
	host := advertiseHost(cfg)
	self := p.coord.self
	meta := replicas.MemberMeta{Federation: self.Federation, XDS: self.XDS, Admin: self.Admin, Replication: self.Federation}
	members, err := replicas.StartMembership(p.coordCtx, replicas.MembershipConfig{
		Name: cfg.ID, BindAddr: cmp.Or(cfg.GossipAddr, ":7946"), AdvertiseAddr: advertiseGossip(host, cfg.GossipAddr),
		Join: cfg.Join, Meta: meta, Summaries: p.coord.summaries, Fast: cfg.FastGossip,
	}, p.log)
	if err != nil {
		return fmt.Errorf("gossip: %w", err)
	}
	p.gossipNow.Store(members)
	replicator := replicas.NewReplicator(p.state, cfg.Replication, p.replWiring, p.peerCreds, p.log)
	p.coordWG.Go(func() { replicator.Run(p.coordCtx) })
	p.coordWG.Go(func() { <-members.Done() })
	p.loop("membership", func(ctx context.Context) { p.coord.follow(ctx, members, replicator) })
	return nil
}

// serve serves federation at once, then xDS and admin once the restored
// registry is translated: a client that reconnects to empty caches would be
// told that every listener and cluster it knows is gone (its connection
// waits in the backlog meanwhile). Without the catalog or the snapshot
// (whole false: etcd did not answer), or with clusters the catalog names
// that the state lacks, xDS waits on a goroutine of its own (see xdsgate.go).
func (p *parts) serve(ctx context.Context, whole bool) error {
	p.serveGRPC("federation", p.fedServer, p.fedLis)
	if whole && (len(p.missingClusters()) == 0 || p.cfg.ColdStartWait <= 0) {
		if err := p.push.caughtUp(ctx); err != nil {
			return err
		}
		p.serveXDS()
	} else {
		if missing := p.missingClusters(); whole && len(missing) > 0 {
			p.withholdForClusters(missing) // readiness says why from the first answer
		}
		p.wg.Go(func() { p.serveXDSWhenWhole(ctx) })
	}
	p.adminServing = true
	p.run("admin", func() error { return p.adminServer.Serve(p.adminLis) })
	return nil
}

// serveXDS starts serving xDS.
func (p *parts) serveXDS() {
	p.serveGRPC("xds", p.xdsGRPC, p.xdsLis)
	p.xdsServing.Store(true)
	p.withhold("", "")
}

func (p *parts) serveGRPC(name string, s *grpc.Server, lis net.Listener) {
	p.servingMu.Lock()
	defer p.servingMu.Unlock()
	if p.stopping {
		return // stop has stopped the servers already
	}
	p.serving = append(p.serving, s)
	p.run(name, func() error { return s.Serve(lis) })
}

// run runs a server until it is stopped, logging why if it fails otherwise.
func (p *parts) run(name string, serve func() error) {
	p.wg.Go(func() {
		if err := serve(); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("server failed", "server", name, "err", err)
		}
	})
}

// stop stops what started, in this order: the gRPC servers together (no
// change comes in after), coordination (a leader saves the registry once
// more as its term ends), admin, the state; waits for all of it; then
// releases what was acquired (etcd, listeners) in reverse. It is the hub's
// shutdown, and Start's cleanup when a step fails.
func (p *parts) stop() {
	p.servingMu.Lock()
	p.stopping = true
	serving := slices.Clone(p.serving)
	p.servingMu.Unlock()
	stopGRPC(serving...)
	if p.stopCoord != nil {
		p.stopCoord()
	}
	p.coordWG.Wait()
	if p.adminServing {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = p.adminServer.Shutdown(shutdownCtx)
		cancel()
	}
	if p.stopState != nil {
		p.stopState()
	}
	p.wg.Wait()
	for i := len(p.cleanup) - 1; i >= 0; i-- {
		p.cleanup[i]()
	}
}

// xdsReadBuffer is the read buffer of an xDS client's connection. grpc's
// default, 32 KiB, was half the hub's heap per directly connected client
// (grpc lends an idle connection its buffer only on a bare TCP connection;
// the hub's are wrapped, by the connection limits and, if configured, TLS). A client sends
// a request now and then, and a frame larger than the buffer is read
// straight into place. (The federation port keeps the default: spokes
// stream updates.)
const xdsReadBuffer = 4 << 10

// stopGrace is how long a stopping hub lets RPCs finish. Its RPCs are
// streams that never end by themselves (spoke sessions, replication, xDS):
// the grace only lets the GOAWAY reach clients, so they move to another
// replica without an error, before the streams are cut.
const stopGrace = 250 * time.Millisecond

// stopGRPC stops the servers together: a GOAWAY first, then, after the
// grace, whatever streams remain are cut.
func stopGRPC(servers ...*grpc.Server) {
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(func() {
			done := make(chan struct{})
			go func() { s.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(stopGrace):
				s.Stop()
				<-done
			}
		})
	}
	wg.Wait()
}

// etcdTimeout bounds every etcd call made on a spoke's behalf.
const etcdTimeout = 5 * time.Second

// catalogEpochs issues epochs through the etcd catalog.
type catalogEpochs struct{ catalog *replicas.Catalog }

func (c catalogEpochs) NextEpoch(ctx context.Context, cluster registry.ClusterID) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	return c.catalog.NextEpoch(ctx, cluster)
}

// grpcLogger adapts slog for go-grpc-middleware's logging interceptor.
// grpcLogger logs each finished call; refused ones (InvalidArgument and the
// like) a few a minute per code, every peer-supplied value cut short (see
// limits.RefusalLog.FinishedCall).
func grpcLogger(l *slog.Logger) logging.Logger {
	r := limits.NewRefusalLog(l, 0, 0)
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		r.FinishedCall(ctx, slog.Level(lvl), msg, fields...)
	})
}

// advertiseHost is the host peers reach this replica's servers at.
func advertiseHost(cfg Config) string {
	if cfg.AdvertiseHost != "" {
		return cfg.AdvertiseHost
	}
	if host, _, err := net.SplitHostPort(cfg.GossipAddr); err == nil && host != "" && !net.ParseIP(host).IsUnspecified() {
		return host
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && !ip.IP.IsLoopback() && ip.IP.To4() != nil {
			return ip.IP.String()
		}
	}
	return "127.0.0.1"
}

// advertise is a listener's address as peers should dial it.
func advertise(host string, a net.Addr) string {
	_, port, _ := net.SplitHostPort(a.String())
	return net.JoinHostPort(host, port)
}

// advertiseGossip is the gossip address peers should use ("" lets memberlist choose).
func advertiseGossip(host, gossipAddr string) string {
	_, port, err := net.SplitHostPort(cmp.Or(gossipAddr, ":7946"))
	if err != nil {
		return ""
	}
	return net.JoinHostPort(host, port)
}

func leaderConfig(cfg Config) replicas.LeaderConfig {
	l := replicas.DefaultLeaderConfig()
	l.Prefix, l.ID = cfg.EtcdPrefix, cfg.ID
	return l
}
