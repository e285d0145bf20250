package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/nodeagent"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/relay"
	"github.com/navemesh/nave/xds"
)

// The node agent's node. The relay asks the hub for this node's endpoints,
// and serves them to every client behind it.
const (
	relayNodeID = "node-east-1a"
	relayRegion = "us-east"
	relayZone   = "us-east-1a"
)

// relayEnv is a `nave hub` process, a `nave node` process in front of it,
// and in-process spokes publishing manifest directories to the hub.
type relayEnv struct {
	t     testing.TB
	hub   *hubProcess
	agent *nodeAgentProcess
	root  string // the spokes' manifest directories, one per cluster
	// spokeTarget is the hub as startSpoke sees it: it only reads the
	// federation address, which stays the same across hub restarts.
	spokeTarget *testHub
}

// hubProcess is a `nave hub` a test can kill and start again with the same
// ports and data directory.
type hubProcess struct {
	t               testing.TB
	bin             string
	args            []string
	fed, xds, admin string // admin is a base URL
	proc            *proc
}

// nodeAgentProcess is a `nave node`; admin is a base URL.
type nodeAgentProcess struct {
	proc       *proc
	xds, admin string
}

// startRelayEnv starts the hub and the node agent (for us-east/us-east-1a)
// from the nave binary bin; the test starts the spokes it needs.
func startRelayEnv(t testing.TB, bin string) *relayEnv {
	t.Helper()
	dir := t.TempDir()
	tb, _ := yaml.Marshal(tokens)
	tokensFile := filepath.Join(dir, "tokens.yaml")
	writeFile(t, tokensFile, string(tb))
	adminAddr := freeAddr(t)
	h := &hubProcess{t: t, bin: bin, fed: freeAddr(t), xds: freeAddr(t), admin: "http://" + adminAddr}
	h.args = []string{"hub", "--id=hub-0", "--data-dir=" + filepath.Join(dir, "hub"), "--tokens=" + tokensFile,
		"--federation-addr=" + h.fed, "--xds-addr=" + h.xds, "--admin-addr=" + adminAddr, "--snapshot-interval=200ms"}
	h.start()

	agentAdmin := freeAddr(t)
	a := &nodeAgentProcess{xds: freeAddr(t), admin: "http://" + agentAdmin}
	// A short --backoff-max: the restart test awaits the relay's return to the hub.
	a.proc = startProc(t, "node", bin, "node", "--hub="+h.xds, "--xds-addr="+a.xds, "--admin-addr="+agentAdmin,
		"--zone="+relayZone, "--region="+relayRegion, "--node-id="+relayNodeID, "--cluster-id=east", "--network=net1",
		"--backoff-max=500ms")
	// The agent binds its xDS listener before it serves its admin API.
	await(t, "node agent ready", func() bool { return httpStatus(a.admin+"/readyz") == http.StatusOK })

	fed, err := net.ResolveTCPAddr("tcp", h.fed)
	if err != nil {
		t.Fatal(err)
	}
	return &relayEnv{t: t, hub: h, agent: a, root: t.TempDir(), spokeTarget: &testHub{Hub: &hub.Hub{FederationAddr: fed}}}
}

// start starts the hub process (again) and waits until it is ready.
func (h *hubProcess) start() {
	h.t.Helper()
	h.proc = startProc(h.t, "hub", h.bin, h.args...)
	await(h.t, "hub ready", func() bool { return httpStatus(h.admin+"/readyz") == http.StatusOK })
}

// startSpoke runs an in-process spoke for cluster over its manifest
// directory; it reconnects to a restarted hub within 200 ms (startSpoke's
// backoff bound).
func (e *relayEnv) startSpoke(cluster registry.ClusterID, region string) *testSpoke {
	return startSpoke(e.t, e.spokeTarget, cluster, e.dir(cluster), region)
}

func (e *relayEnv) dir(cluster registry.ClusterID) string {
	return filepath.Join(e.root, string(cluster))
}

