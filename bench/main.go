// Command bench is Nave's scale benchmark: it drives a real `nave hub`
// process with simulated spokes (real federation publishers), many
// lightweight ADS clients and two real grpc-go xDS clients, churns
// endpoints, restarts the hub, and reports convergence latency, xDS traffic,
// the hub's memory and CPU, and how fast it serves again after a restart.
//
//	go run ./bench                        # small scale (or SCALE=large)
//	go run ./bench -scale large -out large.json
//	go run ./bench -scale large -mtls     # the same with mTLS on both of the hub's ports
//	go run ./bench -storm                 # 100 spokes and 10,000 clients connect at once, then reconnect
//	go run ./bench -relay                 # 10,000 clients straight to the hub vs behind 200 node-local relays
//	go run ./bench -floods                # the hub's memory and an honest client's convergence under seven floods (floods.go)
//	go run ./bench -scale large -routes 200 -policies 200 -route-changes 0.5
//	                                      # traffic policy at scale (routes.go): half the churn moves routes' weights
//	go run ./bench -h                     # every knob
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/backoff"

	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
)

// scaleConfig is the size of one run.
type scaleConfig struct {
	Name              string        `json:"name"`
	Clusters          int           `json:"clusters"`
	Services          int           `json:"servicesPerCluster"`
	Endpoints         int           `json:"endpointsPerService"` // per cluster
	GRPCClients       int           `json:"grpcClients"`
	ServicesPerClient int           `json:"servicesPerClient"`
	Gateways          int           `json:"gatewayClients"`
	Rate              float64       `json:"changesPerSecond"`
	Duration          time.Duration `json:"churnDuration"`
	// RestartOver is how long the rolling restart of one service takes (0:
	// none). It starts a third of the way into the churn; at most a third
	// long, it leaves the first and last thirds, which the backlog check
	// compares, to the random changes alone.
	RestartOver time.Duration `json:"restartOver"`
	// RestartEndpoints is how many endpoints the restarted service (service 0
	// of cluster 0) has; the churn's random changes leave it alone.
	RestartEndpoints int `json:"restartEndpoints"`
	// PhaseTimeout bounds every wait (sync, clients, drain, restarts).
	PhaseTimeout time.Duration `json:"phaseTimeout"`
	// Routes and Policies are how many services carry a GRPCRoute and a
	// TrafficPolicy (see routes.go); RouteChanges is the share of the
	// churn's changes that move a route's weights instead of endpoints.
	Routes       int     `json:"routes,omitempty"`
	Policies     int     `json:"policies,omitempty"`
	RouteChanges float64 `json:"routeChanges,omitempty"`
}

// MarshalJSON writes durations as text ("20s").
func (s scaleConfig) MarshalJSON() ([]byte, error) {
	type plain scaleConfig
	return json.Marshal(struct {
		plain
		Duration     string `json:"churnDuration"`
		RestartOver  string `json:"restartOver"`
		PhaseTimeout string `json:"phaseTimeout"`
	}{plain(s), s.Duration.String(), s.RestartOver.String(), s.PhaseTimeout.String()})
}

var scales = map[string]scaleConfig{
	"small": {Name: "small", Clusters: 3, Services: 100, Endpoints: 10, GRPCClients: 100, ServicesPerClient: 5, Gateways: 2,
		Rate: 20, Duration: 20 * time.Second, RestartOver: 6 * time.Second, RestartEndpoints: 100, PhaseTimeout: 2 * time.Minute},
	"large": {Name: "large", Clusters: 10, Services: 1000, Endpoints: 10, GRPCClients: 1000, ServicesPerClient: 5, Gateways: 10,
		Rate: 100, Duration: 60 * time.Second, RestartOver: 20 * time.Second, RestartEndpoints: 1000, PhaseTimeout: 10 * time.Minute},
}

// stormScale is the reconnect storm's (-storm): a modest registry, many
// peers. It has no churn; Rate and Duration only size the address space.
var stormScale = scaleConfig{Name: "storm", Clusters: 100, Services: 20, Endpoints: 5, GRPCClients: 10_000, ServicesPerClient: 3,
	Rate: 1, Duration: time.Second, PhaseTimeout: 5 * time.Minute}

// defaultStreamsPerConn is how many client streams share one gRPC
// connection at most: below the hub's 128 concurrent streams per
// connection, beyond which grpc-go queues new streams until one ends.
const defaultStreamsPerConn = 100

