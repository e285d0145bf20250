package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/relay"
)

// The relay comparison (-relay, issue 13): the same gRPC clients, first
// each with a stream of its own to the hub, then behind node-local relays
// (package relay) that hold one upstream stream each, against a fresh hub
// process with the same registry. It measures the hub's xDS streams and
// memory before the clients connect and once every one of them is served
// (after a forced GC), and what a relay adds to convergence: a change is
// timed by the bench's clock from its hand-over to the spoke's publisher
// until a relayed client holds it and until a direct client of the same
// locality and subscriptions holds it.
//
// The relays run in the bench process: the real relay package, each with
// its own gRPC connection to the hub (from a loopback address of its own,
// as a node has its own IP) and its own gRPC server on 127.0.0.1:0. A
// relay's node has the locality of its clients, spread over the
// simulated clusters' regions and zones as the other modes spread clients.

// relayBlock is where relays dial the hub from: 127.3.0.0/16.
const relayBlock = 3

// relayScale is -relay's: a modest registry, 10,000 gRPC clients, and a
// short churn for the latency of the relay hop. Every client subscribes to
// 5 of the 100 services at random, so a relay's 50 clients together want
// about 92 of them: a node whose pods share little (the relay's worst case).
var relayScale = scaleConfig{Name: "relay", Clusters: 10, Services: 100, Endpoints: 10, GRPCClients: 10_000, ServicesPerClient: 5,
	Rate: 20, Duration: 20 * time.Second, PhaseTimeout: 5 * time.Minute}

const (
	// defaultRelays is -relays: 10,000 clients, 50 per node.
	defaultRelays = 200
	// defaultRelayLocalConns is -relay-local-conns: 2 clients per
	// connection. One each would need 20,000 file descriptors in the bench
	// process (both ends of every local connection), its limit here; what
	// the relays' local connections cost is not the hub's anyway.
	defaultRelayLocalConns = 25
)

// relayResult is what -relay measured.
type relayResult struct {
	Relays            int     `json:"relays"`
	Clients           int     `json:"clients"`
	ClientsPerRelay   float64 `json:"clientsPerRelay"`
	ServicesPerClient int     `json:"servicesPerClient"`
	Localities        int     `json:"localities"` // distinct (region, zone) of the relays (and their clients)
	// LocalConns is how many connections each relay's clients share.
	LocalConns int `json:"localConnsPerRelay"`
	// Setup says where the relays run.
	Setup string `json:"setup"`
	// Empty is the hub before the spokes synced.
	Empty   *usageSample `json:"empty,omitempty"`
	Direct  *relayConfig `json:"direct,omitempty"`
	Relayed *relayConfig `json:"relayed,omitempty"`
	// The hub memory attributable to clients, direct over relayed.
	RSSRatio        float64 `json:"rssRatio"`
	SettledRSSRatio float64 `json:"settledRssRatio"`
	HeapInuseRatio  float64 `json:"heapInuseRatio"`
	LiveHeapRatio   float64 `json:"liveHeapRatio"`
	// Hop is the relay's added convergence latency.
	Hop *relayHop `json:"hop,omitempty"`
	// Relays' own view (their metrics and status), once every client was served.
	RelayState *relayState `json:"relayState,omitempty"`
	// RestartMs: the hub's stop and start (fresh data dir) between the two
	// configurations, until every spoke resynced.
	RestartStopMs   float64 `json:"restartStopMs"`
	RestartSyncedMs float64 `json:"restartSyncedMs"`
	// RestartSpokeWarnings are the spokes' warnings meanwhile (their sessions end).
	RestartSpokeWarnings []string `json:"restartSpokeWarnings,omitempty"`
}

// relayConfig is one configuration: clients straight to the hub, or behind relays.
type relayConfig struct {
	Name string `json:"name"`
	// HubConns is how many connections the clients (direct) or the relays hold to the hub.
	HubConns int `json:"hubConns"`
	// The hub before the clients (or relays) connected and once every client
	// was served, each after the settle pause and a forced GC; the xDS
	// streams are nave_xds_connected_clients.
	Before usageSample `json:"before"`
	After  usageSample `json:"after"`
	// What the clients account for: After - Before.
	RSSBytes        float64 `json:"rssBytes"`
	SettledRSSBytes float64 `json:"settledRssBytes"`
	HeapInuseBytes  float64 `json:"heapInuseBytes"`
	LiveHeapBytes   float64 `json:"liveHeapBytes"`
	// ServedMs: from the start of connecting until the last client held
	// everything it asked for (the bench's clock); ClientsServed per client.
	ServedMs      float64        `json:"servedMs"`
	ClientsServed latencySummary `json:"clientsServed"`
	Served        int            `json:"served"` // clients served (of relayResult.Clients)
	// ConnectHubCPUSeconds is the hub's CPU from Before to After,
	// ConnectBenchCPUSeconds the bench process's (clients and, relayed, the
	// relays: they share the machine's cores with the hub).
	ConnectHubCPUSeconds   float64 `json:"connectHubCpuSeconds"`
	ConnectBenchCPUSeconds float64 `json:"connectBenchCpuSeconds"`
	// BenchRSSBytes is the bench process's RSS once every client was served.
	BenchRSSBytes float64     `json:"benchRssBytes"`
	Churn         *relayChurn `json:"churn,omitempty"`
	// Stale and unknown states the clients saw (see restartResult).
	StaleStates   int64 `json:"staleStates"`
	UnknownStates int64 `json:"unknownStates"`
	// Errors: the hub's refusals and log, the clients' stream errors and
	// the spokes' warnings during this configuration.
	Errors *refusalReport `json:"errors,omitempty"`
	// RelayWarnings counts the relays' log records at Warn and above.
	RelayWarnings int64    `json:"relayWarnings"`
	RelayMessages []string `json:"relayMessages,omitempty"`
}

// relayChurn is a configuration's churn: random changes over every
// cluster and service, as in the churn scenario (no rolling restart).
type relayChurn struct {
	Changes      int     `json:"changes"`
	AchievedRate float64 `json:"achievedRate"`
	// Latency: from a change's hand-over to its publisher until a subscribed
	// client (of the 10,000) held it, per (client, change) pair.
	Latency     latencySummary `json:"latency"`
	Unconverged int64          `json:"unconverged"`
	Drained     bool           `json:"drained"`
	DrainMs     float64        `json:"drainMs"`
	// What the hub sent: xDS responses (EDS) per change, and its CPU.
	HubEDSResponsesPerChange float64 `json:"hubEdsResponsesPerChange"`
	HubCPUSeconds            float64 `json:"hubCpuSeconds"`
	// BenchCPUSeconds is the bench process's (clients, relays, spokes);
	// Seconds is how long the churn and its drain took.
	BenchCPUSeconds float64 `json:"benchCpuSeconds"`
	Seconds         float64 `json:"seconds"`
	HubNACKs        float64 `json:"hubNacks"`
	// HubThrottled counts requests that waited for their stream's request
	// rate (a relay's one stream carries every ACK of its node).
	HubThrottled float64 `json:"hubThrottledRequests"`
	// start and end bound the hand-overs of the churn's changes (since the ledger's start).
	start, end time.Duration
}

