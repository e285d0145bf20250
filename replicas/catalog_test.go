package replicas

import (
	"context"
	"testing"
	"time"
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
