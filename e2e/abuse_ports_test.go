package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/logbuf"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
)

// Attack: requests on the xDS and on the federation port whose headers
// (gRPC metadata) hold 2 MiB, sent by a raw HTTP/2 client that ignores the
// bound the hub announces (a grpc-go client refuses to send them itself):
// 2 MiB decoded from a few KiB on the wire (one header repeated through
// HPACK's dynamic table), 2 MiB on the wire in 2,048 headers, and one
// header value of 2 MiB. Guarantee: the hub announces a header list bound
// of 64 KiB in its HTTP/2 settings; the first request is refused
// (RST_STREAM, FRAME_SIZE_ERROR) and its connection serves on; the other
// two cost the peer its connection (past the bound the server reads no
// more of a header block: golang.org/x/net's framer closes the connection
// at the next CONTINUATION frame, or at a string longer than the bound).
// None is answered or reaches a handler: the hub knows nothing of their
// xDS node, their hello for north never began a session. The legitimate
// client converges.
func TestAbuseHugeRequestHeaders(t *testing.T) {
	a := startAbuseHub(t)
	bound := uint32(hub.DefaultConnectionLimits().MaxHeaderListBytes)
	value := strings.Repeat("p", 1000)
	repeated := make([][2]string, 2048) // 2 MiB decoded: one header, then 2,047 references to it
	distinct := make([][2]string, 2048) // 2 MiB on the wire
	for i := range 2048 {
		repeated[i] = [2]string{"x-padding", value}
		distinct[i] = [2]string{fmt.Sprintf("x-pad-%04d", i), fmt.Sprintf("%04d", i) + value}
	}
	ads := "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
	publish := "/nave.federation.v1.Federation/Publish"
	auth := [2]string{"authorization", "Bearer " + tokens["north"]}
	for _, port := range []struct {
		name, addr, path string
		auth             [][2]string
		// control is a request the hub answers at once; refused one that
		// it would keep, had its headers been let through.
		control, refused proto.Message
	}{
		{"xds", a.XDSAddr.String(), ads, nil,
			&discovery.DiscoveryRequest{Node: &core.Node{Id: "raw-control"}, TypeUrl: resource.ListenerType},
			&discovery.DiscoveryRequest{Node: &core.Node{Id: "padded"}, TypeUrl: resource.ListenerType}},
		{"federation", a.FederationAddr.String(), publish, [][2]string{auth},
			// north's token for west: PERMISSION_DENIED, answered at once and nothing kept.
			&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "west"}}},
			&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "north", SpokeId: "padded"}}}},
	} {
		c := dialRawH2(t, "127.0.0.2", port.addr)
		settings := c.await(t, port.name+": the hub's settings", func(f h2Frame) bool { return f.typ == http2.FrameSettings && !f.ack })
		if got := settings.settings[http2.SettingMaxHeaderListSize]; got != bound {
			t.Errorf("%s: the hub announces a header list bound of %d, want %d", port.name, got, bound)
		}
		// A request with small headers is answered: the raw client speaks gRPC.
		c.headers(t, 1, port.path, port.auth)
		c.message(t, 1, port.control)
		c.await(t, port.name+": the answer to a request with small headers", func(f h2Frame) bool { return f.typ == http2.FrameHeaders && f.stream == 1 })
		// 2 MiB decoded from one frame: the stream is refused, the connection stays.
		wire := c.headers(t, 3, port.path, append(slices.Clone(port.auth), repeated...))
		c.message(t, 3, port.refused)
		t.Logf("%s: 2 MiB of headers in %d bytes on the wire", port.name, wire)
		rst := c.await(t, port.name+": the refusal of 2 MiB of headers", func(f h2Frame) bool {
			return f.stream == 3 && (f.typ == http2.FrameRSTStream || f.typ == http2.FrameHeaders)
		})
		if rst.typ != http2.FrameRSTStream || rst.code != http2.ErrCodeFrameSize {
			t.Errorf("%s: 2 MiB of headers (%d bytes on the wire) answered %v (code %v), want RST_STREAM FRAME_SIZE_ERROR", port.name, wire, rst.typ, rst.code)
		}
		c.ping(t)
		// 2 MiB on the wire, or in one value: the connection is closed, the stream never answered.
		for _, h := range []struct {
			what  string
			extra [][2]string
		}{
			{"2,048 headers of 1 KiB", distinct},
			{"a header value of 2 MiB", [][2]string{{"x-padding", strings.Repeat("p", 2<<20)}}},
		} {
			huge := dialRawH2(t, "127.0.0.2", port.addr)
			huge.headers(t, 1, port.path, append(slices.Clone(port.auth), h.extra...))
			huge.message(t, 1, port.refused)
			if err := huge.closed(t); err != nil {
				t.Errorf("%s: %s: %v", port.name, h.what, err)
			}
			if huge.answered(1) {
				t.Errorf("%s: the request with %s was answered", port.name, h.what)
			}
		}
	}
	a.converges("requests with 2 MiB of headers")
	var info adminapi.ClientsInfo
	a.getJSON(t, "/debug/clients", &info)
	for _, c := range info.Clients {
		if c.NodeID == "padded" {
			t.Error("/debug/clients lists the node of a request whose headers were refused")
		}
	}
	if cs, ok := a.View().Clusters["north"]; ok {
		t.Errorf("a refused hello began a session of north: %+v", cs)
	}
}

