package hub_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/navemesh/nave/adminapi"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
)

// TestTraceAfterFailover: east's spoke publishes at replica a, a real
// grpc-go client holds the service at replica b; a dies, east's spoke
// resumes at b with one endpoint changed, and b's trace of that change
// shows every stage: applied, translated, pushed to the client, and its
// ACK, with the stage histograms observed.
func TestTraceAfterFailover(t *testing.T) {
	e := startSharedEtcd(t)
	liveness := hub.DefaultLiveness()
	gossipA, gossipB := freeAddr(t), freeAddr(t)
	a, stopA := startHub(t, t.TempDir(), replicaOf(e, "a", gossipA, []string{gossipB}, liveness))
	b, _ := startHub(t, t.TempDir(), replicaOf(e, "b", gossipB, []string{gossipA}, liveness))
	_, epoch := publishAPI(t, a, "east")
	awaitCond(t, "east replicated to b", 10*time.Second, func() bool { return b.View().Clusters["east"].Services == 1 })

	client := xdstest.NewClient(t, b.XDSAddr.String(), "client-b", registry.Locality{Region: "r1", Zone: "z1"}, "api.default.svc.clusterset.local:8080")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, _ = client.Check(ctx, &healthpb.HealthCheckRequest{}) // resolves the target; nothing answers at the test's addresses
	cancel()
	admin := "http://" + b.AdminAddr.String()
	awaitCond(t, "client-b holding api's endpoints at b", 10*time.Second, func() bool {
		var info adminapi.ClientsInfo
		return getJSON(t, admin+"/debug/clients?node=client-b", &info) && len(info.Clients) == 1 &&
			info.Clients[0].State == adminapi.Synced && info.Clients[0].Types["eds"].Acked != ""
	})

	stopA()
	stream, welcome := rawSession(t, b, &fedv1.Hello{ClusterId: "east", Network: "n1", SpokeId: "s1", SpokeBuild: "b1",
		AckedEpoch: epoch, AckedVersion: 1})
	if welcome.GetEpoch() <= epoch {
		t.Fatalf("the session at b has epoch %d, want one after a's %d", welcome.GetEpoch(), epoch)
	}
	sendShards(t, stream, &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true},
		apiShard("east", olderExport, "grpc", "10.0.0.1")) // what b holds already: no change
	if m := recv(t, stream); m.GetAck() == nil {
		t.Fatalf("the full state at b answered %v", m)
	}
	// Then a change, and where it began: a source that showed it 40 ms after
	// it happened, 3 ms in the spoke, about 2 ms to the hub.
	sendShards(t, stream, &fedv1.Update{Nonce: "2", Version: 2, LinkNanos: int64(2 * time.Millisecond),
		Origins: []*fedv1.ChangeOrigin{{Service: &fedv1.ServiceKey{Namespace: "default", Name: "api"}, ResourceVersion: "1234",
			SourceNanos: int64(40 * time.Millisecond), SpokeNanos: int64(3 * time.Millisecond)}}},
		apiShard("east", olderExport, "grpc", "10.0.0.2"))
	if m := recv(t, stream); m.GetAck() == nil {
		t.Fatalf("the change at b answered %v", m)
	}

	var tr adminapi.TraceInfo
	awaitCond(t, "b's trace of the change acknowledged by client-b", 10*time.Second, func() bool {
		if !getJSON(t, admin+"/debug/trace?service=default/api&limit=1", &tr) || len(tr.Traces) != 1 {
			return false
		}
		return tr.Traces[0].Acked == 1
	})
	got := tr.Traces[0]
	if tr.Replica != "b" || got.Cluster != "east" || got.Translated == nil || got.Translated.Before(got.Received) || got.Type != "eds" ||
		got.Pushed != 1 || got.LastAck == nil || len(got.Slowest) != 1 {
		t.Fatalf("b's trace: %+v", tr)
	}
	s := got.Slowest[0]
	if s.NodeID != "client-b" || s.ApplyToPush < 0 || s.PushToAck < 0 || s.HubToAck < s.ApplyToPush || s.HubToAck < s.PushToAck {
		t.Errorf("client-b's stages: %+v", s)
	}
	if o := got.Origin; o == nil || o.ResourceVersion != "1234" || o.Source != 40 || o.Spoke != 3 || o.SpokeToHub != 2 || s.EndToEnd < 45+s.HubToAck-0.01 {
		t.Errorf("the change's origin %+v and client-b's end to end %.3f; want 40+3+2 ms before the hub's %.3f", o, s.EndToEnd, s.HubToAck)
	}
	_, metrics := get(t, admin+"/metrics")
	for _, stage := range []string{"source", "spoke", "spoke_to_hub", "hub_apply_to_push", "push_to_ack", "hub_to_ack", "end_to_end"} {
		if !strings.Contains(metrics, `nave_convergence_seconds_count{cluster="east",stage="`+stage+`"}`) {
			t.Errorf("b's metrics have no %s observation for east", stage)
		}
	}
	if code, body := get(t, admin+"/debug/trace?service=nope"); code != 400 || !strings.Contains(body, "nope") {
		t.Errorf("a bad service: %d %s", code, body)
	}
}

func getJSON(t *testing.T, url string, v any) bool {
	t.Helper()
	code, body := get(t, url)
	if code != 200 {
		return false
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return true
}
