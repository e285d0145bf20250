package registry

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

// t0 is the export time used by fixtures; older and newer exports are derived from it.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var (
	keyWeb = ServiceKey{Namespace: "shop", Name: "web"}
	keyAPI = ServiceKey{Namespace: "shop", Name: "api"}
	keyDB  = ServiceKey{Namespace: "data", Name: "db"}
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ips(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = ip(s)
	}
	return out
}

func tcp(name string, port int32) ServicePort {
	return ServicePort{Name: name, Port: port, Protocol: ProtocolTCP}
}

func udp(name string, port int32) ServicePort {
	return ServicePort{Name: name, Port: port, Protocol: ProtocolUDP}
}

func ready() Conditions    { return Conditions{Ready: true, Serving: true} }
func draining() Conditions { return Conditions{Serving: true, Terminating: true} }
func notReady() Conditions { return Conditions{} }

// endpoint builds a ready endpoint with one address and the given name=port pairs.
func endpoint(addr string, ports ...EndpointPort) Endpoint {
	return Endpoint{Addresses: ips(addr), Ports: ports, Conditions: ready()}
}

func eport(name string, port int32) EndpointPort { return EndpointPort{Name: name, Port: port} }

// shard builds a normalized shard of cluster for key exporting ports, with endpoints.
func shard(cluster ClusterID, key ServiceKey, ports []ServicePort, eps ...Endpoint) *Shard {
	s := &Shard{Cluster: cluster, Service: key, ExportedAt: t0, Ports: ports, Endpoints: eps}
	s.Normalize()
	return s
}

// cloneShard deep-copies s, so tests can change the copy and re-apply an equal but distinct value.
func cloneShard(s *Shard) *Shard {
	c := *s
	c.Ports = slices.Clone(s.Ports)
	c.Endpoints = slices.Clone(s.Endpoints)
	for i := range c.Endpoints {
		c.Endpoints[i].Addresses = slices.Clone(c.Endpoints[i].Addresses)
		c.Endpoints[i].Ports = slices.Clone(c.Endpoints[i].Ports)
	}
	return &c
}

// mustApply applies c and fails the test unless the diff is non-empty.
func mustApply(t *testing.T, r *Registry, c Change) (*Registry, Diff) {
	t.Helper()
	next, d := r.Apply(c)
	if d.Empty() {
		t.Fatalf("Apply(%+v) changed nothing", c)
	}
	return next, d
}

func upsert(cluster ClusterID, shards ...*Shard) Change {
	return Change{Cluster: cluster, Upserts: shards}
}
