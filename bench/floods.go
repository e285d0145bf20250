package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// The flood mode (-floods): the attacks of issue 24 against a whole hub
// process, one after another, each on a fresh hub (embedded etcd, spokes
// authenticated by token) that one honest simulated spoke publishes a small
// registry to and one honest ADS client follows. For each flood it
// measures the hub's resident memory (VmRSS) before, its peak during
// (VmHWM, reset as the flood starts, and VmRSS polled), and once the
// flood's streams closed and a few seconds passed; the honest client's
// convergence on an endpoint change made while the flood runs; and how the
// hub answered the flood (status codes, frames, connections closed),
// counted. The floods themselves are in floods_attacks.go.
//
// Bytes and counts compare across machines and runs; times less so on a
// shared machine.

// floodScale is the honest registry: one cluster, a few services, endpoints
// in three zones of one region (so a client's own zone can come first).
var floodScale = scaleConfig{Name: "floods", Clusters: 1, Services: 4, Endpoints: 6, GRPCClients: 1, ServicesPerClient: 4,
	Rate: 1, Duration: time.Second, PhaseTimeout: 2 * time.Minute}

// Timings of every flood.
const (
	floodSettleBefore = 2 * time.Second  // before the "before" sample
	floodSettleAfter  = 5 * time.Second  // after the flood's streams closed, before the "settled" sample
	floodConvergeWait = 20 * time.Second // longest wait for the honest client to see a change
	floodAnswerWait   = 30 * time.Second // longest wait for the hub to answer one flood stream
)

// Clusters the hub has tokens for: the honest one, the flood's, and a probe.
var (
	floodHonest = clusterID(0) // c00
	floodRogue  = clusterID(1) // c01
	floodProbe  = clusterID(2) // c02
)

// attackBlock is the loopback block the floods dial from (127.3.0.0/16):
// neither the honest spoke's nor the honest client's addresses.
const attackBlock = 3

// floodSpec is one flood.
type floodSpec struct {
	key, title string
	// run floods the hub in e, calling mid once while the flood holds (the
	// honest change is made and awaited then), and returns once the flood's
	// streams and connections closed.
	run func(ctx context.Context, e *floodEnv, r *floodResult, mid func()) error
	// afterStop, if set, runs once the hub stopped (it may read its data dir).
	afterStop func(ctx context.Context, e *floodEnv, r *floodResult) error
}

// floodResult is what one flood measured.
type floodResult struct {
	Key   string `json:"key"`
	Title string `json:"title"`
	// NA says why the flood could not be driven against this hub.
	NA              string  `json:"na,omitempty"`
	RSSBeforeBytes  float64 `json:"rssBeforeBytes"`
	RSSPeakBytes    float64 `json:"rssPeakBytes"`
	RSSSettledBytes float64 `json:"rssSettledBytes"`
	// PeakFromHWM says the peak is the kernel's VmHWM, reset as the flood
	// began (else only VmRSS polled every 20 ms).
	PeakFromHWM bool `json:"peakFromHwm"`
	// HeapSettledBytes is the hub's Go heap in use at the settled sample
	// (garbage of the flood included, until a collection).
	HeapSettledBytes float64 `json:"heapSettledBytes"`
	// LiveHeapBeforeBytes and LiveHeapAfterBytes are the hub's heap right
	// after two forced collections (/debug/pprof/heap?gc=1), before the
	// flood and after the settled sample: what the hub still holds of it.
	// 0: the hub has no --pprof.
	LiveHeapBeforeBytes float64 `json:"liveHeapBeforeBytes"`
	LiveHeapAfterBytes  float64 `json:"liveHeapAfterBytes"`
	// HubCPUSeconds is the CPU the hub used from the flood's start to its end.
	HubCPUSeconds float64 `json:"hubCpuSeconds"`
	// HubLogBytes is what the hub logged (at warn) from the flood's start to the settled sample.
	HubLogBytes int64 `json:"hubLogBytes"`
	// BaselineMs is the honest client's convergence on a change before the flood.
	BaselineMs float64 `json:"baselineMs"`
	// ConvergenceMs is its convergence on the change made during the flood (-1: not within ConvergeWait).
	ConvergenceMs  float64 `json:"convergenceMs"`
	ConvergenceErr string  `json:"convergenceError,omitempty"`
	// Total is how many streams, connections or messages the flood sent;
	// Refused how many of them the hub refused (Outcomes says how).
	Total    int            `json:"total"`
	Refused  int            `json:"refused"`
	Outcomes map[string]int `json:"outcomes"`
	Notes    []string       `json:"notes,omitempty"`
	FloodMs  float64        `json:"floodMs"`
	Error    string         `json:"error,omitempty"`
}

