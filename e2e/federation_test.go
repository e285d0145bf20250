package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

const echoTarget = "echo.default.svc.clusterset.local:8080"

// Three clusters in two regions; clients in two zones fail over zone ->
// region -> elsewhere and back, and not one RPC fails on the way.
func TestLocalityFailoverAcrossClusters(t *testing.T) {
	ctx := testContext(t)
	h := startHub(t)
	root := t.TempDir()
	// One address each: two endpoints of one service never share an IP (a spoke merges them).
	e1a := xdstest.StartBackend(t, "east/us-east-1a", "127.0.0.1")
	e1b := xdstest.StartBackend(t, "east/us-east-1b", "127.0.0.2")
	n1c := xdstest.StartBackend(t, "north/us-east-1c", "127.0.0.3")
	w1a := xdstest.StartBackend(t, "west/us-west-1a", "127.0.0.4")
	east, north, west := filepath.Join(root, "east"), filepath.Join(root, "north"), filepath.Join(root, "west")
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", true}, endpoint{e1b, "us-east-1b", true})
	writeService(t, north, "echo", endpoint{n1c, "us-east-1c", true})
	writeService(t, west, "echo", endpoint{w1a, "us-west-1a", true})
	startSpoke(t, h, "east", east, "us-east")
	startSpoke(t, h, "north", north, "us-east")
	startSpoke(t, h, "west", west, "us-west")
	await(t, "echo from three clusters", func() bool { return len(h.clustersOf("default/echo")) == 3 })

	xdsAddr := h.XDSAddr.String()
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	inEast := xdstest.StartPoller(pollCtx, t, "client us-east-1a", xdstest.NewClient(t, xdsAddr, "c-east", locality("us-east", "us-east-1a"), echoTarget))
	inWest := xdstest.StartPoller(pollCtx, t, "client us-west-1a", xdstest.NewClient(t, xdsAddr, "c-west", locality("us-west", "us-west-1a"), echoTarget))

	inEast.AwaitOnly(ctx, t, e1a.Name)
	inWest.AwaitOnly(ctx, t, w1a.Name)

	// The client's zone goes away: the rest of its region takes over.
	start := time.Now()
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", false}, endpoint{e1b, "us-east-1b", true})
	inEast.AwaitOnly(ctx, t, e1b.Name, n1c.Name)
	t.Logf("zone failover: manifest written -> client traffic moved (incl. %d answers streak) in %s", xdstest.Streak, time.Since(start))
	inEast.Await(ctx, t, "both same-region backends", func(recent []string, _ map[string]bool) bool {
		return slices.Contains(recent, e1b.Name) && slices.Contains(recent, n1c.Name)
	})

	// The whole region goes away: the other region takes over.
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", false}, endpoint{e1b, "us-east-1b", false})
	writeService(t, north, "echo", endpoint{n1c, "us-east-1c", false})
	start = time.Now()
	inEast.AwaitOnly(ctx, t, w1a.Name)
	t.Logf("region failover: manifest written -> client traffic moved in %s", time.Since(start))

	// Everything comes back: so does the traffic, to the client's own zone.
	writeService(t, east, "echo", endpoint{e1a, "us-east-1a", true}, endpoint{e1b, "us-east-1b", true})
	writeService(t, north, "echo", endpoint{n1c, "us-east-1c", true})
	inEast.AwaitOnly(ctx, t, e1a.Name)
	inWest.AwaitOnly(ctx, t, w1a.Name)

	stopPolling()
	for _, p := range []*xdstest.Poller{inEast, inWest} {
		calls, failed := p.Failures()
		if len(failed) > 0 {
			t.Errorf("%d of %d RPCs failed, first: %v", len(failed), calls, failed[0])
		}
	}

	// The admin API tells the same story as the clients, once north's change
	// (written after east's, which the client already followed) has arrived too.
	var a adminapi.Assignment
	await(t, "us-east-1a's assignment: zone, region, elsewhere", func() bool {
		var info adminapi.EndpointsInfo
		h.getJSON(t, "/debug/endpoints?service=default/echo&region=us-east&zone=us-east-1a", &info)
		a = info.Ports[0].Assignment
		return len(a.Priorities) == 3 && len(a.Priorities[1].Localities) == 2
	})
	if a.Priorities[0].Localities[0].Locality.Zone != "us-east-1a" || a.Priorities[2].Localities[0].Locality.Region != "us-west" {
		t.Errorf("assignment for us-east-1a = %+v, want zone, region (two zones), elsewhere", a.Priorities)
	}
}

