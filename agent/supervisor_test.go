package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The supervisor's tests run internal/fakeenvoy, a test double that takes
// Envoy's flags and serves the admin endpoints the agent uses; it is not a
// proxy, and it records what it is told in a file these tests read.

var (
	fakeEnvoyOnce sync.Once
	fakeEnvoyPath string
	fakeEnvoyErr  error
)

// fakeEnvoy builds the test double once per test binary.
func fakeEnvoy(t testing.TB) string {
	t.Helper()
	fakeEnvoyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fakeenvoy-")
		if err != nil {
			fakeEnvoyErr = err
			return
		}
		fakeEnvoyPath = filepath.Join(dir, "fakeenvoy")
		out, err := exec.Command("go", "build", "-o", fakeEnvoyPath, "./internal/fakeenvoy").CombinedOutput()
		if err != nil {
			fakeEnvoyErr = fmt.Errorf("go build ./internal/fakeenvoy: %v\n%s", err, out)
		}
	})
	if fakeEnvoyErr != nil {
		t.Fatal(fakeEnvoyErr)
	}
	return fakeEnvoyPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeEnvoyPath != "" {
		os.RemoveAll(filepath.Dir(fakeEnvoyPath))
	}
	os.Exit(code)
}

// event is one line of the test double's record (fakeenvoy's Event).
type event struct {
	Time   time.Time `json:"time"`
	PID    int       `json:"pid"`
	Epoch  int       `json:"epoch"`
	Event  string    `json:"event"`
	Args   []string  `json:"args"`
	Signal string    `json:"signal"`
	Query  string    `json:"query"`
}

// recordFile is where the test double records; its events are read back.
type recordFile string

func (r recordFile) events(t testing.TB) []event {
	t.Helper()
	b, err := os.ReadFile(string(r))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []event
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("record line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

// await waits until the events satisfy ok, and returns them.
func (r recordFile) await(t testing.TB, what string, ok func([]event) bool) []event {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		evs := r.events(t)
		if ok(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 15s for %s; events:\n%s", what, dump(evs))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func dump(evs []event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %s pid=%d epoch=%d %s %s%s\n", e.Time.Format("15:04:05.000"), e.PID, e.Epoch, e.Event, e.Signal, e.Query)
	}
	return b.String()
}

func filter(evs []event, kind string) []event {
	var out []event
	for _, e := range evs {
		if e.Event == kind {
			out = append(out, e)
		}
	}
	return out
}

func count(kind string, n int) func([]event) bool {
	return func(evs []event) bool { return len(filter(evs, kind)) >= n }
}

// freePort is a port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}

// testSupervisor is a supervisor of the test double with short timings,
// and the record it writes to.
func testSupervisor(t *testing.T, edit func(*SupervisorConfig)) (*Supervisor, recordFile, []byte) {
	t.Helper()
	dir := t.TempDir()
	rec := recordFile(filepath.Join(dir, "record.jsonl"))
	t.Setenv("FAKEENVOY_RECORD", string(rec))
	cfg := DefaultSupervisorConfig()
	cfg.Binary = fakeEnvoy(t)
	cfg.Dir = filepath.Join(dir, "work")
	cfg.AdminPort = freePort(t)
	cfg.DrainTime, cfg.ParentShutdown, cfg.ParentGrace = time.Second, 2*time.Second, 100*time.Millisecond
	cfg.DrainDuration, cfg.StopTimeout = 200*time.Millisecond, 5*time.Second
	cfg.Watch = fastWatch
	cfg.Stdout, cfg.Stderr = testWriter{t}, testWriter{t}
	if edit != nil {
		edit(&cfg)
	}
	boot := testBootstrap(t, cfg.AdminPort, "v1")
	return NewSupervisor(cfg, boot, testLog(t)), rec, boot
}

// testBootstrap is a real bootstrap (admin on port); version makes different ones.
func testBootstrap(t testing.TB, adminPort int, version string) []byte {
	t.Helper()
	cfg := eastWest()
	cfg.AdminPort = adminPort
	cfg.Node.ID = "gw-" + version
	b, err := Bootstrap(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := MarshalBootstrap(b)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Logf("envoy: %s", bytes.TrimRight(p, "\n"))
	}
	return len(p), nil
}

// runSupervisor runs s until the test ends or cancel is called; wait returns Run's error.
func runSupervisor(t *testing.T, s *Supervisor) (cancel context.CancelFunc, wait func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	var err error
	wait = func() error {
		once.Do(func() {
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the supervisor did not return within 30s")
			}
		})
		return err
	}
	t.Cleanup(func() {
		cancel()
		wait()
	})
	return cancel, wait
}

