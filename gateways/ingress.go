package gateways

import (
	"fmt"
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
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
			c := withPolicy(edsCluster(e.svc.Key, e.port), e.svc.Traffic.Policy)
			if !clusters[c.GetName()] {
				clusters[c.GetName()] = true
				res.Clusters = append(res.Clusters, c)
			}
			if l.Mode == ModePassthrough {
				continue // TLS passes through to the service itself: its routes are for HTTP
			}
			for _, c := range backendClusters(r, routed(e, r)) {
				if !clusters[c.GetName()] {
					clusters[c.GetName()] = true
					res.Clusters = append(res.Clusters, c)
				}
			}
		}
		switch l.Mode {
		case ModePassthrough:
			if li := passthroughListener(l, picked); li != nil {
				res.Listeners = append(res.Listeners, li)
			}
		default:
			li, routes := httpListener(l, picked, r)
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
// exposed service, answering to its host names, with the service's own
// routes (traffic policy) as every client of it gets them.
func httpListener(l Listener, services []exposed, r *registry.Registry) (*listener.Listener, *route.RouteConfiguration) {
	name := ListenerName(l.Port)
	routes := &route.RouteConfiguration{Name: name}
	for _, e := range services {
		routes.VirtualHosts = append(routes.VirtualHosts, &route.VirtualHost{
			Name:    e.svc.Key.String(),
			Domains: e.hosts,
			Routes:  ingressRoutes(e, r),
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

// ingressRoutes are an exposed service's routes in a gateway's form: the
// routes every client of the port gets (xds.Routes: the service's traffic
// policy, or one route to the port's cluster), each rewriting the host to
// the service's authority, and without Envoy's default 15 s timeout
// unless the policy sets one (a gRPC stream may last).
func ingressRoutes(e exposed, r *registry.Registry) []*route.Route {
	auth := authority(e.svc.Key, e.port.Port)
	e = routed(e, r)
	routes := xds.Routes(e.svc, e.port.Port, r.Service)
	for _, rt := range routes {
		a := rt.GetRoute()
		if a == nil {
			continue // a direct response: nothing to forward
		}
		a.HostRewriteSpecifier = &route.RouteAction_HostRewriteLiteral{HostRewriteLiteral: auth}
		if a.Timeout == nil {
			a.Timeout = durationpb.New(0)
		}
		if a.MaxStreamDuration == nil {
			a.MaxStreamDuration = &route.RouteAction_MaxStreamDuration{GrpcTimeoutHeaderMax: durationpb.New(0)} // honour the client's grpc-timeout
		} else {
			// The policy's timeout, or the client's grpc-timeout if shorter (gRFC A31).
			a.MaxStreamDuration.GrpcTimeoutHeaderMax = a.MaxStreamDuration.MaxStreamDuration
		}
	}
	return routes
}

// backendClusters are the clusters an exposed service's routes send
// requests to besides its own, each shaped by its service's policy: a
// service no cluster exports gets one whose assignment is empty (the hub
// publishes it as a placeholder), spoken to as the exposed port is.
func backendClusters(r *registry.Registry, e exposed) []*cluster.Cluster {
	var out []*cluster.Cluster
	for _, b := range xds.RouteBackends(e.svc, e.port.Port) {
		if !b.Local && b.Key == e.svc.Key && b.Port == e.port.Port {
			continue // the port's own cluster
		}
		port := e.port
		port.Port = b.Port
		svc := r.Service(b.Key)
		for _, p := range xds.ServicePorts(svc) {
			if p.Port == b.Port {
				port = p
			}
		}
		c := edsClusterNamed(b.ClusterName(), port)
		if svc != nil {
			c = withPolicy(c, svc.Traffic.Policy)
		}
		out = append(out, c)
	}
	return out
}

// routed is e as its routes are served: with its traffic, or, when its
// routes make a route configuration the hub refuses (and serves its
// proxyless clients without), without, as they are served.
func routed(e exposed, r *registry.Registry) exposed {
	if e.svc.Traffic.IsZero() || xds.Validate(xds.RouteConfiguration(e.svc, e.port, r.Service)) == nil {
		return e
	}
	plain := *e.svc
	plain.Traffic = traffic.Set{}
	e.svc = &plain
	return e
}
