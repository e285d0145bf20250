// Package spokecmd is the command line of the spoke (`nave spoke`, and the
// `nave-spoke` binary that links nothing of the hub).
package spokecmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/navemesh/nave/cmd/internal/cli"
	"github.com/navemesh/nave/lease"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

// Run parses the flags of `nave spoke` in args and runs the spoke until ctx ends.
func Run(ctx context.Context, args []string) error {
	cfg := spoke.DefaultConfig()
	fs := flag.NewFlagSet("nave spoke", flag.ContinueOnError)
	var lf cli.LogFlags
	lf.Register(fs)
	var cluster, network, export string
	fs.StringVar(&cluster, "cluster-id", "", "this cluster's ID (a DNS label, required)")
	fs.StringVar(&network, "network", "", "the cluster's network name")
	fs.Func("network-gateway", "host:port of an east-west gateway of the network, announced to the hub (repeatable; also found from Services labelled "+spoke.NetworkGatewayLabel+")",
		func(s string) error {
			g, err := registry.ParseGateway(s)
			if err == nil {
				cfg.NetworkGateways = append(cfg.NetworkGateways, g)
			}
			return err
		})
	fs.StringVar(&cfg.HubAddr, "hub", "127.0.0.1:15010", "the hub's federation address")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding this cluster's federation token")
	fs.StringVar(&cfg.HubCAFile, "hub-ca", "", "PEM CA that signed the hub's certificate: connect over TLS")
	fs.StringVar(&cfg.HubServerName, "hub-server-name", "", "name to expect in the hub's certificate (default: the --hub host)")
	fs.StringVar(&cfg.CertFile, "cert", "", "PEM client certificate naming this cluster (spiffe://TRUST-DOMAIN/nave/cluster/ID), for a hub that asks for one (with --hub-ca)")
	fs.StringVar(&cfg.KeyFile, "key", "", "PEM private key of --cert")
	fs.StringVar(&cfg.Source, "source", "", "where services come from: kube (the Kubernetes API; the default in a pod or with --kubeconfig) or dir:PATH (a directory of manifests)")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (kube source); empty uses the pod's service account")
	kubeQPS := float64(cfg.KubeQPS)
	fs.Float64Var(&kubeQPS, "kube-qps", kubeQPS, "requests per second to the Kubernetes API (kube source)")
	fs.IntVar(&cfg.KubeBurst, "kube-burst", cfg.KubeBurst, "burst of requests to the Kubernetes API (kube source)")
	var namespaces, exclude string
	fs.StringVar(&namespaces, "namespaces", "", "comma-separated namespaces whose services may federate; empty: all (kube source)")
	fs.StringVar(&exclude, "exclude-namespaces", strings.Join(cfg.Namespaces.Exclude, ","), "comma-separated namespaces whose services never federate (kube source)")
	le := &cfg.LeaderElection
	fs.BoolVar(&le.Enabled, "leader-elect", le.Enabled, "with several replicas, only the holder of a Lease streams (kube source)")
	fs.StringVar(&le.Namespace, "lease-namespace", le.Namespace, "namespace of the leader-election Lease")
	fs.StringVar(&le.Name, "lease-name", le.Name, "name of the leader-election Lease")
	fs.DurationVar(&le.LeaseDuration, "lease-duration", le.LeaseDuration, "how long a standby waits after the leader's last renewal before taking over")
	fs.DurationVar(&le.RenewDeadline, "renew-deadline", le.RenewDeadline, "how long the leader tries to renew before it stops streaming (less than --lease-duration)")
	fs.DurationVar(&le.RetryPeriod, "retry-period", le.RetryPeriod, "how often leader election retries")
	fs.IntVar(&cfg.GiveUpAfter, "give-up-after", cfg.GiveUpAfter, "a leader that fails this many hub sessions in a row gives up the Lease so a standby on another node tries (0: never)")
	fs.DurationVar(&le.StandBack, "stand-back", le.StandBack, "how long a leader that gave up the Lease stays out of the election (0: --lease-duration)")
	fs.StringVar(&cfg.Region, "region", "", "region of endpoints whose node has no topology.kubernetes.io/region label")
	fs.StringVar(&export, "export", "labeled", "which services federate: labeled (nave.io/export=true) or all")
	fs.BoolVar(&cfg.Imports, "imports", cfg.Imports, "write the MCS imports the hub sends (ServiceImports, EndpointSlices, derived Services) into the cluster (kube source, leader only)")
	importsQPS := float64(cfg.ImportsQPS)
	fs.Float64Var(&importsQPS, "imports-qps", importsQPS, "writes per second of the import writer to the Kubernetes API (a client of its own)")
	fs.IntVar(&cfg.ImportsBurst, "imports-burst", cfg.ImportsBurst, "burst of the import writer's writes to the Kubernetes API")
	fs.DurationVar(&cfg.PollInterval, "poll", cfg.PollInterval, "how often a dir source rescans its directory (it watches it for changes; it polls at this interval if it cannot)")
	fs.StringVar(&cfg.AdminAddr, "admin-addr", "", "listen address for /healthz, /readyz and /metrics (HTTP); empty serves none")
	fs.StringVar(&cfg.Federation.SpokeID, "spoke-id", cfg.Federation.SpokeID, "name of this spoke instance, unique among spokes ($POD_NAME in a pod, else hostname-PID)")
	fs.DurationVar(&cfg.Federation.DigestInterval, "digest-interval", cfg.Federation.DigestInterval, "how often to compare digests with the hub")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Cluster, cfg.Network = registry.ClusterID(cluster), registry.Network(network)
	if len(cfg.NetworkGateways) > 0 && cfg.Network == "" {
		return errors.New("--network-gateway needs --network: a gateway is a way into a network")
	}
	cfg.Federation.Build = cli.BuildVersion()
	cfg.KubeQPS, cfg.ImportsQPS = float32(kubeQPS), float32(importsQPS)
	cfg.Namespaces.Include, cfg.Namespaces.Exclude = cli.SplitList(namespaces), cli.SplitList(exclude)
	switch export {
	case "labeled":
	case "all":
		cfg.ExportAll = true
	default:
		return fmt.Errorf("--export %q: want labeled or all", export)
	}
	if cfg.Source == "" {
		if os.Getenv("KUBERNETES_SERVICE_HOST") == "" && cfg.Kubeconfig == "" {
			return errors.New("--source is required outside a pod: kube (with --kubeconfig) or dir:PATH")
		}
		cfg.Source = "kube"
	}
	if le.Enabled && cfg.Source == "kube" {
		if err := lease.ValidTiming(le.LeaseDuration, le.RenewDeadline, le.RetryPeriod); err != nil {
			return fmt.Errorf("leader election needs 0 < --retry-period < --renew-deadline < --lease-duration: %w", err)
		}
	}
	if cfg.PollInterval < 10*time.Millisecond {
		return errors.New("--poll must be at least 10ms")
	}
	log, err := lf.Logger()
	if err != nil {
		return err
	}
	return spoke.Run(ctx, cfg, log)
}
