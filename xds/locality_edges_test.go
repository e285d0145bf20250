package xds

import (
	"slices"
	"strings"
	"testing"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// policyService is echo's port 8080 with the given shards and locality policy (on the first shard).
func policyService(t *testing.T, lp *traffic.LocalityPolicy, shards ...*registry.Shard) *registry.Service {
	t.Helper()
	if lp != nil {
		shards[0] = withTraffic(t, shards[0], traffic.Set{Policy: &traffic.Policy{Name: "echo", Locality: lp}})
	}
	r, _ := apply(t, registry.New(), shards...)
	return r.Service(echo)
}

// layout is, per priority, "address/health" of each endpoint, and per
// priority each locality's weight by "region/zone/subzone".
func layoutOf(cla *endpoint.ClusterLoadAssignment) (eps [][]string, weights []map[string]uint32) {
	// The default's blocks carry their endpoints as unknown fields: decode them.
	b, err := proto.Marshal(cla)
	if err != nil {
		panic(err)
	}
	cla = &endpoint.ClusterLoadAssignment{}
	if err := proto.Unmarshal(b, cla); err != nil {
		panic(err)
	}
	for _, le := range cla.GetEndpoints() {
		for int(le.GetPriority()) >= len(eps) {
			eps = append(eps, nil)
			weights = append(weights, map[string]uint32{})
		}
		l := le.GetLocality()
		weights[le.GetPriority()][l.GetRegion()+"/"+l.GetZone()+"/"+l.GetSubZone()] += le.GetLoadBalancingWeight().GetValue()
		for _, e := range le.GetLbEndpoints() {
			eps[le.GetPriority()] = append(eps[le.GetPriority()], e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()+"/"+e.GetHealthStatus().String())
		}
	}
	for _, p := range eps {
		slices.Sort(p)
	}
	return eps, weights
}

// A distribute entry whose from names a subzone would never apply (a
// client's group drops its subzone, groupOf): the model refuses it.
func TestDistributeFromASubzoneIsRefused(t *testing.T) {
	lp := &traffic.LocalityPolicy{Distribute: []traffic.Distribution{{From: "r1/z1/sz1",
		To: []traffic.LocalityWeight{{Locality: "r1/z2", Weight: 100}}}}}
	err := (&traffic.Policy{Name: "p", Locality: lp}).Validate()
	if err == nil || !strings.Contains(err.Error(), "subzone") {
		t.Fatalf("Validate = %v, want a refusal naming the subzone", err)
	}
}

// A client that names no zone shares no zone with anyone: not even the
// zone "" of endpoints that have no locality.
func TestFailoverPriorityZoneForAClientWithoutLocality(t *testing.T) {
	svc := policyService(t, &traffic.LocalityPolicy{FailoverPriority: []string{traffic.LabelZone}},
		shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
			ep("10.0.0.1", registry.Locality{}, ready, eport("grpc", 9090)),
			ep("10.0.0.2", loc("r1", "z1"), ready, eport("grpc", 9090))))
	topo := newTopology(registry.Networks{})
	pe := newPolicyEndpoints(ClusterName(echo, 8080), svc, tcp("grpc", 8080), localityPolicy(svc), topo)
	cla, _ := pe.forClient(Client{}, topo)
	got, _ := layoutOf(cla)
	if len(got) != 1 {
		t.Errorf("a client without locality, failoverPriority [zone]: priorities %v, want one (it shares no zone)", got)
	}
	// The same for a client that knows its region but not its zone: it
	// prefers the zone-less endpoints of its region over r1/z1's.
	svc = policyService(t, &traffic.LocalityPolicy{FailoverPriority: []string{traffic.LabelRegion, traffic.LabelZone}},
		shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
			ep("10.0.0.1", registry.Locality{Region: "r1"}, ready, eport("grpc", 9090)),
			ep("10.0.0.2", loc("r1", "z1"), ready, eport("grpc", 9090))))
	pe = newPolicyEndpoints(ClusterName(echo, 8080), svc, tcp("grpc", 8080), localityPolicy(svc), topo)
	cla, _ = pe.forClient(Client{Locality: registry.Locality{Region: "r1"}}, topo)
	if got, _ := layoutOf(cla); len(got) != 1 {
		t.Errorf("a client in r1 with no zone, failoverPriority [region, zone]: priorities %v, want one", got)
	}
}

// Nave keeps a locality's DRAINING endpoints beside its healthy ones (so
// Envoy finishes their work, Assign's doc); splitByCluster drops a
// cluster's part of a locality that holds only draining endpoints.
func TestFailoverPriorityByClusterKeepsDrainingEndpoints(t *testing.T) {
	shards := func() []*registry.Shard {
		return []*registry.Shard{
			shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))),
			shard("west", echo, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.1.0.1", loc("r1", "z1"), draining, eport("grpc", 9090))),
		}
	}
	topo := newTopology(registry.Networks{})
	client := Client{Cluster: "east", Locality: loc("r1", "z1")}
	plain := policyService(t, nil, shards()...)
	def, _ := newPortEndpoints(plain, tcp("grpc", 8080), nil, topo)
	defCLA, _ := def.forClient(client, topo)
	svc := policyService(t, &traffic.LocalityPolicy{FailoverPriority: []string{traffic.LabelCluster, traffic.LabelZone}}, shards()...)
	pe := newPolicyEndpoints(ClusterName(echo, 8080), svc, tcp("grpc", 8080), localityPolicy(svc), topo)
	cla, _ := pe.forClient(client, topo)
	d, _ := layoutOf(defCLA)
	got, _ := layoutOf(cla)
	if !slices.Contains(slices.Concat(got...), "10.1.0.1/DRAINING") {
		t.Errorf("failoverPriority [cluster, zone]: %v; the default keeps west's draining endpoint: %v", got, d)
	}
}

// A TrafficPolicy whose locality is present but empty (`locality: {}`, which
// the model and the CRD admit) is Nave's default, and takes the default's
// path (shared blocks), not the per-client one.
func TestEmptyLocalityPolicyTakesTheDefaultPath(t *testing.T) {
	lp := &traffic.LocalityPolicy{}
	if err := (&traffic.Policy{Name: "p", Locality: lp}).Validate(); err != nil {
		t.Skipf("the model refuses an empty locality: %v", err)
	}
	svc := policyService(t, lp, shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))))
	if localityPolicy(svc) != nil {
		t.Errorf("locality: {} is the default, yet localityPolicy returns %+v: the service is assigned per client", localityPolicy(svc))
	}
}