// clustersOf returns the clusters the hub holds service from.
func (h *hubProcess) clustersOf(t testing.TB, service string) []registry.ClusterID {
	t.Helper()
	var all []adminapi.ServiceInfo
	getJSON(t, h.admin+"/debug/services", &all)
	for _, s := range all {
		if s.Service.String() == service {
			return s.Clusters
		}
	}
	return nil
}

// cluster returns the hub's status of a cluster (the zero value when it has none).
func (h *hubProcess) cluster(t testing.TB, id registry.ClusterID) adminapi.ClusterStatus {
	t.Helper()
	var all []adminapi.ClusterStatus
	getJSON(t, h.admin+"/debug/clusters", &all)
	for _, c := range all {
		if c.Cluster == id {
			return c
		}
	}
	return adminapi.ClusterStatus{}
}

// client returns the node agent's status of the local stream of node
// (ok false while it has none).
func (a *nodeAgentProcess) client(t testing.TB, node string) (c relay.ClientStatus, ok bool) {
	t.Helper()
	var all nodeagent.Clients
	getJSON(t, a.admin+"/debug/clients", &all)
	for _, c := range all.Clients {
		if c.NodeID == node {
			return c, true
		}
	}
	return relay.ClientStatus{}, false
}

// metricValue returns the value of one series (name{labels}) on a
// /metrics page; 0 when it is absent (a counter never incremented).
func metricValue(t testing.TB, url, series string) float64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(httpBody(url)))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err != nil {
				t.Fatalf("%s: series %s: %v", url, series, err)
			}
			return v
		}
	}
	return 0
}

// logHas says whether some line of a process's log contains every one of parts.
func logHas(t testing.TB, p *proc, parts ...string) bool {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		all := true
		for _, part := range parts {
			all = all && strings.Contains(line, part)
		}
		if all {
			return true
		}
	}
	return false
}

func noFailedRPCs(t testing.TB, during string, pollers ...*xdstest.Poller) {
	t.Helper()
	for _, p := range pollers {
		if calls, failed := p.Failures(); len(failed) > 0 {
			t.Errorf("%s: %d of %d RPCs failed %s, first: %v", p.Name(), len(failed), calls, during, failed[0])
		}
	}
}

// The node agent (`nave node`) in front of a `nave hub`, end to end. The
// cases share one build of nave (it takes seconds); each has its own hub,
// node agent and spokes.
func TestRelay(t *testing.T) {
	bin := buildNave(t)
	t.Run("FailsOverAcrossLocalities", func(t *testing.T) { testRelayFailsOverAcrossLocalities(t, bin) })
	t.Run("ServesThroughHubRestart", func(t *testing.T) { testRelayServesThroughHubRestart(t, bin) })
	t.Run("ReportsLocalNACKUpstream", func(t *testing.T) { testRelayReportsLocalNACKUpstream(t, bin) })
	t.Run("ServesAGateway", func(t *testing.T) { testRelayServesAGateway(t, bin) })
}