// A service exported by two clusters merges; removing it from one leaves the
// other's endpoints; removing it everywhere removes the service.
func TestServiceInTwoClustersMergesAndDeletes(t *testing.T) {
	ctx := testContext(t)
	h := startHub(t)
	root := t.TempDir()
	be := xdstest.StartBackend(t, "east", "127.0.0.1")
	bw := xdstest.StartBackend(t, "west", "127.0.0.1")
	east, west := filepath.Join(root, "east"), filepath.Join(root, "west")
	writeService(t, east, "echo", endpoint{be, "z1", true})
	writeService(t, west, "echo", endpoint{bw, "z2", true})
	startSpoke(t, h, "east", east, "r1")
	startSpoke(t, h, "west", west, "r2")
	await(t, "echo from both clusters", func() bool { return len(h.clustersOf("default/echo")) == 2 })

	var services []adminapi.ServiceInfo
	h.getJSON(t, "/debug/services", &services)
	if len(services) != 1 || services[0].Healthy != 2 || len(services[0].Conflicts) != 0 {
		t.Fatalf("/debug/services = %+v, want one service with 2 healthy endpoints and no conflict", services)
	}

	// A client without locality spreads over both clusters.
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	p := xdstest.StartPoller(pollCtx, t, "client", xdstest.NewClient(t, h.XDSAddr.String(), "c", registry.Locality{}, echoTarget))
	p.Await(ctx, t, "both clusters", func(_ []string, seen map[string]bool) bool { return seen["east"] && seen["west"] })

	if err := os.Remove(filepath.Join(east, "echo.yaml")); err != nil {
		t.Fatal(err)
	}
	await(t, "echo only from west", func() bool { return slices.Equal(h.clustersOf("default/echo"), []registry.ClusterID{"west"}) })
	p.AwaitOnly(ctx, t, "west")
	stopPolling()
	if calls, failed := p.Failures(); len(failed) > 0 {
		t.Errorf("%d of %d RPCs failed while east withdrew, first: %v", len(failed), calls, failed[0])
	}

	if err := os.Remove(filepath.Join(west, "echo.yaml")); err != nil {
		t.Fatal(err)
	}
	await(t, "echo gone", func() bool { return h.View().Registry.Len() == 0 })
}

