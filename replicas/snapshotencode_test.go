package replicas

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// wholeBody is a snapshot's body as proto.Marshal makes it of the whole
// message at once (how format 2 was first written).
func wholeBody(t testing.TB, s registry.Snapshot) []byte {
	s = s.Sorted()
	pb := &fedv1.Snapshot{Revision: s.Revision}
	if !s.Taken.IsZero() {
		pb.TakenUnixNano = s.Taken.UnixNano()
	}
	for _, c := range s.Clusters {
		pc := &fedv1.SnapshotCluster{Cluster: string(c.Cluster), Network: string(c.Network), Gateways: federation.GatewaysToProto(c.Gateways),
			Stamp: &fedv1.Stamp{Epoch: c.Epoch, Version: c.Version}, Resolved: resolvedToProto(c.Resolved)}
		for _, sh := range c.Shards {
			pc.Shards = append(pc.Shards, federation.ShardToProto(sh))
		}
		pb.Clusters = append(pb.Clusters, pc)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(pb)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// encodedBody encodes s with e and returns the body inside the frame.
func encodedBody(t testing.TB, e *snapshotEncoder, s registry.Snapshot) ([]byte, []byte) {
	b, err := e.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	format, body, err := registry.ReadSnapshotFrame(b)
	if err != nil || format != snapshotFormat {
		t.Fatalf("frame: format %d, %v", format, err)
	}
	return b, body
}

// TestSnapshotBodyIsTheWholeMessage: assembled from blocks, the body is
// byte for byte what marshalling the whole message makes (so every reader
// of format 2, older hubs among them, reads it), for small and large
// snapshots, with gateways and resolved names after the shards.
func TestSnapshotBodyIsTheWholeMessage(t *testing.T) {
	for name, snap := range map[string]registry.Snapshot{
		"codec":     codecSnapshot(),
		"realistic": realisticSnapshot(3, 700, 3),
		"empty":     {},
		"gateways":  gatewaySnapshot(),
	} {
		if _, body := encodedBody(t, newSnapshotEncoder(), snap); !bytes.Equal(body, wholeBody(t, snap)) {
			t.Errorf("%s: the body differs from the whole message's wire form", name)
		}
	}
}

func gatewaySnapshot() registry.Snapshot {
	s := codecSnapshot()
	s.Clusters[0].Gateways = []registry.Gateway{{Address: "gw.east.example", Port: 15443}}
	s.Clusters[0].Resolved = []registry.ResolvedName{{Name: "gw.east.example", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}}
	return s
}

// TestSnapshotEncoderCompressesWhatChanged: after a change of one service,
// an addition and a removal, the next encoding compresses only the blocks
// holding them, decodes to the new snapshot and is byte for byte what a
// fresh encoder writes.
func TestSnapshotEncoderCompressesWhatChanged(t *testing.T) {
	snap := realisticSnapshot(2, 2000, 2)
	e := newSnapshotEncoder()
	encodedBody(t, e, snap)
	first := e.deflated
	if first < 2*2000/maxBlock {
		t.Fatalf("%d blocks compressed for 4,000 services, want at least %d", first, 2*2000/maxBlock)
	}
	next := snap
	next.Clusters = slices.Clone(snap.Clusters)
	c := &next.Clusters[1]
	c.Shards = slices.Clone(c.Shards)
	changed := *c.Shards[700]
	changed.Endpoints = changed.Endpoints[:1]
	c.Shards[700] = &changed                       // a change
	c.Shards = slices.Delete(c.Shards, 1200, 1201) // a removal
	added := *c.Shards[1500]
	added.Service.Name += "-new"
	c.Shards = append(c.Shards, &added) // an addition
	next.Revision++

	b, body := encodedBody(t, e, next)
	if n := e.deflated - first; n < 1 || n > 6 {
		t.Errorf("%d blocks compressed again for three changed services, want 1 to 6", n)
	}
	if !bytes.Equal(body, wholeBody(t, next)) {
		t.Error("the body after changes differs from the whole message's wire form")
	}
	fresh, err := EncodeSnapshot(next)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, fresh) {
		t.Error("the encoding after changes differs from a fresh encoder's")
	}
	got, err := DecodeSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if !sameSnapshot(got, next.Sorted()) {
		t.Error("the encoding after changes decodes to something else")
	}
}

// TestSnapshotEncoderValidatesNewShards: an invalid shard is refused even
// when every other block is kept, and the encoder then still encodes the
// valid snapshot from what it kept.
func TestSnapshotEncoderValidatesNewShards(t *testing.T) {
	snap := realisticSnapshot(1, 500, 1)
	e := newSnapshotEncoder()
	encodedBody(t, e, snap)
	bad := snap
	bad.Clusters = slices.Clone(snap.Clusters)
	bad.Clusters[0].Shards = slices.Clone(snap.Clusters[0].Shards)
	broken := *bad.Clusters[0].Shards[10]
	broken.Ports = append(slices.Clone(broken.Ports), broken.Ports...) // a port twice
	bad.Clusters[0].Shards[10] = &broken
	if _, err := e.Encode(bad); !errors.Is(err, registry.ErrInvalid) || !errors.Is(err, registry.ErrBadSnapshot) {
		t.Fatalf("an invalid shard: %v, want ErrInvalid and ErrBadSnapshot", err)
	}
	before := e.deflated
	if _, body := encodedBody(t, e, snap); !bytes.Equal(body, wholeBody(t, snap)) {
		t.Error("after a refusal, the body differs")
	}
	if e.deflated != before {
		t.Errorf("after a refusal, %d blocks compressed again, want none", e.deflated-before)
	}
}

// BenchmarkSnapshotAfterOneChange is a leader's save after one endpoint
// changed, at 1,000 and 10,000 services in each of two clusters: the cost
// should barely grow with the registry.
func BenchmarkSnapshotAfterOneChange(b *testing.B) {
	for _, services := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", services), func(b *testing.B) {
			snap := realisticSnapshot(2, services, 10).Sorted() // as the hub hands it over
			e := newSnapshotEncoder()
			if _, err := e.Encode(snap); err != nil {
				b.Fatal(err)
			}
			shards := snap.Clusters[0].Shards
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				j := i * 7919 % len(shards)
				sh := *shards[j]
				sh.Endpoints = slices.Clone(sh.Endpoints)
				sh.Endpoints[0].Conditions.Ready = !sh.Endpoints[0].Conditions.Ready
				shards[j] = &sh
				snap.Revision++
				if _, err := e.Encode(snap); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
