package gateways

import (
	"fmt"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// HostsAnnotation, an exported annotation of a service, lists (comma
// separated) more host names an ingress gateway serves it under, besides
// its clusterset hostname.
const HostsAnnotation = "nave.io/ingress-hosts"

// SDSCluster is the bootstrap cluster through which an ingress gateway's
// Envoy fetches its certificates (the agent's SDS server).
const SDSCluster = "nave-sds"

// ListenerName is the name of an ingress gateway's listener on port (and of
// its route configuration).
func ListenerName(port uint32) string { return fmt.Sprintf("nave-ingress-%d", port) }

// exposed is a service an ingress gateway exposes: the port it forwards to
// and the host names it answers to.
type exposed struct {
	svc   *registry.Service
	port  registry.ServicePort
	hosts []string
}

// Ingress builds an ingress gateway's resources: one listener per
// configured port (HTTP with routes, HTTPS terminating TLS with the SDS
// secret named, or TLS passthrough by SNI), a virtual host per exposed
// service under its clusterset hostname and its aliases (HostsAnnotation),
// and a cluster per exposed service port. A host name claimed by two
// services goes to the first in namespace/name order.
func Ingress(r *registry.Registry, n Node) xds.Resources {
	var res xds.Resources
	services := exposedServices(r, n)
	clusters := map[string]bool{}
	for _, l := range n.Listeners {
		var picked []exposed
		for _, e := range services {
			picked = append(picked, e.at(l.Port))
		}
		for _, e := range picked {
			c := edsCluster(e.svc.Key, e.port)
			if !clusters[c.GetName()] {
				clusters[c.GetName()] = true
				res.Clusters = append(res.Clusters, c)
			}
		}
		switch l.Mode {
		case ModePassthrough:
			if li := passthroughListener(l, picked); li != nil {
				res.Listeners = append(res.Listeners, li)
			}
		default:
			li, routes := httpListener(l, picked)
			res.Listeners = append(res.Listeners, li)
			res.Routes = append(res.Routes, routes)
		}
	}
	return res
}

// exposedServices are the services the gateway exposes, in key order, each
// with the host names no earlier service claimed.
func exposedServices(r *registry.Registry, n Node) []exposed {
	var out []exposed
	claimed := map[string]bool{}
	for _, svc := range r.Services() {
		ports := xds.ServicePorts(svc)
		if len(ports) == 0 || svc.Headless || !n.Expose.Selects(svc) {
			continue
		}
		e := exposed{svc: svc, port: ports[0]}
		for _, h := range append([]string{svc.Key.Hostname()}, aliases(svc)...) {
			if !claimed[h] {
				claimed[h] = true
				e.hosts = append(e.hosts, h)
			}
		}
		if len(e.hosts) > 0 {
			out = append(out, e)
		}
	}
	return out
}

// at is the service as a listener on port exposes it: at its port of that
// number when it has one, else at its first.
func (e exposed) at(port uint32) exposed {
	for _, p := range xds.ServicePorts(e.svc) {
		if uint32(p.Port) == port {
			e.port = p
		}
	}
	return e
}

// aliases are the valid host names of the service's HostsAnnotation.
func aliases(svc *registry.Service) []string {
	var out []string
	for _, h := range strings.Split(svc.Annotations[HostsAnnotation], ",") {
		h = strings.ToLower(strings.TrimSpace(h))
		if h != "" && (registry.Gateway{Address: h, Port: 1}).Validate() == nil && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// httpListener is an HTTP(S) listener and its routes: a virtual host per
// exposed service, answering to its host names.
func httpListener(l Listener, services []exposed) (*listener.Listener, *route.RouteConfiguration) {
	name := ListenerName(l.Port)
	routes := &route.RouteConfiguration{Name: name}
	for _, e := range services {
		routes.VirtualHosts = append(routes.VirtualHosts, &route.VirtualHost{
			Name:    e.svc.Key.String(),
			Domains: e.hosts,
			Routes:  []*route.Route{grpcRoute(xds.ClusterName(e.svc.Key, e.port.Port), authority(e.svc.Key, e.port.Port))},
		})
	}
	li := listenerOn(name, l.Port)
	chain := &listener.FilterChain{Filters: []*listener.Filter{
		httpManager(fmt.Sprintf("ingress_%d", l.Port), name, hcm.HttpConnectionManager_AUTO, true),
	}}
	if l.Mode == ModeHTTPS {
		chain.TransportSocket = &core.TransportSocket{Name: wellknown.TransportSocketTLS,
			ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(&tlsv3.DownstreamTlsContext{
				CommonTlsContext: &tlsv3.CommonTlsContext{
					TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: l.Secret, SdsConfig: sdsSource()}},
					AlpnProtocols:                  []string{"h2", "http/1.1"},
				},
			})}}
	}
	li.FilterChains = []*listener.FilterChain{chain}
	return li, routes
}

// passthroughListener routes TLS by SNI, untouched, to the service it
// names; nil when no service is exposed (Envoy refuses a listener without
// filter chains).
func passthroughListener(l Listener, services []exposed) *listener.Listener {
	if len(services) == 0 {
		return nil
	}
	li := listenerOn(ListenerName(l.Port), l.Port)
	li.ListenerFilters = append(li.ListenerFilters, tlsInspector())
	for _, e := range services {
		li.FilterChains = append(li.FilterChains, &listener.FilterChain{
			FilterChainMatch: &listener.FilterChainMatch{ServerNames: e.hosts, TransportProtocol: "tls"},
			Filters:          []*listener.Filter{tcpProxy(fmt.Sprintf("ingress_%d.%s", l.Port, statName(e.svc.Key, e.port.Port)), xds.ClusterName(e.svc.Key, e.port.Port))},
		})
	}
	return li
}

// sdsSource fetches a secret from the agent's SDS server (SDSCluster).
func sdsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion: core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_ApiConfigSource{ApiConfigSource: &core.ApiConfigSource{
			ApiType:             core.ApiConfigSource_GRPC,
			TransportApiVersion: core.ApiVersion_V3,
			GrpcServices: []*core.GrpcService{{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: SDSCluster},
			}}},
		}},
	}
}
