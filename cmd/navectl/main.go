// Command navectl shows what a Nave hub knows, through its admin API.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/navemesh/nave/adminapi"
)

const usage = `navectl: what a Nave hub knows.

Usage:
  navectl [--hub URL] [--token-file F] [-o table|json] clusters
  navectl [--hub URL] [-o table|json] services
  navectl [--hub URL] [-o table|json] endpoints NAMESPACE/NAME [--region R] [--zone Z] [--network N]
  navectl [--hub URL] [-o table|json] networks
  navectl [--hub URL] [-o table|json] imports [CLUSTER]
  navectl [--hub URL] [-o table|json] proxies [NODE]     (alias: clients)
  navectl [--hub URL] [-o table|json] trace NAMESPACE/NAME [--limit N]
  navectl [--hub URL] [-o table|json] routes [NAMESPACE/NAME]

endpoints shows what an xDS client in that locality (and on that network)
receives, priority by priority: another network's endpoints are reached
through its gateways.
networks shows each network, its clusters and the gateways announced for it.
imports shows, for each cluster whose spoke takes imports (at any replica),
how many imports it should hold and whether its spoke has written them; with
CLUSTER, every import that cluster should hold and where it stands.
proxies shows every xDS client of every replica and whether it holds what
it was sent: SYNCED (it acknowledged every response), STALE (a response is
not acknowledged yet; with its age) or NACKED (it rejected the last one);
with NODE, that node's streams in full: what each subscribes to, the
versions sent and acknowledged, its last NACK and why, and each resource
it holds otherwise than the replica would send it now.
trace shows the last changes of a service as each replica saw them through:
when it applied the change, when its xDS resources were published, how many
clients it was pushed to and how many acknowledged it, and the slowest
clients (applied -> pushed, pushed -> acknowledged), all on that replica's
clock.
routes lists the services with routes (GRPCRoute, HTTPRoute) or a
TrafficPolicy; with NAMESPACE/NAME, the routes of each of its ports as the
hub merged them, rule by rule, the backends each sends requests to (and
which no cluster exports: their requests fail UNAVAILABLE), the policy,
the cluster each came from, and the conflicts.
`

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "navectl:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("navectl", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	hubURL := fs.String("hub", envOr("NAVE_HUB", "http://127.0.0.1:15012"), "the hub's admin URL (or $NAVE_HUB)")
	output := fs.String("o", "table", "output: table or json")
	tokenFile := fs.String("token-file", os.Getenv("NAVE_HUB_TOKEN_FILE"), "file holding the hub's admin token (--admin-token-file), or $NAVE_HUB_TOKEN_FILE")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return fmt.Errorf("-o %q: want table or json", *output)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return errors.New("missing command")
	}
	c := client{base: strings.TrimSuffix(*hubURL, "/"), json: *output == "json", out: out}
	if *tokenFile != "" {
		tok, err := readToken(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		c.token = tok
	}
	switch rest[0] {
	case "clusters":
		return c.clusters()
	case "services":
		return c.services()
	case "networks":
		return c.networks()
	case "imports":
		cluster, err := optionalArg(rest, "one cluster")
		if err != nil {
			return err
		}
		return c.imports(cluster)
	case "proxies", "clients":
		node, err := optionalArg(rest, "one node ID")
		if err != nil {
			return err
		}
		return c.proxies(node)
	case "routes":
		service, err := optionalArg(rest, "one service")
		if err != nil {
			return err
		}
		return c.routes(service)
	case "trace":
		tfs := flag.NewFlagSet("navectl trace", flag.ContinueOnError)
		limit := tfs.Int("limit", 10, "how many changes each replica shows")
		service, err := oneArgWithFlags(tfs, rest[1:], "trace", "a service: navectl trace NAMESPACE/NAME")
		if err != nil {
			return err
		}
		if *limit < 1 {
			return fmt.Errorf("--limit %d: want at least 1", *limit)
		}
		return c.trace(service, *limit)
	case "endpoints":
		efs := flag.NewFlagSet("navectl endpoints", flag.ContinueOnError)
		region := efs.String("region", "", "the client's region")
		zone := efs.String("zone", "", "the client's zone")
		network := efs.String("network", "", "the client's network")
		service, err := oneArgWithFlags(efs, rest[1:], "endpoints", "a service: navectl endpoints NAMESPACE/NAME")
		if err != nil {
			return err
		}
		return c.endpoints(service, *region, *zone, *network)
	default:
		return fmt.Errorf("unknown command %q (clusters, services, endpoints, networks, imports, proxies, trace, routes)", rest[0])
	}
}

type client struct {
	base  string
	json  bool
	out   io.Writer
	token string // the hub's admin token ("": none)
}

