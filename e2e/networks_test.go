package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	"google.golang.org/grpc"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

// Two networks that reach each other only through a gateway. Network net-a
// is a host (a network namespace) running the backends of clusters east
// (zone r1/z1) and north (r1/z2), and a grpc-go xDS client in r1/z1; network
// net-b is another host running west's backend (r2/z3) and a client there.
// Neither host has a route to the other. The gateway host is the test's own
// namespace, which reaches both: a real HAProxy runs there, configured from
// the hub's /debug/networks and /debug/endpoints, forwarding HTTP/2 by
// :authority to its network's endpoints (what an east-west gateway's HTTP/2
// listener does). The clients fail over zone -> region -> other network
// (through the gateway) and back, and no RPC fails.
func TestMultiNetworkFailoverThroughGateways(t *testing.T) {
	haproxy := requireHAProxy(t)
	ctx := testContext(t)
	netA, netB := kubetest.NewHost(t), kubetest.NewHost(t)

	serve := func(host *kubetest.Host, name string) xdstest.Backend {
		lis, err := host.Listen("tcp", "0")
		if err != nil {
			t.Fatal(err)
		}
		return xdstest.ServeBackend(t, name, lis)
	}
	east, north, west := serve(netA, "east/r1-z1"), serve(netA, "north/r1-z2"), serve(netB, "west/r2-z3")

	// The networks really are apart: net-a cannot reach west's backend.
	dialCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if c, err := netA.DialContext(dialCtx, west.Addr.String()); err == nil {
		_ = c.Close()
		t.Fatal("net-a reaches net-b's backend without a gateway")
	}
	cancel()

	// Each network's gateway: an address of the gateway host that the other
	// network reaches (the gateway host's end of its link).
	gwForA := netip.AddrPortFrom(netB.RootIP, uint16(freePort(t, netB.RootIP))) // net-a's gateway, for net-b's clients
	gwForB := netip.AddrPortFrom(netA.RootIP, uint16(freePort(t, netA.RootIP))) // net-b's gateway, for net-a's clients

	h := startHub(t)
	root := t.TempDir()
	on := func(network registry.Network, gw netip.AddrPort) func(*spoke.Config) {
		return func(c *spoke.Config) {
			c.Network = network
			c.NetworkGateways = []registry.Gateway{{Address: gw.Addr().String(), Port: int32(gw.Port())}}
		}
	}
	dirs := map[string]string{}
	for _, c := range []struct {
		cluster, region string
		backend         xdstest.Backend
		zone            string
		tune            func(*spoke.Config)
	}{
		{"east", "r1", east, "z1", on("net-a", gwForA)},
		{"north", "r1", north, "z2", on("net-a", gwForA)},
		{"west", "r2", west, "z3", on("net-b", gwForB)},
	} {
		dirs[c.cluster] = filepath.Join(root, c.cluster)
		writeService(t, dirs[c.cluster], "echo", endpoint{c.backend, c.zone, true})
		startSpoke(t, h, registry.ClusterID(c.cluster), dirs[c.cluster], c.region, c.tune)
	}
	var nets []adminapi.NetworkStatus
	await(t, "both networks with their gateway", func() bool {
		h.getJSON(t, "/debug/networks", &nets)
		return len(nets) == 2 && len(nets[0].Gateways) == 1 && len(nets[1].Gateways) == 1 &&
			nets[0].Endpoints+nets[1].Endpoints == 3
	})

	startGateways(t, ctx, haproxy, h, nets)

	// Clients on each network, dialling from their host.
	xdsAddr := h.XDSAddr.String()
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	inA := xdstest.StartPoller(pollCtx, t, "client net-a r1/z1", xdstest.NewClientOn(t, xdsAddr, "c-a", locality("r1", "z1"), "net-a",
		echoTarget, grpc.WithContextDialer(netA.DialContext)))
	inB := xdstest.StartPoller(pollCtx, t, "client net-b r2/z3", xdstest.NewClientOn(t, xdsAddr, "c-b", locality("r2", "z3"), "net-b",
		echoTarget, grpc.WithContextDialer(netB.DialContext)))
	inA.AwaitOnly(ctx, t, east.Name)
	inB.AwaitOnly(ctx, t, west.Name)

	// The hub says what net-a's client holds: its own zone, its region, and
	// net-b behind net-b's gateway.
	var info adminapi.EndpointsInfo
	h.getJSON(t, "/debug/endpoints?service=default/echo&region=r1&zone=z1&network=net-a", &info)
	if got := describe(info.Ports[0].Assignment); !slices.Equal(got, []string{
		"0 r1/z1 east " + east.Addr.String(),
		"1 r1/z2 north " + north.Addr.String(),
		"2 r2/z3/gateway/net-b gateway of net-b " + gwForB.String(),
	}) {
		t.Errorf("net-a client's assignment: %v", got)
	}

	type change struct {
		cluster string
		backend xdstest.Backend
		zone    string
		ready   bool
	}
	steps := []struct {
		what    string
		changes []change
		a, b    []string // who answers each client afterwards
	}{
		{"east's zone fails: net-a's client goes to its region", []change{{"east", east, "z1", false}},
			[]string{north.Name}, []string{west.Name}},
		{"north fails too: net-a's client goes through net-b's gateway", []change{{"north", north, "z2", false}},
			[]string{west.Name}, []string{west.Name}},
		{"east comes back: net-a's client returns home", []change{{"east", east, "z1", true}},
			[]string{east.Name}, []string{west.Name}},
		// HAProxy's configuration is static: it balances over all of net-a's backends, healthy at the hub or not.
		{"west fails: net-b's client goes through net-a's gateway", []change{{"west", west, "z3", false}},
			[]string{east.Name}, []string{east.Name, north.Name}},
		{"everything comes back", []change{{"north", north, "z2", true}, {"west", west, "z3", true}},
			[]string{east.Name}, []string{west.Name}},
	}
	for _, s := range steps {
		start := time.Now()
		for _, c := range s.changes {
			writeService(t, dirs[c.cluster], "echo", endpoint{c.backend, c.zone, c.ready})
		}
		inA.AwaitOnly(ctx, t, s.a...)
		inB.AwaitOnly(ctx, t, s.b...)
		t.Logf("%s: in %s", s.what, time.Since(start).Round(time.Millisecond))
	}

	stopPolling()
	for _, p := range []*xdstest.Poller{inA, inB} {
		calls, failed := p.Failures()
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d RPCs failed, first: %v", p.Name(), len(failed), calls, failed[0])
		}
	}
}