// grpc-go clients behind the node agent fail over zone -> region ->
// elsewhere and back with no failed RPC, while the hub holds one stream for
// the whole node. Every client gets the node's locality, whatever its own
// bootstrap says.
func testRelayFailsOverAcrossLocalities(t *testing.T, bin string) {
	ctx := testContext(t)
	env := startRelayEnv(t, bin)
	// One address each: two endpoints of one service never share an IP (a spoke merges them).
	e1a := xdstest.StartBackend(t, "east/us-east-1a", "127.0.0.1")
	e1b := xdstest.StartBackend(t, "east/us-east-1b", "127.0.0.2")
	n1c := xdstest.StartBackend(t, "north/us-east-1c", "127.0.0.3")
	w1a := xdstest.StartBackend(t, "west/us-west-1a", "127.0.0.4")
	east, north, west := env.dir("east"), env.dir("north"), env.dir("west")
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", true}, endpoint{e1b, "us-east-1b", true})
	writeService(t, north, "echo", endpoint{n1c, "us-east-1c", true})
	writeService(t, west, "echo", endpoint{w1a, "us-west-1a", true})
	env.startSpoke("east", "us-east")
	env.startSpoke("north", "us-east")
	env.startSpoke("west", "us-west")
	await(t, "echo from three clusters", func() bool { return len(env.hub.clustersOf(t, "default/echo")) == 3 })

	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	inZone := xdstest.StartPoller(pollCtx, t, "client c-zone", xdstest.NewClient(t, env.agent.xds, "c-zone", locality(relayRegion, relayZone), echoTarget))
	// Its bootstrap names another region; behind the relay it is a client of the node like any other.
	claimsWest := xdstest.StartPoller(pollCtx, t, "client c-claims-west", xdstest.NewClient(t, env.agent.xds, "c-claims-west", locality("us-west", "us-west-1a"), echoTarget))
	pollers := []*xdstest.Poller{inZone, claimsWest}
	awaitOnly := func(backends ...string) {
		t.Helper()
		for _, p := range pollers {
			p.AwaitOnly(ctx, t, backends...)
		}
	}
	awaitOnly(e1a.Name)

	// The relay's point: two clients of the node, one stream at the hub.
	await(t, "one hub stream (nave_xds_connected_clients 1) for two local streams (nave_relay_streams 2)", func() bool {
		return metricValue(t, env.hub.admin+"/metrics", xds.MetricConnectedClients) == 1 &&
			metricValue(t, env.agent.admin+"/metrics", relay.MetricStreams) == 2
	})

	// The node's zone goes away: the rest of its region takes over.
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", false}, endpoint{e1b, "us-east-1b", true})
	awaitOnly(e1b.Name, n1c.Name)
	for _, p := range pollers {
		p.Await(ctx, t, "both same-region backends", func(recent []string, _ map[string]bool) bool {
			return slices.Contains(recent, e1b.Name) && slices.Contains(recent, n1c.Name)
		})
	}

	// The whole region goes away: the other region takes over.
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", false}, endpoint{e1b, "us-east-1b", false})
	writeService(t, north, "echo", endpoint{n1c, "us-east-1c", false})
	awaitOnly(w1a.Name)

	// Everything comes back: so does the traffic, to the node's own zone.
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", true}, endpoint{e1b, "us-east-1b", true})
	writeService(t, north, "echo", endpoint{n1c, "us-east-1c", true})
	awaitOnly(e1a.Name)

	stopPolling()
	noFailedRPCs(t, "across zone and region failover behind the relay", pollers...)

	// grpc-go accepted every endpoint assignment the relay sent it.
	for _, node := range []string{"c-zone", "c-claims-west"} {
		await(t, node+"'s last EDS response acknowledged", func() bool {
			c, ok := env.agent.client(t, node)
			eds := c.Types["eds"]
			return ok && eds.Sent != "" && eds.Acked == eds.Sent
		})
		if c, _ := env.agent.client(t, node); c.Types["eds"].LastNACK != nil {
			t.Errorf("%s rejected an EDS response: %+v", node, c.Types["eds"].LastNACK)
		}
	}
}

