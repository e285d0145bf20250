// Package registry is Nave's pure model: clusters, services, endpoints,
// localities, per-cluster shards and the merged view of all of them.
//
// Everything here is data in, immutable value out: no I/O, no goroutines.
// Values handed to a Registry must not be changed afterwards.
package registry

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/navemesh/nave/traffic"
)

// ClusterID names a member cluster (a DNS label, e.g. "east").
type ClusterID string

// Network names an L3 network; endpoints on the same network reach each other directly.
type Network string

// Locality is where an endpoint (or a client) runs.
type Locality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	Subzone string `json:"subzone,omitempty"`
}

// String renders the locality as region/zone[/subzone].
func (l Locality) String() string {
	s := l.Region + "/" + l.Zone
	if l.Subzone != "" {
		s += "/" + l.Subzone
	}
	return s
}

// IsZero reports whether nothing is known about the locality.
func (l Locality) IsZero() bool { return l == Locality{} }

// Compare orders localities by region, zone, subzone.
func (l Locality) Compare(o Locality) int {
	return cmp.Or(cmp.Compare(l.Region, o.Region), cmp.Compare(l.Zone, o.Zone), cmp.Compare(l.Subzone, o.Subzone))
}

// ServiceKey identifies a service across all clusters: namespace/name.
type ServiceKey struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// String renders the key as namespace/name.
func (k ServiceKey) String() string { return k.Namespace + "/" + k.Name }

// Hostname is the service's clusterset name (the Kubernetes MCS convention).
func (k ServiceKey) Hostname() string { return k.Name + "." + k.Namespace + ".svc.clusterset.local" }

// Compare orders keys by namespace, then name.
func (k ServiceKey) Compare(o ServiceKey) int {
	return cmp.Or(cmp.Compare(k.Namespace, o.Namespace), cmp.Compare(k.Name, o.Name))
}

// ParseServiceKey parses "namespace/name".
func ParseServiceKey(s string) (ServiceKey, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return ServiceKey{}, fmt.Errorf("%w: service %s is not namespace/name", ErrInvalid, quoted(s))
	}
	return ServiceKey{Namespace: ns, Name: name}, nil
}

// Protocol is a transport protocol as Kubernetes names it.
type Protocol string

// The protocols Kubernetes services use.
const (
	ProtocolTCP  Protocol = "TCP"
	ProtocolUDP  Protocol = "UDP"
	ProtocolSCTP Protocol = "SCTP"
)

// ServicePort is one port a service exposes.
type ServicePort struct {
	Name        string   `json:"name,omitempty"`
	Port        int32    `json:"port"`
	Protocol    Protocol `json:"protocol"`
	AppProtocol string   `json:"appProtocol,omitempty"`
}

// EndpointPort is the port an endpoint serves for the service port of the same name.
type EndpointPort struct {
	Name string `json:"name,omitempty"`
	Port int32  `json:"port"`
}

// Conditions are an endpoint's EndpointSlice conditions.
type Conditions struct {
	Ready       bool `json:"ready"`
	Serving     bool `json:"serving"`
	Terminating bool `json:"terminating"`
}

// Health is what a client should make of an endpoint.
type Health int

// Health values, from best to worst.
const (
	Healthy  Health = iota // ready: receives traffic
	Draining               // terminating but still serving: finish, take nothing new
	Excluded               // neither: never handed to clients
)

// Endpoint is one backend of a service in one cluster. The endpoints of a
// shard may share one Ports list (those of one EndpointSlice do): never
// write into an endpoint's Ports, replace the list.
type Endpoint struct {
	Addresses  []netip.Addr   `json:"addresses,omitempty"`
	Ports      []EndpointPort `json:"ports,omitempty"`
	Locality   Locality       `json:"locality"`
	NodeName   string         `json:"nodeName,omitempty"`
	Hostname   string         `json:"hostname,omitempty"`
	Conditions Conditions     `json:"conditions"`
}

// Health derives the endpoint's health from its conditions.
func (e *Endpoint) Health() Health {
	switch {
	case e.Conditions.Ready:
		return Healthy
	case e.Conditions.Serving && e.Conditions.Terminating:
		return Draining
	default:
		return Excluded
	}
}

