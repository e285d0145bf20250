package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// The floods of issue 24, as the flood mode drives them (see floods.go).

func floodSpecs() []floodSpec {
	return []floodSpec{
		{key: "a", title: "1,100 short xDS streams, a locality each", run: floodLocalities},
		{key: "b", title: "20 xDS streams naming a 2 MiB region", run: floodBigRegion},
		{key: "c", title: "40 xDS streams with a 4 MiB node ID, then GET /debug/clients", run: floodBigNodeID},
		{key: "d", title: "32 xDS streams with 2 MiB of gRPC metadata", run: floodBigHeaders},
		{key: "e", title: "1,000 idle keep-alive admin connections", run: floodAdminConns},
		{key: "f", title: "a hello with a 1.6 MiB spoke_build", run: floodBigHello, afterStop: catalogAfterBigHello},
		{key: "g", title: "150k gateway announcements (or 10 s of them)", run: floodGateways},
	}
}

var errNoAnswer = fmt.Errorf("no answer within %s", floodAnswerWait)

// codeOf is how a flood stream ended: its gRPC code, or what else.
func codeOf(err error) string {
	switch {
	case err == nil:
		return "OK"
	case errors.Is(err, errNoAnswer):
		return "no answer"
	}
	if s, ok := status.FromError(err); ok {
		return s.Code().String()
	}
	return "error: " + firstLine(err.Error())
}

// askEDS opens an ADS stream on ctx (it lives until ctx ends), asks for
// the endpoints of service 0 as node, and waits for the first answer.
func (e *floodEnv) askEDS(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, node *core.Node) (*discovery.DiscoveryResponse, error) {
	st, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	// A stream the hub ended makes Send return io.EOF: Recv says why.
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{e.names.cluster[0]}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	type answer struct {
		resp *discovery.DiscoveryResponse
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		resp, err := st.Recv()
		ch <- answer{resp, err}
	}()
	select {
	case a := <-ch:
		return a.resp, a.err
	case <-time.After(floodAnswerWait):
		return nil, errNoAnswer
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// floodXDS opens n streams on conns connections from the attack block, all
// at once (node(i) names each stream's node), holds them until each has an
// answer, calls between, then closes them and waits for the hub to see it.
func (e *floodEnv) floodXDS(ctx context.Context, r *floodResult, n, conns int, node func(i int) *core.Node, between func()) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ads []discovery.AggregatedDiscoveryServiceClient
	for i := range conns {
		conn, err := e.conn(e.hub.xds, i)
		if err != nil {
			return err
		}
		defer conn.Close()
		ads = append(ads, discovery.NewAggregatedDiscoveryServiceClient(conn))
	}
	var o outcomes
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := e.askEDS(sctx, ads[i%conns], node(i))
			o.add(codeOf(err))
		})
	}
	wg.Wait()
	o.into(r)
	r.Total, r.Refused = n, n-r.Outcomes["OK"]
	between()
	cancel()
	e.awaitXDSClients(ctx, 1)
	return nil
}

// a. Short streams, each naming a locality of its own and asking for
// endpoints (16 at a time), then an honest client of a zone nobody asked
// for yet: is its own zone first?
func floodLocalities(ctx context.Context, e *floodEnv, r *floodResult, mid func()) error {
	const n, workers = 1100, 16
	conn, err := e.conn(e.hub.xds, 0)
	if err != nil {
		return err
	}
	defer conn.Close()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	var o outcomes
	var next, done atomic.Int64
	var wg, midWG sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				sctx, cancel := context.WithCancel(ctx)
				_, err := e.askEDS(sctx, ads, &core.Node{Id: fmt.Sprintf("flood-a-%04d", i),
					Locality: &core.Locality{Region: fmt.Sprintf("flood-%04d", i), Zone: "z"}})
				cancel()
				o.add(codeOf(err))
				if done.Add(1) == n/2 {
					midWG.Go(mid) // the other half goes on meanwhile
				}
			}
		})
	}
	wg.Wait()
	midWG.Wait()
	o.into(r)
	r.Total, r.Refused = n, n-r.Outcomes["OK"]
	e.awaitXDSClients(ctx, 1)
	if m, err := e.hub.metrics(ctx); err == nil {
		r.note("locality groups the hub holds after the flood (nave_xds_locality_groups): %.0f", m.sum("nave_xds_locality_groups", ""))
	}
	own, desc, err := e.ownZone(ctx)
	if err != nil {
		r.note("an honest client of a new zone afterwards: %v", err)
		r.Outcomes["honest new zone: no answer"]++
		return nil
	}
	verdict := "its own zone first"
	if !own {
		verdict = "NOT its own zone first"
	}
	r.note("an honest client of a new zone afterwards got %s (priority by zone: %s)", verdict, desc)
	r.Outcomes["honest new zone: "+verdict]++
	return nil
}

