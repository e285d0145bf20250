// Package hub is the hub process: it wires the federation server, the merged
// registry, the xDS server, etcd and the admin HTTP API together.
package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
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
	// PeerTokenFile holds the token replicas present to each other; empty
	// leaves replication open (development only).
	PeerTokenFile string
	// PeerCAFile is the CA that signed the replicas' federation certificates
	// (with TLSCertFile): replicas verify each other with it.
	PeerCAFile string
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
		MaxSnapshotBytes: 64 << 20,
		SnapshotFormat:   2,
		Federation:       federation.DefaultHubConfig(),
		Replication:      replicas.DefaultReplicationConfig(),
		XDS:              xds.DefaultConfig(),
	}
}

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
	log = log.With("hub", cfg.ID)
	var cleanup []func() // run in reverse on failure or shutdown
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	cfg.Federation.HubID = cfg.ID
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = DefaultConfig().SnapshotInterval
	}
	if cfg.SnapshotFormat == 0 {
		cfg.SnapshotFormat = DefaultConfig().SnapshotFormat
	}
	// xDS versions unique to this process: a client that reconnects after a
	// restart, or to another replica, never takes new content for what it acked.
	cfg.XDS.VersionPrefix = cfg.ID + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"

	// 1. Credentials: a spoke may only publish for the cluster its token names.
	var tokens federation.Tokens
	if cfg.TokensFile != "" {
		if tokens, err = federation.LoadTokens(cfg.TokensFile); err != nil {
			return nil, err
		}
	} else {
		log.Warn("no --tokens file: any spoke may publish for any cluster (development only)")
	}
	fedCreds := insecure.NewCredentials()
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		if fedCreds, err = credentials.NewServerTLSFromFile(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			return nil, fmt.Errorf("federation TLS: %w", err)
		}
	} else if tokens != nil {
		log.Warn("federation without TLS: spoke tokens travel in clear (set --tls-cert and --tls-key)")
	}
	var peerToken string
	if cfg.PeerTokenFile != "" {
		if peerToken, err = federation.LoadToken(cfg.PeerTokenFile); err != nil {
			return nil, err
		}
	}
	gossip := len(cfg.Join) > 0 || cfg.GossipAddr != ""
	if gossip && len(cfg.EtcdEndpoints) == 0 {
		// Epochs fence a cluster's sessions across replicas only if every replica draws them from one etcd.
		return nil, errors.New("hub replicas (--join, --gossip-addr) need a shared etcd: set --etcd-endpoints")
	}
	if gossip && peerToken == "" {
		log.Warn("no --peer-token-file: any process may replicate with this hub (development only)")
	}
	if peerToken != "" {
		if err := federation.ValidatePeerToken(peerToken, tokens); err != nil {
			return nil, err
		}
	}
	// Replicas dial each other's federation port: over TLS when it speaks TLS,
	// trusting the CA in PeerCAFile.
	peerCreds := insecure.NewCredentials()
	if cfg.TLSCertFile != "" && gossip {
		if cfg.PeerCAFile == "" {
			return nil, errors.New("hub replicas whose federation port speaks TLS need --peer-ca: the CA that signed the replicas' certificates")
		}
		if peerCreds, err = credentials.NewClientTLSFromFile(cfg.PeerCAFile, ""); err != nil {
			return nil, fmt.Errorf("peer TLS: %w", err)
		}
	}

	// 2. etcd: external, or embedded in the data dir.
	endpoints := cfg.EtcdEndpoints
	if len(endpoints) == 0 {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
		e, endpoint, err := startEmbeddedEtcd(ctx, cfg.DataDir, log)
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, e.Close)
		endpoints = []string{endpoint}
	}
	etcd, err := newEtcdClient(endpoints)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { etcd.Close() })
	catalog := replicas.NewCatalog(etcd, cfg.EtcdPrefix)
	snapshots := replicas.NewSnapshotStore(etcd, cfg.EtcdPrefix, cfg.MaxSnapshotBytes)
	if err := snapshots.WriteFormat(cfg.SnapshotFormat); err != nil {
		return nil, err
	}

	// 3. Metrics, on a registry of the hub's own.
	metricsReg := prometheus.NewRegistry()
	metricsReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(metricsReg)
	grpcMetrics := grpcprom.NewServerMetrics()
	metricsReg.MustRegister(grpcMetrics)

	// 4. The xDS server and the state that feeds it.
	xdsServer := xds.NewServer(cfg.XDS, log, metricsReg)
	// Gossip hears about every change of the state (summaries: who is home, at which stamp).
	var gossipNow atomic.Pointer[replicas.Membership]
	onChange := func(v View) {
		m.observe(v)
		if g := gossipNow.Load(); g != nil {
			g.UpdateSummaries() // never blocks; pushes at most once a second
		}
	}
	// xDS translation runs off the state goroutine, coalescing what arrives meanwhile.
	push := newPusher(xdsServer, log)
	st := newState(cfg.ID, cfg.Liveness, push, catalog, cfg.Federation.Limits, onChange, log)
	coord := &coordinator{
		id: cfg.ID, state: st, etcd: etcd, catalog: catalog, snapshots: snapshots,
		leaderCfg: leaderConfig(cfg),
		interval:  cfg.SnapshotInterval, liveness: cfg.Liveness, metrics: m, log: log.With("component", "coordination"),
	}

	// 5. gRPC servers: federation (authenticated) and xDS, with recovery, logging and metrics.
	recoveryOpt := recovery.WithRecoveryHandler(func(p any) error {
		log.Error("panic in gRPC handler", "panic", p)
		return status.Errorf(codes.Internal, "internal error")
	})
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall)}
	fedServer := grpc.NewServer(
		grpc.Creds(fedCreds),
		grpc.MaxRecvMsgSize(2*cfg.Federation.MaxMessageBytes), // a chunk, plus the removes that ride with it
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainStreamInterceptor(
			grpcMetrics.StreamServerInterceptor(),
			logging.StreamServerInterceptor(grpcLogger(log.With("component", "federation-grpc")), logOpts...),
			recovery.StreamServerInterceptor(recoveryOpt),
			federation.AuthInterceptor(tokens, federation.WithPeerToken(peerToken)),
		),
	)
	hubFed := federation.NewHubServer(cfg.Federation, st, catalogEpochs{catalog: catalog}, m.federationHooks(), log)
	fedv1.RegisterFederationServer(fedServer, hubFed)
	// Replicas replicate over the federation port, authenticated by the peer token.
	replCfg := cfg.Replication
	replCfg.ReplicaID, replCfg.MaxMessageBytes, replCfg.PeerToken = cfg.ID, cfg.Federation.MaxMessageBytes, peerToken
	replCfg.Limits = cfg.Federation.Limits
	replCfg.Hooks = m.replicationHooks()
	fedv1.RegisterReplicationServer(fedServer, replicas.NewReplicationServer(st, replCfg, log))

	xdsGRPC := grpc.NewServer(
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainStreamInterceptor(
			grpcMetrics.StreamServerInterceptor(),
			logging.StreamServerInterceptor(grpcLogger(log.With("component", "xds-grpc")), logOpts...),
			recovery.StreamServerInterceptor(recoveryOpt),
		),
		grpc.ChainUnaryInterceptor(grpcMetrics.UnaryServerInterceptor(), recovery.UnaryServerInterceptor(recoveryOpt)),
	)
	xdsServer.Register(xdsGRPC)

	// 6. Listen everywhere before serving anything, so a bad address fails fast.
	fedLis, err := net.Listen("tcp", cfg.FederationAddr)
	if err != nil {
		return nil, fmt.Errorf("listen federation: %w", err)
	}
	cleanup = append(cleanup, func() { fedLis.Close() })
	xdsLis, err := net.Listen("tcp", cfg.XDSAddr)
	if err != nil {
		return nil, fmt.Errorf("listen xds: %w", err)
	}
	cleanup = append(cleanup, func() { xdsLis.Close() })
	adminLis, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("listen admin: %w", err)
	}
	cleanup = append(cleanup, func() { adminLis.Close() })

	// 7. Catalog: clusters seen before show up (disconnected) until their spokes return.
	listCtx, cancelList := context.WithTimeout(ctx, 10*time.Second)
	records, err := catalog.List(listCtx)
	cancelList()
	if err != nil {
		log.Warn("read cluster catalog", "err", err)
	}

	h := &Hub{FederationAddr: fedLis.Addr(), XDSAddr: xdsLis.Addr(), AdminAddr: adminLis.Addr(), state: st, coord: coord, done: make(chan struct{})}
	// Ready once started: every listener is up, the state runs and holds the
	// persisted registry (so a full restart never serves an empty one). An
	// unreachable etcd degrades the hub but leaves it ready: it serves and replicates.
	adm := &admin{pprof: cfg.Pprof, state: st, coord: coord, metrics: metricsReg, log: log.With("component", "admin"), ready: func() error { return nil }}
	adminServer := &http.Server{Handler: adm.handler(), ReadHeaderTimeout: 10 * time.Second}

	// 8. Run: the state goroutine first, then the servers. Everything ends with ctx.
	var wg sync.WaitGroup
	stateCtx, stopState := context.WithCancel(context.Background())
	wg.Go(func() { st.run(stateCtx) })
	wg.Go(func() { push.run(stateCtx) })
	if err := st.known(ctx, records); err != nil {
		stopState()
		wg.Wait()
		return nil, err
	}
	// 9. Warm start: serve the last persisted registry until live data
	// replaces it. With etcd unreachable, it goes on trying in the background
	// (it only ever fills in clusters older than what the hub holds).
	restored := coord.restore(ctx)
	// 10. Coordination: etcd health, leadership, liveness; with peers, gossip and replication.
	coordCtx, stopCoord := context.WithCancel(context.Background())
	loop := func(name string, fn func(context.Context)) {
		wg.Go(func() { forever(coordCtx, log, name, fn) })
	}
	if !restored {
		wg.Go(func() { coord.restoreLater(coordCtx) })
	}
	loop("etcd-health", coord.watchEtcd)
	loop("leader", coord.lead)
	loop("liveness", coord.tickLiveness)
	if gossip {
		host := advertiseHost(cfg)
		meta := replicas.MemberMeta{
			Federation: advertise(host, fedLis.Addr()), XDS: advertise(host, xdsLis.Addr()),
			Admin: advertise(host, adminLis.Addr()), Replication: advertise(host, fedLis.Addr()),
		}
		members, err := replicas.StartMembership(coordCtx, replicas.MembershipConfig{
			Name: cfg.ID, BindAddr: cmp.Or(cfg.GossipAddr, ":7946"), AdvertiseAddr: advertiseGossip(host, cfg.GossipAddr),
			Join: cfg.Join, Meta: meta, Summaries: coord.summaries, Fast: cfg.FastGossip,
		}, log)
		if err != nil {
			stopCoord()
			stopState()
			wg.Wait()
			return nil, fmt.Errorf("gossip: %w", err)
		}
		gossipNow.Store(members)
		replicator := replicas.NewReplicator(st, replCfg, peerCreds, log)
		wg.Go(func() { replicator.Run(coordCtx) })
		wg.Go(func() { <-members.Done() })
		loop("membership", func(ctx context.Context) { coord.follow(ctx, members, replicator) })
	}
	serve := func(name string, fn func() error) {
		wg.Go(func() {
			if err := fn(); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, http.ErrServerClosed) {
				log.Error("server failed", "server", name, "err", err)
			}
		})
	}
	serve("federation", func() error { return fedServer.Serve(fedLis) })
	// xDS only once the restored registry is translated: a client that
	// reconnects to empty caches would be told that every listener and
	// cluster it knows is gone (its connection waits in the backlog meanwhile).
	if err := push.caughtUp(ctx); err != nil {
		stopCoord()
		stopGRPC(fedServer)
		stopState()
		wg.Wait()
		return nil, err
	}
	serve("xds", func() error { return xdsGRPC.Serve(xdsLis) })
	serve("admin", func() error { return adminServer.Serve(adminLis) })
	log.Info("hub serving", "federation", h.FederationAddr, "xds", h.XDSAddr, "admin", h.AdminAddr, "etcd", endpoints)

	go func() {
		defer close(h.done)
		<-ctx.Done()
		log.Info("hub stopping")
		stopCoord()
		stopGRPC(fedServer, xdsGRPC)
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = adminServer.Shutdown(shutdownCtx)
		cancel()
		stopState()
		wg.Wait()
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
		log.Info("hub stopped")
	}()
	return h, nil
}

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
func grpcLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
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
