package replicas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/navemesh/nave/registry"
)

// testSnapshot builds a valid snapshot of revision rev: clusters × services ×
// endpoints with random addresses and hostnames, which gzip cannot shrink
// much (about 45 bytes an endpoint).
func testSnapshot(rev uint64, clusters, services, endpoints int) registry.Snapshot {
	rng := rand.New(rand.NewPCG(rev, 7))
	word := func(n int) string {
		const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
		b := make([]byte, n)
		for i := range b {
			b[i] = letters[rng.IntN(26+10*min(i, 1))] // starts with a letter
		}
		return string(b)
	}
	snap := registry.Snapshot{Revision: rev, Taken: time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)}
	for c := range clusters {
		id := registry.ClusterID(fmt.Sprintf("c%d", c))
		sc := registry.SnapshotCluster{Cluster: id, Network: "n1", Epoch: 2, Version: rev}
		for s := range services {
			sh := &registry.Shard{Cluster: id, Service: registry.ServiceKey{Namespace: "ns", Name: fmt.Sprintf("svc-%d", s)},
				ExportedAt: snap.Taken, Ports: []registry.ServicePort{{Name: "http", Port: 80, Protocol: registry.ProtocolTCP}}}
			for range endpoints {
				var a [16]byte
				for i := range a {
					a[i] = byte(rng.Uint32())
				}
				a[0] = 0xfd // unique local unicast
				sh.Endpoints = append(sh.Endpoints, registry.Endpoint{
					Addresses:  []netip.Addr{netip.AddrFrom16(a)},
					Ports:      []registry.EndpointPort{{Name: "http", Port: 8080}},
					Hostname:   word(40),
					Conditions: registry.Conditions{Ready: true, Serving: true},
				})
			}
			sh.Normalize()
			sc.Shards = append(sc.Shards, sh)
		}
		// As the registry lists them, and the encoding keeps them.
		slices.SortFunc(sc.Shards, func(a, b *registry.Shard) int { return a.Service.Compare(b.Service) })
		snap.Clusters = append(snap.Clusters, sc)
	}
	return snap
}

// sameSnapshot reports whether two snapshots say the same thing.
func sameSnapshot(a, b registry.Snapshot) bool {
	if a.Revision != b.Revision || !a.Taken.Equal(b.Taken) || len(a.Clusters) != len(b.Clusters) {
		return false
	}
	for i, ca := range a.Clusters {
		cb := b.Clusters[i]
		if ca.Cluster != cb.Cluster || ca.Network != cb.Network || ca.Epoch != cb.Epoch || ca.Version != cb.Version ||
			!slices.EqualFunc(ca.Shards, cb.Shards, (*registry.Shard).Equal) {
			return false
		}
	}
	return true
}

// keysUnder lists the keys under prefix, with the size of each value.
func keysUnder(t *testing.T, cli *clientv3.Client, prefix string) map[string]int {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), prefix)] = len(kv.Value)
	}
	return out
}

func testStore(t *testing.T, maxBytes int) (*SnapshotStore, *clientv3.Client, string) {
	t.Helper()
	_, endpoint := embeddedEtcd(t)
	cli := dialEtcd(t, endpoint)
	prefix := "/" + strings.ReplaceAll(t.Name(), "/", "_") + "/"
	return NewSnapshotStore(cli, prefix, maxBytes), cli, prefix
}

func load(t *testing.T, s *SnapshotStore) (registry.Snapshot, bool) {
	t.Helper()
	snap, ok, err := s.Load(context.Background())
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return snap, ok
}

