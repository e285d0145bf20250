// Package nodeagent is the node agent, the Nave pod on every node (the
// candidates, a few spoke pods, stream the cluster to the hub). It serves
// xDS to the proxyless gRPC clients and the gateways of its node through a
// node-local relay (package relay), so the hub holds one stream per node
// (and one per gateway) instead of one per pod, and it watches nothing in
// Kubernetes: it reads its own Node once, for its locality.
//
// The candidates (a small Deployment running `nave spoke`) stream the
// cluster to the hub; see deploy/README.md for the two shapes together.
package nodeagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/internal/xdstype"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/relay"
)

// Config configures a node agent.
type Config struct {
	// HubAddr is the hub's xDS address.
	HubAddr string
	// HubCAFile, when set, makes the agent connect over TLS and trust the
	// hub's certificate for HubServerName (default: the HubAddr host);
	// CertFile and KeyFile are the agent's client certificate for a hub
	// whose xDS port asks for one (its identity under the hub's policy).
	// The files are re-read at each connection.
	HubCAFile, HubServerName string
	CertFile, KeyFile        string
	// XDSAddr is where the node's clients connect (a host port, or the
	// address behind a Service with internalTrafficPolicy: Local).
	XDSAddr string
	// AdminAddr serves /healthz, /readyz, /metrics and /debug/clients ("": none).
	AdminAddr string
	// NodeID is the ID the agent gives the hub (default nave-node~NODE).
	NodeID string
	// NodeName is the Kubernetes node the agent runs on: the agent reads
	// that Node's topology labels (through Kube) for what Locality lacks.
	NodeName string
	// Locality holds the region and zone given (they win over the Node's
	// labels); with both given the Node is not read.
	Locality registry.Locality
	// Kube is how the agent reaches the Kubernetes API to read its Node.
	Kube KubeAPI
	// Cluster and Network are the cluster's ID and network, sent to the hub
	// as node metadata (CLUSTER_ID, NETWORK): the hub hands the node the
	// endpoints its network reaches.
	Cluster registry.ClusterID
	Network registry.Network
	// Relay holds the relay's tuning (backoff, retention); the agent
	// wires it to the hub and the node from the fields above.
	Relay relay.Config
}

// DefaultConfig serves xDS on :15011 and the admin API on :9090, and reads
// the Node from inside the pod.
func DefaultConfig() Config {
	return Config{XDSAddr: ":15011", AdminAddr: ":9090", Kube: InCluster(), Relay: relay.DefaultConfig()}
}

// Run runs the node agent until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if cfg.HubAddr == "" {
		return errors.New("node agent: no hub xDS address")
	}
	relayLog := log // the relay names itself (component=relay)
	log = log.With("component", "node-agent")
	if cfg.Cluster != "" {
		if err := registry.ValidateClusterID(cfg.Cluster); err != nil {
			return err
		}
	}
	loc, err := nodeLocality(ctx, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while reading the Node: a clean stop
		}
		return err
	}
	dial, err := hubDialOptions(ctx, cfg, log)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	self := node(cfg, loc)
	r, err := relay.New(cfg.Relay, relay.Wiring{Upstream: cfg.HubAddr, DialOptions: dial, Node: self}, relayLog, reg)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, r, reg, log.With("node", self.GetId(), "locality", loc.String()))
}

// nodeLocality is the configured locality, completed from the Node's labels
// when a part is missing and the node is named.
func nodeLocality(ctx context.Context, cfg Config, log *slog.Logger) (registry.Locality, error) {
	loc := cfg.Locality
	if loc.Region != "" && loc.Zone != "" {
		return loc, nil
	}
	if cfg.NodeName == "" {
		log.Warn("no node name: the locality is only what was given", "locality", loc.String())
		return loc, nil
	}
	labels, err := cfg.Kube.Locality(ctx, cfg.NodeName, log)
	if err != nil {
		return registry.Locality{}, err
	}
	loc.Region, loc.Zone = cmp.Or(loc.Region, labels.Region), cmp.Or(loc.Zone, labels.Zone)
	return loc, nil
}

