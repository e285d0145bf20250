package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// The reconnect storm (-storm): every spoke and every xDS client connects
// to one hub replica at once, first to a fresh hub, then again when the
// hub restarts, as after a rollout or a crash. Each client has a
// connection of its own (a client is a process), each connection and
// each spoke an address of its own, so the hub's default per-peer limits
// apply as in production. It measures how long until every spoke is synced
// and every client holds everything it asked for, the hub's peak memory,
// and whether anything refused a legitimate peer.

// stormResult is what the storm measured.
type stormResult struct {
	Spokes          int `json:"spokes"`
	Clients         int `json:"clients"`
	Conns           int `json:"conns"`           // client connections
	SourceAddresses int `json:"sourceAddresses"` // loopback addresses spokes and clients dial from
	// Connect: every peer connects at once to a fresh hub (no catalog: it
	// serves xDS at once, so early clients see the registry fill up).
	Connect stormPhase `json:"connect"`
	// Reconnect: the hub restarts on its data dir; every peer reconnects at once.
	Reconnect *stormPhase `json:"reconnect,omitempty"`
}

// stormPhase is one storm, timed from its start (Reconnect: from the new
// hub process's start).
type stormPhase struct {
	SpokesSyncedMs  float64        `json:"spokesSyncedMs"`  // every spoke's session acknowledged (full state, or resumed)
	ClientsServedMs float64        `json:"clientsServedMs"` // every client holds the latest state of everything it asked for
	AllServedMs     float64        `json:"allServedMs"`     // the later of the two
	ClientsServed   latencySummary `json:"clientsServed"`   // per client
	SpokesSynced    int            `json:"spokesSynced"`
	ClientsDone     int            `json:"clientsDone"`
	HubReadyMs      float64        `json:"hubReadyMs,omitempty"`
	PeakRSSBytes    float64        `json:"peakRssBytes"` // the hub process's VmHWM
	HubCPUSeconds   float64        `json:"hubCpuSeconds"`
	BenchCPUSeconds float64        `json:"benchCpuSeconds"`
	BenchPeakRSS    float64        `json:"benchPeakRssBytes"` // the bench process's VmHWM (its spokes and clients)
	// SpokeDials and ClientDials count the connections dialled (a
	// connection attempt that timed out in its handshakes dials again).
	SpokeDials    int64          `json:"spokeDials"`
	ClientDials   int64          `json:"clientDials"`
	StaleStates   int64          `json:"staleStates"`
	UnknownStates int64          `json:"unknownStates"`
	Refusals      *refusalReport `json:"refusals"`
}

// refusalReport is what refused or troubled legitimate peers.
type refusalReport struct {
	// Refused counts refusals of legitimate peers: the hub's refusal
	// counters, and client streams that ended with a code the hub does not
	// count there (its refused connections and handshakes show as
	// Unavailable to the client, its refused streams as ResourceExhausted
	// or DeadlineExceeded: those it counts itself).
	Refused float64 `json:"refused"`
	// Hub holds the hub's nave_refused_total and
	// nave_tls_refused_handshakes_total series that are not 0.
	Hub map[string]float64 `json:"hub,omitempty"`
	// ClientStreamErrors counts client streams that ended in an error,
	// ClientErrors tallies them by gRPC code with a first message.
	ClientStreamErrors int64    `json:"clientStreamErrors"`
	ClientErrors       []string `json:"clientErrors,omitempty"`
	// SpokeWarnings counts the spokes' log records at Warn and above.
	SpokeWarnings int64    `json:"spokeWarnings"`
	SpokeMessages []string `json:"spokeMessages,omitempty"`
	// HubLog tallies the hub's WARN and ERROR log lines by message.
	HubLog map[string]int `json:"hubLog,omitempty"`
}