func TestSnapshotStoreRoundTripInChunks(t *testing.T) {
	store, cli, prefix := testStore(t, 0)
	if _, ok := load(t, store); ok {
		t.Fatal("Load found a snapshot in an empty store")
	}
	ctx := context.Background()
	big := testSnapshot(5, 2, 220, 50)
	n, err := store.Save(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	if n <= snapshotChunkBytes {
		t.Fatalf("Save wrote %d bytes, want more than one chunk", n)
	}
	keys := keysUnder(t, cli, prefix+"snapshots/")
	chunks := (n + snapshotChunkBytes - 1) / snapshotChunkBytes
	if len(keys) != chunks+1 {
		t.Errorf("keys %v, want %d chunks and the pointer", keys, chunks)
	}
	for i := range chunks {
		key := fmt.Sprintf("%020d/%04d", 5, i)
		if size, ok := keys[key]; !ok || size > snapshotChunkBytes {
			t.Errorf("chunk %s: %d bytes (present %t), want at most %d", key, size, ok, snapshotChunkBytes)
		}
	}
	got, ok := load(t, store)
	if !ok || !sameSnapshot(got, big) {
		t.Fatalf("Load returned revision %d (found %t), not what was saved", got.Revision, ok)
	}
	t.Logf("%d endpoints: %d bytes in %d chunks", 2*220*50, n, chunks)

	// A newer snapshot replaces it, and the older chunks go.
	small := testSnapshot(6, 1, 2, 2)
	if _, err := store.Save(ctx, small); err != nil {
		t.Fatal(err)
	}
	keys = keysUnder(t, cli, prefix+"snapshots/")
	if _, ok := keys[fmt.Sprintf("%020d/0000", 6)]; !ok || len(keys) != 2 {
		t.Errorf("after saving revision 6, keys are %v, want its one chunk and the pointer", keys)
	}
	if got, _ := load(t, store); !sameSnapshot(got, small) {
		t.Errorf("Load returned revision %d, want 6", got.Revision)
	}
}

func TestSnapshotStoreRefusesOlderRevisions(t *testing.T) {
	store, cli, prefix := testStore(t, 0)
	ctx := context.Background()
	if _, err := store.Save(ctx, testSnapshot(10, 1, 3, 3)); err != nil {
		t.Fatal(err)
	}
	before := keysUnder(t, cli, prefix)
	for _, rev := range []uint64{9, 10, 1} {
		_, err := store.Save(ctx, testSnapshot(rev, 1, 3, 3))
		if !errors.Is(err, ErrSnapshotSuperseded) {
			t.Errorf("saving revision %d over 10: %v, want ErrSnapshotSuperseded", rev, err)
		}
	}
	if after := keysUnder(t, cli, prefix); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("refused saves changed the keys: %v, were %v", after, before)
	}
	if got, _ := load(t, store); got.Revision != 10 {
		t.Errorf("Load returned revision %d, want 10", got.Revision)
	}
}

func TestSnapshotStoreRefusesTooLargeSnapshots(t *testing.T) {
	store, cli, prefix := testStore(t, 8<<10)
	ctx := context.Background()
	if _, err := store.Save(ctx, testSnapshot(1, 1, 2, 2)); err != nil {
		t.Fatal(err)
	}
	before := keysUnder(t, cli, prefix)
	_, err := store.Save(ctx, testSnapshot(2, 1, 20, 20))
	if !errors.Is(err, ErrSnapshotTooLarge) || !strings.Contains(err.Error(), "more than the limit of 8192") {
		t.Fatalf("saving a large snapshot: %v, want ErrSnapshotTooLarge", err)
	}
	if after := keysUnder(t, cli, prefix); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a refused save changed the keys: %v, were %v", after, before)
	}
	if got, _ := load(t, store); got.Revision != 1 {
		t.Errorf("Load returned revision %d, want 1", got.Revision)
	}
	if s := NewSnapshotStore(cli, prefix, 0); s.maxBytes != DefaultMaxSnapshotBytes {
		t.Errorf("default limit %d, want %d", s.maxBytes, DefaultMaxSnapshotBytes)
	}
	if s := NewSnapshotStore(cli, prefix, 1<<30); s.maxBytes != maxSnapshotChunks*snapshotChunkBytes {
		t.Errorf("limit %d, want it lowered to what one Txn can switch (%d)", s.maxBytes, maxSnapshotChunks*snapshotChunkBytes)
	}
}

