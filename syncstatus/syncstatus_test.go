package syncstatus

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

const (
	eds = resource.EndpointType
	cds = resource.ClusterType
)

func newTracker() (*Tracker, *time.Time) {
	t := New("r1")
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	t.now = func() time.Time { return now }
	return t, &now
}

func only(t *testing.T, tr *Tracker, node string) Client {
	t.Helper()
	cs := tr.Clients(node)
	if len(cs) != 1 {
		t.Fatalf("%d streams of %q, want 1", len(cs), node)
	}
	return cs[0]
}

// A named resource as it goes on the wire: field 1 is its name.
func named(name string) *anypb.Any {
	return &anypb.Any{TypeUrl: eds, Value: append([]byte{0x0a, byte(len(name))}, name...)}
}

func TestStateOfTheWorldExchange(t *testing.T) {
	tr, now := newTracker()
	tr.Open(Stream{ID: 1}, "")
	node := &core.Node{Id: "n1", Locality: &core.Locality{Region: "r", Zone: "z"}}
	names := []string{"a", "b"}
	tr.Request(1, &discovery.DiscoveryRequest{Node: node, TypeUrl: eds, ResourceNames: names})
	if c := only(t, tr, "n1"); c.State != Synced || c.Types["eds"].Subscribed != 2 || c.Types["eds"].Pending {
		t.Fatalf("before any response: %+v", c)
	}

	*now = now.Add(time.Second)
	sentAt := *now
	before := tr.Response(1, eds, &discovery.DiscoveryResponse{VersionInfo: "v1", Nonce: "1", Resources: []*anypb.Any{named("a"), named("b")}})
	if !before.Asked.Equal(sentAt.Add(-time.Second)) || before.Acked != "" || !before.SubscribedAt.Equal(before.Asked) {
		t.Errorf("Response says %+v; want asked (and subscribed) at %v, a first fetch", before, sentAt.Add(-time.Second))
	}
	c := only(t, tr, "n1")
	if c.State != Stale || c.StaleSince == nil || !c.StaleSince.Equal(sentAt) || !c.Types["eds"].Pending {
		t.Fatalf("sent, not answered: %+v", c)
	}

	// A NACK of the response: NACKED, with the names it carried.
	tr.Request(1, &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: names, ResponseNonce: "1",
		ErrorDetail: &rpcstatus.Status{Message: "no"}})
	c = only(t, tr, "n1")
	n := c.Types["eds"].LastNACK
	if c.State != Nacked || n == nil || n.Version != "v1" || n.Detail != "no" || !slices.Equal(n.Resources, []string{"a", "b"}) || n.Count != 2 {
		t.Fatalf("after a NACK: %+v (NACK %+v)", c, n)
	}

	// The same version sent again: still rejected.
	tr.Response(1, eds, &discovery.DiscoveryResponse{VersionInfo: "v1", Nonce: "2"})
	if c := only(t, tr, "n1"); c.State != Nacked || !c.Types["eds"].Pending {
		t.Fatalf("the rejected version resent: %+v", c)
	}

	// A late answer to an older nonce changes nothing.
	if b := tr.Response(1, eds, &discovery.DiscoveryResponse{VersionInfo: "v2", Nonce: "3", Resources: []*anypb.Any{named("a"), named("b")}}); b.Acked != "" {
		t.Error("the stream acknowledged nothing yet (it rejected v1), so v2 still answers its first fetch")
	}
	tr.Request(1, &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: names, VersionInfo: "v1", ResponseNonce: "2"})
	if c := only(t, tr, "n1"); c.State != Nacked || c.Types["eds"].Acked != "" || !c.Types["eds"].Pending {
		t.Fatalf("a late ACK of nonce 2 counted (the stream still lacks what it rejected, v2 pending): %+v", c)
	}
	// The ACK of the last response: SYNCED; the NACK stays as history.
	tr.Request(1, &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: names, VersionInfo: "v2", ResponseNonce: "3"})
	c = only(t, tr, "n1")
	if ty := c.Types["eds"]; c.State != Synced || ty.Acked != "v2" || ty.Rejecting || ty.LastNACK == nil {
		t.Fatalf("after the ACK of v2: %+v, eds %+v", c, ty)
	}
	if b := tr.Response(1, eds, &discovery.DiscoveryResponse{VersionInfo: "v3", Nonce: "4"}); b.Acked != "v2" {
		t.Errorf("v3 follows an acknowledged v2: %+v; want a push, the stream holding v2", b)
	}
	// The subscription is the request's own slice, not a copy.
	tr.streamsMu.Lock()
	same := &tr.streams[Stream{ID: 1}].types[eds].names[0] == &names[0]
	tr.streamsMu.Unlock()
	if !same {
		t.Error("the tracker copied the subscription")
	}

	tr.Close(Stream{ID: 1})
	if cs := tr.Clients(""); len(cs) != 0 {
		t.Errorf("a closed stream is still reported: %+v", cs)
	}
	// Requests of a stream the tracker does not know (closed) are ignored.
	tr.Request(1, &discovery.DiscoveryRequest{Node: node, TypeUrl: eds})
	if cs := tr.Clients(""); len(cs) != 0 {
		t.Errorf("a request of a closed stream brought it back: %+v", cs)
	}
}