// Attack: from one address (127.0.0.2), more kept-alive connections to the
// admin port than one peer may hold; then, from a second address, more
// than the port holds in all. Guarantee: beyond AdminMaxConnectionsPerPeer
// (32) a connection is closed on accept and counted as
// nave_refused_total{port="admin",reason="max_connections_per_peer"},
// while /readyz answers a new connection from 127.0.0.1; at
// AdminMaxConnections, a new connection closes one without a request in
// progress of the address holding the most ("evicted_idle"), so the port
// never holds more than its total and idle connections never keep a health
// probe out. The legitimate client converges throughout.
func TestAbuseAdminConnectionCaps(t *testing.T) {
	const total = 48
	perPeer := hub.DefaultConnectionLimits().AdminMaxConnectionsPerPeer
	a := startAbuseHub(t, func(c *hub.Config) { c.Connections.AdminMaxConnections = total })
	admin := a.AdminAddr.String()
	open := func(from string, n int) (held []net.Conn, refused int) {
		for range n {
			c, err := adminKeptAlive(t, from, admin)
			if err != nil {
				refused++
				continue
			}
			held = append(held, c)
		}
		return held, refused
	}
	first, refused := open("127.0.0.2", perPeer+8)
	if len(first) != perPeer || refused != 8 {
		t.Fatalf("%d connections kept alive from one address, %d refused; want %d kept and 8 refused", len(first), refused, perPeer)
	}
	if code := freshStatus(a.admin + "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz from 127.0.0.1 with 127.0.0.2 over its cap: %d", code)
	}
	a.metricAtLeast(t, `nave_refused_total{port="admin",reason="max_connections_per_peer"}`, 8)
	a.converges("one peer over its admin connections")

	// A second address takes what is left of the port's total, and more:
	// each connection past the total closes one of the address holding the most.
	second, refused := open("127.0.0.3", perPeer)
	if refused != 0 {
		t.Fatalf("%d of a second peer's connections refused with idle ones held; want room made for each", refused)
	}
	a.metricAtLeast(t, `nave_refused_total{port="admin",reason="evicted_idle"}`, float64(len(first)+len(second)-total))
	if code := freshStatus(a.admin + "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz from 127.0.0.1 with the admin port full of idle connections: %d", code)
	}
	a.converges("the admin port's connections all held")
	for _, c := range append(first, second...) {
		c.Close()
	}
	awaitFor(t, "/readyz from a new connection once the attackers let go", time.Minute, func() bool {
		return freshStatus(a.admin+"/readyz") == http.StatusOK
	})
}