func (r *floodResult) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// floodResults is the flood mode's whole output.
type floodResults struct {
	Binary  string         `json:"binary"`
	Version string         `json:"version,omitempty"`
	Started time.Time      `json:"started"`
	CPUs    int            `json:"cpus"`
	Load    string         `json:"loadAverage"`
	HubArgs []string       `json:"hubArgs"`
	Notes   []string       `json:"notes,omitempty"`
	Floods  []*floodResult `json:"floods"`
}

// floodRunner holds what every flood shares.
type floodRunner struct {
	cfg    config
	work   string
	bin    string
	tokens map[registry.ClusterID]string
	// hubArgs are the flags every hub gets beyond the bench's own (those the binary knows).
	hubArgs []string
	log     *os.File
}

// runFloods runs the flood mode and reports what it measured, also when a
// flood failed (its row says how).
func runFloods(ctx context.Context, cfg config, stdout io.Writer) (err error) {
	res := &floodResults{Started: time.Now(), CPUs: numCPU(), Load: loadAverage()}
	fr := &floodRunner{cfg: cfg, tokens: map[registry.ClusterID]string{}}
	if fr.work, err = os.MkdirTemp("", "nave-floods-"); err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	failed := false
	defer func() {
		if fr.log != nil {
			fr.log.Close()
		}
		printFloods(stdout, res)
		if cfg.out != "" {
			if werr := writeFloodsJSON(cfg.out, res); werr != nil && err == nil {
				err = werr
			} else if werr == nil {
				progress("results written to %s", cfg.out)
			}
		}
		if (err == nil && !failed || ctx.Err() != nil) && !cfg.keep {
			_ = os.RemoveAll(fr.work)
		} else {
			progress("work dir (hub logs and data) kept in %s", fr.work)
		}
	}()
	if err := fr.prepare(ctx, res); err != nil {
		return err
	}
	specs, err := selectFloods(cfg.floodOnly)
	if err != nil {
		return err
	}
	for _, spec := range specs {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted before flood %s", spec.key)
		}
		r := fr.runOne(ctx, spec)
		res.Floods = append(res.Floods, r)
		if r.Error != "" {
			failed = true
			progress("flood %s: %s", spec.key, r.Error)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if failed {
		return errors.New("some floods did not complete (see their rows)")
	}
	return nil
}

// selectFloods returns the floods -flood-only names (all when empty).
func selectFloods(only string) ([]floodSpec, error) {
	all := floodSpecs()
	if only == "" {
		return all, nil
	}
	var out []floodSpec
	for _, k := range strings.Split(only, ",") {
		k = strings.TrimSpace(k)
		i := slices.IndexFunc(all, func(s floodSpec) bool { return s.key == k })
		if i < 0 {
			return nil, fmt.Errorf("-flood-only %q: no flood %q (a to %s)", only, k, all[len(all)-1].key)
		}
		out = append(out, all[i])
	}
	return out, nil
}

// prepare builds (or takes) the binary, learns which flags it knows, and
// writes the tokens file.
func (fr *floodRunner) prepare(ctx context.Context, res *floodResults) error {
	var err error
	if fr.log, err = os.Create(filepath.Join(fr.work, "spokes.log")); err != nil {
		return err
	}
	fr.bin = fr.cfg.naveBin
	if fr.bin == "" {
		progress("building ./cmd/nave")
		if fr.bin, err = buildHub(ctx, fr.work); err != nil {
			return err
		}
	}
	res.Binary = fr.bin
	if out, err := exec.CommandContext(ctx, fr.bin, "version").Output(); err == nil {
		res.Version = strings.TrimSpace(string(out))
	}
	known, err := hubFlags(ctx, fr.bin)
	if err != nil {
		return err
	}
	// The bench's own flags (hubprocess.go) and --tokens must be known: a
	// hub without them cannot be driven at all.
	for _, f := range []string{"id", "data-dir", "federation-addr", "xds-addr", "admin-addr", "log-level", "tokens"} {
		if !known[f] {
			return fmt.Errorf("%s hub has no --%s flag: the flood mode cannot drive it", fr.bin, f)
		}
	}
	var tokens strings.Builder
	for _, c := range []registry.ClusterID{floodHonest, floodRogue, floodProbe} {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		fr.tokens[c] = hex.EncodeToString(b)
		fmt.Fprintf(&tokens, "%s: %s\n", c, fr.tokens[c])
	}
	tokensFile := filepath.Join(fr.work, "tokens.yaml")
	if err := os.WriteFile(tokensFile, []byte(tokens.String()), 0o600); err != nil {
		return err
	}
	fr.hubArgs = []string{"--tokens", tokensFile}
	if known["pprof"] {
		fr.hubArgs = append(fr.hubArgs, "--pprof") // a forced collection before and after each flood
	}
	kept, dropped := knownArgs(fr.cfg.hubArgs, known)
	fr.hubArgs = append(fr.hubArgs, kept...)
	if len(dropped) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("-hub-args the binary does not know, left out: %s", strings.Join(dropped, " ")))
	}
	res.HubArgs = fr.hubArgs
	progress("floods against %s (%s); work dir %s", fr.bin, cmpOr(res.Version, "version unknown"), fr.work)
	return nil
}

