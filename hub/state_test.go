package hub

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

func startState(t *testing.T) *state {
	t.Helper()
	s := newState("hub-test", DefaultLiveness(), nil, registry.DefaultLimits(), nil, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	go s.run(ctx)
	t.Cleanup(func() { cancel(); <-s.done })
	return s
}

func apiShard(cluster registry.ClusterID, exportedAt time.Time, portName string) *registry.Shard {
	s := &registry.Shard{
		Cluster: cluster, Service: registry.ServiceKey{Namespace: "default", Name: "api"}, ExportedAt: exportedAt,
		Ports: []registry.ServicePort{{Name: portName, Port: 8080, Protocol: registry.ProtocolTCP}},
	}
	s.Normalize()
	return s
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Each cluster's conflict set follows the registry, and only the sets that
// change wake their watchers: an update of one cluster wakes the other
// cluster of a conflict it creates or resolves.
func TestStateTracksConflictsPerCluster(t *testing.T) {
	s := startState(t)
	ctx := context.Background()
	apply := func(sh *registry.Shard) {
		t.Helper()
		if _, err := s.Apply(ctx, 1, 1, registry.Change{Cluster: sh.Cluster, Upserts: []*registry.Shard{sh}}); err != nil {
			t.Fatal(err)
		}
	}
	old, young := time.Unix(1_700_000_000, 0), time.Unix(1_800_000_000, 0)
	key := registry.ServiceKey{Namespace: "default", Name: "api"}

	apply(apiShard("east", young, "grpc"))
	eastSet, eastChanged := s.Conflicts("east")
	westSet, westChanged := s.Conflicts("west")
	_, northChanged := s.Conflicts("north")
	if len(eastSet) != 0 || len(westSet) != 0 {
		t.Fatalf("conflicts before a second export: east %v, west %v", eastSet, westSet)
	}

	// west exports the service earlier under another port name: west wins.
	apply(apiShard("west", old, "web"))
	if !closed(eastChanged) || !closed(westChanged) {
		t.Fatal("a new conflict did not wake both clusters' watchers")
	}
	if closed(northChanged) {
		t.Fatal("a conflict of others woke an uninvolved cluster's watcher")
	}
	eastSet, eastChanged = s.Conflicts("east")
	westSet, westChanged = s.Conflicts("west")
	for id, set := range map[registry.ClusterID]federation.Conflicts{"east": eastSet, "west": westSet} {
		if len(set) != 1 || len(set[key]) != 1 || !strings.Contains(set[key][0].Text, "kept west's, ignored east's") ||
			!strings.Contains(set[key][0].Text, "west exported the service first") {
			t.Errorf("%s's conflicts: %q", id, set)
		}
	}

	// An update that changes endpoints only leaves the conflicts as they are.
	withEndpoint := apiShard("east", young, "grpc")
	withEndpoint.Endpoints = []registry.Endpoint{{Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}}
	apply(withEndpoint)
	if closed(eastChanged) || closed(westChanged) {
		t.Fatal("an update that changed no conflict woke a watcher")
	}

	// The loser (east) takes the winner's name: the conflict is resolved for both.
	apply(apiShard("east", young, "web"))
	if !closed(eastChanged) || !closed(westChanged) {
		t.Fatal("a resolved conflict did not wake both clusters' watchers")
	}
	for _, id := range []registry.ClusterID{"east", "west"} {
		if set, _ := s.Conflicts(id); len(set) != 0 {
			t.Errorf("%s still has conflicts %q", id, set)
		}
	}
}

// An operation that panics reports that it failed (an update it was part
// of is not acknowledged), and the state goes on.
func TestPanickingOperationFails(t *testing.T) {
	s := startState(t)
	if err := s.do(context.Background(), func() { panic("boom") }); !errors.Is(err, errPanicked) {
		t.Fatalf("a panicking operation returned %v, want errPanicked", err)
	}
	ran := false
	if err := s.do(context.Background(), func() { ran = true }); err != nil || !ran {
		t.Fatalf("the next operation: %v, ran %v", err, ran)
	}
}