// Garbled manifests, malicious shards and wrong credentials are refused
// with a clear error, and nothing already served changes.
func TestBadInputChangesNothing(t *testing.T) {
	ctx := testContext(t)
	h := startHub(t)
	dir := filepath.Join(t.TempDir(), "east")
	b := xdstest.StartBackend(t, "east", "127.0.0.1")
	other := xdstest.StartBackend(t, "other", "127.0.0.1")
	writeService(t, dir, "echo", endpoint{b, "z1", true})
	startSpoke(t, h, "east", dir, "r1")
	await(t, "echo", func() bool { return len(h.clustersOf("default/echo")) == 1 })
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	p := xdstest.StartPoller(pollCtx, t, "client", xdstest.NewClient(t, h.XDSAddr.String(), "c", locality("r1", "z1"), echoTarget))
	p.AwaitOnly(ctx, t, "east")
	echo := h.View().Registry.Service(registry.ServiceKey{Namespace: "default", Name: "echo"})

	// 1. A garbled manifest: the spoke reports and skips it. A later good change
	//    in another file shows the spoke has read the garbled one meanwhile.
	writeFile(t, filepath.Join(dir, "echo.yaml"), "apiVersion: v1\nkind: Service\nmetadata: [this is not\n")
	writeService(t, dir, "other", endpoint{other, "z1", true})
	await(t, "other", func() bool { return len(h.clustersOf("default/other")) == 1 })
	if got := h.View().Registry.Service(echo.Key); got != echo {
		t.Fatalf("a garbled manifest changed echo: %+v", got)
	}

	// 2. A malicious shard, sent with a valid credential (west's: a session for
	//    east would supersede east's live spoke): NACKed, naming the service.
	before := h.View().Registry
	conn, err := grpc.NewClient(h.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: tokens["west"], AllowInsecure: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := fedv1.NewFederationClient(conn).Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustSend(t, stream, &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "west"}}})
	if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("hello answered %v, %v", m, err)
	}
	evil := &fedv1.Shard{
		Service: &fedv1.ServiceKey{Namespace: "default", Name: "echo"},
		Ports:   []*fedv1.ServicePort{{Name: "grpc", Port: 8080, Protocol: "TCP"}},
		Endpoints: []*fedv1.Endpoint{{Addresses: []string{"0.0.0.0"}, Ready: true,
			Ports: []*fedv1.EndpointPort{{Name: "grpc", Port: 1}}}},
	}
	mustSend(t, stream, &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{
		Nonce: "x", Version: 1, FullState: true, LastChunk: true, Upserts: []*fedv1.Shard{evil},
	}}})
	m, err := stream.Recv()
	if err != nil || m.GetNack() == nil {
		t.Fatalf("malicious shard answered %v, %v; want a nack", m, err)
	}
	if rj := m.GetNack().GetRejections()[0]; rj.GetService().GetName() != "echo" {
		t.Errorf("rejection %v does not name the service", rj)
	}
	if h.View().Registry != before {
		t.Fatal("a NACKed shard changed the registry")
	}
	_ = stream.CloseSend()

	// 3. A message larger than the hub accepts is refused before it is read.
	stream2, err := fedv1.NewFederationClient(conn).Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	huge := &fedv1.Hello{ClusterId: "west", SpokeBuild: string(make([]byte, 9<<20))}
	_ = stream2.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: huge}})
	if _, err := stream2.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("huge message answered %v, want ResourceExhausted", err)
	}

	// 4. Wrong credentials: another cluster's token, and a made-up one.
	for _, tc := range []struct {
		token string
		code  codes.Code
	}{{tokens["north"], codes.PermissionDenied}, {"made-up-token-0123456789", codes.Unauthenticated}} {
		c, err := grpc.NewClient(h.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: tc.token, AllowInsecure: true}))
		if err != nil {
			t.Fatal(err)
		}
		s, err := fedv1.NewFederationClient(c).Publish(ctx)
		if err == nil {
			_ = s.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "east"}}})
			_, err = s.Recv()
		}
		if status.Code(err) != tc.code {
			t.Errorf("token %q: %v, want %s", tc.token, err, tc.code)
		}
		c.Close()
	}
	if h.View().Registry != before {
		t.Fatal("refused input changed the registry")
	}
	stopPolling()
	if calls, failed := p.Failures(); len(failed) > 0 {
		t.Errorf("%d of %d RPCs failed during bad input, first: %v", len(failed), calls, failed[0])
	}
}

// A spoke restart sends the full state again; the hub diffs it against what
// it holds, so nothing is removed and re-added and clients see no change.
func TestSpokeRestartCausesNoChurn(t *testing.T) {
	ctx := testContext(t)
	h := startHub(t)
	dir := filepath.Join(t.TempDir(), "east")
	b := xdstest.StartBackend(t, "east", "127.0.0.1")
	writeService(t, dir, "echo", endpoint{b, "z1", true})
	first := startSpoke(t, h, "east", dir, "r1")
	await(t, "echo", func() bool { return len(h.clustersOf("default/echo")) == 1 })
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	p := xdstest.StartPoller(pollCtx, t, "client", xdstest.NewClient(t, h.XDSAddr.String(), "c", locality("r1", "z1"), echoTarget))
	p.AwaitOnly(ctx, t, "east")

	before := h.View()
	epoch := before.Clusters["east"].Epoch
	first.stop()
	await(t, "east disconnected", func() bool { return !h.View().Clusters["east"].Connected })
	startSpoke(t, h, "east", dir, "r1")
	await(t, "east's new session to publish its full state", func() bool {
		c := h.View().Clusters["east"]
		return c.Connected && c.Epoch > epoch && c.Version > 0
	})
	if after := h.View().Registry; after.Version() != before.Registry.Version() {
		t.Errorf("registry version went from %d to %d across a spoke restart: something was removed and re-added",
			before.Registry.Version(), after.Version())
	}
	p.AwaitOnly(ctx, t, "east")
	stopPolling()
	if calls, failed := p.Failures(); len(failed) > 0 {
		t.Errorf("%d of %d RPCs failed across a spoke restart, first: %v", len(failed), calls, failed[0])
	}
}

func mustSend(t testing.TB, s fedv1.Federation_PublishClient, m *fedv1.SpokeMessage) {
	t.Helper()
	if err := s.Send(m); err != nil {
		t.Fatal(err)
	}
}