var flagLine = regexp.MustCompile(`(?m)^\s+-{1,2}([a-zA-Z0-9][a-zA-Z0-9-]*)`)

// hubFlags returns the flags `nave hub` of bin knows, from its usage.
func hubFlags(ctx context.Context, bin string) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, "hub", "-h").CombinedOutput() // exits non-zero after its usage
	known := map[string]bool{}
	for _, m := range flagLine.FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = true
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("%s hub -h lists no flags:\n%s", bin, out)
	}
	return known, nil
}

// knownArgs keeps the flags of args (--name value, --name=value, or a
// lone boolean) that known names, and returns the others.
func knownArgs(args []string, known map[string]bool) (kept, dropped []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name := strings.TrimLeft(a, "-")
		name, _, hasValue := strings.Cut(name, "=")
		group := []string{a}
		if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			group = append(group, args[i+1])
			i++
		}
		if strings.HasPrefix(a, "-") && known[name] {
			kept = append(kept, group...)
		} else {
			dropped = append(dropped, group...)
		}
	}
	return kept, dropped
}

// floodEnv is one fresh hub with its honest spoke and client.
type floodEnv struct {
	fr     *floodRunner
	dir    string
	hub    *hubProcess
	ledger *ledger
	world  *world
	fleet  *fleet
	names  *resourceNames
	rng    *mrand.Rand

	spoke       *publisherStatus
	spokeConn   *grpc.ClientConn
	spokeCancel context.CancelFunc
	spokeDone   sync.WaitGroup

	// attack is how the floods' gRPC connections dial.
	attack *peerDialing
}

// startEnv starts a hub on a data dir of its own, publishes the honest
// registry and connects the honest client; it returns once the client
// holds every endpoint.
func (fr *floodRunner) startEnv(ctx context.Context, key string) (*floodEnv, error) {
	e := &floodEnv{fr: fr, dir: filepath.Join(fr.work, key), rng: mrand.New(mrand.NewPCG(fr.cfg.seed, 0xf100d)),
		attack: &peerDialing{connectTimeout: 10 * time.Second, backoff: clientBackoff}}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if e.hub, err = newHubProcess(fr.bin, filepath.Join(e.dir, "hub.log"), fr.hubArgs); err != nil {
		return nil, err
	}
	if err := e.hub.start(filepath.Join(e.dir, "data")); err != nil {
		return e, err
	}
	if _, err := e.hub.waitReady(ctx, floodScale.PhaseTimeout); err != nil {
		return e, err
	}
	sc := floodScale
	e.ledger = newLedger(time.Now(), sc.Clusters, sc.Services)
	if e.world, err = newWorld(sc, e.ledger, fr.cfg.seed, netip.AddrPort{}); err != nil {
		return e, err
	}
	e.names = newResourceNames(sc.Services)
	fc := fleetConfig{GRPC: 1, ServicesPerClient: sc.Services, Conns: 1, Seed: fr.cfg.seed,
		Dial: &peerDialing{connectTimeout: 10 * time.Second, backoff: clientBackoff}}
	if e.fleet, err = newFleet(ctx, fc, sc, e.ledger, e.hub.xds); err != nil {
		return e, err
	}
	if err := e.startSpoke(ctx); err != nil {
		return e, err
	}
	if err := e.await(ctx, "the honest spoke to be synced", func() bool {
		_, _, at := e.spoke.snapshot()
		return !at.IsZero()
	}); err != nil {
		return e, err
	}
	e.fleet.start([]int{0})
	return e, e.await(ctx, "the honest client to hold every endpoint", func() bool {
		_, done := e.fleet.complete([]int{0}, 0)
		return done == 1
	})
}