// flagValue is the value following flag in args.
func flagValue(args []string, flag string) string {
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		return ""
	}
	return args[i+1]
}

func TestSupervisorHotRestartsOnBootstrapChanges(t *testing.T) {
	s, rec, _ := testSupervisor(t, func(c *SupervisorConfig) { c.BaseID = 7; c.Concurrency = 2 })
	cancel, wait := runSupervisor(t, s)
	rec.await(t, "epoch 0", count("start", 1))

	s.Update(testBootstrap(t, s.cfg.AdminPort, "v1")) // the same bootstrap: nothing to do
	s.Update(testBootstrap(t, s.cfg.AdminPort, "v2"))
	rec.await(t, "epoch 1", count("start", 2))
	s.Update(testBootstrap(t, s.cfg.AdminPort, "v3"))
	evs := rec.await(t, "epoch 2", count("start", 3))

	starts := filter(evs, "start")
	if len(starts) != 3 {
		t.Fatalf("want 3 Envoys (the unchanged bootstrap restarts nothing), got:\n%s", dump(evs))
	}
	for i, e := range starts {
		want := map[string]string{
			"--restart-epoch": fmt.Sprint(i), "--parent-shutdown-time-s": "2", "--drain-time-s": "1",
			"--drain-strategy": "immediate", "--base-id": "7", "--log-level": "warning", "--concurrency": "2",
		}
		for flag, v := range want {
			if got := flagValue(e.Args, flag); got != v {
				t.Errorf("Envoy %d: %s %q, want %q (args %q)", i, flag, got, v, e.Args)
			}
		}
		boot, err := os.ReadFile(flagValue(e.Args, "-c"))
		if err == nil && !bytes.Contains(boot, []byte(fmt.Sprintf(`"gw-v%d"`, i+1))) {
			t.Errorf("Envoy %d was started with the wrong bootstrap", i)
		}
	}

	// The parents run until their shutdown time (real Envoys exit by
	// themselves then; the double waits for the agent's SIGTERM after the grace).
	evs = rec.await(t, "both parents stopped", count("exit", 2))
	for _, parent := range starts[:2] {
		child := starts[parent.Epoch+1]
		var term *event
		for _, e := range filter(evs, "signal") {
			if e.PID == parent.PID {
				term = &e
			}
		}
		if term == nil || term.Signal != "terminated" {
			t.Fatalf("parent epoch %d got no SIGTERM:\n%s", parent.Epoch, dump(evs))
		}
		if after := term.Time.Sub(child.Time); after < s.cfg.ParentShutdown {
			t.Errorf("parent epoch %d was stopped %v after its child started, before its shutdown time %v", parent.Epoch, after, s.cfg.ParentShutdown)
		}
	}
	for _, e := range filter(evs, "signal") {
		if e.PID == starts[2].PID {
			t.Errorf("the newest Envoy got %s", e.Signal)
		}
	}
	// The old bootstraps go with their Envoys (once the supervisor has reaped them).
	deadline := time.Now().Add(10 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(s.cfg.Dir, "envoy-bootstrap-*.json"))
		if len(files) == 1 && filepath.Base(files[0]) == "envoy-bootstrap-2.json" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bootstraps left: %v, want only epoch 2's", files)
		}
		time.Sleep(10 * time.Millisecond)
	}

	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestSupervisorHotRestartsWhenCertificatesChange(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	good, _ := certPair(t, "hub-ca")
	writeFile(t, ca, good)
	s, rec, _ := testSupervisor(t, func(c *SupervisorConfig) {
		c.WatchFiles = []string{ca}
		c.CheckFiles = func() error { return checkHubFiles(Hub{CAFile: ca}) }
	})
	logs := &logRecorder{}
	s.log = logs.logger(t)
	cancel, wait := runSupervisor(t, s)
	rec.await(t, "epoch 0", count("start", 1))

	// A CA file that does not load is refused: the running Envoy is kept...
	writeFile(t, ca, []byte("not a certificate"))
	logs.await(t, "would not load")
	// ...and the good one that follows hot restarts it, as epoch 1.
	rotated, _ := certPair(t, "hub-ca-2")
	writeFile(t, ca, rotated)
	evs := rec.await(t, "a hot restart", count("start", 2))
	if got := flagValue(filter(evs, "start")[1].Args, "--restart-epoch"); got != "1" {
		t.Fatalf("after the certificate change: --restart-epoch %s, want 1:\n%s", got, dump(evs))
	}
	if len(filter(evs, "start")) != 2 {
		t.Fatalf("want exactly one restart:\n%s", dump(evs))
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestSupervisorGivesUpOnACrashLoop(t *testing.T) {
	const delay = time.Millisecond
	t.Setenv("FAKEENVOY_CRASH_AFTER", "20ms")
	s, rec, _ := testSupervisor(t, func(c *SupervisorConfig) {
		c.Restarts = RestartBudget{Max: 10, Delay: delay, HealthyAfter: time.Minute}
	})
	_, wait := runSupervisor(t, s)
	err := wait()
	if !errors.Is(err, ErrRestartBudget) || !strings.Contains(err.Error(), "10 restarts") {
		t.Fatalf("Run = %v, want ErrRestartBudget after 10 restarts", err)
	}
	evs := rec.events(t)
	starts, crashes := filter(evs, "start"), filter(evs, "crash")
	if len(starts) != 11 || len(crashes) != 11 {
		t.Fatalf("want the first Envoy and exactly 10 restarts, all crashing; got %d starts, %d crashes:\n%s", len(starts), len(crashes), dump(evs))
	}
	var gaps []time.Duration
	for i, st := range starts[1:] {
		if got := flagValue(st.Args, "--restart-epoch"); got != "0" {
			t.Errorf("restart %d: --restart-epoch %s, want 0 (no parent left to hand over)", i+1, got)
		}
		gap := st.Time.Sub(crashes[i].Time)
		if want := delay << i; gap < want {
			t.Errorf("restart %d came %v after the crash, before its backoff %v", i+1, gap, want)
		}
		gaps = append(gaps, gap)
	}
	// The delays grow: the last backoffs (256ms, 512ms) dwarf the first (1ms, 2ms) and any scheduling noise.
	if !(gaps[9] > gaps[8] && gaps[8] > gaps[0] && gaps[9] > 4*gaps[1]) {
		t.Errorf("the delays between crash and restart did not grow: %v", gaps)
	}
}

func TestSupervisorRestartBudgetResetsAfterHealthyRun(t *testing.T) {
	// Every Envoy crashes after 60ms, but having run longer than HealthyAfter
	// (30ms) each is a fresh start: the budget of 1 is never spent.
	t.Setenv("FAKEENVOY_CRASH_AFTER", "60ms")
	s, rec, _ := testSupervisor(t, func(c *SupervisorConfig) {
		c.Restarts = RestartBudget{Max: 1, Delay: time.Millisecond, HealthyAfter: 30 * time.Millisecond}
	})
	cancel, wait := runSupervisor(t, s)
	rec.await(t, "four Envoys", count("start", 4))
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil: Envoys that ran healthily must not spend the budget", err)
	}
}

func TestSupervisorDrainsBeforeStopping(t *testing.T) {
	s, rec, _ := testSupervisor(t, func(c *SupervisorConfig) { c.DrainDuration = 300 * time.Millisecond })
	cancel, wait := runSupervisor(t, s)
	rec.await(t, "Envoy", count("start", 1))
	ready := NewReadiness(s.cfg.AdminPort, s)
	awaitReady(t, ready)

	stopAt := time.Now()
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if took := time.Since(stopAt); took < s.cfg.DrainDuration {
		t.Errorf("Run returned %v after cancel, before the drain duration %v", took, s.cfg.DrainDuration)
	}
	evs := rec.events(t)
	drains, signals := filter(evs, "drain"), filter(evs, "signal")
	if len(drains) != 1 || drains[0].Query != "graceful" {
		t.Fatalf("want one POST /drain_listeners?graceful:\n%s", dump(evs))
	}
	if len(signals) != 1 || signals[0].Signal != "terminated" {
		t.Fatalf("want one SIGTERM:\n%s", dump(evs))
	}
	if d := signals[0].Time.Sub(drains[0].Time); d < s.cfg.DrainDuration {
		t.Errorf("SIGTERM came %v after the drain started, want at least the drain duration %v:\n%s", d, s.cfg.DrainDuration, dump(evs))
	}
	if len(filter(evs, "exit")) != 1 {
		t.Errorf("Envoy did not exit:\n%s", dump(evs))
	}
}

func TestSupervisorRefusesWhatCannotRun(t *testing.T) {
	s, _, _ := testSupervisor(t, func(c *SupervisorConfig) { c.Binary = filepath.Join(t.TempDir(), "no-envoy") })
	if err := s.Run(t.Context()); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "--envoy") {
		t.Errorf("Run with a missing binary = %v, want ErrInvalidConfig naming --envoy", err)
	}
	s, _, _ = testSupervisor(t, func(c *SupervisorConfig) { c.ParentShutdown = c.DrainTime })
	if err := s.Run(t.Context()); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "--parent-shutdown") {
		t.Errorf("Run with parent shutdown = drain time: %v, want ErrInvalidConfig naming --parent-shutdown", err)
	}
}

