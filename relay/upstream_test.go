package relay

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/utils/clock"
)

// scriptedHub is an ADS server the test drives by hand: it hands over
// every request it receives and sends what the test gives it.
type scriptedHub struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	requests  chan *discovery.DiscoveryRequest
	responses chan *discovery.DiscoveryResponse
	// streams counts the streams opened.
	streams atomic.Int32
}

func (h *scriptedHub) StreamAggregatedResources(stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	h.streams.Add(1)
	errc := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case h.requests <- req:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case err := <-errc:
			return err
		case <-stream.Context().Done():
			return nil
		case resp := <-h.responses:
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// TestRelayACKsAndNACKsUpstream: the relay ACKs what it decodes with its
// version and nonce, NACKs what it cannot with the last good version, and
// keeps serving the last good state.
func TestRelayACKsAndNACKsUpstream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := &scriptedHub{requests: make(chan *discovery.DiscoveryRequest, 16), responses: make(chan *discovery.DiscoveryResponse)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, h)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	relay, reg, relayAddr := startRelay(t, lis.Addr().String(), loc("r1", "z1"))

	next := func(what string) *discovery.DiscoveryRequest {
		t.Helper()
		select {
		case req := <-h.requests:
			return req
		case <-ctx.Done():
			t.Fatalf("no upstream request: %s", what)
			return nil
		}
	}
	respond := func(resp *discovery.DiscoveryResponse) {
		t.Helper()
		select {
		case h.responses <- resp:
		case <-ctx.Done():
			t.Fatal("the scripted hub's stream is gone")
		}
	}

	// A local client asks for one assignment.
	local := dialLocal(ctx, t, relayAddr)
	const name = "outbound|8080||echo.default.svc.clusterset.local"
	if err := local.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "raw"}, TypeUrl: resource.EndpointType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}

	req := next("the subscription")
	if req.GetNode().GetId() != "node-1" || req.GetTypeUrl() != resource.EndpointType || !slices.Equal(req.GetResourceNames(), []string{name}) ||
		req.GetVersionInfo() != "" || req.GetResponseNonce() != "" {
		t.Fatalf("first upstream request %v, want node-1's EDS subscription to %s", req, name)
	}
	cla, err := anypb.New(&endpoint.ClusterLoadAssignment{ClusterName: name})
	if err != nil {
		t.Fatal(err)
	}
	respond(&discovery.DiscoveryResponse{TypeUrl: resource.EndpointType, VersionInfo: "v1", Nonce: "n1", Resources: []*anypb.Any{cla}})
	if req := next("the ACK"); req.GetVersionInfo() != "v1" || req.GetResponseNonce() != "n1" || req.GetErrorDetail() != nil ||
		!slices.Equal(req.GetResourceNames(), []string{name}) || req.GetNode() != nil {
		t.Fatalf("ACK %v, want version v1, nonce n1, no error, no node", req)
	}
	// The local client gets the assignment (perhaps after an empty first answer).
	for {
		resp, err := local.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetResources()) == 1 {
			break
		}
		if err := local.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{name},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}

	// Garbage: NACKed with the last good version, and the cache keeps v1's assignment.
	respond(&discovery.DiscoveryResponse{TypeUrl: resource.EndpointType, VersionInfo: "v2", Nonce: "n2",
		Resources: []*anypb.Any{{TypeUrl: resource.EndpointType, Value: []byte{0xff, 0xff, 0xff}}}})
	if req := next("the NACK"); req.GetVersionInfo() != "v1" || req.GetResponseNonce() != "n2" || req.GetErrorDetail().GetMessage() == "" {
		t.Fatalf("NACK %v, want version v1, nonce n2 and an error detail", req)
	}
	if n := metricValue(t, reg, MetricUpstreamNACKs, typeEDS); n != 1 {
		t.Errorf("%s{eds} = %v, want 1", MetricUpstreamNACKs, n)
	}
	if got := relay.node.caches[resource.EndpointType].GetResources(); len(got) != 1 || got[name] == nil {
		t.Errorf("after a NACK the cache holds %v, want the last good assignment", got)
	}
	if n := metricValue(t, reg, MetricUpstreamResponses, typeEDS); n != 2 {
		t.Errorf("%s{eds} = %v, want 2", MetricUpstreamResponses, n)
	}
}

