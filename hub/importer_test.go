package hub

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
)

// importerRound hands im a registry of the shards, as the state would (a
// change, then a view), and runs a round.
func importerRound(t *testing.T, im *importer, clusters map[registry.ClusterID]ClusterStatus, shards ...*registry.Shard) {
	t.Helper()
	reg := registry.New()
	var diff registry.Diff
	for _, s := range shards {
		var d registry.Diff
		reg, d = reg.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
		diff.Services = append(diff.Services, d.Services...)
	}
	im.Update(reg, diff)
	im.round(context.Background(), View{Registry: reg, Clusters: clusters})
}

func webShard(cluster registry.ClusterID, headless bool) *registry.Shard {
	s := &registry.Shard{Cluster: cluster, Service: registry.ServiceKey{Namespace: "default", Name: "web"}, Headless: headless,
		Ports: []registry.ServicePort{{Name: "http", Port: 80, Protocol: registry.ProtocolTCP}}}
	s.Normalize()
	return s
}

// A set is authoritative only when the hub knows which clusters there are
// and holds every one of them, and no import waits for its IP: an empty or
// unread catalog is trusted only after the grace.
func TestImporterAuthority(t *testing.T) {
	held := clusterStatus(adminapi.ClusterStatus{Cluster: "east", LastUpdate: time.Now()})
	known := clusterStatus(adminapi.ClusterStatus{Cluster: "west"}) // in the catalog, no data yet
	im := newImporter(nil, nil, time.Hour, slog.New(slog.DiscardHandler))
	importerRound(t, im, map[registry.ClusterID]ClusterStatus{"east": held}, webShard("east", true))
	if set, _ := im.Imports(); set.Authoritative || set.Imports.Len() != 1 {
		t.Fatalf("without a catalog, within the grace: authoritative=%v, %d imports; want not authoritative", set.Authoritative, set.Imports.Len())
	}
	im.catalogRead.Store(true)
	importerRound(t, im, map[registry.ClusterID]ClusterStatus{"east": held, "west": known}, webShard("east", true))
	if set, _ := im.Imports(); set.Authoritative {
		t.Fatal("authoritative while a cluster of the catalog has no data")
	}
	known.Stale = true
	importerRound(t, im, map[registry.ClusterID]ClusterStatus{"east": held, "west": known}, webShard("east", true))
	if set, _ := im.Imports(); !set.Authoritative {
		t.Fatal("not authoritative with every cluster held or stale")
	}

	// Without a catalog, the grace passing makes it authoritative.
	late := newImporter(nil, nil, time.Nanosecond, slog.New(slog.DiscardHandler))
	importerRound(t, late, map[registry.ClusterID]ClusterStatus{"east": held}, webShard("east", true))
	if set, _ := late.Imports(); !set.Authoritative {
		t.Fatal("not authoritative after the grace")
	}
}

// A ClusterSetIP service whose IP cannot be claimed waits, and the set is
// not authoritative meanwhile (a spoke would delete its import).
func TestImporterWaitingForAnIPIsNotAuthoritative(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ips, err := replicas.NewClusterSetIPs(cli, "/nave/", []netip.Prefix{netip.MustParsePrefix("243.0.0.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	im := newImporter(ips, []string{"243.0.0.0/24"}, time.Nanosecond, slog.New(slog.DiscardHandler))
	im.claimTimeout = 50 * time.Millisecond
	importerRound(t, im, map[registry.ClusterID]ClusterStatus{"east": clusterStatus(adminapi.ClusterStatus{Cluster: "east", LastUpdate: time.Now()})},
		webShard("east", false))
	set, _ := im.Imports()
	if set.Authoritative || set.Imports.Len() != 0 || !im.waiting[registry.ServiceKey{Namespace: "default", Name: "web"}] {
		t.Fatalf("authoritative=%v imports=%d waiting=%v; want the import waiting for its IP and the set not authoritative",
			set.Authoritative, set.Imports.Len(), im.waiting)
	}
}
