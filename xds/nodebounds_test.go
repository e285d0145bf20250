package xds

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/internal/logbuf"
)

// startXDSLogging is startXDS logging to out.
func startXDSLogging(t *testing.T, out io.Writer) (*Server, string) {
	t.Helper()
	s := NewServer(DefaultConfig(), Wiring{}, slog.New(slog.NewTextHandler(out, nil)), prometheus.NewRegistry())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return s, lis.Addr().String()
}

// firstAnswer opens an ADS stream, sends req and returns the first response, or how the stream ended.
func firstAnswer(ctx context.Context, t *testing.T, ads discovery.AggregatedDiscoveryServiceClient, req *discovery.DiscoveryRequest) (*discovery.DiscoveryResponse, error) {
	t.Helper()
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(req); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return stream.Recv()
}

// A node with a string over MaxNodeFieldBytes is refused on its first
// request, with InvalidArgument naming the field, before the server keeps
// anything of it (no locality group is made for it); at the bound, it is
// served.
func TestOversizedNodeFieldsAreRefused(t *testing.T) {
	s, _, addr := startXDS(t)
	r, d := twoServices(t, ready)
	s.Update(r, d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ads := dialADS(ctx, t, addr)
	long := strings.Repeat("x", MaxNodeFieldBytes+1)
	meta := func(key string) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{key: structpb.NewStringValue(long)}}
	}
	cases := []struct {
		field string
		node  *core.Node
	}{
		{"id", &core.Node{Id: long}},
		{"cluster", &core.Node{Id: "n", Cluster: long}},
		{"locality region", &core.Node{Id: "n", Locality: &core.Locality{Region: long, Zone: "z1"}}},
		{"locality zone", &core.Node{Id: "n", Locality: &core.Locality{Region: "r1", Zone: long}}},
		{"locality sub_zone", &core.Node{Id: "n", Locality: &core.Locality{Region: "r1", Zone: "z1", SubZone: long}}},
		{"user_agent_name", &core.Node{Id: "n", UserAgentName: long}},
		{"user_agent_version", &core.Node{Id: "n", UserAgentVersionType: &core.Node_UserAgentVersion{UserAgentVersion: long}}},
		{"metadata NETWORK", &core.Node{Id: "n", Metadata: meta(MetadataNetwork)}},
		{"metadata CLUSTER_ID", &core.Node{Id: "n", Metadata: meta(MetadataCluster)}},
	}
	for _, c := range cases {
		_, err := firstAnswer(ctx, t, ads, &discovery.DiscoveryRequest{Node: c.node, TypeUrl: resource.EndpointType, ResourceNames: []string{ClusterName(echo, 8080)}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "node's "+c.field+" is") {
			t.Errorf("a node whose %s is %d bytes: %.200v, want InvalidArgument naming it", c.field, len(long), err)
		}
	}
	if got := testutil.ToFloat64(s.metrics.refused.WithLabelValues(reasonNodeFieldTooLarge)); got != float64(len(cases)) {
		t.Errorf("%s{reason=%q} = %v, want %d", MetricRefusedRequests, reasonNodeFieldTooLarge, got, len(cases))
	}
	if n := len(*s.groups.Load()); n != 0 {
		t.Errorf("refused nodes made %d locality groups", n)
	}
	// At the bound, every field at once.
	bound := strings.Repeat("y", MaxNodeFieldBytes)
	node := &core.Node{Id: bound, Cluster: bound, Locality: &core.Locality{Region: bound, Zone: bound, SubZone: bound},
		UserAgentName: bound, UserAgentVersionType: &core.Node_UserAgentVersion{UserAgentVersion: bound}}
	resp, err := firstAnswer(ctx, t, ads, &discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{ClusterName(echo, 8080)}})
	if err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("a node at the bounds: %v, %v", resp, err)
	}
}

// Refusals and NACKs are logged with what the client sent cut short, and
// a flood of them logs a few lines, not one each.
func TestRefusalsLogLittle(t *testing.T) {
	var out logbuf.Buffer
	s, addr := startXDSLogging(t, &out)
	r, d := twoServices(t, ready)
	s.Update(r, d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ads := dialADS(ctx, t, addr)
	huge := strings.Repeat("h", 1<<20)
	fat := &structpb.Struct{Fields: map[string]*structpb.Value{"blob": structpb.NewStringValue(strings.Repeat("x", DefaultConfig().MaxNodeMetadataBytes))}}
	for range 30 {
		_, err := firstAnswer(ctx, t, ads, &discovery.DiscoveryRequest{Node: &core.Node{Id: huge, Metadata: fat}, TypeUrl: resource.EndpointType,
			ResourceNames: []string{ClusterName(echo, 8080)}})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a node with a 1 MiB ID and too much metadata: %v", err)
		}
	}
	// Clients that NACK what they are sent, with long details.
	for range 30 {
		stream, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		name := ClusterName(echo, 8080)
		if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "nacker"}, TypeUrl: resource.EndpointType, ResourceNames: []string{name}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		nacks := testutil.ToFloat64(s.metrics.nacks.WithLabelValues(typeEDS))
		if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{name}, ResponseNonce: resp.GetNonce(),
			ErrorDetail: status.New(codes.InvalidArgument, huge).Proto()}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for testutil.ToFloat64(s.metrics.nacks.WithLabelValues(typeEDS)) == nacks {
			if time.Now().After(deadline) {
				t.Fatal("the NACK was never counted")
			}
			time.Sleep(time.Millisecond)
		}
	}
	logged := out.String()
	if len(logged) > 32<<10 {
		t.Fatalf("30 refusals and 30 NACKs carrying 1 MiB strings logged %d bytes", len(logged))
	}
	if n := strings.Count(logged, "refused an xDS request"); n == 0 || n > 10 {
		t.Errorf("30 refusals logged %d lines, want a few", n)
	}
	if n := strings.Count(logged, "(NACK)"); n == 0 || n > 10 {
		t.Errorf("30 NACKs logged %d lines, want a few", n)
	}
}
