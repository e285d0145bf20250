package registry

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// sampleRegistry holds east (web, api), west (web, db) and the stamps of
// east, west and quiet, a known cluster that publishes nothing.
func sampleRegistry(t testing.TB) (*Registry, map[ClusterID]ClusterStamp) {
	r := New()
	r, _ = r.Apply(upsert("east", webShard("east", "10.0.0.1", "10.0.0.2"), apiShard("east", "10.0.0.3")))
	west := webShard("west", "10.1.0.1")
	west.Endpoints[0].Locality = Locality{Region: "eu", Zone: "eu-1a"}
	west.Endpoints = append(west.Endpoints, Endpoint{Addresses: ips("10.1.0.2", "fd00::2"),
		Ports: []EndpointPort{eport("http", 8080)}, Conditions: draining(), NodeName: "node-1.eu", Hostname: "web-1"})
	west.Normalize()
	r, _ = r.Apply(upsert("west", west, dbShard("west", "10.1.0.9")))
	stamps := map[ClusterID]ClusterStamp{
		"east":  {Network: "n1", Epoch: 3, Version: 17},
		"west":  {Network: "n2", Epoch: 1, Version: 4},
		"quiet": {Network: "n1", Epoch: 2, Version: 1},
	}
	return r, stamps
}

func TestRegistrySnapshotListsEveryClusterSorted(t *testing.T) {
	r, stamps := sampleRegistry(t)
	snap := r.Snapshot(stamps)
	if snap.Revision != 0 || !snap.Taken.IsZero() {
		t.Errorf("Snapshot set Revision %d, Taken %v; the writer sets them", snap.Revision, snap.Taken)
	}
	var got []string
	for _, c := range snap.Clusters {
		var keys []string
		for _, s := range c.Shards {
			keys = append(keys, s.Service.String())
		}
		got = append(got, fmt.Sprintf("%s %s %d.%d %v", c.Cluster, c.Network, c.Epoch, c.Version, keys))
	}
	want := []string{
		"east n1 3.17 [shop/api shop/web]",
		"quiet n1 2.1 []",
		"west n2 1.4 [data/db shop/web]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("snapshot clusters:\n got %q\nwant %q", got, want)
	}
}

func TestSnapshotRoundTripRestoresTheRegistry(t *testing.T) {
	r, stamps := sampleRegistry(t)
	snap := r.Snapshot(stamps)
	snap.Revision, snap.Taken = 42, time.Date(2026, 3, 1, 13, 0, 0, 123456789, time.FixedZone("CET", 3600))
	b, err := EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != 42 || !got.Taken.Equal(snap.Taken) {
		t.Errorf("decoded revision %d taken %v, want 42 %v", got.Revision, got.Taken, snap.Taken)
	}
	assertSnapshotsEqual(t, got, snap)

	// Applying every cluster's Change to an empty registry restores what was held.
	restored := New()
	for _, c := range got.Clusters {
		restored, _ = restored.Apply(c.Change())
	}
	for _, id := range []ClusterID{"east", "west", "quiet"} {
		if g, w := restored.Cluster(id), r.Cluster(id); g != w {
			t.Errorf("restored %s = %+v, want %+v", id, g, w)
		}
	}
	if g, w := restored.Len(), r.Len(); g != w {
		t.Errorf("restored %d services, want %d", g, w)
	}
}

func assertSnapshotsEqual(t *testing.T, got, want Snapshot) {
	t.Helper()
	if len(got.Clusters) != len(want.Clusters) {
		t.Fatalf("%d clusters, want %d", len(got.Clusters), len(want.Clusters))
	}
	for i, g := range got.Clusters {
		w := want.Clusters[i]
		if g.Cluster != w.Cluster || g.Network != w.Network || g.Epoch != w.Epoch || g.Version != w.Version {
			t.Errorf("cluster %d = %s %s %d.%d, want %s %s %d.%d", i, g.Cluster, g.Network, g.Epoch, g.Version,
				w.Cluster, w.Network, w.Epoch, w.Version)
		}
		if !slices.EqualFunc(g.Shards, w.Shards, (*Shard).Equal) {
			t.Errorf("cluster %s shards differ:\n got %s\nwant %s", g.Cluster, jsonOf(g.Shards), jsonOf(w.Shards))
		}
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestEncodeSnapshotIsDeterministicAndLeavesItsInputAlone(t *testing.T) {
	r, stamps := sampleRegistry(t)
	snap := r.Snapshot(stamps)
	snap.Revision, snap.Taken = 7, t0
	want, err := EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		shuffled := snap
		shuffled.Taken = t0.In(time.FixedZone("X", -7200)) // the same instant elsewhere
		shuffled.Clusters = slices.Clone(snap.Clusters)
		rng.Shuffle(len(shuffled.Clusters), func(i, j int) {
			shuffled.Clusters[i], shuffled.Clusters[j] = shuffled.Clusters[j], shuffled.Clusters[i]
		})
		for i := range shuffled.Clusters {
			c := &shuffled.Clusters[i]
			c.Shards = slices.Clone(c.Shards)
			rng.Shuffle(len(c.Shards), func(i, j int) { c.Shards[i], c.Shards[j] = c.Shards[j], c.Shards[i] })
		}
		before := slices.Clone(shuffled.Clusters)
		for i := range before {
			before[i].Shards = slices.Clone(before[i].Shards)
		}
		got, err := EncodeSnapshot(shuffled)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("the same snapshot in another order encodes differently")
		}
		for i := range before {
			if before[i].Cluster != shuffled.Clusters[i].Cluster || !slices.Equal(before[i].Shards, shuffled.Clusters[i].Shards) {
				t.Fatalf("EncodeSnapshot reordered its input")
			}
		}
	}
}

