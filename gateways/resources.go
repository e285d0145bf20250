package gateways

import (
	"strconv"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
	"github.com/navemesh/nave/xds"
)

// connectTimeout is how long a gateway waits for an upstream connection.
const connectTimeout = 5 * time.Second

// upstream is how a gateway's cluster speaks to its endpoints.
type upstream int

const (
	// http1: HTTP/1.1 to the endpoint, whatever the client spoke (a pod
	// that does not say it speaks HTTP/2 may not).
	http1 upstream = iota
	// http2: HTTP/2 in the clear (gRPC, h2c).
	http2
)

// upstreamOf is how a gateway speaks HTTP to a service port's endpoints
// (TCP proxying ignores it).
func upstreamOf(p registry.ServicePort) upstream {
	if speaksHTTP2(p) {
		return http2
	}
	return http1
}

// speaksHTTP2 reports whether a service port serves HTTP/2 in the clear
// (gRPC): its appProtocol says so, or its name does (Istio's convention).
func speaksHTTP2(p registry.ServicePort) bool {
	switch strings.ToLower(p.AppProtocol) {
	case "grpc", "h2c", "http2", "kubernetes.io/h2c", "grpc-web":
		return true
	}
	name := strings.ToLower(p.Name)
	return name == "grpc" || strings.HasPrefix(name, "grpc-") || name == "http2" || strings.HasPrefix(name, "http2-") ||
		name == "h2c" || strings.HasPrefix(name, "h2c-")
}

// edsCluster is a gateway's cluster of a service port: its endpoints come
// over ADS as the assignment of the same name, computed for the gateway's
// locality (and, for an east-west gateway, its network alone).
func edsCluster(k registry.ServiceKey, p registry.ServicePort) *cluster.Cluster {
	return edsClusterNamed(xds.ClusterName(k, p.Port), p)
}

// edsClusterNamed is edsCluster under another name (a route's backend: a
// Service backend's cluster-local name, say).
func edsClusterNamed(name string, p registry.ServicePort) *cluster.Cluster {
	explicit := &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{
		HttpProtocolOptions: &core.Http1ProtocolOptions{}}}
	if upstreamOf(p) == http2 {
		explicit.ProtocolConfig = &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &core.Http2ProtocolOptions{}}
	}
	opts := &upstreamhttp.HttpProtocolOptions{UpstreamProtocolOptions: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: explicit}}
	return &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		// Locality-weighted, so failover follows the gateway's locality (priorities) and weights.
		CommonLbConfig: &cluster.Cluster_CommonLbConfig{LocalityConfigSpecifier: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
			LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{}}},
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(opts)},
	}
}

// httpManager is a listener filter chain's HTTP connection manager, its
// routes fetched over ADS (RDS) as routeConfig. stripPort: virtual hosts
// name hosts without a port, and a client's Host loses any it carries.
func httpManager(statPrefix, routeConfig string, codec hcm.HttpConnectionManager_CodecType, stripPort bool) *listener.Filter {
	m := &hcm.HttpConnectionManager{
		CodecType:  codec,
		StatPrefix: statPrefix,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource: ads(), RouteConfigName: routeConfig,
		}},
		HttpFilters: []*hcm.HttpFilter{{
			Name:       wellknown.Router,
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})},
		}},
		// Long-lived gRPC streams: no idle cut before an hour.
		StreamIdleTimeout: durationpb.New(time.Hour),
	}
	if stripPort {
		m.StripPortMode = &hcm.HttpConnectionManager_StripAnyHostPort{StripAnyHostPort: true}
	}
	return &listener.Filter{Name: wellknown.HTTPConnectionManager, ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(m)}}
}

// tcpProxy is a filter forwarding the connection, untouched, to a cluster.
func tcpProxy(statPrefix, clusterName string) *listener.Filter {
	return &listener.Filter{Name: wellknown.TCPProxy, ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxy.TcpProxy{
		StatPrefix:       statPrefix,
		ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: clusterName},
	})}}
}

// tlsInspector reads the SNI of a TLS connection, for filter chains to match on.
func tlsInspector() *listener.ListenerFilter {
	return &listener.ListenerFilter{Name: wellknown.TLSInspector,
		ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{})}}
}

// grpcRoute sends every request of a virtual host to a cluster, as gRPC
// needs: no overall timeout (streams last), the client's grpc-timeout
// honoured, and the authority rewritten to what the cluster's endpoints (or
// the east-west gateway in front of them) route by: HOSTNAME:PORT.
func grpcRoute(clusterName, authority string) *route.Route {
	action := &route.RouteAction{
		ClusterSpecifier: &route.RouteAction_Cluster{Cluster: clusterName},
		Timeout:          durationpb.New(0),
		MaxStreamDuration: &route.RouteAction_MaxStreamDuration{
			GrpcTimeoutHeaderMax: durationpb.New(0), // honour the client's grpc-timeout, however long
		},
	}
	if authority != "" {
		action.HostRewriteSpecifier = &route.RouteAction_HostRewriteLiteral{HostRewriteLiteral: authority}
	}
	return &route.Route{
		Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: action},
	}
}

func listenerOn(name string, port uint32) *listener.Listener {
	return &listener.Listener{
		Name: name,
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Protocol: core.SocketAddress_TCP, Address: "0.0.0.0", PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
		}}},
	}
}

func authority(k registry.ServiceKey, port int32) string {
	return k.Hostname() + ":" + strconv.Itoa(int(port))
}

func ads() *core.ConfigSource {
	return &core.ConfigSource{
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
		ResourceApiVersion:    core.ApiVersion_V3,
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic("gateways: pack " + string(m.ProtoReflect().Descriptor().FullName()) + ": " + err.Error())
	}
	return a
}

// withPolicy shapes a gateway's cluster by its service's policy (nil:
// none), in the form Envoy takes: the legacy lb_policy and its config
// (least request, ring hash; weighted round robin is round robin here)
// beside the locality-weighted setting, without the load_balancing_policy
// proxyless clients get. Envoy takes the first policy of that list it
// knows and fails on its config (it does not fall back), its wrr_locality
// takes only client-side WRR, and it refuses load_balancing_policy beside
// locality weighting.
func withPolicy(c *cluster.Cluster, p *traffic.Policy) *cluster.Cluster {
	xds.ApplyClusterPolicy(c, p)
	c.LoadBalancingPolicy = nil
	return c
}