// Attack: admin connections that hold the hub without asking anything of
// it: one that sends nothing, one that trickles its request's headers a
// line at a time, one kept alive after its request, and one request with
// 2 MiB of headers. Guarantee: the first two are closed once the header
// timeout (HandshakeTimeout, here 1 s) passes, however long the trickle
// goes on; the kept-alive one after AdminIdleTimeout (here 1 s); the
// oversized request is answered 431 (headers beyond 64 KiB). /readyz still
// answers, and the legitimate client converges.
func TestAbuseAdminSlowAndSilentConnections(t *testing.T) {
	a := startAbuseHub(t, func(c *hub.Config) {
		c.Connections.HandshakeTimeout, c.Connections.AdminIdleTimeout = time.Second, time.Second
	})
	admin := a.AdminAddr.String()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 30 * time.Second}
	dial := func() net.Conn {
		c, err := d.Dial("tcp", admin)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	if err := closedWithin(dial(), time.Minute); err != nil {
		t.Errorf("a silent admin connection: %v", err)
	}

	slow := dial()
	if _, err := io.WriteString(slow, "GET /readyz HTTP/1.1\r\nHost: nave\r\n"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	trickled := make(chan int, 1)
	go func() {
		lines := 0
		defer func() { trickled <- lines }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := fmt.Fprintf(slow, "X-Slow-%d: 1\r\n", lines); err != nil {
				return
			}
			lines++
		}
	}()
	err := closedWithin(slow, time.Minute)
	close(stop)
	lines := <-trickled
	if err != nil {
		t.Errorf("an admin request trickling its headers: %v", err)
	}
	t.Logf("a request trickling its headers was closed after %d lines", lines)

	kept, err := adminKeptAlive(t, "127.0.0.2", admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := closedWithin(kept, time.Minute); err != nil {
		t.Errorf("an idle kept-alive admin connection: %v", err)
	}

	big := dial()
	_ = big.SetDeadline(time.Now().Add(time.Minute))
	go func() { // the hub stops reading past its bound, and closes once it has answered
		_, _ = io.WriteString(big, "GET /readyz HTTP/1.1\r\nHost: nave\r\nX-Padding: "+strings.Repeat("p", 2<<20)+"\r\n\r\n")
	}()
	resp, err := http.ReadResponse(bufio.NewReader(big), nil)
	if err != nil {
		t.Errorf("an admin request with 2 MiB of headers: %v, want 431", err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("an admin request with 2 MiB of headers was answered %s, want 431", resp.Status)
	}

	if code := freshStatus(a.admin + "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the slow and silent connections: %d", code)
	}
	a.converges("slow and silent admin connections")
}

// Attack: a spoke of cluster north floods the hub with gateway
// announcements and digests that do not match (each would cost a topology
// rebuild or a resync), 150 of each, interleaved. Guarantee: they take
// from the cluster's update rate (here 50/s, burst 25) as updates do: at
// any moment the hub has taken at most burst + rate × elapsed of them
// (seen from the spoke: the n-th resync answers the n-th digest, taken
// after the n-th announcement), each waiting one is counted in
// nave_federation_throttled_updates_total{cluster="north"}, none is
// dropped (every digest is answered, the last announcement is held), and
// the legitimate spoke's own updates are not slowed.
func TestAbuseAnnouncementsAndDigestsTakeTheUpdateRate(t *testing.T) {
	const perSecond, burst, pairs = 50, 25, 150
	a := startAbuseHub(t, func(c *hub.Config) { c.Federation.UpdatesPerSecond, c.Federation.UpdateBurst = perSecond, burst })
	start := time.Now() // before the hello: the session's rate starts after it
	st, welcome, err := a.publishAsNorth(&fedv1.Hello{ClusterId: "north", Network: "net-north", SpokeId: "flood"})
	if welcome == nil {
		t.Fatalf("hello: %v", err)
	}
	var (
		mu      sync.Mutex
		answers int
		over    []string
	)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			if m.GetResync() == nil {
				continue
			}
			at := time.Since(start)
			mu.Lock()
			answers++
			if taken := 2 * answers; float64(taken) > burst+perSecond*at.Seconds()+1 {
				over = append(over, fmt.Sprintf("%d taken after %v", taken, at))
			}
			mu.Unlock()
		}
	}()
	gateway := func(i int) *fedv1.NetworkGateway {
		return &fedv1.NetworkGateway{Address: fmt.Sprintf("192.0.2.%d", i%250+1), Port: 15443}
	}
	for i := range pairs {
		if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{
			Gateways: []*fedv1.NetworkGateway{gateway(i)}}}}); err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Digest{Digest: &fedv1.Digest{Version: 0, Digest: "not-the-digest"}}}); err != nil {
			t.Fatal(err)
		}
	}
	a.metricAtLeast(t, `nave_federation_throttled_updates_total{cluster="north"}`, 1)
	a.converges("a flood of gateway announcements and digests")
	a.converges("a flood of gateway announcements and digests")
	awaitFor(t, "every digest answered", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return answers == pairs
	})
	mu.Lock()
	if len(over) > 0 {
		t.Errorf("announcements and digests taken faster than %d/s (burst %d): %v", perSecond, burst, over)
	}
	mu.Unlock()
	t.Logf("%d announcements and %d digests taken in %v", pairs, pairs, time.Since(start).Round(time.Millisecond))
	last := gateway(pairs - 1)
	awaitFor(t, "north's last announcement held", time.Minute, func() bool {
		gws := a.View().Clusters["north"].Gateways
		return len(gws) == 1 && gws[0].Address == last.GetAddress() && gws[0].Port == int32(last.GetPort())
	})
	a.metricAtLeast(t, `nave_federation_resyncs_total{cluster="north",reason="digest"}`, pairs)
}