// The hub is killed and restarted while clients behind the node agent keep
// calling: no RPC fails, a client that starts while the hub is down is
// served the relay's last good state, and once the hub is back a change
// reaches every client through the relay.
func testRelayServesThroughHubRestart(t *testing.T, bin string) {
	ctx := testContext(t)
	env := startRelayEnv(t, bin)
	e1a := xdstest.StartBackend(t, "east/us-east-1a", "127.0.0.1")
	e1b := xdstest.StartBackend(t, "east/us-east-1b", "127.0.0.2")
	east := env.dir("east")
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", true})
	env.startSpoke("east", "us-east")
	await(t, "echo from east", func() bool { return len(env.hub.clustersOf(t, "default/echo")) == 1 })

	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	early := xdstest.StartPoller(pollCtx, t, "client c-early", xdstest.NewClient(t, env.agent.xds, "c-early", locality(relayRegion, relayZone), echoTarget))
	early.AwaitOnly(ctx, t, e1a.Name)

	// The crash comes once east is in a snapshot, so the hub comes back
	// warm: a crash right after a cluster's first session (a cold start that
	// waits for the cluster) is e2e/catalog_crash_test.go's.
	await(t, "the hub to persist east", func() bool {
		var c adminapi.Coordination
		getJSON(t, env.hub.admin+"/debug/hub", &c)
		return c.Snapshot.Clusters == 1
	})
	// SIGKILL: no goodbye on the relay's stream, as in a crash.
	env.hub.proc.kill()
	agentMetrics := env.agent.admin + "/metrics"
	await(t, "the relay to see the hub gone", func() bool { return metricValue(t, agentMetrics, relay.MetricUpstreamConnected) == 0 })

	// A new client of the node starts while there is no hub at all.
	late := xdstest.StartPoller(pollCtx, t, "client c-late", xdstest.NewClient(t, env.agent.xds, "c-late", locality(relayRegion, relayZone), echoTarget))
	late.AwaitOnly(ctx, t, e1a.Name)
	early.AwaitOnly(ctx, t, e1a.Name)
	if got := metricValue(t, agentMetrics, relay.MetricUpstreamConnected); got != 0 {
		t.Fatalf("%s = %v while the hub is down: c-late may not have been served from the relay's cache", relay.MetricUpstreamConnected, got)
	}

	// The same hub comes back (same ports, same data directory); so do the spoke and the relay.
	restarted := time.Now()
	env.hub.start()
	await(t, "east back at the restarted hub", func() bool {
		c := env.hub.cluster(t, "east")
		return c.Connected && c.SessionStart.After(restarted)
	})
	await(t, "the relay back on the restarted hub", func() bool {
		return metricValue(t, agentMetrics, relay.MetricUpstreamConnected) == 1 &&
			metricValue(t, agentMetrics, relay.MetricUpstreamReconnects) >= 1 &&
			metricValue(t, env.hub.admin+"/metrics", xds.MetricConnectedClients) == 1
	})

	// A change after the restart reaches both clients, through the relay's new stream.
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", false}, endpoint{e1b, "us-east-1b", true})
	early.AwaitOnly(ctx, t, e1b.Name)
	late.AwaitOnly(ctx, t, e1b.Name)

	stopPolling()
	noFailedRPCs(t, "across a hub crash and restart", early, late)
}

