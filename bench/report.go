package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// results is everything a run measured; it is printed as tables and written as JSON.
type results struct {
	Scale   scaleConfig `json:"scale"`
	Delta   bool        `json:"delta"`
	Conns   int         `json:"conns"`
	Seed    uint64      `json:"seed"`
	Started time.Time   `json:"started"`
	CPUs    int         `json:"cpus"`
	Error   string      `json:"error,omitempty"`
	// Load is the machine's load average (1, 5, 15 min) when the run started.
	Load string `json:"loadAverage"`
	// MTLS: the hub ran with mTLS on both ports (-mtls); the clients'
	// certificates spread over ClientIdentities SPIFFE IDs.
	MTLS             bool `json:"mtls"`
	ClientIdentities int  `json:"clientIdentities,omitempty"`

	Endpoints  int     `json:"endpoints"` // published at start, echo included
	HubReadyMs float64 `json:"hubReadyMs"`

	InitialSync   syncResult     `json:"initialSync"`
	Connect       connectResult  `json:"connect"`
	Churn         churnStats     `json:"churn"`
	SnapshotBytes int            `json:"snapshotBytes"`
	WarmRestart   *restartResult `json:"warmRestart,omitempty"`
	// CatalogRestart: cold, the snapshots deleted and the catalog kept (see catalog.go).
	CatalogRestart *restartResult `json:"catalogRestart,omitempty"`
	ColdRestart    *restartResult `json:"coldRestart,omitempty"`
	Usage          []usageSample  `json:"usage"`
	Memory         memoryDerived  `json:"memory"`
	Sanity         []sanityResult `json:"sanity"`
	// Refusals: what refused legitimate peers while they connected and churned.
	Refusals *refusalReport `json:"refusals,omitempty"`
	Storm    *stormResult   `json:"storm,omitempty"`
	Notes    []string       `json:"notes,omitempty"`
	// Relay: the relay comparison (-relay, relay.go).
	Relay *relayResult `json:"relay,omitempty"`
}

// syncResult is how long the initial sync took, from the publishers' start.
type syncResult struct {
	SpokesSyncedMs float64 `json:"spokesSyncedMs"` // every publisher's full state acknowledged
	HubConfirmedMs float64 `json:"hubConfirmedMs"` // /debug/clusters shows it (polled)
}

// connectResult is how long the clients took to hold every endpoint, from their start.
type connectResult struct {
	FirstPerGroup   int     `json:"firstPerGroup"`
	FirstPerGroupMs float64 `json:"firstPerGroupMs"`
	Rest            int     `json:"rest"`
	RestMs          float64 `json:"restMs"`
}

// churnStats is what the churn measured.
type churnStats struct {
	Changes          int            `json:"changes"`
	ByKind           map[string]int `json:"byKind"`
	RequestedRate    float64        `json:"requestedRate"`
	AchievedRate     float64        `json:"achievedRate"`
	MaxScheduleLagMs float64        `json:"maxScheduleLagMs"`
	// Convergence latency: change handed to its publisher -> a subscribed
	// client received a ClusterLoadAssignment holding it, per (client, change) pair.
	Latency        latencySummary  `json:"latency"`
	GRPC           latencySummary  `json:"latencyGRPC"`
	Gateway        latencySummary  `json:"latencyGateway"`
	RollingRestart *restartChurn   `json:"rollingRestart,omitempty"`
	Backlog        backlog         `json:"backlog"`
	Windows        []window        `json:"windows"`
	Pairs          int64           `json:"pairs"`     // (client, change) pairs expected
	Converged      int             `json:"converged"` // pairs seen
	Unconverged    int64           `json:"unconverged"`
	PendingAtEnd   int64           `json:"pendingAtEnd"` // pairs not yet seen when the churn stopped
	DrainMs        float64         `json:"drainMs"`      // from the churn's end until every pair was seen
	Drained        bool            `json:"drained"`
	Clients        []clientTraffic `json:"clients"`
	Hub            hubChurn        `json:"hub"`
	// Routes: the route changes (-route-changes) and the routes' and
	// policies' cost; nil without -routes. The figures above are the
	// endpoint changes' (pairs, latency), or all changes' (per change).
	Routes *routeChurn `json:"routes,omitempty"`
}

