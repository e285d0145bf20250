package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/etcdtest"
	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
	"github.com/navemesh/nave/xds"
)

// startReplicas runs three hub replicas (a, b, c) over one real etcd,
// gossiping, and the demo's east spoke at a; it returns them once each
// serves demo/echo and a lists all three as members.
func startReplicas(t *testing.T) []*hub.Hub {
	t.Helper()
	endpoint, stopEtcd := etcdtest.Start(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.DiscardHandler)
	ids := []string{"a", "b", "c"}
	gossip := make([]string, len(ids))
	for i := range gossip {
		addr, err := nettest.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		gossip[i] = addr
	}
	var hubs []*hub.Hub
	for i, id := range ids {
		cfg := hub.DefaultConfig()
		cfg.ID, cfg.DataDir, cfg.EtcdEndpoints = id, t.TempDir(), []string{endpoint}
		cfg.FederationAddr, cfg.XDSAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		cfg.GossipAddr, cfg.AdvertiseHost, cfg.FastGossip = gossip[i], "127.0.0.1", true
		cfg.Join = append(append([]string{}, gossip[:i]...), gossip[i+1:]...)
		h, err := hub.Start(ctx, cfg, log)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		hubs = append(hubs, h)
	}
	sc := spoke.DefaultConfig()
	sc.Cluster, sc.Region, sc.HubAddr = "east", "us-east", hubs[0].FederationAddr.String()
	sc.Source = "dir:" + filepath.Join("..", "..", "deploy", "demo", "east")
	spokeDone := make(chan error, 1)
	go func() { spokeDone <- spoke.Run(ctx, sc, log) }()
	t.Cleanup(func() {
		cancel()
		<-spokeDone
		for _, h := range hubs {
			_ = h.Wait()
		}
		stopEtcd()
	})
	await(t, "every replica serving demo/echo and a knowing all three", 30*time.Second, func() bool {
		for _, h := range hubs {
			if len(h.View().Registry.Services()) != 1 {
				return false
			}
		}
		var coord adminapi.Coordination
		c := client{base: "http://" + hubs[0].AdminAddr.String()}
		return c.get("/debug/hub", &coord) == nil && len(coord.Members) == 3
	})
	return hubs
}

func await(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
	}
}

// TestProxiesMergesReplicas: three replicas, a client at each, and
// `navectl proxies` at one of them shows all three: a real grpc-go client
// that took everything (SYNCED, at b), a client that rejected its
// endpoints (NACKED with its reason, at a) and one whose connection froze
// before it answered (STALE, at c). `navectl proxies NODE` shows one in full.
func TestProxiesMergesReplicas(t *testing.T) {
	hubs := startReplicas(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cla := xds.ClusterName(registry.ServiceKey{Namespace: "demo", Name: "echo"}, 8080)

	// At b: a real grpc-go client; a call makes it resolve (nothing answers at the demo's addresses).
	synced := xdstest.NewClient(t, hubs[1].XDSAddr.String(), "grpc-synced", registry.Locality{Region: "us-east", Zone: "us-east-1a"},
		"echo.demo.svc.clusterset.local:8080")
	callCtx, callCancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, _ = synced.Check(callCtx, &healthpb.HealthCheckRequest{})
	callCancel()

	// At a and c: raw ADS streams asking for echo's endpoints.
	stream := func(h *hub.Hub, node string) (discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, *discovery.DiscoveryResponse) {
		conn, err := grpc.NewClient(h.XDSAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := &core.Node{Id: node, Locality: &core.Locality{Region: "us-west"}}
		if err := st.Send(&discovery.DiscoveryRequest{Node: n, TypeUrl: resource.EndpointType, ResourceNames: []string{cla}}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return st, resp
	}
	nacker, resp := stream(hubs[0], "raw-nacker")
	if err := nacker.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{cla}, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: 3, Message: "priority 1 has no endpoints"}}); err != nil {
		t.Fatal(err)
	}
	stream(hubs[2], "raw-frozen") // never answers

	url := "http://" + hubs[0].AdminAddr.String()
	var clients []adminapi.Client
	defer func() {
		if t.Failed() {
			raw, _ := json.MarshalIndent(clients, "", "  ")
			t.Logf("last clients seen: %s", raw)
		}
	}()
	await(t, "three clients in three states", 20*time.Second, func() bool {
		clients = nil
		var out strings.Builder
		if err := run([]string{"--hub", url, "-o", "json", "proxies"}, &out); err != nil {
			return false
		}
		if err := json.Unmarshal([]byte(out.String()), &clients); err != nil {
			t.Fatal(err)
		}
		if len(clients) != 3 {
			return false
		}
		want := map[string][2]string{"grpc-synced": {"b", adminapi.Synced}, "raw-nacker": {"a", adminapi.Nacked}, "raw-frozen": {"c", adminapi.Stale}}
		for _, c := range clients {
			if w := want[c.NodeID]; c.Replica != w[0] || c.State != w[1] {
				return false
			}
		}
		// The grpc-go client has taken all four types.
		for _, c := range clients {
			if c.NodeID == "grpc-synced" && len(c.Types) != 4 {
				return false
			}
		}
		return true
	})

	table := navectl(t, "--hub", url, "proxies")
	t.Logf("navectl proxies:\n%s", table)
	for _, want := range []string{"NODE", "grpc-synced", "raw-nacker", "raw-frozen", "us-east/us-east-1a", "NACKED", "STALE (",
		"3 clients: 1 synced, 1 stale, 1 nacked"} {
		if !strings.Contains(table, want) {
			t.Errorf("proxies table lacks %q:\n%s", want, table)
		}
	}
	if rows := strings.Count(table, "SYNCED"); rows < 5 { // the synced client's state and its four types
		t.Errorf("proxies table shows SYNCED %d times, want the synced client's state and its four types:\n%s", rows, table)
	}

	one := navectl(t, "--hub", url, "clients", "raw-nacker")
	t.Logf("navectl clients raw-nacker:\n%s", one)
	for _, want := range []string{"node raw-nacker", "at replica a", "state: NACKED", "still rejecting", "priority 1 has no endpoints", cla,
		"the client rejected it, and has accepted no response carrying it since"} {
		if !strings.Contains(one, want) {
			t.Errorf("proxies raw-nacker lacks %q:\n%s", want, one)
		}
	}
	if out := navectl(t, "--hub", url, "proxies", "grpc-synced"); !strings.Contains(out, "holds what this replica would send it now") ||
		strings.Contains(out, "differs from") {
		t.Errorf("the synced client should hold what its replica would send:\n%s", out)
	}
	// Every replica traced east's services arriving (at a from the spoke, at b and c by replication).
	trace := navectl(t, "--hub", url, "trace", "demo/echo", "--limit", "1")
	t.Logf("navectl trace demo/echo:\n%s", trace)
	for _, want := range []string{"changes of demo/echo", "REPLICA", "\na ", "\nb ", "\nc ", "east"} {
		if !strings.Contains(trace, want) {
			t.Errorf("trace lacks %q:\n%s", want, trace)
		}
	}
	var out strings.Builder
	if err := run([]string{"--hub", url, "trace", "no-slash"}, &out); err == nil || !strings.Contains(err.Error(), "NAMESPACE/NAME") {
		t.Errorf("trace of a malformed service: %v", err)
	}
	if err := run([]string{"--hub", url, "proxies", "nobody"}, &out); err == nil || !strings.Contains(err.Error(), `no replica has a client of node "nobody"`) {
		t.Errorf("proxies of an unknown node: %v", err)
	}
}