// A spoke shows whether its hub session is up, and what the hub acknowledged,
// so a stalled sync pages someone instead of going unnoticed.
func TestSpokeAdminShowsSessionHealth(t *testing.T) {
	h := startHub(t)
	dir := filepath.Join(t.TempDir(), "east")
	b := xdstest.StartBackend(t, "east", "127.0.0.1")
	writeService(t, dir, "echo", endpoint{b, "z1", true})
	admin := freeAddr(t)
	startSpoke(t, h, "east", dir, "r1", func(c *spoke.Config) { c.AdminAddr = admin })

	await(t, "spoke ready", func() bool { return httpStatus("http://"+admin+"/readyz") == http.StatusOK })
	await(t, "acknowledged service in the spoke's metrics", func() bool {
		m := httpBody("http://" + admin + "/metrics")
		return strings.Contains(m, "nave_spoke_acked_services 1") && strings.Contains(m, "nave_spoke_connected 1")
	})
	if got := httpStatus("http://" + admin + "/healthz"); got != http.StatusOK {
		t.Errorf("/healthz = %d", got)
	}
}

// A spoke that restarts while one of its services is invalid keeps the form
// the hub already holds (it asks the hub to retain it) instead of removing it.
func TestSpokeRestartKeepsAnInvalidServicesLastGoodForm(t *testing.T) {
	h := startHub(t)
	dir := filepath.Join(t.TempDir(), "east")
	b := xdstest.StartBackend(t, "east", "127.0.0.1")
	writeService(t, dir, "echo", endpoint{b, "z1", true})
	first := startSpoke(t, h, "east", dir, "r1")
	await(t, "echo", func() bool { return len(h.clustersOf("default/echo")) == 1 })
	good := h.View().Registry.Service(registry.ServiceKey{Namespace: "default", Name: "echo"})
	epoch := h.View().Clusters["east"].Epoch
	first.stop()

	// While no spoke runs, the Service's port name turns invalid (upper case).
	path := filepath.Join(dir, "echo.yaml")
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, strings.Replace(string(content), "name: grpc", "name: GRPC", 1))
	startSpoke(t, h, "east", dir, "r1")
	await(t, "the new spoke's full state", func() bool {
		c := h.View().Clusters["east"]
		return c.Connected && c.Epoch > epoch && c.Version > 0
	})
	if got := h.View().Registry.Service(good.Key); got != good {
		t.Fatalf("echo after a restart with an invalid manifest: %+v, want the last good form", got)
	}

	// Gone for good is still gone: deleting the manifest removes the service.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	await(t, "echo removed", func() bool { return h.View().Registry.Len() == 0 })
}

// A cluster over the hub's limits gets as much as fits; the services past the
// limit are refused by name, and the session carries on for the rest.
func TestClusterOverLimitKeepsPublishingWhatFits(t *testing.T) {
	h := startHub(t, func(c *hub.Config) { c.Federation.Limits.MaxServicesPerCluster = 2 })
	dir := filepath.Join(t.TempDir(), "east")
	b := xdstest.StartBackend(t, "east", "127.0.0.1")
	other := xdstest.StartBackend(t, "other", "127.0.0.2")
	for _, name := range []string{"aa", "bb", "cc"} {
		writeService(t, dir, name, endpoint{b, "z1", true})
	}
	admin := freeAddr(t)
	startSpoke(t, h, "east", dir, "r1", func(c *spoke.Config) { c.AdminAddr = admin })
	await(t, "aa and bb", func() bool {
		return len(h.clustersOf("default/aa")) == 1 && len(h.clustersOf("default/bb")) == 1
	})
	await(t, "cc refused", func() bool {
		return strings.Contains(httpBody("http://"+admin+"/metrics"), "nave_spoke_refused_services 1")
	})
	if h.View().Registry.Len() != 2 {
		t.Fatalf("hub holds %d services, want 2", h.View().Registry.Len())
	}
	epoch := h.View().Clusters["east"].Epoch

	// Changes to what fits still flow, in the same session.
	writeService(t, dir, "aa", endpoint{b, "z1", true}, endpoint{other, "z1", true})
	await(t, "aa's second endpoint", func() bool {
		svc := h.View().Registry.Service(registry.ServiceKey{Namespace: "default", Name: "aa"})
		return svc != nil && len(svc.Shards[0].Endpoints) == 2
	})
	if got := h.View().Clusters["east"].Epoch; got != epoch {
		t.Errorf("the session was restarted (epoch %d -> %d)", epoch, got)
	}
}