// startSpoke runs the honest cluster's publisher, with its token.
func (e *floodEnv) startSpoke(ctx context.Context) error {
	cl := e.world.clusters[0]
	dial := &peerDialing{connectTimeout: 10 * time.Second,
		backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond}}
	opts := append(dial.options(loopbackAddr(spokeBlock, 0), nil),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: e.fr.tokens[cl.id], AllowInsecure: true}))
	conn, err := grpc.NewClient(e.hub.fed, opts...)
	if err != nil {
		return fmt.Errorf("honest spoke: %w", err)
	}
	e.spokeConn = conn
	cfg := federation.DefaultSpokeConfig()
	cfg.SpokeID, cfg.Build = "bench-"+string(cl.id), "bench"
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 500*time.Millisecond
	e.spoke = &publisherStatus{}
	log := slog.New(slog.NewTextHandler(e.fr.log, &slog.HandlerOptions{Level: slog.LevelInfo})).With("flood", filepath.Base(e.dir))
	pub := federation.NewPublisher(cfg, federation.SpokeWiring{Cluster: cl.id, Network: benchNetwork, Origins: cl.origins, Status: e.spoke.update}, conn, log)
	sctx, cancel := context.WithCancel(ctx)
	e.spokeCancel = cancel
	e.spokeDone.Go(func() {
		if err := pub.Run(sctx, cl.out); err != nil && sctx.Err() == nil {
			log.Error("publisher stopped", "err", err)
		}
	})
	return nil
}

// await polls cond every 10 ms until it holds, a minute passes, or the hub exits.
func (e *floodEnv) await(ctx context.Context, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for !cond() {
		if !e.hub.running() {
			return fmt.Errorf("waiting for %s: the hub exited (%v); its log ends:\n%s", what, e.hub.waitErr, e.hub.logTail(20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// change makes one endpoint change of the honest cluster and returns how
// long until the honest client's EDS held it (its own receive time).
func (e *floodEnv) change(ctx context.Context) (time.Duration, error) {
	n0 := len(e.fleet.takeSamples())
	if _, err := e.world.randomChange(0, e.rng.IntN(floodScale.Services)); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(floodConvergeWait)
	for e.ledger.pending.Load() > 0 {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the honest client did not see the change within %s", floodConvergeWait)
		}
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			return 0, err
		}
	}
	var worst time.Duration
	for _, s := range e.fleet.takeSamples()[n0:] {
		worst = max(worst, s.latency)
	}
	return worst, nil
}

// stop ends the honest client and spoke, then the hub (gracefully: it
// writes what it owes to etcd).
func (e *floodEnv) stop() {
	if e.fleet != nil {
		e.fleet.stop()
	}
	if e.spokeCancel != nil {
		e.spokeCancel()
		e.spokeDone.Wait()
	}
	if e.spokeConn != nil {
		_ = e.spokeConn.Close()
	}
	if e.hub != nil {
		if _, err := e.hub.stop(30 * time.Second); err != nil {
			progress("%v", err)
		}
	}
}

// conn dials the hub's port addr from the i-th address of the attack block.
func (e *floodEnv) conn(addr string, i int, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append(e.attack.options(loopbackAddr(attackBlock, i), nil),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30), grpc.MaxCallSendMsgSize(1<<30)))
	return grpc.NewClient(addr, append(opts, extra...)...)
}

// awaitXDSClients waits (at most 15 s) until the hub counts at most n xDS
// clients: it saw the flood's streams close.
func (e *floodEnv) awaitXDSClients(ctx context.Context, n int) {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if m, err := e.hub.metrics(ctx); err == nil && m.sum("nave_xds_connected_clients", "") <= float64(n) {
			return
		}
		if sleep(ctx, 50*time.Millisecond) != nil {
			return
		}
	}
}

