package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/gateways"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/testpki"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// Tenants: what one tenant of the mesh (a workload's identity on the xDS
// port, a cluster on the federation port) may take that is another's.

// tenantPolicy is the xDS policy of the tenant tests: the gateways'
// identity receives every namespace (what a gateway must be granted); an
// operator's identity several namespaces, not every one; every other
// identity of a namespace its own namespace only.
const tenantPolicy = `rules:
- identity: spiffe://cluster.local/ns/nave-gateways/sa/eastwest
  namespaces: ["*"]
- identity: spiffe://cluster.local/ns/ops/sa/admin
  namespaces: [default, shop, nave-gateways]
- identity: spiffe://cluster.local/ns/*
  namespaces: [$namespace]
`

// tenantHub is an abuse hub whose xDS port requires client certificates
// and applies tenantPolicy; its legitimate client (identity
// ns/default/sa/legit, restricted to namespace default) connects over
// mTLS. ca issues the identities the test's tenants present.
type tenantHub struct {
	*abuseHub
	ca *testpki.CA
}

func startTenantHub(t *testing.T) *tenantHub {
	ca := testpki.NewCA(t, "nave")
	server := ca.Issue(t, "hub-xds", testpki.Cert{Hosts: []string{"127.0.0.1"}, Usages: serverUsage})
	policy := filepath.Join(t.TempDir(), "xds-policy.yaml")
	writeFile(t, policy, tenantPolicy)
	h := startHub(t, func(c *hub.Config) {
		c.Connections.XDSStreamsPerPeer = 1000
		c.XDSTLSCertFile, c.XDSTLSKeyFile, c.XDSClientCAFile, c.XDSPolicyFile = server.CertFile, server.KeyFile, ca.File, policy
	})
	ctx, cancel := context.WithCancel(testContext(t))
	t.Cleanup(cancel)
	a := &abuseHub{testHub: h, t: t, ctx: ctx, dir: filepath.Join(t.TempDir(), "east"),
		backends: []xdstest.Backend{xdstest.StartBackend(t, "a", "127.0.0.1"), xdstest.StartBackend(t, "b", "127.0.0.1")}}
	writeService(t, a.dir, "echo", endpoint{a.backends[0], "z1", true})
	startSpoke(t, h, "east", a.dir, "r1")
	legit := ca.Issue(t, "legit", testpki.Cert{URI: "spiffe://cluster.local/ns/default/sa/legit"})
	client := xdstest.NewClientTLS(t, h.XDSAddr.String(), "legit", locality("r1", "z1"), echoTarget,
		xdstest.TLSFiles{CA: ca.File, Cert: legit.CertFile, Key: legit.KeyFile})
	a.poller = xdstest.StartPoller(ctx, t, "legit", client)
	t.Cleanup(cancel) // runs before the poller's cleanup waits for it
	return &tenantHub{abuseHub: a, ca: ca}
}

// creds are the transport credentials of a client presenting a
// certificate of the SPIFFE ID uri.
func (h *tenantHub) creds(t *testing.T, name, uri string) credentials.TransportCredentials {
	t.Helper()
	return tlsCreds(t, h.ca.File, h.ca.Issue(t, name, testpki.Cert{URI: uri}))
}

// adsFrom is an ADS client connecting from another loopback address (another peer) with creds.
func adsFrom(t *testing.T, from, addr string, creds credentials.TransportCredentials) discovery.AggregatedDiscoveryServiceClient {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return discovery.NewAggregatedDiscoveryServiceClient(conn)
}

// openADS opens a stream, sends req and returns the first answer, or how
// the hub ended the stream. The stream stays open until ctx ends.
func openADS(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, req *discovery.DiscoveryRequest) (*discovery.DiscoveryResponse, error) {
	st, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(req); err != nil && err != io.EOF { // EOF: refused already; Recv has the status
		return nil, err
	}
	return st.Recv()
}

// eastWestNode is the node of an east-west gateway of network at r1/z1.
func eastWestNode(id, network string) *core.Node {
	return &core.Node{Id: id, Locality: &core.Locality{Region: "r1", Zone: "z1"}, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		gateways.MetadataRole:    structpb.NewStringValue(gateways.RoleEastWest),
		gateways.MetadataNetwork: structpb.NewStringValue(network),
	}}}
}

// startEnvoyStandInWith is startEnvoyStandIn over creds (the stand-in
// asks for every cluster and listener, then what they name, and ACKs).
func startEnvoyStandInWith(ctx context.Context, t *testing.T, addr string, creds credentials.TransportCredentials, node *core.Node) *envoyStandIn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
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

