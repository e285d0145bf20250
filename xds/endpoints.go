package xds

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"

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
	// split, when not nil, is the form clients on a network are handed:
	// the port's endpoints deduplicated per network, because two networks
	// name the same address:port for different pods (see groupByLocality).
	split *portEndpoints
	// localities are the served localities (with a healthy endpoint), sorted.
	localities []registry.Locality
	blocks     []localityBlock // one per locality, in the same order
	// counts are each block's per-network counts (the parts'), for planSplit.
	counts [][]networkCount
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
	// sum is a hash of what the block puts on the wire, priority aside;
	// key also covers its endpoints' networks, which its parts follow (see blockSum).
	sum, key uint64
	// parts are the locality's endpoints per network (sorted by network),
	// for clients that name their network. A locality on one network has one
	// part, sharing the block's bytes.
	parts []blockPart
	// counts are the parts' counts, in the same order (for planSplit).
	counts []networkCount
}

// blockPart is the endpoints of one network within a locality.
type blockPart struct {
	count networkCount
	raw   []byte // their marshalled lb_endpoints
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
// The networks of the endpoints' clusters come from t (nil: none); a prev
// built against another cluster-to-network map must not be passed.
func newPortEndpoints(svc *registry.Service, port registry.ServicePort, prev *portEndpoints, t *topology) (*portEndpoints, error) {
	eps := svc.Endpoints(port)
	p, err := buildPortEndpoints(groupEndpoints(svc.Key, port, eps, nil), prev, t, false)
	if err != nil || !overlapsAcrossNetworks(eps, t) {
		return p, err
	}
	var prevSplit *portEndpoints
	if prev != nil {
		prevSplit = prev.split
	}
	p.split, err = buildPortEndpoints(groupEndpoints(svc.Key, port, eps, t), prevSplit, t, true)
	return p, err
}

// buildPortEndpoints builds the blocks of a grouping (see newPortEndpoints;
// perNetwork: deduplicated per network).
func buildPortEndpoints(loc localities, prev *portEndpoints, t *topology, perNetwork bool) (*portEndpoints, error) {
	p := &portEndpoints{clusterName: ClusterName(loc.service, loc.port), localities: loc.servedLocalities()}
	p.blocks = make([]localityBlock, len(loc.served))
	var before map[registry.Locality]localityBlock
	if prev != nil {
		before = make(map[registry.Locality]localityBlock, len(prev.blocks))
		for i, l := range prev.localities {
			before[l] = prev.blocks[i]
		}
	}
	var buf []byte
	p.counts = make([][]networkCount, len(loc.served))
	for i, le := range loc.served {
		var sum, key uint64
		buf, sum, key = blockSum(buf, le, t)
		b, ok := before[le.Locality]
		if !ok || b.key != key {
			var err error
			if b, err = newBlock(p.clusterName, le, sum, key, t, perNetwork); err != nil {
				return nil, err
			}
		}
		p.blocks[i] = b
		p.counts[i] = b.counts
	}
	return p, nil
}

// blockSum hashes what a locality's block holds (sum), and that with its
// endpoints' networks (key; sum when no cluster names a network). buf is
// scratch space.
func blockSum(buf []byte, le LocalityEndpoints, t *topology) (_ []byte, sum, key uint64) {
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
	sum = maphash.Bytes(seed, buf)
	if t == nil || len(t.clusters) == 0 {
		return buf, sum, sum
	}
	buf = binary.LittleEndian.AppendUint64(buf[:0], sum)
	for _, e := range le.Endpoints {
		buf = append(buf, t.clusters[e.Cluster]...) // a network name: never holds a NUL
		buf = append(buf, 0)
	}
	return buf, sum, maphash.Bytes(seed, buf)
}

// newBlock builds and validates one locality's block. A block of a
// grouping per network (perNetwork) may name an address once per network:
// only its parts are handed out whole, and each is checked alone.
func newBlock(clusterName string, le LocalityEndpoints, sum, key uint64, t *topology, perNetwork bool) (localityBlock, error) {
	lle := localityLbEndpoints(le, 0)
	if perNetwork {
		if err := validateParts(clusterName, le, lle, t); err != nil {
			return localityBlock{}, err
		}
	} else if err := Validate(&endpoint.ClusterLoadAssignment{ClusterName: clusterName, Endpoints: []*endpoint.LocalityLbEndpoints{lle}}); err != nil {
		return localityBlock{}, err
	}
	// The whole block in endpoint order; a locality whose endpoints are on
	// several networks also gets each network's part (network, then endpoint order).
	counts := countByNetwork(le.Endpoints, t)
	parts := make([]blockPart, len(counts))
	var raw []byte
	for i, e := range lle.LbEndpoints {
		b, err := marshalDeterministic.Marshal(e)
		if err != nil {
			return localityBlock{}, fmt.Errorf("%w: ClusterLoadAssignment %q: %v", ErrInvalidResource, clusterName, err)
		}
		raw = appendLbEndpoint(raw, b)
		if len(counts) > 1 {
			at, _ := slices.BinarySearchFunc(counts, t.networkOf(le.Endpoints[i].Cluster), func(c networkCount, n registry.Network) int { return cmp.Compare(c.network, n) })
			parts[at].raw = appendLbEndpoint(parts[at].raw, b)
		}
	}
	for i, c := range counts {
		parts[i].count = c
	}
	if len(parts) == 1 {
		parts[0].raw = raw
	}
	b := localityBlock{sum: sum, key: key, parts: parts, counts: counts}
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

// appendLbEndpoint appends one marshalled LbEndpoint as an lb_endpoints field.
func appendLbEndpoint(raw, lbEndpoint []byte) []byte {
	raw = protowire.AppendTag(raw, lbEndpointsField, protowire.BytesType)
	return protowire.AppendBytes(raw, lbEndpoint)
}

// forClient returns the ClusterLoadAssignment for client (on the wire, the
// same resource as ClusterLoadAssignment(AssignFor(svc, port, client, nets)))
// and a hash of it. A client without a network gets forGroup's. Localities
// whose endpoints are all on the client's network (or none) share their
// blocks; the others get a block of their own with the endpoints the client
// reaches directly and the gateways placed there.
func (p *portEndpoints) forClient(client Client, t *topology) (*endpoint.ClusterLoadAssignment, uint64) {
	if client.Network == "" {
		return p.forGroup(client.Locality)
	}
	if p.split != nil {
		p = p.split // two networks share addresses: this client's own grouping
	}
	plan := planSplit(client, p.localities, p.counts, t)
	defer plan.release()
	cla := &endpoint.ClusterLoadAssignment{ClusterName: p.clusterName, Endpoints: make([]*endpoint.LocalityLbEndpoints, 0, len(p.blocks)+len(plan.gateways))}
	var h maphash.Hash
	h.SetSeed(seed)
	h.WriteString(string(client.Network))
	var buf [16]byte
	for pr := range plan.count {
		for i, b := range p.blocks {
			if plan.prio[i] != pr {
				continue
			}
			if lp := plan.localities[i]; lp.weight > 0 {
				// The block's key covers its locality, endpoints and their networks.
				binary.LittleEndian.PutUint64(buf[:8], b.key)
				binary.LittleEndian.PutUint32(buf[8:12], pr)
				binary.LittleEndian.PutUint32(buf[12:16], lp.weight)
				h.Write(buf[:16])
				if allDirect(client.Network, b.parts) {
					cla.Endpoints = append(cla.Endpoints, b.atPriority[pr])
				} else {
					var raw []byte
					for _, part := range b.parts {
						if reachesDirectly(client.Network, part.count.network) {
							raw = append(raw, part.raw...)
						}
					}
					m := &endpoint.LocalityLbEndpoints{Locality: b.atPriority[0].Locality, LoadBalancingWeight: wrapperspb.UInt32(lp.weight), Priority: pr}
					m.ProtoReflect().SetUnknown(raw)
					cla.Endpoints = append(cla.Endpoints, m)
				}
			}
			for _, g := range plan.gateways {
				if g.anchor == i {
					cla.Endpoints = append(cla.Endpoints, gatewayLocalityLb(g, pr, &h))
				}
			}
		}
	}
	return cla, h.Sum64()
}

// gatewayLocalityLb is the LocalityLbEndpoints of a gateway locality at
// priority pr, and it writes what it holds to h.
func gatewayLocalityLb(g gatewayLocality, pr uint32, h *maphash.Hash) *endpoint.LocalityLbEndpoints {
	h.WriteString(g.locality.Region + "\x00" + g.locality.Zone + "\x00" + g.locality.Subzone + "\x00")
	var buf [8]byte
	binary.LittleEndian.PutUint32(buf[:4], pr)
	binary.LittleEndian.PutUint32(buf[4:], g.weight)
	h.Write(buf[:])
	var raw []byte
	for _, e := range g.gateways {
		raw = appendGateway(raw, e)
		h.Write(e.wire)
		binary.LittleEndian.PutUint32(buf[:4], e.weight)
		h.Write(buf[:4])
	}
	m := &endpoint.LocalityLbEndpoints{
		Locality:            &core.Locality{Region: g.locality.Region, Zone: g.locality.Zone, SubZone: g.locality.Subzone},
		LoadBalancingWeight: wrapperspb.UInt32(g.weight), Priority: pr,
	}
	m.ProtoReflect().SetUnknown(raw)
	return m
}

// allDirect reports whether a client on network client reaches every part directly.
func allDirect(client registry.Network, parts []blockPart) bool {
	for _, part := range parts {
		if !reachesDirectly(client, part.count.network) {
			return false
		}
	}
	return true
}

// appendGateway appends a gateway's LbEndpoint as an lb_endpoints field:
// its endpoint's wire form (the same for every assignment, kept by the
// topology) followed by its health and weight, in field order, as the
// deterministic marshalling of the whole LbEndpoint writes them.
func appendGateway(raw []byte, g gatewayEntry) []byte {
	weightLen := protowire.SizeTag(1) + protowire.SizeVarint(uint64(g.weight)) // UInt32Value.value
	lbLen := len(g.wire) +
		protowire.SizeTag(lbHealthField) + protowire.SizeVarint(uint64(core.HealthStatus_HEALTHY)) +
		protowire.SizeTag(lbWeightField) + protowire.SizeBytes(weightLen)
	raw = protowire.AppendTag(raw, lbEndpointsField, protowire.BytesType)
	raw = protowire.AppendVarint(raw, uint64(lbLen))
	raw = append(raw, g.wire...)
	raw = protowire.AppendTag(raw, lbHealthField, protowire.VarintType)
	raw = protowire.AppendVarint(raw, uint64(core.HealthStatus_HEALTHY))
	raw = protowire.AppendTag(raw, lbWeightField, protowire.BytesType)
	raw = protowire.AppendVarint(raw, uint64(weightLen))
	raw = protowire.AppendTag(raw, 1, protowire.VarintType)
	return protowire.AppendVarint(raw, uint64(g.weight))
}

// Field numbers of LbEndpoint.
var (
	lbEndpointFields = (&endpoint.LbEndpoint{}).ProtoReflect().Descriptor().Fields()
	lbHealthField    = lbEndpointFields.ByName("health_status").Number()
	lbWeightField    = lbEndpointFields.ByName("load_balancing_weight").Number()
	lbEndpointField  = lbEndpointFields.ByName("endpoint").Number()
)

// gatewayEndpointWire is the wire form of the endpoint field of a gateway's LbEndpoint.
func gatewayEndpointWire(addr netip.AddrPort) []byte {
	b, err := marshalDeterministic.Marshal(&endpoint.Endpoint{Address: socketAddress(addr.Addr().String(), int32(addr.Port()))})
	if err != nil {
		panic(fmt.Sprintf("xds: marshal a gateway endpoint: %v", err)) // built from valid parts
	}
	return protowire.AppendBytes(protowire.AppendTag(nil, lbEndpointField, protowire.BytesType), b)
}

// validateParts checks a per-network block: every endpoint valid, and no
// address:port twice within one network.
func validateParts(clusterName string, le LocalityEndpoints, lle *endpoint.LocalityLbEndpoints, t *topology) error {
	seen := make(map[string]bool, len(le.Endpoints))
	for i, e := range lle.GetLbEndpoints() {
		if err := e.ValidateAll(); err != nil {
			return fmt.Errorf("%w: ClusterLoadAssignment %q: %v", ErrInvalidResource, clusterName, err)
		}
		key := string(t.networkOf(le.Endpoints[i].Cluster)) + "\x00" + netip.AddrPortFrom(le.Endpoints[i].Address, uint16(le.Endpoints[i].Port)).String()
		if seen[key] {
			return fmt.Errorf("%w: ClusterLoadAssignment %q: endpoint %s appears twice in one network", ErrInvalidResource, clusterName, key)
		}
		seen[key] = true
	}
	return nil
}