// rssSampler polls a process's VmRSS until stopped, keeping the largest.
type rssSampler struct {
	peak atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, _, err := procUsage(pid); err == nil && int64(rss) > s.peak.Load() {
				s.peak.Store(int64(rss))
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) end() float64 {
	close(s.stop)
	<-s.done
	return float64(s.peak.Load())
}

// resetPeakRSS resets a process's VmHWM to its current RSS (Linux: 5 to clear_refs).
func resetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// runOne runs one flood on a fresh hub and measures it.
func (fr *floodRunner) runOne(ctx context.Context, spec floodSpec) (r *floodResult) {
	r = &floodResult{Key: spec.key, Title: spec.title, Outcomes: map[string]int{}, ConvergenceMs: -1}
	progress("flood %s: %s", spec.key, spec.title)
	e, err := fr.startEnv(ctx, spec.key)
	defer func() {
		if e != nil {
			e.stop()
			if spec.afterStop != nil && r.Error == "" && r.NA == "" {
				if err := spec.afterStop(ctx, e, r); err != nil {
					r.Error = err.Error()
				}
			}
		}
	}()
	if err != nil {
		r.Error = "setup: " + err.Error()
		return r
	}
	if d, err := e.change(ctx); err == nil {
		r.BaselineMs = ms(d)
	} else {
		r.Error = "baseline change: " + err.Error()
		return r
	}
	if err := sleep(ctx, floodSettleBefore); err != nil {
		r.Error = err.Error()
		return r
	}
	pid := e.hub.pid()
	rss, _, err := procUsage(pid)
	if err != nil {
		r.Error = "read the hub's usage: " + err.Error()
		return r
	}
	r.RSSBeforeBytes = rss
	r.LiveHeapBeforeBytes = e.liveHeap(ctx)
	// The CPU the flood costs counts from after liveHeap's forced collections.
	_, cpu0, err := procUsage(pid)
	if err != nil {
		r.Error = "read the hub's usage: " + err.Error()
		return r
	}
	logPath := e.hub.logPath
	log0 := fileSize(logPath)
	r.PeakFromHWM = resetPeakRSS(pid) == nil
	sampler := sampleRSS(pid)
	var once sync.Once
	midCalled := false
	mid := func() {
		once.Do(func() {
			midCalled = true
			d, err := e.change(ctx)
			if err != nil {
				r.ConvergenceErr = err.Error()
				return
			}
			r.ConvergenceMs = ms(d)
		})
	}
	start := time.Now()
	floodErr := spec.run(ctx, e, r, mid)
	r.FloodMs = ms(time.Since(start))
	if floodErr == nil && r.NA == "" && !midCalled {
		r.note("the honest change was made after the flood (it ended before its midpoint)")
		mid()
	}
	peak := sampler.end()
	if r.PeakFromHWM {
		if hwm, err := procPeakRSS(pid); err == nil {
			peak = max(peak, hwm)
		}
	}
	r.RSSPeakBytes = peak
	if _, cpu1, err := procUsage(pid); err == nil {
		r.HubCPUSeconds = cpu1 - cpu0
	}
	if floodErr != nil {
		r.Error = floodErr.Error()
		return r
	}
	if !e.hub.running() {
		r.Error = fmt.Sprintf("the hub exited during the flood (%v); its log ends:\n%s", e.hub.waitErr, e.hub.logTail(20))
		return r
	}
	if err := sleep(ctx, floodSettleAfter); err != nil {
		r.Error = err.Error()
		return r
	}
	if rss, _, err := procUsage(pid); err == nil {
		r.RSSSettledBytes = rss
	}
	if m, err := e.hub.metrics(ctx); err == nil {
		r.HeapSettledBytes = m.sum("go_memstats_heap_inuse_bytes", "")
	}
	r.LiveHeapAfterBytes = e.liveHeap(ctx)
	r.HubLogBytes = fileSize(logPath) - log0
	if r.NA == "" {
		progress("flood %s: RSS %s -> peak %s -> settled %s; honest client converged in %s (baseline %s); refused %d of %d %v",
			spec.key, mib(r.RSSBeforeBytes), mib(r.RSSPeakBytes), mib(r.RSSSettledBytes), convergenceText(r), fmtMs(r.BaselineMs),
			r.Refused, r.Total, r.Outcomes)
	}
	return r
}

func convergenceText(r *floodResult) string {
	if r.ConvergenceMs < 0 {
		return "not within " + floodConvergeWait.String()
	}
	return fmtMs(r.ConvergenceMs)
}

// outcomes counts how the flood's parts ended. Safe for concurrent use.
type outcomes struct {
	mu sync.Mutex
	m  map[string]int
}

func (o *outcomes) add(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]int{}
	}
	o.m[key]++
}

