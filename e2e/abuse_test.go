package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/xdstest"
)

// abuseHub is a hub under attack from other addresses of the loopback
// network, and a legitimate spoke and xDS client on 127.0.0.1 that must
// keep converging meanwhile.
type abuseHub struct {
	*testHub
	t        *testing.T
	ctx      context.Context
	dir      string
	backends []xdstest.Backend
	poller   *xdstest.Poller
	turn     int
}

func startAbuseHub(t *testing.T, opts ...func(*hub.Config)) *abuseHub {
	h := startHub(t, func(c *hub.Config) {
		c.Connections.XDSStreamsPerPeer = 1000
		for _, o := range opts {
			o(c)
		}
	})
	ctx, cancel := context.WithCancel(testContext(t))
	t.Cleanup(cancel)
	a := &abuseHub{testHub: h, t: t, ctx: ctx, dir: filepath.Join(t.TempDir(), "east"),
		backends: []xdstest.Backend{xdstest.StartBackend(t, "a", "127.0.0.1"), xdstest.StartBackend(t, "b", "127.0.0.1")}}
	writeService(t, a.dir, "echo", endpoint{a.backends[0], "z1", true})
	startSpoke(t, h, "east", a.dir, "r1")
	client := xdstest.NewClient(t, h.XDSAddr.String(), "legit", locality("r1", "z1"), "echo.default.svc.clusterset.local:8080")
	a.poller = xdstest.StartPoller(ctx, t, "legit", client)
	t.Cleanup(cancel) // runs before the poller's cleanup waits for it
	return a
}

// converges moves echo to the other backend and waits, at most 10 s, for
// the legitimate client to follow.
func (a *abuseHub) converges(during string) {
	a.t.Helper()
	a.turn++
	next := a.backends[a.turn%2]
	start := time.Now()
	writeService(a.t, a.dir, "echo", endpoint{next, "z1", true})
	ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
	defer cancel()
	a.poller.AwaitOnly(ctx, a.t, next.Name)
	a.t.Logf("during %s: the legitimate client converged in %v", during, time.Since(start).Round(time.Millisecond))
}

// dialFrom connects from another loopback address (another peer).
func dialFrom(t *testing.T, from, addr string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestAbuseSilentConnections(t *testing.T) {
	// Other tests keep the defaults (10 s): on a loaded machine a real
	// client's handshake can take over a second.
	a := startAbuseHub(t, func(c *hub.Config) { c.Connections.HandshakeTimeout = time.Second })
	var conns []net.Conn
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}
	for _, addr := range []string{a.FederationAddr.String(), a.XDSAddr.String()} {
		for range 500 {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conns = append(conns, c)
		}
	}
	a.converges("1,000 silent connections")
	// Each is closed once the handshake deadline (1 s here) passes.
	for _, c := range conns {
		if err := closedWithin(c, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// closedWithin reads what the server sends (its HTTP/2 settings, say)
// until it closes the connection.
func closedWithin(c net.Conn, d time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			if isTimeout(err) {
				return fmt.Errorf("a connection to %s is still open after %v", c.RemoteAddr(), d)
			}
			return nil
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestAbuseStreamsForNamesThatDoNotExist(t *testing.T) {
	a := startAbuseHub(t)
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	for c := range 20 {
		conn := dialFrom(t, "127.0.0.2", a.XDSAddr.String())
		ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
		for s := range 100 {
			wg.Go(func() {
				st, err := ads.StreamAggregatedResources(ctx)
				if err == nil {
					err = st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: fmt.Sprintf("abuser-%d-%d", c, s)}, TypeUrl: resource.ListenerType,
						ResourceNames: []string{fmt.Sprintf("nope-%d-%d.default.svc.clusterset.local:80", c, s)}})
				}
				if err == nil || err == io.EOF { // EOF: refused already; Recv has the status
					_, err = st.Recv()
				}
				mu.Lock()
				codesSeen[status.Code(err)]++
				mu.Unlock()
			})
		}
	}
	a.metricAtLeast(t, `nave_refused_total{port="xds",reason="max_streams_per_peer"}`, 1000)
	a.converges("2,000 ADS streams asking for names that do not exist")
	cancel()
	wg.Wait()
	if codesSeen[codes.ResourceExhausted] != 1000 {
		t.Fatalf("streams ended with %v; want 1,000 refused (ResourceExhausted) beyond the peer's 1,000", codesSeen)
	}
}

func TestAbuseOversizedRequests(t *testing.T) {
	a := startAbuseHub(t)
	ads := discovery.NewAggregatedDiscoveryServiceClient(dialFrom(t, "127.0.0.2", a.XDSAddr.String()))
	names := make([]string, 100_000)
	for i := range names {
		names[i] = fmt.Sprintf("n%d.default.svc.clusterset.local:80", i)
	}
	fields := map[string]any{}
	for i := range 1000 {
		fields[fmt.Sprintf("k%d", i)] = strings.Repeat("x", 1000)
	}
	big, err := structpb.NewStruct(fields)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		req  *discovery.DiscoveryRequest
		code codes.Code
	}{
		{"100,000 names", &discovery.DiscoveryRequest{Node: &core.Node{Id: "many"}, TypeUrl: resource.ListenerType, ResourceNames: names}, codes.ResourceExhausted},
		{"1 MB of node metadata", &discovery.DiscoveryRequest{Node: &core.Node{Id: "fat", Metadata: big}, TypeUrl: resource.ListenerType}, codes.InvalidArgument},
		{"a node ID of 1 MiB", &discovery.DiscoveryRequest{Node: &core.Node{Id: strings.Repeat("i", 1<<20)}, TypeUrl: resource.ListenerType}, codes.InvalidArgument},
		{"a zone of 1 MiB", &discovery.DiscoveryRequest{Node: &core.Node{Id: "far", Locality: &core.Locality{Region: "r1", Zone: strings.Repeat("z", 1<<20)}},
			TypeUrl: resource.EndpointType, ResourceNames: []string{"outbound|8080||echo.default.svc.clusterset.local"}}, codes.InvalidArgument},
		{"a user agent of 1 MiB", &discovery.DiscoveryRequest{Node: &core.Node{Id: "agent", UserAgentName: strings.Repeat("u", 1<<20)}, TypeUrl: resource.ListenerType}, codes.InvalidArgument},
	} {
		st, err := ads.StreamAggregatedResources(a.ctx)
		if err == nil {
			err = st.Send(c.req)
		}
		if err == nil || err == io.EOF {
			_, err = st.Recv()
		}
		if status.Code(err) != c.code {
			t.Errorf("%s: %.300v, want %v", c.what, err, c.code)
		}
	}
	a.converges("oversized requests")
	a.metricAtLeast(t, `nave_xds_refused_requests_total{reason="node_field_too_large"}`, 3)
	// None of them is kept: the sync status knows only the legitimate client.
	var info adminapi.ClientsInfo
	a.getJSON(t, "/debug/clients", &info)
	for _, c := range info.Clients {
		if c.NodeID != "legit" {
			t.Errorf("/debug/clients lists %.40q", c.NodeID)
		}
	}
}