// TestRelayReportsLocalNACKsUpstream: a local client's NACK is repeated
// upstream as a NACK of the hub's last response that names the client and
// its error, and an ACK follows once no local client rejects.
func TestRelayReportsLocalNACKsUpstream(t *testing.T) {
	const edsName = "outbound|8080||echo.default.svc.clusterset.local"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := &scriptedHub{requests: make(chan *discovery.DiscoveryRequest, 64), responses: make(chan *discovery.DiscoveryResponse)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, h)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	_, reg, relayAddr := startRelay(t, lis.Addr().String(), loc("r1", "z1"))
	next := func(what string) *discovery.DiscoveryRequest {
		t.Helper()
		select {
		case req := <-h.requests:
			return req
		case <-ctx.Done():
			t.Fatalf("no upstream request: %s", what)
			return nil
		}
	}
	respond := func(version string, factor uint32) {
		t.Helper()
		cla, err := anypb.New(&endpoint.ClusterLoadAssignment{ClusterName: edsName,
			Policy: &endpoint.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(factor)}})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case h.responses <- &discovery.DiscoveryResponse{TypeUrl: resource.EndpointType, VersionInfo: version, Nonce: "n-" + version, Resources: []*anypb.Any{cla}}:
		case <-ctx.Done():
			t.Fatal("the scripted hub's stream is gone")
		}
	}

	local := dialLocal(ctx, t, relayAddr)
	send := func(req *discovery.DiscoveryRequest) {
		t.Helper()
		req.TypeUrl, req.ResourceNames = resource.EndpointType, []string{edsName}
		if err := local.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	// recvFactor reads local responses, ACKing the others, until the assignment has factor.
	recvFactor := func(factor uint32) *discovery.DiscoveryResponse {
		t.Helper()
		for {
			resp, err := local.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetResources()) == 1 {
				var cla endpoint.ClusterLoadAssignment
				if err := resp.GetResources()[0].UnmarshalTo(&cla); err != nil {
					t.Fatal(err)
				}
				if cla.GetPolicy().GetOverprovisioningFactor().GetValue() == factor {
					return resp
				}
			}
			send(&discovery.DiscoveryRequest{VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
		}
	}
	send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "picky"}})
	next("the subscription")
	respond("v1", 140)
	if req := next("the ACK of v1"); req.GetErrorDetail() != nil {
		t.Fatalf("ACK of v1: %v", req)
	}
	resp := recvFactor(140)
	send(&discovery.DiscoveryRequest{ResponseNonce: resp.GetNonce(), ErrorDetail: &rpcstatus.Status{Code: 3, Message: "unsupported policy"}})

	req := next("the report")
	msg := req.GetErrorDetail().GetMessage()
	if req.GetVersionInfo() != "v1" || req.GetResponseNonce() != "n-v1" || !strings.Contains(msg, `node "picky"`) || !strings.Contains(msg, "unsupported policy") {
		t.Fatalf("report %v: want a NACK of n-v1 keeping version v1 that names node picky and its error", req)
	}
	if n := metricValue(t, reg, MetricReportedNACKs, typeEDS); n != 1 {
		t.Errorf("%s{eds} = %v, want 1", MetricReportedNACKs, n)
	}
	// The client repeats its NACK: nothing new to report.
	send(&discovery.DiscoveryRequest{ResponseNonce: resp.GetNonce(), ErrorDetail: &rpcstatus.Status{Code: 3, Message: "unsupported policy"}})
	select {
	case req := <-h.requests:
		t.Fatalf("a repeated NACK was reported again: %v", req)
	case <-time.After(300 * time.Millisecond):
	}

	// v2 comes and the client accepts it: the last word upstream is an ACK of v2.
	respond("v2", 150)
	resp = recvFactor(150)
	send(&discovery.DiscoveryRequest{VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	var last *discovery.DiscoveryRequest
	for done := false; !done; {
		select {
		case req := <-h.requests:
			last = req
		case <-time.After(500 * time.Millisecond):
			done = true
		}
	}
	if last == nil || last.GetVersionInfo() != "v2" || last.GetErrorDetail() != nil {
		t.Fatalf("the last upstream request %v, want an ACK of v2", last)
	}
}

// TestIdleRelayOpensNoStream: a relay no local client asks anything of
// holds no stream to the hub (a stream that sends nothing is ended by the
// hub's first-message deadline, over and over); the first subscription
// opens one at once.
func TestIdleRelayOpensNoStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	_, reg, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"))
	// A local stream that subscribes to nothing yet.
	local := dialLocal(ctx, t, relayAddr)
	time.Sleep(300 * time.Millisecond) // what must not happen has had time to
	if n := h.streams.Load(); n != 0 {
		t.Fatalf("an idle relay opened %d streams to the hub, want none", n)
	}
	if v := metricValue(t, reg, MetricUpstreamConnected, ""); v != 0 {
		t.Errorf("%s = %v while idle, want 0", MetricUpstreamConnected, v)
	}
	if err := local.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "raw"}, TypeUrl: resource.ListenerType, ResourceNames: []string{"l"}}); err != nil {
		t.Fatal(err)
	}
	select {
	case req := <-h.requests:
		if req.GetTypeUrl() != resource.ListenerType || !slices.Equal(req.GetResourceNames(), []string{"l"}) {
			t.Fatalf("first upstream request %v, want the listener l", req)
		}
	case <-ctx.Done():
		t.Fatal("the first subscription opened no stream")
	}
	if n := h.streams.Load(); n != 1 {
		t.Errorf("%d streams opened, want 1", n)
	}
}

