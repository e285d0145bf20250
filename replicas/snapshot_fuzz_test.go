package replicas

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// FuzzCountSnapshot: the wire walk that bounds a snapshot before it is
// decoded (FuzzDecodeSnapshot covers the codec as a whole). For every body
// that decodes, countSnapshot must agree exactly with the decoded message:
// it refuses the body if and only if the message holds more clusters,
// services of a cluster or endpoints of a cluster than the limits allow.
func FuzzCountSnapshot(f *testing.F) {
	framed, err := EncodeSnapshot(codecSnapshot())
	if err != nil {
		f.Fatal(err)
	}
	_, body, err := registry.ReadSnapshotFrame(framed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(body)
	f.Add([]byte{})
	shard := federation.ShardToProto(codecSnapshot().Clusters[0].Shards[1]) // two endpoints
	add := func(clusters ...*fedv1.SnapshotCluster) {
		b, err := proto.Marshal(&fedv1.Snapshot{Revision: 9, Clusters: clusters})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// At and beyond the tight limits: services, endpoints and clusters.
	add(&fedv1.SnapshotCluster{Cluster: "east", Shards: []*fedv1.Shard{shard, shard}})
	add(&fedv1.SnapshotCluster{Cluster: "east", Shards: []*fedv1.Shard{shard, shard, shard}})
	add(&fedv1.SnapshotCluster{Cluster: "a"}, &fedv1.SnapshotCluster{Cluster: "b"}, &fedv1.SnapshotCluster{Cluster: "c"},
		&fedv1.SnapshotCluster{Cluster: "d"})
	f.Add(body[:len(body)/2])

	tight := registry.Limits{MaxServicesPerCluster: 3, MaxEndpointsPerCluster: 4}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, lim := range []registry.Limits{tight, registry.DefaultLimits()} {
			err := countSnapshot(b, lim)
			var pb fedv1.Snapshot
			if proto.Unmarshal(b, &pb) != nil {
				continue // corrupt: counting may refuse it or leave it to the decoder
			}
			over := len(pb.GetClusters()) > lim.MaxServicesPerCluster
			for _, c := range pb.GetClusters() {
				endpoints := 0
				for _, s := range c.GetShards() {
					endpoints += len(s.GetEndpoints())
				}
				over = over || len(c.GetShards()) > lim.MaxServicesPerCluster || endpoints > lim.MaxEndpointsPerCluster
			}
			switch {
			case over && err == nil:
				t.Fatalf("counted a snapshot beyond the limits %+v as within them", lim)
			case !over && err != nil:
				t.Fatalf("refused a snapshot within the limits %+v: %v", lim, err)
			case err != nil && !errors.Is(err, registry.ErrInvalid):
				t.Fatalf("refused a well-formed snapshot with %v, not ErrInvalid", err)
			}
		}
	})
}