// PortNumber returns the endpoint's port named name.
func (e *Endpoint) PortNumber(name string) (int32, bool) {
	for _, p := range e.Ports {
		if p.Name == name {
			return p.Port, true
		}
	}
	return 0, false
}

// Shard is one cluster's view of one service.
type Shard struct {
	Cluster ClusterID  `json:"cluster"`
	Service ServiceKey `json:"service"`
	// ExportedAt is when the cluster started exporting the service; the oldest export wins a conflict.
	ExportedAt time.Time     `json:"exportedAt"`
	Headless   bool          `json:"headless,omitempty"`
	Ports      []ServicePort `json:"ports,omitempty"`
	Endpoints  []Endpoint    `json:"endpoints,omitempty"`
	// Properties are the rest of what an import mirrors of the Service and its export.
	Properties
	// Traffic is the routes attached to the service and the policy
	// targeting it, as the cluster exports them.
	Traffic traffic.Set `json:"traffic,omitzero"`
}

// Normalize sorts a shard's ports, endpoints and addresses so that equal
// shards compare, hash and encode equally. It changes s in place.
func (s *Shard) Normalize() {
	s.ExportedAt = s.ExportedAt.UTC().Truncate(time.Second)
	if s.ExportedAt.Unix() == 0 {
		// The Unix epoch is "unset" on the wire: say so here too, or the
		// hub would hold another shard (and hash) than the spoke.
		s.ExportedAt = time.Time{}
	}
	slices.SortFunc(s.Ports, func(a, b ServicePort) int {
		return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Name, b.Name))
	})
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		slices.SortFunc(e.Addresses, netip.Addr.Compare)
		// Endpoints may share one port list (those of one EndpointSlice do):
		// a sorted list is left unwritten.
		if !slices.IsSortedFunc(e.Ports, compareEndpointPorts) {
			slices.SortFunc(e.Ports, compareEndpointPorts)
		}
	}
	slices.SortFunc(s.Endpoints, compareEndpoints)
	s.Traffic.Normalize()
}

func compareEndpointPorts(a, b EndpointPort) int {
	return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port))
}

func compareEndpoints(a, b Endpoint) int {
	if c := slices.CompareFunc(a.Addresses, b.Addresses, netip.Addr.Compare); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(a.Hostname, b.Hostname), cmp.Compare(a.NodeName, b.NodeName))
}

// Equal reports whether two normalized shards say the same thing.
func (s *Shard) Equal(o *Shard) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.Cluster == o.Cluster && s.Service == o.Service && s.ExportedAt.Equal(o.ExportedAt) &&
		s.Headless == o.Headless && slices.Equal(s.Ports, o.Ports) &&
		slices.EqualFunc(s.Endpoints, o.Endpoints, endpointEqual) && s.Properties.Equal(&o.Properties) &&
		s.Traffic.Equal(&o.Traffic)
}

// SamePorts reports whether two shards declare the same service shape
// (ports, headless, export time, properties): everything but endpoints and
// traffic, which decide no endpoint assignment.
func (s *Shard) SamePorts(o *Shard) bool {
	return s.Headless == o.Headless && s.ExportedAt.Equal(o.ExportedAt) && slices.Equal(s.Ports, o.Ports) &&
		s.Properties.Equal(&o.Properties)
}

func endpointEqual(a, b Endpoint) bool {
	return slices.Equal(a.Addresses, b.Addresses) && slices.Equal(a.Ports, b.Ports) && a.Locality == b.Locality &&
		a.NodeName == b.NodeName && a.Hostname == b.Hostname && a.Conditions == b.Conditions
}

// Port returns the shard's service port with the given number and protocol.
func (s *Shard) Port(number int32, protocol Protocol) (ServicePort, bool) {
	for _, p := range s.Ports {
		if p.Port == number && p.Protocol == protocol {
			return p, true
		}
	}
	return ServicePort{}, false
}

// EndpointCount counts endpoints by health.
func (s *Shard) EndpointCount() (healthy, draining, excluded int) {
	for i := range s.Endpoints {
		switch s.Endpoints[i].Health() {
		case Healthy:
			healthy++
		case Draining:
			draining++
		default:
			excluded++
		}
	}
	return
}