// config is everything a run needs.
type config struct {
	scale       scaleConfig
	conns       int
	delta       bool
	seed        uint64
	out         string
	cpuProfile  string
	heapProfile string
	// restartProfile is where the warm restart's CPU profile goes.
	restartProfile string
	// selfProfile is where the bench's own CPU profile goes (is the load generator the bottleneck?).
	selfProfile string
	naveBin     string
	keep        bool
	settle      time.Duration
	spokeMaxBo  time.Duration
	hubArgs     []string
	noRestarts  bool
	// storm runs the reconnect storm instead of the churn scenario.
	storm bool
	// mtls runs the hub with mTLS on both ports; spokes and clients present certificates.
	mtls bool
	// clientIdentities spreads the ADS clients' certificates over this many
	// SPIFFE IDs (service accounts); the hub bounds streams per identity.
	clientIdentities int
	// streamsPerConn bounds the client streams sharing one connection;
	// connsSet says -conns was given (the storm's default is one per client).
	streamsPerConn int
	connsSet       bool
	// connectTimeout bounds each connection attempt of spokes and clients.
	connectTimeout time.Duration
	// relay compares the clients straight to the hub with the same clients
	// behind node-local relays (see relay.go); each relay's
	// clients share relayLocalConns connections to it.
	relay           bool
	relays          int
	relayLocalConns int
	// floods runs the flood mode (floods.go); floodOnly names the floods to run.
	floods    bool
	floodOnly string
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg config
	scaleName := fs.String("scale", cmpOr(os.Getenv("SCALE"), "small"), "small or large (default from $SCALE)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./bench [flags]\n\nScales (the other size flags override the scale's values):\n")
		for _, name := range []string{"small", "large"} {
			sc := scales[name]
			fmt.Fprintf(fs.Output(), "  %s: %d clusters x %d services x %d endpoints, %d gRPC clients x %d services, %d gateways, %.0f changes/s for %s\n",
				name, sc.Clusters, sc.Services, sc.Endpoints, sc.GRPCClients, sc.ServicesPerClient, sc.Gateways, sc.Rate, sc.Duration)
		}
		sc := stormScale
		fmt.Fprintf(fs.Output(), "  -storm: %d clusters x %d services x %d endpoints, %d gRPC clients x %d services, each on a connection of its own, all at once; then again after a hub restart\n",
			sc.Clusters, sc.Services, sc.Endpoints, sc.GRPCClients, sc.ServicesPerClient)
		sc = relayScale
		fmt.Fprintf(fs.Output(), "  -relay: %d clusters x %d services x %d endpoints, %d gRPC clients x %d services, straight to the hub, then behind -relays node-local relays; %.0f changes/s for %s in each\n",
			sc.Clusters, sc.Services, sc.Endpoints, sc.GRPCClients, sc.ServicesPerClient, sc.Rate, sc.Duration)
		fmt.Fprintf(fs.Output(), "  traffic policy at scale (issue 26): -scale large -routes 200 -policies 200 -route-changes 0.5 (route changes beside endpoint changes; -route-changes 1: route changes only)\n")
		fmt.Fprintln(fs.Output())
		fs.PrintDefaults()
	}
	var o scaleConfig
	fs.IntVar(&o.Clusters, "clusters", 0, "simulated clusters (spokes)")
	fs.IntVar(&o.Services, "services", 0, "services per cluster (every cluster exports every service)")
	fs.IntVar(&o.Endpoints, "endpoints", 0, "endpoints per service per cluster")
	fs.IntVar(&o.GRPCClients, "grpc-clients", 0, "gRPC-style ADS clients (LDS->RDS->CDS->EDS by name, with a locality)")
	fs.IntVar(&o.ServicesPerClient, "services-per-client", 0, "services each gRPC-style client subscribes to")
	fs.IntVar(&o.Gateways, "gateways", 0, "gateway-style ADS clients (wildcard CDS, EDS for every cluster)")
	fs.Float64Var(&o.Rate, "rate", 0, "endpoint changes per second during the churn")
	fs.DurationVar(&o.Duration, "duration", 0, "how long the churn lasts")
	fs.DurationVar(&o.RestartOver, "restart-over", 0, "how long the rolling restart of one service takes")
	fs.IntVar(&o.RestartEndpoints, "restart-endpoints", 0, "endpoints of the service the rolling restart replaces, one by one")
	fs.DurationVar(&o.PhaseTimeout, "phase-timeout", 0, "longest wait for any phase (sync, clients, drain, restart)")
	noRestart := fs.Bool("no-rolling-restart", false, "churn without the rolling restart of one service")
	fs.BoolVar(&cfg.noRestarts, "no-restarts", false, "skip the hub restarts (warm, cold with the catalog, cold; -storm: the reconnect storm)")
	fs.IntVar(&cfg.conns, "conns", 4, "gRPC connections the ADS clients share, at least (more when -streams-per-conn asks; -storm: one per client)")
	fs.IntVar(&cfg.streamsPerConn, "streams-per-conn", defaultStreamsPerConn, "client streams one connection carries at most (the hub allows 128)")
	fs.BoolVar(&cfg.storm, "storm", false, "reconnect storm: every spoke and every client connects at once, to a fresh hub and after a restart (sizes from -storm's scale; the size flags override)")
	fs.BoolVar(&cfg.relay, "relay", false, "node-local relays: the hub's streams and memory with the gRPC clients straight to it, then (a fresh hub, the same registry) behind -relays relays running in the bench process, and the latency a relay adds (sizes from -relay's scale; the size flags override)")
	fs.IntVar(&cfg.relays, "relays", defaultRelays, "with -relay, how many relays (nodes) the gRPC clients are spread over")
	fs.IntVar(&cfg.relayLocalConns, "relay-local-conns", defaultRelayLocalConns, "with -relay, how many connections each relay's clients share (one per client needs a file descriptor at both ends, in the bench process)")
	fs.BoolVar(&cfg.floods, "floods", false, "flood mode: a fresh hub per flood (xDS localities, huge regions, node IDs and headers, idle admin connections, an oversized hello, gateway announcements) with an honest spoke and client; the hub's RSS and the client's convergence during each (see floods.go)")
	fs.StringVar(&cfg.floodOnly, "flood-only", "", "with -floods, which floods to run, by letter (e.g. \"a,c\"; default all)")
	fs.BoolVar(&cfg.mtls, "mtls", false, "mTLS on the hub's federation and xDS ports: spokes and clients present certificates of a CA the bench makes")
	clientIDs := fs.Int("client-identities", 0, "with -mtls, how many SPIFFE IDs the clients' certificates spread over (default 1; -storm: 10, as the hub bounds streams per identity)")
	fs.BoolVar(&cfg.delta, "delta", false, "ADS clients speak delta (incremental) xDS instead of state of the world")
	fs.Uint64Var(&cfg.seed, "seed", 1, "random seed (subscriptions, churn)")
	fs.StringVar(&cfg.out, "out", "bench-results.json", "where to write the results as JSON (empty: nowhere)")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "save the hub's CPU profile during the churn (-storm: the storm's first 20 s) here (starts the hub with --pprof)")
	fs.StringVar(&cfg.heapProfile, "heapprofile", "", "save the hub's heap profile after the churn (-storm: the storm) here (starts the hub with --pprof)")
	fs.StringVar(&cfg.selfProfile, "bench-cpuprofile", "", "save the benchmark process's own CPU profile (the whole run) here")
	fs.StringVar(&cfg.restartProfile, "restart-cpuprofile", "", "save the hub's CPU profile of the first seconds after the warm restart here (starts the hub with --pprof)")
	fs.StringVar(&cfg.naveBin, "nave-bin", "", "a built nave binary (default: build ./cmd/nave into the work dir)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the work dir (hub data, logs) after a successful run")
	fs.DurationVar(&cfg.settle, "settle", 2*time.Second, "pause before each memory sample, so the hub's heap settles")
	fs.DurationVar(&cfg.spokeMaxBo, "spoke-max-backoff", 500*time.Millisecond, "the simulated spokes' longest reconnect backoff (production default: 30s)")
	fs.DurationVar(&cfg.connectTimeout, "connect-timeout", 0, "how long one connection attempt of a spoke or client (TCP, TLS and HTTP/2 handshakes) may take before it gives up and retries (default 5s; -storm: 20s, grpc-go's default, as real clients reconnecting)")
	routes := fs.Int("routes", 0, "services (of each cluster's -services) that carry a GRPCRoute: a 90/10 weighted split between the service and another service, and a header match sending canary requests to the other; one cluster carries each (at large scale: -routes 200)")
	policies := fs.Int("policies", 0, "services that carry a TrafficPolicy: least request, outlier detection by failure percentage, a 2s timeout, 2 retries (at large scale: -policies 200)")
	routeChanges := fs.Float64("route-changes", 0, "share (0 to 1) of the churn's changes that move a routed service's weights instead of its endpoints; each cycle of the churn (a tenth of it, 1 to 5 s) starts with its share of route changes, so that the hub's CPU is split by kind (needs -routes; turns the rolling restart off)")
	hubArgs := fs.String("hub-args", "", "extra flags for nave hub, space-separated (e.g. \"--snapshot-interval 1s\")")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	sc, ok := scales[*scaleName]
	if !ok {
		return config{}, fmt.Errorf("-scale %q: want small or large", *scaleName)
	}
	cfg.clientIdentities = 1
	if cfg.connectTimeout == 0 {
		cfg.connectTimeout = 5 * time.Second
		if cfg.storm {
			cfg.connectTimeout = 20 * time.Second
		}
	}
	if cfg.storm {
		sc, cfg.clientIdentities = stormScale, 10
	}
	if cfg.relay {
		sc = relayScale
	}
	restartAsked := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "conns":
			cfg.connsSet = true
		case "client-identities":
			cfg.clientIdentities = *clientIDs
		case "clusters":
			sc.Clusters = o.Clusters
		case "services":
			sc.Services = o.Services
		case "endpoints":
			sc.Endpoints = o.Endpoints
		case "grpc-clients":
			sc.GRPCClients = o.GRPCClients
		case "services-per-client":
			sc.ServicesPerClient = o.ServicesPerClient
		case "gateways":
			sc.Gateways = o.Gateways
		case "rate":
			sc.Rate = o.Rate
		case "duration":
			sc.Duration = o.Duration
		case "restart-over":
			sc.RestartOver, restartAsked = o.RestartOver, o.RestartOver > 0
		case "restart-endpoints":
			sc.RestartEndpoints = o.RestartEndpoints
		case "phase-timeout":
			sc.PhaseTimeout = o.PhaseTimeout
		}
	})
	sc.Routes, sc.Policies, sc.RouteChanges = *routes, *policies, *routeChanges
	if sc.RouteChanges > 0 && !restartAsked {
		// The rolling restart's endpoint changes would land in route
		// segments too, and blur the hub's CPU per kind of change.
		*noRestart = true
	}
	if *noRestart {
		sc.RestartOver, sc.RestartEndpoints = 0, 0
	}
	cfg.scale = sc
	cfg.hubArgs = strings.Fields(*hubArgs)
	return cfg, validate(cfg)
}

