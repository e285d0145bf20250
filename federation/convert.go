// Package federation is the spoke<->hub protocol and its two ends: the
// spoke's publisher and the hub's sessions (shards up, imports down),
// validation of what arrives, and credentials.
package federation

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// ShardToProto encodes a shard for the wire (the cluster is implied by the session).
func ShardToProto(s *registry.Shard) *fedv1.Shard {
	out := &fedv1.Shard{
		Service:        KeyToProto(s.Service),
		ExportedAtUnix: s.ExportedAt.Unix(),
		Headless:       s.Headless,
		Ports:          make([]*fedv1.ServicePort, len(s.Ports)),
		Endpoints:      make([]*fedv1.Endpoint, len(s.Endpoints)),
	}
	if s.ExportedAt.IsZero() {
		out.ExportedAtUnix = 0
	}
	out.Properties = propertiesToProto(&s.Properties)
	out.Traffic = trafficToProto(&s.Traffic)
	for i, p := range s.Ports {
		out.Ports[i] = &fedv1.ServicePort{Name: p.Name, Port: p.Port, Protocol: string(p.Protocol), AppProtocol: p.AppProtocol}
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		pe := &fedv1.Endpoint{
			Addresses:   make([]string, len(e.Addresses)),
			Ports:       make([]*fedv1.EndpointPort, len(e.Ports)),
			NodeName:    e.NodeName,
			Hostname:    e.Hostname,
			Ready:       e.Conditions.Ready,
			Serving:     e.Conditions.Serving,
			Terminating: e.Conditions.Terminating,
		}
		if !e.Locality.IsZero() {
			pe.Locality = &fedv1.Locality{Region: e.Locality.Region, Zone: e.Locality.Zone, Subzone: e.Locality.Subzone}
		}
		for j, a := range e.Addresses {
			pe.Addresses[j] = a.String()
		}
		for j, p := range e.Ports {
			pe.Ports[j] = &fedv1.EndpointPort{Name: p.Name, Port: p.Port}
		}
		out.Endpoints[i] = pe
	}
	return out
}

// ShardFromProto decodes, normalizes and validates a shard received from
// cluster. The error is a *registry.ValidationError naming the service.
func ShardFromProto(cluster registry.ClusterID, in *fedv1.Shard, lim registry.Limits) (*registry.Shard, error) {
	s, err := ShardFromProtoUnvalidated(cluster, in, lim)
	if err != nil {
		return nil, err
	}
	if err := s.Validate(lim); err != nil {
		return nil, err
	}
	return s, nil
}

// ShardFromProtoUnvalidated is ShardFromProto but for the shard's validation: it checks
// sizes before allocating and parses addresses, for callers that validate
// the shard later themselves.
func ShardFromProtoUnvalidated(cluster registry.ClusterID, in *fedv1.Shard, lim registry.Limits) (*registry.Shard, error) {
	key := KeyFromProto(in.GetService())
	bad := func(format string, args ...any) error {
		return &registry.ValidationError{Service: key, Reason: fmt.Sprintf(format, args...)}
	}
	// Check sizes before allocating anything in proportion to them.
	if len(in.GetPorts()) > lim.MaxPorts {
		return nil, bad("%d ports, more than the limit of %d", len(in.GetPorts()), lim.MaxPorts)
	}
	if len(in.GetEndpoints()) > lim.MaxEndpoints {
		return nil, bad("%d endpoints, more than the limit of %d", len(in.GetEndpoints()), lim.MaxEndpoints)
	}
	s := &registry.Shard{
		Cluster:   cluster,
		Service:   key,
		Headless:  in.GetHeadless(),
		Ports:     make([]registry.ServicePort, len(in.GetPorts())),
		Endpoints: make([]registry.Endpoint, len(in.GetEndpoints())),
	}
	if t := in.GetExportedAtUnix(); t != 0 {
		s.ExportedAt = time.Unix(t, 0).UTC()
	}
	if n := len(in.GetProperties().GetLabels()) + len(in.GetProperties().GetAnnotations()); n > maxExportedMetadata {
		return nil, bad("%d exported labels and annotations, more than the limit of %d", n, maxExportedMetadata)
	}
	s.Properties = propertiesFromProto(in.GetProperties())
	var problem string
	if s.Traffic, problem = trafficFromProto(in.GetTraffic()); problem != "" {
		return nil, bad("%s", problem)
	}
	for i, p := range in.GetPorts() {
		s.Ports[i] = registry.ServicePort{Name: p.GetName(), Port: p.GetPort(), Protocol: registry.Protocol(p.GetProtocol()), AppProtocol: p.GetAppProtocol()}
	}
	var ports []registry.EndpointPort // the last endpoint's, which the next shares when equal
	for i, pe := range in.GetEndpoints() {
		if len(pe.GetAddresses()) > lim.MaxAddressesPerEndpoint {
			return nil, bad("endpoint %d has %d addresses, more than the limit of %d", i, len(pe.GetAddresses()), lim.MaxAddressesPerEndpoint)
		}
		e := registry.Endpoint{
			Addresses: make([]netip.Addr, len(pe.GetAddresses())),
			Locality:  registry.Locality{Region: pe.GetLocality().GetRegion(), Zone: pe.GetLocality().GetZone(), Subzone: pe.GetLocality().GetSubzone()},
			NodeName:  pe.GetNodeName(),
			Hostname:  pe.GetHostname(),
			Conditions: registry.Conditions{
				Ready: pe.GetReady(), Serving: pe.GetServing(), Terminating: pe.GetTerminating(),
			},
		}
		for j, a := range pe.GetAddresses() {
			addr, err := netip.ParseAddr(a)
			if err != nil {
				return nil, bad("endpoint %d: address %q is not an IP", i, a)
			}
			e.Addresses[j] = addr
		}
		if len(pe.GetPorts()) > lim.MaxPorts {
			return nil, bad("endpoint %d has %d ports, more than the limit of %d", i, len(pe.GetPorts()), lim.MaxPorts)
		}
		if !samePorts(ports, pe.GetPorts()) {
			ports = make([]registry.EndpointPort, len(pe.GetPorts()))
			for j, p := range pe.GetPorts() {
				ports[j] = registry.EndpointPort{Name: p.GetName(), Port: p.GetPort()}
			}
		}
		e.Ports = ports
		s.Endpoints[i] = e
	}
	s.Normalize()
	return s, nil
}

