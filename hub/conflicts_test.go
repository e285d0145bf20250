package hub_test

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/registry"
)

var (
	apiKey              = registry.ServiceKey{Namespace: "default", Name: "api"}
	olderExport         = time.Unix(1_700_000_000, 0).UTC()
	youngerExport       = time.Unix(1_800_000_000, 0).UTC()
	conflictWestWins    = "kept west's, ignored east's"
	conflictWestIsOlder = "west exported the service first"
)

func apiShard(cluster registry.ClusterID, exportedAt time.Time, portName, addr string) *registry.Shard {
	s := &registry.Shard{
		Cluster: cluster, Service: apiKey, ExportedAt: exportedAt,
		Ports: []registry.ServicePort{{Name: portName, Port: 8080, Protocol: registry.ProtocolTCP}},
		Endpoints: []registry.Endpoint{{
			Addresses: []netip.Addr{netip.MustParseAddr(addr)}, Ports: []registry.EndpointPort{{Name: portName, Port: 9090}},
			Conditions: registry.Conditions{Ready: true, Serving: true},
		}},
	}
	s.Normalize()
	return s
}

// spoke runs a real Publisher for cluster against h and hands on what it
// reports and, when it takes the import stream, the imports it is given.
type spoke struct {
	pub     *federation.Publisher
	states  chan federation.State
	reports chan federation.Reports
	imports chan federation.ImportState
	stop    func()
}