// relayHop is the convergence latency a relay adds (see hop), by the
// bench's clock.
type relayHop struct {
	// ToRelay: from a change's hand-over until a relay received it, per
	// (relay, change); FromRelay: from then until a client of that relay
	// held it, per (relayed client, change); RelayUnmatched counts client
	// samples without their relay's.
	ToRelay        latencySummary `json:"toRelay"`
	FromRelay      latencySummary `json:"fromRelay"`
	FromRelayMin   float64        `json:"fromRelayMinMs"`
	RelayUnmatched int            `json:"relayUnmatched"`
	// Probe pairs: per relay, a relayed client and a direct one of the
	// relay's locality, both subscribed to what the relay's first client asks for.
	Pairs int `json:"pairs"`
	// Samples are the (pair, change) pairs both clients converged on;
	// Unmatched the relayed ones whose direct twin has no sample.
	Samples   int `json:"samples"`
	Unmatched int `json:"unmatched"`
	// Direct and Relayed: from hand-over to held; Added: relayed - direct
	// for the same change (negative when the relayed client was first).
	Direct   latencySummary `json:"direct"`
	Relayed  latencySummary `json:"relayed"`
	Added    latencySummary `json:"added"`
	AddedMin float64        `json:"addedMinMs"`
}

// relayState is what the relays say of themselves.
type relayState struct {
	UpstreamConnected int     `json:"upstreamConnected"` // relays with their hub stream open
	LocalStreams      float64 `json:"localStreams"`
	Reconnects        float64 `json:"upstreamReconnects"`
	UpstreamNACKs     float64 `json:"upstreamNacks"` // hub responses a relay rejected
	LocalNACKs        float64 `json:"localNacks"`    // relay responses a local client rejected
	ReportedNACKs     float64 `json:"reportedNacks"`
	UpstreamDials     int64   `json:"upstreamDials"`
	// EDSNames: names per relay in its upstream EDS subscription.
	EDSNamesMean float64 `json:"edsNamesMean"`
	EDSNamesMin  int     `json:"edsNamesMin"`
	EDSNamesMax  int     `json:"edsNamesMax"`
}

// clientSpec is one simulated gRPC client: its node and its services.
type clientSpec struct {
	node     *core.Node
	services []int
}

// relayRun holds what the -relay steps share.
type relayRun struct {
	b   *bench
	res *relayResult
	// clients are the gRPC clients, the same in both configurations;
	// relayOf[i] is client i's relay, nodes[n] relay n's node.
	clients []clientSpec
	relayOf []int
	nodes   []*core.Node
	// spokeTally is where the spokes' warnings go now: one per configuration.
	spokeTally    atomic.Pointer[errorTally]
	spokeWarnings [3]errorTally // direct, relayed, the restart between them
	relayWarnings errorTally
}

func newRelayRun(b *bench) *relayRun {
	rr := &relayRun{b: b, res: &relayResult{}}
	b.res.Relay = rr.res
	rr.spokeTally.Store(&rr.spokeWarnings[0])
	return rr
}

// validateRelay checks -relay's flags (validate checked the rest).
func validateRelay(cfg config) error {
	sc := cfg.scale
	switch {
	case cfg.storm || cfg.mtls || cfg.delta:
		return fmt.Errorf("-relay runs plaintext, state-of-the-world clients only (not with -storm, -mtls or -delta)")
	case sc.Gateways > 0:
		return fmt.Errorf("-relay compares gRPC clients: -gateways must be 0")
	case cfg.relays < 1 || cfg.relays > sc.GRPCClients:
		return fmt.Errorf("-relays %d: want 1 to -grpc-clients (%d)", cfg.relays, sc.GRPCClients)
	case cfg.relays > maxLoopbackPeers || directConns(cfg) > maxLoopbackPeers:
		return fmt.Errorf("at most %d relays and %d direct client connections (each dials from a loopback address of its own)", maxLoopbackPeers, maxLoopbackPeers)
	case cfg.relayLocalConns < 1:
		return fmt.Errorf("-relay-local-conns must be at least 1")
	}
	// Both ends of every local connection are in the bench process.
	local := 0
	for _, n := range relaySizes(sc.GRPCClients, cfg.relays) {
		local += min(n, cfg.relayLocalConns)
	}
	need := max(directConns(cfg), 2*local+5*cfg.relays) + sc.Clusters + 200
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && uint64(need) > lim.Cur {
		return fmt.Errorf("-relay needs about %d file descriptors and may open %d: lower -grpc-clients, -relay-local-conns or -conns", need, lim.Cur)
	}
	return nil
}

// directConns is how many connections the direct clients use: one each
// (a client is a process), unless -conns is given.
func directConns(cfg config) int {
	if cfg.connsSet {
		return connsFor(cfg.scale.GRPCClients, cfg.streamsPerConn, cfg.conns)
	}
	return max(cfg.scale.GRPCClients, 1)
}

// relayOfClient is the relay of client i of n spread over r relays: contiguous blocks.
func relayOfClient(i, n, r int) int { return i * r / n }

// relaySizes is how many of n clients each of r relays has.
func relaySizes(n, r int) []int {
	out := make([]int, r)
	for i := range n {
		out[relayOfClient(i, n, r)]++
	}
	return out
}

// start starts the hub (with --pprof: the bench forces a GC before each
// memory sample), builds the registry and the clients, and syncs the spokes.
func (rr *relayRun) start(ctx context.Context) error {
	b := rr.b
	sc := b.cfg.scale
	if !slices.Contains(b.cfg.hubArgs, "--pprof") {
		b.cfg.hubArgs = append([]string{"--pprof"}, b.cfg.hubArgs...)
	}
	if err := b.startHub(ctx); err != nil {
		return err
	}
	// The empty hub's sample is kept here: the usage table's per-endpoint,
	// per-group and per-client rows are the churn scenario's.
	if len(b.res.Usage) > 0 {
		rr.res.Empty = &b.res.Usage[0]
		b.res.Usage = nil
	}
	rr.makeClients()
	b.ledger = newLedger(time.Now(), sc.Clusters, sc.Services)
	var err error
	if b.world, err = newWorld(sc, b.ledger, b.cfg.seed, b.echo.addr); err != nil {
		return err
	}
	b.res.Endpoints = b.world.endpointCount()
	if b.logFile, err = os.Create(filepath.Join(b.work, "spokes.log")); err != nil {
		return err
	}
	log := slog.New(warnCounter{Handler: slog.NewTextHandler(b.logFile, &slog.HandlerOptions{Level: slog.LevelInfo}), tally: rr.spokeTally.Load})
	progress("%d spokes publish %d endpoints", sc.Clusters, b.res.Endpoints)
	start := time.Now()
	if b.spokes, err = startSpokes(ctx, b.world, b.hub.fed, b.cfg.spokeMaxBo, log, nil, b.spokeDial); err != nil {
		return err
	}
	synced, confirmed, err := b.awaitSpokes(ctx, nil, start)
	if err != nil {
		return err
	}
	b.res.InitialSync = syncResult{SpokesSyncedMs: ms(synced), HubConfirmedMs: ms(confirmed)}
	progress("initial sync: spokes acknowledged after %s", synced.Round(time.Millisecond))
	return nil
}