// Attack: cluster north sends a full state in chunks that are small on the
// wire but hold more than the hub's bound once decoded (endpoints hold 10
// to 16 times their wire bytes). Guarantee: the chunk that takes the
// buffered full state past MaxFullStateBytes, counted as
// registry.Shard.HeldBytes, is NACKed ("full state would hold more than …
// bytes decoded") before the last chunk arrives, the buffered chunks are
// dropped, the last chunk is NACKed too and nothing of that full state is
// applied; the session goes on (a full state within the bound is
// applied), and the other clusters are unaffected.
func TestAbuseFullStateHeldBeyondItsBound(t *testing.T) {
	chunk := func(name string, octet byte) *fedv1.Shard {
		sh := &fedv1.Shard{Service: &fedv1.ServiceKey{Namespace: "flood", Name: name},
			Ports: []*fedv1.ServicePort{{Name: "p", Port: 80, Protocol: "TCP"}}}
		for i := range 2000 {
			sh.Endpoints = append(sh.Endpoints, &fedv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", octet, i>>8, i&255)}, Ready: true})
		}
		return sh
	}
	chunks := []*fedv1.Shard{chunk("a", 1), chunk("b", 2), chunk("c", 3)}
	held := func(p *fedv1.Shard) int {
		sh, err := federation.ShardFromProto("north", p, registry.DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		return sh.HeldBytes()
	}
	// The first chunk fits, the second takes the full state past the bound.
	bound := held(chunks[0]) + held(chunks[1])/2
	wire := 0
	for _, c := range chunks {
		wire += proto.Size(c)
	}
	if wire >= bound {
		t.Fatalf("the chunks take %d bytes on the wire: the test wants fewer than the bound, %d", wire, bound)
	}
	t.Logf("three chunks of %d bytes on the wire in all; the bound is %d bytes held, the first chunk holds %d", wire, bound, held(chunks[0]))
	a := startAbuseHub(t, func(c *hub.Config) { c.Federation.MaxFullStateBytes = bound })
	st, welcome, err := a.publishAsNorth(&fedv1.Hello{ClusterId: "north", Network: "net-north", SpokeId: "heavy"})
	if welcome == nil {
		t.Fatalf("hello: %v", err)
	}
	send := func(u *fedv1.Update) *fedv1.HubMessage {
		t.Helper()
		if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("update %s: %v", u.GetNonce(), err)
		}
		return m
	}
	if m := send(&fedv1.Update{Nonce: "1a", Version: 1, FullState: true, Upserts: chunks[:1]}); m.GetAck() == nil {
		t.Fatalf("the first chunk, within the bound, was answered %v", m)
	}
	if m := send(&fedv1.Update{Nonce: "1b", Version: 1, FullState: true, Upserts: chunks[1:2]}); m.GetNack() == nil ||
		!strings.Contains(m.GetNack().String(), fmt.Sprintf("full state would hold more than %d bytes decoded", bound)) {
		t.Fatalf("the chunk that takes the full state past %d bytes held (%d on the wire in all) was answered %v, want a NACK saying so", bound, wire, m)
	}
	if m := send(&fedv1.Update{Nonce: "1c", Version: 1, FullState: true, LastChunk: true, Upserts: chunks[2:]}); m.GetNack() == nil {
		t.Fatalf("the last chunk of the refused full state was answered %v, want a NACK", m)
	}
	for _, name := range []string{"flood/a", "flood/b", "flood/c"} {
		if got := a.clustersOf(name); len(got) != 0 {
			t.Errorf("%s of the refused full state is published by %v", name, got)
		}
	}
	a.metricAtLeast(t, `nave_federation_updates_total{cluster="north",kind="full",result="nack"}`, 2)
	a.converges("a full state held beyond its bound")
	if got := a.clustersOf("default/echo"); !slices.Equal(got, []registry.ClusterID{"east"}) {
		t.Errorf("echo is published by %v", got)
	}
	// The session goes on: a full state within the bound is applied.
	if m := send(&fedv1.Update{Nonce: "2", Version: 2, FullState: true, LastChunk: true, Upserts: chunks[:1]}); m.GetAck().GetDigest() == "" {
		t.Fatalf("a full state within the bound was answered %v", m)
	}
	await(t, "north's full state within the bound applied", func() bool { return slices.Equal(a.clustersOf("flood/a"), []registry.ClusterID{"north"}) })
}

// Attack: sessions of one cluster that supersede each other while they
// start: a second session of north while the first is in its full state,
// then, for fresh clusters (each first session records the cluster in the
// catalog before it begins), eight sessions at once, each saying hello and
// starting a full state. Guarantee: a superseded session ends with ABORTED
// saying it was superseded, wherever it was (before its welcome, while it
// began, in its full state), never UNAVAILABLE "context canceled"; exactly
// the newest survives; nothing of a superseded full state is applied; the
// legitimate client converges.
func TestAbuseSessionsSupersededWhileStarting(t *testing.T) {
	racers := federation.Tokens{}
	all := federation.Tokens{}
	for c, tok := range tokens {
		all[c] = tok
	}
	for i := range 4 {
		c := registry.ClusterID(fmt.Sprintf("race-%d", i))
		racers[c] = fmt.Sprintf("race-%d-token-0123456789abcdef", i)
		all[c] = racers[c]
	}
	b, err := yaml.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	tokensFile := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(tokensFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	a := startAbuseHub(t, func(c *hub.Config) { c.TokensFile = tokensFile })
	superseded := func(err error) bool {
		return status.Code(err) == codes.Aborted && strings.Contains(err.Error(), "superseded")
	}
	fullState := func(name string, last bool) *fedv1.SpokeMessage {
		return &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: last,
			Upserts: []*fedv1.Shard{{Service: &fedv1.ServiceKey{Namespace: "flood", Name: name},
				Ports: []*fedv1.ServicePort{{Name: "p", Port: 80, Protocol: "TCP"}}}}}}}
	}

	// Superseded in its full state.
	first, welcome, err := a.publishAsNorth(&fedv1.Hello{ClusterId: "north", Network: "net-north", SpokeId: "first"})
	if welcome == nil {
		t.Fatalf("the first session: %v", err)
	}
	if err := first.Send(fullState("first", false)); err != nil {
		t.Fatal(err)
	}
	if m, err := first.Recv(); m.GetAck() == nil {
		t.Fatalf("the first chunk: %v, %v", m, err)
	}
	second, welcome, err := a.publishAsNorth(&fedv1.Hello{ClusterId: "north", Network: "net-north", SpokeId: "second"})
	if welcome == nil {
		t.Fatalf("the second session: %v", err)
	}
	if _, err := first.Recv(); !superseded(err) {
		t.Errorf("the session superseded in its full state ended with %v, want Aborted saying it was superseded", err)
	}
	if err := second.Send(fullState("second", true)); err != nil {
		t.Fatal(err)
	}
	if m, err := second.Recv(); m.GetAck().GetDigest() == "" {
		t.Fatalf("the second session's full state: %v, %v", m, err)
	}
	if got := a.clustersOf("flood/first"); len(got) != 0 {
		t.Errorf("the superseded full state is published by %v", got)
	}
	a.converges("a session superseded in its full state")

	// Eight sessions of a fresh cluster at once.
	const n = 8
	type outcome struct {
		epoch uint64 // 0: no welcome
		err   error  // how it ended (nil: still live)
	}
	beforeWelcome, afterWelcome := 0, 0
	for cluster, token := range racers {
		ctx, cancel := context.WithCancel(a.ctx)
		conn := dialFederationFrom(t, "127.0.0.2", a.FederationAddr.String(), token)
		client := fedv1.NewFederationClient(conn)
		var mu sync.Mutex
		outcomes := make([]outcome, n)
		ended := 0
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				var epoch uint64
				err := func() error {
					st, err := client.Publish(ctx)
					if err != nil {
						return err
					}
					if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{
						ClusterId: string(cluster), Network: "net-race", SpokeId: fmt.Sprintf("racer-%d", i)}}}); err != nil && err != io.EOF {
						return err
					}
					m, err := st.Recv()
					if err != nil {
						return err
					}
					epoch = m.GetWelcome().GetEpoch()
					mu.Lock()
					outcomes[i].epoch = epoch
					mu.Unlock()
					if err := st.Send(fullState(fmt.Sprintf("racer-%d", i), false)); err != nil && err != io.EOF {
						return err
					}
					for {
						if _, err := st.Recv(); err != nil {
							return err
						}
					}
				}()
				mu.Lock()
				defer mu.Unlock()
				if ctx.Err() == nil {
					outcomes[i].err, ended = err, ended+1
				}
			})
		}
		// The newest may still be on its way to its welcome when the others have ended.
		awaitFor(t, fmt.Sprintf("all but one of %d sessions of %s ended, that one welcomed", n, cluster), time.Minute, func() bool {
			mu.Lock()
			defer mu.Unlock()
			welcomed := 0
			for _, o := range outcomes {
				if o.err == nil && o.epoch != 0 {
					welcomed++
				}
			}
			return ended == n-1 && welcomed == 1
		})
		mu.Lock()
		var newest uint64
		for _, o := range outcomes {
			newest = max(newest, o.epoch)
		}
		live := 0
		for i, o := range outcomes {
			switch {
			case o.err == nil:
				live++
				if o.epoch != newest {
					t.Errorf("%s: session %d (epoch %d) lives on, not the newest (epoch %d)", cluster, i, o.epoch, newest)
				}
			case !superseded(o.err):
				t.Errorf("%s: session %d (epoch %d) ended with %v, want Aborted saying it was superseded", cluster, i, o.epoch, o.err)
			case o.epoch == 0:
				beforeWelcome++
			default:
				afterWelcome++
			}
		}
		mu.Unlock()
		if live != 1 {
			t.Errorf("%s: %d sessions live on, want 1", cluster, live)
		}
		cancel()
		wg.Wait()
	}
	t.Logf("superseded sessions: %d before their welcome, %d after it", beforeWelcome, afterWelcome)
	a.converges("sessions superseding each other as they start")
}

