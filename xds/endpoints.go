package xds

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

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
	// sum is a hash of what the block puts on the wire, priority aside.
	sum uint64
}

// seed keys the content hashes; they never leave the process.
var seed = maphash.MakeSeed()

// lbEndpointsField is the field number of LocalityLbEndpoints.lb_endpoints.
var lbEndpointsField = (&endpoint.LocalityLbEndpoints{}).ProtoReflect().Descriptor().Fields().ByName("lb_endpoints").Number()

// newPortEndpoints builds the xDS form of svc's port and validates it. The
// assignment of clients without locality holds every served locality at
// priority 0, so validating it covers every endpoint, weight and address; the
// other groups' assignments differ only in the priorities, which are
// contiguous by construction.
func newPortEndpoints(svc *registry.Service, port registry.ServicePort) (*portEndpoints, error) {
	loc := groupByLocality(svc, port)
	p := &portEndpoints{clusterName: ClusterName(svc.Key, port.Port), localities: loc.servedLocalities()}
	p.blocks = make([]localityBlock, len(loc.served))
	decoded := &endpoint.ClusterLoadAssignment{ClusterName: p.clusterName, Endpoints: make([]*endpoint.LocalityLbEndpoints, len(loc.served))}
	weight := wrapperspb.UInt32(1) // every endpoint's, shared by the decoded form
	for i, le := range loc.served {
		lle := &endpoint.LocalityLbEndpoints{
			Locality:            &core.Locality{Region: le.Locality.Region, Zone: le.Locality.Zone, SubZone: le.Locality.Subzone},
			LoadBalancingWeight: wrapperspb.UInt32(le.Weight),
			LbEndpoints:         make([]*endpoint.LbEndpoint, 0, len(le.Endpoints)),
		}
		for _, e := range le.Endpoints {
			health := core.HealthStatus_HEALTHY
			if e.Health == StatusDraining {
				health = core.HealthStatus_DRAINING
			}
			lle.LbEndpoints = append(lle.LbEndpoints, &endpoint.LbEndpoint{
				HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
					Address: socketAddress(e.Address.String(), e.Port),
				}},
				HealthStatus:        health,
				LoadBalancingWeight: weight,
			})
		}
		decoded.Endpoints[i] = lle
	}
	if err := Validate(decoded); err != nil {
		return nil, err
	}
	var buf []byte
	for i, lle := range decoded.Endpoints {
		var raw []byte
		for _, e := range lle.LbEndpoints {
			b, err := marshalDeterministic.Marshal(e)
			if err != nil {
				return nil, fmt.Errorf("%w: ClusterLoadAssignment %q: %v", ErrInvalidResource, p.clusterName, err)
			}
			raw = protowire.AppendTag(raw, lbEndpointsField, protowire.BytesType)
			raw = protowire.AppendBytes(raw, b)
		}
		l := loc.served[i].Locality
		buf = append(buf[:0], l.Region...)
		buf = append(buf, 0)
		buf = append(buf, l.Zone...)
		buf = append(buf, 0)
		buf = append(buf, l.Subzone...)
		buf = append(buf, 0)
		buf = binary.LittleEndian.AppendUint32(buf, lle.GetLoadBalancingWeight().GetValue())
		buf = append(buf, raw...)
		b := localityBlock{sum: maphash.Bytes(seed, buf)}
		for pr := range b.atPriority {
			m := &endpoint.LocalityLbEndpoints{Locality: lle.Locality, LoadBalancingWeight: lle.LoadBalancingWeight, Priority: uint32(pr)}
			m.ProtoReflect().SetUnknown(raw)
			b.atPriority[pr] = m
		}
		p.blocks[i] = b
	}
	return p, nil
}

var marshalDeterministic = proto.MarshalOptions{Deterministic: true}

// assignment returns the ClusterLoadAssignment for clients of group: on the
// wire, the same resource as ClusterLoadAssignment(Assign(svc, port, group)).
// It shares the blocks; callers must not modify it.
func (p *portEndpoints) assignment(group registry.Locality) *endpoint.ClusterLoadAssignment {
	prio, count := priorities(group, p.localities)
	cla := &endpoint.ClusterLoadAssignment{ClusterName: p.clusterName, Endpoints: make([]*endpoint.LocalityLbEndpoints, 0, len(p.blocks))}
	for pr := range count {
		for i, b := range p.blocks {
			if prio[i] == pr {
				cla.Endpoints = append(cla.Endpoints, b.atPriority[pr])
			}
		}
	}
	return cla
}

// sum is a hash of group's assignment: equal sums, equal resources. It costs
// a few nanoseconds per locality, where proto.Equal walks every endpoint.
func (p *portEndpoints) sum(group registry.Locality) uint64 {
	prio, _ := priorities(group, p.localities)
	var h maphash.Hash
	h.SetSeed(seed)
	var buf [12]byte
	for i, b := range p.blocks {
		binary.LittleEndian.PutUint64(buf[:8], b.sum)
		binary.LittleEndian.PutUint32(buf[8:], prio[i])
		h.Write(buf[:])
	}
	return h.Sum64()
}
