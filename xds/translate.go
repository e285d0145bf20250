package xds

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// ErrInvalidResource marks a generated resource that failed validation; it is never published.
var ErrInvalidResource = errors.New("xds: invalid resource")

// connectTimeout is the Cluster connect timeout (Envoy uses it; grpc-go ignores it).
const connectTimeout = 5 * time.Second

// ListenerName is the name of the Listener (and RouteConfiguration) of a
// service port: exactly what follows xds:/// in a gRPC target.
func ListenerName(k registry.ServiceKey, port int32) string {
	return k.Hostname() + ":" + strconv.Itoa(int(port))
}

// ClusterName is the name of the Cluster of a service port, which is also its
// EDS service name and its ClusterLoadAssignment's cluster_name.
func ClusterName(k registry.ServiceKey, port int32) string {
	return "outbound|" + strconv.Itoa(int(port)) + "||" + k.Hostname()
}

// LocalClusterName is the name of the Cluster a route's Service backend
// sends requests to: the service port's endpoints in the client's own
// cluster only (GEP-1748), which each client's assignment holds.
func LocalClusterName(k registry.ServiceKey, port int32) string {
	return "outbound|" + strconv.Itoa(int(port)) + "|local|" + k.Hostname()
}

// ServicePorts returns the ports of svc that become xDS resources: TCP only,
// in the service's order (by number).
func ServicePorts(svc *registry.Service) []registry.ServicePort {
	if svc == nil {
		return nil
	}
	out := make([]registry.ServicePort, 0, len(svc.Ports))
	for _, p := range svc.Ports {
		if p.Protocol == registry.ProtocolTCP {
			out = append(out, p)
		}
	}
	return out
}

// Listener builds the API listener a proxyless gRPC client resolves for the
// service port: an HttpConnectionManager that fetches its routes by RDS over ADS.
func Listener(k registry.ServiceKey, port registry.ServicePort) *listener.Listener {
	name := ListenerName(k, port.Port)
	manager := &hcm.HttpConnectionManager{
		CodecType:  hcm.HttpConnectionManager_AUTO,
		StatPrefix: statPrefix(k, port.Port),
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: name,
		}},
		// grpc-go requires the router last, recognised by the type of its typed_config.
		HttpFilters: []*hcm.HttpFilter{{
			Name:       wellknown.Router,
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})},
		}},
	}
	return &listener.Listener{
		Name:        name,
		ApiListener: &listener.ApiListener{ApiListener: mustAny(manager)},
	}
}

// RouteConfiguration builds the routes of the service port: one virtual host
// for host:port (what grpc-go matches, the channel authority) and host,
// holding the routes attached to the port (see Routes), or, without
// any, one route sending everything to the port's Cluster. lookup (nil:
// none) finds the services the routes send requests to, whose policies
// may ask for a hash policy.
func RouteConfiguration(svc *registry.Service, port registry.ServicePort, lookup Lookup) *route.RouteConfiguration {
	name := ListenerName(svc.Key, port.Port)
	if lookup == nil {
		lookup = func(registry.ServiceKey) *registry.Service { return nil }
	}
	return &route.RouteConfiguration{
		Name: name,
		VirtualHosts: []*route.VirtualHost{{
			Name:    name,
			Domains: []string{name, svc.Key.Hostname()},
			Routes:  Routes(svc, port.Port, lookup),
		}},
	}
}

// Cluster builds the EDS Cluster of the service port, shaped by the
// service's policy p (nil: none); its endpoints come over ADS.
func Cluster(k registry.ServiceKey, port registry.ServicePort, p *traffic.Policy) *cluster.Cluster {
	return clusterNamed(ClusterName(k, port.Port), p)
}

// clusterNamed is the EDS Cluster name, shaped by policy p.
func clusterNamed(name string, p *traffic.Policy) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{
			EdsConfig:   adsSource(),
			ServiceName: name,
		},
		ConnectTimeout: durationpb.New(connectTimeout),
		LbPolicy:       cluster.Cluster_ROUND_ROBIN,
	}
	ApplyClusterPolicy(c, p)
	return c
}

// ClusterLoadAssignment turns an Assignment into its xDS form.
func ClusterLoadAssignment(a Assignment) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: a.ClusterName, Endpoints: []*endpoint.LocalityLbEndpoints{}}
	for _, p := range a.Priorities {
		for _, l := range p.Localities {
			cla.Endpoints = append(cla.Endpoints, localityLbEndpoints(l, p.Priority))
		}
	}
	return cla
}