// makeClients makes the relays' nodes and the clients: relay n's node is
// in region n mod regions, zone n div regions (as the other modes spread
// clients); its clients share its locality and subscribe to random services.
func (rr *relayRun) makeClients() {
	cfg := rr.b.cfg
	sc := cfg.scale
	nRegions := regions(sc.Clusters)
	localities := map[registry.Locality]bool{}
	for n := range cfg.relays {
		region := fmt.Sprintf("region-%d", n%nRegions)
		l := registry.Locality{Region: region, Zone: zoneOf(region, n/nRegions)}
		localities[l] = true
		rr.nodes = append(rr.nodes, &core.Node{Id: fmt.Sprintf("nave-node~node-%03d", n),
			Locality: &core.Locality{Region: l.Region, Zone: l.Zone}})
	}
	rng := rand.New(rand.NewPCG(cfg.seed, cfg.seed^0xc1e7))
	k := min(sc.ServicesPerClient, sc.Services)
	for i := range sc.GRPCClients {
		n := relayOfClient(i, sc.GRPCClients, cfg.relays)
		services := rng.Perm(sc.Services)[:k]
		slices.Sort(services)
		rr.clients = append(rr.clients, clientSpec{node: &core.Node{Id: fmt.Sprintf("grpc-%05d", i), Locality: rr.nodes[n].GetLocality()}, services: services})
		rr.relayOf = append(rr.relayOf, n)
	}
	rr.res.Relays, rr.res.Clients, rr.res.ServicesPerClient = cfg.relays, sc.GRPCClients, k
	rr.res.ClientsPerRelay = float64(sc.GRPCClients) / float64(cfg.relays)
	rr.res.Localities, rr.res.LocalConns = len(localities), cfg.relayLocalConns
	rr.res.Setup = "relays in the bench process: the real relay package, each with its own gRPC connection to the hub " +
		"(from a loopback address of its own) and its own gRPC server on 127.0.0.1:0; each relay's clients share its local connections"
}

// newClientFleet makes a fleet of the given gRPC clients, not started;
// its connections are conns (the fleet closes them). The ledger's
// subscribers are counted by setSubscribers.
func newClientFleet(ctx context.Context, sc scaleConfig, l *ledger, specs []clientSpec, conns []*grpc.ClientConn) *fleet {
	ctx, cancel := context.WithCancel(ctx)
	f := &fleet{ledger: l, layout: newAddrLayout(sc.Clusters), names: newResourceNames(sc.Services), clusters: sc.Clusters,
		ctx: ctx, cancel: cancel, conns: conns}
	for _, s := range specs {
		f.clients = append(f.clients, f.newClient(profileGRPC, s.node, s.services))
	}
	return f
}

// startOn starts client i of f on conn.
func startOn(f *fleet, i int, conn *grpc.ClientConn) {
	c := f.clients[i]
	f.wg.Go(func() { c.run(f.ctx, conn) })
}

// indices are 0..n-1.
func indices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// dialHub is a client connection to the hub from the j-th client address.
func (rr *relayRun) dialHub(j int) (*grpc.ClientConn, error) {
	b := rr.b
	opts := append(b.clientDial.options(loopbackAddr(clientBlock, j), nil), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	conn, err := grpc.NewClient(b.hub.xds, opts...)
	if err != nil {
		return nil, fmt.Errorf("xDS connection: %w", err)
	}
	return conn, nil
}

// dialLocal is a client connection to a relay's local address.
func (rr *relayRun) dialLocal(addr string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: clientBackoff, MinConnectTimeout: rr.b.cfg.connectTimeout}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		return nil, fmt.Errorf("relay connection: %w", err)
	}
	return conn, nil
}

// sampleHub samples the hub after the settle pause and three forced GCs
// (the heap profile with gc=1 runs one): heap in use is then what is live.
func (rr *relayRun) sampleHub(ctx context.Context, phase string) (usageSample, error) {
	b := rr.b
	if err := sleep(ctx, b.cfg.settle); err != nil {
		return usageSample{}, err
	}
	// Three times: what sync.Pools (gRPC's buffers) hold survives one GC,
	// and the runtime returns free pages to the system only from a chunk
	// that was not dense (nearly all in use) in this GC cycle or the last,
	// so the pages the burst filled go after a third (an idle hub's own
	// periodic GC, every 2 minutes, does the same, later).
	for range 3 {
		if _, code, err := b.hub.get(ctx, "/debug/pprof/heap?gc=1"); err != nil || code != http.StatusOK {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("%s: no forced GC before the sample (%d, %v)", phase, code, err))
			break
		}
	}
	u, err := b.hub.usage(ctx, phase)
	if err != nil {
		return u, fmt.Errorf("sample the hub's usage: %w", err)
	}
	if u.SettledRSSBytes, u.SettledAnonBytes, err = settledRSS(ctx, b.hub.pid()); err != nil {
		return u, err
	}
	return u, nil
}

// Settled RSS: sampled every second until it has not fallen by a MiB for
// settledFor, for at most settleRSSMax.
const (
	settledFor   = 5 * time.Second
	settleRSSMax = time.Minute
)

// settledRSS waits until the process pid's RSS stops falling,
// and returns it with its anonymous part: the Go runtime returns the free
// pages it keeps after a peak in the background, so RSS sampled right
// after the peak counts memory the process no longer uses.
func settledRSS(ctx context.Context, pid int) (rss, anon float64, err error) {
	start, lastDrop := time.Now(), time.Now()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("settled RSS: %w", err)
	}
	rss, anon = statusBytes(status, "VmRSS"), statusBytes(status, "RssAnon")
	dropFrom := rss // a drop counts from here: a slow fall adds up to one
	for time.Since(lastDrop) < settledFor && time.Since(start) < settleRSSMax {
		if err := sleep(ctx, time.Second); err != nil {
			return 0, 0, err
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return 0, 0, fmt.Errorf("settled RSS: %w", err)
		}
		now := statusBytes(status, "VmRSS")
		if now < dropFrom-(1<<20) {
			lastDrop, dropFrom = time.Now(), now
		}
		if now <= rss {
			rss, anon = now, statusBytes(status, "RssAnon")
		}
	}
	return rss, anon, nil
}

