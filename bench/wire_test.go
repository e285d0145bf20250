package main

import (
	"fmt"
	"slices"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestScanAssignmentReadsWhatUnmarshalReads(t *testing.T) {
	lb := func(addr string, port uint32, h core.HealthStatus) *endpoint.LbEndpoint {
		return &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: &core.Address{
				Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Address: addr, PortSpecifier: &core.SocketAddress_PortValue{PortValue: port}}}}}},
			HealthStatus:        h,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}
	}
	cla := &endpoint.ClusterLoadAssignment{ClusterName: "outbound|8080||svc.ns.svc.clusterset.local", Endpoints: []*endpoint.LocalityLbEndpoints{
		{Locality: &core.Locality{Region: "r1", Zone: "z1"}, LoadBalancingWeight: wrapperspb.UInt32(2), LbEndpoints: []*endpoint.LbEndpoint{
			lb("10.0.0.1", 9090, core.HealthStatus_HEALTHY), lb("10.0.0.2", 9091, core.HealthStatus_DRAINING)}},
		{Locality: &core.Locality{Region: "r2"}, Priority: 1, LoadBalancingWeight: wrapperspb.UInt32(1), LbEndpoints: []*endpoint.LbEndpoint{
			lb("10.1.0.1", 8080, core.HealthStatus_UNKNOWN)}},
	}}
	b, err := proto.Marshal(cla)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			want = append(want, fmt.Sprintf("%s:%d/%s", sa.GetAddress(), sa.GetPortValue(), e.GetHealthStatus()))
		}
	}
	var got []string
	name, err := scanAssignment(b, func(addr string, port uint32, h core.HealthStatus) {
		got = append(got, fmt.Sprintf("%s:%d/%s", addr, port, h))
	})
	if err != nil {
		t.Fatal(err)
	}
	if name != cla.GetClusterName() || !slices.Equal(got, want) {
		t.Fatalf("scanAssignment: %q %v, want %q %v", name, got, cla.GetClusterName(), want)
	}
	if _, err := scanAssignment(b[:len(b)-3], func(string, uint32, core.HealthStatus) {}); err == nil {
		t.Fatal("a truncated assignment scanned without error")
	}
}