// seriesSum sums the values of a metric's series that carry every label
// given (`k="v"`), whatever their order.
func (h *testHub) seriesSum(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	sum := 0.0
	sc := bufio.NewScanner(strings.NewReader(httpBody(h.admin + "/metrics")))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+"{")
		if !ok {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok || slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(","+set+",", ","+l+",") }) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(value, &v); err != nil {
			t.Fatalf("series %s{%s}: %v", name, set, err)
		}
		sum += v
	}
	return sum
}

// awaitSeries awaits the sum of a metric's series (see seriesSum) being want.
func (h *testHub) awaitSeries(t *testing.T, want float64, name string, labels ...string) {
	t.Helper()
	awaitFor(t, fmt.Sprintf("%s%v at %v", name, labels, want), time.Minute, func() bool { return h.seriesSum(t, name, labels...) == want })
}

// Attack: a workload's identity (namespace shop: no gateway's) claims
// NAVE_GATEWAY for 300 networks, more than the hub keeps gateway views for
// (256), to be served every namespace's services through a gateway's view,
// or to fill the table so that real gateways are refused. An operator's
// identity granted several namespaces, but not every one, claims it too.
// Guarantee: with mTLS and an xDS policy on the xDS port, only an identity
// the policy grants every namespace ("*") may be a gateway: every claim
// ends with PERMISSION_DENIED before anything is built (no gateway view,
// no locality group, nothing in /debug/clients), counted in
// nave_xds_group_refusals_total{kind="gateway",bound="not_a_gateway"};
// a real gateway's identity is then served its view (listeners, routes,
// clusters, its network's endpoints), and the legitimate client keeps
// converging throughout.
func TestAbuseGatewayViewsClaimedByAWorkload(t *testing.T) {
	h := startTenantHub(t)
	addr := h.XDSAddr.String()
	// Before: the legitimate client's locality group, no gateway view.
	h.awaitSeries(t, 1, xds.MetricGroups, `kind="locality"`)
	h.awaitSeries(t, 0, xds.MetricGroups, `kind="gateway"`)

	const claims = 300
	intruder := h.creds(t, "intruder", "spiffe://cluster.local/ns/shop/sa/intruder")
	var wg sync.WaitGroup
	var mu sync.Mutex
	ended := map[codes.Code]int{}
	var sample error
	for c := range 3 { // 100 streams per connection: under the hub's 128
		ads := adsFrom(t, "127.0.0.2", addr, intruder)
		for s := range claims / 3 {
			wg.Go(func() {
				id := fmt.Sprintf("intruder-%d-%d", c, s)
				resp, err := openADS(h.ctx, ads, &discovery.DiscoveryRequest{Node: eastWestNode(id, fmt.Sprintf("net-evil-%03d", c*claims/3+s)),
					TypeUrl: resource.ClusterType})
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					err = fmt.Errorf("served %d clusters", len(resp.GetResources()))
				}
				ended[status.Code(err)]++
				sample = err
			})
		}
	}
	h.converges("300 gateway claims by a workload's identity")
	wg.Wait()
	if ended[codes.PermissionDenied] != claims || !strings.Contains(sample.Error(), "may not be a gateway") {
		t.Fatalf("gateway claims by a workload's identity ended %v (e.g. %v); want %d PermissionDenied saying it may not be a gateway", ended, sample, claims)
	}
	admin := h.creds(t, "admin", "spiffe://cluster.local/ns/ops/sa/admin")
	_, err := openADS(h.ctx, adsFrom(t, "127.0.0.2", addr, admin), &discovery.DiscoveryRequest{Node: eastWestNode("admin", "net1"), TypeUrl: resource.ClusterType})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a gateway claim by an identity granted three namespaces, not every one: %v; want PermissionDenied", err)
	}
	h.awaitSeries(t, claims+1, xds.MetricGroupRefusals, `kind="gateway"`, `bound="not_a_gateway"`)
	// Nothing was built for them: no gateway view, no locality group (the
	// legitimate client's only), no client known.
	if n := h.seriesSum(t, xds.MetricGroups, `kind="gateway"`); n != 0 {
		t.Errorf("%v gateway groups after the refused claims; want none", n)
	}
	if n := h.seriesSum(t, xds.MetricGroups, `kind="locality"`); n != 1 {
		t.Errorf("%v locality groups after the refused claims; want the legitimate client's alone", n)
	}
	var info adminapi.ClientsInfo
	h.getJSON(t, "/debug/clients", &info)
	for _, c := range info.Clients {
		if c.NodeID != "legit" {
			t.Errorf("/debug/clients lists %.40q", c.NodeID)
		}
	}

	// A real gateway (its identity granted "*") of network net1, whose
	// view nothing made before: it is served its listeners, routes, echo's
	// cluster and its network's endpoint of it (east's, at r1/z1).
	gw := startEnvoyStandInWith(h.ctx, t, addr, h.creds(t, "eastwest", "spiffe://cluster.local/ns/nave-gateways/sa/eastwest"),
		eastWestNode("eastwest-1", "net1"))
	echo := xds.ClusterName(registry.ServiceKey{Namespace: "default", Name: "echo"}, 8080)
	awaitFor(t, "the gateway's view: its listeners, routes, echo's cluster and endpoint", time.Minute, func() bool {
		return gw.serves(gateways.EastWestHTTP2Listener, echo, h.backends[0].Addr.AddrPort().Addr()) &&
			gw.get(resource.ListenerType, gateways.EastWestTLSListener) != nil
	})
	h.awaitSeries(t, 1, xds.MetricGroups, `kind="gateway"`, `state="held"`)
	h.converges("a real gateway served")
	if empty, err := gw.firstEmpty(); err != nil || len(empty) > 0 {
		t.Errorf("the gateway's stream: %v; types first answered with nothing: %v", err, empty)
	}
	if calls, failed := h.poller.Failures(); len(failed) > 0 {
		t.Errorf("%d of %d RPCs of the legitimate client failed, first: %v", len(failed), calls, failed[0])
	}
}