// serve samples the hub, connects clients (start starts them all and
// returns their fleets), waits until every one holds everything it asked
// for, and samples the hub again.
func (rr *relayRun) serve(ctx context.Context, rc *relayConfig, start func() ([]*fleet, error)) error {
	b := rr.b
	before, err := rr.sampleHub(ctx, rc.Name+": before")
	if err != nil {
		return err
	}
	rc.Before = before
	progress("%s: connecting %d clients (hub: %d xDS streams, RSS %s, heap in use %s)", rc.Name, len(rr.clients), before.XDSClients,
		mib(before.RSSBytes), mib(before.HeapInuseBytes))
	startL, beforeSelf := b.ledger.since(time.Now()), selfCPU()
	fleets, err := start()
	if err != nil {
		return err
	}
	complete := func() (last time.Duration, done int) {
		for _, f := range fleets {
			l, d := f.complete(indices(len(f.clients)), startL)
			last, done = max(last, l), done+d
		}
		return last, done
	}
	waitErr := b.await(ctx, "every client to hold everything it asked for", func() (bool, error) {
		_, done := complete()
		return done == len(rr.clients), nil
	})
	last, done := complete()
	rc.Served = done
	if done > 0 {
		rc.ServedMs = ms(last - startL)
		var times []time.Duration
		for _, f := range fleets {
			times = append(times, f.completionTimes(indices(len(f.clients)), startL)...)
		}
		rc.ClientsServed = summarize(times)
	}
	if waitErr != nil {
		return fmt.Errorf("%w (%d of %d clients served)", waitErr, done, len(rr.clients))
	}
	rc.ConnectBenchCPUSeconds = (selfCPU() - beforeSelf).Seconds()
	if rss, _, err := procUsage(os.Getpid()); err == nil {
		rc.BenchRSSBytes = rss
	}
	progress("%s: every client served after %s; sampling the hub", rc.Name, fmtMs(rc.ServedMs))
	after, err := rr.sampleHub(ctx, rc.Name+": clients")
	if err != nil {
		return err
	}
	rc.After = after
	rc.RSSBytes, rc.HeapInuseBytes = after.RSSBytes-before.RSSBytes, after.HeapInuseBytes-before.HeapInuseBytes
	rc.SettledRSSBytes = after.SettledRSSBytes - before.SettledRSSBytes
	rc.LiveHeapBytes = after.LiveHeapBytes - before.LiveHeapBytes
	rc.ConnectHubCPUSeconds = after.CPUSeconds - before.CPUSeconds
	if b.cfg.heapProfile != "" {
		if err := b.hub.fetchProfile(ctx, "/debug/pprof/heap", b.cfg.heapProfile+"-"+rc.Name); err != nil {
			b.res.Notes = append(b.res.Notes, "heap profile: "+err.Error())
		}
	}
	progress("%s: hub %d xDS streams, RSS %s (+%s), heap in use %s (+%s)", rc.Name, after.XDSClients, mib(after.RSSBytes), mib(rc.RSSBytes),
		mib(after.HeapInuseBytes), mib(rc.HeapInuseBytes))
	return nil
}

// setSubscribers counts, per service, the clients of fleets in the
// ledger, and forgets pending pairs: every client holds the latest state,
// so from now on only new changes are pending.
func setSubscribers(l *ledger, fleets []*fleet) {
	clear(l.subscribers)
	for _, f := range fleets {
		for _, c := range f.clients {
			for _, s := range c.services {
				l.subscribers[s]++
			}
		}
	}
	l.pending.Store(0)
}

// churn makes random changes at -rate for -duration and waits until every
// client of fleets holds every change; it returns the samples of each
// fleet, handed over during the churn.
func (rr *relayRun) churn(ctx context.Context, name string, fleets []*fleet) (*relayChurn, [][]sample, error) {
	b := rr.b
	sc := b.cfg.scale
	setSubscribers(b.ledger, fleets)
	for _, f := range fleets {
		f.phase.Store(phaseChurn)
	}
	beforeM, err := b.hub.metrics(ctx)
	if err != nil {
		return nil, nil, err
	}
	progress("%s: churn, %.0f changes/s for %s", name, sc.Rate, sc.Duration)
	began, beforeSelf := time.Now(), selfCPU()
	start := b.ledger.since(began)
	cr, err := b.world.churn(ctx, sc.Rate, sc.Duration, 0)
	if err != nil {
		return nil, nil, err
	}
	end := b.ledger.since(time.Now())
	drainErr := b.await(ctx, "every client to hold every change", func() (bool, error) { return b.ledger.pending.Load() == 0, nil })
	afterM, err := b.hub.metrics(ctx)
	if err != nil {
		return nil, nil, err
	}
	ch := &relayChurn{Changes: cr.Changes, AchievedRate: float64(cr.Changes) / cr.Elapsed.Seconds(), Drained: drainErr == nil,
		Unconverged: b.ledger.pending.Load(), HubCPUSeconds: delta(beforeM, afterM, "process_cpu_seconds_total", ""),
		HubNACKs: delta(beforeM, afterM, "nave_xds_nacks_total", ""), start: start, end: end,
		HubThrottled:    delta(beforeM, afterM, "nave_xds_throttled_requests_total", ""),
		BenchCPUSeconds: (selfCPU() - beforeSelf).Seconds(), Seconds: time.Since(began).Seconds()}
	if cr.Changes > 0 {
		ch.HubEDSResponsesPerChange = delta(beforeM, afterM, "nave_xds_responses_total", `type="eds"`) / float64(cr.Changes)
	}
	var out [][]sample
	var drain time.Duration
	for _, f := range fleets {
		var in []sample
		for _, s := range f.takeSamples() {
			if s.handed >= start && s.handed <= end {
				in = append(in, s)
				drain = max(drain, s.handed+s.latency-end)
			}
		}
		out = append(out, in)
	}
	ch.DrainMs = ms(drain)
	return ch, out, drainErr
}

// allLatencies are the latencies of samples.
func allLatencies(samples []sample) []time.Duration {
	out := make([]time.Duration, 0, len(samples))
	for _, s := range samples {
		out = append(out, s.latency)
	}
	return out
}

// errorReport gathers what troubled peers in one configuration: the
// hub's refusal counters in m (the hub process is the configuration's
// own), its log from logFrom on, the clients' stream errors and the
// spokes' warnings.
func (rr *relayRun) errorReport(rc *relayConfig, m promText, logFrom int64, spokes *errorTally, fleets []*fleet) {
	r := &refusalReport{}
	var series map[string]float64
	r.Refused, series = hubRefusals(m)
	if len(series) > 0 {
		r.Hub = series
	}
	var streamErrors errorTally
	for _, f := range fleets {
		for ph := range phases {
			t := &f.streamErrors[ph]
			t.mu.Lock()
			for code, n := range t.counts {
				for range n {
					streamErrors.add(code, t.first[code])
				}
				if !countedByHub[code] {
					r.Refused += float64(n)
				}
			}
			t.mu.Unlock()
			rc.StaleStates += f.observed[ph][0].Load()
			rc.UnknownStates += f.observed[ph][1].Load()
		}
	}
	r.ClientStreamErrors, r.ClientErrors = streamErrors.total.Load(), streamErrors.summary()
	r.SpokeWarnings, r.SpokeMessages = spokes.total.Load(), spokes.summary()
	if log, err := readFrom(rr.b.hub.logPath, logFrom); err == nil {
		if p := logProblems(log); len(p) > 0 {
			r.HubLog = p
		}
	}
	rc.Errors = r
}