// TestRelayTakesLargeResponses: a response past grpc's default 4 MiB (a
// large subscription's assignments) is taken and ACKed, not refused and
// asked for again forever.
func TestRelayTakesLargeResponses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	_, reg, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"))
	local := dialLocal(ctx, t, relayAddr)
	const name = "outbound|8080||big.default.svc.clusterset.local"
	if err := local.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "raw"}, TypeUrl: resource.EndpointType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	<-h.requests
	// 6 MiB of assignment: one endpoint per distinct hostname, as many as it takes.
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{}}}
	pad := strings.Repeat("x", 1000)
	for i := range 6 << 10 { // about 1 KiB each
		cla.Endpoints[0].LbEndpoints = append(cla.Endpoints[0].LbEndpoints, &endpoint.LbEndpoint{HostIdentifier: &endpoint.LbEndpoint_Endpoint{
			Endpoint: &endpoint.Endpoint{Hostname: fmt.Sprintf("endpoint-%08d-%s", i, pad)}}})
	}
	if n := proto.Size(cla); n < 6<<20 {
		t.Fatalf("the assignment is %d bytes, want at least 6 MiB", n)
	}
	a, err := anypb.New(cla)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case h.responses <- &discovery.DiscoveryResponse{TypeUrl: resource.EndpointType, VersionInfo: "big", Nonce: "n1", Resources: []*anypb.Any{a}}:
	case <-ctx.Done():
		t.Fatal("the stream is gone")
	}
	select {
	case req := <-h.requests:
		if req.GetVersionInfo() != "big" || req.GetErrorDetail() != nil {
			t.Fatalf("after a 6 MiB response the relay sent %v, want its ACK", req)
		}
	case <-ctx.Done():
		t.Fatal("no ACK of a 6 MiB response")
	}
	if n := metricValue(t, reg, MetricUpstreamReconnects, ""); n != 0 {
		t.Errorf("%s = %v, want 0", MetricUpstreamReconnects, n)
	}
}

// A client's detail and node ID are quoted upstream cut to a bound, as
// valid UTF-8: a cut inside a character failed the send, and ended the
// relay's stream to the hub at every report.
func TestReportQuotesBoundedValidUTF8(t *testing.T) {
	r := rejection{node: strings.Repeat("n", 1000), version: "v1", detail: strings.Repeat("a", maxReportedDetail-1) + "é" + strings.Repeat("b", 100)}
	msg := r.message()
	if !utf8.ValidString(msg) {
		t.Fatalf("the report is not valid UTF-8: %q", msg)
	}
	if len(msg) > maxReportedNode+maxReportedDetail+200 {
		t.Errorf("the report is %d bytes, want it bounded", len(msg))
	}
	if got := truncate("a\xffb", 10); got != "ab" {
		t.Errorf("truncate of invalid UTF-8 = %q, want %q", got, "ab")
	}
}

