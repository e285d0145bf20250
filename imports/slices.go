package imports

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/navemesh/nave/registry"
)

// MaxEndpointsPerSlice bounds an imported EndpointSlice, as the Kubernetes
// EndpointSlice controller's default does (the API allows 1,000; smaller
// slices make an endpoint change a smaller write for every watcher).
const MaxEndpointsPerSlice = 100

// Slice is one imported EndpointSlice: endpoints of one source cluster and
// one IP family that share one port list. The writer adds what every
// imported slice carries: the labels multicluster.kubernetes.io/service-name
// and multicluster.kubernetes.io/source-cluster, kubernetes.io/service-name
// set to DerivedServiceName (so kube-proxy programs the derived Service), and
// its own endpointslice.kubernetes.io/managed-by (never the EndpointSlice
// controller's, which would delete the slice).
type Slice struct {
	// Name is the object name (see the naming scheme in names.go); a slice
	// keeps it for as long as it exists.
	Name    string
	Cluster registry.ClusterID
	Family  registry.IPFamily
	// Ports are sorted by name.
	Ports []SlicePort
	// Endpoints are sorted by first address; at most MaxEndpointsPerSlice.
	Endpoints []Endpoint
}

// SlicePort is an EndpointSlice port: the name, protocol and appProtocol of
// the import's port and the endpoints' target port number.
type SlicePort struct {
	Name        string
	Port        int32
	Protocol    registry.Protocol
	AppProtocol string
}

// Equal reports whether two slices say the same thing, in the same order.
func (s *Slice) Equal(o *Slice) bool {
	return s.Name == o.Name && s.Cluster == o.Cluster && s.Family == o.Family && slices.Equal(s.Ports, o.Ports) &&
		slices.EqualFunc(s.Endpoints, o.Endpoints, func(a, b Endpoint) bool { return a.Equal(&b) })
}

func compareSlicePorts(a, b SlicePort) int {
	return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.AppProtocol, b.AppProtocol))
}

// Slices packs an import's endpoints into EndpointSlices, given the slices
// the importing cluster holds now (prev, e.g. read back from the API
// server; nil for none). The result, sorted by cluster, family and name, is
// what the cluster must hold: create the slices whose names are new,
// update those that differ from prev, delete the prev slices not in it.
//
// An EndpointSlice has one port list for all its endpoints, and an
// endpoint's target ports are part of it: the same port name may map to
// 8080 on some pods and 9090 on others (a rolling update that changes the
// container port, or pods of two versions). So the endpoints of a source
// cluster are first grouped by family and by port signature (the slice
// ports their target ports give), and every slice holds one group's
// endpoints only, as the Kubernetes EndpointSlice controller does.
//
// Packing is sticky, to keep writes few:
//   - an endpoint still wanted stays in the prev slice it is in (updated in
//     place if its conditions or hostname changed); one that is gone leaves
//     its slice;
//   - new endpoints (and those whose port signature changed) first fill
//     prev slices of their group that change anyway, then those with the
//     most room, and only then go to new slices of up to
//     MaxEndpointsPerSlice;
//   - a slice left empty is dropped, and its name is free for a new slice,
//     which the writer then sees as an update rather than a delete and a
//     create. A source with no endpoints has no slices: the ServiceImport
//     lists the exporting clusters, and no consumer needs an empty slice
//     (the EndpointSlice controller's placeholder slice only tells "no
//     endpoints" from "not yet synced" for a local Service).
//
// So a change of one endpoint changes exactly one slice (two when its port
// signature changes: it must move), a new endpoint fills a slice with room
// before a slice is made, and Slices(imp, Slices(imp, prev)) equals
// Slices(imp, prev). The result does not depend on the order of prev or of
// anything in imp. Names of prev slices must be unique, as object names in
// one namespace are.
func Slices(imp *Import, prev []Slice) []Slice {
	held := make([]Prev, len(prev))
	for i := range prev {
		held[i] = prev[i].Prev()
	}
	return SlicesFrom(imp, held)
}

// Prev is what Slices needs to know of a slice the cluster holds: a writer
// that keeps this of its slices, rather than the slices, packs alike
// (SlicesFrom).
type Prev struct {
	Name    string
	Cluster registry.ClusterID
	Family  registry.IPFamily
	Ports   []SlicePort
	// Endpoints are the endpoints the slice holds, in its order.
	Endpoints []Held
}

// Held is an endpoint a slice holds, as Slices needs to know it: its first
// address (which identifies it), and the Sum of all it says.
type Held struct {
	First netip.Addr // the zero Addr for an endpoint with no address
	Sum   uint64
}

// Prev returns what Slices needs to know of s.
func (s *Slice) Prev() Prev {
	p := Prev{Name: s.Name, Cluster: s.Cluster, Family: s.Family, Ports: s.Ports, Endpoints: make([]Held, len(s.Endpoints))}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if len(e.Addresses) > 0 {
			p.Endpoints[i].First = e.Addresses[0]
		}
		p.Endpoints[i].Sum = e.Sum()
	}
	return p
}