func TestSnapshotStoreDetectsCorruption(t *testing.T) {
	for _, tc := range []struct {
		name string
		harm func(t *testing.T, cli *clientv3.Client, dir string)
		want string
	}{
		{"flipped byte", func(t *testing.T, cli *clientv3.Client, dir string) {
			key := dir + fmt.Sprintf("%020d/0001", 3)
			resp, err := cli.Get(context.Background(), key)
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("chunk %s: %v %v", key, resp, err)
			}
			v := bytes.Clone(resp.Kvs[0].Value)
			v[len(v)/2] ^= 1
			if _, err := cli.Put(context.Background(), key, string(v)); err != nil {
				t.Fatal(err)
			}
		}, "does not match the pointer's"},
		{"missing chunk", func(t *testing.T, cli *clientv3.Client, dir string) {
			if _, err := cli.Delete(context.Background(), dir+fmt.Sprintf("%020d/0001", 3)); err != nil {
				t.Fatal(err)
			}
		}, "chunk 2 of 2"},
		{"longer chunk", func(t *testing.T, cli *clientv3.Client, dir string) {
			if _, err := cli.Put(context.Background(), dir+fmt.Sprintf("%020d/0001", 3), strings.Repeat("x", snapshotChunkBytes)); err != nil {
				t.Fatal(err)
			}
		}, "more than the"},
		{"garbage pointer", func(t *testing.T, cli *clientv3.Client, dir string) {
			if _, err := cli.Put(context.Background(), dir+"current", "{"); err != nil {
				t.Fatal(err)
			}
		}, "pointer"},
		{"pointer to nothing", func(t *testing.T, cli *clientv3.Client, dir string) {
			if _, err := cli.Put(context.Background(), dir+"current", `{"revision":4,"chunks":1,"bytes":10,"sha256":"00"}`); err != nil {
				t.Fatal(err)
			}
		}, "is not a sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, cli, prefix := testStore(t, 0)
			store.chunkBytes = 8 << 10 // two chunks of a small snapshot
			if _, err := store.Save(context.Background(), testSnapshot(3, 1, 20, 12)); err != nil {
				t.Fatal(err)
			}
			if got := len(keysUnder(t, cli, prefix+"snapshots/")); got != 3 {
				t.Fatalf("%d keys, want 2 chunks and the pointer", got)
			}
			tc.harm(t, cli, prefix+"snapshots/")
			_, ok, err := store.Load(context.Background())
			if !errors.Is(err, ErrSnapshotCorrupt) || ok || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load: found %t, %v; want ErrSnapshotCorrupt saying %q", ok, err, tc.want)
			}
			// The next save replaces what is broken.
			next := testSnapshot(5, 1, 2, 2)
			if _, err := store.Save(context.Background(), next); err != nil {
				t.Fatalf("saving over a corrupt snapshot: %v", err)
			}
			if got, _ := load(t, store); !sameSnapshot(got, next) {
				t.Errorf("Load after a new save returned revision %d, want 5", got.Revision)
			}
		})
	}
}

func TestSnapshotStoreKeepsThePreviousSnapshotThroughACrashedSave(t *testing.T) {
	store, cli, prefix := testStore(t, 0)
	ctx := context.Background()
	first := testSnapshot(1, 1, 3, 3)
	if _, err := store.Save(ctx, first); err != nil {
		t.Fatal(err)
	}
	// Saves of revisions 2 and 3 crashed after writing some chunks.
	dir := prefix + "snapshots/"
	for _, key := range []string{fmt.Sprintf("%020d/0000", 2), fmt.Sprintf("%020d/0000", 3), fmt.Sprintf("%020d/0007", 3)} {
		if _, err := cli.Put(ctx, dir+key, "partial"); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := load(t, store); !sameSnapshot(got, first) {
		t.Fatalf("Load returned revision %d, want 1", got.Revision)
	}
	// Saving revision 3 again replaces its leftovers and deletes the older ones.
	third := testSnapshot(3, 1, 4, 4)
	if _, err := store.Save(ctx, third); err != nil {
		t.Fatal(err)
	}
	keys := keysUnder(t, cli, dir)
	if _, ok := keys[fmt.Sprintf("%020d/0000", 3)]; !ok || len(keys) != 2 {
		t.Errorf("keys %v, want revision 3's one chunk and the pointer", keys)
	}
	if got, _ := load(t, store); !sameSnapshot(got, third) {
		t.Errorf("Load returned revision %d, want 3", got.Revision)
	}
}

func TestSnapshotStoreConcurrentWritersKeepTheNewest(t *testing.T) {
	store, cli, prefix := testStore(t, 0)
	ctx := context.Background()
	const writers, each = 4, 8
	var mu sync.Mutex
	var saved []uint64
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				rev := uint64(i*writers + w + 1) // the writers interleave revisions
				_, err := store.Save(ctx, testSnapshot(rev, 1, 3, 3))
				switch {
				case err == nil:
					mu.Lock()
					saved = append(saved, rev)
					mu.Unlock()
				case !errors.Is(err, ErrSnapshotSuperseded):
					t.Errorf("writer %d saving %d: %v", w, rev, err)
				}
				if snap, ok, err := store.Load(ctx); err != nil || !ok {
					t.Errorf("Load during saves: %v (found %t)", err, ok)
				} else if _, err := EncodeSnapshot(snap); err != nil {
					t.Errorf("Load during saves returned an invalid snapshot: %v", err)
				}
			}
		})
	}
	wg.Wait()
	newest := uint64(0)
	for _, r := range saved {
		newest = max(newest, r)
	}
	got, _ := load(t, store)
	if got.Revision != newest || !sameSnapshot(got, testSnapshot(newest, 1, 3, 3)) {
		t.Errorf("Load returned revision %d, want the newest saved, %d (saved %v)", got.Revision, newest, saved)
	}
	for key := range keysUnder(t, cli, prefix+"snapshots/") {
		if key != "current" && !strings.HasPrefix(key, fmt.Sprintf("%020d/", newest)) {
			// Only a save that lost its switch to a newer one may leave chunks behind (the next save deletes them).
			if rev := strings.SplitN(key, "/", 2)[0]; rev > fmt.Sprintf("%020d", newest) {
				t.Errorf("chunk %s of a revision newer than the current one", key)
			}
		}
	}
	t.Logf("%d of %d saves succeeded", len(saved), writers*each)
}

