package registry

import (
	"net/netip"
	"unsafe"
)

// Sizes of what a shard holds, for HeldBytes.
const (
	shardSize        = int(unsafe.Sizeof(Shard{}))
	servicePortSize  = int(unsafe.Sizeof(ServicePort{}))
	endpointSize     = int(unsafe.Sizeof(Endpoint{}))
	endpointPortSize = int(unsafe.Sizeof(EndpointPort{}))
	addrSize         = int(unsafe.Sizeof(netip.Addr{}))
	mapEntryOverhead = 48 // a small map's share per entry, beyond its strings
)

// HeldBytes estimates the memory s holds once decoded: its structs, slices
// and strings (each counted as its own allocation, as a decoder makes them).
// What a peer sends is bounded by this, not by its wire size: decoded, a
// shard holds 10 to 16 times the bytes it took on the wire.
func (s *Shard) HeldBytes() int {
	n := shardSize + s.Traffic.HeldBytes() + len(s.Cluster) + len(s.Service.Namespace) + len(s.Service.Name) +
		len(s.SessionAffinity) + len(s.InternalTrafficPolicy) + len(s.TrafficDistribution) + 8*len(s.IPFamilies)
	for k, v := range s.Labels {
		n += mapEntryOverhead + len(k) + len(v)
	}
	for k, v := range s.Annotations {
		n += mapEntryOverhead + len(k) + len(v)
	}
	for _, p := range s.Ports {
		n += servicePortSize + len(p.Name) + len(p.AppProtocol) + len(p.Protocol)
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		n += endpointSize + addrSize*len(e.Addresses) + endpointPortSize*len(e.Ports) +
			len(e.Locality.Region) + len(e.Locality.Zone) + len(e.Locality.Subzone) + len(e.NodeName) + len(e.Hostname)
		for _, p := range e.Ports {
			n += len(p.Name)
		}
	}
	return n
}
