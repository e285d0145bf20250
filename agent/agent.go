// Package agent runs Envoy as a Nave gateway, as Istio's pilot-agent runs
// it: it writes Envoy's bootstrap (node metadata naming the gateway's role,
// network and locality; ADS to the hub), serves Envoy its certificates over
// SDS from watched files, supervises Envoy (hot restart on changes, restart
// after crashes within a budget, drain on shutdown) and answers readiness
// probes for the Envoy that holds the listeners (see Serving).
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/navemesh/nave/gateways"
)

// Config configures a gateway agent.
type Config struct {
	// Node is who the gateway is; Hub where its configuration comes from.
	Node Node
	Hub  Hub
	// AdminPort is Envoy's admin port, on 127.0.0.1 only.
	AdminPort int
	// StatusAddr is where the agent serves ReadyPath and LivePath.
	StatusAddr string
	// WorkDir holds Envoy's bootstraps and the SDS socket (sds.sock).
	WorkDir string
	// Secrets are served to Envoy over SDS.
	Secrets []SecretFiles
	// Watch is how the certificate files (secrets and the hub's) are watched.
	Watch Watch
	// Envoy is how Envoy is run; Run sets its Dir, AdminPort, WatchFiles,
	// Watch and CheckFiles from the fields above.
	Envoy SupervisorConfig
}

// DefaultConfig returns the configuration `nave gateway` starts with (it
// still needs a role, and a network for east-west).
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Node:       Node{ID: host},
		Hub:        Hub{Addr: "127.0.0.1:15011"},
		AdminPort:  15000,
		StatusAddr: ":15021",
		WorkDir:    filepath.Join(os.TempDir(), "nave-gateway"),
		Watch:      DefaultWatch(),
		Envoy:      DefaultSupervisorConfig(),
	}
}

// SDSSocketName is the SDS socket's name in the work directory.
const SDSSocketName = "sds.sock"

// Run runs the gateway until ctx ends, then drains Envoy, stops it and
// returns nil. It returns an error for a configuration that cannot work
// (before anything starts), or when Envoy keeps crashing.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	base := log.With("role", cfg.Node.Role, "node", cfg.Node.ID)
	log = base.With("component", "gateway-agent")

	// 1. The bootstrap, checked before anything starts.
	socket := filepath.Join(cfg.WorkDir, SDSSocketName)
	if !filepath.IsAbs(socket) {
		abs, err := filepath.Abs(socket)
		if err != nil {
			return fmt.Errorf("work directory: %w", err)
		}
		socket = abs
	}
	b, err := Bootstrap(BootstrapConfig{Node: cfg.Node, Hub: cfg.Hub, AdminPort: cfg.AdminPort, SDSSocket: socket})
	if err != nil {
		return err
	}
	bootstrapJSON, err := MarshalBootstrap(b)
	if err != nil {
		return err
	}
	if cfg.Hub.CAFile == "" {
		log.Warn("Envoy connects to the hub in plaintext (no --hub-ca)", "hub", cfg.Hub.Addr)
	}
	if err := checkHubFiles(cfg.Hub); err != nil {
		return fmt.Errorf("%w: %v (--hub-ca, --hub-cert, --hub-key)", ErrInvalidConfig, err)
	}
	ec := cfg.Envoy
	ec.Dir, ec.AdminPort = cfg.WorkDir, cfg.AdminPort
	ec.WatchFiles, ec.Watch = cfg.Hub.Files(), cfg.Watch
	ec.CheckFiles = func() error { return checkHubFiles(cfg.Hub) }
	if err := ec.check(); err != nil {
		return err
	}
	if cfg.Node.Role == gateways.RoleEastWest && len(cfg.Secrets) > 0 {
		log.Warn("an east-west gateway passes TLS through and uses no secrets; --secret is served but unused")
	}
	if err := checkListenerSecrets(cfg.Node.Listeners, cfg.Secrets); err != nil {
		return err
	}
	if cfg.Hub.ServerName != "" && cfg.Hub.CAFile == "" {
		return fmt.Errorf("%w: --hub-server-name without --hub-ca: the connection to the hub would be plaintext", ErrInvalidConfig)
	}

	// 2. The secrets, loaded once: a wrong --secret fails here.
	sds, err := NewSDSServer(cfg.Secrets, cfg.Watch, base)
	if err != nil {
		return err
	}

	// 3. The work directory (private: it holds the SDS socket) and the listeners.
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	sdsLis, err := listenUnix(socket)
	if err != nil {
		return fmt.Errorf("SDS socket: %w", err)
	}
	statusLis, err := net.Listen("tcp", cfg.StatusAddr)
	if err != nil {
		sdsLis.Close()
		return fmt.Errorf("status address (--status-port): %w", err)
	}

	// 4. SDS and the status server run until Envoy is stopped (Envoy keeps
	// its SDS stream while it drains; probes get 503, not a refused connection).
	var wg sync.WaitGroup
	defer wg.Wait() // after stopServing, below
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	supervisor := NewSupervisor(ec, bootstrapJSON, base)
	ready := NewReadiness(cfg.AdminPort, supervisor) // the Envoy serving, through hot restarts
	status := &http.Server{Handler: ready.Handler(), ReadHeaderTimeout: 5 * time.Second}
	wg.Go(func() {
		defer recoverLog(log, "SDS server")
		if err := sds.Serve(serveCtx, sdsLis); err != nil {
			log.Error("SDS server stopped", "error", err)
		}
	})
	wg.Go(func() {
		defer recoverLog(log, "status server")
		log.Info("serving readiness", "address", statusLis.Addr().String(), "ready", ReadyPath, "live", LivePath)
		if err := status.Serve(statusLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("status server stopped", "error", err)
		}
	})
	wg.Go(func() {
		<-serveCtx.Done()
		shutCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = status.Shutdown(shutCtx)
	})
	// Not ready from the moment the agent is told to stop.
	stopReady := context.AfterFunc(ctx, ready.Drain)
	defer stopReady()

	// 5. Envoy, until ctx ends.
	log.Info("starting Envoy", "hub", cfg.Hub.Addr, "network", cfg.Node.Network, "cluster_id", cfg.Node.ClusterID,
		"admin", fmt.Sprintf("127.0.0.1:%d", cfg.AdminPort), "secrets", len(cfg.Secrets))
	return supervisor.Run(ctx)
}

func recoverLog(log *slog.Logger, what string) {
	if r := recover(); r != nil {
		log.Error("panic in the "+what, "panic", r, "stack", string(debug.Stack()))
	}
}

// checkListenerSecrets refuses an HTTPS listener whose certificate no
// --secret serves: Envoy would wait for it, then serve that listener without one.
func checkListenerSecrets(listeners string, secrets []SecretFiles) error {
	if listeners == "" {
		return nil
	}
	ls, err := gateways.ParseListeners(listeners)
	if err != nil {
		return fmt.Errorf("%w: --listeners: %v", ErrInvalidConfig, err)
	}
	for _, l := range ls {
		if l.Mode == gateways.ModeHTTPS && !slices.ContainsFunc(secrets, func(s SecretFiles) bool { return s.Name == l.Secret }) {
			return fmt.Errorf("%w: listener %d/https:%s: no --secret %s=CERT,KEY serves its certificate", ErrInvalidConfig, l.Port, l.Secret, l.Secret)
		}
	}
	return nil
}