func TestDeltaExchange(t *testing.T) {
	tr, _ := newTracker()
	s := Stream{Delta: true, ID: 7}
	tr.Open(s, "")
	tr.Open(Stream{ID: 7}, "") // a sotw stream numbered alike is another stream
	node := &core.Node{Id: "d"}
	tr.DeltaRequest(7, &discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: eds, ResourceNamesSubscribe: []string{"a", "b"},
		InitialResourceVersions: map[string]string{"c": "v0"}})
	tr.DeltaRequest(7, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesUnsubscribe: []string{"b"}})
	tr.DeltaResponse(7, eds, &discovery.DeltaDiscoveryResponse{SystemVersionInfo: "v3", Nonce: "5",
		Resources: []*discovery.Resource{{Name: "a"}}, RemovedResources: []string{"b"}})
	tr.DeltaRequest(7, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: "5"})
	c := only(t, tr, "d")
	ty := c.Types["eds"]
	if c.Stream != s || c.State != Synced || ty.Acked != "v3" || ty.Wildcard || !slices.Equal(ty.Names, []string{"a", "c"}) {
		t.Fatalf("delta stream: %+v, eds %+v; want synced at v3 subscribed to a and c", c, ty)
	}
	if all := tr.Clients(""); len(all) != 2 {
		t.Errorf("%d streams, want 2 (sotw 7 and delta 7)", len(all))
	}
}

// BenchmarkPush is the tracker's cost of one push to a subscribed client:
// the response and the client's ACK (the server's callbacks call both).
func BenchmarkPush(b *testing.B) {
	tr := New("r1")
	tr.Open(Stream{ID: 1}, "")
	names := []string{"outbound|8080||echo.demo.svc.clusterset.local"}
	tr.Request(1, &discovery.DiscoveryRequest{Node: &core.Node{Id: "n"}, TypeUrl: eds, ResourceNames: names})
	resp := &discovery.DiscoveryResponse{VersionInfo: "v", Nonce: "1", Resources: []*anypb.Any{named(names[0])}}
	ack := &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: names, VersionInfo: "v", ResponseNonce: "1"}
	b.ReportAllocs()
	for b.Loop() {
		tr.Response(1, eds, resp)
		tr.Request(1, ack)
	}
}