// rawSnapshot encodes v (any JSON) in the snapshot format without any check.
func rawSnapshot(t testing.TB, version byte, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString(snapshotMagic)
	buf.WriteByte(version)
	zw := gzip.NewWriter(&buf)
	if s, ok := v.(string); ok {
		zw.Write([]byte(s))
	} else if err := json.NewEncoder(zw).Encode(v); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	return buf.Bytes()
}

func TestDecodeSnapshotRefusesWhatItCannotTrust(t *testing.T) {
	r, stamps := sampleRegistry(t)
	snap := r.Snapshot(stamps)
	snap.Revision = 9
	good, err := EncodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	flipped := slices.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	newer := slices.Clone(good)
	newer[len(snapshotMagic)] = 2

	web := webShard("east", "10.0.0.1")
	cluster := func(id ClusterID, shards ...*Shard) SnapshotCluster {
		return SnapshotCluster{Cluster: id, Epoch: 1, Version: 1, Shards: shards}
	}
	noPorts := cloneShard(web)
	noPorts.Ports = nil
	badAddr := cloneShard(web)
	badAddr.Endpoints[0].Addresses = []netip.Addr{{}}

	for _, tc := range []struct {
		name    string
		in      []byte
		want    string
		invalid bool // also ErrInvalid
	}{
		{"empty", nil, "not a Nave snapshot", false},
		{"garbage", []byte("hello, world, this is not a snapshot"), "not a Nave snapshot", false},
		{"header only", good[:snapshotHeader], "not gzip: truncated", false},
		{"unknown version", newer, "format version 2 is not supported (this decoder reads version 1)", false},
		{"truncated in the gzip header", good[:snapshotHeader+5], "truncated", false},
		{"truncated in the data", good[:len(good)/2], "truncated", false},
		{"truncated trailer", good[:len(good)-3], "truncated", false},
		{"corrupted byte", flipped, "corrupt", false},
		{"garbage after the data", append(slices.Clone(good), "junk"...), "4 bytes of garbage after the data", false},
		{"two gzip members", append(slices.Clone(good), good[snapshotHeader:]...), "garbage after the data", false},
		{"not JSON", rawSnapshot(t, 1, "{not json"), "corrupt", false},
		{"JSON of another shape", rawSnapshot(t, 1, `{"clusters": 3}`), "corrupt", false},
		{"bad cluster ID", rawSnapshot(t, 1, Snapshot{Clusters: []SnapshotCluster{cluster("East_1")}}),
			`cluster ID "East_1" is not a DNS label`, true},
		{"duplicate cluster", rawSnapshot(t, 1, Snapshot{Clusters: []SnapshotCluster{cluster("east"), cluster("east")}}),
			"cluster east appears twice", true},
		{"null shard", rawSnapshot(t, 1, `{"clusters":[{"cluster":"east","shards":[null]}]}`),
			"cluster east: shard 0 is null", true},
		{"shard of another cluster", rawSnapshot(t, 1, Snapshot{Clusters: []SnapshotCluster{cluster("west", web)}}),
			`cluster west holds a shard of cluster "east" (service shop/web)`, true},
		{"duplicate service", rawSnapshot(t, 1, Snapshot{Clusters: []SnapshotCluster{cluster("east", web, web)}}),
			"cluster east: service shop/web appears twice", true},
		{"invalid shard", rawSnapshot(t, 1, Snapshot{Clusters: []SnapshotCluster{cluster("east", noPorts)}}),
			"cluster east: service shop/web: no ports", true},
		{"invalid address", rawSnapshot(t, 1, Snapshot{Clusters: []SnapshotCluster{cluster("east", badAddr)}}),
			"is not a unicast IP", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeSnapshot(tc.in)
			if err == nil {
				t.Fatalf("decoded %+v, want an error", got)
			}
			if !errors.Is(err, ErrBadSnapshot) || errors.Is(err, ErrInvalid) != tc.invalid {
				t.Errorf("error %q: Is(ErrBadSnapshot) %t, Is(ErrInvalid) %t, want true, %t",
					err, errors.Is(err, ErrBadSnapshot), errors.Is(err, ErrInvalid), tc.invalid)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestDecodeSnapshotRefusesEveryTruncation(t *testing.T) {
	r, stamps := sampleRegistry(t)
	good, err := EncodeSnapshot(r.Snapshot(stamps))
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(good) {
		if _, err := DecodeSnapshot(good[:n]); !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("the first %d of %d bytes: error %v, want ErrBadSnapshot", n, len(good), err)
		}
	}
}

func TestSnapshotsKeepPerClusterLimits(t *testing.T) {
	// DefaultLimits take half a million endpoints to exceed; smaller limits make the same point.
	lim := DefaultLimits()
	lim.MaxServicesPerCluster, lim.MaxEndpointsPerCluster = 2, 3
	snap := func(shards ...*Shard) *Snapshot {
		return &Snapshot{Clusters: []SnapshotCluster{{Cluster: "east", Shards: shards}}}
	}
	web, api, db := webShard("east", "10.0.0.1", "10.0.0.2"), apiShard("east", "10.0.0.3"), dbShard("east", "10.0.0.4")
	if err := CheckSnapshot(snap(web, api), lim); err != nil {
		t.Errorf("2 services, 3 endpoints: %v", err)
	}
	if err := CheckSnapshot(snap(web, api, db), lim); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "3 services, more than the limit of 2") {
		t.Errorf("3 services: %v", err)
	}
	web3 := webShard("east", "10.0.0.1", "10.0.0.2", "10.0.0.5")
	if err := CheckSnapshot(snap(web3, api), lim); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "4 endpoints, more than the limit of 3") {
		t.Errorf("4 endpoints: %v", err)
	}
}

func TestEncodeSnapshotRefusesWhatCannotBeDecoded(t *testing.T) {
	web := webShard("east", "10.0.0.1")
	for name, snap := range map[string]Snapshot{
		"bad cluster ID":   {Clusters: []SnapshotCluster{{Cluster: ""}}},
		"nil shard":        {Clusters: []SnapshotCluster{{Cluster: "east", Shards: []*Shard{web, nil}}}},
		"foreign shard":    {Clusters: []SnapshotCluster{{Cluster: "west", Shards: []*Shard{web}}}},
		"duplicate shards": {Clusters: []SnapshotCluster{{Cluster: "east", Shards: []*Shard{web, web}}}},
	} {
		if _, err := EncodeSnapshot(snap); !errors.Is(err, ErrInvalid) || !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: error %v, want ErrInvalid and ErrBadSnapshot", name, err)
		}
	}
	if _, err := EncodeSnapshot(Snapshot{Taken: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}); !errors.Is(err, ErrBadSnapshot) {
		t.Errorf("a time JSON cannot hold: error %v, want ErrBadSnapshot", err)
	}
}