// Only an ACK of the last response (its nonce and version) ends a
// client's rejection: grpc-go changes a subscription after a NACK with the
// version it still holds.
func TestOnlyAnACKEndsARejection(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	l := newLocalStreams(m, testLogger(), 100, clock.RealClock{}, func() {})
	l.open(1)
	l.response(1, resource.EndpointType, &discovery.DiscoveryResponse{VersionInfo: "v2", Nonce: "n2"})
	rejecting := func() int { return len(l.rejections()[resource.EndpointType]) }
	req := func(r *discovery.DiscoveryRequest) {
		t.Helper()
		r.TypeUrl = resource.EndpointType
		if err := l.request(1, r); err != nil {
			t.Fatal(err)
		}
	}
	req(&discovery.DiscoveryRequest{VersionInfo: "v1", ResponseNonce: "n2", ErrorDetail: &rpcstatus.Status{Message: "no"}})
	if n := rejecting(); n != 1 {
		t.Fatalf("after a NACK of n2: %d rejecting, want 1", n)
	}
	req(&discovery.DiscoveryRequest{VersionInfo: "v1", ResponseNonce: "n2", ResourceNames: []string{"a", "b"}})
	if n := rejecting(); n != 1 {
		t.Fatalf("after a subscription change naming n2 with the old version: %d rejecting, want still 1", n)
	}
	req(&discovery.DiscoveryRequest{VersionInfo: "v2", ResponseNonce: "n2"})
	if n := rejecting(); n != 0 {
		t.Fatalf("after an ACK of v2: %d rejecting, want 0", n)
	}
}

// TestRejectionReportedOnce: a client that goes on rejecting what it holds
// is reported once, however many unrelated responses the hub sends (each
// ACKed upstream); an ACK follows when it leaves.
func TestRejectionReportedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	_, reg, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"))
	const name = "outbound|8080||echo.default.svc.clusterset.local"
	localCtx, closeLocal := context.WithCancel(ctx)
	local := dialLocal(localCtx, t, relayAddr)
	if err := local.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "picky"}, TypeUrl: resource.EndpointType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	h.next(ctx, t, "the subscription")
	cla, err := anypb.New(&endpoint.ClusterLoadAssignment{ClusterName: name})
	if err != nil {
		t.Fatal(err)
	}
	respond := func(version string) {
		t.Helper()
		select {
		case h.responses <- &discovery.DiscoveryResponse{TypeUrl: resource.EndpointType, VersionInfo: version, Nonce: "n-" + version, Resources: []*anypb.Any{cla}}:
		case <-ctx.Done():
			t.Fatal("the stream is gone")
		}
	}
	respond("v1")
	h.next(ctx, t, "the ACK of v1")
	// The relay may answer before its cache holds the assignment: ACK until it comes.
	var resp *discovery.DiscoveryResponse
	for {
		if resp, err = local.Recv(); err != nil {
			t.Fatal(err)
		}
		if len(resp.GetResources()) == 1 {
			break
		}
		if err := local.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{name},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := local.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{name}, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Message: "no"}}); err != nil {
		t.Fatal(err)
	}
	if req := h.next(ctx, t, "the report"); req.GetErrorDetail() == nil {
		t.Fatalf("want the report, got %v", req)
	}
	// The same assignment again and again: the client is sent nothing new and rejects on.
	for _, v := range []string{"v2", "v3", "v4"} {
		respond(v)
		if req := h.next(ctx, t, "the ACK of "+v); req.GetErrorDetail() != nil || req.GetVersionInfo() != v {
			t.Fatalf("after %s the relay sent %v, want its ACK", v, req)
		}
	}
	select {
	case req := <-h.requests:
		t.Fatalf("a standing rejection was reported again: %v", req)
	case <-time.After(300 * time.Millisecond):
	}
	if n := metricValue(t, reg, MetricReportedNACKs, typeEDS); n != 1 {
		t.Errorf("%s{eds} = %v, want 1", MetricReportedNACKs, n)
	}
	closeLocal()
}