// restartChurn is the rolling restart within the churn.
type restartChurn struct {
	Service   string         `json:"service"`
	Endpoints int            `json:"endpoints"`
	Steps     int            `json:"steps"` // endpoints replaced
	FromS     float64        `json:"fromS"`
	ToS       float64        `json:"toS"`
	Latency   latencySummary `json:"latency"`
	// Subscribers are the clients subscribed to the service; Pushes the
	// assignments of it they received while the restart ran.
	Subscribers int   `json:"subscribers"`
	Pushes      int64 `json:"pushes"`
}

// clientTraffic is what one profile of clients received during the churn and its drain.
type clientTraffic struct {
	Profile               string   `json:"profile"`
	Pairs                 int64    `json:"pairs"`
	Responses             int64    `json:"responses"`
	Bytes                 int64    `json:"bytes"`
	EDSResponses          int64    `json:"edsResponses"`
	EDSAssignments        int64    `json:"edsAssignments"`
	OtherTypes            []string `json:"otherTypes,omitempty"` // non-EDS responses: none expected
	ResponsesPerChange    float64  `json:"responsesPerChange"`
	BytesPerChange        float64  `json:"bytesPerChange"`
	PushesPerClientChange float64  `json:"pushesPerClientChange"` // EDS responses per (client, change) pair
}

// hubChurn is what the hub's /metrics say about the churn.
type hubChurn struct {
	ResponsesPerChange   map[string]float64 `json:"responsesPerChange"` // nave_xds_responses_total by type
	Updates              float64            `json:"xdsUpdates"`         // xDS translations (Server.Update calls)
	UpdateMeanMs         float64            `json:"xdsUpdateMeanMs"`
	EDSPushLatencyMeanMs float64            `json:"edsPushLatencyMeanMs"`
	RegistryVersions     float64            `json:"registryVersions"`
	SpokeDeltas          float64            `json:"spokeDeltas"`
	SpokeNACKs           float64            `json:"spokeNACKs"`
	XDSNACKs             float64            `json:"xdsNACKs"`
	CPUSeconds           float64            `json:"cpuSeconds"`
	CPUCores             float64            `json:"cpuCores"` // average from before the churn until every client converged
	CPUMsPerChange       float64            `json:"cpuMsPerChange"`
	LoadCPUSeconds       float64            `json:"benchCPUSeconds"` // the bench process itself (clients, spokes)
	RSSBeforeBytes       float64            `json:"rssBeforeBytes"`
	RSSAfterBytes        float64            `json:"rssAfterBytes"`
	HeapInuseAfterBytes  float64            `json:"heapInuseAfterBytes"`
	// Convergence is the hub's own trace of the churn's changes, by stage
	// (nave_convergence_seconds; quantiles interpolated within its buckets).
	Convergence map[string]stageSummary `json:"convergence,omitempty"`
}

