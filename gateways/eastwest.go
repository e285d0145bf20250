package gateways

import (
	"fmt"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// Names of an east-west gateway's resources.
const (
	EastWestTLSListener   = "nave-eastwest-tls"
	EastWestHTTP2Listener = "nave-eastwest-h2"
	EastWestHTTP2Routes   = "nave-eastwest-h2"
)

// SNI is the server name by which a client on another network asks an
// east-west gateway for a service port over TLS: Istio's
// outbound_.PORT_._.HOSTNAME, so Istio's sidecars reach Nave's gateways.
func SNI(k registry.ServiceKey, port int32) string {
	return fmt.Sprintf("outbound_.%d_._.%s", port, k.Hostname())
}

// EastWest builds an east-west gateway's resources: for every federated
// service port, a cluster of the gateway's network's endpoints of it (the
// node's EDS is computed NetworkOnly), a filter chain of the TLS listener
// that forwards the TLS connections naming it (SNI) untouched, and a
// virtual host of the HTTP/2 listener's routes that forwards plaintext
// HTTP/2 (gRPC) naming it (:authority HOSTNAME:PORT).
func EastWest(r *registry.Registry) xds.Resources {
	var res xds.Resources
	tls := listenerOn(EastWestTLSListener, EastWestTLSPort)
	tls.ListenerFilters = append(tls.ListenerFilters, tlsInspector())
	routes := &route.RouteConfiguration{Name: EastWestHTTP2Routes}
	for _, svc := range r.Services() {
		for _, p := range xds.ServicePorts(svc) {
			// The client chose the route (and this network) already: the
			// gateway applies the service's policy among its endpoints.
			c := withPolicy(edsCluster(svc.Key, p), svc.Traffic.Policy)
			res.Clusters = append(res.Clusters, c)
			tls.FilterChains = append(tls.FilterChains, &listener.FilterChain{
				FilterChainMatch: &listener.FilterChainMatch{ServerNames: []string{SNI(svc.Key, p.Port)}, TransportProtocol: "tls"},
				Filters:          []*listener.Filter{tcpProxy("eastwest."+statName(svc.Key, p.Port), c.GetName())},
			})
			host := authority(svc.Key, p.Port)
			routes.VirtualHosts = append(routes.VirtualHosts, &route.VirtualHost{
				Name: host, Domains: []string{host},
				Routes: []*route.Route{grpcRoute(c.GetName(), "")},
			})
		}
	}
	h2 := listenerOn(EastWestHTTP2Listener, EastWestHTTP2Port)
	h2.FilterChains = []*listener.FilterChain{{Filters: []*listener.Filter{
		// HTTP/2 from proxyless gRPC; HTTP/1.1 too, from another network's ingress gateway.
		httpManager("eastwest_h2", EastWestHTTP2Routes, hcm.HttpConnectionManager_AUTO, false),
	}}}
	// Envoy refuses a listener without filter chains: the TLS one waits for a service.
	if len(tls.FilterChains) > 0 {
		res.Listeners = append(res.Listeners, tls)
	}
	res.Listeners = append(res.Listeners, h2)
	res.Routes = append(res.Routes, routes)
	return res
}

func statName(k registry.ServiceKey, port int32) string {
	return fmt.Sprintf("%s.%s.%d", k.Namespace, k.Name, port)
}
