package imports

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
)

var (
	web = registry.ServiceKey{Namespace: "shop", Name: "web"}
	t0  = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func tcp(name string, port int32) registry.ServicePort {
	return registry.ServicePort{Name: name, Port: port, Protocol: registry.ProtocolTCP}
}

func ready() registry.Conditions { return registry.Conditions{Ready: true, Serving: true} }

// ep is a ready endpoint with the given addresses serving "http" on 8080.
func ep(addrs ...string) registry.Endpoint {
	e := registry.Endpoint{
		Ports:      []registry.EndpointPort{{Name: "http", Port: 8080}},
		Locality:   registry.Locality{Region: "eu", Zone: "eu-1a"},
		NodeName:   "node-1",
		Conditions: ready(),
	}
	for _, a := range addrs {
		e.Addresses = append(e.Addresses, addr(a))
	}
	return e
}

// shard is a ClusterSetIP shard exporting "http" 80/TCP since t0+age.
func shard(cluster registry.ClusterID, age time.Duration, eps ...registry.Endpoint) *registry.Shard {
	return &registry.Shard{
		Cluster: cluster, Service: web, ExportedAt: t0.Add(age),
		Ports: []registry.ServicePort{tcp("http", 80)}, Endpoints: eps,
	}
}

// merged merges shards through a real registry, as the hub does.
func merged(t testing.TB, shards ...*registry.Shard) *registry.Service {
	t.Helper()
	r := registry.New()
	for _, s := range shards {
		s.Normalize()
		if err := s.Validate(registry.DefaultLimits()); err != nil {
			t.Fatalf("shard %s: %v", s.Cluster, err)
		}
		r, _ = r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
	}
	svc := r.Service(shards[0].Service)
	if svc == nil {
		t.Fatal("no merged service")
	}
	return svc
}

// randomService is a merged service of up to 4 clusters with random
// endpoints (both families, a few multi-address and dual-stack ones, two
// target ports for "http", some without any port).
func randomService(t testing.TB, rng *rand.Rand, headless bool) *registry.Service {
	var shards []*registry.Shard
	for c := range 1 + rng.IntN(4) {
		s := shard(registry.ClusterID(fmt.Sprintf("c%d", c)), time.Duration(rng.IntN(3))*time.Hour)
		s.Headless = headless
		s.Ports = append(s.Ports, registry.ServicePort{Name: "grpc", Port: 9000, Protocol: registry.ProtocolTCP, AppProtocol: "grpc"})
		seen := map[netip.Addr]bool{}
		for range rng.IntN(300) {
			var e registry.Endpoint
			e.Conditions = registry.Conditions{Ready: rng.IntN(4) > 0, Serving: rng.IntN(2) > 0, Terminating: rng.IntN(5) == 0}
			e.Locality.Zone = fmt.Sprintf("z%d", rng.IntN(3))
			if rng.IntN(3) == 0 {
				e.Hostname = fmt.Sprintf("h%d", rng.IntN(1000))
			}
			for range 1 + rng.IntN(3)/2*rng.IntN(3) {
				var a netip.Addr
				if rng.IntN(3) == 0 {
					a = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(c), byte(rng.IntN(4)), byte(rng.IntN(256))})
				} else {
					a = netip.AddrFrom4([4]byte{10, byte(c), byte(rng.IntN(4)), byte(rng.IntN(256))})
				}
				if !seen[a] {
					seen[a] = true
					e.Addresses = append(e.Addresses, a)
				}
			}
			if len(e.Addresses) == 0 {
				continue
			}
			switch rng.IntN(10) {
			case 0: // no port
			case 1:
				e.Ports = []registry.EndpointPort{{Name: "http", Port: 9090}}
			case 2:
				e.Ports = []registry.EndpointPort{{Name: "http", Port: 8080}, {Name: "grpc", Port: 9000}}
			default:
				e.Ports = []registry.EndpointPort{{Name: "http", Port: 8080}}
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		shards = append(shards, s)
	}
	return merged(t, shards...)
}

// shuffled returns a deep copy of svc with every list in random order
// (but the IP families, whose order means something).
func shuffled(rng *rand.Rand, svc *registry.Service) *registry.Service {
	out := *svc
	out.Ports = shuffle(rng, svc.Ports)
	out.Shards = shuffle(rng, svc.Shards)
	for i, sh := range out.Shards {
		c := *sh
		c.Ports = shuffle(rng, sh.Ports)
		c.Endpoints = shuffle(rng, sh.Endpoints)
		for j := range c.Endpoints {
			c.Endpoints[j].Addresses = shuffle(rng, c.Endpoints[j].Addresses)
			c.Endpoints[j].Ports = shuffle(rng, c.Endpoints[j].Ports)
		}
		out.Shards[i] = &c
	}
	return &out
}

func shuffle[T any](rng *rand.Rand, s []T) []T {
	s = slices.Clone(s)
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}