// node is what the relay tells the hub about its node.
func node(cfg Config, loc registry.Locality) *core.Node {
	id := cfg.NodeID
	if id == "" {
		name := cfg.NodeName
		if name == "" {
			name, _ = os.Hostname()
		}
		id = "nave-node~" + name
	}
	fields := map[string]*structpb.Value{}
	if cfg.Cluster != "" {
		fields[xdstype.MetadataCluster] = structpb.NewStringValue(string(cfg.Cluster))
	}
	if cfg.Network != "" {
		fields[xdstype.MetadataNetwork] = structpb.NewStringValue(string(cfg.Network))
	}
	return &core.Node{Id: id, Cluster: string(cfg.Cluster), Locality: &core.Locality{Region: loc.Region, Zone: loc.Zone},
		Metadata: &structpb.Struct{Fields: fields}}
}

// gracefulStop bounds how long the agent waits for local streams to end when it stops.
const gracefulStop = 3 * time.Second

// localReadBuffer is the read buffer of a local client's connection.
const localReadBuffer = 4 << 10

// credentialsReload is how often the certificate files are looked at.
const credentialsReload = time.Second

// hubDialOptions are how the agent connects to the hub: TLS with HubCAFile
// (and a client certificate with CertFile; the files are read again when
// they change, until ctx ends), else plaintext; and keepalives, so a hub
// that vanished without closing the connection is noticed in 40 s.
func hubDialOptions(ctx context.Context, cfg Config, log *slog.Logger) ([]grpc.DialOption, error) {
	if cfg.CertFile != "" && cfg.HubCAFile == "" {
		return nil, errors.New("node agent: a client certificate (--cert) needs TLS to the hub: set --hub-ca")
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("node agent: --cert and --key go together")
	}
	if cfg.HubServerName != "" && cfg.HubCAFile == "" {
		return nil, errors.New("node agent: --hub-server-name needs TLS to the hub: set --hub-ca")
	}
	transport := insecure.NewCredentials()
	if cfg.HubCAFile != "" {
		store, err := identity.Load(identity.Files{Cert: cfg.CertFile, Key: cfg.KeyFile, CA: cfg.HubCAFile}, log)
		if err != nil {
			return nil, fmt.Errorf("node agent: hub TLS: %w", err)
		}
		transport = store.ClientCreds(cfg.HubServerName, nil)
		go identity.Watch(ctx, log.With("component", "credentials"), credentialsReload, nil, store.Reload)
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}, nil
}

// serve serves the relay to the node's clients and the admin API, and runs
// the relay's upstream streams, until ctx ends or one of them fails.
func serve(ctx context.Context, cfg Config, r *relay.Relay, reg *prometheus.Registry, log *slog.Logger) error {
	lis, err := net.Listen("tcp", cfg.XDSAddr)
	if err != nil {
		return fmt.Errorf("node agent: listen xDS: %w", err)
	}
	var adminLis net.Listener
	if cfg.AdminAddr != "" {
		if adminLis, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
			lis.Close()
			return fmt.Errorf("node agent: listen admin: %w", err)
		}
	}
	// A small read buffer: a node's clients send a request now and then;
	// grpc's default is 32 KiB per connection (its write buffers are
	// shared already).
	srv := grpc.NewServer(grpc.ReadBufferSize(localReadBuffer))
	r.Register(srv)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Run(ctx) })
	g.Go(func() error {
		log.Info("node agent serving xDS", "addr", lis.Addr().String(), "hub", cfg.HubAddr)
		if err := srv.Serve(lis); err != nil {
			return fmt.Errorf("node agent: serve xDS: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		// The local streams end when Run returns; a client that stopped
		// reading holds its handler in a send, so the wait is bounded.
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(gracefulStop):
			log.Warn("local clients did not let go; closing their connections", "after", gracefulStop)
			srv.Stop()
		}
		return nil
	})
	if adminLis != nil {
		g.Go(func() error { return serveAdmin(ctx, adminLis, r, reg, log) })
	}
	return g.Wait()
}
