package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/navemesh/nave/internal/nettest"
)

// The cold restart with the catalog: the hub restarts on its data dir with
// its persisted snapshots deleted and its cluster catalog kept, as a
// replica finds etcd when it starts without a snapshot it can use (a new
// replica, a lost or unreadable snapshot). It knows which clusters exist,
// so --cold-start-wait holds xDS back until they resynced: no client
// should see a world in part. (The plain cold restart, on a fresh data dir,
// has no catalog either: nothing tells the hub what to wait for.)

// hubEtcdPrefix is where the hub keeps its keys (its --etcd-prefix default).
const hubEtcdPrefix = "/nave/"

// catalogAfterDrop is what dropSnapshots found and did.
type catalogAfterDrop struct {
	SnapshotKeysDeleted int64 `json:"snapshotKeysDeleted"`
	CatalogClusters     int64 `json:"catalogClusters"`
}

// dropSnapshots opens the embedded etcd of the stopped hub's dataDir (as
// the hub does), deletes every persisted snapshot, and counts the
// clusters the catalog still holds.
func dropSnapshots(ctx context.Context, dataDir string) (catalogAfterDrop, error) {
	var out catalogAfterDrop
	err := withHubEtcd(ctx, dataDir, func(ctx context.Context, cli *clientv3.Client) error {
		del, err := cli.Delete(ctx, hubEtcdPrefix+"snapshots/", clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("delete the snapshots: %w", err)
		}
		out.SnapshotKeysDeleted = del.Deleted
		get, err := cli.Get(ctx, hubEtcdPrefix+"clusters/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return fmt.Errorf("count the catalog: %w", err)
		}
		out.CatalogClusters = get.Count
		return nil
	})
	return out, err
}

// withHubEtcd opens the embedded etcd of a stopped hub's dataDir (as the hub
// does) and runs fn with a client of it, for 30 s at most.
func withHubEtcd(ctx context.Context, dataDir string, fn func(context.Context, *clientv3.Client) error) error {
	clientAddr, err := nettest.FreeAddr()
	if err != nil {
		return err
	}
	peerAddr, err := nettest.FreeAddr()
	if err != nil {
		return err
	}
	clientURL, peerURL := url.URL{Scheme: "http", Host: clientAddr}, url.URL{Scheme: "http", Host: peerAddr}
	cfg := embed.NewConfig()
	cfg.Name = "nave-hub" // the member name the hub gives it
	cfg.Dir = filepath.Join(dataDir, "etcd")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{filepath.Join(dataDir, "etcd-bench.log")}
	cfg.TickMs, cfg.ElectionMs = 10, 100
	if _, err := os.Stat(cfg.Dir); err != nil {
		return fmt.Errorf("the hub's etcd: %w", err)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("open the hub's etcd in %s: %w", cfg.Dir, err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return fmt.Errorf("the hub's etcd in %s not ready after 60s", cfg.Dir)
	case <-ctx.Done():
		return ctx.Err()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL.String()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return fn(ctx, cli)
}
