package hub

import (
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/replicas"
)

func TestSnapshotSavesTakeATenthOfTheTimeAtMost(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	interval := 2 * time.Second
	for _, tc := range []struct {
		name string
		took time.Duration
		ok   bool
		want time.Duration
	}{
		{"a quick save waits the interval", 50 * time.Millisecond, true, 2 * time.Second},
		{"a slow save waits ten times as long", 700 * time.Millisecond, true, 7 * time.Second},
		{"a failure waits ten intervals", 50 * time.Millisecond, false, 20 * time.Second},
	} {
		if got := nextSave(start, tc.took, interval, tc.ok).Sub(start); got != tc.want {
			t.Errorf("%s: next save after %v, want %v", tc.name, got, tc.want)
		}
	}
}

// What the leader writes to the catalog, and when: a record the catalog
// lacks; a new epoch or network; the spoke's ID and build only from a
// session here; while a spoke is live, LiveAt once it is a refresh old;
// after, the last time this replica saw it live, but never a time it only
// started a timer from over one the catalog has.
func TestCatalogRecordFollowsTheState(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	refresh := time.Minute
	first := now.Add(-time.Hour)
	held := replicas.ClusterRecord{Cluster: "east", Network: "n1", SpokeID: "s1", Build: "b1", Epoch: 4,
		FirstSeen: first, LastSeen: now.Add(-10 * time.Minute), LiveAt: now.Add(-10 * time.Minute)}
	live := ClusterStatus{ClusterStatus: adminapi.ClusterStatus{Cluster: "east", Network: "n1", Epoch: 4, Version: 9, Home: "b", LiveAt: now}, liveSeen: true}
	gone := live
	gone.Home, gone.LiveAt = "", now.Add(-5*time.Minute)
	for _, tc := range []struct {
		name  string
		cl    ClusterStatus
		old   replicas.ClusterRecord
		has   bool
		write bool
		check func(replicas.ClusterRecord) bool
	}{
		{"not in the catalog", live, replicas.ClusterRecord{}, false, true, func(r replicas.ClusterRecord) bool {
			return r.Network == "n1" && r.Epoch == 4 && r.LiveAt.Equal(now) && r.FirstSeen.Equal(now)
		}},
		{"nothing held, no spoke", clusterStatus(adminapi.ClusterStatus{Cluster: "east"}), replicas.ClusterRecord{}, false, false, nil},
		{"live, recorded a refresh ago", live, held, true, true, func(r replicas.ClusterRecord) bool {
			return r.LiveAt.Equal(now) && r.LastSeen.Equal(now) && r.FirstSeen.Equal(first) && r.SpokeID == "s1"
		}},
		{"live, recorded lately", with(live, func(c *ClusterStatus) { c.LiveAt = held.LiveAt.Add(refresh / 2) }), held, true, false, nil},
		{"a new epoch", with(live, func(c *ClusterStatus) { c.Epoch, c.LiveAt = 5, held.LiveAt }), held, true, true,
			func(r replicas.ClusterRecord) bool { return r.Epoch == 5 && r.LiveAt.Equal(held.LiveAt) }},
		{"a new spoke, here", with(live, func(c *ClusterStatus) { c.Connected, c.SpokeID, c.Build, c.LiveAt = true, "s2", "b2", held.LiveAt }), held, true, true,
			func(r replicas.ClusterRecord) bool { return r.SpokeID == "s2" && r.Build == "b2" }},
		{"an old spoke's ID, not here", with(live, func(c *ClusterStatus) { c.SpokeID, c.LiveAt = "s0", held.LiveAt }), held, true, false, nil},
		{"gone since it was seen live", gone, held, true, true, func(r replicas.ClusterRecord) bool { return r.LiveAt.Equal(gone.LiveAt) }},
		{"gone, seen live as recorded", with(gone, func(c *ClusterStatus) { c.LiveAt = held.LiveAt }), held, true, false, nil},
		{"gone, a timer started here later", with(gone, func(c *ClusterStatus) { c.liveSeen = false }), held, true, false, nil},
		{"gone, a timer started here, none recorded", with(gone, func(c *ClusterStatus) { c.liveSeen = false }),
			with(held, func(r *replicas.ClusterRecord) { r.LiveAt = time.Time{} }), true, true,
			func(r replicas.ClusterRecord) bool { return r.LiveAt.Equal(gone.LiveAt) }},
	} {
		got, write := catalogRecord(tc.cl, tc.old, tc.has, refresh, now)
		if write != tc.write || (write && tc.check != nil && !tc.check(got)) {
			t.Errorf("%s: write %v, %+v", tc.name, write, got)
		}
	}
}

func with[T any](v T, f func(*T)) T {
	f(&v)
	return v
}