// ownZone asks for service 0's endpoints as a client of zone c of region
// 0 (the honest client is in zone a; no one asked for c) and reports
// whether c alone is at priority 0.
func (e *floodEnv) ownZone(ctx context.Context) (bool, string, error) {
	region := regionOf(0)
	zone := zoneOf(region, 2)
	conn, err := grpc.NewClient(e.hub.xds, e.attack.options(loopbackAddr(clientBlock, 1), nil)...)
	if err != nil {
		return false, "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := e.askEDS(ctx, discovery.NewAggregatedDiscoveryServiceClient(conn),
		&core.Node{Id: "honest-new-zone", Locality: &core.Locality{Region: region, Zone: zone}})
	if err != nil {
		return false, "", err
	}
	if len(resp.GetResources()) != 1 {
		return false, "", fmt.Errorf("%d assignments, want 1", len(resp.GetResources()))
	}
	var cla endpoint.ClusterLoadAssignment
	if err := resp.GetResources()[0].UnmarshalTo(&cla); err != nil {
		return false, "", err
	}
	prio := map[string]uint32{}
	for _, le := range cla.GetEndpoints() {
		prio[le.GetLocality().GetZone()] = le.GetPriority()
	}
	own := len(prio) > 1
	var desc []string
	for _, z := range slices.Sorted(maps.Keys(prio)) {
		desc = append(desc, fmt.Sprintf("%s %d", z, prio[z]))
		if (z == zone) != (prio[z] == 0) {
			own = false
		}
	}
	return own, strings.Join(desc, ", "), nil
}

// b. Streams naming a region of 2 MiB each, held open.
func floodBigRegion(ctx context.Context, e *floodEnv, r *floodResult, mid func()) error {
	const n, size = 20, 2 << 20
	return e.floodXDS(ctx, r, n, 1, func(i int) *core.Node {
		return &core.Node{Id: fmt.Sprintf("flood-b-%02d", i),
			Locality: &core.Locality{Region: fmt.Sprintf("%05d", i) + strings.Repeat("r", size-5), Zone: "z"}}
	}, mid)
}

// c. Streams whose node ID is just under 4 MiB (the hub's gRPC messages
// are 4 MiB at most: a 4 MiB ID would not reach it), held open; then the
// admin port lists the xDS clients.
func floodBigNodeID(ctx context.Context, e *floodEnv, r *floodResult, mid func()) error {
	const n, conns, size = 40, 4, 4<<20 - 1<<10
	r.note("node IDs of %d bytes (4 MiB less 1 KiB, so that a request fits the hub's 4 MiB gRPC message bound)", size)
	return e.floodXDS(ctx, r, n, conns, func(i int) *core.Node {
		prefix := fmt.Sprintf("flood-c-%02d-", i)
		return &core.Node{Id: prefix + strings.Repeat("n", size-len(prefix))}
	}, func() {
		start := time.Now()
		code, size, err := e.getDiscard(ctx, "/debug/clients")
		took := time.Since(start)
		rss, _, _ := procUsage(e.hub.pid())
		if err != nil {
			r.note("GET /debug/clients while the streams were open: %v after %s; the hub's RSS then %s", err, took.Round(time.Millisecond), mib(rss))
		} else {
			r.note("GET /debug/clients while the streams were open: %d, %s in %s; the hub's RSS right after it %s",
				code, mib(float64(size)), took.Round(time.Millisecond), mib(rss))
		}
		mid()
	})
}