// Attack: 100 refusals, 25 of each of four kinds, every one carrying a
// string of 1 MiB: xDS requests with a node ID of 1 MiB, hellos with a
// spoke ID of 1 MiB, updates with a nonce of 1 MiB (NACKed), digests of
// 1 MiB (each asks for a resync). Guarantee (limits/logs.go): each
// value from a peer is cut to 256 bytes in the hub's log, and each reason
// logs at most 10 lines a minute: the hub's log (at the default level,
// info) grows by less than 64 KiB, and the legitimate client converges.
func TestAbuseRefusalsKeepTheLogSmall(t *testing.T) {
	var logs logbuf.Buffer
	a := startAbuseHubLogging(t, &logs)
	a.converges("the hub's start")
	before := len(logs.String())
	filler := strings.Repeat("Z", 1<<20)
	const each = 25
	start := time.Now()

	ads := discovery.NewAggregatedDiscoveryServiceClient(dialFrom(t, "127.0.0.2", a.XDSAddr.String()))
	for range each {
		st, err := ads.StreamAggregatedResources(a.ctx)
		if err == nil {
			err = st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: filler}, TypeUrl: resource.ListenerType})
		}
		if err == nil || err == io.EOF {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("an xDS request with a node ID of 1 MiB: %.300v, want InvalidArgument", err)
		}
	}

	t.Logf("xDS requests refused in %v", time.Since(start).Round(time.Millisecond))
	fed := fedv1.NewFederationClient(dialFederationFrom(t, "127.0.0.2", a.FederationAddr.String(), tokens["north"]))
	for range each {
		st, err := fed.Publish(a.ctx)
		if err == nil {
			err = st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "north", SpokeId: filler}}})
		}
		if err == nil || err == io.EOF {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a hello with a spoke ID of 1 MiB: %.300v, want InvalidArgument", err)
		}
	}

	t.Logf("hellos refused in %v", time.Since(start).Round(time.Millisecond))
	st, err := fed.Publish(a.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: "north", Network: "net-north", SpokeId: "loud"}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); m.GetWelcome() == nil {
		t.Fatalf("hello: %v, %v", m, err)
	}
	for range each {
		// Version 0 is never above the last applied one: NACKed, the nonce repeated.
		if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: &fedv1.Update{Nonce: filler, Version: 0}}}); err != nil {
			t.Fatal(err)
		}
		if m, err := st.Recv(); m.GetNack() == nil {
			t.Fatalf("an update with a nonce of 1 MiB: %.300v, %v; want a NACK", m, err)
		}
		if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Digest{Digest: &fedv1.Digest{Digest: filler}}}); err != nil {
			t.Fatal(err)
		}
		if m, err := st.Recv(); m.GetResync() == nil {
			t.Fatalf("a digest of 1 MiB: %.300v, %v; want a resync", m, err)
		}
	}
	a.converges("refusals of 1 MiB strings")

	grown := logs.String()[before:]
	t.Logf("the hub's log grew by %d bytes in %d lines during %d refusals of 1 MiB strings (%v)", len(grown), strings.Count(grown, "\n"), 4*each,
		time.Since(start).Round(time.Millisecond))
	if len(grown) >= 64<<10 {
		t.Errorf("the hub's log grew by %d bytes during the refusals, want less than 64 KiB", len(grown))
	}
	if strings.Contains(grown, strings.Repeat("Z", 300)) {
		t.Error("the hub's log holds more than 256 bytes of a peer's string")
	}
	for _, msg := range []string{
		"refused an xDS request whose node has a string too long",
		"refused a spoke's hello",
		"update rejected",
		"asking spoke for a resync",
	} {
		if n := strings.Count(grown, msg); n == 0 || n > 10 {
			t.Errorf("%d lines %q for %d refusals, want 1 to 10", n, msg, each)
		}
	}
	for _, line := range strings.Split(grown, "\n") {
		if len(line) > 4<<10 {
			t.Errorf("a log line of %d bytes: %.300s", len(line), line)
		}
	}
	if t.Failed() {
		t.Logf("the hub's log during the refusals:\n%s", grown)
	}
}

