package xds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/registry"
)

// where lists, per priority, each locality's endpoints as "address/weight"
// (a gateway as "gw:address/weight").
func where(a Assignment) [][]string {
	var out [][]string
	for _, p := range a.Priorities {
		var tier []string
		for _, l := range p.Localities {
			for _, e := range l.Endpoints {
				s := l.Locality.Zone + " " + e.Address.String()
				if e.Gateway != "" {
					s = l.Locality.Zone + " gw:" + e.Address.String()
				}
				tier = append(tier, s+"/"+itoa(e.Weight))
			}
		}
		out = append(out, tier)
	}
	return out
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

func TestSplitHorizonFollowsTheNearestHealthyEndpoints(t *testing.T) {
	port := tcp("grpc", 8080)
	nets := registry.Networks{
		Clusters: map[registry.ClusterID]registry.Network{"a1": "net-a", "b1": "net-b", "b2": "net-b", "c1": "net-c"},
		Gateways: map[registry.Network][]registry.Gateway{"net-b": {{Address: "192.0.2.20", Port: 15443}}},
	}
	build := func(b1 registry.Conditions) *registry.Service {
		r, _ := apply(t, registry.New(),
			shard("a1", echo, []registry.ServicePort{port}, ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))),
			// net-b: two endpoints in the client's region (z2), three further away (r2).
			shard("b1", echo, []registry.ServicePort{port},
				ep("10.1.0.1", loc("r1", "z2"), b1, eport("grpc", 9090)),
				ep("10.1.0.2", loc("r1", "z2"), b1, eport("grpc", 9090))),
			shard("b2", echo, []registry.ServicePort{port},
				ep("10.2.0.1", loc("r2", "z3"), ready, eport("grpc", 9090)),
				ep("10.2.0.2", loc("r2", "z3"), ready, eport("grpc", 9090)),
				ep("10.2.0.3", loc("r2", "z4"), ready, eport("grpc", 9090))),
			// net-c has no gateway: unreachable from net-a.
			shard("c1", echo, []registry.ServicePort{port}, ep("10.3.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))))
		return r.Service(echo)
	}
	client := Client{Network: "net-a", Locality: loc("r1", "z1")}

	a := AssignFor(build(ready), port, client, nets)
	want := [][]string{{"z1 10.0.0.1/1"}, {"z2 gw:192.0.2.20/2"}}
	if got := where(a); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("net-b healthy nearby: %v, want %v", got, want)
	}
	if want := []UnreachableNetwork{{Network: "net-c", Endpoints: 1}}; !slices.Equal(a.Unreachable, want) {
		t.Errorf("unreachable %v, want %v", a.Unreachable, want)
	}
	if err := Validate(ClusterLoadAssignment(a)); err != nil {
		t.Error(err)
	}

	// net-b's nearby endpoints fail: its gateway moves to the next tier, with
	// the weight of the three endpoints there (both r2 zones).
	a = AssignFor(build(notReady), port, client, nets)
	want = [][]string{{"z1 10.0.0.1/1"}, {"z3 gw:192.0.2.20/3"}}
	if got := where(a); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("net-b failed nearby: %v, want %v", got, want)
	}

	// A net-b client gets its own endpoints directly and net-a's not at all (no gateway).
	a = AssignFor(build(ready), port, Client{Network: "net-b", Locality: loc("r1", "z2")}, nets)
	want = [][]string{{"z2 10.1.0.1/1", "z2 10.1.0.2/1"}, {"z3 10.2.0.1/1", "z3 10.2.0.2/1", "z4 10.2.0.3/1"}}
	if got := where(a); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("net-b client: %v, want %v", got, want)
	}
	if want := []UnreachableNetwork{{Network: "net-a", Endpoints: 1}, {Network: "net-c", Endpoints: 1}}; !slices.Equal(a.Unreachable, want) {
		t.Errorf("unreachable %v, want %v", a.Unreachable, want)
	}

	// A client without a network gets every endpoint directly, as before networks.
	plain := AssignFor(build(ready), port, Client{Locality: loc("r1", "z1")}, nets)
	if got, want := where(plain), where(Assign(build(ready), port, loc("r1", "z1"))); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("client without a network: %v, want %v", got, want)
	}
}

