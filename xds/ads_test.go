package xds

import (
	"context"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/navemesh/nave/registry"
)

// twoServices is echo (east, r1/z1 and r1/z2) and other (west, r2/z3).
func twoServices(t *testing.T, echoCond registry.Conditions) (*registry.Registry, registry.Diff) {
	return apply(t, registry.New(),
		shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
			ep("10.0.0.1", loc("r1", "z1"), echoCond, eport("grpc", 9090)),
			ep("10.0.0.2", loc("r1", "z2"), ready, eport("grpc", 9090))),
		shard("west", otherKey, []registry.ServicePort{tcp("grpc", 8080)},
			ep("10.1.0.1", loc("r2", "z3"), ready, eport("grpc", 9090))))
}

var otherKey = registry.ServiceKey{Namespace: "default", Name: "other"}

func dialADS(ctx context.Context, t *testing.T, addr string) discovery.AggregatedDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return discovery.NewAggregatedDiscoveryServiceClient(conn)
}

func claNames(t *testing.T, resources []*anypb.Any) []string {
	t.Helper()
	return namesOf(t, resources, (*endpoint.ClusterLoadAssignment).GetClusterName)
}

// namesOf unpacks resources as M and returns their names, sorted.
func namesOf[M any, P interface {
	*M
	proto.Message
}](t *testing.T, resources []*anypb.Any, name func(P) string) []string {
	t.Helper()
	var out []string
	for _, r := range resources {
		m := P(new(M))
		if err := r.UnmarshalTo(m); err != nil {
			t.Fatal(err)
		}
		out = append(out, name(m))
	}
	slices.Sort(out)
	return out
}

// TestEndpointChangeResendsOnlyItsAssignment speaks state-of-the-world ADS by hand.
func TestEndpointChangeResendsOnlyItsAssignment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, metrics, addr := startXDS(t)
	r, _ := twoServices(t, ready)
	srv.Update(r, registry.Diff{})

	stream, err := dialADS(ctx, t, addr).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	echoCLA, otherCLA := ClusterName(echo, 8080), ClusterName(otherKey, 8080)
	names := []string{echoCLA, otherCLA}
	node := &core.Node{Id: "raw", Locality: &core.Locality{Region: "r1", Zone: "z1"}}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := len(resp.GetResources()); got != 2 {
		t.Fatalf("first response has %d assignments, want 2", got)
	}
	ack := func(resp *discovery.DiscoveryResponse) {
		t.Helper()
		if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: names,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	ack(resp)
	acked := resp.GetVersionInfo()

	// A change that does not change what clients see (a not-ready endpoint appears)
	// publishes nothing.
	edsUpdates := metricValue(t, metrics, MetricResourceUpdates, typeEDS)
	r2, d := apply(t, r, shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)),
		ep("10.0.0.2", loc("r1", "z2"), ready, eport("grpc", 9090)),
		ep("10.0.0.3", loc("r1", "z2"), notReady, eport("grpc", 9090))))
	if d.Empty() {
		t.Fatal("test change changed nothing in the registry")
	}
	srv.Update(r2, d)
	if got := metricValue(t, metrics, MetricResourceUpdates, typeEDS); got != edsUpdates {
		t.Errorf("an invisible change published %v assignments", got-edsUpdates)
	}

	// echo's zone-1 endpoint starts draining: only echo's assignment is resent.
	r3, d := apply(t, r2, shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), draining, eport("grpc", 9090)),
		ep("10.0.0.2", loc("r1", "z2"), ready, eport("grpc", 9090))))
	srv.Update(r3, d)
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := claNames(t, resp.GetResources()); !slices.Equal(got, []string{echoCLA}) {
		t.Fatalf("push after an echo endpoint change carried %v, want only %s", got, echoCLA)
	}
	var cla endpoint.ClusterLoadAssignment
	if err := resp.GetResources()[0].UnmarshalTo(&cla); err != nil {
		t.Fatal(err)
	}
	if got := cla.GetEndpoints(); len(got) != 1 || got[0].GetLocality().GetZone() != "z2" || got[0].GetPriority() != 0 {
		t.Fatalf("echo for r1/z1 after z1 drained: %v, want z2 alone at priority 0", got)
	}
	if got := metricValue(t, metrics, MetricResourceUpdates, typeLDS); got != 2 {
		t.Errorf("listeners published %v times, want 2 (once per service)", got)
	}

	// The client rejects that push. The server answers nothing until the next
	// change, and that answer proves the NACK was processed (and counted) first:
	// after a response no watch is open until the next request.
	// Like a real client, it NACKs with the version it last accepted.
	if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: names,
		VersionInfo: acked, ResponseNonce: resp.GetNonce(), ErrorDetail: &status.Status{Message: "test says no"}}); err != nil {
		t.Fatal(err)
	}
	for metricValue(t, metrics, MetricNACKs, typeEDS) != 1 {
		if ctx.Err() != nil {
			t.Fatal("the NACK was never counted")
		}
		time.Sleep(time.Millisecond)
	}
	r4, d := apply(t, r3, shard("west", otherKey, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.1.0.2", loc("r2", "z3"), ready, eport("grpc", 9090))))
	srv.Update(r4, d)
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := claNames(t, resp.GetResources()); !slices.Equal(got, []string{otherCLA}) {
		t.Fatalf("push after an other endpoint change carried %v, want only %s", got, otherCLA)
	}
	if got := metricValue(t, metrics, MetricNACKs, typeEDS); got != 1 {
		t.Errorf("NACKs counted: %v, want 1", got)
	}
}

// TestDeltaEndpoints speaks incremental (delta) ADS by hand: one changed
// assignment, then a removed one.
func TestDeltaEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, _, addr := startXDS(t)
	r, _ := twoServices(t, ready)
	srv.Update(r, registry.Diff{})

	stream, err := dialADS(ctx, t, addr).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	echoCLA, otherCLA := ClusterName(echo, 8080), ClusterName(otherKey, 8080)
	node := &core.Node{Id: "delta", Locality: &core.Locality{Region: "r2", Zone: "z3"}}
	if err := stream.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.EndpointType,
		ResourceNamesSubscribe: []string{echoCLA, otherCLA}}); err != nil {
		t.Fatal(err)
	}
	recv := func() *discovery.DeltaDiscoveryResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if got := resourceNames(recv().GetResources()); !slices.Equal(got, []string{echoCLA, otherCLA}) {
		t.Fatalf("first delta response: %v", got)
	}

	r2, d := apply(t, r, shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), draining, eport("grpc", 9090)),
		ep("10.0.0.2", loc("r1", "z2"), ready, eport("grpc", 9090))))
	srv.Update(r2, d)
	if got := resourceNames(recv().GetResources()); !slices.Equal(got, []string{echoCLA}) {
		t.Fatalf("delta push after an echo change: %v, want only %s", got, echoCLA)
	}

	r3, d := r2.Apply(registry.Change{Cluster: "west", Removes: []registry.ServiceKey{otherKey}})
	srv.Update(r3, d)
	resp := recv()
	if len(resp.GetResources()) != 0 || !slices.Equal(resp.GetRemovedResources(), []string{otherCLA}) {
		t.Fatalf("delta push after removing other: resources %v, removed %v", resourceNames(resp.GetResources()), resp.GetRemovedResources())
	}
}

func resourceNames(resources []*discovery.Resource) []string {
	var out []string
	for _, r := range resources {
		out = append(out, r.GetName())
	}
	slices.Sort(out)
	return out
}