// direct: every client with a stream of its own to the hub (one
// connection each, unless -conns), then a churn.
func (rr *relayRun) direct(ctx context.Context) error {
	b := rr.b
	rc := &relayConfig{Name: "direct"}
	rr.res.Direct = rc
	rr.spokeTally.Store(&rr.spokeWarnings[0])
	logFrom := fileSize(b.hub.logPath)
	n := directConns(b.cfg)
	rc.HubConns, b.res.Conns = n, n
	conns := make([]*grpc.ClientConn, 0, n)
	for j := range n {
		conn, err := rr.dialHub(j)
		if err != nil {
			for _, c := range conns {
				_ = c.Close()
			}
			return err
		}
		conns = append(conns, conn)
	}
	f := newClientFleet(ctx, b.cfg.scale, b.ledger, rr.clients, conns)
	defer f.stop()
	err := rr.serve(ctx, rc, func() ([]*fleet, error) {
		for i := range f.clients {
			startOn(f, i, conns[i%n])
		}
		return []*fleet{f}, nil
	})
	if err == nil {
		// A real grpc-go client calls the echo backend through the hub.
		rr.sanity(ctx, b.hub.xds, "grpc-go-direct", "direct", rr.nodes[0])
		var samples [][]sample
		rc.Churn, samples, err = rr.churn(ctx, rc.Name, []*fleet{f})
		if rc.Churn != nil {
			rc.Churn.Latency = summarize(allLatencies(samples[0]))
			progress("direct: convergence %s", rc.Churn.Latency)
		}
	}
	if m, merr := b.hub.metrics(ctx); merr == nil {
		rr.errorReport(rc, m, logFrom, &rr.spokeWarnings[0], []*fleet{f})
	}
	return err
}

// sanity checks that a real grpc-go client reaches the echo backend through xdsAddr.
func (rr *relayRun) sanity(ctx context.Context, xdsAddr, name, phase string, node *core.Node) {
	b := rr.b
	l := registry.Locality{Region: node.GetLocality().GetRegion(), Zone: node.GetLocality().GetZone()}
	c, err := newSanityClient(xdsAddr, name, l, nil)
	if err != nil {
		b.res.Sanity = append(b.res.Sanity, sanityResult{Client: name, Phase: phase, Error: err.Error()})
		return
	}
	defer c.close()
	r := c.check(ctx, phase, 30*time.Second)
	b.res.Sanity = append(b.res.Sanity, r)
	if !r.OK {
		progress("grpc-go client %s could not call the echo backend: %s", name, r.Error)
	}
}

// nodeRelay is one relay with its local gRPC server.
type nodeRelay struct {
	r    *relay.Relay
	reg  *prometheus.Registry
	srv  *grpc.Server
	addr string
	done chan struct{}
}

// relays runs the relays until stop.
type relays struct {
	nodes  []*nodeRelay
	taps   []*relayTap // by relay
	cancel context.CancelFunc
	dials  atomic.Int64
	log    *os.File
}

// startRelays starts a relay per node: its upstream stream to the hub
// (from its own loopback address), its local server on 127.0.0.1:0.
func (rr *relayRun) startRelays(ctx context.Context) (*relays, error) {
	b := rr.b
	ctx, cancel := context.WithCancel(ctx)
	rs := &relays{cancel: cancel}
	var err error
	if rs.log, err = os.Create(filepath.Join(b.work, "relays.log")); err != nil {
		cancel()
		return nil, err
	}
	log := slog.New(warnCounter{Handler: slog.NewTextHandler(rs.log, &slog.HandlerOptions{Level: slog.LevelInfo}),
		tally: func() *errorTally { return &rr.relayWarnings }})
	for n, node := range rr.nodes {
		from := loopbackAddr(relayBlock, n)
		w := relay.Wiring{Upstream: b.hub.xds, Node: node}
		tap := newRelayTap(b.ledger, b.cfg.scale)
		rs.taps = append(rs.taps, tap)
		w.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				rs.dials.Add(1)
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
				return d.DialContext(ctx, "tcp", addr)
			}),
			tap.interceptor()}
		reg := prometheus.NewRegistry()
		r, err := relay.New(relay.DefaultConfig(), w, log.With("node", node.GetId()), reg)
		if err != nil {
			rs.stop()
			return nil, err
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			rs.stop()
			return nil, fmt.Errorf("relay listener: %w", err)
		}
		nr := &nodeRelay{r: r, reg: reg, srv: grpc.NewServer(), addr: lis.Addr().String(), done: make(chan struct{})}
		r.Register(nr.srv)
		go func() { _ = nr.srv.Serve(lis) }()
		go func() {
			defer close(nr.done)
			if err := r.Run(ctx); err != nil {
				log.Error("relay stopped", "node", node.GetId(), "err", err)
			}
		}()
		rs.nodes = append(rs.nodes, nr)
	}
	return rs, nil
}

func (rs *relays) stop() {
	rs.cancel()
	for _, nr := range rs.nodes {
		<-nr.done
		nr.srv.Stop()
	}
	if rs.log != nil {
		rs.log.Close()
	}
}

// state sums the relays' metrics and upstream subscriptions.
func (rs *relays) state() *relayState {
	st := &relayState{UpstreamDials: rs.dials.Load(), EDSNamesMin: -1}
	total := 0
	for _, nr := range rs.nodes {
		m := gatherSums(nr.reg)
		if m[relay.MetricUpstreamConnected] == 1 {
			st.UpstreamConnected++
		}
		st.LocalStreams += m[relay.MetricStreams]
		st.Reconnects += m[relay.MetricUpstreamReconnects]
		st.UpstreamNACKs += m[relay.MetricUpstreamNACKs]
		st.LocalNACKs += m[relay.MetricNACKs]
		st.ReportedNACKs += m[relay.MetricReportedNACKs]
		eds := len(nr.r.Subscriptions()["eds"])
		total += eds
		st.EDSNamesMax = max(st.EDSNamesMax, eds)
		if st.EDSNamesMin < 0 || eds < st.EDSNamesMin {
			st.EDSNamesMin = eds
		}
	}
	if len(rs.nodes) > 0 {
		st.EDSNamesMean = float64(total) / float64(len(rs.nodes))
	}
	return st
}