func TestAbuseClientThatNACKsForever(t *testing.T) {
	a := startAbuseHub(t)
	ads := discovery.NewAggregatedDiscoveryServiceClient(dialFrom(t, "127.0.0.2", a.XDSAddr.String()))
	st, err := ads.StreamAggregatedResources(a.ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &core.Node{Id: "nacker", Locality: &core.Locality{Region: "r1", Zone: "z1"}}
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{"outbound|8080||echo.default.svc.clusterset.local"}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			_ = st.Send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(),
				ResourceNames: []string{"outbound|8080||echo.default.svc.clusterset.local"}, ErrorDetail: status.New(codes.InvalidArgument, "never").Proto()})
		}
	}()
	a.converges("a client NACKing every response")
	a.converges("a client NACKing every response")
	a.metricAtLeast(t, `nave_xds_nacks_total{type="eds"}`, 2)
}

func TestAbuseSpokeFloodingUpdates(t *testing.T) {
	a := startAbuseHub(t)
	conn, err := grpc.NewClient(a.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: tokens["north"], AllowInsecure: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	st, err := fedv1.NewFederationClient(conn).Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "north", Network: "net1", SpokeId: "flood"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil { // welcome
		t.Fatal(err)
	}
	go func() { // ACKs, read as they come
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	go func() {
		for v := uint64(1); ctx.Err() == nil; v++ {
			u := &fedv1.Update{Nonce: fmt.Sprint(v), Version: v, FullState: v == 1, LastChunk: true, Upserts: []*fedv1.Shard{{
				Service: &fedv1.ServiceKey{Namespace: "flood", Name: "svc"},
				Ports:   []*fedv1.ServicePort{{Name: "p", Port: int32(1 + v%1000), Protocol: "TCP"}},
			}}}
			if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
				return
			}
		}
	}()
	a.metricAtLeast(t, `nave_federation_throttled_updates_total{cluster="north"}`, 1)
	a.converges("a spoke flooding updates")
	a.converges("a spoke flooding updates")
}

// rawCodec sends bytes as they are, to put malformed messages on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

var _ encoding.Codec = rawCodec{}

func TestAbuseMalformedBytes(t *testing.T) {
	a := startAbuseHub(t)
	garbage := []byte(strings.Repeat("\xff\x00nave?", 10_000))
	for _, addr := range []string{a.FederationAddr.String(), a.XDSAddr.String()} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(garbage)
		if err := closedWithin(c, 5*time.Second); err != nil {
			t.Error(err)
		}
		c.Close()
	}
	for _, c := range []struct{ addr, method string }{
		{a.FederationAddr.String(), "/nave.federation.v1.Federation/Publish"},
		{a.XDSAddr.String(), "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"},
	} {
		conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: tokens["north"], AllowInsecure: true}),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		st, err := conn.NewStream(a.ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, c.method)
		if err == nil {
			err = st.SendMsg(garbage)
		}
		if err == nil || err == io.EOF {
			var out []byte
			err = st.RecvMsg(&out)
		}
		if code := status.Code(err); code == codes.OK || code == codes.Unknown {
			t.Errorf("%s: malformed bytes answered %v", c.method, err)
		}
	}
	a.converges("malformed bytes")
	if got := a.clustersOf("default/echo"); len(got) != 1 {
		t.Fatalf("echo is published by %v", got)
	}
}