// startAbuseHubLogging is startAbuseHub with the hub's log (at the
// default level, info) written to w.
func startAbuseHubLogging(t *testing.T, w io.Writer) *abuseHub {
	dir := t.TempDir()
	tb, _ := yaml.Marshal(tokens)
	tokensFile := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokensFile, tb, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := hub.DefaultConfig()
	cfg.ID, cfg.DataDir, cfg.TokensFile = "test-hub", filepath.Join(dir, "data"), tokensFile
	cfg.FederationAddr, cfg.XDSAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Connections.XDSStreamsPerPeer = 1000
	hubCtx, stop := context.WithCancel(context.Background())
	h, err := hub.Start(hubCtx, cfg, slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		stop()
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(); _ = h.Wait() })
	th := &testHub{Hub: h, admin: "http://" + h.AdminAddr.String()}
	ctx, cancel := context.WithCancel(testContext(t))
	t.Cleanup(cancel)
	a := &abuseHub{testHub: th, t: t, ctx: ctx, dir: filepath.Join(t.TempDir(), "east"),
		backends: []xdstest.Backend{xdstest.StartBackend(t, "a", "127.0.0.1"), xdstest.StartBackend(t, "b", "127.0.0.1")}}
	writeService(t, a.dir, "echo", endpoint{a.backends[0], "z1", true})
	startSpoke(t, th, "east", a.dir, "r1")
	client := xdstest.NewClient(t, h.XDSAddr.String(), "legit", locality("r1", "z1"), "echo.default.svc.clusterset.local:8080")
	a.poller = xdstest.StartPoller(ctx, t, "legit", client)
	t.Cleanup(cancel) // runs before the poller's cleanup waits for it
	return a
}

