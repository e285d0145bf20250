package spoke

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// Source is where a spoke learns its cluster's state. Run calls publish with
// the complete state once it is known, then after every change, until ctx ends.
type Source interface {
	Name() string
	Run(ctx context.Context, publish func(State)) error
}

// Config configures a spoke.
type Config struct {
	Cluster registry.ClusterID
	Network registry.Network
	// HubAddr is the hub's federation address (host:port).
	HubAddr string
	// TokenFile holds the cluster's federation token; empty sends none.
	TokenFile string
	// HubCAFile, when set, makes the spoke connect over TLS and trust the hub
	// certificates it signed (PEM); HubServerName overrides the name checked.
	HubCAFile, HubServerName string
	// Source is "dir:PATH" (a directory of manifests).
	Source string
	// Region is the region of endpoints whose node carries none.
	Region string
	// ExportAll federates every service, not only those labelled nave.io/export=true.
	ExportAll bool
	// PollInterval is how often a dir source looks for changes.
	PollInterval time.Duration
	// AdminAddr serves /healthz, /readyz and /metrics; empty serves nothing.
	AdminAddr  string
	Federation federation.SpokeConfig
}

// DefaultConfig returns the configuration `nave spoke` starts with.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	f := federation.DefaultSpokeConfig()
	f.SpokeID = host
	return Config{PollInterval: 500 * time.Millisecond, Federation: f}
}

// Run runs a spoke until ctx ends: its source feeds the publisher, which keeps
// the hub's copy of the cluster's state current.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := registry.ValidateClusterID(cfg.Cluster); err != nil {
		return err
	}
	log = log.With("cluster", cfg.Cluster)
	src, err := NewSource(cfg, log)
	if err != nil {
		return err
	}
	transport := insecure.NewCredentials()
	if cfg.HubCAFile != "" {
		if transport, err = credentials.NewClientTLSFromFile(cfg.HubCAFile, cfg.HubServerName); err != nil {
			return fmt.Errorf("hub TLS: %w", err)
		}
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
	if cfg.TokenFile != "" {
		tok, err := federation.LoadToken(cfg.TokenFile)
		if err != nil {
			return err
		}
		// Over TLS the token is protected; without it, sending it anyway is the operator's choice (loopback, demos).
		opts = append(opts, grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: tok, AllowInsecure: cfg.HubCAFile == ""}))
	}
	conn, err := grpc.NewClient(cfg.HubAddr, opts...)
	if err != nil {
		return fmt.Errorf("hub address %q: %w", cfg.HubAddr, err)
	}
	defer conn.Close()

	mon := newMonitor()
	var adminLis net.Listener
	if cfg.AdminAddr != "" {
		if adminLis, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
			return fmt.Errorf("listen admin: %w", err)
		}
		defer adminLis.Close()
	}

	fc := cfg.Federation
	fc.Cluster, fc.Network = cfg.Cluster, cfg.Network
	pub := federation.NewPublisher(fc, conn, log, mon.observe)

	// The source hands each complete state to the publisher; only the latest matters.
	states := make(chan State, 1)
	publish := func(st State) {
		mon.states.Inc()
		select {
		case <-states: // drop the state the publisher has not taken yet
		default:
		}
		states <- st
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srcErr := make(chan error, 1)
	go func() {
		defer cancel()
		srcErr <- src.Run(ctx, publish)
	}()
	adminDone := make(chan struct{})
	go func() {
		defer close(adminDone)
		if adminLis == nil {
			return
		}
		if err := mon.serve(ctx, adminLis, log); err != nil {
			log.Error("spoke admin server failed", "err", err)
		}
	}()
	defer func() { cancel(); <-adminDone }()
	log.Info("spoke running", "source", src.Name(), "hub", cfg.HubAddr)
	_ = pub.Run(ctx, states)
	// The publisher returns only once ctx ends: because the caller is done, or the source failed.
	if err := <-srcErr; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("source %s: %w", src.Name(), err)
	}
	return nil
}

// NewSource returns the source cfg.Source names.
func NewSource(cfg Config, log *slog.Logger) (Source, error) {
	opts := BuildOptions{Cluster: cfg.Cluster, DefaultRegion: cfg.Region, ExportAll: cfg.ExportAll, Limits: registry.DefaultLimits()}
	kind, arg, _ := strings.Cut(cfg.Source, ":")
	switch kind {
	case "dir":
		if arg == "" {
			return nil, fmt.Errorf("source %q: want dir:PATH", cfg.Source)
		}
		return NewDirSource(arg, opts, cfg.PollInterval, log), nil
	default:
		return nil, fmt.Errorf("unknown source %q: want dir:PATH", cfg.Source)
	}
}
