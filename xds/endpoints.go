package xds

import (
	"encoding/binary"
	"hash/maphash"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/navemesh/nave/registry"
)

// portEndpoints is a service port's endpoints in xDS form, built and
// validated once per change and shared by the ClusterLoadAssignments of every
// locality group. Groups differ only in which priority each locality gets, and
// a locality can only get one of three, so each locality's
// LocalityLbEndpoints is built once per possible priority: a group's
// assignment is a list of pointers into them, and memory and work per group
// no longer grow with the number of endpoints.
type portEndpoints struct {
	clusterName string
	// localities are the served localities (with a healthy endpoint), sorted.
	localities []registry.Locality
	blocks     []localityBlock // one per locality, in the same order
}

// localityBlock is one locality's LocalityLbEndpoints at each priority it
// can have. Nothing in it is ever modified once built.
type localityBlock struct {
	atPriority [tierCount]*endpoint.LocalityLbEndpoints
	// sum is a hash of what the block puts on the wire, priority aside.
	sum uint64
}

// endpointWeight is every endpoint's load_balancing_weight, shared: messages
// that are never modified may sit in many trees, and marshal concurrently.
var endpointWeight = wrapperspb.UInt32(1)

// seed keys the content hashes; they never leave the process.
var seed = maphash.MakeSeed()

// newPortEndpoints builds the xDS form of svc's port and validates it. The
// assignment of clients without locality holds every served locality at
// priority 0, so validating it covers every endpoint, weight and address; the
// other groups' assignments differ only in the priorities, which are
// contiguous by construction.
func newPortEndpoints(svc *registry.Service, port registry.ServicePort) (*portEndpoints, error) {
	loc := groupByLocality(svc, port)
	p := &portEndpoints{clusterName: ClusterName(svc.Key, port.Port), localities: loc.servedLocalities()}
	p.blocks = make([]localityBlock, len(loc.served))
	var buf []byte
	for i, le := range loc.served {
		locality := &core.Locality{Region: le.Locality.Region, Zone: le.Locality.Zone, SubZone: le.Locality.Subzone}
		weight := wrapperspb.UInt32(le.Weight)
		lb := make([]*endpoint.LbEndpoint, 0, len(le.Endpoints))
		buf = append(buf[:0], le.Locality.Region...)
		buf = append(buf, 0)
		buf = append(buf, le.Locality.Zone...)
		buf = append(buf, 0)
		buf = append(buf, le.Locality.Subzone...)
		buf = append(buf, 0)
		buf = binary.LittleEndian.AppendUint32(buf, le.Weight)
		for _, e := range le.Endpoints {
			health := core.HealthStatus_HEALTHY
			if e.Health == StatusDraining {
				health = core.HealthStatus_DRAINING
			}
			lb = append(lb, &endpoint.LbEndpoint{
				HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
					Address: socketAddress(e.Address.String(), e.Port),
				}},
				HealthStatus:        health,
				LoadBalancingWeight: endpointWeight,
			})
			buf = e.Address.AppendTo(buf)
			buf = binary.LittleEndian.AppendUint32(buf, uint32(e.Port))
			buf = append(buf, byte(health))
		}
		b := localityBlock{sum: maphash.Bytes(seed, buf)}
		for pr := range b.atPriority {
			b.atPriority[pr] = &endpoint.LocalityLbEndpoints{Locality: locality, LoadBalancingWeight: weight, Priority: uint32(pr), LbEndpoints: lb}
		}
		p.blocks[i] = b
	}
	if err := Validate(p.assignment(registry.Locality{})); err != nil {
		return nil, err
	}
	return p, nil
}

// assignment returns the ClusterLoadAssignment for clients of group: the same
// resource as ClusterLoadAssignment(Assign(svc, port, group)), sharing the
// blocks. Callers must not modify it.
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
