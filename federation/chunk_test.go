package federation

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// ItemBytes is exact: an update's items take on the wire what it says, in
// every message the Chunker packs (a spoke's, an import's, a replica's).
func TestItemBytesIsExact(t *testing.T) {
	var shards []*fedv1.Shard
	var keys []*fedv1.ServiceKey
	var imps []*fedv1.Import
	sum := map[string]int{}
	for i := range 20 {
		sh := ShardToProto(testShard("east", fmt.Sprintf("svc%d", i), "10.0.0.1", "10.0.0.2"))
		k := KeyToProto(registry.ServiceKey{Namespace: "default", Name: fmt.Sprintf("gone%d", i)})
		imp := ImportToProto(testImport("default", fmt.Sprintf("imp%d", i), "10.0.1.1"))
		shards, keys, imps = append(shards, sh), append(keys, k), append(imps, imp)
		sum["shards"] += ItemBytes(sh)
		sum["keys"] += ItemBytes(k)
		sum["imports"] += ItemBytes(imp)
	}
	for what, c := range map[string]struct {
		m    proto.Message
		want int
	}{
		"a spoke's update":   {&fedv1.Update{Upserts: shards, Removes: keys, Retain: keys}, sum["shards"] + 2*sum["keys"]},
		"an import update":   {&fedv1.ImportUpdate{Upserts: imps, Removes: keys}, sum["imports"] + sum["keys"]},
		"a replica's update": {&fedv1.ReplicaUpdate{Upserts: shards, Removes: keys}, sum["shards"] + sum["keys"]},
	} {
		if got := proto.Size(c.m); got != c.want {
			t.Errorf("%s: %d bytes, ItemBytes says %d", what, got, c.want)
		}
	}
}

// The Chunker starts a chunk when an item would pass the budget, never for
// the first item of one (an item larger than the budget travels alone).
func TestChunker(t *testing.T) {
	c := Chunker{Budget: 10}
	var starts []bool
	for _, n := range []int{4, 4, 4, 30, 1, 9, 1} {
		starts = append(starts, c.Next(n))
	}
	want := []bool{false, false, true, true, true, false, true}
	if fmt.Sprint(starts) != fmt.Sprint(want) {
		t.Errorf("new chunks %v, want %v", starts, want)
	}
}