func (o *outcomes) into(r *floodResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	maps.Copy(r.Outcomes, o.m)
}

func printFloods(w io.Writer, res *floodResults) {
	fmt.Fprintf(w, "\nNave flood bench: %s (%s); %d CPUs, load %s; hub flags %s\n", res.Binary, cmpOr(res.Version, "?"), res.CPUs, res.Load,
		strings.Join(res.HubArgs, " "))
	for _, n := range res.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nflood\tRSS before\tpeak\tsettled\theap settled\tlive heap before/after\thub CPU\tconvergence (baseline)\trefused\thow")
	for _, r := range res.Floods {
		if r.NA != "" {
			fmt.Fprintf(tw, "%s. %s\tn/a: %s\n", r.Key, r.Title, r.NA)
			continue
		}
		if r.Error != "" && r.RSSBeforeBytes == 0 {
			fmt.Fprintf(tw, "%s. %s\tfailed: %s\n", r.Key, r.Title, firstLine(r.Error))
			continue
		}
		fmt.Fprintf(tw, "%s. %s\t%s\t%s\t%s\t%s\t%s / %s\t%.1fs\t%s (%s)\t%d of %d\t%s\n", r.Key, r.Title, mib(r.RSSBeforeBytes), mib(r.RSSPeakBytes),
			mib(r.RSSSettledBytes), mib(r.HeapSettledBytes), mib(r.LiveHeapBeforeBytes), mib(r.LiveHeapAfterBytes), r.HubCPUSeconds,
			convergenceText(r), fmtMs(r.BaselineMs), r.Refused, r.Total, outcomeText(r.Outcomes))
	}
	tw.Flush()
	for _, r := range res.Floods {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "%s: %s\n", r.Key, n)
		}
		if r.ConvergenceErr != "" {
			fmt.Fprintf(w, "%s: convergence: %s\n", r.Key, r.ConvergenceErr)
		}
		if r.HubLogBytes > 0 {
			fmt.Fprintf(w, "%s: the hub logged %s meanwhile\n", r.Key, kib(float64(r.HubLogBytes)))
		}
		if r.Error != "" {
			fmt.Fprintf(w, "%s: error: %s\n", r.Key, r.Error)
		}
	}
}

// outcomeText lists outcomes, most frequent first.
func outcomeText(m map[string]int) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b))
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}

func writeFloodsJSON(path string, res *floodResults) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// liveHeap forces two collections in the hub (its pprof heap profile with
// gc=1: the second frees what sync.Pools, grpc's buffer pools among them,
// kept through the first) and returns the heap it then holds (0 without
// --pprof).
func (e *floodEnv) liveHeap(ctx context.Context) float64 {
	for range 2 {
		if code, _, err := e.getDiscard(ctx, "/debug/pprof/heap?gc=1"); err != nil || code != http.StatusOK {
			return 0
		}
	}
	m, err := e.hub.metrics(ctx)
	if err != nil {
		return 0
	}
	return m.sum("go_memstats_heap_alloc_bytes", "")
}

// getDiscard GETs path on the hub's admin port, reading the body away; it
// returns the status and the body's size.
func (e *floodEnv) getDiscard(ctx context.Context, path string) (int, int64, error) {
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.hub.admin+path, nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, n, err
}
