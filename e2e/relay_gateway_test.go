package e2e

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/agent"
	"github.com/navemesh/nave/gateways"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/nodeagent"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/relay"
	"github.com/navemesh/nave/xds"
)

// envoyStandIn is a test double of Envoy's xDS client (no Envoy binary
// runs where Nave is built and tested): over one ADS stream it asks for every
// listener and cluster, then for the routes its listeners name and the
// endpoints of its EDS clusters, ACKs every response and keeps the latest
// resources. Its node is the one `nave gateway` writes into Envoy's
// bootstrap.
type envoyStandIn struct {
	mu        sync.Mutex
	resources map[string]map[string]proto.Message // by type URL, then name
	// firstWithout records a response of a type that came before any other of
	// that type and held nothing (Envoy would take it as none, and go live).
	firstWithout []string
	err          error
}

// startEnvoyStandIn connects to addr as the gateway node.
func startEnvoyStandIn(ctx context.Context, t testing.TB, addr string, node *core.Node) *envoyStandIn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(func() { cancel(); _ = conn.Close() })
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := &envoyStandIn{resources: map[string]map[string]proto.Message{}}
	// Envoy asks for clusters, then listeners, wildcard; its node comes on the first request only.
	asked := map[string][]string{}
	send := func(req *discovery.DiscoveryRequest) error {
		asked[req.GetTypeUrl()] = req.GetResourceNames()
		return st.Send(req)
	}
	if err := send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if err := send(&discovery.DiscoveryRequest{TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := e.follow(st, send, asked)
		e.mu.Lock()
		e.err = err
		e.mu.Unlock()
	}()
	return e
}