// SlicesFrom is Slices given what it needs to know of the prev slices.
func SlicesFrom(imp *Import, prev []Prev) []Slice {
	if imp == nil {
		return nil
	}
	prevs := make([]*Prev, len(prev))
	for i := range prev {
		prevs[i] = &prev[i]
	}
	slices.SortFunc(prevs, func(a, b *Prev) int {
		return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Family, b.Family), cmp.Compare(a.Name, b.Name))
	})

	sources := make([]*Source, len(imp.Sources))
	for i := range imp.Sources {
		sources[i] = &imp.Sources[i]
	}
	slices.SortStableFunc(sources, func(a, b *Source) int { return cmp.Compare(a.Cluster, b.Cluster) })

	// Phase 1: per source and family, keep what prev slices may keep.
	var buckets []*bucket
	used := map[string]bool{}
	var p packer
	for _, src := range sources {
		for _, fam := range []registry.IPFamily{registry.IPv4, registry.IPv6} {
			b := p.bucket(imp.Service, src, fam)
			if b == nil {
				continue
			}
			lo, _ := slices.BinarySearchFunc(prevs, b, func(s *Prev, b *bucket) int {
				return cmp.Or(cmp.Compare(s.Cluster, b.cluster), cmp.Compare(s.Family, b.family))
			})
			for i := lo; i < len(prevs) && prevs[i].Cluster == b.cluster && prevs[i].Family == b.family; i++ {
				if used[prevs[i].Name] {
					continue // a name twice: the first keeps it
				}
				if w := b.keep(prevs[i]); w != nil {
					used[w.slice.Name] = true
				}
			}
			buckets = append(buckets, b)
		}
	}
	// Phase 2: place the rest, then collect.
	var out []Slice
	for _, b := range buckets {
		b.fill(used)
		for _, w := range b.works {
			slices.SortFunc(w.slice.Endpoints, compareFirstAddress)
			out = append(out, w.slice)
		}
	}
	slices.SortFunc(out, func(a, b Slice) int {
		return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Family, b.Family), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func compareFirstAddress(a, b Endpoint) int { return a.Addresses[0].Compare(b.Addresses[0]) }

// group is a port signature: the slice ports its endpoints share.
type group struct {
	ports []SlicePort
	key   string
}

// member is one wanted endpoint and where it has gone.
type member struct {
	ep       *Endpoint
	g        *group
	assigned bool
}

// work is one slice being packed.
type work struct {
	slice   Slice
	g       *group
	changed bool // differs from its prev version (or is new)
}

// bucket packs the endpoints of one source cluster and one family.
type bucket struct {
	key     registry.ServiceKey
	cluster registry.ClusterID
	family  registry.IPFamily
	members []member // sorted by first address
	groups  map[string]*group
	works   []*work
}

// packer holds scratch space reused across buckets.
type packer struct {
	ports []SlicePort
	key   []byte
	// The last endpoint's ports and group: neighbours mostly share them.
	lastPorts []registry.EndpointPort
	lastGroup *group
}

// bucket returns the bucket of src's endpoints of family, or nil when there are none.
func (p *packer) bucket(key registry.ServiceKey, src *Source, family registry.IPFamily) *bucket {
	b := &bucket{key: key, cluster: src.Cluster, family: family, groups: map[string]*group{}}
	b.members = make([]member, 0, len(src.Endpoints))
	p.lastGroup = nil // groups are per bucket
	for i := range src.Endpoints {
		e := &src.Endpoints[i]
		if len(e.Addresses) == 0 || e.Family() != family {
			continue
		}
		b.members = append(b.members, member{ep: e, g: p.group(b, src, e)})
	}
	if len(b.members) == 0 {
		return nil
	}
	if !slices.IsSortedFunc(b.members, compareMembers) {
		slices.SortFunc(b.members, compareMembers)
	}
	// A first address twice (not from Build): the first keeps it.
	b.members = slices.CompactFunc(b.members, func(x, y member) bool { return compareMembers(x, y) == 0 })
	return b
}

func compareMembers(x, y member) int { return x.ep.Addresses[0].Compare(y.ep.Addresses[0]) }

// group returns e's port signature: for each of the source's ports that e
// has a target port for, that port with e's target port number.
func (p *packer) group(b *bucket, src *Source, e *Endpoint) *group {
	if p.lastGroup != nil && slices.Equal(e.Ports, p.lastPorts) {
		return p.lastGroup
	}
	ports := p.ports[:0]
	for _, sp := range src.Ports {
		for _, ep := range e.Ports {
			if ep.Name == sp.Name {
				ports = append(ports, SlicePort{Name: sp.Name, Port: ep.Port, Protocol: sp.Protocol, AppProtocol: sp.AppProtocol})
				break
			}
		}
	}
	slices.SortFunc(ports, compareSlicePorts)
	p.ports = ports
	p.key = portsKey(p.key[:0], ports)
	g, ok := b.groups[string(p.key)]
	if !ok {
		g = &group{ports: slices.Clone(ports), key: string(p.key)}
		b.groups[g.key] = g
	}
	p.lastPorts, p.lastGroup = e.Ports, g
	return g
}

// portsKey appends an unambiguous encoding of sorted slice ports to buf.
func portsKey(buf []byte, ports []SlicePort) []byte {
	for _, sp := range ports {
		buf = binary.AppendUvarint(buf, uint64(len(sp.Name)))
		buf = append(buf, sp.Name...)
		buf = binary.AppendUvarint(buf, uint64(uint32(sp.Port)))
		buf = binary.AppendUvarint(buf, uint64(len(sp.Protocol)))
		buf = append(buf, sp.Protocol...)
		buf = binary.AppendUvarint(buf, uint64(len(sp.AppProtocol)))
		buf = append(buf, sp.AppProtocol...)
	}
	return buf
}

func (b *bucket) member(addr netip.Addr) *member {
	i, ok := slices.BinarySearchFunc(b.members, addr, func(m member, a netip.Addr) int { return m.ep.Addresses[0].Compare(a) })
	if !ok {
		return nil
	}
	return &b.members[i]
}

// keep starts a work from a prev slice with the wanted endpoints it holds,
// as they are wanted now; it returns nil when none is left.
func (b *bucket) keep(s *Prev) *work {
	ports := s.Ports
	if !slices.IsSortedFunc(ports, compareSlicePorts) {
		ports = slices.Clone(ports)
		slices.SortFunc(ports, compareSlicePorts)
	}
	g := b.groups[string(portsKey(nil, ports))]
	if g == nil {
		return nil // nobody has these ports any more: every endpoint moves
	}
	w := &work{g: g, slice: Slice{Name: s.Name, Cluster: b.cluster, Family: b.family, Ports: g.ports,
		Endpoints: make([]Endpoint, 0, min(len(s.Endpoints), MaxEndpointsPerSlice))}}
	w.changed = !slices.Equal(s.Ports, g.ports)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		var m *member
		if e.First.IsValid() {
			m = b.member(e.First)
		}
		if m == nil || m.assigned || m.g != g || len(w.slice.Endpoints) == MaxEndpointsPerSlice {
			w.changed = true
			continue
		}
		m.assigned = true
		if m.ep.Sum() != e.Sum {
			w.changed = true
		}
		w.slice.Endpoints = append(w.slice.Endpoints, *m.ep)
	}
	if len(w.slice.Endpoints) == 0 {
		return nil
	}
	b.works = append(b.works, w)
	return w
}

