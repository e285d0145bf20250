package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// readCatalog opens the embedded etcd of a stopped hub's dataDir (as
// dropSnapshots does, catalog.go) and returns the cluster catalog's records.
func readCatalog(ctx context.Context, dataDir string) (map[registry.ClusterID]replicas.ClusterRecord, error) {
	clientAddr, err := nettest.FreeAddr()
	if err != nil {
		return nil, err
	}
	peerAddr, err := nettest.FreeAddr()
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("the hub's etcd: %w", err)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("open the hub's etcd in %s: %w", cfg.Dir, err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("the hub's etcd in %s not ready after 60s", cfg.Dir)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL.String()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	get, err := cli.Get(ctx, hubEtcdPrefix+"clusters/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the catalog: %w", err)
	}
	out := map[registry.ClusterID]replicas.ClusterRecord{}
	for _, kv := range get.Kvs {
		var r replicas.ClusterRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, fmt.Errorf("catalog record %s: %w", kv.Key, err)
		}
		out[r.Cluster] = r
	}
	return out, nil
}