func TestSetNetworksRepublishesOnlyWhatItChanges(t *testing.T) {
	r := goldenRegistry(t)
	srv := NewServer(DefaultConfig(), Wiring{}, nil, nil)
	srv.Update(r, registry.Diff{})
	plain, netA := srv.edsCache(nodeAt(loc("r1", "z1"), "")), srv.edsCache(nodeAt(loc("r1", "z1"), "net-a"))
	versions := func() (uint64, uint64) {
		srv.stateMu.Lock()
		defer srv.stateMu.Unlock()
		return plain.version, netA.version
	}
	p0, a0 := versions()

	// Networks arrive: net-a's client now reaches west (net-b) through its gateway.
	srv.SetNetworks(goldenNetworks)
	p1, a1 := versions()
	if p1 != p0 || a1 == a0 {
		t.Fatalf("after the topology arrived: plain %d->%d (want unchanged), net-a %d->%d (want changed)", p0, p1, a0, a1)
	}
	gwOf := func() []string {
		var out []string
		for _, cla := range publishedOf[*endpoint.ClusterLoadAssignment](t, netA) {
			for _, l := range cla.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					if a := e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(); strings.HasPrefix(a, "192.0.2.") {
						out = append(out, a)
					}
				}
			}
		}
		return out
	}
	if got := gwOf(); !slices.Contains(got, "192.0.2.20") {
		t.Fatalf("net-a client holds gateways %v, want net-b's", got)
	}
	// The same topology again changes nothing.
	srv.SetNetworks(goldenNetworks)
	if p2, a2 := versions(); p2 != p1 || a2 != a1 {
		t.Errorf("an unchanged topology republished: %d->%d, %d->%d", p1, p2, a1, a2)
	}
	// net-b's gateway changes address: only net-a's client is told.
	moved := registry.Networks{Clusters: goldenNetworks.Clusters, Gateways: map[registry.Network][]registry.Gateway{
		"net-b": {{Address: "192.0.2.99", Port: 15443}}}}
	srv.SetNetworks(moved)
	if p3, a3 := versions(); p3 != p1 || a3 == a1 {
		t.Errorf("a gateway change: plain %d->%d (want unchanged), net-a %d->%d (want changed)", p1, p3, a1, a3)
	}
	if got := gwOf(); !slices.Equal(got, []string{"192.0.2.99", "192.0.2.99"}) {
		t.Errorf("net-a client holds gateways %v, want 192.0.2.99 for echo:8080 and cart:80", got)
	}
}

// Two networks may use the same pod addresses for different pods: each
// network's clients get their own pod directly and the other network's
// behind its gateway; a client without a network gets the address once.
func TestSplitHorizonWithOverlappingPodAddresses(t *testing.T) {
	port := tcp("grpc", 8080)
	nets := registry.Networks{
		Clusters: map[registry.ClusterID]registry.Network{"a1": "net-a", "b1": "net-b"},
		Gateways: map[registry.Network][]registry.Gateway{
			"net-a": {{Address: "192.0.2.10", Port: 15444}}, "net-b": {{Address: "192.0.2.20", Port: 15444}}},
	}
	r, _ := apply(t, registry.New(),
		shard("a1", echo, []registry.ServicePort{port}, ep("10.0.0.5", loc("r1", "z1"), ready, eport("grpc", 9090))),
		shard("b1", echo, []registry.ServicePort{port}, ep("10.0.0.5", loc("r2", "z3"), ready, eport("grpc", 9090))))
	svc := r.Service(echo)
	topo := newTopology(nets)
	pe, err := newPortEndpoints(svc, port, nil, topo)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		client Client
		want   [][]string
	}{
		{Client{Network: "net-a", Locality: loc("r1", "z1")}, [][]string{{"z1 10.0.0.5/1"}, {"z3 gw:192.0.2.20/1"}}},
		{Client{Network: "net-b", Locality: loc("r2", "z3")}, [][]string{{"z3 10.0.0.5/1"}, {"z1 gw:192.0.2.10/1"}}},
		{Client{Locality: loc("r2", "z3")}, [][]string{{"z1 10.0.0.5/1"}}}, // a1 wins: the lower cluster ID
	} {
		a := AssignFor(svc, port, tc.client, nets)
		if got := where(a); !slices.EqualFunc(got, tc.want, slices.Equal) {
			t.Errorf("%+v: %v, want %v", tc.client, got, tc.want)
		}
		cla, _ := pe.forClient(tc.client, topo)
		if got, want := decoded(t, cla), ClusterLoadAssignment(a); !proto.Equal(got, want) {
			t.Errorf("%+v: fast path\n%v\nwant\n%v", tc.client, got, want)
		}
		if err := Validate(decoded(t, cla)); err != nil {
			t.Errorf("%+v: %v", tc.client, err)
		}
	}
}

// Clients choose their network as they choose their locality: beyond
// MaxLocalityGroups, networks no cluster is on share one group, so no
// client can grow the EDS caches past the bound by naming new networks.
func TestNetworkNamesDoNotEscapeTheGroupBound(t *testing.T) {
	s := NewServer(Config{MaxLocalityGroups: 4}, Wiring{}, nil, nil)
	s.SetNetworks(registry.Networks{Clusters: map[registry.ClusterID]registry.Network{"east": "n1"}})
	for i := range 100 {
		md, _ := structpb.NewStruct(map[string]any{"NETWORK": fmt.Sprintf("made-up-%d", i)})
		s.edsCache(&core.Node{Id: fmt.Sprint(i), Locality: &core.Locality{Region: fmt.Sprint("r", i)}, Metadata: md})
	}
	md, _ := structpb.NewStruct(map[string]any{"NETWORK": "n1"})
	s.edsCache(&core.Node{Id: "known", Locality: &core.Locality{Region: "elsewhere"}, Metadata: md})
	// 4 groups, one for every unknown network, one for the known network n1.
	if n := len(*s.groups.Load()); n > 6 {
		t.Fatalf("%d locality groups; the bound is 4, plus one for unknown networks and one per known network", n)
	}
}

