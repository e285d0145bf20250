package replicas

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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
	if n, err := cat.RecordAll(term, records); err != nil || n != len(records) {
		t.Fatalf("RecordAll = %d, %v; want all %d", n, err, len(records))
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
	if n, err := cat.RecordAll(term, late); !errors.Is(err, ErrNotLeader) || n != 0 {
		t.Errorf("RecordAll of a deposed leader = %d, %v; want ErrNotLeader", n, err)
	}
	if gone, err := cat.Forget(term, "c000", 2); !errors.Is(err, ErrNotLeader) || gone {
		t.Errorf("Forget of a deposed leader = %v, %v; want ErrNotLeader", gone, err)
	}
	if list, _ := cat.List(ctx); len(list) != held || list[0].Cluster != "c000" {
		t.Errorf("a deposed leader changed the catalog: %d records, want %d", len(list), held)
	}
}