// TestIdleRelayPrunes: with no local client and no stream to the hub, what
// no client wants still leaves the caches after RetainUnwanted (a new
// client would be served it at once, however old).
func TestIdleRelayPrunes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := &scriptedHub{requests: make(chan *discovery.DiscoveryRequest, 64), responses: make(chan *discovery.DiscoveryResponse)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, h)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	relay, _, relayAddr := startRelay(t, lis.Addr().String(), loc("r1", "z1"))
	const name = "outbound|8080||echo.default.svc.clusterset.local"
	localCtx, closeLocal := context.WithCancel(ctx)
	local := dialLocal(localCtx, t, relayAddr)
	if err := local.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "raw"}, TypeUrl: resource.EndpointType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	h.next(ctx, t, "the subscription")
	cla, err := anypb.New(&endpoint.ClusterLoadAssignment{ClusterName: name})
	if err != nil {
		t.Fatal(err)
	}
	h.responses <- &discovery.DiscoveryResponse{TypeUrl: resource.EndpointType, VersionInfo: "v1", Nonce: "n1", Resources: []*anypb.Any{cla}}
	h.next(ctx, t, "the ACK")
	held := func() int { return len(relay.node.caches[resource.EndpointType].GetResources()) }
	if n := held(); n != 1 {
		t.Fatalf("the relay holds %d assignments, want 1", n)
	}
	// The hub goes, then the client: the relay is idle.
	g.Stop()
	closeLocal()
	waitFor(ctx, t, "the unwanted assignment to leave the idle relay's cache", func() bool { return held() == 0 })
}

// TestACKWhenTheRejectingClientLeaves: when a report is the relay's last
// word to the hub and the rejecting client goes (another still asks for the
// same), the relay ACKs: no client rejects what it holds any more.
func TestACKWhenTheRejectingClientLeaves(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, hubAddr := startScriptedHub(t)
	_, _, relayAddr := startRelay(t, hubAddr, loc("r1", "z1"))
	const name = "outbound|8080||echo.default.svc.clusterset.local"
	conn, err := grpc.NewClient(relayAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	// open subscribes a local stream and returns it once it holds the assignment, unanswered.
	open := func(streamCtx context.Context, node string) (discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, *discovery.DiscoveryResponse) {
		t.Helper()
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(streamCtx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: resource.EndpointType, ResourceNames: []string{name}}); err != nil {
			t.Fatal(err)
		}
		for {
			resp, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetResources()) == 1 {
				return s, resp
			}
			if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{name},
				VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The hub answers the first client's subscription.
	first := make(chan struct{})
	go func() {
		defer close(first)
		h.next(ctx, t, "the subscription")
		cla, err := anypb.New(&endpoint.ClusterLoadAssignment{ClusterName: name})
		if err != nil {
			t.Error(err)
			return
		}
		h.responses <- &discovery.DiscoveryResponse{TypeUrl: resource.EndpointType, VersionInfo: "v1", Nonce: "n1", Resources: []*anypb.Any{cla}}
		h.next(ctx, t, "the ACK of v1")
	}()
	stays, resp := open(ctx, "stays")
	<-first
	if err := stays.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{name},
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	leaveCtx, leave := context.WithCancel(ctx)
	picky, resp := open(leaveCtx, "picky")
	if err := picky.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{name}, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Message: "no"}}); err != nil {
		t.Fatal(err)
	}
	if req := h.next(ctx, t, "the report"); !strings.Contains(req.GetErrorDetail().GetMessage(), `"picky"`) {
		t.Fatalf("want the report naming picky, got %v", req)
	}
	leave()
	if req := h.next(ctx, t, "the ACK once picky left"); req.GetErrorDetail() != nil || req.GetVersionInfo() != "v1" || req.GetResponseNonce() != "n1" {
		t.Fatalf("after the rejecting client left the relay sent %v, want an ACK of v1", req)
	}
}
