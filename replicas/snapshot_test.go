package replicas

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// codecSnapshot has what a snapshot can hold: several clusters (one known
// and empty), IPv4 and IPv6 addresses, localities, node and host names,
// draining endpoints, networks, a time with nanoseconds.
func codecSnapshot() registry.Snapshot {
	exported := time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC) // the wire keeps seconds
	shard := func(cluster registry.ClusterID, name string, eps ...registry.Endpoint) *registry.Shard {
		sh := &registry.Shard{Cluster: cluster, Service: registry.ServiceKey{Namespace: "shop", Name: name}, ExportedAt: exported,
			Ports: []registry.ServicePort{{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP, AppProtocol: "kubernetes.io/h2c"}}, Endpoints: eps}
		sh.Normalize()
		return sh
	}
	ep := func(addr string, c registry.Conditions) registry.Endpoint {
		return registry.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(addr)}, Ports: []registry.EndpointPort{{Name: "grpc", Port: 9090}},
			Locality: registry.Locality{Region: "eu", Zone: "eu-1a", Subzone: "rack-1"}, NodeName: "node-1.eu", Hostname: "web-0", Conditions: c}
	}
	ready, draining := registry.Conditions{Ready: true, Serving: true}, registry.Conditions{Serving: true, Terminating: true}
	return registry.Snapshot{Revision: 42, Taken: time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.UTC), Clusters: []registry.SnapshotCluster{
		{Cluster: "east", Network: "n1", Epoch: 3, Version: 17, Shards: []*registry.Shard{
			shard("east", "api", ep("10.0.0.3", ready)),
			shard("east", "web", ep("10.0.0.1", ready), ep("fd00::2", draining)),
		}},
		{Cluster: "quiet", Network: "n1", Epoch: 2, Version: 1},
		{Cluster: "west", Network: "n2", Epoch: 1, Version: 4, Shards: []*registry.Shard{shard("west", "web", ep("10.1.0.1", ready))}},
	}}
}

func TestSnapshotRoundTrips(t *testing.T) {
	snap := codecSnapshot()
	b, err := EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	if b[len(magic)] != snapshotFormat {
		t.Fatalf("encoded as format %d, want %d", b[len(magic)], snapshotFormat)
	}
	got, err := DecodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if !sameSnapshot(got, snap) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, snap)
	}
	// What earlier hubs wrote (format 1, JSON) still reads.
	old, err := registry.EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeSnapshot(old); err != nil || !sameSnapshot(got, snap) {
		t.Fatalf("format 1: %v\n%+v", err, got)
	}
}

func TestEncodeSnapshotIsDeterministicAndLeavesItsInputAlone(t *testing.T) {
	snap := codecSnapshot()
	want, err := EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10 {
		shuffled := snap
		shuffled.Clusters = append([]registry.SnapshotCluster(nil), snap.Clusters...)
		rng.Shuffle(len(shuffled.Clusters), func(i, j int) {
			shuffled.Clusters[i], shuffled.Clusters[j] = shuffled.Clusters[j], shuffled.Clusters[i]
		})
		for i := range shuffled.Clusters {
			c := &shuffled.Clusters[i]
			c.Shards = append([]*registry.Shard(nil), c.Shards...)
			rng.Shuffle(len(c.Shards), func(i, j int) { c.Shards[i], c.Shards[j] = c.Shards[j], c.Shards[i] })
		}
		before := fmt.Sprint(shuffled.Clusters)
		got, err := EncodeSnapshot(shuffled)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("a reordered snapshot encoded to other bytes")
		}
		if fmt.Sprint(shuffled.Clusters) != before {
			t.Fatal("EncodeSnapshot reordered its input")
		}
	}
}

// magic starts every encoded snapshot.
const magic = "NAVESNAP"

// frame encodes pb as format 2 without any check, as a corrupt or hostile writer could.
func frame(t testing.TB, pb *fedv1.Snapshot) []byte {
	t.Helper()
	body, err := proto.Marshal(pb)
	if err != nil {
		t.Fatal(err)
	}
	return rawFrame(t, body)
}