// BenchmarkMemoryPerClient reports what the tracker holds per client: a
// grpc-go client of one service (four types, a name each, one push of each
// acknowledged), the requests' own name lists left out (the server holds
// them anyway).
func BenchmarkMemoryPerClient(b *testing.B) {
	const clients = 10_000
	types := []string{resource.ListenerType, resource.RouteType, resource.ClusterType, eds}
	names := []string{"echo.demo.svc.clusterset.local:8080"}
	var before, after runtime.MemStats
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr := New("r1")
		for i := range clients {
			id := int64(i)
			tr.Open(Stream{ID: id}, "")
			node := &core.Node{Id: "n"}
			for _, ty := range types {
				tr.Request(id, &discovery.DiscoveryRequest{Node: node, TypeUrl: ty, ResourceNames: names})
				tr.Response(id, ty, &discovery.DiscoveryResponse{VersionInfo: "v1", Nonce: "1", Resources: []*anypb.Any{named(names[0])}})
				tr.Request(id, &discovery.DiscoveryRequest{TypeUrl: ty, ResourceNames: names, VersionInfo: "v1", ResponseNonce: "1"})
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/clients, "B/client")
		runtime.KeepAlive(tr)
	}
}

// Cases a review found: an empty list after named ones asks for nothing
// (grpc-go unsubscribes so), not for everything; a rejected resource stays
// missing while later responses carry other ones; a stream of one type's
// service may name no type; a delta stream that resumes holds its versions.
func TestSubscriptionEdges(t *testing.T) {
	tr, _ := newTracker()
	tr.Open(Stream{ID: 1}, "")
	node := &core.Node{Id: "n"}
	tr.Request(1, &discovery.DiscoveryRequest{Node: node, TypeUrl: eds, ResourceNames: []string{"a"}})
	tr.Request(1, &discovery.DiscoveryRequest{TypeUrl: eds})
	if ty := only(t, tr, "n").Types["eds"]; ty.Wildcard || ty.Subscribed != 0 {
		t.Errorf("after unsubscribing its last name: %+v; want no names, not a wildcard", ty)
	}

	tr.Open(Stream{ID: 2}, "")
	tr.Request(2, &discovery.DiscoveryRequest{Node: &core.Node{Id: "m"}, TypeUrl: eds, ResourceNames: []string{"a", "b"}})
	tr.Response(2, eds, &discovery.DiscoveryResponse{VersionInfo: "v1", Nonce: "1", Resources: []*anypb.Any{named("a"), named("b")}})
	tr.Request(2, &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"a", "b"}, ResponseNonce: "1", ErrorDetail: &rpcstatus.Status{Message: strings.Repeat("x", 5000)}})
	tr.Response(2, eds, &discovery.DiscoveryResponse{VersionInfo: "v2", Nonce: "2", Resources: []*anypb.Any{named("b")}})
	tr.Request(2, &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"a", "b"}, VersionInfo: "v2", ResponseNonce: "2"})
	c := only(t, tr, "m")
	ty := c.Types["eds"]
	if c.State != Nacked || !slices.Equal(ty.Unresolved, []string{"a"}) || len(ty.LastNACK.Detail) > maxDetail+len("…") {
		t.Errorf("a rejected, b accepted later: %s, eds %+v; want NACKED with a unresolved and the detail bounded", c.State, ty)
	}
	tr.Response(2, eds, &discovery.DiscoveryResponse{VersionInfo: "v3", Nonce: "3", Resources: []*anypb.Any{named("a")}})
	tr.Request(2, &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"a", "b"}, VersionInfo: "v3", ResponseNonce: "3"})
	if c := only(t, tr, "m"); c.State != Synced || len(c.Types["eds"].Unresolved) != 0 {
		t.Errorf("a accepted at v3: %+v", c)
	}

	tr.Open(Stream{Delta: true, ID: 3}, cds) // the CDS service's delta stream; its requests name no type
	tr.DeltaRequest(3, &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "d"}, ResourceNamesSubscribe: []string{"c"}})
	tr.DeltaResponse(3, cds, &discovery.DeltaDiscoveryResponse{SystemVersionInfo: "v1", Nonce: "1", Resources: []*discovery.Resource{{Name: "c"}}})
	if a := tr.DeltaRequest(3, &discovery.DeltaDiscoveryRequest{ResponseNonce: "1"}); !a.ACK || a.TypeURL != cds {
		t.Errorf("the CDS stream's typeless ACK: %+v", a)
	}
	if c := only(t, tr, "d"); c.State != Synced || c.Types["cds"].Acked != "v1" || len(c.Types) != 1 {
		t.Errorf("a CDS stream naming no type: %+v", c)
	}

	tr.Open(Stream{Delta: true, ID: 4}, "")
	tr.DeltaRequest(4, &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "r"}, TypeUrl: eds, ResourceNamesSubscribe: []string{"a"},
		InitialResourceVersions: map[string]string{"a": "h1"}})
	if ty := only(t, tr, "r").Types["eds"]; !ty.Resumed || ty.Sent != "" {
		t.Errorf("a resumed delta stream: %+v", ty)
	}
}