// fill places the endpoints no prev slice kept, group by group: into slices
// that change anyway, then into those with the most room, then into new
// slices named with the smallest free indexes.
func (b *bucket) fill(used map[string]bool) {
	var rest []*member
	for i := range b.members {
		if !b.members[i].assigned {
			rest = append(rest, &b.members[i])
		}
	}
	if len(rest) == 0 {
		return
	}
	// Group order, then address order: deterministic, and endpoints of one
	// group stay together.
	slices.SortStableFunc(rest, func(x, y *member) int { return cmp.Compare(x.g.key, y.g.key) })
	prefix := ""
	next := 0
	for len(rest) > 0 {
		g := rest[0].g
		n := 1
		for n < len(rest) && rest[n].g == g {
			n++
		}
		todo := rest[:n]
		rest = rest[n:]
		var room []*work
		for _, w := range b.works {
			if w.g == g && len(w.slice.Endpoints) < MaxEndpointsPerSlice {
				room = append(room, w)
			}
		}
		slices.SortFunc(room, func(x, y *work) int {
			if x.changed != y.changed {
				return cmp.Compare(boolInt(y.changed), boolInt(x.changed))
			}
			if !x.changed {
				if c := cmp.Compare(len(x.slice.Endpoints), len(y.slice.Endpoints)); c != 0 {
					return c // most room first
				}
			}
			return cmp.Compare(x.slice.Name, y.slice.Name)
		})
		for len(todo) > 0 {
			var w *work
			if len(room) > 0 {
				w, room = room[0], room[1:]
			} else {
				if prefix == "" {
					prefix = slicePrefix(b.key, b.cluster, b.family)
				}
				name := sliceName(prefix, next)
				for used[name] {
					next++
					name = sliceName(prefix, next)
				}
				used[name] = true
				w = &work{g: g, slice: Slice{Name: name, Cluster: b.cluster, Family: b.family, Ports: g.ports,
					Endpoints: make([]Endpoint, 0, min(len(todo), MaxEndpointsPerSlice))}}
				b.works = append(b.works, w)
			}
			k := min(MaxEndpointsPerSlice-len(w.slice.Endpoints), len(todo))
			for _, m := range todo[:k] {
				m.assigned = true
				w.slice.Endpoints = append(w.slice.Endpoints, *m.ep)
			}
			w.changed = true
			todo = todo[k:]
		}
	}
}