// gatherSums sums every gauge and counter of reg by metric name.
func gatherSums(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[mf.GetName()] += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

// relayed: a fresh hub process with the same registry; the same clients
// behind the relays; then a probe pair per relay and a churn, for the
// latency the relay hop adds.
func (rr *relayRun) relayed(ctx context.Context) error {
	b := rr.b
	sc := b.cfg.scale
	rc := &relayConfig{Name: "relayed", HubConns: len(rr.nodes)}
	rr.spokeTally.Store(&rr.spokeWarnings[2])
	// 1. A fresh hub process on a fresh data dir; the spokes resync.
	sessions := b.spokes.sessions()
	progress("relayed: restarting the hub on a fresh data dir")
	stopped, err := b.hub.stop(30 * time.Second)
	rr.res.RestartStopMs = ms(stopped)
	if err != nil {
		return err
	}
	if err := b.hub.start(filepath.Join(b.work, "data-2")); err != nil {
		return err
	}
	if _, err := b.hub.waitReady(ctx, sc.PhaseTimeout); err != nil {
		return err
	}
	synced, _, err := b.awaitSpokes(ctx, sessions, b.hub.started)
	rr.res.RestartSpokeWarnings = rr.spokeWarnings[2].summary()
	if err != nil {
		return err
	}
	rr.res.RestartSyncedMs = ms(synced)
	rr.res.Relayed = rc
	rr.spokeTally.Store(&rr.spokeWarnings[1])
	logFrom := fileSize(b.hub.logPath)

	// 2. The relays, then every relay's clients (a fleet per relay) on its local connections.
	var rs *relays
	var fleets []*fleet // every fleet made, stopped before the relays
	defer func() {
		for _, f := range fleets {
			f.stop()
		}
		if rs != nil {
			rs.stop()
		}
	}()
	err = rr.serve(ctx, rc, func() ([]*fleet, error) {
		var err error
		if rs, err = rr.startRelays(ctx); err != nil {
			return nil, err
		}
		specs := make([][]clientSpec, len(rs.nodes))
		for i, c := range rr.clients {
			specs[rr.relayOf[i]] = append(specs[rr.relayOf[i]], c)
		}
		for n, nr := range rs.nodes {
			var local []*grpc.ClientConn
			for range min(len(specs[n]), b.cfg.relayLocalConns) {
				conn, err := rr.dialLocal(nr.addr)
				if err != nil {
					for _, c := range local {
						_ = c.Close()
					}
					return nil, err
				}
				local = append(local, conn)
			}
			f := newClientFleet(ctx, sc, b.ledger, specs[n], local)
			fleets = append(fleets, f)
			for i := range f.clients {
				startOn(f, i, local[i%len(local)])
			}
		}
		return slices.Clone(fleets), nil
	})
	if rs != nil {
		rr.res.RelayState = rs.state()
	}
	if d := rr.res.Direct; d != nil && err == nil {
		ratio := func(a, b float64) float64 {
			if b <= 0 {
				return 0
			}
			return a / b
		}
		rr.res.RSSRatio = ratio(d.RSSBytes, rc.RSSBytes)
		rr.res.SettledRSSRatio = ratio(d.SettledRSSBytes, rc.SettledRSSBytes)
		rr.res.HeapInuseRatio = ratio(d.HeapInuseBytes, rc.HeapInuseBytes)
		rr.res.LiveHeapRatio = ratio(d.LiveHeapBytes, rc.LiveHeapBytes)
	}
	if err == nil {
		rr.sanity(ctx, rs.nodes[0].addr, "grpc-go-relayed", "relayed", rr.nodes[0])
		err = rr.hop(ctx, rc, rs, &fleets)
	}
	if m, merr := b.hub.metrics(ctx); merr == nil {
		rr.errorReport(rc, m, logFrom, &rr.spokeWarnings[1], fleets)
	}
	rc.RelayWarnings, rc.RelayMessages = rr.relayWarnings.total.Load(), rr.relayWarnings.summary()
	return err
}

// hop measures the relay hop in a churn, two ways, every time by the
// bench's clock (time.Now in this process; relays and clients run here):
//
//   - Inside the relay: each relay's upstream connection has a client
//     interceptor (relayTap) that notes when the relay received each
//     change from the hub; a relayed client's sample minus its relay's is
//     the time from the relay's receipt to the client's.
//   - End to end: per relay, a relayed probe client (on a connection of
//     its own to the relay) and its direct twin (to the hub), both in the
//     relay's locality and subscribed to what the relay's first client
//     asks for (the relay's subscription does not change); for the same
//     change, the relayed probe's latency minus the twin's, as far as the
//     hub sends to both streams at once.
func (rr *relayRun) hop(ctx context.Context, rc *relayConfig, rs *relays, fleets *[]*fleet) error {
	b := rr.b
	sc := b.cfg.scale
	clients := slices.Clone(*fleets) // a fleet per relay
	first := make([]int, len(rs.nodes))
	for i := len(rr.clients) - 1; i >= 0; i-- {
		first[rr.relayOf[i]] = i
	}
	var relayedProbes, directProbes []*fleet
	for n, nr := range rs.nodes {
		services := rr.clients[first[n]].services
		local, err := rr.dialLocal(nr.addr)
		if err != nil {
			return err
		}
		pr := newClientFleet(ctx, sc, b.ledger, []clientSpec{{node: &core.Node{Id: fmt.Sprintf("probe-relayed-%03d", n), Locality: rr.nodes[n].GetLocality()},
			services: services}}, []*grpc.ClientConn{local})
		*fleets = append(*fleets, pr)
		hub, err := rr.dialHub(n)
		if err != nil {
			return err
		}
		pd := newClientFleet(ctx, sc, b.ledger, []clientSpec{{node: &core.Node{Id: fmt.Sprintf("probe-direct-%03d", n), Locality: rr.nodes[n].GetLocality()},
			services: services}}, []*grpc.ClientConn{hub})
		*fleets = append(*fleets, pd)
		relayedProbes, directProbes = append(relayedProbes, pr), append(directProbes, pd)
	}
	progress("relayed: %d probe pairs (a relayed client and its direct twin per relay)", len(rs.nodes))
	startL := b.ledger.since(time.Now())
	for i := range relayedProbes {
		startOn(relayedProbes[i], 0, relayedProbes[i].conns[0])
		startOn(directProbes[i], 0, directProbes[i].conns[0])
	}
	probes := append(slices.Clone(relayedProbes), directProbes...)
	err := b.await(ctx, "every probe client to hold everything it asked for", func() (bool, error) {
		for _, p := range probes {
			if _, done := p.complete([]int{0}, startL); done == 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	churnFleets := append(slices.Clone(clients), probes...)
	ch, samples, err := rr.churn(ctx, rc.Name, churnFleets)
	if ch == nil {
		return err
	}
	rc.Churn = ch
	nr := len(rs.nodes)
	var all []time.Duration
	for _, in := range samples[:nr] {
		all = append(all, allLatencies(in)...)
	}
	ch.Latency = summarize(all)
	progress("relayed: convergence %s", ch.Latency)
	hop := &relayHop{Pairs: nr}
	// Inside the relay.
	var toRelay, fromRelay []time.Duration
	for n := range nr {
		at := rs.taps[n].received()
		for handed, when := range at {
			if handed >= ch.start && handed <= ch.end {
				toRelay = append(toRelay, when-handed)
			}
		}
		for _, s := range samples[n] {
			when, ok := at[s.handed]
			if !ok {
				hop.RelayUnmatched++
				continue
			}
			fromRelay = append(fromRelay, s.handed+s.latency-when)
		}
	}
	hop.ToRelay, hop.FromRelay = summarize(toRelay), summarize(fromRelay)
	if len(fromRelay) > 0 {
		hop.FromRelayMin = ms(slices.Min(fromRelay))
	}
	// End to end: the probe pairs.
	var direct, relayed, added []time.Duration
	for i := range nr {
		twin := map[time.Duration]time.Duration{}
		for _, s := range samples[2*nr+i] {
			twin[s.handed] = s.latency
		}
		for _, s := range samples[nr+i] {
			d, ok := twin[s.handed]
			if !ok {
				hop.Unmatched++
				continue
			}
			direct, relayed, added = append(direct, d), append(relayed, s.latency), append(added, s.latency-d)
		}
	}
	hop.Samples = len(added)
	hop.Direct, hop.Relayed, hop.Added = summarize(direct), summarize(relayed), summarize(added)
	if len(added) > 0 {
		hop.AddedMin = ms(slices.Min(added))
	}
	rr.res.Hop = hop
	progress("relay hop: relay receipt -> client %s; probe pairs, relayed - direct %s", hop.FromRelay, hop.Added)
	return err
}

// relayTap notes when a relay received each change: a client interceptor
// on the relay's upstream connection sees the hub's EDS responses and,
// as a client does, finds which generation of each (cluster, service)
// they hold (see ledger.go).
type relayTap struct {
	ledger   *ledger
	layout   addrLayout
	names    *resourceNames
	clusters int

	// mu guards held, fps and at.
	mu   sync.Mutex
	held []int32  // generation held, by service*clusters + cluster
	fps  []uint64 // scratch: fingerprints by cluster
	// at is, by change (its hand-over), when the relay received it; both since the ledger's start.
	at map[time.Duration]time.Duration
}

func newRelayTap(l *ledger, sc scaleConfig) *relayTap {
	return &relayTap{ledger: l, layout: newAddrLayout(sc.Clusters), names: newResourceNames(sc.Services), clusters: sc.Clusters,
		held: make([]int32, sc.Services*sc.Clusters), fps: make([]uint64, sc.Clusters), at: map[time.Duration]time.Duration{}}
}

// interceptor wraps the relay's upstream streams.
func (t *relayTap) interceptor() grpc.DialOption {
	return grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &tappedStream{ClientStream: s, tap: t}, nil
	})
}

type tappedStream struct {
	grpc.ClientStream
	tap *relayTap
}

func (s *tappedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*discovery.DiscoveryResponse); ok && err == nil && r.GetTypeUrl() == resource.EndpointType {
		s.tap.saw(r.GetResources(), time.Now())
	}
	return err
}

// saw notes the assignments a relay received at now.
func (t *relayTap) saw(resources []*anypb.Any, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range resources {
		clear(t.fps)
		name, err := scanAssignment(a.GetValue(), func(addr string, port uint32, health core.HealthStatus) {
			if health != core.HealthStatus_HEALTHY && health != core.HealthStatus_UNKNOWN {
				return
			}
			ad, err := netip.ParseAddr(addr)
			if err != nil {
				return
			}
			if ip, ok := ipv4(ad); ok {
				if ci, ok := t.layout.cluster(ip); ok && ci < len(t.fps) {
					t.fps[ci] += endpointHash(ip, port)
				}
			}
		})
		s, ok := t.names.service[name]
		if err != nil || !ok {
			continue
		}
		for c, fp := range t.fps {
			t.advance(c, s, fp, now)
		}
	}
}

// advance is ledger.observe without the pending count: the relay is no subscriber.
func (t *relayTap) advance(c, s int, fp uint64, now time.Time) {
	h := t.ledger.at(c, s)
	h.mu.Lock()
	defer h.mu.Unlock()
	held := &t.held[s*t.clusters+c]
	g, ok := h.byFP[fp]
	if !ok || g <= *held {
		return
	}
	at := t.ledger.since(now)
	for k := *held + 1; k <= g; k++ {
		t.at[h.handed[k]] = at
	}
	*held = g
}

// received returns a copy of when the relay received each change.
func (t *relayTap) received() map[time.Duration]time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.at)
}

