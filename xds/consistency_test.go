package xds

import (
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"

	"github.com/navemesh/nave/registry"
)

func TestCheckConsistentFindsWhatEnvoyRefuses(t *testing.T) {
	chain := func(clusterName string, sni ...string) *listener.FilterChain {
		return &listener.FilterChain{
			FilterChainMatch: &listener.FilterChainMatch{ServerNames: sni},
			Filters: []*listener.Filter{{Name: wellknown.TCPProxy, ConfigType: &listener.Filter_TypedConfig{
				TypedConfig: mustAny(&tcpproxy.TcpProxy{StatPrefix: "t", ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: clusterName}})}}},
		}
	}
	good := func() Resources {
		l := Listener(echo, tcp("grpc", 8080))
		l.FilterChains = []*listener.FilterChain{{Filters: []*listener.Filter{{Name: wellknown.HTTPConnectionManager,
			ConfigType: &listener.Filter_TypedConfig{TypedConfig: l.GetApiListener().GetApiListener()}}}}}
		l.ApiListener = nil
		l.Address = socketAddress("0.0.0.0", 15444)
		tls := &listener.Listener{Name: "tls", Address: socketAddress("0.0.0.0", 15443),
			FilterChains: []*listener.FilterChain{chain(ClusterName(echo, 8080), "a"), chain(ClusterName(echo, 8080), "b")}}
		return Resources{
			Listeners: []*listener.Listener{l, tls},
			Routes:    []*route.RouteConfiguration{RouteConfiguration(&registry.Service{Key: echo}, tcp("grpc", 8080), nil)},
			Clusters:  []*cluster.Cluster{Cluster(echo, tcp("grpc", 8080), nil)},
		}
	}
	has := func(string) bool { return true }
	if err := CheckConsistent(good(), has); err != nil {
		t.Fatalf("a consistent set: %v", err)
	}
	for _, tc := range []struct {
		want        string
		breaks      func(*Resources)
		assignments func(string) bool
	}{
		{"appears twice", func(r *Resources) { r.Clusters = append(r.Clusters, r.Clusters[0]) }, has},
		{"no endpoint assignment", func(*Resources) {}, func(string) bool { return false }},
		{"names route configuration", func(r *Resources) { r.Routes = nil }, has},
		{"names cluster", func(r *Resources) { r.Clusters[0].Name = "other"; r.Clusters[0].EdsClusterConfig.ServiceName = "other" }, has},
		{"both bind", func(r *Resources) { r.Listeners[1].Address = r.Listeners[0].Address }, has},
		{"the same match", func(r *Resources) { r.Listeners[1].FilterChains[1] = chain(ClusterName(echo, 8080), "a") }, has},
		{"is claimed by virtual hosts", func(r *Resources) {
			vh := r.Routes[0].VirtualHosts[0]
			r.Routes[0].VirtualHosts = append(r.Routes[0].VirtualHosts, &route.VirtualHost{Name: "other", Domains: vh.Domains[:1], Routes: vh.Routes})
		}, has},
	} {
		res := good()
		tc.breaks(&res)
		if err := CheckConsistent(res, tc.assignments); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckConsistent = %v, want an error about %q", err, tc.want)
		}
	}
}