// What a stream rejected stops counting as missing once it no longer asks
// for it, or the server removes it; a removal is no truncated response.
func TestUnresolvedFollowsTheSubscription(t *testing.T) {
	tr, now := newTracker()
	tr.Open(Stream{ID: 1}, "")
	node := &core.Node{Id: "s"}
	tr.Request(1, &discovery.DiscoveryRequest{Node: node, TypeUrl: eds, ResourceNames: []string{"a", "b"}})
	tr.Response(1, eds, &discovery.DiscoveryResponse{VersionInfo: "v1", Nonce: "1", Resources: []*anypb.Any{named("a"), named("b")}})
	tr.Request(1, &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"a", "b"}, ResponseNonce: "1", ErrorDetail: &rpcstatus.Status{Message: "no"}})
	*now = now.Add(time.Second)
	tr.Request(1, &discovery.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"b"}})
	ty := only(t, tr, "s").Types["eds"]
	if !slices.Equal(ty.Unresolved, []string{"b"}) {
		t.Errorf("after unsubscribing a: unresolved %v, want [b]", ty.Unresolved)
	}
	if b := tr.Response(1, eds, &discovery.DiscoveryResponse{VersionInfo: "v2", Nonce: "2"}); !b.SubscribedAt.Equal(*now) {
		t.Errorf("the subscription changed at %v; the tracker says %v", *now, b.SubscribedAt)
	}

	tr.Open(Stream{Delta: true, ID: 2}, "")
	tr.DeltaRequest(2, &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "d"}, TypeUrl: eds, ResourceNamesSubscribe: []string{"a", "b"}})
	tr.DeltaResponse(2, eds, &discovery.DeltaDiscoveryResponse{SystemVersionInfo: "v1", Nonce: "1", Resources: []*discovery.Resource{{Name: "a"}}})
	tr.DeltaRequest(2, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: "1", ErrorDetail: &rpcstatus.Status{Message: "no"}})
	tr.DeltaResponse(2, eds, &discovery.DeltaDiscoveryResponse{SystemVersionInfo: "v2", Nonce: "2", RemovedResources: []string{"b"}})
	tr.DeltaRequest(2, &discovery.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: "2"})
	if c := only(t, tr, "d"); c.State != Nacked || !slices.Equal(c.Types["eds"].Unresolved, []string{"a"}) {
		t.Errorf("a rejected, then a removal of b accepted: %s %+v; want a still missing", c.State, c.Types["eds"])
	}
	tr.DeltaResponse(2, eds, &discovery.DeltaDiscoveryResponse{SystemVersionInfo: "v3", Nonce: "3", RemovedResources: []string{"a"}})
	if c := only(t, tr, "d"); len(c.Types["eds"].Unresolved) != 0 {
		t.Errorf("a removed: still unresolved %v", c.Types["eds"].Unresolved)
	}
}
