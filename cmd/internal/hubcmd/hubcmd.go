// Package hubcmd is the command line of the hub (`nave hub`).
package hubcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/navemesh/nave/cmd/internal/cli"
	"github.com/navemesh/nave/gateways"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/registry"
)

// Run parses the flags of `nave hub` in args and runs a hub replica until ctx ends.
func Run(ctx context.Context, args []string) error {
	cfg, log, err := Parse(args)
	if err != nil {
		return err
	}
	return hub.Run(ctx, cfg, log)
}

// Parse turns the flags of `nave hub` into the hub's configuration, checked
// (hub.Config.Validate: every problem at once), and its logger.
func Parse(args []string) (hub.Config, *slog.Logger, error) {
	cfg := hub.DefaultConfig()
	fs := flag.NewFlagSet("nave hub", flag.ContinueOnError)
	var lf cli.LogFlags
	lf.Register(fs)
	var etcd string
	fs.StringVar(&cfg.ID, "id", cfg.ID, "name of this hub replica")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the embedded etcd's data")
	fs.StringVar(&cfg.FederationAddr, "federation-addr", cfg.FederationAddr, "listen address for spokes (gRPC)")
	fs.StringVar(&cfg.XDSAddr, "xds-addr", cfg.XDSAddr, "listen address for xDS clients (gRPC)")
	fs.StringVar(&cfg.AdminAddr, "admin-addr", cfg.AdminAddr, "listen address for /healthz, /readyz, /metrics and /debug (HTTP)")
	fs.StringVar(&etcd, "etcd-endpoints", "", "comma-separated etcd endpoints; empty runs an embedded etcd in --data-dir")
	fs.StringVar(&cfg.EtcdPrefix, "etcd-prefix", cfg.EtcdPrefix, "key prefix of the hub's data in etcd")
	fs.StringVar(&cfg.EtcdTLS.CAFile, "etcd-ca", "", "PEM CA that signed the external etcd's certificate: connect over TLS")
	fs.StringVar(&cfg.EtcdTLS.CertFile, "etcd-cert", "", "PEM client certificate the hub presents to etcd (--client-cert-auth), with --etcd-key")
	fs.StringVar(&cfg.EtcdTLS.KeyFile, "etcd-key", "", "PEM private key of --etcd-cert")
	fs.StringVar(&cfg.TokensFile, "tokens", "", "YAML file of `cluster-id: token` lines; empty admits any spoke (development only)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate of the federation server (with --tls-key: spokes connect over TLS)")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM private key of the federation server")
	var join, policy, policies string
	fs.StringVar(&join, "join", "", "comma-separated gossip addresses (host:port, or a DNS name resolving to every replica) of peer replicas; needs --etcd-endpoints")
	fs.StringVar(&cfg.GossipAddr, "gossip-addr", "", "gossip listen address (TCP and UDP); default :7946 when --join is set")
	fs.StringVar(&cfg.AdvertiseHost, "advertise-host", "", "host peers reach this replica at (default: the --gossip-addr host or the first non-loopback address)")
	fs.StringVar(&cfg.PeerCAFile, "peer-ca", "", "PEM CA that signed the replicas' federation certificates (with --tls-cert and --join)")
	fs.StringVar(&cfg.ClientCAFile, "client-ca", "", "PEM CA of the client certificates the federation port asks for (with --tls-cert): a spoke's names its cluster (spiffe://TRUST-DOMAIN/nave/cluster/ID), a replica's itself (.../nave/replica/ID); without --tokens a certificate is required")
	fs.StringVar(&cfg.TrustDomain, "trust-domain", cfg.TrustDomain, "SPIFFE trust domain of every identity")
	fs.StringVar(&cfg.CRLFile, "crl", "", "PEM or DER revocation list of the client CAs: revoked certificates are refused, and their sessions end when it is reloaded")
	fs.StringVar(&cfg.XDSTLSCertFile, "xds-tls-cert", "", "PEM certificate of the xDS server (with --xds-tls-key: clients connect over TLS)")
	fs.StringVar(&cfg.XDSTLSKeyFile, "xds-tls-key", "", "PEM private key of the xDS server")
	fs.StringVar(&cfg.XDSClientCAFile, "xds-client-ca", "", "PEM CA of the client certificates the xDS port requires (mTLS)")
	fs.StringVar(&cfg.ExportPolicyFile, "export-policy", "", "YAML policy of the namespaces each cluster may export into, reloaded on change; without it every cluster may export everywhere")
	fs.StringVar(&cfg.XDSPolicyFile, "xds-policy", "", "YAML policy of the namespaces each xDS client identity may receive (with --xds-client-ca); see deploy/README.md")
	fs.StringVar(&cfg.PeerTokenFile, "peer-token-file", "", "file holding the tokens replicas share, one per line: the first is presented, each is accepted (rotation without a pause); reloaded when it changes; empty leaves replication open (development only)")
	fs.StringVar(&cfg.AdminTokenFile, "admin-token-file", "", "file holding the bearer token the admin address requires for /debug/* and /metrics (re-read when it changes); /healthz and /readyz stay open; empty: the admin API is open (bind --admin-addr to localhost)")
	fs.DurationVar(&cfg.Liveness.StaleAfter, "stale-after", cfg.Liveness.StaleAfter, "a cluster with no live spoke at any replica turns stale after this (its endpoints are kept)")
	fs.DurationVar(&cfg.Liveness.DropAfter, "drop-after", cfg.Liveness.DropAfter, "a cluster under the drop policy loses its endpoints after this long without a live spoke")
	fs.StringVar(&policy, "cluster-policy", string(cfg.Liveness.DefaultPolicy), "what happens to a dead cluster's endpoints after --drop-after: keep (fail-static) or drop (fail-closed)")
	fs.StringVar(&policies, "cluster-policies", "", "per-cluster policies overriding --cluster-policy, e.g. east=drop,west=keep")
	fs.IntVar(&cfg.Connections.MaxConnections, "max-connections", cfg.Connections.MaxConnections, "connections each of the federation and xDS ports holds at most (0: no bound); more are closed on accept")
	fs.IntVar(&cfg.Connections.MaxConnectionsPerPeer, "max-connections-per-peer", cfg.Connections.MaxConnectionsPerPeer, "connections one IP address may hold on each port (0: no bound)")
	fs.IntVar(&cfg.Connections.AdminMaxConnections, "admin-max-connections", cfg.Connections.AdminMaxConnections, "connections the admin port holds at most (0: no bound); more are closed on accept")
	fs.IntVar(&cfg.Connections.AdminMaxConnectionsPerPeer, "admin-max-connections-per-peer", cfg.Connections.AdminMaxConnectionsPerPeer, "admin connections one IP address may hold (0: no bound)")
	fs.IntVar(&cfg.Connections.XDSStreamsPerPeer, "max-xds-streams-per-peer", cfg.Connections.XDSStreamsPerPeer, "xDS streams one IP address may hold (0: no bound)")
	fs.IntVar(&cfg.Connections.MaxStreamsPerConnection, "max-streams-per-connection", cfg.Connections.MaxStreamsPerConnection, "concurrent streams of one HTTP/2 connection on the federation and xDS ports")
	fs.Float64Var(&cfg.XDS.RequestsPerSecond, "xds-requests-per-second", cfg.XDS.RequestsPerSecond, "requests one xDS stream may make per second before it is slowed (0: no bound)")
	fs.Float64Var(&cfg.Federation.UpdatesPerSecond, "updates-per-second", cfg.Federation.UpdatesPerSecond, "updates of one cluster the hub applies per second before the spoke is slowed (0: no bound)")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's CPU and heap profiles at /debug/pprof on the admin address")
	fs.BoolVar(&cfg.FastGossip, "gossip-fast", false, "gossip with test timings: failures detected in about a second (tests and demos on one machine)")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "least time between two persisted snapshots of the registry (saved by the leader after changes)")
	fs.DurationVar(&cfg.ColdStartWait, "cold-start-wait", cfg.ColdStartWait, "a replica starting without clusters its catalog knows (no snapshot, or an older one) waits up to this long for them to resync before it serves xDS (no client gets a world in part); 0: serve at once")
	fs.IntVar(&cfg.SnapshotFormat, "snapshot-format", cfg.SnapshotFormat, "format of the snapshots the leader writes: 2 (protobuf), or 1 (JSON) before going back to a version that reads only format 1")
	cidrs := hub.DefaultClustersetCIDR
	fs.StringVar(&cidrs, "clusterset-cidr", cidrs, "comma-separated ranges (one IPv4, one IPv6 at most) that ClusterSetIP imports get their clusterset IP from; empty: each cluster allocates its own")
	fs.DurationVar(&cfg.ClustersetIPHoldDown, "clusterset-ip-hold-down", 0, "how long a released clusterset IP stays reserved for its service (default: --drop-after plus 5m)")
	var ingressNamespaces, ingressSelector string
	fs.StringVar(&ingressNamespaces, "ingress-namespaces", "", "comma-separated namespaces (\"*\": all) whose services an ingress gateway exposes when its metadata names none; empty: nothing")
	fs.StringVar(&ingressSelector, "ingress-selector", "", "with --ingress-namespaces, labels (k=v,k2=v2) an exposed service's exported labels must carry")
	if err := fs.Parse(args); err != nil {
		return hub.Config{}, nil, err
	}
	cfg.IngressExposure.Namespaces = cli.SplitList(ingressNamespaces)
	// Every flag's problem is reported at once, with the configuration's.
	var errs []error
	sel, err := gateways.ParseSelector(ingressSelector)
	if err != nil {
		errs = append(errs, fmt.Errorf("--ingress-selector: %w", err))
	}
	cfg.IngressExposure.Selector = sel
	cfg.ClustersetCIDRs = nil
	for _, c := range cli.SplitList(cidrs) {
		prefix, err := netip.ParsePrefix(c)
		if err != nil {
			errs = append(errs, fmt.Errorf("--clusterset-cidr %q: %w", c, err))
			continue
		}
		cfg.ClustersetCIDRs = append(cfg.ClustersetCIDRs, prefix)
	}
	cfg.EtcdEndpoints = cli.SplitList(etcd)
	cfg.Join = cli.SplitList(join)
	cfg.Liveness.DefaultPolicy = hub.Policy(policy)
	cfg.Liveness.Policies = map[registry.ClusterID]hub.Policy{}
	for _, item := range cli.SplitList(policies) {
		id, p, ok := strings.Cut(item, "=")
		if !ok {
			errs = append(errs, fmt.Errorf("--cluster-policies %q: want cluster=keep|drop", item))
			continue
		}
		cfg.Liveness.Policies[registry.ClusterID(id)] = hub.Policy(p)
	}
	log, err := lf.Logger()
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(append(errs, cfg.Validate())...); err != nil {
		return hub.Config{}, nil, err
	}
	return cfg, log, nil
}