// dialFederationFrom connects to a federation port from another loopback
// address, presenting token; closed when the test ends.
func dialFederationFrom(t *testing.T, from, addr, token string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: token, AllowInsecure: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)), // NACKs repeat what they refuse
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// adminKeptAlive opens a connection to the admin port from another loopback
// address and asks /healthz on it, keeping it alive; it fails when the hub
// closes it instead (refused on accept). The connection is closed when the
// test ends.
func adminKeptAlive(t *testing.T, from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 30 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: nave\r\n\r\n"); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		return nil, fmt.Errorf("GET /healthz: %s (close: %v)", resp.Status, resp.Close)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// freshStatus GETs url on a new connection (none of a pool), from 127.0.0.1.
func freshStatus(url string) int {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// rawH2 is an HTTP/2 connection without grpc-go's client, which keeps to
// the bounds a server announces: it sends what a hostile peer would.
type rawH2 struct {
	conn   net.Conn
	fr     *http2.Framer
	frames chan h2Frame
	done   chan struct{} // closed once the connection ended
	mu     sync.Mutex
	seen   []h2Frame
	err    error // how the connection ended
}

// h2Frame is what the test needs of a frame the server sent.
type h2Frame struct {
	typ      http2.FrameType
	stream   uint32
	code     http2.ErrCode
	ack      bool
	settings map[http2.SettingID]uint32
}

// dialRawH2 connects from another loopback address and sends the client
// preface and settings; a goroutine reads what the server sends.
func dialRawH2(t *testing.T, from, addr string) *rawH2 {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 30 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetWriteDeadline(time.Now().Add(time.Minute))
	c := &rawH2{conn: conn, fr: http2.NewFramer(conn, conn), frames: make(chan h2Frame, 256), done: make(chan struct{})}
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				return
			}
			hf := h2Frame{typ: f.Header().Type, stream: f.Header().StreamID}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				hf.code = f.ErrCode
			case *http2.GoAwayFrame:
				hf.code = f.ErrCode
			case *http2.SettingsFrame:
				hf.ack = f.IsAck()
				hf.settings = map[http2.SettingID]uint32{}
				_ = f.ForeachSetting(func(s http2.Setting) error { hf.settings[s.ID] = s.Val; return nil })
			case *http2.PingFrame:
				hf.ack = f.IsAck()
			}
			c.mu.Lock()
			c.seen = append(c.seen, hf)
			c.mu.Unlock()
			select {
			case c.frames <- hf:
			default: // the test waits for none of the rest
			}
		}
	}()
	return c
}

