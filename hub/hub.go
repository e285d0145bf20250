// Package hub is the hub process: it wires the federation server, the merged
// registry, the xDS server, etcd and the admin HTTP API together.
package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
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
	Federation              federation.HubConfig
	XDS                     xds.Config
}

// DefaultConfig returns the configuration `nave hub` starts with.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		ID:             host,
		DataDir:        "nave-data",
		FederationAddr: ":15010",
		XDSAddr:        ":15011",
		AdminAddr:      ":15012",
		EtcdPrefix:     "/nave/",
		Federation:     federation.DefaultHubConfig(),
		XDS:            xds.DefaultConfig(),
	}
}

// Hub is a running hub replica.
type Hub struct {
	// The addresses the hub listens on.
	FederationAddr, XDSAddr, AdminAddr net.Addr

	state *state
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
	catalog := federation.NewCatalog(etcd, cfg.EtcdPrefix)

	// 3. Metrics, on a registry of the hub's own.
	metricsReg := prometheus.NewRegistry()
	metricsReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(metricsReg)
	grpcMetrics := grpcprom.NewServerMetrics()
	metricsReg.MustRegister(grpcMetrics)

	// 4. The xDS server and the state that feeds it.
	xdsServer := xds.NewServer(cfg.XDS, log, metricsReg)
	st := newState(xdsServer, catalog, cfg.Federation.Limits, m.observe, log)

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
			federation.AuthInterceptor(tokens),
		),
	)
	hubFed := federation.NewHubServer(cfg.Federation, st, catalogEpochs{catalog: catalog}, m.federationHooks(), log)
	fedv1.RegisterFederationServer(fedServer, hubFed)

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

	h := &Hub{FederationAddr: fedLis.Addr(), XDSAddr: xdsLis.Addr(), AdminAddr: adminLis.Addr(), state: st, done: make(chan struct{})}
	// Ready once started: every listener is up and the state runs.
	adm := &admin{state: st, metrics: metricsReg, log: log.With("component", "admin"), ready: func() error { return nil }}
	adminServer := &http.Server{Handler: adm.handler(), ReadHeaderTimeout: 10 * time.Second}

	// 8. Run: the state goroutine first, then the servers. Everything ends with ctx.
	var wg sync.WaitGroup
	stateCtx, stopState := context.WithCancel(context.Background())
	wg.Go(func() { st.run(stateCtx) })
	if err := st.known(ctx, records); err != nil {
		stopState()
		wg.Wait()
		return nil, err
	}
	serve := func(name string, fn func() error) {
		wg.Go(func() {
			if err := fn(); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, http.ErrServerClosed) {
				log.Error("server failed", "server", name, "err", err)
			}
		})
	}
	serve("federation", func() error { return fedServer.Serve(fedLis) })
	serve("xds", func() error { return xdsGRPC.Serve(xdsLis) })
	serve("admin", func() error { return adminServer.Serve(adminLis) })
	log.Info("hub serving", "federation", h.FederationAddr, "xds", h.XDSAddr, "admin", h.AdminAddr, "etcd", endpoints)

	go func() {
		defer close(h.done)
		<-ctx.Done()
		log.Info("hub stopping")
		stopGRPC(fedServer)
		stopGRPC(xdsGRPC)
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

// stopGRPC lets in-flight RPCs finish briefly, then cuts the long-lived streams.
func stopGRPC(s *grpc.Server) {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		s.Stop()
		<-done
	}
}

// etcdTimeout bounds every etcd call made on a spoke's behalf.
const etcdTimeout = 5 * time.Second

// catalogEpochs issues epochs through the etcd catalog.
type catalogEpochs struct{ catalog *federation.Catalog }

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