func rawFrame(t testing.TB, body []byte) []byte {
	t.Helper()
	b, err := registry.WriteSnapshotFrame(snapshotFormat, body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeSnapshotRefusesWhatItCannotTrust(t *testing.T) {
	good, err := EncodeSnapshot(codecSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	validShard := func() *fedv1.Shard { return federation.ShardToProto(codecSnapshot().Clusters[0].Shards[0]) }
	cluster := func(id string, shards ...*fedv1.Shard) *fedv1.SnapshotCluster {
		return &fedv1.SnapshotCluster{Cluster: id, Stamp: &fedv1.Stamp{Epoch: 1, Version: 1}, Shards: shards}
	}
	badAddress := validShard()
	badAddress.Endpoints[0].Addresses[0] = "10.0.0.999"
	badName := validShard()
	badName.Service.Name = "Not_A_Name"
	tooMany := cluster("east")
	for i := range registry.DefaultLimits().MaxServicesPerCluster + 1 {
		sh := validShard()
		sh.Service.Name = fmt.Sprintf("svc-%d", i)
		tooMany.Shards = append(tooMany.Shards, sh)
	}
	for _, tc := range []struct {
		name    string
		in      []byte
		invalid bool
	}{
		{"empty", nil, false},
		{"not a snapshot", []byte("hello, world"), false},
		{"unknown format", append([]byte(magic+"\x03"), good[len(magic)+1:]...), false},
		{"not gzip", []byte(magic + "\x02garbage"), false},
		{"truncated", good[:len(good)-5], false},
		{"garbage after the data", append(append([]byte(nil), good...), 0, 1, 2), false},
		{"not protobuf", rawFrame(t, []byte{0xff, 0xff, 0xff}), false},
		{"invalid cluster ID", frame(t, &fedv1.Snapshot{Clusters: []*fedv1.SnapshotCluster{cluster("East!", validShard())}}), true},
		{"cluster twice", frame(t, &fedv1.Snapshot{Clusters: []*fedv1.SnapshotCluster{cluster("east"), cluster("east")}}), true},
		{"service twice", frame(t, &fedv1.Snapshot{Clusters: []*fedv1.SnapshotCluster{cluster("east", validShard(), validShard())}}), true},
		{"address that is not an IP", frame(t, &fedv1.Snapshot{Clusters: []*fedv1.SnapshotCluster{cluster("east", badAddress)}}), true},
		{"invalid service name", frame(t, &fedv1.Snapshot{Clusters: []*fedv1.SnapshotCluster{cluster("east", badName)}}), true},
		{"more services than a cluster may hold", frame(t, &fedv1.Snapshot{Clusters: []*fedv1.SnapshotCluster{tooMany}}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeSnapshot(tc.in)
			if err == nil {
				t.Fatalf("decoded %+v", got)
			}
			if !errors.Is(err, registry.ErrBadSnapshot) || errors.Is(err, registry.ErrInvalid) != tc.invalid {
				t.Errorf("error %q: Is(ErrBadSnapshot) %t, Is(ErrInvalid) %t, want true, %t",
					err, errors.Is(err, registry.ErrBadSnapshot), errors.Is(err, registry.ErrInvalid), tc.invalid)
			}
		})
	}
	for n := range len(good) {
		if _, err := DecodeSnapshot(good[:n]); !errors.Is(err, registry.ErrBadSnapshot) {
			t.Fatalf("the first %d of %d bytes: error %v, want ErrBadSnapshot", n, len(good), err)
		}
	}
}

func TestEncodeSnapshotRefusesWhatCannotBeDecoded(t *testing.T) {
	dup := codecSnapshot()
	dup.Clusters = append(dup.Clusters, dup.Clusters[0])
	if _, err := EncodeSnapshot(dup); !errors.Is(err, registry.ErrInvalid) || !errors.Is(err, registry.ErrBadSnapshot) {
		t.Errorf("a cluster twice: error %v, want ErrInvalid and ErrBadSnapshot", err)
	}
	if _, err := EncodeSnapshot(registry.Snapshot{Taken: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}); !errors.Is(err, registry.ErrBadSnapshot) {
		t.Errorf("a time nanoseconds cannot hold: error %v, want ErrBadSnapshot", err)
	}
	b, err := EncodeSnapshot(registry.Snapshot{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeSnapshot(b); err != nil || got.Revision != 0 || !got.Taken.IsZero() || len(got.Clusters) != 0 {
		t.Fatalf("empty snapshot: %+v, %v", got, err)
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	good, err := EncodeSnapshot(codecSnapshot())
	if err != nil {
		f.Fatal(err)
	}
	old, _ := registry.EncodeSnapshot(codecSnapshot())
	empty, _ := EncodeSnapshot(registry.Snapshot{})
	f.Add(good)
	f.Add(old)
	f.Add(empty)
	f.Add(good[:len(good)/2])
	f.Add([]byte(magic + "\x02"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSnapshot(b)
		if err != nil {
			if !errors.Is(err, registry.ErrBadSnapshot) {
				t.Fatalf("error %v does not wrap ErrBadSnapshot", err)
			}
			return
		}
		// Whatever decodes re-encodes, and decodes again to the same bytes.
		b1, err := EncodeSnapshot(s)
		if err != nil {
			t.Fatalf("decoded snapshot does not encode: %v", err)
		}
		s2, err := DecodeSnapshot(b1)
		if err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v", err)
		}
		if b2, err := EncodeSnapshot(s2); err != nil || !bytes.Equal(b1, b2) {
			t.Fatalf("encoding is not stable: %v", err)
		}
	})
}

// realisticSnapshot is clusters × services × endpoints shaped like real
// services: sequential addresses, three zones, node names, a few draining.
func realisticSnapshot(clusters, services, endpoints int) registry.Snapshot {
	t0 := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	snap := registry.Snapshot{Revision: 1, Taken: t0}
	for c := range clusters {
		id := registry.ClusterID(fmt.Sprintf("cluster-%d", c))
		sc := registry.SnapshotCluster{Cluster: id, Network: "net-1", Epoch: 4, Version: 1000}
		for s := range services {
			sh := &registry.Shard{Cluster: id, Service: registry.ServiceKey{Namespace: fmt.Sprintf("team-%d", s%40), Name: fmt.Sprintf("svc-%d", s)},
				ExportedAt: t0, Ports: []registry.ServicePort{{Name: "grpc", Port: 9090, Protocol: registry.ProtocolTCP}}}
			for e := range endpoints {
				n := s*endpoints + e
				sh.Endpoints = append(sh.Endpoints, registry.Endpoint{
					Addresses:  []netip.Addr{netip.AddrFrom4([4]byte{10, byte(c), byte(n >> 8), byte(n)})},
					Ports:      []registry.EndpointPort{{Name: "grpc", Port: 9090}},
					Locality:   registry.Locality{Region: "eu-west-1", Zone: fmt.Sprintf("eu-west-1%c", 'a'+e%3)},
					NodeName:   fmt.Sprintf("ip-10-%d-%d-%d.eu-west-1.compute.internal", c, n%256, n%61),
					Conditions: registry.Conditions{Ready: n%17 != 0, Serving: true, Terminating: n%17 == 0},
				})
			}
			sh.Normalize()
			sc.Shards = append(sc.Shards, sh)
		}
		snap.Clusters = append(snap.Clusters, sc)
	}
	return snap
}

// BenchmarkSnapshot encodes and decodes 100k endpoints (10 clusters × 1000
// services × 10) in both formats.
func BenchmarkSnapshot(b *testing.B) {
	snap := realisticSnapshot(10, 1000, 10)
	for _, f := range []struct {
		name   string
		encode func(registry.Snapshot) ([]byte, error)
	}{{"format2", EncodeSnapshot}, {"format1-json", registry.EncodeSnapshot}} {
		enc, err := f.encode(snap)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(f.name+"/encode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f.encode(snap); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(enc)), "bytes")
		})
		b.Run(f.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeSnapshot(enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A snapshot is counted before it is decoded: clusters, services per
// cluster and endpoints per cluster beyond the limits are refused from the
// wire form alone, so a hostile snapshot never costs its decoded size.
func TestSnapshotIsCountedBeforeItIsDecoded(t *testing.T) {
	shard := federation.ShardToProto(codecSnapshot().Clusters[0].Shards[0])
	two := proto.Clone(shard).(*fedv1.Shard)
	two.Endpoints = append(two.Endpoints, two.Endpoints...)
	body := func(clusters ...*fedv1.SnapshotCluster) []byte {
		b, err := proto.Marshal(&fedv1.Snapshot{Clusters: clusters})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	lim := registry.Limits{MaxServicesPerCluster: 2, MaxEndpointsPerCluster: 3}
	within := body(&fedv1.SnapshotCluster{Cluster: "east", Shards: []*fedv1.Shard{shard, shard}})
	if err := countSnapshot(within, lim); err != nil {
		t.Fatalf("within the limits: %v", err)
	}
	for name, b := range map[string][]byte{
		"clusters":  body(&fedv1.SnapshotCluster{Cluster: "a"}, &fedv1.SnapshotCluster{Cluster: "b"}, &fedv1.SnapshotCluster{Cluster: "c"}),
		"services":  body(&fedv1.SnapshotCluster{Cluster: "east", Shards: []*fedv1.Shard{shard, shard, shard}}),
		"endpoints": body(&fedv1.SnapshotCluster{Cluster: "east", Shards: []*fedv1.Shard{two, two}}),
	} {
		if err := countSnapshot(b, lim); !errors.Is(err, registry.ErrInvalid) || !strings.Contains(err.Error(), "more than") {
			t.Errorf("too many %s: %v, want refused", name, err)
		}
	}
	if err := countSnapshot([]byte{0x1a, 0xff}, lim); err == nil {
		t.Error("corrupt wire data was counted")
	}
}
