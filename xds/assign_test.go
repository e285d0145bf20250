package xds

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/navemesh/nave/registry"
)

var echo = registry.ServiceKey{Namespace: "default", Name: "echo"}

// render shows an assignment one locality per line: "priority locality weight: endpoints".
func render(a Assignment) []string {
	var out []string
	for _, p := range a.Priorities {
		for _, l := range p.Localities {
			var eps []string
			for _, e := range l.Endpoints {
				eps = append(eps, fmt.Sprintf("%s/%s:%d/%s", e.Cluster, e.Address, e.Port, e.Health))
			}
			out = append(out, fmt.Sprintf("p%d %s w%d: %s", p.Priority, l.Locality, l.Weight, strings.Join(eps, " ")))
		}
	}
	for _, l := range a.Skipped {
		out = append(out, "skipped "+l.String())
	}
	for _, e := range a.Shadowed {
		out = append(out, fmt.Sprintf("shadowed %s/%s:%d/%s", e.Cluster, e.Address, e.Port, e.Health))
	}
	return out
}

func TestAssign(t *testing.T) {
	grpcPort := tcp("grpc", 8080)
	r1z1, r1z2, r2z3 := loc("r1", "z1"), loc("r1", "z2"), loc("r2", "z3")
	threeZones := []*registry.Shard{
		shard("east", echo, []registry.ServicePort{grpcPort},
			ep("10.0.0.1", r1z1, ready, eport("grpc", 9090)),
			ep("10.0.0.2", r1z2, ready, eport("grpc", 9090))),
		shard("west", echo, []registry.ServicePort{grpcPort},
			ep("10.1.0.1", r2z3, ready, eport("grpc", 9090))),
	}
	tests := []struct {
		name   string
		shards []*registry.Shard
		port   registry.ServicePort
		client registry.Locality
		want   []string
	}{{
		name:   "zone, then region, then the rest",
		shards: threeZones, port: grpcPort, client: r1z1,
		want: []string{
			"p0 r1/z1 w1: east/10.0.0.1:9090/HEALTHY",
			"p1 r1/z2 w1: east/10.0.0.2:9090/HEALTHY",
			"p2 r2/z3 w1: west/10.1.0.1:9090/HEALTHY",
		},
	}, {
		name:   "client in another region",
		shards: threeZones, port: grpcPort, client: r2z3,
		want: []string{
			"p0 r2/z3 w1: west/10.1.0.1:9090/HEALTHY",
			"p1 r1/z1 w1: east/10.0.0.1:9090/HEALTHY",
			"p1 r1/z2 w1: east/10.0.0.2:9090/HEALTHY",
		},
	}, {
		name:   "empty same-region tier is skipped",
		shards: threeZones, port: grpcPort, client: loc("r2", "z4"),
		want: []string{
			"p0 r2/z3 w1: west/10.1.0.1:9090/HEALTHY",
			"p1 r1/z1 w1: east/10.0.0.1:9090/HEALTHY",
			"p1 r1/z2 w1: east/10.0.0.2:9090/HEALTHY",
		},
	}, {
		name:   "client far from everything gets priority 0 only",
		shards: threeZones, port: grpcPort, client: loc("r9", "z9"),
		want: []string{
			"p0 r1/z1 w1: east/10.0.0.1:9090/HEALTHY",
			"p0 r1/z2 w1: east/10.0.0.2:9090/HEALTHY",
			"p0 r2/z3 w1: west/10.1.0.1:9090/HEALTHY",
		},
	}, {
		name:   "client without locality gets everything at priority 0",
		shards: threeZones, port: grpcPort, client: registry.Locality{},
		want: []string{
			"p0 r1/z1 w1: east/10.0.0.1:9090/HEALTHY",
			"p0 r1/z2 w1: east/10.0.0.2:9090/HEALTHY",
			"p0 r2/z3 w1: west/10.1.0.1:9090/HEALTHY",
		},
	}, {
		name:   "client subzone does not matter",
		shards: threeZones, port: grpcPort, client: registry.Locality{Region: "r1", Zone: "z2", Subzone: "rack7"},
		want: []string{
			"p0 r1/z2 w1: east/10.0.0.2:9090/HEALTHY",
			"p1 r1/z1 w1: east/10.0.0.1:9090/HEALTHY",
			"p2 r2/z3 w1: west/10.1.0.1:9090/HEALTHY",
		},
	}, {
		name: "weight counts healthy endpoints, draining kept beside healthy ones, excluded left out",
		shards: []*registry.Shard{shard("east", echo, []registry.ServicePort{grpcPort},
			ep("10.0.0.3", r1z1, ready, eport("grpc", 9090)),
			ep("10.0.0.1", r1z1, ready, eport("grpc", 9090)),
			ep("10.0.0.2", r1z1, draining, eport("grpc", 9090)),
			ep("10.0.0.4", r1z1, notReady, eport("grpc", 9090)),
			ep("10.0.0.5", r1z2, ready, eport("grpc", 9090)))},
		port: grpcPort, client: r1z1,
		want: []string{
			"p0 r1/z1 w2: east/10.0.0.1:9090/HEALTHY east/10.0.0.2:9090/DRAINING east/10.0.0.3:9090/HEALTHY",
			"p1 r1/z2 w1: east/10.0.0.5:9090/HEALTHY",
		},
	}, {
		name: "a locality with only draining endpoints is left out and the next tier becomes priority 0",
		shards: []*registry.Shard{shard("east", echo, []registry.ServicePort{grpcPort},
			ep("10.0.0.1", r1z1, draining, eport("grpc", 9090)),
			ep("10.0.0.2", r1z1, notReady, eport("grpc", 9090)),
			ep("10.0.0.5", r1z2, ready, eport("grpc", 9090)))},
		port: grpcPort, client: r1z1,
		want: []string{
			"p0 r1/z2 w1: east/10.0.0.5:9090/HEALTHY",
			"skipped r1/z1",
		},
	}, {
		name: "nothing healthy: no priorities",
		shards: []*registry.Shard{shard("east", echo, []registry.ServicePort{grpcPort},
			ep("10.0.0.1", r1z1, draining, eport("grpc", 9090)),
			ep("10.0.0.2", r1z2, notReady, eport("grpc", 9090)))},
		port: grpcPort, client: r1z1,
		want: []string{"skipped r1/z1"},
	}, {
		name: "clusters sharing a locality share a LocalityLbEndpoints",
		shards: []*registry.Shard{
			shard("west", echo, []registry.ServicePort{grpcPort}, ep("10.0.0.1", r1z1, ready, eport("grpc", 7070))),
			shard("east", echo, []registry.ServicePort{grpcPort}, ep("10.0.0.9", r1z1, ready, eport("grpc", 9090))),
		},
		port: grpcPort, client: r1z1,
		want: []string{"p0 r1/z1 w2: east/10.0.0.9:9090/HEALTHY west/10.0.0.1:7070/HEALTHY"},
	}, {
		name: "each cluster's own port name picks the target port",
		shards: []*registry.Shard{
			shard("east", echo, []registry.ServicePort{tcp("grpc", 8080), tcp("metrics", 9000)},
				ep("10.0.0.1", r1z1, ready, eport("grpc", 9090), eport("metrics", 9100))),
			shard("west", echo, []registry.ServicePort{tcp("api", 8080)},
				ep("10.1.0.1", r2z3, ready, eport("api", 7070)),
				ep("10.1.0.2", r2z3, ready, eport("other", 7171))), // serves no declared port
		},
		port: grpcPort, client: r2z3,
		want: []string{
			"p0 r2/z3 w1: west/10.1.0.1:7070/HEALTHY",
			"p1 r1/z1 w1: east/10.0.0.1:9090/HEALTHY",
		},
	}, {
		name: "a port only one cluster declares has only its endpoints",
		shards: []*registry.Shard{
			shard("east", echo, []registry.ServicePort{tcp("grpc", 8080), tcp("metrics", 9000)},
				ep("10.0.0.1", r1z1, ready, eport("grpc", 9090), eport("metrics", 9100))),
			shard("west", echo, []registry.ServicePort{tcp("api", 8080)},
				ep("10.1.0.1", r2z3, ready, eport("api", 7070))),
		},
		port: tcp("metrics", 9000), client: r2z3,
		want: []string{"p0 r1/z1 w1: east/10.0.0.1:9100/HEALTHY"},
	}, {
		name: "the same address in two clusters is handed out once: the lower cluster ID wins a tie",
		shards: []*registry.Shard{
			shard("east", echo, []registry.ServicePort{grpcPort}, ep("10.244.0.5", r1z1, ready, eport("grpc", 9090))),
			shard("west", echo, []registry.ServicePort{grpcPort}, ep("10.244.0.5", r2z3, ready, eport("grpc", 9090))),
		},
		port: grpcPort, client: r1z1,
		want: []string{"p0 r1/z1 w1: east/10.244.0.5:9090/HEALTHY", "shadowed west/10.244.0.5:9090/HEALTHY"},
	}, {
		name: "the same address in two clusters is handed out once: the healthier wins",
		shards: []*registry.Shard{
			shard("east", echo, []registry.ServicePort{grpcPort},
				ep("10.244.0.5", r1z1, draining, eport("grpc", 9090)), ep("10.244.0.6", r1z1, ready, eport("grpc", 9090))),
			shard("west", echo, []registry.ServicePort{grpcPort}, ep("10.244.0.5", r2z3, ready, eport("grpc", 9090))),
		},
		port: grpcPort, client: r1z1,
		want: []string{
			"p0 r1/z1 w1: east/10.244.0.6:9090/HEALTHY",
			"p1 r2/z3 w1: west/10.244.0.5:9090/HEALTHY",
			"shadowed east/10.244.0.5:9090/DRAINING",
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := apply(t, registry.New(), tc.shards...)
			svc := r.Service(echo)
			a := Assign(svc, tc.port, tc.client)
			if got := render(a); !slices.Equal(got, tc.want) {
				t.Errorf("Assign:\ngot\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(tc.want, "\n\t"))
			}
			if a.ClusterName != ClusterName(echo, tc.port.Port) {
				t.Errorf("cluster name %q, want %q", a.ClusterName, ClusterName(echo, tc.port.Port))
			}
			for i, p := range a.Priorities {
				if p.Priority != uint32(i) {
					t.Errorf("priority %d at index %d: not contiguous", p.Priority, i)
				}
			}
			if err := Validate(ClusterLoadAssignment(a)); err != nil {
				t.Errorf("ClusterLoadAssignment is invalid: %v", err)
			}
		})
	}
}

func TestValidateRejectsWhatGRPCRejects(t *testing.T) {
	r, _ := apply(t, registry.New(), shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)),
		ep("10.0.0.2", loc("r1", "z2"), ready, eport("grpc", 9090))))
	good := ClusterLoadAssignment(Assign(r.Service(echo), tcp("grpc", 8080), loc("r1", "z1")))
	if err := Validate(good); err != nil {
		t.Fatalf("valid assignment rejected: %v", err)
	}
	noPriority0 := ClusterLoadAssignment(Assign(r.Service(echo), tcp("grpc", 8080), loc("r1", "z1")))
	noPriority0.Endpoints = noPriority0.Endpoints[1:]
	zeroWeight := ClusterLoadAssignment(Assign(r.Service(echo), tcp("grpc", 8080), loc("r1", "z1")))
	zeroWeight.Endpoints[1].LoadBalancingWeight.Value = 0
	noName := ClusterLoadAssignment(Assign(r.Service(echo), tcp("grpc", 8080), loc("r1", "z1")))
	noName.ClusterName = ""
	noClusterName := Cluster(echo, tcp("grpc", 8080), nil)
	noClusterName.Name = ""
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"priority 0 missing", Validate(noPriority0)},
		{"zero locality weight", Validate(zeroWeight)},
		{"no cluster_name", Validate(noName)},
		{"cluster without name (protoc-gen-validate)", Validate(noClusterName)},
	} {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}
