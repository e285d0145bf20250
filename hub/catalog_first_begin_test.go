package hub

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/internal/etcdtest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// A session of a cluster new to the catalog records it before it begins;
// a known cluster's record stays as the leader keeps it; a session whose
// epoch passed before its record was written is superseded; and with etcd
// unreachable a new session is refused within its bound. Refused sessions
// begin nothing.
func TestSessionsRecordANewClusterBeforeTheyBegin(t *testing.T) {
	endpoint, stopEtcd := etcdtest.Start(t, nil)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	catalog := replicas.NewCatalog(cli, "/nave/")
	s := startState(t)
	sessions := catalogFirst{state: s, catalog: catalog, log: slog.New(slog.DiscardHandler)}
	ctx := t.Context()
	record := func(id registry.ClusterID) (replicas.ClusterRecord, bool) {
		t.Helper()
		list, err := catalog.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list {
			if r.Cluster == id {
				return r, true
			}
		}
		return replicas.ClusterRecord{}, false
	}
	epoch := func(id registry.ClusterID) uint64 {
		t.Helper()
		e, err := catalog.NextEpoch(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	begins := func(id registry.ClusterID) bool { _, ok := s.View().Clusters[id]; return ok }

	// A new cluster.
	started := time.Now()
	e1 := epoch("east")
	if _, err := sessions.Begin(ctx, federation.Session{Cluster: "east", Network: "n1", SpokeID: "s1", Build: "b1", Epoch: e1, Started: started}); err != nil {
		t.Fatal(err)
	}
	r, ok := record("east")
	if !ok || r.Epoch != e1 || r.Network != "n1" || r.SpokeID != "s1" || r.Build != "b1" ||
		!r.FirstSeen.Equal(started) || !r.LastSeen.Equal(started) || !r.LiveAt.Equal(started) {
		t.Fatalf("east's record: %+v (found %v), want epoch %d, n1, s1, b1, seen live at %v", r, ok, e1, started)
	}
	if !begins("east") {
		t.Fatal("east's session did not begin")
	}

	// A known cluster: the session leaves its record as it is.
	kept := r
	kept.LiveAt, kept.LastSeen = started.Add(time.Second), started.Add(time.Second)
	if _, err := catalog.RecordAll(ctx, []replicas.ClusterRecord{kept}); err != nil {
		t.Fatal(err)
	}
	if _, err := sessions.Begin(ctx, federation.Session{Cluster: "east", Network: "n2", SpokeID: "s2", Epoch: epoch("east"), Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if r, _ := record("east"); r.Network != "n1" || r.SpokeID != "s1" || r.Epoch != e1 || !r.LiveAt.Equal(kept.LiveAt) {
		t.Errorf("a session of the known east rewrote its record: %+v, want %+v", r, kept)
	}

	// A new cluster whose epoch passed (a newer session, or a drop) before its record was written.
	old, newer := epoch("west"), epoch("west")
	if _, err := sessions.Begin(ctx, federation.Session{Cluster: "west", Epoch: old, Started: time.Now()}); !errors.Is(err, federation.ErrSuperseded) {
		t.Fatalf("west's session of a passed epoch: %v, want superseded", err)
	}
	if _, ok := record("west"); ok || begins("west") {
		t.Fatalf("west's superseded session recorded it (%v) or began (%v)", ok, begins("west"))
	}
	if _, err := sessions.Begin(ctx, federation.Session{Cluster: "west", Epoch: newer, Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if r, ok := record("west"); !ok || r.Epoch != newer {
		t.Fatalf("west's record: %+v (found %v), want epoch %d", r, ok, newer)
	}

	// etcd unreachable: refused when the session's bound runs out, not
	// etcdTimeout later. The bound has run out before Begin is called (it
	// would run out while Begin waits on etcd just the same): the refusal
	// is the bound's, context.Canceled, not etcdTimeout's DeadlineExceeded.
	stopEtcd()
	bound, cancel := context.WithCancel(ctx)
	cancel()
	_, err = sessions.Begin(bound, federation.Session{Cluster: "north", Epoch: 1, Started: time.Now()})
	if err == nil || errors.Is(err, federation.ErrSuperseded) || !errors.Is(err, context.Canceled) {
		t.Fatalf("north's session with etcd down, its bound run out: %v, want refused by its bound (context canceled)", err)
	}
	if begins("north") {
		t.Error("north's session began without its record")
	}
}