// startSpoke starts a spoke of cluster; with namespaces, it takes the import stream for them.
func startSpoke(t *testing.T, h *hub.Hub, cluster registry.ClusterID, namespaces ...string) *spoke {
	t.Helper()
	conn, err := grpc.NewClient(h.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	sp := &spoke{states: make(chan federation.State, 1), reports: make(chan federation.Reports, 1000),
		imports: make(chan federation.ImportState, 1000)}
	cfg := federation.DefaultSpokeConfig()
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	w := federation.SpokeWiring{Cluster: cluster, OnReport: func(r federation.Reports) { sp.reports <- r }}
	if len(namespaces) > 0 {
		w.OnImports = func(s federation.ImportState) { sp.imports <- s }
	}
	pub := federation.NewPublisher(cfg, w, conn, slog.New(slog.DiscardHandler))
	pub.SetNamespaces(namespaces)
	sp.pub = pub
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	src := federation.NewChanges()
	go func() {
		for {
			select {
			case st := <-sp.states:
				src.Set(st)
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { defer close(done); _ = pub.Run(ctx, src) }()
	var once sync.Once
	sp.stop = func() { once.Do(func() { cancel(); <-done; conn.Close() }) }
	t.Cleanup(sp.stop) // before the hub stops: cleanups run last first
	return sp
}

func (sp *spoke) publish(shards ...*registry.Shard) {
	st := federation.State{}
	for _, s := range shards {
		st[s.Service] = s
	}
	sp.states <- st
}

// await returns the first report that satisfies cond.
func (sp *spoke) await(t *testing.T, what string, cond func(federation.Reports) bool) federation.Reports {
	t.Helper()
	timeout := time.After(10 * time.Second)
	var last federation.Reports
	for {
		select {
		case r := <-sp.reports:
			if cond(r) {
				return r
			}
			last = r
		case <-timeout:
			t.Fatalf("never reported %s; last report %v", what, last)
		}
	}
}

// Two clusters export a service with conflicting ports: both spokes learn of
// the conflict, worded the same, naming the winner (the older export, though
// its cluster ID is the higher) and the loser; when the loser gives in, the
// conflict is gone for both.
func TestConflictsReachBothSpokesAndClear(t *testing.T) {
	h, _ := startHub(t, t.TempDir())
	east, west := startSpoke(t, h, "east"), startSpoke(t, h, "west")
	east.publish(apiShard("east", youngerExport, "grpc", "10.0.0.1"))
	west.publish(apiShard("west", olderExport, "web", "10.1.0.1"))

	hasConflict := func(r federation.Reports) bool { return len(r[apiKey].Conflicts) > 0 }
	eastSaw := east.await(t, "the conflict to east", hasConflict)[apiKey]
	westSaw := west.await(t, "the conflict to west", hasConflict)[apiKey]
	for cluster, r := range map[string]federation.ServiceReport{"east": eastSaw, "west": westSaw} {
		if len(r.Conflicts) != 1 || r.Refused != "" || r.Conflicts[0].Kind != registry.PortConflict ||
			!strings.Contains(r.Conflicts[0].Text, conflictWestWins) ||
			!strings.Contains(r.Conflicts[0].Text, conflictWestIsOlder) || !strings.Contains(r.Conflicts[0].Text, "port 8080/TCP") {
			t.Errorf("%s's report: %+v", cluster, r)
		}
	}
	if eastSaw.Conflicts[0] != westSaw.Conflicts[0] {
		t.Errorf("the clusters were told different stories:\n%s\n%s", eastSaw.Conflicts[0], westSaw.Conflicts[0])
	}

	east.publish(apiShard("east", youngerExport, "web", "10.0.0.1"))
	east.await(t, "no conflict to east", func(r federation.Reports) bool { return len(r) == 0 })
	west.await(t, "no conflict to west", func(r federation.Reports) bool { return len(r) == 0 })
	if svc := h.View().Registry.Service(apiKey); svc == nil || len(svc.Conflicts) != 0 || len(svc.Shards) != 2 {
		t.Fatalf("merged service %+v, want both clusters' shards without conflicts", svc)
	}
}

// A refused service is reported with the hub's reason until a valid form is accepted.
func TestRefusedServiceIsReported(t *testing.T) {
	h, _ := startHub(t, t.TempDir())
	east := startSpoke(t, h, "east")
	bad := apiShard("east", olderExport, "grpc", "10.0.0.1")
	bad.Ports[0].Protocol = "QUIC"
	east.publish(bad)
	got := east.await(t, "the refusal", func(r federation.Reports) bool { return r[apiKey].Refused != "" })
	if !strings.Contains(got[apiKey].Refused, "QUIC") {
		t.Fatalf("refused because %q, want the hub's reason about QUIC", got[apiKey].Refused)
	}
	east.publish(apiShard("east", olderExport, "grpc", "10.0.0.1"))
	east.await(t, "nothing", func(r federation.Reports) bool { return len(r) == 0 })
	if h.View().Registry.Service(apiKey) == nil {
		t.Fatal("the hub does not hold the accepted form")
	}
}

// rawSession opens a session by hand; its hello announces the capabilities given.
func rawSession(t *testing.T, h *hub.Hub, hello *fedv1.Hello) (fedv1.Federation_PublishClient, *fedv1.Welcome) {
	t.Helper()
	conn, err := grpc.NewClient(h.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	stream, err := fedv1.NewFederationClient(conn).Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil || m.GetWelcome() == nil {
		t.Fatalf("hello answered %v, %v", m, err)
	}
	return stream, m.GetWelcome()
}

func recv(t *testing.T, stream fedv1.Federation_PublishClient) *fedv1.HubMessage {
	t.Helper()
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sendShards(t *testing.T, stream fedv1.Federation_PublishClient, u *fedv1.Update, shards ...*registry.Shard) {
	t.Helper()
	for _, s := range shards {
		u.Upserts = append(u.Upserts, federation.ShardToProto(s))
	}
	if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
		t.Fatal(err)
	}
}

// The protocol as the hub speaks it: a capable session gets the (empty) set
// right after its first ack, then a new one whenever another cluster's update
// changes it, and right after the welcome of a resumed session; a session
// without the capability never gets one.
func TestConflictsFollowTheProtocol(t *testing.T) {
	h, _ := startHub(t, t.TempDir())
	capable := []string{federation.CapabilityServiceConflicts}
	east, first := rawSession(t, h, &fedv1.Hello{ClusterId: "east", Capabilities: capable})
	sendShards(t, east, &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true}, apiShard("east", youngerExport, "grpc", "10.0.0.1"))
	ack := recv(t, east).GetAck()
	if ack == nil {
		t.Fatal("east's full state was not acked first")
	}
	if m := recv(t, east); m.GetConflicts() == nil || len(m.GetConflicts().GetServices()) != 0 {
		t.Fatalf("after the first ack east got %v, want an empty ServiceConflicts", m)
	}

	// west, without the capability, creates a conflict that west wins.
	west, _ := rawSession(t, h, &fedv1.Hello{ClusterId: "west"})
	sendShards(t, west, &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true}, apiShard("west", olderExport, "web", "10.1.0.1"))
	if m := recv(t, west); m.GetAck() == nil {
		t.Fatalf("west's full state answered %v", m)
	}
	m := recv(t, east) // unasked: east sent nothing since
	if sc := m.GetConflicts().GetServices(); len(sc) != 1 || federation.KeyFromProto(sc[0].GetService()) != apiKey ||
		len(sc[0].GetConflicts()) != 1 || !strings.Contains(sc[0].GetConflicts()[0], conflictWestWins) ||
		len(sc[0].GetReasons()) != 1 || sc[0].GetReasons()[0] != string(registry.PortConflict) {
		t.Fatalf("east got %v, want the conflict on %s", m, apiKey)
	}
	sendShards(t, west, &fedv1.Update{Nonce: "2", Version: 2}, apiShard("west", olderExport, "web", "10.1.0.2"))
	if m := recv(t, west); m.GetAck() == nil {
		t.Fatalf("west without the capability got %v, want only the ack", m)
	}

	// east comes back and resumes: the set follows the welcome at once.
	resumed, welcome := rawSession(t, h, &fedv1.Hello{ClusterId: "east", Capabilities: capable,
		AckedEpoch: first.GetEpoch(), AckedVersion: 1, AckedDigest: ack.GetDigest()})
	if !welcome.GetResume() {
		t.Fatal("east did not resume")
	}
	if sc := recv(t, resumed).GetConflicts().GetServices(); len(sc) != 1 || len(sc[0].GetConflicts()) != 1 {
		t.Fatalf("the resumed session got %v, want the conflict on %s", sc, apiKey)
	}
}
