package federation

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// A buffered full state is bounded by what its shards hold decoded, not by
// the bytes they took on the wire: here 4,000 endpoints take 150 KB sent in
// two chunks and hold more than 600 KiB once decoded.
func TestFullStateBoundCountsWhatIsHeld(t *testing.T) {
	cfg := DefaultHubConfig()
	cfg.MaxFullStateBytes = 600 << 10
	h := startHub(t, cfg)
	stream, _ := rawSession(t, dial(t, h.addr, testTokens["east"]), "east")
	chunk := func(name string) *fedv1.Shard {
		var addrs []string
		for i := range 2000 {
			addrs = append(addrs, fmt.Sprintf("10.%d.%d.%d", len(name), i>>8, i&255))
		}
		return ShardToProto(testShard("east", name, addrs...))
	}
	a, b := chunk("a"), chunk("bb")
	wire := proto.Size(a) + proto.Size(b)
	if wire >= cfg.MaxFullStateBytes {
		t.Fatalf("the chunks take %d bytes on the wire: the test wants fewer than the bound, %d", wire, cfg.MaxFullStateBytes)
	}
	if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "1a", Version: 1, FullState: true, Upserts: []*fedv1.Shard{a}}); m.GetAck() == nil {
		t.Fatalf("the first chunk (under the bound) answered %v", m)
	}
	m := sendUpdate(t, stream, &fedv1.Update{Nonce: "1b", Version: 1, FullState: true, LastChunk: true, Upserts: []*fedv1.Shard{b}})
	if m.GetNack() == nil || !strings.Contains(m.GetNack().String(), "decoded") {
		t.Fatalf("a full state of %d bytes on the wire that holds more than %d decoded answered %v, want a NACK saying so", wire, cfg.MaxFullStateBytes, m)
	}
	if n := h.store.appliedCount(); n != 0 {
		t.Errorf("the refused full state changed the hub's state (%d applies)", n)
	}
}

// Digests and gateway announcements take from the cluster's update rate:
// a flood of them waits for it (each could cost a resync or a topology
// rebuild), as a flood of updates does. Here the rate never refills: the
// burst is taken, and the next message waits.
func TestDigestsAndAnnouncementsShareTheUpdateRate(t *testing.T) {
	for _, kind := range []string{"digests", "announcements"} {
		t.Run(kind, func(t *testing.T) {
			cfg := DefaultHubConfig()
			cfg.UpdatesPerSecond, cfg.UpdateBurst = 1e-9, 5
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var throttled atomic.Int32
			store := newMemStore()
			srv := NewHubServer(cfg, HubWiring{Metrics: HubMetrics{Throttled: func(registry.ClusterID) { throttled.Add(1) }}}, store, &counterEpochs{}, slog.New(slog.DiscardHandler))
			g := grpc.NewServer(grpc.StreamInterceptor(AuthInterceptor(testTokens)))
			fedv1.RegisterFederationServer(g, srv)
			go func() { _ = g.Serve(lis) }()
			t.Cleanup(g.Stop)

			// No deadline on the stream: a wait for the rate past it would end the session.
			stream, err := fedv1.NewFederationClient(dial(t, lis.Addr().String(), testTokens["east"])).Publish(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "east"}}}); err != nil {
				t.Fatal(err)
			}
			if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
				t.Fatalf("hello answered %v, %v", m, err)
			}
			if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true}); m.GetAck() == nil {
				t.Fatalf("the full state answered %v", m)
			}
			for i := range 200 {
				msg := &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Digest{Digest: &fedv1.Digest{Version: 1, Digest: "not-the-digest"}}}
				if kind == "announcements" {
					msg = &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{
						Gateways: []*fedv1.NetworkGateway{{Address: fmt.Sprintf("192.0.2.%d", i%250+1), Port: 15443}}}}}
				}
				if err := stream.Send(msg); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, func() bool { return throttled.Load() > 0 })
			if _, sets := store.gatewaysOf("east"); sets > cfg.UpdateBurst {
				t.Errorf("%d announcements taken, more than the burst of %d", sets, cfg.UpdateBurst)
			}
		})
	}
}

// The update rate is the cluster's, not its session's: a spoke that
// reconnects (or a second credential holder of the cluster racing it)
// gets no fresh burst.
func TestAReconnectGetsNoFreshBurst(t *testing.T) {
	cfg := DefaultHubConfig()
	cfg.UpdatesPerSecond, cfg.UpdateBurst = 1e-9, 5
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var throttled atomic.Int32
	store := newMemStore()
	srv := NewHubServer(cfg, HubWiring{Metrics: HubMetrics{Throttled: func(registry.ClusterID) { throttled.Add(1) }}}, store, &counterEpochs{}, slog.New(slog.DiscardHandler))
	g := grpc.NewServer(grpc.StreamInterceptor(AuthInterceptor(testTokens)))
	fedv1.RegisterFederationServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn := dial(t, lis.Addr().String(), testTokens["east"])
	announce := func(stream fedv1.Federation_PublishClient, n int) {
		t.Helper()
		for i := range n {
			msg := &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{
				Gateways: []*fedv1.NetworkGateway{{Address: fmt.Sprintf("192.0.2.%d", i%250+1), Port: 15443}}}}}
			if err := stream.Send(msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	session := func(ctx context.Context) fedv1.Federation_PublishClient {
		t.Helper()
		stream, err := fedv1.NewFederationClient(conn).Publish(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "east"}}}); err != nil {
			t.Fatal(err)
		}
		if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
			t.Fatalf("hello answered %v, %v", m, err)
		}
		return stream
	}

	first, cancel := context.WithCancel(t.Context())
	announce(session(first), cfg.UpdateBurst+1) // the burst, and one that waits
	waitFor(t, func() bool { return throttled.Load() == 1 })
	waitFor(t, func() bool { _, sets := store.gatewaysOf("east"); return sets == cfg.UpdateBurst })
	cancel()

	announce(session(t.Context()), 1)
	waitFor(t, func() bool { return throttled.Load() == 2 })
	if _, sets := store.gatewaysOf("east"); sets != cfg.UpdateBurst {
		t.Errorf("%d announcements taken in all, want the first session's burst of %d only", sets, cfg.UpdateBurst)
	}
}
