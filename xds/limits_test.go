package xds

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// A request naming more resources than the limit, or a node with oversized
// metadata, ends its stream with a status that says why; it is counted,
// and a well-behaved client beside it is served as usual.
func TestOversizedRequestsAreRefused(t *testing.T) {
	s, _, addr := startXDS(t)
	r, d := twoServices(t, ready)
	s.Update(r, d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ads := dialADS(ctx, t, addr)
	refused := func(req *discovery.DiscoveryRequest) error {
		t.Helper()
		stream, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		_, err = stream.Recv()
		return err
	}
	names := make([]string, DefaultConfig().MaxResourceNames+1)
	for i := range names {
		names[i] = fmt.Sprintf("outbound|8080||svc-%d.default.svc.clusterset.local", i)
	}
	err := refused(&discovery.DiscoveryRequest{Node: &core.Node{Id: "greedy"}, TypeUrl: resource.EndpointType, ResourceNames: names})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most") {
		t.Errorf("a request for %d names: %v, want ResourceExhausted saying the limit", len(names), err)
	}
	big := &structpb.Struct{Fields: map[string]*structpb.Value{"blob": structpb.NewStringValue(strings.Repeat("x", DefaultConfig().MaxNodeMetadataBytes))}}
	err = refused(&discovery.DiscoveryRequest{Node: &core.Node{Id: "fat", Metadata: big}, TypeUrl: resource.EndpointType, ResourceNames: []string{ClusterName(echo, 8080)}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "metadata") {
		t.Errorf("a node with %d bytes of metadata: %v, want InvalidArgument saying why", DefaultConfig().MaxNodeMetadataBytes, err)
	}
	for _, reason := range []string{reasonTooManyNames, reasonMetadataTooLarge} {
		if got := testutil.ToFloat64(s.metrics.refused.WithLabelValues(reason)); got != 1 {
			t.Errorf("%s{reason=%q} = %v, want 1", MetricRefusedRequests, reason, got)
		}
	}
	// A client within the limits is served.
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "polite"}, TypeUrl: resource.EndpointType, ResourceNames: []string{ClusterName(echo, 8080)}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.GetResources()) != 1 {
		t.Errorf("a client within the limits: %v, %v", resp, err)
	}
}