// A local client that rejects a response is reported to the hub as a NACK
// from the relay's node, naming the client: the node agent's
// /debug/clients, the hub's nave_xds_nacks_total and the hub's log all
// show it. Once the client accepts later responses, no more NACKs are
// reported.
func testRelayReportsLocalNACKUpstream(t *testing.T, bin string) {
	ctx := testContext(t)
	env := startRelayEnv(t, bin)
	e1a := xdstest.StartBackend(t, "east/us-east-1a", "127.0.0.1")
	e1b := xdstest.StartBackend(t, "east/us-east-1b", "127.0.0.2")
	east := env.dir("east")
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", true})
	env.startSpoke("east", "us-east")
	await(t, "echo from east", func() bool { return len(env.hub.clustersOf(t, "default/echo")) == 1 })

	// A raw ADS client of the node, so the test decides what it accepts.
	conn, err := grpc.NewClient(env.agent.xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	streamCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(streamCtx)
	if err != nil {
		t.Fatal(err)
	}
	const client = "nacking-client"
	names := []string{xds.ClusterName(registry.ServiceKey{Namespace: "default", Name: "echo"}, 8080)}
	send := func(req *discovery.DiscoveryRequest) {
		t.Helper()
		req.TypeUrl, req.ResourceNames = resource.EndpointType, names
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	// recvAssignment receives EDS responses until one holds an assignment
	// with n endpoints, and returns it with their ports. The others are
	// ACKed.
	recvAssignment := func(n int) (*discovery.DiscoveryResponse, []uint32) {
		t.Helper()
		for {
			resp, err := st.Recv()
			if err != nil {
				t.Fatalf("waiting for an assignment with %d endpoints from the node agent: %v", n, err)
			}
			if resp.GetTypeUrl() != resource.EndpointType {
				t.Fatalf("response of type %s to an EDS request", resp.GetTypeUrl())
			}
			var ports []uint32
			for _, a := range resp.GetResources() {
				var cla endpointv3.ClusterLoadAssignment
				if err := proto.Unmarshal(a.GetValue(), &cla); err != nil {
					t.Fatal(err)
				}
				for _, l := range cla.GetEndpoints() {
					for _, e := range l.GetLbEndpoints() {
						ports = append(ports, e.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue())
					}
				}
			}
			if len(ports) == n {
				return resp, ports
			}
			send(&discovery.DiscoveryRequest{VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
		}
	}

	send(&discovery.DiscoveryRequest{Node: &core.Node{Id: client}})
	first, ports := recvAssignment(1)
	if ports[0] != uint32(e1a.Addr.Port) {
		t.Fatalf("EDS response has endpoint port %d, want %d (east/us-east-1a)", ports[0], e1a.Addr.Port)
	}

	hubMetrics, agentMetrics := env.hub.admin+"/metrics", env.agent.admin+"/metrics"
	hubNACKs := `nave_xds_nacks_total{type="eds"}`
	before := metricValue(t, hubMetrics, hubNACKs)
	const detail = "e2e: this client rejects the assignment"
	send(&discovery.DiscoveryRequest{ResponseNonce: first.GetNonce(), ErrorDetail: status.New(codes.InvalidArgument, detail).Proto()})

	// The node agent shows which client rejected what.
	await(t, "the NACK in the node agent's /debug/clients", func() bool {
		c, ok := env.agent.client(t, client)
		n := c.Types["eds"].LastNACK
		return ok && n != nil && n.Detail == detail && n.Nonce == first.GetNonce() && n.Version == first.GetVersionInfo()
	})
	// The hub counts it, and logs it as the relay's node's NACK naming the client.
	await(t, "the hub's "+hubNACKs+" to rise", func() bool { return metricValue(t, hubMetrics, hubNACKs) >= before+1 })
	await(t, "the hub's log of the relay's NACK naming the client", func() bool {
		return logHas(t, env.hub.proc, "client rejected a response (NACK)", "node="+relayNodeID, client, detail)
	})
	if got := metricValue(t, agentMetrics, fmt.Sprintf(`%s{type="eds"}`, relay.MetricNACKs)); got != 1 {
		t.Errorf("node agent's %s{type=eds} = %v, want 1", relay.MetricNACKs, got)
	}
	// Reported once: the NACK keeps the version the relay holds, so the hub resends nothing to NACK again.
	if got := metricValue(t, agentMetrics, fmt.Sprintf(`%s{type="eds"}`, relay.MetricReportedNACKs)); got != 1 {
		t.Errorf("node agent's %s{type=eds} = %v, want 1", relay.MetricReportedNACKs, got)
	}

	// A change brings a new response, which the client accepts.
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", true}, endpoint{e1b, "us-east-1b", true})
	second, _ := recvAssignment(2)
	send(&discovery.DiscoveryRequest{VersionInfo: second.GetVersionInfo(), ResponseNonce: second.GetNonce()})
	await(t, "the ACK in the node agent's /debug/clients", func() bool {
		c, _ := env.agent.client(t, client)
		return c.Types["eds"].Acked == second.GetVersionInfo()
	})

	// Once the client accepts, the relay reports no more rejections: a
	// rejection is reported once, and only once it has stood a moment (the
	// relay may be handing the client the state that fixes it), and the
	// hub's later responses, each accepted, bring none either.
	for _, eps := range [][]endpoint{
		{{e1a, "us-east-1a", true}},
		{{e1a, "us-east-1a", true}, {e1b, "us-east-1b", true}},
		{{e1a, "us-east-1a", true}},
	} {
		writeService(t, east, "echo", eps...)
		resp, _ := recvAssignment(len(eps))
		send(&discovery.DiscoveryRequest{VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	if got := metricValue(t, agentMetrics, fmt.Sprintf(`%s{type="eds"}`, relay.MetricReportedNACKs)); got != 1 {
		t.Errorf("node agent's %s{type=eds} = %v after its only client accepted four responses, want still 1", relay.MetricReportedNACKs, got)
	}
	if got := metricValue(t, hubMetrics, hubNACKs); got != before+1 {
		t.Errorf("the hub's %s = %v, want %v: one local NACK, counted once", hubNACKs, got, before+1)
	}
}