// follow applies and ACKs responses until the stream ends, asking for the
// routes and endpoints the listeners and clusters name.
func (e *envoyStandIn) follow(st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient,
	send func(*discovery.DiscoveryRequest) error, asked map[string][]string) error {
	for {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		t := resp.GetTypeUrl()
		got := map[string]proto.Message{}
		for _, a := range resp.GetResources() {
			m, err := a.UnmarshalNew()
			if err != nil {
				return err
			}
			got[cachev3.GetResourceName(m)] = m
		}
		e.mu.Lock()
		if _, seen := e.resources[t]; !seen && len(got) == 0 {
			e.firstWithout = append(e.firstWithout, t)
		}
		if cachev3.ResourceRequiresFullStateInSotw(t) || e.resources[t] == nil {
			e.resources[t] = got
		} else {
			for name, m := range got {
				e.resources[t][name] = m
			}
		}
		e.mu.Unlock()
		if err := send(&discovery.DiscoveryRequest{TypeUrl: t, ResourceNames: asked[t], VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			return err
		}
		var next string
		var names []string
		switch t {
		case resource.ListenerType:
			next, names = resource.RouteType, routeNames(got)
		case resource.ClusterType:
			next, names = resource.EndpointType, edsNames(got)
		}
		if next != "" && !slices.Equal(names, asked[next]) {
			if err := send(&discovery.DiscoveryRequest{TypeUrl: next, ResourceNames: names}); err != nil {
				return err
			}
		}
	}
}

// routeNames are the route configurations the listeners' HTTP connection managers name.
func routeNames(listeners map[string]proto.Message) []string {
	var out []string
	for _, m := range listeners {
		for _, fc := range m.(*listenerv3.Listener).GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var h hcm.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&h) == nil && h.GetRds().GetRouteConfigName() != "" {
					out = append(out, h.GetRds().GetRouteConfigName())
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// edsNames are the EDS clusters' names.
func edsNames(clusters map[string]proto.Message) []string {
	var out []string
	for name, m := range clusters {
		if m.(*clusterv3.Cluster).GetType() == clusterv3.Cluster_EDS {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// count returns how many resources of type t the gateway holds.
func (e *envoyStandIn) count(t string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.resources[t])
}

// get returns the resource of type t named name (nil: not held).
func (e *envoyStandIn) get(t, name string) proto.Message {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.resources[t][name]
}

// firstEmpty returns the types first answered with nothing, and why the stream ended.
func (e *envoyStandIn) firstEmpty() ([]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.firstWithout), e.err
}

// serves says whether the gateway holds its listener and routes for echo,
// and echo's endpoints with the backend at addr first (priority 0) and
// only it there.
func (e *envoyStandIn) serves(listener string, cluster string, first netip.Addr) bool {
	l, _ := e.get(resource.ListenerType, listener).(*listenerv3.Listener)
	rc, _ := e.get(resource.RouteType, listener).(*routev3.RouteConfiguration)
	cla, _ := e.get(resource.EndpointType, cluster).(*endpointv3.ClusterLoadAssignment)
	if l == nil || rc == nil || len(rc.GetVirtualHosts()) == 0 || cla == nil || e.get(resource.ClusterType, cluster) == nil {
		return false
	}
	var p0 []string
	for _, le := range cla.GetEndpoints() {
		if le.GetPriority() == 0 {
			for _, lb := range le.GetLbEndpoints() {
				p0 = append(p0, lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
			}
		}
	}
	return slices.Equal(p0, []string{first.String()})
}

// ingressNode is the node `nave gateway` writes into Envoy's bootstrap for
// an ingress gateway id exposing namespace default on 8080, naming no locality.
func ingressNode(t testing.TB, id string) *core.Node {
	t.Helper()
	b, err := agent.Bootstrap(agent.BootstrapConfig{
		Node:      agent.Node{ID: id, Role: gateways.RoleIngress, ExposeNamespaces: "default", Listeners: "8080/http"},
		Hub:       agent.Hub{Addr: "127.0.0.1:15011"},
		AdminPort: 15000, SDSSocket: filepath.Join(t.TempDir(), agent.SDSSocketName)})
	if err != nil {
		t.Fatal(err)
	}
	return b.GetNode()
}

// An ingress gateway (its node as `nave gateway` writes it, naming no
// locality) served through the node agent: it gets its listeners, routes,
// clusters and endpoints, in the node's locality, on a stream of its own
// at the hub; with the hub killed, a hot-restarted gateway is served the
// same from the agent; once the hub is back, a change reaches both.
func testRelayServesAGateway(t *testing.T, bin string) {
	ctx := testContext(t)
	env := startRelayEnv(t, bin)
	e1a := xdstest.StartBackend(t, "east/us-east-1a", "127.0.0.1")
	w1a := xdstest.StartBackend(t, "west/us-west-1a", "127.0.0.4")
	east, west := env.dir("east"), env.dir("west")
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", true})
	writeService(t, west, "echo", endpoint{w1a, "us-west-1a", true})
	env.startSpoke("east", "us-east")
	env.startSpoke("west", "us-west")
	await(t, "echo from two clusters", func() bool { return len(env.hub.clustersOf(t, "default/echo")) == 2 })

	node := ingressNode(t, "ingress-1")
	if node.GetLocality().GetZone() != "" {
		t.Fatalf("the gateway's bootstrap names zone %q: the test wants one that names none", node.GetLocality().GetZone())
	}
	listener, cluster := gateways.ListenerName(8080), xds.ClusterName(registry.ServiceKey{Namespace: "default", Name: "echo"}, 8080)
	east1a, west1a := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.4")
	gw := startEnvoyStandIn(ctx, t, env.agent.xds, node)
	await(t, "the gateway's listener, routes, cluster and echo's endpoints, the node's zone first", func() bool {
		return gw.serves(listener, cluster, east1a)
	})
	agentMetrics, hubMetrics := env.agent.admin+"/metrics", env.hub.admin+"/metrics"
	await(t, "the gateway's own stream at the hub", func() bool {
		return metricValue(t, hubMetrics, xds.MetricConnectedClients) == 1 && metricValue(t, agentMetrics, relay.MetricGateways) == 1 &&
			metricValue(t, agentMetrics, relay.MetricGatewayUpstreams) == 1 && metricValue(t, agentMetrics, relay.MetricUpstreamConnected) == 0
	})
	var status nodeagent.Clients
	getJSON(t, env.agent.admin+"/debug/clients", &status)
	if len(status.Gateways) != 1 || status.Gateways[0].NodeID != node.GetId() || status.Gateways[0].Streams != 1 {
		t.Errorf("the node agent's /debug/clients shows gateways %+v, want %s with one stream", status.Gateways, node.GetId())
	}

	// The hub crashes; the gateway's Envoy is hot restarted meanwhile: the
	// new one gets everything from the agent.
	env.hub.proc.kill()
	await(t, "the relay to see the hub gone", func() bool { return metricValue(t, agentMetrics, relay.MetricGatewayUpstreams) == 0 })
	restarted := startEnvoyStandIn(ctx, t, env.agent.xds, node)
	await(t, "the restarted gateway served from the agent with the hub down", func() bool {
		return restarted.serves(listener, cluster, east1a)
	})

	env.hub.start()
	await(t, "the gateway's stream back at the restarted hub", func() bool {
		return metricValue(t, agentMetrics, relay.MetricGatewayUpstreams) == 1 && metricValue(t, hubMetrics, xds.MetricConnectedClients) == 1
	})
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", false})
	for _, g := range []*envoyStandIn{gw, restarted} {
		await(t, "the gateways to move to west", func() bool { return g.serves(listener, cluster, west1a) })
		if empty, err := g.firstEmpty(); err != nil || len(empty) > 0 {
			t.Errorf("a gateway's stream: %v; types first answered with nothing: %v", err, empty)
		}
	}
}