func TestSnapshotSaveWithinATermNeedsLeadership(t *testing.T) {
	store, cli, prefix := testStore(t, 0)
	cfg := testLeaderConfig(t, 5)
	cfg.Prefix = prefix
	terms := make(chan context.Context, 10)
	startReplica(t, cli, cfg, "hub-a", func(ctx context.Context) {
		terms <- ctx
		<-ctx.Done()
	})
	var term context.Context
	select {
	case term = <-terms:
	case <-time.After(10 * time.Second):
		t.Fatal("no term")
	}
	if _, err := store.Save(term, testSnapshot(1, 1, 2, 2)); err != nil {
		t.Fatalf("a leader's save: %v", err)
	}

	// The lease goes; a save with the old term's fence (as a deposed leader
	// that has not noticed would make) must not land.
	resp, err := cli.Get(context.Background(), electionPrefix(cfg.Prefix)+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("leader keys: %v, %v", resp, err)
	}
	if _, err := cli.Revoke(context.Background(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	<-term.Done()
	deposed := context.WithoutCancel(term)
	before := keysUnder(t, cli, prefix+"snapshots/")
	if _, err := store.Save(deposed, testSnapshot(2, 1, 2, 2)); !errors.Is(err, ErrNotLeader) {
		t.Errorf("a deposed leader's save: %v, want ErrNotLeader", err)
	}
	if after := keysUnder(t, cli, prefix+"snapshots/"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a deposed leader's save changed the keys: %v, were %v", after, before)
	}
	if got, _ := load(t, store); got.Revision != 1 {
		t.Errorf("Load returned revision %d, want 1", got.Revision)
	}
}

// A store told to write format 1 writes what versions before format 2 read,
// and reads it back; it refuses formats it does not know.
func TestSnapshotStoreWritesFormat1OnRequest(t *testing.T) {
	ctx := context.Background()
	store, cli, prefix := testStore(t, 0)
	if err := store.WriteFormat(1); err != nil {
		t.Fatal(err)
	}
	snap := testSnapshot(1, 2, 3, 2)
	if _, err := store.Save(ctx, snap); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, prefix+"snapshots/00000000000000000001/0000")
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("first chunk: %v", err)
	}
	if v := resp.Kvs[0].Value; len(v) < 9 || v[8] != 1 {
		t.Fatalf("stored snapshot is not format 1: % x", v[:min(len(v), 9)])
	}
	if got, err := registry.DecodeSnapshot(resp.Kvs[0].Value); err != nil || !sameSnapshot(got, snap) {
		t.Fatalf("a format 1 reader: %v", err)
	}
	if got, _ := load(t, store); !sameSnapshot(got, snap) {
		t.Fatal("the store does not read back what it wrote")
	}
	if err := store.WriteFormat(3); err == nil {
		t.Fatal("format 3 accepted")
	}
}
