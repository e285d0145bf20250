// Package nodecmd is the command line of the node agent (`nave node`, and
// the `nave-node` binary that links nothing but the relay).
package nodecmd

import (
	"context"
	"errors"
	"flag"
	"time"

	"github.com/navemesh/nave/cmd/internal/cli"
	"github.com/navemesh/nave/nodeagent"
	"github.com/navemesh/nave/registry"
)

// Run parses the flags of `nave node` in args and runs the node agent until ctx ends.
func Run(ctx context.Context, args []string) error {
	cfg := nodeagent.DefaultConfig()
	fs := flag.NewFlagSet("nave node", flag.ContinueOnError)
	var lf cli.LogFlags
	lf.Register(fs)
	var cluster, network string
	fs.StringVar(&cfg.HubAddr, "hub", "", "the hub's xDS address (required)")
	fs.StringVar(&cfg.HubCAFile, "hub-ca", "", "PEM CA that signed the hub's xDS certificate: connect over TLS")
	fs.StringVar(&cfg.HubServerName, "hub-server-name", "", "name to expect in the hub's certificate (default: the --hub host)")
	fs.StringVar(&cfg.CertFile, "cert", "", "PEM client certificate of this agent, for a hub whose xDS port asks for one (with --hub-ca); the hub's --xds-policy applies to its identity")
	fs.StringVar(&cfg.KeyFile, "key", "", "PEM private key of --cert")
	fs.StringVar(&cfg.XDSAddr, "xds-addr", cfg.XDSAddr, "listen address for the node's xDS clients (gRPC)")
	fs.StringVar(&cfg.AdminAddr, "admin-addr", cfg.AdminAddr, "listen address for /healthz, /readyz, /metrics and /debug/clients (HTTP); empty serves none")
	fs.StringVar(&cfg.NodeName, "node-name", "", "the Kubernetes node this agent runs on (the downward API's spec.nodeName): its zone and region labels are read once")
	fs.StringVar(&cfg.NodeID, "node-id", "", "the ID the agent gives the hub (default nave-node~NODE)")
	fs.StringVar(&cfg.Locality.Region, "region", "", "the node's region (wins over its label; with --zone the Node is not read)")
	fs.StringVar(&cfg.Locality.Zone, "zone", "", "the node's zone (wins over its label)")
	fs.StringVar(&cluster, "cluster-id", "", "this cluster's ID, sent to the hub as node metadata (CLUSTER_ID)")
	fs.StringVar(&network, "network", "", "the cluster's network, sent to the hub as node metadata (NETWORK)")
	fs.StringVar(&cfg.Kube.Server, "kube-server", cfg.Kube.Server, "the Kubernetes API server's URL (default: the pod's KUBERNETES_SERVICE_HOST and _PORT)")
	fs.StringVar(&cfg.Kube.TokenFile, "kube-token-file", cfg.Kube.TokenFile, "bearer token for the Kubernetes API (re-read at each request)")
	fs.StringVar(&cfg.Kube.CAFile, "kube-ca", cfg.Kube.CAFile, "PEM CA of the Kubernetes API server")
	fs.DurationVar(&cfg.Relay.RetainUnwanted, "retain-unwanted", cfg.Relay.RetainUnwanted, "how long a resource no local client wants any more stays cached, and a gateway's view once it is gone (a client that reconnects finds them, even with the hub away)")
	fs.IntVar(&cfg.Relay.MaxGateways, "max-gateways", cfg.Relay.MaxGateways, "most gateways on this node served through the agent (each has its own stream to the hub); 0 serves none")
	fs.DurationVar(&cfg.Relay.BackoffMax, "backoff-max", cfg.Relay.BackoffMax, "longest wait between two attempts to reach the hub")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("unexpected arguments: " + fs.Arg(0))
	}
	if cfg.HubAddr == "" {
		return errors.New("--hub is required")
	}
	if cfg.Relay.BackoffMax < cfg.Relay.BackoffMin {
		return errors.New("--backoff-max must be at least " + cfg.Relay.BackoffMin.String())
	}
	if cfg.Relay.MaxGateways < 0 {
		return errors.New("--max-gateways must be 0 or more")
	}
	if cfg.Relay.RetainUnwanted < time.Second {
		return errors.New("--retain-unwanted must be at least 1s")
	}
	cfg.Cluster, cfg.Network = registry.ClusterID(cluster), registry.Network(network)
	log, err := lf.Logger()
	if err != nil {
		return err
	}
	return nodeagent.Run(ctx, cfg, log)
}
