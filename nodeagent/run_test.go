package nodeagent

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/internal/xdstype"
	"github.com/navemesh/nave/registry"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// The hub computes a node's endpoints from what the agent says of its node.
func TestNodeCarriesLocalityClusterAndNetwork(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NodeName, cfg.Cluster, cfg.Network = "worker-1", "east", "net-east"
	n := node(cfg, registry.Locality{Region: "r1", Zone: "z1"})
	fields := n.GetMetadata().GetFields()
	if n.GetId() != "nave-node~worker-1" || n.GetLocality().GetRegion() != "r1" || n.GetLocality().GetZone() != "z1" ||
		fields[xdstype.MetadataCluster].GetStringValue() != "east" || fields[xdstype.MetadataNetwork].GetStringValue() != "net-east" {
		t.Fatalf("node %v: want ID nave-node~worker-1, locality r1/z1, CLUSTER_ID east, NETWORK net-east", n)
	}
	cfg.NodeID = "custom"
	if n := node(cfg, registry.Locality{}); n.GetId() != "custom" {
		t.Fatalf("--node-id custom gave ID %q", n.GetId())
	}
}

// A region and zone given win, and the Node is not read (no API server is
// needed); a part missing is read, and without an API server that is a
// clear error rather than a node served without locality.
func TestLocalityGivenWinsAndMissingIsRead(t *testing.T) {
	ctx := t.Context()
	cfg := DefaultConfig()
	cfg.NodeName, cfg.Kube = "worker-1", KubeAPI{}
	cfg.Locality = registry.Locality{Region: "r1", Zone: "z1"}
	if loc, err := nodeLocality(ctx, cfg, quiet()); err != nil || loc != cfg.Locality {
		t.Fatalf("given r1/z1: %v, %v", loc, err)
	}
	cfg.Locality.Zone = ""
	_, err := nodeLocality(ctx, cfg, quiet())
	if err == nil || !strings.Contains(err.Error(), "--zone") {
		t.Fatalf("zone missing and no API server: %v, want an error naming --zone", err)
	}
}

// The agent is ready, and serves its clients' status, while the hub is
// unreachable: it serves the last good state, and a node-local Service
// must keep sending the node's clients to it.
func TestReadyWithoutTheHub(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hubAddr, err := nettest.FreeAddr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	xdsAddr, err := nettest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := nettest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.HubAddr, cfg.XDSAddr, cfg.AdminAddr = hubAddr, xdsAddr, admin
	cfg.Locality = registry.Locality{Region: "r1", Zone: "z1"}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, quiet()) }()

	var clients Clients
	for {
		resp, err := http.Get("http://" + admin + "/debug/clients")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&clients)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("/debug/clients: %v", err)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the admin API never answered: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if len(clients.Clients) != 0 {
		t.Errorf("/debug/clients lists %d clients, want none", len(clients.Clients))
	}
	// A local client asks for a listener: the relay tries the hub, which is not there.
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "local"}, TypeUrl: resource.ListenerType, ResourceNames: []string{"l"}}); err != nil {
		t.Fatal(err)
	}
	for len(clients.Clients) != 1 || clients.Clients[0].NodeID != "local" {
		select {
		case <-ctx.Done():
			t.Fatalf("/debug/clients never showed the local client: %+v", clients)
		case <-time.After(20 * time.Millisecond):
		}
		resp, err := http.Get("http://" + admin + "/debug/clients")
		if err != nil {
			t.Fatal(err)
		}
		clients = Clients{}
		err = json.NewDecoder(resp.Body).Decode(&clients)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz %d with the hub away, want 200", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v after its context ended, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// Bad settings are refused before anything starts.
func TestRunRefusesBadSettings(t *testing.T) {
	cfg := DefaultConfig()
	if err := Run(t.Context(), cfg, quiet()); err == nil || !strings.Contains(err.Error(), "hub") {
		t.Errorf("no hub address: %v", err)
	}
	cfg.HubAddr, cfg.Cluster = "127.0.0.1:1", "Not A Label"
	if err := Run(t.Context(), cfg, quiet()); err == nil {
		t.Error("an invalid cluster ID was accepted")
	}
	cfg.Cluster, cfg.CertFile = "", "cert.pem"
	cfg.Locality = registry.Locality{Region: "r", Zone: "z"}
	if err := Run(t.Context(), cfg, quiet()); err == nil || !strings.Contains(err.Error(), "--hub-ca") {
		t.Errorf("a certificate without the hub's CA: %v", err)
	}
}