// d. Streams each carrying 2 MiB of headers (128 of 16 KiB), over raw
// HTTP/2 connections that ignore the hub's advertised header bound (a
// grpc-go client would refuse to send them itself), held open.
func floodBigHeaders(ctx context.Context, e *floodEnv, r *floodResult, mid func()) error {
	const n, headers, valueBytes = 32, 128, 16 << 10
	var hs [][2]string
	for i := range headers {
		hs = append(hs, [2]string{fmt.Sprintf("x-flood-%03d", i), strings.Repeat("v", valueBytes)})
	}
	var o outcomes
	var wg sync.WaitGroup
	conns := make([]*h2Conn, n)
	for i := range n {
		wg.Go(func() {
			req, _ := proto.Marshal(&discovery.DiscoveryRequest{Node: &core.Node{Id: fmt.Sprintf("flood-d-%02d", i)},
				TypeUrl: resource.EndpointType, ResourceNames: []string{e.names.cluster[0]}})
			c, err := dialH2(ctx, loopbackAddr(attackBlock, i), e.hub.xds)
			if err != nil {
				o.add("dial: " + firstLine(err.Error()))
				return
			}
			conns[i] = c
			sendErr := c.stream(adsPath, e.hub.xds, hs, req)
			outcome := c.outcome(floodAnswerWait)
			if sendErr != nil && strings.HasPrefix(outcome, "connection") {
				outcome += " while the headers were being sent"
			}
			o.add(outcome)
		})
	}
	wg.Wait()
	o.into(r)
	r.Total, r.Refused = n, n-r.Outcomes[h2Served]
	mid()
	for _, c := range conns {
		if c != nil {
			c.close()
		}
	}
	e.awaitXDSClients(ctx, 1)
	return nil
}

// adsPath is the state-of-the-world ADS method.
const adsPath = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

// e. Connections to the admin port from 10 addresses, each sending one
// keep-alive request and then nothing, held open.
func floodAdminConns(ctx context.Context, e *floodEnv, r *floodResult, mid func()) error {
	const n, addrs, workers = 1000, 10, 50
	conns := make([]net.Conn, n)
	var o outcomes
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				c, outcome := adminKeepAlive(ctx, loopbackAddr(attackBlock, i%addrs), e.hub.admin)
				conns[i] = c
				o.add(outcome)
			}
		})
	}
	wg.Wait()
	o.into(r)
	r.Total = n
	for k, v := range r.Outcomes {
		if !strings.HasPrefix(k, "answered") {
			r.Refused += v
		}
	}
	r.note("connections from %d addresses, %d each", addrs, n/addrs)
	// A probe as a kubelet's: a fresh connection from another address.
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	code, _, err := e.getDiscard(pctx, "/readyz")
	cancel()
	if err != nil {
		r.note("a /readyz probe from 127.0.0.1 while they were held: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
	} else {
		r.note("a /readyz probe from 127.0.0.1 while they were held: %d in %s", code, time.Since(start).Round(time.Millisecond))
	}
	held := 0
	for _, c := range conns {
		if c != nil && stillOpen(c) {
			held++
		}
	}
	r.note("connections the hub still held open when the flood ended: %d", held)
	mid()
	for _, c := range conns {
		if c != nil {
			_ = c.Close()
		}
	}
	return nil
}

// adminKeepAlive connects from from to addr, GETs /healthz keeping the
// connection alive, and returns it open (nil when the hub refused it) with
// what happened.
func adminKeepAlive(ctx context.Context, from netip.Addr, addr string) (net.Conn, string) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, "dial failed"
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: hub\r\nConnection: keep-alive\r\n\r\n"); err != nil {
		c.Close()
		return nil, "closed by the hub (write failed)"
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return nil, "closed by the hub before answering"
		case errors.Is(err, syscall.ECONNRESET):
			return nil, "reset by the hub before answering"
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, "no answer within 10s"
		}
		return nil, "error: " + firstLine(err.Error())
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
	if resp.Close {
		c.Close()
		return nil, fmt.Sprintf("answered %d, then closed", resp.StatusCode)
	}
	return c, fmt.Sprintf("answered %d, kept alive", resp.StatusCode)
}