func validate(cfg config) error {
	sc, lim := cfg.scale, registry.DefaultLimits()
	switch {
	case sc.Clusters < 1 || sc.Services < 1 || sc.Endpoints < 1:
		return errors.New("-clusters, -services and -endpoints must be at least 1")
	case sc.Services+1 > lim.MaxServicesPerCluster:
		return fmt.Errorf("-services %d: a cluster may export at most %d", sc.Services, lim.MaxServicesPerCluster-1)
	case 2*sc.Endpoints > lim.MaxEndpoints:
		return fmt.Errorf("-endpoints %d: the churn doubles it at most, and a shard holds at most %d", sc.Endpoints, lim.MaxEndpoints)
	case sc.RestartOver > 0 && (sc.RestartEndpoints < 1 || sc.RestartEndpoints > lim.MaxEndpoints):
		return fmt.Errorf("-restart-endpoints %d: want 1 to %d (a shard's limit)", sc.RestartEndpoints, lim.MaxEndpoints)
	case 2*sc.Services*sc.Endpoints > lim.MaxEndpointsPerCluster:
		return fmt.Errorf("-services x -endpoints: the churn may double them, and a cluster holds at most %d endpoints", lim.MaxEndpointsPerCluster)
	case sc.GRPCClients < 0 || sc.Gateways < 0 || sc.GRPCClients+sc.Gateways == 0:
		return errors.New("need at least one ADS client (-grpc-clients, -gateways)")
	case sc.ServicesPerClient < 1:
		return errors.New("-services-per-client must be at least 1")
	case sc.Rate <= 0 || sc.Duration <= 0:
		return errors.New("-rate and -duration must be positive")
	case sc.PhaseTimeout <= 0:
		return errors.New("-phase-timeout must be positive")
	case cfg.conns < 1:
		return errors.New("-conns must be at least 1")
	case cfg.connectTimeout <= 0:
		return errors.New("-connect-timeout must be positive")
	case cfg.streamsPerConn < 1:
		return errors.New("-streams-per-conn must be at least 1")
	case cfg.clientIdentities < 1:
		return errors.New("-client-identities must be at least 1")
	case sc.Clusters > maxLoopbackPeers || clientConns(cfg) > maxLoopbackPeers:
		return fmt.Errorf("at most %d spokes and %d client connections (each dials from a loopback address of its own)", maxLoopbackPeers, maxLoopbackPeers)
	}
	if err := validateTraffic(cfg); err != nil {
		return err
	}
	if cfg.relay {
		return validateRelay(cfg)
	}
	return nil
}

// validateTraffic checks -routes, -policies and -route-changes.
func validateTraffic(cfg config) error {
	sc := cfg.scale
	switch {
	case sc.Routes == 0 && sc.Policies == 0 && sc.RouteChanges == 0:
		return nil
	case cfg.storm || cfg.relay || cfg.floods:
		return errors.New("-routes, -policies and -route-changes go with the churn scenario only (not -storm, -relay or -floods)")
	case sc.Routes < 0 || sc.Routes > sc.Services || sc.Policies < 0 || sc.Policies > sc.Services:
		return fmt.Errorf("-routes %d, -policies %d: want 0 to -services (%d)", sc.Routes, sc.Policies, sc.Services)
	case sc.Routes > 0 && sc.Services < 2:
		return errors.New("-routes: a route splits between two services, -services must be at least 2")
	case sc.RouteChanges < 0 || sc.RouteChanges > 1:
		return fmt.Errorf("-route-changes %v: want a share from 0 to 1", sc.RouteChanges)
	case sc.RouteChanges > 0 && sc.Routes == 0:
		return errors.New("-route-changes needs -routes")
	case sc.RouteChanges > 0 && sc.RestartOver > 0:
		return errors.New("-route-changes splits the hub's CPU by segments of the churn, which the rolling restart would blur: drop -restart-over")
	}
	return nil
}

