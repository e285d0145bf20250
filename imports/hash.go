package imports

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"hash/maphash"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/navemesh/nave/registry"
)

// Equal reports whether two imports say the same thing (nil and empty lists
// and maps alike).
func (a *Import) Equal(b *Import) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Service == b.Service && a.Headless == b.Headless && slices.Equal(a.Ports, b.Ports) &&
		slices.Equal(a.IPs, b.IPs) && a.Properties.Equal(&b.Properties) &&
		slices.EqualFunc(a.Sources, b.Sources, func(x, y Source) bool { return x.Equal(&y) })
}

// Equal reports whether two sources say the same thing.
func (s *Source) Equal(o *Source) bool {
	return s.Cluster == o.Cluster && s.Stale == o.Stale && slices.Equal(s.Ports, o.Ports) &&
		slices.EqualFunc(s.Endpoints, o.Endpoints, func(x, y Endpoint) bool { return x.Equal(&y) })
}

// Hash is a digest of the import's content: equal imports (as Equal says)
// hash alike, in every process and every release that keeps the encoding
// (it is SHA-256 over a canonical, versioned binary encoding, truncated to
// 128 bits). The hub and a spoke compare it to tell whether a cluster's
// copy changed. The hash of nil is registry.ZeroHash.
func (a *Import) Hash() registry.Hash {
	if a == nil {
		return registry.ZeroHash
	}
	e := encoder{h: sha256.New(), buf: make([]byte, 0, 4096)}
	e.str("nave.imports.Import/v1")
	e.str(a.Service.Namespace)
	e.str(a.Service.Name)
	e.bool(a.Headless)
	e.servicePorts(a.Ports)
	e.uint(uint64(len(a.IPs)))
	for _, ip := range a.IPs {
		e.addr(ip)
	}
	p := &a.Properties
	e.str(p.SessionAffinity)
	e.uint(uint64(uint32(p.SessionAffinityTimeout)))
	e.str(p.InternalTrafficPolicy)
	e.str(p.TrafficDistribution)
	e.uint(uint64(len(p.IPFamilies)))
	for _, f := range p.IPFamilies {
		e.str(string(f))
	}
	e.stringMap(p.Labels)
	e.stringMap(p.Annotations)
	e.uint(uint64(len(a.Sources)))
	for i := range a.Sources {
		s := &a.Sources[i]
		e.str(string(s.Cluster))
		e.bool(s.Stale)
		e.servicePorts(s.Ports)
		e.uint(uint64(len(s.Endpoints)))
		for j := range s.Endpoints {
			e.endpoint(&s.Endpoints[j])
		}
	}
	return e.sum()
}

// Sum is a 64-bit digest of all an endpoint says, encoded as Hash encodes
// it: equal endpoints (as Equal says) have equal sums in one process, and
// unequal ones, all but surely, different sums. It stands for an endpoint
// one keeps no copy of.
func (e *Endpoint) Sum() uint64 {
	s := endpointSums.Get().(*endpointSum)
	defer endpointSums.Put(s)
	s.h.Reset() // the seed stays
	s.enc.buf = s.enc.buf[:0]
	s.enc.endpoint(e)
	s.h.Write(s.enc.buf)
	return s.h.Sum64()
}

// endpointSum is what Sum writes with, pooled: a hash and its encoder's buffer.
type endpointSum struct {
	h   maphash.Hash
	enc encoder
}

// endpointSums share one seed: sums are compared within one process.
var endpointSums = sync.Pool{New: func() any {
	s := &endpointSum{}
	s.h.SetSeed(sumSeed)
	s.enc = encoder{h: &s.h, buf: make([]byte, 0, 256)}
	return s
}}

var sumSeed = maphash.MakeSeed()

// encoder writes a length-prefixed binary encoding into a hash, buffered.
type encoder struct {
	h   hash.Hash
	buf []byte
}

func (e *encoder) flush() {
	if len(e.buf) >= 3072 {
		e.h.Write(e.buf)
		e.buf = e.buf[:0]
	}
}

func (e *encoder) uint(v uint64) {
	e.buf = binary.AppendUvarint(e.buf, v)
	e.flush()
}

func (e *encoder) bool(b bool) {
	e.uint(uint64(boolInt(b)))
}

func (e *encoder) str(s string) {
	e.buf = binary.AppendUvarint(e.buf, uint64(len(s)))
	e.buf = append(e.buf, s...)
	e.flush()
}

// addr writes the family (0 for the zero Addr), the bytes and the zone.
func (e *encoder) addr(a netip.Addr) {
	switch {
	case !a.IsValid():
		e.buf = append(e.buf, 0)
	case a.Is4():
		b := a.As4()
		e.buf = append(append(e.buf, 4), b[:]...)
	default:
		b := a.As16()
		e.buf = append(append(e.buf, 6), b[:]...)
	}
	e.str(a.Zone())
}

func (e *encoder) endpoint(ep *Endpoint) {
	e.uint(uint64(len(ep.Addresses)))
	for _, ip := range ep.Addresses {
		e.addr(ip)
	}
	e.uint(uint64(len(ep.Ports)))
	for _, pt := range ep.Ports {
		e.str(pt.Name)
		e.uint(uint64(uint32(pt.Port)))
	}
	e.str(ep.Hostname)
	e.str(ep.Zone)
	e.bool(ep.Conditions.Ready)
	e.bool(ep.Conditions.Serving)
	e.bool(ep.Conditions.Terminating)
}

func (e *encoder) servicePorts(ps []registry.ServicePort) {
	e.uint(uint64(len(ps)))
	for _, p := range ps {
		e.str(p.Name)
		e.uint(uint64(uint32(p.Port)))
		e.str(string(p.Protocol))
		e.str(p.AppProtocol)
	}
}

func (e *encoder) stringMap(m map[string]string) {
	e.uint(uint64(len(m)))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		e.str(k)
		e.str(m[k])
	}
}

func (e *encoder) sum() registry.Hash {
	e.h.Write(e.buf)
	var sum [sha256.Size]byte
	var h registry.Hash
	copy(h[:], e.h.Sum(sum[:0]))
	return h
}