// printRelay prints -relay's results.
func printRelay(w io.Writer, r *relayResult) {
	if r.Direct == nil {
		return
	}
	t := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\nNode-local relays: %d gRPC clients (%d services each), straight to the hub vs behind %d relays (%.0f clients each, %d localities)\n",
		r.Clients, r.ServicesPerClient, r.Relays, r.ClientsPerRelay, r.Localities)
	fmt.Fprintf(w, "  %s (%d local connections per relay)\n", r.Setup, r.LocalConns)
	configs := []*relayConfig{r.Direct}
	if r.Relayed != nil {
		configs = append(configs, r.Relayed)
	}
	cols := func(f func(c *relayConfig) string) string {
		var out string
		for _, c := range configs {
			out += f(c) + "\t"
		}
		return out
	}
	row := func(k string, f func(c *relayConfig) string) { fmt.Fprintf(t, "  %s\t%s\n", k, cols(f)) }
	row("", func(c *relayConfig) string { return c.Name })
	row("hub connections", func(c *relayConfig) string { return fmt.Sprint(c.HubConns) })
	row("hub xDS streams", func(c *relayConfig) string { return fmt.Sprintf("%d -> %d", c.Before.XDSClients, c.After.XDSClients) })
	mem := func(before, after, d float64) string {
		return fmt.Sprintf("%s -> %s (+%s)", mib(before), mib(after), mib(d))
	}
	row("hub RSS", func(c *relayConfig) string { return mem(c.Before.RSSBytes, c.After.RSSBytes, c.RSSBytes) })
	row("  at once: heap free not returned yet / goroutine stacks", func(c *relayConfig) string {
		return fmt.Sprintf("%s / %s", mib(c.After.HeapFreeKeptBytes), mib(c.After.StackInuseBytes))
	})
	row("hub RSS, settled (free pages returned)", func(c *relayConfig) string {
		return mem(c.Before.SettledRSSBytes, c.After.SettledRSSBytes, c.SettledRSSBytes)
	})
	row("  of it anonymous", func(c *relayConfig) string {
		return mem(c.Before.SettledAnonBytes, c.After.SettledAnonBytes, c.After.SettledAnonBytes-c.Before.SettledAnonBytes)
	})
	row("hub heap in use (forced GC)", func(c *relayConfig) string {
		return mem(c.Before.HeapInuseBytes, c.After.HeapInuseBytes, c.HeapInuseBytes)
	})
	row("hub live heap", func(c *relayConfig) string {
		return mem(c.Before.LiveHeapBytes, c.After.LiveHeapBytes, c.LiveHeapBytes)
	})
	row("  per client: RSS / heap in use", func(c *relayConfig) string {
		n := float64(max(r.Clients, 1))
		return fmt.Sprintf("%s / %s", kib(c.RSSBytes/n), kib(c.HeapInuseBytes/n))
	})
	row("hub peak RSS (VmHWM) so far", func(c *relayConfig) string { return mib(c.After.PeakRSSBytes) })
	row("hub goroutines; locality groups", func(c *relayConfig) string {
		return fmt.Sprintf("%d -> %d; %d", c.Before.Goroutines, c.After.Goroutines, c.After.LocalityGroups)
	})
	row("clients served", func(c *relayConfig) string {
		return fmt.Sprintf("%d of %d, last after %s (p50 %s)", c.Served, r.Clients, fmtMs(c.ServedMs), fmtMs(c.ClientsServed.P50))
	})
	row("CPU while they connected: hub; bench", func(c *relayConfig) string {
		return fmt.Sprintf("%.1f s; %.1f s", c.ConnectHubCPUSeconds, c.ConnectBenchCPUSeconds)
	})
	row("bench process RSS", func(c *relayConfig) string { return mib(c.BenchRSSBytes) })
	row("churn convergence p50 / p99 / max", func(c *relayConfig) string {
		if c.Churn == nil {
			return "-"
		}
		l := c.Churn.Latency
		return fmt.Sprintf("%s / %s / %s (n=%d)", fmtMs(l.P50), fmtMs(l.P99), fmtMs(l.Max), l.N)
	})
	row("  changes; hub EDS responses per change", func(c *relayConfig) string {
		if c.Churn == nil {
			return "-"
		}
		return fmt.Sprintf("%d at %.1f/s; %.1f", c.Churn.Changes, c.Churn.AchievedRate, c.Churn.HubEDSResponsesPerChange)
	})
	row("  CPU cores: hub; bench (of the churn and drain)", func(c *relayConfig) string {
		if c.Churn == nil || c.Churn.Seconds <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f; %.2f (%.1f s)", c.Churn.HubCPUSeconds/c.Churn.Seconds, c.Churn.BenchCPUSeconds/c.Churn.Seconds, c.Churn.Seconds)
	})
	row("  throttled requests; unconverged pairs", func(c *relayConfig) string {
		if c.Churn == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f; %d", c.Churn.HubThrottled, c.Churn.Unconverged)
	})
	row("stale / unknown states seen", func(c *relayConfig) string { return fmt.Sprintf("%d / %d", c.StaleStates, c.UnknownStates) })
	row("client stream errors", func(c *relayConfig) string {
		if c.Errors == nil {
			return "-"
		}
		return fmt.Sprint(c.Errors.ClientStreamErrors)
	})
	row("hub refusals; NACKs during churn", func(c *relayConfig) string {
		if c.Errors == nil {
			return "-"
		}
		nacks := 0.0
		if c.Churn != nil {
			nacks = c.Churn.HubNACKs
		}
		return fmt.Sprintf("%.0f; %.0f", c.Errors.Refused, nacks)
	})
	row("spoke / relay warnings; hub log warnings", func(c *relayConfig) string {
		if c.Errors == nil {
			return "-"
		}
		return fmt.Sprintf("%d / %d; %d", c.Errors.SpokeWarnings, c.RelayWarnings, len(c.Errors.HubLog))
	})
	t.Flush()
	for _, c := range configs {
		if c.Errors == nil {
			continue
		}
		var logs []string
		for _, m := range slices.Sorted(maps.Keys(c.Errors.HubLog)) {
			logs = append(logs, fmt.Sprintf("%d x %q", c.Errors.HubLog[m], m))
		}
		for _, l := range []struct {
			what  string
			items []string
		}{{"client stream errors", c.Errors.ClientErrors}, {"spoke warnings", c.Errors.SpokeMessages}, {"relay warnings", c.RelayMessages}, {"hub log", logs}} {
			if len(l.items) > 0 {
				fmt.Fprintf(w, "  %s, %s%s\n", c.Name, l.what, listed(l.items))
			}
		}
	}
	if len(r.RestartSpokeWarnings) > 0 {
		fmt.Fprintf(w, "  between the two (the hub's restart, expected), spoke warnings%s\n", listed(r.RestartSpokeWarnings))
	}
	if r.Relayed != nil && r.HeapInuseRatio > 0 {
		fmt.Fprintf(w, "  hub memory attributable to clients, direct / relayed: RSS %.1fx (settled %.1fx), heap in use %.1fx, live heap %.1fx (target at least 10x)\n",
			r.RSSRatio, r.SettledRSSRatio, r.HeapInuseRatio, r.LiveHeapRatio)
	}
	if s := r.RelayState; s != nil {
		fmt.Fprintf(w, "  relays: %d of %d connected upstream (%d dials), %.0f local streams, %.0f upstream reconnects, NACKs %.0f upstream / %.0f local / %.0f reported; EDS names per relay upstream: mean %.1f, %d-%d\n",
			s.UpstreamConnected, r.Relays, s.UpstreamDials, s.LocalStreams, s.Reconnects, s.UpstreamNACKs, s.LocalNACKs, s.ReportedNACKs,
			s.EDSNamesMean, s.EDSNamesMin, s.EDSNamesMax)
	}
	if h := r.Hop; h != nil {
		fmt.Fprintf(w, "\nRelay hop, during the relayed churn (every time by the bench process's clock; relays and clients run in it)\n")
		fmt.Fprintf(t, "  change handed to its publisher -> relay received it (per relay, change)\t%s\n", h.ToRelay)
		fmt.Fprintf(t, "  relay received it -> relayed client held it (per client, change)\t%s  min %s; %d client samples without their relay's\n",
			h.FromRelay, fmtMs(h.FromRelayMin), h.RelayUnmatched)
		fmt.Fprintf(t, "  %d probe pairs (per relay, a relayed client and a direct twin of its locality and subscriptions):\t%d (pair, change) samples, %d unmatched\n",
			h.Pairs, h.Samples, h.Unmatched)
		fmt.Fprintf(t, "    direct twin: handed -> held\t%s\n", h.Direct)
		fmt.Fprintf(t, "    relayed probe: handed -> held\t%s\n", h.Relayed)
		fmt.Fprintf(t, "    added: relayed - direct, same change\t%s  min %s\n", h.Added, fmtMs(h.AddedMin))
		t.Flush()
		fmt.Fprintln(w, "  Target: the relay hop adds at most 10 ms at p99.")
	}
}