// stillOpen reports whether the peer has not closed c (a read that would
// block times out; a closed connection reads EOF at once).
func stillOpen(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	_ = c.SetReadDeadline(time.Time{})
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fedSession is one raw federation session.
type fedSession struct {
	stream  fedv1.Federation_PublishClient
	cancel  context.CancelFunc
	welcome *fedv1.Welcome
}

// hello opens a session on conn with hello and waits for the hub's answer.
func hello(ctx context.Context, conn *grpc.ClientConn, h *fedv1.Hello) (*fedSession, error) {
	sctx, cancel := context.WithCancel(ctx)
	st, err := fedv1.NewFederationClient(conn).Publish(sctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: h}}); err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, err
	}
	timer := time.AfterFunc(floodAnswerWait, cancel)
	m, err := st.Recv()
	timer.Stop()
	if err != nil {
		cancel()
		return nil, err
	}
	if m.GetWelcome() == nil {
		cancel()
		return nil, fmt.Errorf("the hub answered the hello with %T", m.GetKind())
	}
	return &fedSession{stream: st, cancel: cancel, welcome: m.GetWelcome()}, nil
}

// fedConn dials the federation port as cluster c (its token) from the i-th attack address.
func (e *floodEnv) fedConn(c registry.ClusterID, i int) (*grpc.ClientConn, error) {
	return e.conn(e.hub.fed, i, grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: e.fr.tokens[c], AllowInsecure: true}))
}

// bigBuild is the spoke_build of flood f.
const bigBuild = 1600 << 10

// f. The rogue cluster (known to the hub: it said an ordinary hello
// first) says hello again with a 1.6 MiB build; then a probe cluster's
// record must change in the catalog (a second session with another build),
// which the hub's leader writes in one batch with every other cluster's.
func floodBigHello(ctx context.Context, e *floodEnv, r *floodResult, mid func()) error {
	conn, err := e.fedConn(floodRogue, 0)
	if err != nil {
		return err
	}
	defer conn.Close()
	first, err := hello(ctx, conn, &fedv1.Hello{ClusterId: string(floodRogue), Network: benchNetwork, SpokeId: "flood-f", SpokeBuild: "flood-1"})
	if err != nil {
		return fmt.Errorf("the rogue cluster's first, ordinary hello: %w", err)
	}
	first.cancel()
	big, err := hello(ctx, conn, &fedv1.Hello{ClusterId: string(floodRogue), Network: benchNetwork, SpokeId: "flood-f",
		SpokeBuild: strings.Repeat("b", bigBuild)})
	r.Total = 1
	if err != nil {
		r.Refused = 1
		r.Outcomes["hello refused: "+codeOf(err)]++
	} else {
		r.Outcomes["hello welcomed"]++
		defer big.cancel()
	}
	r.note("the rogue cluster %s said an ordinary hello first (so the catalog knew it), then one with a build of %d bytes", floodRogue, bigBuild)
	probeConn, err := e.fedConn(floodProbe, 1)
	if err != nil {
		return err
	}
	defer probeConn.Close()
	p1, err := hello(ctx, probeConn, &fedv1.Hello{ClusterId: string(floodProbe), Network: benchNetwork, SpokeId: "probe", SpokeBuild: "probe-1"})
	if err != nil {
		return fmt.Errorf("the probe cluster's first hello: %w", err)
	}
	p1.cancel()
	p2, err := hello(ctx, probeConn, &fedv1.Hello{ClusterId: string(floodProbe), Network: benchNetwork, SpokeId: "probe", SpokeBuild: "probe-2"})
	if err != nil {
		return fmt.Errorf("the probe cluster's second hello: %w", err)
	}
	defer p2.cancel()
	since := time.Now()
	mid()
	// The leader writes the catalog at least every second.
	return sleep(ctx, time.Until(since.Add(3*time.Second)))
}

// catalogAfterBigHello reads the stopped hub's catalog: did the probe
// cluster's second build reach it, and what became of the rogue's record?
func catalogAfterBigHello(ctx context.Context, e *floodEnv, r *floodResult) error {
	records, err := readCatalog(ctx, filepath.Join(e.dir, "data"))
	if err != nil {
		return fmt.Errorf("read the catalog: %w", err)
	}
	probe, ok := records[floodProbe]
	switch {
	case !ok:
		r.note("catalog after the hub stopped: no record of the probe cluster %s", floodProbe)
	case probe.Build == "probe-2":
		r.note("catalog after the hub stopped: the probe cluster's record was written (build probe-2)")
		r.Outcomes["probe's catalog record written"]++
	default:
		r.note("catalog after the hub stopped: the probe cluster's record was NOT written since its first session (build %q, want probe-2)", probe.Build)
		r.Outcomes["probe's catalog record NOT written"]++
	}
	if rogue, ok := records[floodRogue]; ok {
		r.note("the rogue cluster's record holds a build of %d bytes", len(rogue.Build))
	}
	if log, err := os.ReadFile(e.hub.logPath); err == nil {
		if n := strings.Count(string(log), "cannot keep the cluster catalog current"); n > 0 {
			r.note("the hub logged %d times that it cannot keep the cluster catalog current", n)
		}
	}
	return nil
}