// refusals gathers the refusal report: the hub's counters in m, the hub's
// log from byte logFrom on, and what clients and spokes saw in phases.
func (b *bench) refusals(m promText, logFrom int64, phases ...int) *refusalReport {
	r := &refusalReport{}
	hubTotal, series := hubRefusals(m)
	r.Refused = hubTotal
	if len(series) > 0 {
		r.Hub = series
	}
	for _, ph := range phases {
		t := &b.fleet.streamErrors[ph]
		r.ClientStreamErrors += t.total.Load()
		for _, line := range t.summary() {
			r.ClientErrors = append(r.ClientErrors, phaseNames[ph]+": "+line)
		}
		t.mu.Lock()
		for code, n := range t.counts {
			if !countedByHub[code] {
				r.Refused += float64(n)
			}
		}
		t.mu.Unlock()
		w := &b.spokeWarnings[ph]
		r.SpokeWarnings += w.total.Load()
		for _, line := range w.summary() {
			r.SpokeMessages = append(r.SpokeMessages, phaseNames[ph]+": "+line)
		}
	}
	if log, err := readFrom(b.hub.logPath, logFrom); err == nil {
		if p := logProblems(log); len(p) > 0 {
			r.HubLog = p
		}
	}
	return r
}

// countedByHub are the codes of client stream errors whose refusals the
// hub counts itself (nave_refused_total, nave_tls_refused_handshakes_total);
// Unavailable is also what a stopping hub or a broken connection gives.
var countedByHub = map[string]bool{"Unavailable": true, "ResourceExhausted": true, "DeadlineExceeded": true}

