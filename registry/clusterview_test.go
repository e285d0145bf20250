package registry

import (
	"maps"
	"testing"
)

func TestClusterView(t *testing.T) {
	var zero ClusterView
	if zero.Len() != 0 || zero.Digest() != ZeroHash || len(maps.Collect(zero.All())) != 0 {
		t.Error("the zero ClusterView is not an empty cluster")
	}
	if s, ok := zero.Get(keyWeb); s != nil || ok {
		t.Errorf("the zero ClusterView holds %v", s)
	}

	web, api := webShard("east", "10.0.0.1"), apiShard("east", "10.0.0.2")
	r, _ := mustApply(t, New(), upsert("east", web, api))
	r, _ = mustApply(t, r, upsert("west", webShard("west", "10.1.0.1")))
	v := r.ClusterView("east")
	if v.Len() != 2 || v.Digest() != r.ClusterDigest("east") || v.Digest() != Digest(map[ServiceKey]*Shard{keyWeb: web, keyAPI: api}) {
		t.Errorf("view of east: Len %d, Digest %v", v.Len(), v.Digest())
	}
	if s, ok := v.Get(keyWeb); s != web || !ok {
		t.Errorf("Get(web) = %v, %t", s, ok)
	}
	if s, ok := v.Get(keyDB); s != nil || ok {
		t.Errorf("Get(db) = %v, %t", s, ok)
	}
	if got := maps.Collect(v.All()); !maps.Equal(got, r.ClusterShards("east")) {
		t.Errorf("All = %v, want %v", got, r.ClusterShards("east"))
	}
	if u := r.ClusterView("south"); u.Len() != 0 || u.Digest() != ZeroHash {
		t.Error("an unknown cluster's view is not empty")
	}

	// A view is of one registry version: later Applies leave it as it was.
	r2, _ := mustApply(t, r, Change{Cluster: "east", Replace: true, Upserts: []*Shard{dbShard("east", "10.0.0.3")}})
	if s, ok := v.Get(keyWeb); s != web || !ok || v.Len() != 2 || v.Digest() != r.ClusterDigest("east") {
		t.Error("a view changed after a later Apply")
	}
	if v2 := r2.ClusterView("east"); v2.Len() != 1 || v2.Digest() != r2.ClusterDigest("east") {
		t.Errorf("view after the full state: Len %d", v2.Len())
	}
	for range v.All() {
		break // stopping early must not panic
	}
}