// g. One session of the rogue cluster announces a new gateway set, again
// and again: 150,000 announcements, or as many as go out in 10 s; the
// session is held for the 10 s, and the honest change is made 2 s in.
func floodGateways(ctx context.Context, e *floodEnv, r *floodResult, mid func()) error {
	const most, window = 150_000, 10 * time.Second
	conn, err := e.fedConn(floodRogue, 0)
	if err != nil {
		return err
	}
	defer conn.Close()
	s, err := hello(ctx, conn, &fedv1.Hello{ClusterId: string(floodRogue), Network: "flood-net", SpokeId: "flood-g", SpokeBuild: "flood"})
	if err != nil {
		return fmt.Errorf("the rogue cluster's hello: %w", err)
	}
	defer s.cancel()
	if !slices.Contains(s.welcome.GetCapabilities(), federation.CapabilityGateways) {
		r.NA = "the hub does not take gateway announcements after the hello (no \"gateways\" capability)"
		return nil
	}
	// What the hub sends back (nothing is expected) and how the session ends.
	var received atomic.Int64
	endedCh := make(chan error, 1)
	go func() {
		for {
			if _, err := s.stream.Recv(); err != nil {
				endedCh <- err
				return
			}
			received.Add(1)
		}
	}()
	before, err := e.hub.metrics(ctx)
	if err != nil {
		return err
	}
	// Announcements go out as fast as the hub takes them (its transport's
	// flow control) for the whole window; the session stays open that long
	// (the hub works through what it took), then ends.
	var midWG sync.WaitGroup
	start := time.Now()
	stopMid := make(chan struct{})
	midWG.Go(func() {
		select {
		case <-time.After(2 * time.Second):
			mid()
		case <-stopMid:
		}
	})
	var sent atomic.Int64
	var sendErr error
	var sendTook time.Duration
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		for i := 0; i < most && time.Since(start) < window; i++ {
			a := netip.AddrFrom4([4]byte{100, 64 + byte(i>>16), byte(i >> 8), byte(i)})
			m := &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{
				Gateways: []*fedv1.NetworkGateway{{Address: a.String(), Port: 15443}}}}}
			if sendErr = s.stream.Send(m); sendErr != nil {
				break
			}
			sent.Add(1)
		}
		sendTook = time.Since(start)
	}()
	err = sleep(ctx, time.Until(start.Add(window)))
	close(stopMid)
	midWG.Wait()
	if err != nil {
		return err
	}
	after, err := e.hub.metrics(ctx)
	if err != nil {
		return err
	}
	var ended error
	select {
	case ended = <-endedCh:
	default:
	}
	s.cancel() // a Send still blocked by flow control ends with the stream
	<-sendDone
	n := int(sent.Load())
	r.Total = n
	r.Outcomes["sent"] = n
	r.note("%d announcements sent in %s (%.0f/s), the session held for %s", n, sendTook.Round(time.Millisecond),
		float64(n)/sendTook.Seconds(), window)
	updates := delta(before, after, "nave_xds_update_duration_seconds_count", "")
	throttled := delta(before, after, "nave_federation_throttled_updates_total", "")
	r.Outcomes["xDS updates (topology rebuilds)"] = int(updates)
	r.note("within the %s: %.0f xDS updates (nave_xds_update_duration_seconds_count), %.0f throttle waits (nave_federation_throttled_updates_total)",
		window, updates, throttled)
	if ended != nil {
		r.Refused = 1
		r.Outcomes["session ended: "+codeOf(ended)]++
		r.note("the hub ended the session: %v", firstLine(ended.Error()))
	} else {
		r.note("the session was still open at the end of the window (%d messages from the hub)", received.Load())
	}
	if sendErr != nil && !errors.Is(sendErr, io.EOF) && ended == nil && sendTook < window {
		r.note("a send failed: %v", sendErr)
	}
	return nil
}