// readFrom reads a file from byte off on.
func readFrom(path string, off int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// fileSize is the size of path (0 if it cannot tell).
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// loadAverage is the machine's load average (1, 5, 15 minutes) as /proc/loadavg says.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// storm connects every spoke and every client at once to the fresh hub and
// waits until every spoke is synced and every client served.
func (b *bench) storm(ctx context.Context) error {
	sc := b.cfg.scale
	if err := b.makeWorld(ctx); err != nil {
		return err
	}
	for i := range b.fleet.clients {
		b.all = append(b.all, i)
	}
	conns := clientConns(b.cfg)
	st := &stormResult{Spokes: sc.Clusters, Clients: len(b.all), Conns: conns, SourceAddresses: sc.Clusters + conns}
	b.res.Storm = st
	beforeM, err := b.hub.metrics(ctx)
	if err != nil {
		return err
	}
	logFrom := fileSize(b.hub.logPath)
	progress("storm: %d spokes (%d endpoints) and %d clients on %d connections, from %d loopback addresses, all at once",
		sc.Clusters, b.res.Endpoints, len(b.all), conns, st.SourceAddresses)
	b.fleet.phase.Store(phaseConnect)
	profDone := make(chan error, 1)
	if b.cfg.cpuProfile != "" {
		go func() { profDone <- b.hub.fetchProfile(ctx, "/debug/pprof/profile?seconds=20", b.cfg.cpuProfile) }()
	} else {
		profDone <- nil
	}
	beforeSelf := selfCPU()
	beforeSpokeDials, beforeClientDials := b.spokeDial.attempts.Load(), b.clientDial.attempts.Load()
	start := time.Now()
	startL := b.ledger.since(start)
	if err := b.startSpokes(ctx); err != nil {
		return err
	}
	b.fleet.start(b.all)
	p := &st.Connect
	var spokesAt time.Time
	waitErr := b.await(ctx, "every spoke synced and every client served", func() (bool, error) {
		if spokesAt.IsZero() {
			if at, ok := b.spokes.syncedSince(nil); ok {
				if ok, _ := b.hubConfirms(ctx); ok {
					spokesAt = at
				}
			}
		}
		_, done := b.fleet.complete(b.all, startL)
		return !spokesAt.IsZero() && done == len(b.all), nil
	})
	p.BenchCPUSeconds = (selfCPU() - beforeSelf).Seconds()
	p.SpokeDials, p.ClientDials = b.spokeDial.attempts.Load()-beforeSpokeDials, b.clientDial.attempts.Load()-beforeClientDials
	if !spokesAt.IsZero() {
		p.SpokesSyncedMs = ms(spokesAt.Sub(start))
	}
	p.SpokesSynced = b.spokesSynced(nil)
	last, done := b.fleet.complete(b.all, startL)
	p.ClientsDone = done
	if done > 0 {
		p.ClientsServedMs = ms(last - startL)
		p.ClientsServed = summarize(b.fleet.completionTimes(b.all, startL))
	}
	p.AllServedMs = max(p.SpokesSyncedMs, p.ClientsServedMs)
	p.StaleStates, p.UnknownStates = b.fleet.observed[phaseConnect][0].Load(), b.fleet.observed[phaseConnect][1].Load()
	b.stormCosts(ctx, p, beforeM, logFrom, phaseConnect)
	if b.cfg.heapProfile != "" {
		if err := b.hub.fetchProfile(ctx, "/debug/pprof/heap", b.cfg.heapProfile); err != nil {
			b.res.Notes = append(b.res.Notes, "heap profile: "+err.Error())
		}
	}
	if err := <-profDone; err != nil {
		b.res.Notes = append(b.res.Notes, "cpu profile: "+err.Error())
	}
	if waitErr != nil {
		return fmt.Errorf("%w (%d of %d spokes synced, %d of %d clients served)", waitErr, p.SpokesSynced, sc.Clusters, done, len(b.all))
	}
	progress("storm: every spoke synced after %s, every client served after %s (p50 %s); hub peak RSS %s; %.0f refused",
		fmtMs(p.SpokesSyncedMs), fmtMs(p.ClientsServedMs), fmtMs(p.ClientsServed.P50), mib(p.PeakRSSBytes), p.Refusals.Refused)
	return b.sample(ctx, "storm")
}

// spokesSynced counts the publishers whose current session the hub
// acknowledged, later than after[i] (nil: any).
func (b *bench) spokesSynced(after []int) int {
	n := 0
	for i, s := range b.spokes.status {
		_, sessions, at := s.snapshot()
		if !at.IsZero() && (after == nil || sessions > after[i]) {
			n++
		}
	}
	return n
}

// stormCosts records the hub's peak memory and CPU and what refused peers.
func (b *bench) stormCosts(ctx context.Context, p *stormPhase, beforeM promText, logFrom int64, phase int) {
	p.PeakRSSBytes, _ = procPeakRSS(b.hub.pid())
	p.BenchPeakRSS, _ = procPeakRSS(os.Getpid())
	afterM, err := b.hub.metrics(ctx)
	if err != nil {
		b.res.Notes = append(b.res.Notes, "storm: no metrics after the storm: "+err.Error())
		afterM = promText{}
	}
	p.HubCPUSeconds = delta(beforeM, afterM, "process_cpu_seconds_total", "")
	p.Refusals = b.refusals(afterM, logFrom, phase)
}

// reconnectStorm restarts the hub on its data dir: every spoke and client
// reconnects at once (they retry within 200-500 ms, much faster than real
// clients' backoff: a harsher storm).
func (b *bench) reconnectStorm(ctx context.Context) error {
	logFrom := fileSize(b.hub.logPath)
	beforeSelf := selfCPU()
	beforeSpokeDials, beforeClientDials := b.spokeDial.attempts.Load(), b.clientDial.attempts.Load()
	err := b.warmRestart(ctx)
	r := b.res.WarmRestart
	if r == nil {
		return err
	}
	p := &stormPhase{HubReadyMs: r.ReadyMs, SpokesSyncedMs: r.SpokesSyncedMs, ClientsServedMs: r.ClientsServedMs,
		ClientsServed: r.ClientsServed, ClientsDone: r.ClientsServed.N, StaleStates: r.StaleStates, UnknownStates: r.UnknownStates,
		BenchCPUSeconds: (selfCPU() - beforeSelf).Seconds(),
		SpokeDials:      b.spokeDial.attempts.Load() - beforeSpokeDials, ClientDials: b.clientDial.attempts.Load() - beforeClientDials}
	p.AllServedMs = max(p.SpokesSyncedMs, p.ClientsServedMs)
	if r.SpokesSyncedMs > 0 {
		p.SpokesSynced = len(b.spokes.status)
	}
	// The new process's counters start at 0.
	b.stormCosts(ctx, p, promText{}, logFrom, phaseWarmRestart)
	b.res.Storm.Reconnect = p
	if err == nil {
		progress("reconnect storm: every spoke synced after %s, every client served after %s (from the hub's start); hub peak RSS %s; %.0f refused",
			fmtMs(p.SpokesSyncedMs), fmtMs(p.ClientsServedMs), mib(p.PeakRSSBytes), p.Refusals.Refused)
	}
	return err
}