// get fetches path into v and, with -o json, prints the hub's JSON as it came.
func (c client) get(path string, v any) error {
	hc := http.Client{Timeout: 10 * time.Second}
	req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
	if err != nil {
		return fmt.Errorf("ask the hub: %w", err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("ask the hub: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("read the hub's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(body))
		var e adminapi.ErrorInfo
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return fmt.Errorf("hub answered %s: %s", resp.Status, msg)
	}
	if c.json {
		_, err := c.out.Write(body)
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decode the hub's answer: %w", err)
	}
	return nil
}

func (c client) clusters() error {
	var clusters []adminapi.ClusterStatus
	if err := c.get("/debug/clusters", &clusters); err != nil || c.json {
		return err
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tSTATUS\tHOME\tDATA AGE\tNETWORK\tSERVICES\tENDPOINTS\tEPOCH\tVERSION\tLAST UPDATE\tSPOKE")
	now := time.Now()
	for _, cl := range clusters {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", cl.Cluster, clusterState(cl), dash(cl.Home),
			cl.DataAge(now).Round(time.Second), dash(string(cl.Network)), cl.Services, cl.Endpoints,
			cl.Epoch, cl.Version, ago(cl.LastUpdate), dash(cl.SpokeID))
	}
	return w.Flush()
}

// clusterState words a cluster's liveness: live (a spoke serves it here or
// at another replica), stale, dropped, or waiting (no spoke yet, within the
// grace); restored data not yet confirmed by a live spoke says so.
func clusterState(cl adminapi.ClusterStatus) string {
	st := "waiting"
	switch {
	case cl.Dropped:
		st = "dropped"
	case cl.Stale:
		st = "stale"
	case cl.Connected:
		st = "connected"
	case cl.Home != "":
		st = "live"
	}
	if cl.Restored {
		st += ",restored"
	}
	return st
}

func (c client) services() error {
	var services []adminapi.ServiceInfo
	if err := c.get("/debug/services", &services); err != nil || c.json {
		return err
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SERVICE\tCLUSTERS\tPORTS\tHEALTHY\tDRAINING\tNOT READY\tCONFLICTS")
	for _, s := range services {
		var ports, clusters []string
		for _, p := range s.Ports {
			ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		}
		for _, cl := range s.Clusters {
			clusters = append(clusters, string(cl))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", s.Service, strings.Join(clusters, ","), strings.Join(ports, ","),
			s.Healthy, s.Draining, s.NotReady, len(s.Conflicts))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, s := range services {
		for _, cf := range s.Conflicts {
			fmt.Fprintf(c.out, "conflict in %s: %s\n", s.Service, cf)
		}
	}
	return nil
}

func (c client) endpoints(service, region, zone, network string) error {
	q := url.Values{"service": {service}, "region": {region}, "zone": {zone}, "network": {network}}
	var info adminapi.EndpointsInfo
	if err := c.get("/debug/endpoints?"+q.Encode(), &info); err != nil || c.json {
		return err
	}
	loc := "no locality (every endpoint at priority 0)"
	if !info.Client.IsZero() {
		loc = info.Client.String()
	}
	if info.Network != "" {
		loc += " on network " + string(info.Network)
	}
	fmt.Fprintf(c.out, "%s for a client in %s\n", info.Service, loc)
	for _, p := range info.Ports {
		fmt.Fprintf(c.out, "\n%s  (port %d/%s)\n", p.Target, p.Port.Port, p.Port.Protocol)
		w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "PRIORITY\tLOCALITY\tWEIGHT\tCLUSTER\tENDPOINT\tHEALTH")
		for _, pr := range p.Assignment.Priorities {
			for _, l := range pr.Localities {
				for _, e := range l.Endpoints {
					who := string(e.Cluster)
					if e.Gateway != "" {
						who = fmt.Sprintf("gateway of %s (for %d endpoints)", e.Gateway, e.Weight)
					}
					fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%s\n", pr.Priority, l.Locality, l.Weight, who,
						netip.AddrPortFrom(e.Address, uint16(e.Port)), e.Health)
				}
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if len(p.Assignment.Priorities) == 0 {
			fmt.Fprintln(c.out, "(no healthy endpoint: clients of this port get nothing)")
		}
		for _, l := range p.Assignment.Skipped {
			fmt.Fprintf(c.out, "left out: %s has no healthy endpoint\n", l)
		}
		for _, u := range p.Assignment.Unreachable {
			fmt.Fprintf(c.out, "left out: network %s (%d healthy endpoints) has no gateway this client can reach\n", u.Network, u.Endpoints)
		}
	}
	return nil
}

func (c client) networks() error {
	var nets []adminapi.NetworkStatus
	if err := c.get("/debug/networks", &nets); err != nil || c.json {
		return err
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NETWORK\tCLUSTERS\tSERVICES\tENDPOINTS\tGATEWAYS\tREACHABLE FROM OTHER NETWORKS")
	for _, n := range nets {
		var clusters, gws []string
		for _, cl := range n.Clusters {
			clusters = append(clusters, string(cl))
		}
		for _, g := range n.Gateways {
			s := g.String()
			switch {
			case len(g.Resolved) > 0:
				s += " (" + strings.Join(g.Resolved, " ") + ")"
			case !g.Usable:
				s += " (name not resolved)"
			}
			gws = append(gws, s)
		}
		reach := "yes"
		if !n.Reachable {
			reach = "no: no gateway"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\n", n.Network, strings.Join(clusters, ","), n.Services, n.Endpoints,
			dash(strings.Join(gws, ",")), reach)
	}
	if len(nets) == 0 {
		fmt.Fprintln(w, "(no cluster names a network: every client reaches every endpoint directly)")
	}
	return w.Flush()
}

// oneArgWithFlags parses a command's flags, given before or after its one
// argument, and returns the argument; what says what it is.
func oneArgWithFlags(fs *flag.FlagSet, args []string, command, what string) (string, error) {
	var arg string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return "", err
		}
		if fs.NArg() == 0 {
			break
		}
		if arg != "" {
			return "", fmt.Errorf("%s takes one argument, got %q and %q", command, arg, fs.Arg(0))
		}
		arg, args = fs.Arg(0), fs.Args()[1:]
	}
	if arg == "" {
		return "", fmt.Errorf("%s needs %s", command, what)
	}
	return arg, nil
}

// optionalArg returns a command's one optional argument ("" if none).
func optionalArg(rest []string, what string) (string, error) {
	switch len(rest) {
	case 1:
		return "", nil
	case 2:
		return rest[1], nil
	default:
		return "", fmt.Errorf("%s takes at most %s", rest[0], what)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

// readToken reads the admin token a file holds (surrounding spaces and
// newlines are not part of it).
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