// stageSummary is one stage of the hub's convergence histogram.
type stageSummary struct {
	Count  float64 `json:"count"`
	MeanMs float64 `json:"meanMs"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
}

// restartResult is one hub restart, measured from the new process's start.
type restartResult struct {
	DataDir         string         `json:"dataDir"`
	StopMs          float64        `json:"stopMs"` // SIGTERM -> exit
	ReadyMs         float64        `json:"readyMs"`
	ClientsServedMs float64        `json:"clientsServedMs"` // every client holds every endpoint again
	ClientsServed   latencySummary `json:"clientsServed"`
	SpokesSyncedMs  float64        `json:"spokesSyncedMs"` // every publisher's new session acknowledged
	HubConfirmedMs  float64        `json:"hubConfirmedMs"`
	SpokesResumed   int            `json:"spokesResumed"`
	StaleStates     int64          `json:"staleStates"`   // assignments older than what a client held
	UnknownStates   int64          `json:"unknownStates"` // assignments matching no published state (partial views)
	// StaleRoutes and UnknownRoutes: the same for route configurations (with -routes).
	StaleRoutes   int64 `json:"staleRoutes,omitempty"`
	UnknownRoutes int64 `json:"unknownRoutes,omitempty"`
	// Catalog: what the cold restart with the catalog left in etcd.
	Catalog *catalogAfterDrop `json:"catalog,omitempty"`
}

// memoryDerived is what the usage samples say per endpoint, group and client.
type memoryDerived struct {
	PerEndpointBytes float64 `json:"perEndpointBytes"` // (RSS synced - RSS empty) / endpoints
	PerGroupBytes    float64 `json:"perGroupBytes"`    // (RSS groups - RSS synced) / locality groups (with their first client)
	PerClientBytes   float64 `json:"perClientBytes"`   // (RSS clients - RSS groups) / further clients
	// The same with the live heap; null when no GC ran between the two samples.
	PerEndpointLiveHeapBytes *float64 `json:"perEndpointLiveHeapBytes"`
	PerGroupLiveHeapBytes    *float64 `json:"perGroupLiveHeapBytes"`
	PerClientLiveHeapBytes   *float64 `json:"perClientLiveHeapBytes"`
	ChurnGrowthBytes         float64  `json:"churnGrowthBytes"` // RSS after the churn - before
	LocalityGroups           int      `json:"localityGroups"`
}

// liveDelta is the live heap grown from a to b per n, if a GC ran in between.
func liveDelta(a, b usageSample, n float64) *float64 {
	if b.GCs == a.GCs || n == 0 {
		return nil
	}
	v := (b.LiveHeapBytes - a.LiveHeapBytes) / n
	return &v
}

func (r *results) derive() {
	by := map[string]usageSample{}
	for _, u := range r.Usage {
		by[u.Phase] = u
	}
	empty, okE := by["empty"]
	synced, okS := by["synced"]
	groups, okG := by["groups"]
	clients, okC := by["clients"]
	m := &r.Memory
	if okE && okS && r.Endpoints > 0 {
		m.PerEndpointBytes = (synced.RSSBytes - empty.RSSBytes) / float64(r.Endpoints)
		m.PerEndpointLiveHeapBytes = liveDelta(empty, synced, float64(r.Endpoints))
	}
	if okS && okG && groups.LocalityGroups > 0 {
		m.LocalityGroups = groups.LocalityGroups
		m.PerGroupBytes = (groups.RSSBytes - synced.RSSBytes) / float64(groups.LocalityGroups)
		m.PerGroupLiveHeapBytes = liveDelta(synced, groups, float64(groups.LocalityGroups))
	}
	if okG && okC && r.Connect.Rest > 0 {
		m.PerClientBytes = (clients.RSSBytes - groups.RSSBytes) / float64(r.Connect.Rest)
		m.PerClientLiveHeapBytes = liveDelta(groups, clients, float64(r.Connect.Rest))
	}
	if r.Churn.Hub.RSSAfterBytes > 0 {
		m.ChurnGrowthBytes = r.Churn.Hub.RSSAfterBytes - r.Churn.Hub.RSSBeforeBytes
	}
}

func writeJSON(path string, r *results) error {
	r.derive()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

func numCPU() int { return runtime.NumCPU() }

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

func kib(b float64) string {
	if b < 0 {
		return fmt.Sprintf("-%s", kib(-b))
	}
	if b < 1024 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f KiB", b/1024)
}

func kibOrNA(b *float64) string {
	if b == nil {
		return "n/a (no GC between the samples)"
	}
	return kib(*b)
}

// printReport prints the results as tables.
func printReport(w io.Writer, r *results) {
	r.derive()
	sc := r.Scale
	mode := "state of the world"
	if r.Delta {
		mode = "delta"
	}
	security := "plaintext"
	if r.MTLS {
		security = fmt.Sprintf("mTLS on both ports, %d client identities", r.ClientIdentities)
	}
	fmt.Fprintf(w, "\nNave scale benchmark (%s): %d clusters x %d services x %d endpoints = %d endpoints; %d gRPC clients x %d services, %d gateways; %s xDS over %d conns; %s; %d CPUs, load %s\n",
		sc.Name, sc.Clusters, sc.Services, sc.Endpoints, r.Endpoints, sc.GRPCClients, sc.ServicesPerClient, sc.Gateways, mode, r.Conns, security, r.CPUs, r.Load)
	if r.Error != "" {
		fmt.Fprintf(w, "RUN FAILED: %s\n", firstLine(r.Error))
	}
	// Each section aligns its own rows.
	t := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	section := func(title string) {
		t.Flush()
		fmt.Fprintf(w, "\n%s\n", title)
	}
	row := func(k, format string, args ...any) { fmt.Fprintf(t, "  %s\t%s\n", k, fmt.Sprintf(format, args...)) }

	if r.HubReadyMs > 0 {
		section("Startup")
		row("hub ready (empty)", "%s", fmtMs(r.HubReadyMs))
	}
	if r.InitialSync.SpokesSyncedMs > 0 {
		row("initial sync", "spokes acked %s, hub view confirmed %s", fmtMs(r.InitialSync.SpokesSyncedMs), fmtMs(r.InitialSync.HubConfirmedMs))
	}
	if r.Connect.Rest+r.Connect.FirstPerGroup > 0 {
		row("clients served", "%d first-of-group in %s, %d more in %s", r.Connect.FirstPerGroup, fmtMs(r.Connect.FirstPerGroupMs), r.Connect.Rest, fmtMs(r.Connect.RestMs))
	}

	if st := r.Storm; st != nil {
		section(fmt.Sprintf("Reconnect storm: %d spokes and %d clients on %d connections, from %d loopback addresses, at once",
			st.Spokes, st.Clients, st.Conns, st.SourceAddresses))
		for _, ph := range []struct {
			name string
			p    *stormPhase
		}{{"fresh hub", &st.Connect}, {"after a restart", st.Reconnect}} {
			if ph.p == nil {
				continue
			}
			p := ph.p
			from := "from the storm's start"
			if p.HubReadyMs > 0 {
				from = fmt.Sprintf("from the hub's start (ready %s)", fmtMs(p.HubReadyMs))
			}
			row(ph.name+": all served", "%s %s: spokes synced %s (%d of %d), clients served %s (%d of %d)",
				fmtMs(p.AllServedMs), from, fmtMs(p.SpokesSyncedMs), p.SpokesSynced, st.Spokes, fmtMs(p.ClientsServedMs), p.ClientsDone, st.Clients)
			row("  per client", "%s", p.ClientsServed)
			row("  hub", "peak RSS (VmHWM) %s, CPU %.1f s; bench CPU %.1f s, peak RSS %s", mib(p.PeakRSSBytes), p.HubCPUSeconds, p.BenchCPUSeconds, mib(p.BenchPeakRSS))
			row("  connections dialled", "%d by %d spokes, %d by %d clients (beyond one each: retries)", p.SpokeDials, st.Spokes, p.ClientDials, st.Conns)
			row("  stale / unknown states seen", "%d / %d", p.StaleStates, p.UnknownStates)
			printRefusals(t, "  ", p.Refusals)
		}
	}

	c := r.Churn
	if c.Changes > 0 {
		section(fmt.Sprintf("Churn: %d changes (%s), %.1f/s (random changes asked at %.0f/s, plus the rolling restart; schedule lag max %s)",
			c.Changes, kinds(c.ByKind), c.AchievedRate, c.RequestedRate, fmtMs(c.MaxScheduleLagMs)))
		row("convergence, all pairs", "%s", c.Latency)
		row("  gRPC clients", "%s", c.GRPC)
		row("  gateways", "%s", c.Gateway)
		if c.RollingRestart != nil {
			rr := c.RollingRestart
			row("  rolling restart", "%s  (%s, %d endpoints replaced one by one, %.0f-%.0fs)", rr.Latency, rr.Service, rr.Steps, rr.FromS, rr.ToS)
			if rr.Subscribers > 0 && rr.Steps > 0 {
				row("  restart pushes", "%.2f per subscribed client per replaced endpoint (%d pushes to %d clients)",
					float64(rr.Pushes)/float64(rr.Subscribers)/float64(rr.Steps), rr.Pushes, rr.Subscribers)
			}
		}
		row("  first third", "%s", c.Backlog.FirstThird)
		row("  last third", "%s", c.Backlog.LastThird)
		growing := "no"
		if c.Backlog.Growing {
			growing = "YES: latency grows over the churn"
		}
		row("backlog growing", "%s; %d pairs pending at the churn's end, drained in %s", growing, c.PendingAtEnd, fmtMs(c.DrainMs))
		row("pairs", "%d expected, %d converged, %d never", c.Pairs, c.Converged, c.Unconverged)
		var ws []string
		for _, win := range c.Windows {
			if win.N > 0 {
				ws = append(ws, fmt.Sprintf("%.1fs: p50 %s p99 %s", win.FromS, fmtMs(win.P50), fmtMs(win.P99)))
			}
		}
		row("by window", "%s", strings.Join(ws, " | "))
		for _, ct := range c.Clients {
			if ct.Pairs == 0 && ct.Responses == 0 {
				continue
			}
			other := ""
			if len(ct.OtherTypes) > 0 {
				other = "; non-EDS: " + strings.Join(ct.OtherTypes, ", ")
			}
			row("client traffic, "+ct.Profile, "%.2f responses, %s per change; %.2f EDS pushes per (client, change)%s",
				ct.ResponsesPerChange, kib(ct.BytesPerChange), ct.PushesPerClientChange, other)
		}
		h := c.Hub
		var hr []string
		for _, ty := range typeNames {
			if v, ok := h.ResponsesPerChange[ty]; ok {
				hr = append(hr, fmt.Sprintf("%s %.2f", ty, v))
			}
		}
		row("hub responses per change", "%s", strings.Join(hr, ", "))
		row("hub pipeline", "%.0f spoke deltas, %.0f registry versions, %.0f xDS updates (mean %.2f ms), EDS push latency mean %.2f ms, NACKs %.0f spoke / %.0f xDS",
			h.SpokeDeltas, h.RegistryVersions, h.Updates, h.UpdateMeanMs, h.EDSPushLatencyMeanMs, h.SpokeNACKs, h.XDSNACKs)
		row("hub CPU", "%.2f s (%.2f cores, %.2f ms per change); bench process %.2f s", h.CPUSeconds, h.CPUCores, h.CPUMsPerChange, h.LoadCPUSeconds)
		var stages []string
		for _, st := range convergenceStages {
			if v, ok := h.Convergence[st]; ok {
				stages = append(stages, fmt.Sprintf("%s %.1f/%.1f (%.0f)", st, v.P50Ms, v.P99Ms, v.Count))
			}
		}
		if len(stages) > 0 {
			row("hub's trace, ms p50/p99 (n)", "%s", strings.Join(stages, ", "))
		}
		if rt := c.Routes; rt != nil {
			printRouteChurn(t, row, section, rt)
		}
	}
	if r.Relay != nil {
		t.Flush()
		printRelay(w, r.Relay)
	}
	if r.Refusals != nil {
		section("Refusals (connect and churn)")
		printRefusals(t, "", r.Refusals)
	}

	if len(r.Usage) > 0 {
		section("Hub memory and CPU")
		fmt.Fprintf(t, "  phase\tRSS\tpeak RSS\theap in use\tlive heap\tCPU s\tgoroutines\txDS streams\tgroups\n")
		for _, u := range r.Usage {
			fmt.Fprintf(t, "  %s\t%s\t%s\t%s\t%s\t%.2f\t%d\t%d\t%d\n", u.Phase, mib(u.RSSBytes), mib(u.PeakRSSBytes), mib(u.HeapInuseBytes), mib(u.LiveHeapBytes),
				u.CPUSeconds, u.Goroutines, u.XDSClients, u.LocalityGroups)
		}
		m := r.Memory
		row("per endpoint", "%s RSS, live heap %s", kib(m.PerEndpointBytes), kibOrNA(m.PerEndpointLiveHeapBytes))
		row("per locality group", "%s RSS, live heap %s (%d groups, with their first client)", kib(m.PerGroupBytes), kibOrNA(m.PerGroupLiveHeapBytes), m.LocalityGroups)
		row("per client", "%s RSS, live heap %s", kib(m.PerClientBytes), kibOrNA(m.PerClientLiveHeapBytes))
		if r.SnapshotBytes > 0 {
			row("persisted snapshot", "%s", kib(float64(r.SnapshotBytes)))
		}
	}

	for _, rr := range []struct {
		name string
		r    *restartResult
	}{{"Warm restart (same data dir: persisted snapshot)", r.WarmRestart},
		{"Cold restart with the catalog (same data dir, snapshots deleted: the hub knows its clusters and waits for them, --cold-start-wait)", r.CatalogRestart},
		{"Cold restart (fresh data dir: no snapshot, no catalog)", r.ColdRestart}} {
		if rr.r == nil {
			continue
		}
		section(rr.name)
		row("stop (SIGTERM -> exit)", "%s", fmtMs(rr.r.StopMs))
		row("ready (/readyz)", "%s after start", fmtMs(rr.r.ReadyMs))
		row("every client served", "%s after start (per client %s)", fmtMs(rr.r.ClientsServedMs), rr.r.ClientsServed)
		row("every spoke synced", "%s after start (hub view %s); %d resumed", fmtMs(rr.r.SpokesSyncedMs), fmtMs(rr.r.HubConfirmedMs), rr.r.SpokesResumed)
		row("stale / unknown states seen", "%d / %d", rr.r.StaleStates, rr.r.UnknownStates)
		if r.Scale.Routes > 0 {
			row("stale / unknown routes seen", "%d / %d", rr.r.StaleRoutes, rr.r.UnknownRoutes)
		}
		if c := rr.r.Catalog; c != nil {
			row("before the start", "%d snapshot keys deleted; the catalog holds %d clusters", c.SnapshotKeysDeleted, c.CatalogClusters)
		}
	}

	if len(r.Sanity) > 0 {
		section("grpc-go xDS clients (echo backend)")
		for _, s := range r.Sanity {
			status := "ok"
			if !s.OK {
				status = "FAILED: " + s.Error
			}
			row(s.Client+" "+s.Phase, "%s in %s", status, fmtMs(s.Ms))
		}
	}
	t.Flush()
	fmt.Fprint(w, legend)
	if r.Churn.Routes != nil {
		fmt.Fprint(w, routeLegend)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintln(w)
}

const legend = `
Convergence: a change handed to its spoke's publisher -> a subscribed client received a ClusterLoadAssignment holding it
(or a later state), per (client, change) pair; clients timestamp on receipt. Restart times count from the new hub
process's start. Memory per endpoint/group/client: deltas between phases; RSS and heap in use are noisy (Go keeps
freed memory, garbage awaits the next GC); live heap (the GC goal / (1 + GOGC/100)) is steadier.
`

const routeLegend = `Route convergence (-routes, -route-changes): a route's weights moved at its spoke's publisher -> a gRPC client
subscribed to the service received a RouteConfiguration with the new split (or a later one). The hub's CPU by kind: its
CPU time over the churn's route segments and endpoint segments (each until the next begins), per change of that kind.
`

// printRouteChurn prints the route changes' section.
func printRouteChurn(t io.Writer, row func(k, format string, args ...any), section func(string), rt *routeChurn) {
	how := "no route changes"
	switch {
	case rt.Fraction >= 1:
		how = "every change a route change"
	case rt.Fraction > 0:
		how = fmt.Sprintf("%.0f%% of each %.1fs cycle route changes, then endpoint changes", 100*rt.Fraction, rt.CycleS)
	}
	section(fmt.Sprintf("Traffic policy: %d services with a GRPCRoute (weighted split + header match), %d with a TrafficPolicy; %d route changes (%s)",
		rt.Routes, rt.Policies, rt.Changes, how))
	if rt.Changes > 0 {
		row("route convergence", "%s", rt.Latency)
		var ws []string
		for _, win := range rt.Windows {
			if win.N > 0 {
				ws = append(ws, fmt.Sprintf("%.1fs: p50 %s p99 %s", win.FromS, fmtMs(win.P50), fmtMs(win.P99)))
			}
		}
		row("  by window", "%s", strings.Join(ws, " | "))
		row("route pairs", "%d expected, %d converged, %d never; %d pending at the churn's end", rt.Pairs, rt.Converged, rt.Unconverged, rt.PendingAtEnd)
		row("RDS to gRPC clients", "%.2f pushes per (client, route change), %s per route change; hub: %.2f RDS responses per route change",
			rt.RDSPushesPerClientChange, kib(rt.RDSBytesPerChange), rt.HubRDSResponsesPerChange)
	}
	row("stale / unknown routes seen", "%d / %d", rt.StaleStates, rt.UnknownStates)
	if c := rt.CPU; c != nil {
		perChange := func(ms float64, n int) string {
			if n == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2f ms per change", ms)
		}
		row("hub CPU by kind", "endpoint changes %s (%.2f s over %d segments, %d changes); route changes %s (%.2f s over %d segments, %d changes)",
			perChange(c.EndpointCPUMsPerChange, c.EndpointChanges), c.EndpointCPUSeconds, c.EndpointSegments, c.EndpointChanges,
			perChange(c.RouteCPUMsPerChange, c.RouteChanges), c.RouteCPUSeconds, c.RouteSegments, c.RouteChanges)
	}
}

// printRefusals prints a refusal report as rows of t, each key prefixed.
func printRefusals(t io.Writer, prefix string, r *refusalReport) {
	if r == nil {
		return
	}
	row := func(k, format string, args ...any) {
		fmt.Fprintf(t, "  %s%s\t%s\n", prefix, k, fmt.Sprintf(format, args...))
	}
	var hub []string
	for _, s := range slices.Sorted(maps.Keys(r.Hub)) {
		hub = append(hub, fmt.Sprintf("%s %.0f", s, r.Hub[s]))
	}
	row("refusals of legitimate peers", "%.0f (hub counters: %s)", r.Refused, cmpOr(strings.Join(hub, ", "), "none"))
	row("client stream errors", "%d%s", r.ClientStreamErrors, listed(r.ClientErrors))
	row("spoke warnings", "%d%s", r.SpokeWarnings, listed(r.SpokeMessages))
	var logs []string
	for _, m := range slices.Sorted(maps.Keys(r.HubLog)) {
		logs = append(logs, fmt.Sprintf("%d x %q", r.HubLog[m], m))
	}
	row("hub log warnings/errors", "%s", cmpOr(strings.Join(logs, ", "), "none"))
}

// listed is ": a; b; c" (at most five, then how many more), or "" for none.
func listed(items []string) string {
	if len(items) == 0 {
		return ""
	}
	more := ""
	if len(items) > 5 {
		more = fmt.Sprintf("; and %d more", len(items)-5)
		items = items[:5]
	}
	return ": " + strings.Join(items, "; ") + more
}

func kinds(by map[string]int) string {
	var parts []string
	for _, k := range kindNames[1:] {
		if n := by[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	return strings.Join(parts, ", ")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