// samePorts reports whether decoding in would give ports (nil: no list
// yet). The endpoints of one EndpointSlice list the same ports, and a shard
// lists them one after another: they share one list. Normalize sorts it in
// place, once, which leaves it right for each of them; nothing else writes
// into an endpoint's ports (see registry.Endpoint).
func samePorts(ports []registry.EndpointPort, in []*fedv1.EndpointPort) bool {
	return ports != nil && slices.EqualFunc(ports, in, func(p registry.EndpointPort, q *fedv1.EndpointPort) bool {
		return p.Name == q.GetName() && p.Port == q.GetPort()
	})
}

// maxExportedMetadata bounds a shard's exported labels and annotations
// together, before they are copied (the registry bounds their bytes).
const maxExportedMetadata = 1024

// propertiesToProto encodes properties; the defaults encode as nothing.
func propertiesToProto(p *registry.Properties) *fedv1.ServiceProperties {
	if p.Equal(&registry.Properties{}) {
		return nil
	}
	out := &fedv1.ServiceProperties{
		SessionAffinity: p.SessionAffinity, SessionAffinityTimeoutSeconds: p.SessionAffinityTimeout,
		InternalTrafficPolicy: p.InternalTrafficPolicy, TrafficDistribution: p.TrafficDistribution,
		Labels: p.Labels, Annotations: p.Annotations,
	}
	for _, f := range p.IPFamilies {
		out.IpFamilies = append(out.IpFamilies, string(f))
	}
	return out
}

// propertiesFromProto decodes properties (unvalidated); empty maps and
// lists become nil, as the registry's hash and equality treat them alike.
func propertiesFromProto(in *fedv1.ServiceProperties) (p registry.Properties) {
	p.SessionAffinity = in.GetSessionAffinity()
	p.SessionAffinityTimeout = in.GetSessionAffinityTimeoutSeconds()
	p.InternalTrafficPolicy = in.GetInternalTrafficPolicy()
	p.TrafficDistribution = in.GetTrafficDistribution()
	for _, f := range in.GetIpFamilies() {
		p.IPFamilies = append(p.IPFamilies, registry.IPFamily(f))
	}
	if len(in.GetLabels()) > 0 {
		p.Labels = in.GetLabels()
	}
	if len(in.GetAnnotations()) > 0 {
		p.Annotations = in.GetAnnotations()
	}
	return p
}

// KeyToProto encodes a service key.
func KeyToProto(k registry.ServiceKey) *fedv1.ServiceKey {
	return &fedv1.ServiceKey{Namespace: k.Namespace, Name: k.Name}
}

// KeyFromProto decodes a service key (unvalidated).
func KeyFromProto(k *fedv1.ServiceKey) registry.ServiceKey {
	return registry.ServiceKey{Namespace: k.GetNamespace(), Name: k.GetName()}
}
