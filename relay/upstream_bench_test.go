package relay

import (
	"fmt"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// BenchmarkRelayResponse: what the relay spends on one hub response of 100
// assignments (10 endpoints each) of which one changed, the usual shape of
// an EDS push to a relay subscribed to many services.
func BenchmarkRelayResponse(b *testing.B) {
	r, err := New(DefaultConfig(), Wiring{Upstream: "127.0.0.1:1", Node: &core.Node{Id: "bench"}}, testLogger(), nil)
	if err != nil {
		b.Fatal(err)
	}
	const services = 100
	names := map[string]struct{}{}
	assignment := func(i, gen int) *anypb.Any {
		cla := &endpoint.ClusterLoadAssignment{ClusterName: fmt.Sprintf("outbound|8080||svc-%d.ns.svc.clusterset.local", i)}
		var lbs []*endpoint.LbEndpoint
		for e := range 10 {
			lbs = append(lbs, &endpoint.LbEndpoint{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Address: fmt.Sprintf("10.%d.%d.%d", i/250, i%250, e+gen), PortSpecifier: &core.SocketAddress_PortValue{PortValue: 8080}}}}}}})
		}
		cla.Endpoints = []*endpoint.LocalityLbEndpoints{{Locality: &core.Locality{Region: "r1", Zone: "z1"}, LbEndpoints: lbs}}
		a, err := anypb.New(cla)
		if err != nil {
			b.Fatal(err)
		}
		return a
	}
	responses := make([]*discovery.DiscoveryResponse, 2)
	for gen := range responses {
		resp := &discovery.DiscoveryResponse{TypeUrl: resource.EndpointType}
		for i := range services {
			g := 0
			if i == 0 {
				g = gen // only the first assignment differs between the two
			}
			resp.Resources = append(resp.Resources, assignment(i, g))
			names[fmt.Sprintf("outbound|8080||svc-%d.ns.svc.clusterset.local", i)] = struct{}{}
		}
		responses[gen] = resp
	}
	sub := subscription{names: names}
	u := &upstream{view: r.node, held: newHeldState(), types: map[string]*upstreamType{}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := u.receive(resource.EndpointType, responses[i%2], sub, sub); err != nil {
			b.Fatal(err)
		}
	}
}
