package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/navemesh/nave/agent"
	"github.com/navemesh/nave/cmd/internal/cli"
	"github.com/navemesh/nave/gateways"
)

// runGateway runs Envoy as a Nave gateway (`nave gateway [flags]`), or
// copies the nave binary for an Envoy image's container (`nave gateway
// install DIR`).
func runGateway(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "install" {
		return installSelf(args[1:])
	}
	cfg, lf, err := parseGatewayFlags(args)
	if err != nil {
		return err
	}
	log, err := lf.Logger()
	if err != nil {
		return err
	}
	return agent.Run(ctx, cfg, log)
}

// parseGatewayFlags reads `nave gateway`'s flags into the agent's configuration.
func parseGatewayFlags(args []string) (agent.Config, cli.LogFlags, error) {
	cfg := agent.DefaultConfig()
	fs := flag.NewFlagSet("nave gateway", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage:
  nave gateway --role=east-west|ingress [flags]   run Envoy as a Nave gateway
  nave gateway install DIR                        copy this binary to DIR/nave (an init container's job)

Flags:
`)
		fs.PrintDefaults()
	}
	var lf cli.LogFlags
	lf.Register(fs)
	n, h, e := &cfg.Node, &cfg.Hub, &cfg.Envoy
	fs.StringVar(&n.Role, "role", "", "the gateway's role: "+gateways.RoleEastWest+" (into this network, for other networks) or "+gateways.RoleIngress+" (required)")
	fs.StringVar(&n.Network, "network", "", "the gateway's network (required for east-west)")
	fs.StringVar(&n.ClusterID, "cluster-id", "", "the gateway's cluster, as its spoke names it")
	fs.StringVar(&n.Region, "region", "", "the gateway's region: it is handed the nearest endpoints first")
	fs.StringVar(&n.Zone, "zone", "", "the gateway's zone")
	fs.StringVar(&n.SubZone, "subzone", "", "the gateway's sub-zone")
	fs.StringVar(&n.ID, "node-id", n.ID, "Envoy's node ID (default: the host name; a pod's name)")
	fs.StringVar(&n.ExposeNamespaces, "expose-namespaces", "", "ingress: comma-separated namespaces whose services to expose (\"*\": all); empty: the hub's --ingress-namespaces")
	fs.StringVar(&n.ExposeSelector, "expose-selector", "", "ingress: labels (k=v,k2=v2) an exposed service's exported labels must carry")
	fs.StringVar(&n.Listeners, "listeners", "", "ingress: comma-separated listeners PORT/http, PORT/https:SECRET or PORT/passthrough (default 8080/http)")
	fs.StringVar(&h.Addr, "hub", h.Addr, "the hub's xDS address, host:port")
	fs.StringVar(&h.CAFile, "hub-ca", "", "PEM CA that signed the hub's xDS certificate: Envoy connects over TLS (Envoy is hot restarted when it changes)")
	fs.StringVar(&h.CertFile, "hub-cert", "", "PEM client certificate Envoy presents to the hub (with --hub-key and --hub-ca)")
	fs.StringVar(&h.KeyFile, "hub-key", "", "PEM private key of --hub-cert")
	fs.StringVar(&h.ServerName, "hub-server-name", "", "name the hub's certificate must carry, also sent as SNI (default: the --hub host)")
	fs.Func("secret", "NAME=CERT,KEY[,CA]: PEM files served to Envoy over SDS as secret NAME (and the CA as NAME"+agent.CASecretSuffix+"), pushed again when they change (repeatable)",
		func(s string) error {
			sf, err := parseSecretFlag(s)
			if err == nil {
				cfg.Secrets = append(cfg.Secrets, sf)
			}
			return err
		})
	fs.StringVar(&cfg.WorkDir, "work-dir", cfg.WorkDir, "directory for Envoy's bootstrap and the SDS socket (keep the path short: a unix socket path has at most 107 bytes)")
	fs.IntVar(&cfg.AdminPort, "envoy-admin-port", cfg.AdminPort, "port of Envoy's admin API, on 127.0.0.1 only")
	fs.StringVar(&e.Binary, "envoy", e.Binary, "Envoy's binary: a path, or a name looked up in PATH")
	fs.StringVar(&e.LogLevel, "envoy-log-level", e.LogLevel, "Envoy's --log-level: trace, debug, info, warning, error, critical or off")
	fs.IntVar(&e.BaseID, "base-id", e.BaseID, "Envoy's --base-id (hot restart's shared memory; distinct per Envoy sharing an IPC namespace)")
	fs.IntVar(&e.Concurrency, "concurrency", 0, "Envoy's worker threads; 0: one per hardware thread of the node (set it to the pod's CPU limit)")
	statusPort := 15021
	fs.IntVar(&statusPort, "status-port", statusPort, "port of the agent's "+agent.ReadyPath+" and "+agent.LivePath)
	fs.DurationVar(&e.DrainDuration, "drain-duration", e.DrainDuration, "on SIGTERM, how long Envoy drains (after drain_listeners?graceful) before it is stopped")
	fs.DurationVar(&e.DrainTime, "drain-time", e.DrainTime, "Envoy's --drain-time-s: how long an old Envoy's listeners drain on a hot restart")
	fs.DurationVar(&e.ParentShutdown, "parent-shutdown", e.ParentShutdown, "Envoy's --parent-shutdown-time-s: when an old Envoy exits after a hot restart (longer than --drain-time)")
	fs.DurationVar(&e.ChildReadyTimeout, "child-ready-timeout", e.ChildReadyTimeout, "how long the new Envoy of a hot restart has to turn LIVE before it is abandoned (its parent serves on)")
	if err := fs.Parse(args); err != nil {
		return cfg, lf, err
	}
	if fs.NArg() > 0 {
		return cfg, lf, fmt.Errorf("unexpected arguments %q (flags only; or: nave gateway install DIR)", fs.Args())
	}
	if statusPort < 1 || statusPort > 65535 {
		return cfg, lf, fmt.Errorf("--status-port %d: want 1 to 65535", statusPort)
	}
	if statusPort == cfg.AdminPort {
		return cfg, lf, fmt.Errorf("--status-port and --envoy-admin-port are both %d", statusPort)
	}
	cfg.StatusAddr = fmt.Sprintf(":%d", statusPort)
	switch n.Role {
	case gateways.RoleEastWest, gateways.RoleIngress:
	case "":
		return cfg, lf, fmt.Errorf("--role is required: %s or %s", gateways.RoleEastWest, gateways.RoleIngress)
	default:
		return cfg, lf, fmt.Errorf("--role %q: want %s or %s", n.Role, gateways.RoleEastWest, gateways.RoleIngress)
	}
	if n.Role == gateways.RoleEastWest && n.Network == "" {
		return cfg, lf, errors.New("--role east-west needs --network: the gateway is the way into that network")
	}
	return cfg, lf, nil
}

// parseSecretFlag parses NAME=CERT,KEY[,CA].
func parseSecretFlag(s string) (agent.SecretFiles, error) {
	name, files, ok := strings.Cut(s, "=")
	parts := strings.Split(files, ",")
	if !ok || strings.TrimSpace(name) == "" || len(parts) < 2 || len(parts) > 3 ||
		slices.ContainsFunc(parts, func(p string) bool { return strings.TrimSpace(p) == "" }) {
		return agent.SecretFiles{}, fmt.Errorf("%q: want NAME=CERT,KEY or NAME=CERT,KEY,CA", s)
	}
	sf := agent.SecretFiles{Name: strings.TrimSpace(name), CertFile: strings.TrimSpace(parts[0]), KeyFile: strings.TrimSpace(parts[1])}
	if len(parts) == 3 {
		sf.CAFile = strings.TrimSpace(parts[2])
	}
	return sf, nil
}

// installSelf copies the running nave binary to DIR/nave. The nave image
// is distroless (no shell, no cp), so an init container of that image runs
// `nave gateway install /shared` to hand the binary to the Envoy container.
func installSelf(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: nave gateway install DIR")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install: find this binary: %w", err)
	}
	src, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer src.Close()
	dest := filepath.Join(args[0], "nave")
	tmp, err := os.CreateTemp(args[0], ".nave-*")
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return fmt.Errorf("install: copy to %s: %w", args[0], err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("install: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	fmt.Printf("installed %s\n", dest)
	return nil
}
