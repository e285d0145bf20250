package replicas

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/navemesh/nave/internal/etcdtest"
	"github.com/navemesh/nave/registry"
)

// A dropped cluster leaves the catalog, unless its spoke came back since;
// its epochs go on from where they were.
func TestCatalogForgetsADroppedCluster(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	cat := NewCatalog(dialEtcd(t, endpoint), "/nave/")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now()
	for _, r := range []ClusterRecord{{Cluster: "east", Epoch: 3, FirstSeen: now}, {Cluster: "west", Epoch: 9, FirstSeen: now}} {
		if err := cat.Record(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := cat.NextEpoch(ctx, "east"); err != nil {
			t.Fatal(err)
		}
	}
	if gone, err := cat.Forget(ctx, "east", 4); err != nil || !gone {
		t.Fatalf("Forget(east, drop epoch 4) = %v, %v; want forgotten", gone, err)
	}
	if gone, err := cat.Forget(ctx, "west", 5); err != nil || gone {
		t.Fatalf("Forget(west recorded at epoch 9, drop epoch 5) = %v, %v; want kept", gone, err)
	}
	if gone, err := cat.Forget(ctx, "north", 1); err != nil || gone {
		t.Fatalf("Forget(unknown) = %v, %v", gone, err)
	}
	list, err := cat.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Cluster != "west" {
		t.Errorf("catalog %+v, want west only", list)
	}
	if e, err := cat.NextEpoch(ctx, "east"); err != nil || e != 4 {
		t.Errorf("east's next epoch after forgetting = %d, %v; its counter must go on", e, err)
	}
}

// The leader writes records in batches, each only while it leads: a term
// that has lost leadership writes and forgets nothing.
func TestCatalogRecordAllIsBatchedAndFenced(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	cli := dialEtcd(t, endpoint)
	cat := NewCatalog(cli, "/nave/")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A leader key, as a term of Lead holds one.
	key := "/nave/leader/term"
	put, err := cli.Put(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	term := context.WithValue(ctx, leaderFenceKey{}, leaderFence{key: key, rev: put.Header.Revision})
	now := time.Now().UTC()
	var records []ClusterRecord
	for i := range 3*maxRecordsPerTxn + 1 { // more than one transaction holds
		records = append(records, ClusterRecord{Cluster: registry.ClusterID(fmt.Sprintf("c%03d", i)), Epoch: 1, FirstSeen: now, LiveAt: now})
	}
	if written, err := cat.RecordAll(term, records); err != nil || len(written) != len(records) {
		t.Fatalf("RecordAll wrote %d, %v; want all %d", len(written), err, len(records))
	}
	list, err := cat.List(ctx)
	if err != nil || len(list) != len(records) || !list[7].LiveAt.Equal(now) {
		t.Fatalf("catalog after RecordAll: %d records, %v", len(list), err)
	}

	if gone, err := cat.Forget(term, "c001", 2); err != nil || !gone {
		t.Fatalf("Forget(c001) of the leader = %v, %v; want forgotten", gone, err)
	}
	if gone, err := cat.Forget(term, "c002", 1); err != nil || gone {
		t.Fatalf("Forget(c002 recorded at the drop's epoch) = %v, %v; want kept", gone, err)
	}
	held := len(records) - 1 // c001 is gone

	// Leadership lost: the key is gone.
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	late := []ClusterRecord{{Cluster: "late", Epoch: 1, FirstSeen: now}}
	if written, err := cat.RecordAll(term, late); !errors.Is(err, ErrNotLeader) || len(written) != 0 {
		t.Errorf("RecordAll of a deposed leader wrote %d, %v; want ErrNotLeader", len(written), err)
	}
	if gone, err := cat.Forget(term, "c000", 2); !errors.Is(err, ErrNotLeader) || gone {
		t.Errorf("Forget of a deposed leader = %v, %v; want ErrNotLeader", gone, err)
	}
	if list, _ := cat.List(ctx); len(list) != held || list[0].Cluster != "c000" {
		t.Errorf("a deposed leader changed the catalog: %d records, want %d", len(list), held)
	}
}

// One record never stops another's: a record over MaxRecordBytes, or one
// etcd refuses as too large, is left out alone, and the records batched
// with it are written (a 1.6 MiB spoke build once made the leader's whole
// batched write fail, and other clusters' drop timers went unrecorded).
func TestCatalogRecordAllWritesEveryRecordButTheOneTooLarge(t *testing.T) {
	srv := etcdtest.StartTuned(t, nil, func(c *embed.Config) { c.MaxRequestBytes = 8 << 10 })
	cat := NewCatalog(dialEtcd(t, srv.Endpoint), "/nave/")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UTC()
	record := func(id string, network int) ClusterRecord {
		return ClusterRecord{Cluster: registry.ClusterID(id), Epoch: 1, FirstSeen: now, LiveAt: now, Network: registry.Network(strings.Repeat("n", network))}
	}
	legacy := record("d", 0)
	legacy.Build = strings.Repeat("b", 1600<<10) // an older hub's unbounded hello: cut, and written
	records := []ClusterRecord{
		record("a", 10), record("b", 10),
		record("big", 10<<10),    // under MaxRecordBytes, over etcd's 8 KiB request bound
		record("huge", 1600<<10), // over MaxRecordBytes: never sent
		record("c", 10), legacy,
	}
	written, err := cat.RecordAll(ctx, records)
	if err == nil || !strings.Contains(err.Error(), "catalog entry big") || !strings.Contains(err.Error(), "catalog entry huge") {
		t.Errorf("RecordAll: %v; want errors naming big and huge", err)
	}
	var got []string
	for _, r := range written {
		got = append(got, string(r.Cluster))
	}
	if want := []string{"a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("RecordAll wrote %v, want %v", got, want)
	}
	list, err := cat.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, r := range list {
		got = append(got, string(r.Cluster))
		if len(r.Build) > maxRecordField {
			t.Errorf("the catalog holds %s with a build of %d bytes, want it cut to %d", r.Cluster, len(r.Build), maxRecordField)
		}
	}
	if want := []string{"a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("the catalog holds %v, want %v", got, want)
	}
}
