package hub

import (
	"testing"
	"time"
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
