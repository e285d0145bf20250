package xds

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/registry"
)

// portEndpoints is a service port's endpoints in xDS form, built and
// validated once per change and shared by the ClusterLoadAssignments of every
// locality group. Groups differ only in which priority each locality gets, and
// a locality can only get one of three, so each locality's
// LocalityLbEndpoints is built once per possible priority: a group's
// assignment is a list of pointers into them, and memory and work per group
// do not grow with the number of endpoints.
type portEndpoints struct {
	clusterName string
	// localities are the served localities (with a healthy endpoint), sorted.
	localities []registry.Locality
	blocks     []localityBlock // one per locality, in the same order
}

// localityBlock is one locality's LocalityLbEndpoints at each priority it
// can have. Nothing in it is ever modified once built.
//
// Its endpoints are kept marshalled: the lb_endpoints field (2) travels as
// the messages' unknown fields, which protobuf writes out as they are, so
// clients read ordinary lb_endpoints. A decoded LbEndpoint takes about 450
// bytes of heap, its wire form about 30: at 100k endpoints that is 45 MB
// against 3. The decoded form is validated before it is dropped.
type localityBlock struct {
	atPriority [tierCount]*endpoint.LocalityLbEndpoints
	// sum is a hash of what the block puts on the wire, priority aside (see blockSum).
	sum uint64
}

// seed keys the content hashes; they never leave the process.
var seed = maphash.MakeSeed()

// lbEndpointsField is the field number of LocalityLbEndpoints.lb_endpoints.
var lbEndpointsField = (&endpoint.LocalityLbEndpoints{}).ProtoReflect().Descriptor().Fields().ByName("lb_endpoints").Number()

// newPortEndpoints builds the xDS form of svc's port, reusing the blocks of
// prev (the port's previous form; nil for none) whose locality holds the same
// endpoints as before: a change rebuilds only the localities it touched.
//
// Each new block is validated as an assignment of that one locality, which
// covers its endpoints, its weight and its addresses; addresses are unique
// across localities by construction (see unique), and the locality groups'
// assignments differ only in the priorities, contiguous by construction.
func newPortEndpoints(svc *registry.Service, port registry.ServicePort, prev *portEndpoints) (*portEndpoints, error) {
	loc := groupByLocality(svc, port)
	p := &portEndpoints{clusterName: ClusterName(svc.Key, port.Port), localities: loc.servedLocalities()}
	p.blocks = make([]localityBlock, len(loc.served))
	var before map[registry.Locality]localityBlock
	if prev != nil {
		before = make(map[registry.Locality]localityBlock, len(prev.blocks))
		for i, l := range prev.localities {
			before[l] = prev.blocks[i]
		}
	}
	var buf []byte
	for i, le := range loc.served {
		var sum uint64
		buf, sum = blockSum(buf, le)
		if b, ok := before[le.Locality]; ok && b.sum == sum {
			p.blocks[i] = b
			continue
		}
		b, err := newBlock(p.clusterName, le, sum)
		if err != nil {
			return nil, err
		}
		p.blocks[i] = b
	}
	return p, nil
}

// blockSum hashes what a locality's block holds (buf is scratch space).
func blockSum(buf []byte, le LocalityEndpoints) ([]byte, uint64) {
	buf = append(buf[:0], le.Locality.Region...)
	buf = append(buf, 0)
	buf = append(buf, le.Locality.Zone...)
	buf = append(buf, 0)
	buf = append(buf, le.Locality.Subzone...)
	buf = append(buf, 0)
	buf = binary.LittleEndian.AppendUint32(buf, le.Weight)
	for _, e := range le.Endpoints {
		buf = e.Address.AppendTo(buf) // the text clients get; never holds a NUL
		buf = append(buf, 0)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(e.Port))
		draining := byte(0)
		if e.Health == StatusDraining {
			draining = 1
		}
		buf = append(buf, draining)
	}
	return buf, maphash.Bytes(seed, buf)
}

// newBlock builds and validates one locality's block.
func newBlock(clusterName string, le LocalityEndpoints, sum uint64) (localityBlock, error) {
	lle := localityLbEndpoints(le, 0)
	if err := Validate(&endpoint.ClusterLoadAssignment{ClusterName: clusterName, Endpoints: []*endpoint.LocalityLbEndpoints{lle}}); err != nil {
		return localityBlock{}, err
	}
	var raw []byte
	for _, e := range lle.LbEndpoints {
		b, err := marshalDeterministic.Marshal(e)
		if err != nil {
			return localityBlock{}, fmt.Errorf("%w: ClusterLoadAssignment %q: %v", ErrInvalidResource, clusterName, err)
		}
		raw = protowire.AppendTag(raw, lbEndpointsField, protowire.BytesType)
		raw = protowire.AppendBytes(raw, b)
	}
	b := localityBlock{sum: sum}
	for pr := range b.atPriority {
		m := &endpoint.LocalityLbEndpoints{Locality: lle.Locality, LoadBalancingWeight: lle.LoadBalancingWeight, Priority: uint32(pr)}
		m.ProtoReflect().SetUnknown(raw)
		b.atPriority[pr] = m
	}
	return b, nil
}

var marshalDeterministic = proto.MarshalOptions{Deterministic: true}

// forGroup returns the ClusterLoadAssignment for clients of group (on the
// wire, the same resource as ClusterLoadAssignment(Assign(svc, port, group)))
// and a hash of it: equal sums, equal resources. The hash costs a few
// nanoseconds per locality, where proto.Equal walks every endpoint. The
// assignment shares the blocks; callers must not modify it.
func (p *portEndpoints) forGroup(group registry.Locality) (*endpoint.ClusterLoadAssignment, uint64) {
	prio, count := priorities(group, p.localities)
	cla := &endpoint.ClusterLoadAssignment{ClusterName: p.clusterName, Endpoints: make([]*endpoint.LocalityLbEndpoints, 0, len(p.blocks))}
	for pr := range count {
		for i, b := range p.blocks {
			if prio[i] == pr {
				cla.Endpoints = append(cla.Endpoints, b.atPriority[pr])
			}
		}
	}
	var h maphash.Hash
	h.SetSeed(seed)
	var buf [12]byte
	for i, b := range p.blocks {
		binary.LittleEndian.PutUint64(buf[:8], b.sum)
		binary.LittleEndian.PutUint32(buf[8:], prio[i])
		h.Write(buf[:])
	}
	return cla, h.Sum64()
}