// Attack: one workload's identity (ns/default/sa/hog) opens streams that
// each name a locality of their own, to make the hub build and keep an
// EDS cache per stream, up to the table's bound (1,024), and refuse every
// other client a group of its own. Guarantee: an identity the xDS policy
// restricts makes a new locality group only while it holds fewer than 16:
// the 17th stream naming a new locality ends with RESOURCE_EXHAUSTED,
// counted in nave_xds_group_refusals_total{kind="locality",bound="per_identity"};
// joining an existing group is still allowed (and counts as held), another
// identity still gets a new group, the legitimate client keeps converging,
// and once the identity holds fewer than 16 it may make a new one.
func TestAbuseLocalityGroupsOfOneIdentity(t *testing.T) {
	h := startTenantHub(t)
	h.awaitSeries(t, 1, xds.MetricGroups, `kind="locality"`, `state="held"`)
	ads := adsFrom(t, "127.0.0.2", h.XDSAddr.String(), h.creds(t, "hog", "spiffe://cluster.local/ns/default/sa/hog"))
	echo := xds.ClusterName(registry.ServiceKey{Namespace: "default", Name: "echo"}, 8080)
	ask := func(ctx context.Context, id string, l *core.Locality) error {
		resp, err := openADS(ctx, ads, &discovery.DiscoveryRequest{Node: &core.Node{Id: id, Locality: l}, TypeUrl: resource.EndpointType, ResourceNames: []string{echo}})
		if err == nil && len(resp.GetResources()) != 1 {
			err = fmt.Errorf("served %d assignments, want echo's", len(resp.GetResources()))
		}
		return err
	}
	const streams = 40
	var stops []context.CancelFunc
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	served, refused := 0, 0
	for i := range streams { // one after the other, each kept open: the first 16 hold their group
		ctx, stop := context.WithCancel(h.ctx)
		stops = append(stops, stop)
		switch err := ask(ctx, fmt.Sprint("hog-", i), &core.Locality{Region: fmt.Sprintf("hog-%02d", i), Zone: "z"}); {
		case err == nil:
			served++
		case status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "per identity"):
			refused++
		default:
			t.Fatalf("stream %d of one identity: %v", i, err)
		}
	}
	if served != xds.MaxGroupsPerIdentity || refused != streams-xds.MaxGroupsPerIdentity {
		t.Fatalf("one identity naming %d localities: %d served, %d refused; want %d served, the rest refused (ResourceExhausted, per identity)",
			streams, served, refused, xds.MaxGroupsPerIdentity)
	}
	h.awaitSeries(t, streams-xds.MaxGroupsPerIdentity, xds.MetricGroupRefusals, `kind="locality"`, `bound="per_identity"`)
	h.awaitSeries(t, 1+xds.MaxGroupsPerIdentity, xds.MetricGroups, `kind="locality"`, `state="held"`)
	h.converges("one identity holding its 16 locality groups")

	// At its bound, the identity still joins a group that exists (the
	// legitimate client's r1/z1); another identity still gets a new one.
	joined, leave := context.WithCancel(h.ctx)
	defer leave()
	if err := ask(joined, "hog-joins", &core.Locality{Region: "r1", Zone: "z1"}); err != nil {
		t.Fatalf("the identity at its bound joining an existing group: %v", err)
	}
	other := h.ca.Issue(t, "other", testpki.Cert{URI: "spiffe://cluster.local/ns/default/sa/other"})
	pollCtx, stopPolling := context.WithCancel(h.ctx)
	defer stopPolling() // before the poller's cleanup waits for it
	xdstest.StartPoller(pollCtx, t, "other identity in r1/z2", xdstest.NewClientTLS(t, h.XDSAddr.String(), "other", locality("r1", "z2"), echoTarget,
		xdstest.TLSFiles{CA: h.ca.File, Cert: other.CertFile, Key: other.KeyFile}))
	h.awaitSeries(t, 2+xds.MaxGroupsPerIdentity, xds.MetricGroups, `kind="locality"`, `state="held"`)

	// The bound counts every group the identity holds, the one it joined
	// too: with one of its own groups let go of (idle now), it holds 16
	// still, and a new locality is refused.
	stops[0]()
	h.awaitSeries(t, 1+xds.MaxGroupsPerIdentity, xds.MetricGroups, `kind="locality"`, `state="held"`)
	if err := ask(h.ctx, "hog-again", &core.Locality{Region: "hog-again", Zone: "z"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a new locality of the identity holding 15 groups of its own and one it joined: %v; want ResourceExhausted", err)
	}
	// Once it leaves the joined one too, a new locality is served.
	leave()
	awaitFor(t, "the identity served a new locality once it held 15 groups", time.Minute, func() bool {
		ctx, stop := context.WithCancel(h.ctx)
		stops = append(stops, stop)
		return ask(ctx, "hog-again", &core.Locality{Region: "hog-again", Zone: "z"}) == nil
	})
	h.converges("one identity at its bound")
	if calls, failed := h.poller.Failures(); len(failed) > 0 {
		t.Errorf("%d of %d RPCs of the legitimate client failed, first: %v", len(failed), calls, failed[0])
	}
}