// localityLbEndpoints is the xDS form of one locality's endpoints at priority.
func localityLbEndpoints(l LocalityEndpoints, priority uint32) *endpoint.LocalityLbEndpoints {
	lle := &endpoint.LocalityLbEndpoints{
		Locality:            &core.Locality{Region: l.Locality.Region, Zone: l.Locality.Zone, SubZone: l.Locality.Subzone},
		LoadBalancingWeight: wrapperspb.UInt32(l.Weight),
		Priority:            priority,
		LbEndpoints:         make([]*endpoint.LbEndpoint, 0, len(l.Endpoints)),
	}
	for _, e := range l.Endpoints {
		health := core.HealthStatus_HEALTHY
		if e.Health == StatusDraining {
			health = core.HealthStatus_DRAINING
		}
		lle.LbEndpoints = append(lle.LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: socketAddress(e.Address.String(), e.Port),
			}},
			HealthStatus:        health,
			LoadBalancingWeight: wrapperspb.UInt32(e.Weight),
		})
	}
	return lle
}

type named interface{ GetName() string }

// Validate checks a resource before it is published: the protoc-gen-validate
// rules of the Envoy API, plus what grpc-go requires of a ClusterLoadAssignment
// (priorities contiguous from 0, locality weights > 0). A client NACKs an
// invalid resource and go-control-plane would resend it forever, so nothing
// invalid may reach a cache.
func Validate(m proto.Message) error {
	v, ok := m.(interface{ ValidateAll() error })
	if !ok {
		return fmt.Errorf("%w: %T has no validation", ErrInvalidResource, m)
	}
	if err := v.ValidateAll(); err != nil {
		return fmt.Errorf("%w: %s %q: %v", ErrInvalidResource, typeName(m), resourceName(m), err)
	}
	if cla, ok := m.(*endpoint.ClusterLoadAssignment); ok {
		if err := validateAssignment(cla); err != nil {
			return fmt.Errorf("%w: ClusterLoadAssignment %q: %v", ErrInvalidResource, cla.GetClusterName(), err)
		}
	}
	if rc, ok := m.(*route.RouteConfiguration); ok {
		if n := proto.Size(rc); n > maxRouteConfigurationBytes {
			return fmt.Errorf("%w: RouteConfiguration %q is %d bytes, more than %d (a client takes at most 4 MiB in one response)",
				ErrInvalidResource, rc.GetName(), n, maxRouteConfigurationBytes)
		}
	}
	return nil
}

// maxRouteConfigurationBytes bounds a route configuration: a client receives
// every one it watches in one response, and grpc-go takes at most 4 MiB.
// Validation keeps a service's routes well below it (traffic.MaxRouteBytes).
const maxRouteConfigurationBytes = 512 << 10

func validateAssignment(cla *endpoint.ClusterLoadAssignment) error {
	seen := map[uint32]bool{}
	addrs := map[string]bool{}
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			key := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
			if addrs[key] {
				return fmt.Errorf("endpoint %s appears twice (grpc-go rejects the assignment)", key)
			}
			addrs[key] = true
		}
		if l.GetLoadBalancingWeight().GetValue() == 0 {
			return fmt.Errorf("locality %v has no load_balancing_weight (grpc-go would ignore it)", l.GetLocality())
		}
		if len(l.GetLbEndpoints()) == 0 {
			return fmt.Errorf("locality %v has no endpoints", l.GetLocality())
		}
		seen[l.GetPriority()] = true
	}
	for p := range uint32(len(seen)) {
		if !seen[p] {
			return fmt.Errorf("priorities are not contiguous from 0: priority %d missing", p)
		}
	}
	return nil
}

func resourceName(m proto.Message) string {
	if n, ok := m.(named); ok {
		return n.GetName()
	}
	if c, ok := m.(*endpoint.ClusterLoadAssignment); ok {
		return c.GetClusterName()
	}
	return ""
}

func typeName(m proto.Message) string { return string(m.ProtoReflect().Descriptor().Name()) }

func statPrefix(k registry.ServiceKey, port int32) string {
	return k.Namespace + "." + k.Name + "." + strconv.Itoa(int(port))
}

func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
		ResourceApiVersion:    core.ApiVersion_V3,
	}
}

func socketAddress(addr string, port int32) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Protocol:      core.SocketAddress_TCP,
		Address:       addr,
		PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(port)},
	}}}
}

// mustAny packs a message we built ourselves; it cannot fail for a registered type.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("xds: pack %T: %v", m, err))
	}
	return a
}
