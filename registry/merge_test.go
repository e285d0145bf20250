package registry

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// exported returns a normalized shard of keyWeb exported by cluster at t0+age.
func exported(cluster ClusterID, age time.Duration, headless bool, ports ...ServicePort) *Shard {
	s := &Shard{Cluster: cluster, Service: keyWeb, ExportedAt: t0.Add(age), Headless: headless, Ports: ports}
	s.Normalize()
	return s
}

// mergeByApply merges shards through the registry, one cluster per Apply.
func mergeByApply(t *testing.T, shards []*Shard) *Service {
	t.Helper()
	r := New()
	for _, s := range shards {
		r, _ = mustApply(t, r, upsert(s.Cluster, s))
	}
	svc := r.Service(keyWeb)
	if svc == nil {
		t.Fatal("service not merged")
	}
	return svc
}

type wantConflict struct {
	Property string
	Winner   ClusterID
	Loser    ClusterID
}

func TestMerge(t *testing.T) {
	const hour = time.Hour
	tests := []struct {
		name      string
		shards    []*Shard
		ports     []ServicePort
		headless  bool
		conflicts []wantConflict
	}{
		{
			name:   "one cluster",
			shards: []*Shard{exported("east", 0, false, tcp("http", 80))},
			ports:  []ServicePort{tcp("http", 80)},
		},
		{
			name: "two clusters, same port",
			shards: []*Shard{
				exported("west", 0, false, tcp("http", 80)),
				exported("east", hour, false, tcp("http", 80)),
			},
			ports: []ServicePort{tcp("http", 80)},
		},
		{
			name: "ports are the union",
			shards: []*Shard{
				exported("west", 0, false, tcp("http", 80), tcp("grpc", 9090)),
				exported("east", hour, false, tcp("http", 80), ServicePort{Name: "https", Port: 443, Protocol: ProtocolTCP, AppProtocol: "https"}),
			},
			ports:     []ServicePort{tcp("http", 80), {Name: "https", Port: 443, Protocol: ProtocolTCP, AppProtocol: "https"}, tcp("grpc", 9090)},
			conflicts: []wantConflict{{"ports", "west", "east"}}, // different port sets conflict (upstream conformance)
		},
		{
			name: "53/TCP and 53/UDP coexist",
			shards: []*Shard{
				exported("east", 0, false, tcp("dns-tcp", 53)),
				exported("west", 0, false, udp("dns-udp", 53), tcp("dns-tcp", 53)),
			},
			ports:     []ServicePort{tcp("dns-tcp", 53), udp("dns-udp", 53)},
			conflicts: []wantConflict{{"ports", "east", "west"}},
		},
		{
			name: "same number, other name: the older export wins",
			shards: []*Shard{
				exported("east", hour, false, tcp("web", 80)),
				exported("west", 0, false, tcp("http", 80)),
			},
			ports:     []ServicePort{tcp("http", 80)},
			conflicts: []wantConflict{{"port 80/TCP", "west", "east"}},
		},
		{
			name: "same number, other name, same export time: the lower cluster ID wins",
			shards: []*Shard{
				exported("west", 0, false, tcp("http", 80)),
				exported("east", 0, false, tcp("web", 80)),
			},
			ports:     []ServicePort{tcp("web", 80)},
			conflicts: []wantConflict{{"port 80/TCP", "east", "west"}},
		},
		{
			name: "export times equal after truncation to seconds",
			shards: []*Shard{
				exported("west", 0, false, tcp("http", 80)),
				exported("east", 900*time.Millisecond, false, tcp("web", 80)),
			},
			ports:     []ServicePort{tcp("web", 80)},
			conflicts: []wantConflict{{"port 80/TCP", "east", "west"}},
		},
		{
			name: "same number, other appProtocol",
			shards: []*Shard{
				exported("east", 0, false, ServicePort{Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "http"}),
				exported("west", -hour, false, ServicePort{Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "kubernetes.io/h2c"}),
			},
			ports:     []ServicePort{{Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "kubernetes.io/h2c"}},
			conflicts: []wantConflict{{"port 80/TCP", "west", "east"}},
		},
		{
			name: "appProtocol set in one cluster only",
			shards: []*Shard{
				exported("east", 0, false, ServicePort{Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "http"}),
				exported("west", hour, false, tcp("http", 80)),
			},
			ports:     []ServicePort{{Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "http"}},
			conflicts: []wantConflict{{"port 80/TCP", "east", "west"}},
		},
		{
			name: "same name, other number",
			shards: []*Shard{
				exported("east", 0, false, tcp("http", 80)),
				exported("west", hour, false, tcp("http", 8080)),
			},
			ports:     []ServicePort{tcp("http", 80)},
			conflicts: []wantConflict{{`port name "http"`, "east", "west"}},
		},
		{
			name: "same name, other protocol",
			shards: []*Shard{
				exported("east", hour, false, tcp("dns", 53)),
				exported("west", 0, false, udp("dns", 53)),
			},
			ports:     []ServicePort{udp("dns", 53)},
			conflicts: []wantConflict{{`port name "dns"`, "west", "east"}},
		},
		{
			name: "headless mismatch",
			shards: []*Shard{
				exported("east", hour, false, tcp("http", 80)),
				exported("west", 0, true, tcp("http", 80)),
			},
			ports:     []ServicePort{tcp("http", 80)},
			headless:  true,
			conflicts: []wantConflict{{"type", "west", "east"}},
		},
		{
			name: "headless everywhere",
			shards: []*Shard{
				exported("east", 0, true, tcp("http", 80)),
				exported("west", hour, true, tcp("http", 80)),
			},
			ports:    []ServicePort{tcp("http", 80)},
			headless: true,
		},
		{
			name: "three clusters, every loser reported",
			shards: []*Shard{
				exported("a", 0, false, tcp("http", 80)),
				exported("b", hour, false, tcp("web", 80), tcp("admin", 9901)),
				exported("c", 2*hour, true, tcp("http", 80), tcp("admin", 9902)),
			},
			ports: []ServicePort{tcp("http", 80), tcp("admin", 9901)},
			conflicts: []wantConflict{
				{"port 80/TCP", "a", "b"},
				{"type", "a", "c"},
				{`port name "admin"`, "b", "c"},
				{"ports", "a", "b"}, // b's 9901 is only in b
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forward := mergeByApply(t, tt.shards)
			reversed := slices.Clone(tt.shards)
			slices.Reverse(reversed)
			backward := mergeByApply(t, reversed)
			for _, svc := range []*Service{forward, backward} {
				ids := svc.Clusters()
				if !slices.IsSorted(ids) || len(ids) != len(tt.shards) {
					t.Errorf("Shards by cluster = %v, want all %d sorted", ids, len(tt.shards))
				}
				if !slices.Equal(svc.Ports, tt.ports) {
					t.Errorf("Ports = %v, want %v", svc.Ports, tt.ports)
				}
				if svc.Headless != tt.headless {
					t.Errorf("Headless = %t, want %t", svc.Headless, tt.headless)
				}
				var got []wantConflict
				for _, c := range svc.Conflicts {
					got = append(got, wantConflict{c.Property, c.Winner, c.Loser})
					if c.Reason == "" || !strings.Contains(c.String(), string(c.Winner)) || !strings.Contains(c.String(), string(c.Loser)) {
						t.Errorf("conflict %+v does not explain itself: %q", c, c.String())
					}
				}
				if !sameElements(got, tt.conflicts) {
					t.Errorf("Conflicts = %+v, want %+v", got, tt.conflicts)
				}
				checkNothingSilent(t, svc)
			}
			if !slices.Equal(forward.Conflicts, backward.Conflicts) {
				t.Errorf("conflicts depend on arrival order:\n%+v\n%+v", forward.Conflicts, backward.Conflicts)
			}
		})
	}
}