// clientConns is how many connections the ADS clients use: one each in the
// storm (unless -conns), else -conns, or more so that none carries more
// than -streams-per-conn streams.
func clientConns(cfg config) int {
	clients := cfg.scale.GRPCClients + cfg.scale.Gateways
	if cfg.storm && !cfg.connsSet {
		return max(clients, 1)
	}
	return connsFor(clients, cfg.streamsPerConn, cfg.conns)
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal the bench cleans up (the hub is stopped either
	// way); a second one kills it at once.
	context.AfterFunc(ctx, stop)
	if cfg.selfProfile != "" {
		f, err := os.Create(cfg.selfProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if cfg.floods {
		err = runFloods(ctx, cfg, os.Stdout)
	} else {
		err = run(ctx, cfg, os.Stdout)
	}
	stop()
	if err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// progress prints what the bench is doing to stderr.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s ==> %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// run runs the whole benchmark, then reports what it measured, also when a
// phase failed (the results say which).
func run(ctx context.Context, cfg config, stdout io.Writer) (err error) {
	res := &results{Scale: cfg.scale, Delta: cfg.delta, Conns: clientConns(cfg), Seed: cfg.seed, Started: time.Now(), CPUs: numCPU(),
		MTLS: cfg.mtls, Load: loadAverage()}
	if cfg.mtls {
		res.ClientIdentities = cfg.clientIdentities
	}
	b := &bench{cfg: cfg, res: res,
		spokeDial: &peerDialing{connectTimeout: cfg.connectTimeout,
			backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: cfg.spokeMaxBo}},
		clientDial: &peerDialing{connectTimeout: cfg.connectTimeout, backoff: clientBackoff},
	}
	defer func() {
		b.close()
		if err != nil {
			res.Error = err.Error()
			if b.work != "" && (ctx.Err() == nil || cfg.keep) {
				err = fmt.Errorf("%w\n(hub log and data kept in %s)", err, b.work)
			}
		}
		printReport(stdout, res)
		if cfg.out != "" {
			if werr := writeJSON(cfg.out, res); werr != nil && err == nil {
				err = werr
			} else if werr == nil {
				progress("results written to %s", cfg.out)
			}
		}
		// A failed run keeps the work dir for its logs; an interrupted or successful one does not.
		if (err == nil || ctx.Err() != nil) && !cfg.keep && b.work != "" {
			_ = os.RemoveAll(b.work)
		}
	}()
	steps := []struct {
		name    string
		fn      func(context.Context) error
		restart bool // skipped with -no-restarts
	}{
		// 1. A work dir and the hub binary.
		{"prepare", b.prepare, false},
		// 2. The echo backend and the hub, empty.
		{"start the hub", b.startHub, false},
		// 3. Simulated clusters publish their full states: the initial sync.
		{"initial sync", b.initialSync, false},
		// 4. ADS clients connect: first one per locality group, then the rest; then real grpc-go clients.
		{"connect clients", b.connectClients, false},
		// 5. Churn endpoints; measure convergence, traffic and the hub's cost.
		{"churn", b.churn, false},
		// 6. Restart the hub on its data dir (warm start from the persisted snapshot).
		{"warm restart", b.warmRestart, true},
		// 7. Restart the hub on its data dir without its snapshots: it knows the clusters from its catalog.
		{"cold restart with the catalog", b.catalogRestart, true},
		// 8. Restart the hub on a fresh data dir (spokes resync everything).
		{"cold restart", b.coldRestart, true},
	}
	if cfg.storm {
		steps = steps[:2]
		steps = append(steps, []struct {
			name    string
			fn      func(context.Context) error
			restart bool
		}{
			// 3. Every spoke and every client connects at once to the fresh hub.
			{"storm", b.storm, false},
			// 4. The hub restarts on its data dir: every one of them reconnects at once.
			{"reconnect storm", b.reconnectStorm, true},
		}...)
	}
	if cfg.relay {
		rr := newRelayRun(b)
		steps = append(steps[:1], []struct {
			name    string
			fn      func(context.Context) error
			restart bool
		}{
			// 2. The echo backend and the hub (with --pprof, for a forced GC before each memory sample); the spokes sync.
			{"start the hub", rr.start, false},
			// 3. The clients straight to the hub: its streams and memory; then a churn.
			{"direct clients", rr.direct, false},
			// 4. A fresh hub, the same registry: the clients behind the relays; then a churn with a probe pair per relay.
			{"relayed clients", rr.relayed, false},
		}...)
	}
	for _, s := range steps {
		if s.restart && cfg.noRestarts {
			continue
		}
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted before %s", s.name)
		}
		if err := s.fn(ctx); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%s: interrupted", s.name)
			}
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// bench holds what the steps share.
type bench struct {
	cfg     config
	res     *results
	work    string
	bin     string
	hub     *hubProcess
	echo    *echoBackend
	ledger  *ledger
	world   *world
	spokes  *spokes
	fleet   *fleet
	sanity  []*sanityClient
	all     []int // every client index
	logFile *os.File
	// pki holds the certificates of an -mtls run.
	pki *benchPKI
	// spokeWarnings tallies the spokes' log records at Warn and above, by phase.
	spokeWarnings [phases]errorTally
	// How spokes and clients dial the hub, and how often they did.
	spokeDial, clientDial *peerDialing
}

func (b *bench) close() {
	for _, s := range b.sanity {
		s.close()
	}
	if b.fleet != nil {
		b.fleet.stop()
	}
	if b.spokes != nil {
		b.spokes.stop()
	}
	if b.hub != nil {
		b.hub.kill()
	}
	if b.echo != nil {
		b.echo.stop()
	}
	if b.logFile != nil {
		b.logFile.Close()
	}
}

func (b *bench) prepare(ctx context.Context) error {
	work, err := os.MkdirTemp("", "nave-bench-")
	if err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	b.work = work
	progress("scale %s: %d clusters x %d services x %d endpoints, %d gRPC clients (%d services each), %d gateways, %.0f changes/s for %s; work dir %s",
		b.cfg.scale.Name, b.cfg.scale.Clusters, b.cfg.scale.Services, b.cfg.scale.Endpoints, b.cfg.scale.GRPCClients,
		b.cfg.scale.ServicesPerClient, b.cfg.scale.Gateways, b.cfg.scale.Rate, b.cfg.scale.Duration, work)
	if b.cfg.mtls {
		var ids []registry.ClusterID
		for c := range b.cfg.scale.Clusters {
			ids = append(ids, clusterID(c))
		}
		if b.pki, err = newBenchPKI(filepath.Join(work, "pki"), ids, b.cfg.clientIdentities); err != nil {
			return fmt.Errorf("certificates: %w", err)
		}
		progress("mTLS on both ports: %d cluster certificates, %d client identities", len(ids), len(b.pki.clients))
	}
	if b.cfg.naveBin != "" {
		b.bin = b.cfg.naveBin
		return nil
	}
	progress("building ./cmd/nave")
	b.bin, err = buildHub(ctx, work)
	return err
}

func (b *bench) startHub(ctx context.Context) error {
	var err error
	if b.echo, err = startEchoBackend(); err != nil {
		return err
	}
	hubArgs := b.cfg.hubArgs
	if b.cfg.cpuProfile != "" || b.cfg.heapProfile != "" || b.cfg.restartProfile != "" {
		hubArgs = append([]string{"--pprof"}, hubArgs...)
	}
	if b.pki != nil {
		hubArgs = append(b.pki.hubArgs(), hubArgs...)
	}
	if b.hub, err = newHubProcess(b.bin, filepath.Join(b.work, "hub.log"), hubArgs); err != nil {
		return err
	}
	progress("starting the hub (federation %s, xDS %s, admin %s)", b.hub.fed, b.hub.xds, b.hub.admin)
	if err := b.hub.start(filepath.Join(b.work, "data-1")); err != nil {
		return err
	}
	ready, err := b.hub.waitReady(ctx, b.cfg.scale.PhaseTimeout)
	if err != nil {
		return err
	}
	b.res.HubReadyMs = ms(ready)
	return b.sample(ctx, "empty")
}

// sample records the hub's resource use after the settle pause.
func (b *bench) sample(ctx context.Context, phase string) error {
	if err := sleep(ctx, b.cfg.settle); err != nil {
		return err
	}
	u, err := b.hub.usage(ctx, phase)
	if err != nil {
		return fmt.Errorf("sample the hub's usage: %w", err)
	}
	b.res.Usage = append(b.res.Usage, u)
	return nil
}

// makeWorld makes the simulated clusters, their ledger and the
// (unconnected) clients: they exist before any change, so every change
// knows its subscribers.
func (b *bench) makeWorld(ctx context.Context) error {
	sc := b.cfg.scale
	b.ledger = newLedger(time.Now(), sc.Clusters, sc.Services)
	var err error
	if b.world, err = newWorld(sc, b.ledger, b.cfg.seed, b.echo.addr); err != nil {
		return err
	}
	b.res.Endpoints = b.world.endpointCount()
	return b.makeFleet(ctx)
}

func (b *bench) initialSync(ctx context.Context) error {
	sc := b.cfg.scale
	if err := b.makeWorld(ctx); err != nil {
		return err
	}
	progress("%d spokes publish %d endpoints", sc.Clusters, b.res.Endpoints)
	start := time.Now()
	if err := b.startSpokes(ctx); err != nil {
		return err
	}
	synced, confirmed, err := b.awaitSpokes(ctx, nil, start)
	if err != nil {
		return err
	}
	b.res.InitialSync = syncResult{SpokesSyncedMs: ms(synced), HubConfirmedMs: ms(confirmed)}
	progress("initial sync: spokes acknowledged after %s, hub view confirmed after %s", synced.Round(time.Millisecond), confirmed.Round(time.Millisecond))
	return b.sample(ctx, "synced")
}

// makeFleet makes the ADS clients, unconnected: on clientConns
// connections, over mTLS with -mtls.
func (b *bench) makeFleet(ctx context.Context) error {
	sc := b.cfg.scale
	fc := fleetConfig{GRPC: sc.GRPCClients, ServicesPerClient: sc.ServicesPerClient, Gateways: sc.Gateways,
		Conns: clientConns(b.cfg), Delta: b.cfg.delta, Seed: b.cfg.seed, Dial: b.clientDial, Routes: b.world.routes, Plan: b.world.plan}
	if b.pki != nil {
		fc.TLS = func(conn int) *tls.Config { return b.pki.clients[clientIdentity(conn, b.cfg.clientIdentities)] }
	}
	var err error
	b.fleet, err = newFleet(ctx, fc, sc, b.ledger, b.hub.xds)
	return err
}

// startSpokes starts a publisher per cluster, logging to spokes.log; their
// warnings are tallied by the phase the clients are in.
func (b *bench) startSpokes(ctx context.Context) error {
	var err error
	if b.logFile == nil {
		if b.logFile, err = os.Create(filepath.Join(b.work, "spokes.log")); err != nil {
			return err
		}
	}
	handler := slog.NewTextHandler(b.logFile, &slog.HandlerOptions{Level: slog.LevelInfo})
	log := slog.New(warnCounter{Handler: handler, tally: func() *errorTally { return &b.spokeWarnings[b.fleet.phase.Load()] }})
	var tlsFor func(registry.ClusterID) *tls.Config
	if b.pki != nil {
		tlsFor = func(c registry.ClusterID) *tls.Config { return b.pki.spokes[c] }
	}
	b.spokes, err = startSpokes(ctx, b.world, b.hub.fed, b.cfg.spokeMaxBo, log, tlsFor, b.spokeDial)
	return err
}

// awaitSpokes waits until every publisher has a session acknowledged by the
// hub, later than the sessions counted in after (nil: any), and the hub's
// /debug/clusters shows every cluster connected, confirmed (not restored),
// at the version the spoke holds acknowledged, with every endpoint. It
// returns how long after start each was first seen.
func (b *bench) awaitSpokes(ctx context.Context, after []int, start time.Time) (synced, confirmed time.Duration, err error) {
	err = b.await(ctx, "every spoke synced and the hub showing it", func() (bool, error) {
		at, ok := b.spokes.syncedSince(after)
		if !ok {
			return false, nil
		}
		synced = at.Sub(start)
		ok, err := b.hubConfirms(ctx)
		if ok {
			confirmed = time.Since(start)
		}
		return ok, err
	})
	return synced, confirmed, err
}

// hubConfirms reports whether the hub holds every cluster live, at the
// version its spoke holds acknowledged, with every endpoint.
func (b *bench) hubConfirms(ctx context.Context) (bool, error) {
	view, err := b.hub.clusters(ctx)
	if err != nil {
		return false, nil // the hub may still be starting; await times out if it never answers
	}
	byID := map[string]hubCluster{}
	for _, c := range view {
		byID[c.Cluster] = c
	}
	for i, cl := range b.world.clusters {
		st, _, _ := b.spokes.status[i].snapshot()
		want := 0
		for _, sh := range cl.state {
			want += len(sh.Endpoints)
		}
		c, ok := byID[string(cl.id)]
		if !ok || !c.Connected || c.Restored || c.Version != st.AckedVersion || c.Endpoints != want {
			return false, nil
		}
	}
	return true, nil
}

// await polls cond until it holds, the phase timeout passes, or the hub exits.
func (b *bench) await(ctx context.Context, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.scale.PhaseTimeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if !b.hub.running() {
			return fmt.Errorf("waiting for %s: the hub exited (%v); its log ends:\n%s", what, b.hub.waitErr, b.hub.logTail(20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (b *bench) connectClients(ctx context.Context) error {
	sc := b.cfg.scale
	first := b.fleet.firstPerGroup(regions(sc.Clusters))
	for i := range b.fleet.clients {
		b.all = append(b.all, i)
	}
	rest := slices.DeleteFunc(slices.Clone(b.all), func(i int) bool { return slices.Contains(first, i) })
	// How long from their start until the last of them held every endpoint (client-side timestamps).
	awaitClients := func(indices []int, what string) (time.Duration, error) {
		start := b.ledger.since(time.Now())
		var last time.Duration
		err := b.await(ctx, what, func() (bool, error) {
			var done int
			last, done = b.fleet.complete(indices, 0)
			return done == len(indices), nil
		})
		return last - start, err
	}
	progress("connecting %d clients, one per locality group", len(first))
	b.fleet.start(first)
	d, err := awaitClients(first, "the first client of every locality group to hold every endpoint")
	if err != nil {
		return err
	}
	b.res.Connect.FirstPerGroup, b.res.Connect.FirstPerGroupMs = len(first), ms(d)
	if err := b.sample(ctx, "groups"); err != nil {
		return err
	}
	progress("connecting the other %d clients", len(rest))
	b.fleet.start(rest)
	d, err = awaitClients(rest, "every client to hold every endpoint")
	if err != nil {
		return err
	}
	b.res.Connect.Rest, b.res.Connect.RestMs = len(rest), ms(d)
	progress("clients connected: first per group after %s, the rest after %s", time.Duration(b.res.Connect.FirstPerGroupMs*1e6).Round(time.Millisecond), d.Round(time.Millisecond))
	if f := b.fleet; f.routes != nil {
		// Every gRPC client holds its services' routes: else route changes could not converge.
		err := b.await(ctx, "every gRPC client to hold its services' routes", func() (bool, error) {
			return f.routeHolders.Load() == f.routeWatches, nil
		})
		if err != nil {
			return fmt.Errorf("%w (%d of %d routes held; %d served without their route)", err, f.routeHolders.Load(), f.routeWatches,
				f.routeObserved[phaseConnect][1].Load())
		}
		progress("%d routes held by their %d (client, service) watchers; %d services carry a policy", len(b.world.plan.routed), f.routeWatches, len(b.world.plan.policied))
	}
	if err := b.sample(ctx, "clients"); err != nil {
		return err
	}
	// Real grpc-go clients in two localities call the echo backend through the hub.
	regionLast := fmt.Sprintf("region-%d", regions(sc.Clusters)-1)
	var files *xdstest.TLSFiles
	if b.pki != nil {
		files = &xdstest.TLSFiles{CA: b.pki.ca.File, Cert: b.pki.sanityCert, Key: b.pki.sanityKey}
	}
	for i, l := range []registry.Locality{{Region: "region-0", Zone: zoneOf("region-0", 0)}, {Region: regionLast, Zone: zoneOf(regionLast, 1)}} {
		c, err := newSanityClient(b.hub.xds, fmt.Sprintf("grpc-go-%d", i), l, files)
		if err != nil {
			return err
		}
		b.sanity = append(b.sanity, c)
	}
	return b.checkSanity(ctx, "connect")
}

func (b *bench) checkSanity(ctx context.Context, phase string) error {
	for _, c := range b.sanity {
		r := c.check(ctx, phase, 30*time.Second)
		b.res.Sanity = append(b.res.Sanity, r)
		if !r.OK {
			progress("grpc-go client %s could not call the echo backend (%s): %s", c.name, phase, r.Error)
		}
	}
	return ctx.Err()
}

func (b *bench) churn(ctx context.Context) error {
	sc := b.cfg.scale
	b.fleet.phase.Store(phaseChurn)
	beforeM, err := b.hub.metrics(ctx)
	if err != nil {
		return err
	}
	beforeU, err := b.hub.usage(ctx, "before churn")
	if err != nil {
		return err
	}
	beforeT, beforeSelf := b.fleet.counters.snapshot(), selfCPU()
	profDone := make(chan error, 1)
	if b.cfg.cpuProfile != "" {
		go func() {
			secs := max(int(sc.Duration.Seconds()), 1)
			profDone <- b.hub.fetchProfile(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), b.cfg.cpuProfile)
		}()
	} else {
		profDone <- nil
	}
	progress("churn: %.0f changes/s for %s", sc.Rate, sc.Duration)
	if sc.RouteChanges > 0 {
		progress("churn: %.0f%% of each %s cycle moves routes' weights, the rest endpoints", 100*sc.RouteChanges, routeCycle(sc.Duration))
	}
	// With route changes, the hub's CPU time at each switch between route
	// and endpoint changes (see attributeCPU).
	var marks []cpuMark
	if b.world.routes != nil && sc.RouteChanges > 0 {
		b.world.onSegment = func(route bool) {
			_, cpu, _ := procUsage(b.hub.pid())
			marks = append(marks, cpuMark{route: route, cpuSeconds: cpu})
		}
	}
	start := b.ledger.since(time.Now())
	b.world.onRestart = b.fleet.restarting.Store
	cr, err := b.world.churn(ctx, sc.Rate, sc.Duration, sc.RestartOver)
	b.fleet.restarting.Store(false)
	b.world.onSegment = nil
	if err != nil {
		return err
	}
	end := b.ledger.since(time.Now())
	pendingAtEnd := b.ledger.pending.Load()
	var routesPendingAtEnd int64
	if b.world.routes != nil {
		routesPendingAtEnd = b.world.routes.pending.Load()
	}
	progress("churn done: %d changes; %d (client, change) pairs still pending (%d of route changes); waiting for every client",
		cr.Changes, pendingAtEnd+routesPendingAtEnd, routesPendingAtEnd)
	drainErr := b.await(ctx, "every client to hold every change", func() (bool, error) {
		return b.ledger.pending.Load() == 0 && (b.world.routes == nil || b.world.routes.pending.Load() == 0), nil
	})
	_, endCPU, _ := procUsage(b.hub.pid())
	afterT, afterSelf := b.fleet.counters.snapshot(), selfCPU()
	afterM, err := b.hub.metrics(ctx)
	if err != nil {
		return err
	}
	afterU, err := b.hub.usage(ctx, "after churn")
	if err != nil {
		return err
	}
	b.res.Usage = append(b.res.Usage, afterU)
	if err := <-profDone; err != nil {
		b.res.Notes = append(b.res.Notes, "cpu profile: "+err.Error())
	}
	if b.cfg.heapProfile != "" {
		if err := b.hub.fetchProfile(ctx, "/debug/pprof/heap", b.cfg.heapProfile); err != nil {
			b.res.Notes = append(b.res.Notes, "heap profile: "+err.Error())
		}
	}
	b.res.Churn = b.churnResults(cr, start, end, pendingAtEnd, drainErr == nil, beforeM, afterM, beforeU, afterU,
		afterT.minus(beforeT), afterSelf-beforeSelf)
	if b.world.routes != nil {
		b.res.Churn.Routes = b.routeResults(cr, start, end, routesPendingAtEnd, beforeM, afterM, afterT.minus(beforeT), marks, endCPU)
	}
	// Nothing refused a legitimate spoke or client while connecting and churning?
	b.res.Refusals = b.refusals(afterM, 0, phaseConnect, phaseChurn)
	if drainErr != nil {
		return drainErr
	}
	return nil
}

// churnResults computes what the churn measured.
func (b *bench) churnResults(cr churnResult, start, end time.Duration, pendingAtEnd int64, drained bool,
	beforeM, afterM promText, beforeU, afterU usageSample, traffic trafficSnapshot, selfCPU time.Duration) churnStats {
	// Endpoint changes' pairs only: route changes' are routeResults'.
	samples := slices.DeleteFunc(b.fleet.takeSamples(), func(s sample) bool { return s.kind == kindRoute })
	byProfile := func(p profile) func(sample) bool { return func(s sample) bool { return s.profile == p } }
	all := latencies(samples, 0, 1<<62, nil)
	// The drain ends when the last pair converged.
	var drain time.Duration
	for _, s := range samples {
		drain = max(drain, s.handed+s.latency-end)
	}
	st := churnStats{
		Changes: cr.Changes, ByKind: cr.ByKind, RequestedRate: b.cfg.scale.Rate,
		AchievedRate: float64(cr.Changes) / cr.Elapsed.Seconds(), MaxScheduleLagMs: ms(cr.MaxLag),
		Latency: summarize(all), GRPC: summarize(latencies(samples, 0, 1<<62, byProfile(profileGRPC))),
		Gateway: summarize(latencies(samples, 0, 1<<62, byProfile(profileGateway))),
		Backlog: backlogOf(samples, start, end), Windows: windowsOf(samples, start, end, 6),
		PendingAtEnd: pendingAtEnd, DrainMs: ms(drain), Drained: drained, Unconverged: b.ledger.pending.Load(),
		Converged: len(samples),
	}
	if cr.Restart != "" {
		subscribers := 0
		for _, c := range b.fleet.clients {
			if slices.Contains(c.services, 0) {
				subscribers++
			}
		}
		st.RollingRestart = &restartChurn{Service: cr.Restart, Endpoints: b.cfg.scale.RestartEndpoints, Steps: cr.kinds[kindRestart],
			FromS: (cr.RestartSpan[0] - start).Seconds(), ToS: (cr.RestartSpan[1] - start).Seconds(),
			Latency:     summarize(latencies(samples, 0, 1<<62, func(s sample) bool { return s.kind == kindRestart })),
			Subscribers: subscribers, Pushes: b.fleet.restartPushes.Load()}
	}
	// Pairs: every change of a service, once per client subscribed to it.
	var pairs [profiles]int64
	subs := [profiles][]int32{make([]int32, b.cfg.scale.Services), make([]int32, b.cfg.scale.Services)}
	for _, c := range b.fleet.clients {
		for _, s := range c.services {
			subs[c.prof][s]++
		}
	}
	for i := range b.ledger.hist {
		h := &b.ledger.hist[i]
		s := i % b.cfg.scale.Services
		h.mu.Lock()
		changes := int64(len(h.fps) - 1)
		h.mu.Unlock()
		for p := range profiles {
			pairs[p] += changes * int64(subs[p][s])
		}
	}
	st.Pairs = pairs[profileGRPC] + pairs[profileGateway]
	changes := float64(max(cr.Changes, 1))
	for p := range profiles {
		t := clientTraffic{Profile: profile(p).String(), Pairs: pairs[p]}
		for ty := range types {
			t.Responses += traffic.Responses[p][ty]
			t.Bytes += traffic.Bytes[p][ty]
			if ty != typeEDS && traffic.Responses[p][ty] > 0 {
				t.OtherTypes = append(t.OtherTypes, fmt.Sprintf("%s x%d", typeNames[ty], traffic.Responses[p][ty]))
			}
		}
		t.EDSResponses = traffic.Responses[p][typeEDS]
		t.EDSAssignments = traffic.Resources[p][typeEDS]
		t.ResponsesPerChange = float64(t.Responses) / changes
		t.BytesPerChange = float64(t.Bytes) / changes
		if pairs[p] > 0 {
			t.PushesPerClientChange = float64(t.EDSResponses) / float64(pairs[p])
		}
		st.Clients = append(st.Clients, t)
	}
	hub := hubChurn{
		ResponsesPerChange:  map[string]float64{},
		CPUSeconds:          afterU.CPUSeconds - beforeU.CPUSeconds,
		RegistryVersions:    delta(beforeM, afterM, "nave_hub_registry_version", ""),
		SpokeDeltas:         delta(beforeM, afterM, "nave_federation_updates_total", `kind="delta"`),
		SpokeNACKs:          delta(beforeM, afterM, "nave_federation_updates_total", `result="nack"`),
		XDSNACKs:            delta(beforeM, afterM, "nave_xds_nacks_total", ""),
		LoadCPUSeconds:      selfCPU.Seconds(),
		RSSBeforeBytes:      beforeU.RSSBytes,
		RSSAfterBytes:       afterU.RSSBytes,
		HeapInuseAfterBytes: afterU.HeapInuseBytes,
	}
	hub.CPUCores = hub.CPUSeconds / afterU.At.Sub(beforeU.At).Seconds()
	hub.CPUMsPerChange = 1000 * hub.CPUSeconds / changes
	for _, ty := range typeNames {
		if n := delta(beforeM, afterM, "nave_xds_responses_total", `type="`+ty+`"`); n > 0 {
			hub.ResponsesPerChange[ty] = n / changes
		}
	}
	if n := delta(beforeM, afterM, "nave_xds_update_duration_seconds_count", ""); n > 0 {
		hub.UpdateMeanMs = 1000 * delta(beforeM, afterM, "nave_xds_update_duration_seconds_sum", "") / n
		hub.Updates = n
	}
	if n := delta(beforeM, afterM, "nave_xds_push_latency_seconds_count", `type="eds"`); n > 0 {
		hub.EDSPushLatencyMeanMs = 1000 * delta(beforeM, afterM, "nave_xds_push_latency_seconds_sum", `type="eds"`) / n
	}
	hub.Convergence = convergenceOf(beforeM, afterM)
	st.Hub = hub
	return st
}

func (b *bench) warmRestart(ctx context.Context) error {
	// The snapshot should hold the final state: wait for one taken after the
	// hub applied its last change (both on the hub's state goroutine).
	var snap hubSnapshot
	err := b.await(ctx, "the hub to persist a snapshot of the final state", func() (bool, error) {
		view, err := b.hub.clusters(ctx)
		if err != nil {
			return false, nil
		}
		var last time.Time
		for _, c := range view {
			if c.LastUpdate.After(last) {
				last = c.LastUpdate
			}
		}
		if snap, err = b.hub.coordination(ctx); err != nil {
			return false, nil
		}
		return !snap.Snapshot.At.Before(last), nil
	})
	if err != nil {
		// Restart anyway: stale states seen by clients will show what the snapshot missed.
		b.res.Notes = append(b.res.Notes, "warm restart without a snapshot of the final state: "+err.Error())
	}
	b.res.SnapshotBytes = snap.Snapshot.Bytes
	r, err := b.restart(ctx, phaseWarmRestart, filepath.Join(b.work, "data-1"), nil)
	b.res.WarmRestart = r
	return err
}

// catalogRestart restarts the hub on its data dir with the snapshots
// deleted from its etcd and the catalog kept (see catalog.go).
func (b *bench) catalogRestart(ctx context.Context) error {
	dataDir := filepath.Join(b.work, "data-1")
	r, err := b.restart(ctx, phaseCatalogRestart, dataDir, func(r *restartResult) error {
		dropped, err := dropSnapshots(ctx, dataDir)
		if err != nil {
			return err
		}
		r.Catalog = &dropped
		progress("%s: deleted %d snapshot keys; the catalog holds %d clusters", phaseNames[phaseCatalogRestart], dropped.SnapshotKeysDeleted, dropped.CatalogClusters)
		return nil
	})
	b.res.CatalogRestart = r
	return err
}

func (b *bench) coldRestart(ctx context.Context) error {
	r, err := b.restart(ctx, phaseColdRestart, filepath.Join(b.work, "data-2"), nil)
	b.res.ColdRestart = r
	return err
}

// restart stops the hub (SIGTERM) and starts it again on dataDir (after
// beforeStart, if set, with the hub stopped), then measures until the hub
// is ready, every client holds every endpoint again, and every spoke is
// synced. The result exists before beforeStart runs.
func (b *bench) restart(ctx context.Context, phase int, dataDir string, beforeStart func(*restartResult) error) (*restartResult, error) {
	r := &restartResult{DataDir: filepath.Base(dataDir)}
	b.fleet.phase.Store(int32(phase))
	sessions := b.spokes.sessions()
	progress("%s: stopping the hub", phaseNames[phase])
	stopped, err := b.hub.stop(30 * time.Second)
	r.StopMs = ms(stopped)
	if err != nil {
		return r, err
	}
	if beforeStart != nil {
		if err := beforeStart(r); err != nil {
			return r, fmt.Errorf("%s: %w", phaseNames[phase], err)
		}
	}
	progress("%s: starting the hub on %s", phaseNames[phase], r.DataDir)
	if err := b.hub.start(dataDir); err != nil {
		return r, err
	}
	start := b.hub.started
	since := b.ledger.since(start)
	if phase == phaseWarmRestart && b.cfg.restartProfile != "" {
		go b.profileStart(ctx)
	}
	ready, err := b.hub.waitReady(ctx, b.cfg.scale.PhaseTimeout)
	if err != nil {
		return r, err
	}
	r.ReadyMs = ms(ready)
	// Clients and spokes, in parallel: whichever comes last ends the wait.
	var clientsDone, spokesDone bool
	err = b.await(ctx, "every client to hold every endpoint and every spoke to be synced again", func() (bool, error) {
		if !clientsDone {
			if last, done := b.fleet.complete(b.all, since); done == len(b.all) {
				clientsDone = true
				r.ClientsServedMs = ms(last - since)
				r.ClientsServed = summarize(b.fleet.completionTimes(b.all, since))
			}
		}
		if !spokesDone {
			if at, ok := b.spokes.syncedSince(sessions); ok {
				if ok, _ := b.hubConfirms(ctx); ok {
					spokesDone = true
					r.SpokesSyncedMs = ms(at.Sub(start))
					r.HubConfirmedMs = ms(time.Since(start))
				}
			}
		}
		return clientsDone && spokesDone, nil
	})
	for _, p := range b.spokes.status {
		if st, _, _ := p.snapshot(); st.Resumed {
			r.SpokesResumed++
		}
	}
	r.StaleStates = b.fleet.observed[phase][0].Load()
	r.UnknownStates = b.fleet.observed[phase][1].Load()
	r.StaleRoutes = b.fleet.routeObserved[phase][0].Load()
	r.UnknownRoutes = b.fleet.routeObserved[phase][1].Load()
	if err != nil {
		_, done := b.fleet.complete(b.all, since)
		return r, fmt.Errorf("%w (%d of %d clients served)", err, done, len(b.all))
	}
	progress("%s: hub ready after %s, every client served after %s, every spoke synced after %s",
		phaseNames[phase], fmtMs(r.ReadyMs), fmtMs(r.ClientsServedMs), fmtMs(r.SpokesSyncedMs))
	if err := b.checkSanity(ctx, phaseNames[phase]); err != nil {
		return r, err
	}
	return r, b.sample(ctx, phaseNames[phase])
}

// profileStart saves the CPU profile of the restarted hub's first seconds:
// it asks as soon as the admin address answers.
func (b *bench) profileStart(ctx context.Context) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := b.hub.fetchProfile(ctx, "/debug/pprof/profile?seconds=4", b.cfg.restartProfile)
		if err == nil || errors.Is(err, errNoPprof) || ctx.Err() != nil || time.Now().After(deadline) {
			if err != nil {
				progress("restart cpu profile: %v", err)
			}
			return
		}
		if sleep(ctx, 10*time.Millisecond) != nil {
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
