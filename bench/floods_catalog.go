package main

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// readCatalog opens the embedded etcd of a stopped hub's dataDir (as
// dropSnapshots does, catalog.go) and returns the cluster catalog's records.
func readCatalog(ctx context.Context, dataDir string) (map[registry.ClusterID]replicas.ClusterRecord, error) {
	out := map[registry.ClusterID]replicas.ClusterRecord{}
	err := withHubEtcd(ctx, dataDir, func(ctx context.Context, cli *clientv3.Client) error {
		get, err := cli.Get(ctx, hubEtcdPrefix+"clusters/", clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("read the catalog: %w", err)
		}
		for _, kv := range get.Kvs {
			var r replicas.ClusterRecord
			if err := json.Unmarshal(kv.Value, &r); err != nil {
				return fmt.Errorf("catalog record %s: %w", kv.Key, err)
			}
			out[r.Cluster] = r
		}
		return nil
	})
	return out, err
}