// writeServiceIn is writeService for a service of namespace ns (its file:
// NS-NAME.yaml in dir).
func writeServiceIn(t *testing.T, dir, ns, name string, eps ...endpoint) {
	t.Helper()
	scratch := t.TempDir()
	writeService(t, scratch, name, eps...)
	b, err := os.ReadFile(filepath.Join(scratch, name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, ns+"-"+name+".yaml"), strings.ReplaceAll(string(b), "namespace: default\n", "namespace: "+ns+"\n"))
}

// refusedExports is what /debug/clusters says the export policy refused of cluster.
func (h *testHub) refusedExports(t *testing.T, cluster registry.ClusterID) map[string]string {
	t.Helper()
	var clusters []adminapi.ClusterStatus
	h.getJSON(t, "/debug/clusters", &clusters)
	for _, c := range clusters {
		if c.Cluster == cluster {
			return c.RefusedExports
		}
	}
	return nil
}

// Attack: a hostile cluster (north, with a valid token) exports default/echo,
// the service the honest cluster east exports, to have its endpoints join
// it and take a share of echo's traffic. Guarantee: with an export policy
// (--export-policy) letting east export into default and north into
// north-* only, north's export of default/echo is refused
// (ExportNotPermitted, under refusedExports of north in /debug/clusters,
// a NACK in nave_federation_updates_total) and never reaches an xDS
// client: the honest client is handed east's endpoints only and no RPC of
// it reaches north's backend, while north's export into north-apps flows.
// The policy file is reloaded when it changes: allowing north into default
// makes its endpoint join echo; forbidding it again drops it at once.
// (Without a policy every cluster may export everywhere: east, west and
// north all export default/echo in TestLocalityFailoverAcrossClusters.)
func TestAbuseExportPolicyHostileCluster(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "export-policy.yaml")
	const northConfined = "rules:\n- cluster: east\n  namespaces: [default]\n- cluster: north\n  namespaces: [\"north-*\"]\n"
	writeFile(t, policy, northConfined)
	a := startAbuseHub(t, func(c *hub.Config) { c.ExportPolicyFile = policy })

	hostile, permitted := xdstest.StartBackend(t, "north/default", "127.0.0.1"), xdstest.StartBackend(t, "north/north-apps", "127.0.0.1")
	northDir := filepath.Join(t.TempDir(), "north")
	writeServiceIn(t, northDir, "default", "echo", endpoint{hostile, "z1", true}) // the zone of the honest client and of east's endpoint
	writeServiceIn(t, northDir, "north-apps", "echo", endpoint{permitted, "z1", true})
	startSpoke(t, a.testHub, "north", northDir, "r1")

	awaitFor(t, "north's export of default/echo refused", time.Minute, func() bool {
		return strings.HasPrefix(a.refusedExports(t, "north")["default/echo"], "ExportNotPermitted: ")
	})
	awaitFor(t, "north's export into north-apps held", time.Minute, func() bool {
		return slices.Equal(a.clustersOf("north-apps/echo"), []registry.ClusterID{"north"})
	})
	awaitFor(t, "north's refused update counted as a NACK", time.Minute, func() bool {
		return a.seriesSum(t, "nave_federation_updates_total", `cluster="north"`, `result="nack"`) >= 1
	})
	if r := a.refusedExports(t, "east"); len(r) != 0 {
		t.Errorf("/debug/clusters: east refused %v", r)
	}
	// North's permitted export is served, over RPC.
	pollCtx, stopPolling := context.WithCancel(a.ctx)
	defer stopPolling() // before the poller's cleanup waits for it
	apps := xdstest.StartPoller(pollCtx, t, "north-apps client", xdstest.NewClient(t, a.XDSAddr.String(), "apps", locality("r1", "z1"),
		"echo.north-apps.svc.clusterset.local:8080"))
	apps.AwaitOnly(a.ctx, t, permitted.Name)

	// The honest client follows east's moves, and is handed east's endpoint alone.
	a.converges("a hostile cluster exporting into default")
	a.converges("a hostile cluster exporting into default")
	if got := a.clustersOf("default/echo"); !slices.Equal(got, []registry.ClusterID{"east"}) {
		t.Fatalf("default/echo is held from %v, want east alone", got)
	}
	var info adminapi.EndpointsInfo
	a.getJSON(t, "/debug/endpoints?service=default/echo&region=r1&zone=z1", &info)
	if got := describe(info.Ports[0].Assignment); len(got) != 1 || !strings.Contains(got[0], " east ") {
		t.Errorf("the honest client's assignment of default/echo: %v, want east's endpoint alone", got)
	}
	a.poller.Await(a.ctx, t, "nothing of north's backend", func(_ []string, seen map[string]bool) bool {
		if seen[hostile.Name] {
			t.Errorf("an RPC of the honest client reached north's backend (seen %v)", seen)
		}
		return true
	})

	// The policy now lets north into default: its endpoint joins echo (the
	// same locality as east's: round robin between them).
	writeFile(t, policy, "rules:\n- cluster: east\n  namespaces: [default]\n- cluster: north\n  namespaces: [\"north-*\", default]\n")
	a.poller.Await(a.ctx, t, "north's backend once the policy allows it", func(_ []string, seen map[string]bool) bool { return seen[hostile.Name] })
	awaitFor(t, "north's refusal forgotten", time.Minute, func() bool { return len(a.refusedExports(t, "north")) == 0 })

	// Forbidden again: the hub drops it, and asks north for its state again, which it refuses.
	writeFile(t, policy, northConfined)
	a.poller.AwaitOnly(a.ctx, t, a.backends[a.turn%2].Name)
	awaitFor(t, "north's export of default/echo refused again", time.Minute, func() bool {
		return strings.HasPrefix(a.refusedExports(t, "north")["default/echo"], "ExportNotPermitted: ")
	})
	if got := a.clustersOf("default/echo"); !slices.Equal(got, []registry.ClusterID{"east"}) {
		t.Fatalf("default/echo is held from %v, want east alone", got)
	}
	apps.AwaitOnly(a.ctx, t, permitted.Name)
	a.converges("north forbidden again")
	for _, p := range []*xdstest.Poller{a.poller, apps} {
		if calls, failed := p.Failures(); len(failed) > 0 {
			t.Errorf("%s: %d of %d RPCs failed, first: %v", p.Name(), len(failed), calls, failed[0])
		}
	}
}