// headers opens stream id with a gRPC request for path carrying extra
// headers, in frames of at most 16 KiB (HTTP/2's default frame size), and
// returns the size of the header block on the wire.
func (c *rawH2) headers(t *testing.T, id uint32, path string, extra [][2]string) int {
	t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	fields := append([][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "nave"},
		{"content-type", "application/grpc"}, {"te", "trailers"}}, extra...)
	for _, f := range fields {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	b := block.Bytes()
	const frame = 16 << 10
	first := b[:min(frame, len(b))]
	// A hub that closes the connection part way fails the writes: the caller checks how it ended.
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(b) <= frame}); err != nil {
		return len(b)
	}
	for rest := b[len(first):]; len(rest) > 0; {
		n := min(frame, len(rest))
		if err := c.fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			return len(b)
		}
		rest = rest[n:]
	}
	return len(b)
}

// message sends m on stream id as one gRPC message (on a connection the
// server closed, it is lost: the caller checks how the stream ended).
func (c *rawH2) message(t *testing.T, id uint32, m proto.Message) {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.fr.WriteData(id, false, append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...))
}

// ping sends a PING and waits for its answer: the connection serves.
func (c *rawH2) ping(t *testing.T) {
	t.Helper()
	if err := c.fr.WritePing(false, [8]byte{'n', 'a', 'v', 'e'}); err != nil {
		t.Fatal(err)
	}
	c.await(t, "the answer to a PING", func(f h2Frame) bool { return f.typ == http2.FramePing && f.ack })
}

// await returns the first frame (from now on) for which match holds,
// failing the test after a minute or when the connection ends first.
func (c *rawH2) await(t *testing.T, what string, match func(h2Frame) bool) h2Frame {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case f := <-c.frames:
			if match(f) {
				return f
			}
		case <-c.done:
			// The reader may have queued the frame just before it ended.
			for {
				select {
				case f := <-c.frames:
					if match(f) {
						return f
					}
				default:
					c.mu.Lock()
					defer c.mu.Unlock()
					t.Fatalf("%s: the connection ended first (%v), after %+v", what, c.err, c.seen)
				}
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// closed waits, at most a minute, for the server to close the connection.
func (c *rawH2) closed(t *testing.T) error {
	t.Helper()
	select {
	case <-c.done:
		return nil
	case <-time.After(time.Minute):
		return errors.New("the connection is still open after a minute")
	}
}

// answered says whether the server sent headers on stream id.
func (c *rawH2) answered(id uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(c.seen, func(f h2Frame) bool { return f.typ == http2.FrameHeaders && f.stream == id })
}