// awaitReady waits until the readiness check passes.
func awaitReady(t testing.TB, r *Readiness) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := r.Check(t.Context())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 15s: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A hot restart whose new Envoy exits at once (real Envoy does, e.g., while
// its parent still initializes) leaves the parent serving, untouched, and
// is tried again later at the same epoch, without spending the crash budget.
func TestFailedHotRestartKeepsTheParentServing(t *testing.T) {
	t.Setenv("FAKEENVOY_FAIL_EPOCH_ONCE", "1")
	s, rec, _ := testSupervisor(t, nil)
	cancel, wait := runSupervisor(t, s)
	first := rec.await(t, "epoch 0 started", count("start", 1))[0]
	s.Update(testBootstrap(t, s.cfg.AdminPort, "v2"))
	evs := rec.await(t, "epoch 1 tried twice", func(evs []event) bool {
		n := 0
		for _, e := range filter(evs, "start") {
			if e.Epoch == 1 {
				n++
			}
		}
		return n == 2
	})
	var tries []event
	for _, e := range filter(evs, "start") {
		if e.Epoch == 1 {
			tries = append(tries, e)
		}
	}
	if gap := tries[1].Time.Sub(tries[0].Time); gap < 900*time.Millisecond {
		t.Errorf("the failed hot restart was tried again after %v, want a backoff of a second", gap)
	}
	for _, e := range filter(evs, "signal") {
		if e.PID == first.PID {
			t.Fatalf("the serving parent got %s when its child failed:\n%s", e.Signal, dump(evs))
		}
	}
	for _, e := range filter(evs, "start") {
		if e.Epoch == 0 && e.PID != first.PID {
			t.Fatalf("epoch 0 was started again (a crash restart), not the hot restart retried:\n%s", dump(evs))
		}
	}
	// The retry took: the parent is stopped after its shutdown time.
	rec.await(t, "the parent stopped after the retried hot restart", func(evs []event) bool {
		for _, e := range filter(evs, "signal") {
			if e.PID == first.PID {
				return true
			}
		}
		return false
	})
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

// A hot restart whose new Envoy never turns LIVE (it cannot reach the hub,
// say) is abandoned: the new Envoy is stopped, the parent serves on.
func TestHotRestartThatNeverGoesLiveIsAbandoned(t *testing.T) {
	t.Setenv("FAKEENVOY_NOT_LIVE_EPOCH", "1")
	s, rec, _ := testSupervisor(t, func(c *SupervisorConfig) { c.ChildReadyTimeout = 500 * time.Millisecond })
	cancel, wait := runSupervisor(t, s)
	first := rec.await(t, "epoch 0 started", count("start", 1))[0]
	s.Update(testBootstrap(t, s.cfg.AdminPort, "v2"))
	rec.await(t, "the stuck epoch 1 stopped", func(evs []event) bool {
		for _, e := range filter(evs, "signal") {
			if e.Epoch == 1 {
				return true
			}
		}
		return false
	})
	time.Sleep(3 * time.Second) // longer than the parent's shutdown time: it would be stopped by now
	evs := rec.events(t)
	for _, e := range filter(evs, "signal") {
		if e.PID == first.PID {
			t.Fatalf("the serving parent got %s though its child never turned LIVE:\n%s", e.Signal, dump(evs))
		}
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

// readinessPoller polls the status server's ReadyPath until stopped, and
// keeps every answer that was not 200.
type readinessPoller struct {
	polls      atomic.Int64
	stop, done chan struct{}
	failuresMu sync.Mutex // guards failures
	failures   []string
}

func pollReadiness(base string) *readinessPoller {
	p := &readinessPoller{stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 10 * time.Second}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			resp, err := client.Get(base + ReadyPath)
			var answer string
			if err != nil {
				answer = err.Error()
			} else {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					answer = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
				}
			}
			if answer != "" {
				p.failuresMu.Lock()
				p.failures = append(p.failures, answer)
				p.failuresMu.Unlock()
			}
			p.polls.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return p
}

// awaitPolls waits until n more polls were answered.
func (p *readinessPoller) awaitPolls(t testing.TB, n int64) {
	t.Helper()
	want := p.polls.Load() + n
	deadline := time.Now().Add(15 * time.Second)
	for p.polls.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("the status server answered %d polls in 15s, want %d", p.polls.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// finish stops polling and returns the polls and the answers that were not 200.
func (p *readinessPoller) finish() (int64, []string) {
	close(p.stop)
	<-p.done
	p.failuresMu.Lock()
	defer p.failuresMu.Unlock()
	return p.polls.Load(), p.failures
}

// epochEvent is a test for an event of kind by the Envoy of epoch.
func epochEvent(kind string, epoch int) func([]event) bool {
	return func(evs []event) bool {
		return slices.ContainsFunc(filter(evs, kind), func(e event) bool { return e.Epoch == epoch })
	}
}

// While a hot restart's new Envoy initialises, it holds the admin address
// (Envoy's child shuts its parent's admin down as it starts) but the parent
// serves the listeners: the gateway stays ready throughout, and after.
func TestReadinessHoldsThroughAHotRestart(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "live-gate")
	writeFile(t, gate, []byte("0"))
	t.Setenv("FAKEENVOY_LIVE_GATE", gate)
	s, rec, _ := testSupervisor(t, nil)
	base := serveStatus(t, NewReadiness(s.cfg.AdminPort, s))
	cancel, wait := runSupervisor(t, s)
	awaitStatus(t, base, ReadyPath, http.StatusOK)

	poller := pollReadiness(base)
	s.Update(testBootstrap(t, s.cfg.AdminPort, "v2"))
	// The child took the admin over and initialises: the status server is
	// asked a good many times meanwhile.
	rec.await(t, "epoch 1 holding the admin", epochEvent("admin", 1))
	if !epochEvent("admin-shutdown", 0)(rec.events(t)) {
		t.Fatalf("epoch 1 bound the admin address without shutting its parent's down:\n%s", dump(rec.events(t)))
	}
	poller.awaitPolls(t, 20)
	if epochEvent("live", 1)(rec.events(t)) {
		t.Fatal("epoch 1 turned LIVE before the test let it")
	}
	// It turns LIVE and takes over; the status server is asked on.
	writeFile(t, gate, []byte("1"))
	rec.await(t, "epoch 1 LIVE", epochEvent("live", 1))
	poller.awaitPolls(t, 20)
	polls, failures := poller.finish()
	if len(failures) > 0 {
		t.Fatalf("%s answered other than 200 to %d of %d polls during the hot restart, first %q",
			ReadyPath, len(failures), polls, failures[0])
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

// A hot restart whose new Envoy never turns LIVE (the hub unreachable during
// a certificate rotation, say) is abandoned after ChildReadyTimeout: its
// parent, whose admin the child had shut down, serves on, and the gateway
// is ready again.
func TestReadinessReturnsAfterAnAbandonedHotRestart(t *testing.T) {
	t.Setenv("FAKEENVOY_NOT_LIVE_EPOCH", "1")
	s, rec, _ := testSupervisor(t, func(c *SupervisorConfig) { c.ChildReadyTimeout = 500 * time.Millisecond })
	base := serveStatus(t, NewReadiness(s.cfg.AdminPort, s))
	cancel, wait := runSupervisor(t, s)
	first := rec.await(t, "epoch 0 started", count("start", 1))[0]
	awaitStatus(t, base, ReadyPath, http.StatusOK)

	s.Update(testBootstrap(t, s.cfg.AdminPort, "v2"))
	evs := rec.await(t, "the stuck epoch 1 abandoned", epochEvent("exit", 1))
	if !epochEvent("admin-shutdown", 0)(evs) {
		t.Fatalf("epoch 1 did not shut its parent's admin down:\n%s", dump(evs))
	}
	awaitStatus(t, base, ReadyPath, http.StatusOK)
	for _, e := range filter(rec.events(t), "signal") {
		if e.PID == first.PID {
			t.Fatalf("the serving parent got %s though its child never turned LIVE", e.Signal)
		}
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}
