package xds

import (
	"context"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/syncstatus"
)

// streamOf returns the one stream of node the server reports (with its
// details), failing unless there is exactly one.
func streamOf(t *testing.T, s *Server, node string) syncstatus.Client {
	t.Helper()
	cs := s.Clients(node)
	if len(cs) != 1 {
		t.Fatalf("node %s: %d streams reported, want 1: %+v", node, len(cs), cs)
	}
	return cs[0]
}

// TestClientSyncStatus drives raw ADS streams (each a node) through every
// state the server reports: one that acknowledges (SYNCED), one that
// rejects (NACKED, with the detail and the rejected resource), one that
// stops answering (STALE, and what it holds differs after a change), and
// one asking for a resource the server does not have.
func TestClientSyncStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, _, addr := startXDSWith(t, DefaultConfig(), Wiring{Replica: "replica-a"})
	r, _ := twoServices(t, ready)
	srv.Update(r, registry.Diff{})
	echoCLA := ClusterName(echo, 8080)

	type raw struct {
		stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
		names  []string
	}
	open := func(node string, names ...string) (*raw, *discovery.DiscoveryResponse) {
		t.Helper()
		st, err := dialADS(ctx, t, addr).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := &core.Node{Id: node, Cluster: "east", Locality: &core.Locality{Region: "r1", Zone: "z1"}}
		if err := st.Send(&discovery.DiscoveryRequest{Node: n, TypeUrl: resource.EndpointType, ResourceNames: names}); err != nil {
			t.Fatal(err)
		}
		c := &raw{stream: st, names: names}
		if slices.Contains(names, "missing") {
			return c, nil // nothing to answer
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return c, resp
	}
	answer := func(c *raw, resp *discovery.DiscoveryResponse, version string, detail *rpcstatus.Status) {
		t.Helper()
		if err := c.stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: c.names,
			VersionInfo: version, ResponseNonce: resp.GetNonce(), ErrorDetail: detail}); err != nil {
			t.Fatal(err)
		}
	}
	await := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not within 10s: %s; the server reports %+v", what, srv.Clients(""))
			}
		}
	}

	acker, first := open("acker", echoCLA)
	answer(acker, first, first.GetVersionInfo(), nil)
	nacker, toReject := open("nacker", echoCLA)
	answer(nacker, toReject, "", &rpcstatus.Status{Code: 3, Message: "endpoint 10.0.0.1: bad weight"})
	frozen, held := open("frozen", echoCLA)
	answer(frozen, held, held.GetVersionInfo(), nil)
	open("wants-more", echoCLA, "missing")
	await("acker synced, nacker nacked, frozen synced", func() bool {
		return streamOf(t, srv, "acker").State == syncstatus.Synced && streamOf(t, srv, "nacker").State == syncstatus.Nacked &&
			streamOf(t, srv, "frozen").Types["eds"].Acked == held.GetVersionInfo() &&
			len(srv.Clients("wants-more")) == 1 && srv.Clients("wants-more")[0].Types["eds"].Subscribed == 2
	})

	a := streamOf(t, srv, "acker")
	eds := a.Types["eds"]
	if a.Replica != "replica-a" || a.Cluster != "east" || a.Locality.Zone != "z1" || a.ConnectedSince.IsZero() ||
		eds.Sent != first.GetVersionInfo() || eds.Acked != first.GetVersionInfo() || eds.Pending || eds.Subscribed != 1 ||
		!slices.Equal(eds.Names, []string{echoCLA}) || len(eds.Differences) != 0 {
		t.Errorf("acker: %+v, eds %+v; want synced at %s with no difference", a, eds, first.GetVersionInfo())
	}
	n := streamOf(t, srv, "nacker").Types["eds"]
	if nack := n.LastNACK; !n.Rejecting || nack == nil || nack.Detail != "endpoint 10.0.0.1: bad weight" ||
		nack.Version != toReject.GetVersionInfo() || nack.Nonce != toReject.GetNonce() || !slices.Equal(nack.Resources, []string{echoCLA}) || nack.Count != 1 {
		t.Errorf("nacker's eds: %+v (NACK %+v); want rejecting %s with the detail and %s", n, n.LastNACK, toReject.GetVersionInfo(), echoCLA)
	}
	if d := n.Differences; len(d) != 1 || d[0].Resource != echoCLA || d[0].Held != "" {
		t.Errorf("nacker acknowledged nothing, so it holds nothing known of %s; differences %+v", echoCLA, d)
	}
	w := streamOf(t, srv, "wants-more").Types["eds"]
	if len(w.Differences) != 2 || w.Differences[0].Resource != "missing" || w.Differences[0].Current != "" || w.Differences[1].Resource != echoCLA {
		t.Errorf("wants-more: differences %+v; want %s (nothing acknowledged) and missing (not served)", w.Differences, echoCLA)
	}

	// A change: the acker takes it, the frozen stream does not answer.
	r2, d := apply(t, r, shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)),
		ep("10.0.0.9", loc("r1", "z1"), ready, eport("grpc", 9090))))
	srv.Update(r2, d)
	next, err := acker.stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	answer(acker, next, next.GetVersionInfo(), nil)
	if _, err := frozen.stream.Recv(); err != nil { // sent, never answered
		t.Fatal(err)
	}
	await("the frozen stream stale, the acker synced at the new version", func() bool {
		return streamOf(t, srv, "frozen").State == syncstatus.Stale && streamOf(t, srv, "acker").Types["eds"].Acked == next.GetVersionInfo()
	})
	f := streamOf(t, srv, "frozen")
	fe := f.Types["eds"]
	if f.StaleSince == nil || !fe.Pending || fe.Acked != held.GetVersionInfo() || fe.Sent != next.GetVersionInfo() {
		t.Errorf("frozen: %+v, eds %+v; want stale since the push, sent %s, acked %s", f, fe, next.GetVersionInfo(), held.GetVersionInfo())
	}
	if d := fe.Differences; len(d) != 1 || d[0].Resource != echoCLA || d[0].Held != held.GetVersionInfo() || d[0].Current != next.GetVersionInfo() {
		t.Errorf("frozen's differences %+v; want %s held at %s, now %s", d, echoCLA, held.GetVersionInfo(), next.GetVersionInfo())
	}
	if d := streamOf(t, srv, "acker").Types["eds"].Differences; len(d) != 0 {
		t.Errorf("the acker holds the new version, yet differences %+v", d)
	}

	// A closed stream is forgotten.
	if err := acker.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	await("the acker forgotten", func() bool { return len(srv.Clients("acker")) == 0 })
	if got := len(srv.Clients("")); got != 3 {
		t.Errorf("%d streams reported, want 3", got)
	}
}