// layout lists, per priority, each locality as "zone subzone weight:
// address/weight ...", locality weights included (a gateway's share of
// traffic is its locality's weight).
func layout(a Assignment) [][]string {
	var out [][]string
	for _, p := range a.Priorities {
		var tier []string
		for _, l := range p.Localities {
			s := strings.TrimSpace(l.Locality.Zone+" "+l.Locality.Subzone) + " " + itoa(l.Weight) + ":"
			for _, e := range l.Endpoints {
				s += " " + e.Address.String() + "/" + itoa(e.Weight)
			}
			tier = append(tier, s)
		}
		out = append(out, tier)
	}
	return out
}

// One gateway in front of two networks (issue 27): an address may appear
// only once in an assignment (grpc-go NACKs it twice, in any two localities,
// whatever their priorities), so it goes where the nearer network needs it,
// at that network's own tier, with the weight of that network's endpoints
// there. The farther network is not pulled nearer (its endpoints add no
// weight there) nor does it drag the nearer one away; its own gateways that
// no nearer network took stand at its own tier. Networks sharing a gateway
// at one tier share one gateway locality, whose weight is their sum.
func TestSplitHorizonGatewaySharedByNetworks(t *testing.T) {
	port := tcp("grpc", 8080)
	const g, k = "192.0.2.30", "192.0.2.31"
	gw := registry.Gateway{Address: "192.0.2.30", Port: 15444}
	other := registry.Gateway{Address: "192.0.2.31", Port: 15444}
	client := Client{Network: "net-a", Locality: loc("r1", "z1")}
	for _, tc := range []struct {
		name      string
		near, far registry.Network // near: a pod in the client's zone; far: two pods at farAt
		farAt     registry.Locality
		farGws    []registry.Gateway
		want      [][]string
	}{
		{"the far network sorts first", "net-near", "net-far", loc("r2", "z3"), []registry.Gateway{gw},
			[][]string{{"z1 gateway/net-near 1: " + g + "/1"}, {"z2 1: 10.0.0.2/1"}}},
		{"the near network sorts first", "net-b", "net-c", loc("r2", "z3"), []registry.Gateway{gw},
			[][]string{{"z1 gateway/net-b 1: " + g + "/1"}, {"z2 1: 10.0.0.2/1"}}},
		{"the far network has a gateway of its own too", "net-near", "net-far", loc("r2", "z3"), []registry.Gateway{gw, other},
			[][]string{{"z1 gateway/net-near 1: " + g + "/1"}, {"z2 1: 10.0.0.2/1"}, {"z3 gateway/net-far 2: " + k + "/2"}}},
		{"both at one tier", "net-near", "net-far", loc("r1", "z1"), []registry.Gateway{gw},
			[][]string{{"z1 gateway/net-far 3: " + g + "/3"}, {"z2 1: 10.0.0.2/1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nets := registry.Networks{
				Clusters: map[registry.ClusterID]registry.Network{"a1": "net-a", "near": tc.near, "far": tc.far},
				Gateways: map[registry.Network][]registry.Gateway{tc.near: {gw}, tc.far: tc.farGws},
			}
			r, _ := apply(t, registry.New(),
				// The client's network: one pod, in the next zone.
				shard("a1", echo, []registry.ServicePort{port}, ep("10.0.0.2", loc("r1", "z2"), ready, eport("grpc", 9090))),
				shard("near", echo, []registry.ServicePort{port}, ep("10.1.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))),
				shard("far", echo, []registry.ServicePort{port},
					ep("10.2.0.1", tc.farAt, ready, eport("grpc", 9090)),
					ep("10.2.0.2", tc.farAt, ready, eport("grpc", 9090))))
			svc := r.Service(echo)
			a := AssignFor(svc, port, client, nets)
			if got := layout(a); !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
			if err := Validate(ClusterLoadAssignment(a)); err != nil {
				t.Error(err)
			}
			topo := newTopology(nets)
			pe, err := newPortEndpoints(svc, port, nil, topo)
			if err != nil {
				t.Fatal(err)
			}
			cla, _ := pe.forClient(client, topo)
			if got, want := decoded(t, cla), ClusterLoadAssignment(a); !proto.Equal(got, want) {
				t.Errorf("fast path\n%v\nwant\n%v", got, want)
			}
		})
	}
}