// describe lists an assignment's endpoints as "priority locality who address".
func describe(a adminapi.Assignment) []string {
	var out []string
	for _, p := range a.Priorities {
		for _, l := range p.Localities {
			for _, e := range l.Endpoints {
				who := string(e.Cluster)
				if e.Gateway != "" {
					who = "gateway of " + string(e.Gateway)
				}
				out = append(out, fmt.Sprintf("%d %s %s %s", p.Priority, l.Locality, who, netip.AddrPortFrom(e.Address, uint16(e.Port))))
			}
		}
	}
	return out
}

// requireHAProxy returns the path of Debian's haproxy (`make haproxy`
// installs it); without it the test skips, or fails under NAVE_E2E_REQUIRE=1.
func requireHAProxy(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"haproxy", "/usr/sbin/haproxy"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv(kubetest.RequireEnv) == "1" {
		t.Fatalf("haproxy is not installed: run `make haproxy` (%s=1)", kubetest.RequireEnv)
	}
	t.Skip("haproxy is not installed: run `make haproxy`")
	return ""
}

// freePort finds a free TCP port on ip.
func freePort(t *testing.T, ip netip.Addr) int {
	t.Helper()
	lis, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}

// gatewayConfig is an HAProxy configuration of the east-west gateways: for
// each network with a gateway, an HTTP/2 (cleartext) frontend at the
// gateway's address that routes each service port by :authority to the
// network's own endpoints of it.
var gatewayConfig = template.Must(template.New("haproxy").Parse(`global
  maxconn 1000
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
{{range .}}
frontend gw-{{.Network}}
  bind {{.Listen}} proto h2
{{- range .Routes}}
  use_backend {{.Backend}} if { req.hdr(host) -i {{.Authority}} }
{{- end}}
{{range .Routes}}
backend {{.Backend}}
  balance roundrobin
{{- range $i, $s := .Servers}}
  server s{{$i}} {{$s}} proto h2
{{- end}}
{{end}}
{{- end}}
`))

type gatewayFrontend struct {
	Network registry.Network
	Listen  string
	Routes  []gatewayRoute
}

type gatewayRoute struct {
	Backend, Authority string
	Servers            []string
}

// startGateways runs HAProxy as every network's gateway, configured from
// what the hub says: each network's gateway address (/debug/networks) and
// the endpoints a client on that network is handed directly (/debug/endpoints).
func startGateways(t *testing.T, ctx context.Context, haproxy string, h *testHub, nets []adminapi.NetworkStatus) {
	t.Helper()
	var services []adminapi.ServiceInfo
	h.getJSON(t, "/debug/services", &services)
	var fronts []gatewayFrontend
	for _, n := range nets {
		f := gatewayFrontend{Network: n.Network, Listen: n.Gateways[0].String()}
		mine := func(c registry.ClusterID) bool { return slices.Contains(n.Clusters, c) }
		for _, svc := range services {
			var info adminapi.EndpointsInfo
			h.getJSON(t, fmt.Sprintf("/debug/endpoints?service=%s&network=%s", svc.Service, n.Network), &info)
			for _, p := range info.Ports {
				r := gatewayRoute{Backend: fmt.Sprintf("%s-%s-%s-%d", n.Network, svc.Service.Namespace, svc.Service.Name, p.Port.Port),
					Authority: strings.TrimPrefix(p.Target, "xds:///")}
				for _, pr := range p.Assignment.Priorities {
					for _, l := range pr.Localities {
						for _, e := range l.Endpoints {
							if e.Gateway == "" && mine(e.Cluster) {
								r.Servers = append(r.Servers, netip.AddrPortFrom(e.Address, uint16(e.Port)).String())
							}
						}
					}
				}
				if len(r.Servers) > 0 {
					f.Routes = append(f.Routes, r)
				}
			}
		}
		fronts = append(fronts, f)
	}
	var cfg bytes.Buffer
	if err := gatewayConfig.Execute(&cfg, fronts); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, cfg.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(haproxy, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy rejects the gateway configuration: %v\n%s\n%s", err, out, cfg.String())
	}
	cmd := exec.CommandContext(ctx, haproxy, "-db", "-f", path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, f := range fronts {
		await(t, "gateway "+f.Listen+" listening", func() bool {
			c, err := net.DialTimeout("tcp", f.Listen, time.Second)
			if err == nil {
				_ = c.Close()
			}
			return err == nil
		})
	}
	t.Logf("gateways:\n%s", cfg.String())
}
