package federation

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

func gw(t *testing.T, s string) registry.Gateway {
	t.Helper()
	g, err := registry.ParseGateway(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestSpokeAnnouncesGatewaysInItsHelloAndWhenTheyChange(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	conn := dial(t, h.addr, testTokens["east"])
	p := startPublisher(t, conn, "east", fastSpoke())
	// Known before the session opens: the hello carries them.
	if err := p.pub.SetGateways([]registry.Gateway{gw(t, "192.0.2.7:15443"), gw(t, "gw.east.example.com:15443"), gw(t, "192.0.2.7:15443")}); err != nil {
		t.Fatal(err)
	}
	p.states <- stateOf(testShard("east", "a", "10.0.0.1"))
	p.awaitAcked(t, 1)
	want := []registry.Gateway{{Address: "192.0.2.7", Port: 15443}, {Address: "gw.east.example.com", Port: 15443}}
	waitFor(t, func() bool { got, _ := h.store.gatewaysOf("east"); return slices.Equal(got, want) })

	// A change mid-session is sent; the same set again is not.
	next := []registry.Gateway{gw(t, "[2001:db8::1]:15443")}
	if err := p.pub.SetGateways(next); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { got, _ := h.store.gatewaysOf("east"); return slices.Equal(got, next) })
	_, sets := h.store.gatewaysOf("east")
	if err := p.pub.SetGateways(next); err != nil {
		t.Fatal(err)
	}
	// Withdrawing every gateway is an announcement too.
	if err := p.pub.SetGateways(nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { got, _ := h.store.gatewaysOf("east"); return len(got) == 0 })
	if _, n := h.store.gatewaysOf("east"); n != sets+1 {
		t.Errorf("%d announcements after the change, want 1 (the repeated set is not sent)", n-sets)
	}
}

// eastWithAGateway is a hub and east's publisher, whose announced gateway the hub holds.
func eastWithAGateway(t *testing.T) (*testHub, *publisher, []registry.Gateway) {
	t.Helper()
	h := startHub(t, DefaultHubConfig())
	conn := dial(t, h.addr, testTokens["east"])
	p := startPublisher(t, conn, "east", fastSpoke())
	good := []registry.Gateway{gw(t, "192.0.2.7:15443")}
	if err := p.pub.SetGateways(good); err != nil {
		t.Fatal(err)
	}
	p.states <- stateOf(testShard("east", "a", "10.0.0.1"))
	p.awaitAcked(t, 1)
	waitFor(t, func() bool { got, _ := h.store.gatewaysOf("east"); return slices.Equal(got, good) })
	return h, p, good
}

func TestInvalidGatewaysAreRefusedAndChangeNothing(t *testing.T) {
	h, p, good := eastWithAGateway(t)
	for _, bad := range [][]registry.Gateway{
		{{Address: "192.0.2.7", Port: 0}},
		{{Address: "not a host", Port: 15443}},
		{{Address: "0.0.0.0", Port: 15443}},
		{{Address: "fe80::1%eth0", Port: 15443}},
		make([]registry.Gateway, registry.MaxGateways+1),
	} {
		if err := p.pub.SetGateways(bad); err == nil {
			t.Errorf("SetGateways(%v) = nil, want an error", bad)
		}
	}
	// A spoke that sends bad gateways anyway: the hub keeps what it held.
	stream, welcome := rawSession(t, dial(t, h.addr, testTokens["west"]), "west")
	if welcome == nil {
		t.Fatal("session refused")
	}
	_ = stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{
		Gateways: []*fedv1.NetworkGateway{{Address: "192.0.2.9", Port: 70000}}}}})
	_ = stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{
		Gateways: []*fedv1.NetworkGateway{{Address: "192.0.2.9", Port: 15443}}}}})
	waitFor(t, func() bool { got, _ := h.store.gatewaysOf("west"); return len(got) == 1 && got[0].Port == 15443 })
	if got, _ := h.store.gatewaysOf("east"); !slices.Equal(got, good) {
		t.Errorf("east holds %v, want %v", got, good)
	}
}

func TestAHelloWithoutGatewaysKeepsWhatTheHubHolds(t *testing.T) {
	h, _, good := eastWithAGateway(t)
	// A restarted spoke that does not know its gateways yet says nothing of them.
	stream, welcome := rawSession(t, dial(t, h.addr, testTokens["east"]), "east")
	if welcome == nil {
		t.Fatal("session refused")
	}
	_ = stream.CloseSend()
	if got, _ := h.store.gatewaysOf("east"); !slices.Equal(got, good) {
		t.Errorf("after a hello without gateways the hub holds %v, want %v", got, good)
	}
}

// oldHub is a hub from before gateways: its welcome names no capability,
// and it ends a session on a message it does not know.
type oldHub struct {
	fedv1.UnimplementedFederationServer
	kinds chan string
}

func (h *oldHub) Publish(stream fedv1.Federation_PublishServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Welcome{Welcome: &fedv1.Welcome{Epoch: 1, MaxMessageBytes: 1 << 20}}}); err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		h.kinds <- fmt.Sprintf("%T", m.GetKind())
	}
}

// A spoke never sends a hub that predates gateways a NetworkGateways message.
func TestSpokeSendsNoGatewaysToAnOlderHub(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &oldHub{kinds: make(chan string, 100)}
	g := grpc.NewServer()
	fedv1.RegisterFederationServer(g, h)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	p := startPublisher(t, dial(t, lis.Addr().String(), ""), "east", fastSpoke())
	p.states <- stateOf(testShard("east", "a", "10.0.0.1"))
	if kind := <-h.kinds; !strings.Contains(kind, "Update") {
		t.Fatalf("first message after the welcome: %s", kind)
	}
	if err := p.pub.SetGateways([]registry.Gateway{gw(t, "192.0.2.7:15444")}); err != nil {
		t.Fatal(err)
	}
	select {
	case kind := <-h.kinds:
		if strings.Contains(kind, "Gateways") {
			t.Fatalf("the spoke sent %s to a hub that does not take it", kind)
		}
	case <-time.After(300 * time.Millisecond):
	}
}