func TestEmptySnapshotRoundTrips(t *testing.T) {
	b, err := EncodeSnapshot(Snapshot{Revision: 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(b)
	if err != nil || got.Revision != 1 || len(got.Clusters) != 0 {
		t.Errorf("decoded %+v, %v", got, err)
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	r, stamps := sampleRegistry(f)
	snap := r.Snapshot(stamps)
	snap.Revision, snap.Taken = 3, t0
	good, err := EncodeSnapshot(snap)
	if err != nil {
		f.Fatal(err)
	}
	empty, _ := EncodeSnapshot(Snapshot{})
	f.Add(good)
	f.Add(empty)
	f.Add(good[:len(good)/2])
	f.Add(good[:snapshotHeader])
	f.Add([]byte{})
	f.Add([]byte(snapshotMagic + "\x02"))
	f.Add(rawSnapshot(f, 1, `{"clusters":[{"cluster":"east","shards":[null]}]}`))
	f.Add(rawSnapshot(f, 1, `{"revision":1,"clusters":[{"cluster":"east","shards":[{"cluster":"east","service":{"namespace":"a","name":"b"},"headless":true,"endpoints":[{"addresses":["::ffff:10.0.0.1"]}]}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSnapshot(b)
		if err != nil {
			if !errors.Is(err, ErrBadSnapshot) {
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
		b2, err := EncodeSnapshot(s2)
		if err != nil || !bytes.Equal(b1, b2) {
			t.Fatalf("encoding is not stable: %v", err)
		}
	})
}