// checkNothingSilent: every port a cluster declares is either merged as declared or named in a conflict
// with that cluster as loser, and a differing type is always a conflict.
func checkNothingSilent(t *testing.T, svc *Service) {
	t.Helper()
	lost := map[ClusterID]int{}
	for _, c := range svc.Conflicts {
		if c.IsPortSet() { // nothing of the loser is dropped: the ports are the union
			continue
		}
		lost[c.Loser]++
		if c.Winner == c.Loser {
			t.Errorf("conflict %+v has the same winner and loser", c)
		}
	}
	for _, s := range svc.Shards {
		dropped := 0
		for _, p := range s.Ports {
			if !slices.Contains(svc.Ports, p) {
				dropped++
			}
		}
		if s.Headless != svc.Headless {
			dropped++
		}
		if dropped != lost[s.Cluster] {
			t.Errorf("cluster %s: %d of its declarations not merged, %d conflicts report it", s.Cluster, dropped, lost[s.Cluster])
		}
	}
}

func sameElements[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func TestServiceEndpoints(t *testing.T) {
	east := &Shard{
		Cluster: "east", Service: keyWeb, ExportedAt: t0,
		Ports: []ServicePort{tcp("http", 80), tcp("grpc", 9090)},
		Endpoints: []Endpoint{
			{Addresses: ips("10.0.0.3"), Ports: []EndpointPort{eport("http", 8080)}, Conditions: ready(),
				Locality: Locality{Region: "us", Zone: "us-1a"}},
			{Addresses: ips("10.0.0.9", "10.0.0.1"), Ports: []EndpointPort{eport("http", 8081), eport("grpc", 9090)},
				Conditions: draining(), Locality: Locality{Region: "us", Zone: "us-1b"}},
			{Addresses: ips("10.0.0.2"), Ports: []EndpointPort{eport("http", 8080)}, Conditions: notReady()},
			{Addresses: ips("10.0.0.4"), Ports: []EndpointPort{eport("grpc", 9090)}, Conditions: ready()}, // no http port
		},
	}
	west := &Shard{ // newer: loses the name of port 80, but still serves it under its own name
		Cluster: "west", Service: keyWeb, ExportedAt: t0.Add(time.Hour),
		Ports: []ServicePort{tcp("web", 80), udp("grpc-udp", 9090)},
		Endpoints: []Endpoint{
			{Addresses: ips("fd00::1", "10.1.0.1"), Ports: []EndpointPort{eport("http", 1111), eport("web", 9000), eport("grpc", 9090), eport("grpc-udp", 9091)},
				Conditions: ready(), Locality: Locality{Region: "eu", Zone: "eu-1a"}},
		},
	}
	east.Normalize()
	west.Normalize()
	r, _ := mustApply(t, New(), upsert("east", east))
	r, _ = mustApply(t, r, upsert("west", west))
	svc := r.Service(keyWeb)
	if len(svc.Conflicts) != 2 || svc.Conflicts[0].Loser != "west" || !svc.Conflicts[1].IsPortSet() {
		t.Fatalf("fixture: conflicts %+v", svc.Conflicts)
	}

	tests := []struct {
		port ServicePort
		want []PortEndpoint
	}{
		{
			port: tcp("http", 80),
			want: []PortEndpoint{
				{Cluster: "east", Address: ip("10.0.0.1"), Port: 8081, Locality: Locality{Region: "us", Zone: "us-1b"}, Health: Draining},
				{Cluster: "east", Address: ip("10.0.0.3"), Port: 8080, Locality: Locality{Region: "us", Zone: "us-1a"}, Health: Healthy},
				{Cluster: "west", Address: ip("10.1.0.1"), Port: 9000, Locality: Locality{Region: "eu", Zone: "eu-1a"}, Health: Healthy},
			},
		},
		{
			port: tcp("grpc", 9090), // west declares 9090 over UDP only
			want: []PortEndpoint{
				{Cluster: "east", Address: ip("10.0.0.1"), Port: 9090, Locality: Locality{Region: "us", Zone: "us-1b"}, Health: Draining},
				{Cluster: "east", Address: ip("10.0.0.4"), Port: 9090, Health: Healthy},
			},
		},
		{
			port: udp("grpc-udp", 9090),
			want: []PortEndpoint{
				{Cluster: "west", Address: ip("10.1.0.1"), Port: 9091, Locality: Locality{Region: "eu", Zone: "eu-1a"}, Health: Healthy},
			},
		},
		{port: tcp("http", 81)},
	}
	for _, tt := range tests {
		got := svc.Endpoints(tt.port)
		if !slices.Equal(got, tt.want) {
			t.Errorf("Endpoints(%d/%s) =\n%+v\nwant\n%+v", tt.port.Port, tt.port.Protocol, got, tt.want)
		}
	}
}
