package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// SupervisorConfig is how Envoy is run.
type SupervisorConfig struct {
	// Binary is Envoy's executable (a path, or a name looked up in PATH).
	Binary string
	// Dir is where each Envoy's bootstrap is written (envoy-bootstrap-EPOCH.json).
	Dir string
	// AdminPort is the port of Envoy's admin API on 127.0.0.1 (as in the bootstrap).
	AdminPort int
	// LogLevel is Envoy's --log-level (trace, debug, info, warning, error, critical, off).
	LogLevel string
	// BaseID is Envoy's --base-id: it names the shared memory and domain
	// sockets of hot restart, so two Envoys sharing an IPC namespace need
	// different ones.
	BaseID int
	// Concurrency is Envoy's --concurrency (worker threads); 0 leaves
	// Envoy's default, one per hardware thread of the node, not of the
	// pod's CPU limit.
	Concurrency int
	// DrainTime is Envoy's --drain-time-s: how long listeners drain on a
	// hot restart or a graceful drain (rounded up to whole seconds).
	DrainTime time.Duration
	// ParentShutdown is Envoy's --parent-shutdown-time-s: how long after a
	// hot restart the new Envoy tells its parent to exit (rounded up to
	// whole seconds). It must be longer than DrainTime.
	ParentShutdown time.Duration
	// ParentGrace is how long past ParentShutdown the agent waits for a
	// parent to exit by itself, as a real Envoy does, before it sends it SIGTERM.
	ParentGrace time.Duration
	// DrainDuration is how long the agent lets Envoy drain when it stops
	// (after POST /drain_listeners?graceful, before SIGTERM).
	DrainDuration time.Duration
	// StopTimeout is how long an Envoy has to exit after SIGTERM before SIGKILL.
	StopTimeout time.Duration
	// ChildReadyTimeout is how long the new Envoy of a hot restart has to
	// turn LIVE (it waits for its configuration from the hub without a
	// timeout of its own): one that does not is stopped, its parent serves
	// on (and is the one readiness reports on, though the new Envoy shut
	// its admin API down), and the hot restart is tried again later.
	ChildReadyTimeout time.Duration
	// Restarts is the budget of restarts after crashes.
	Restarts RestartBudget
	// WatchFiles are files the bootstrap names (the hub's CA, certificate
	// and key), which Envoy reads only when it starts: when they change
	// (polled as Watch says), Envoy is hot restarted, provided CheckFiles
	// (optional) finds them good; otherwise the running Envoy is kept.
	WatchFiles []string
	Watch      Watch
	CheckFiles func() error
	// Stdout and Stderr receive Envoy's output (default: the agent's).
	Stdout, Stderr io.Writer
}

// RestartBudget bounds restarts after crashes: the n-th restart in a row
// (from 0) waits Delay×2^n, and once Max restarts have been spent the
// supervisor gives up. The budget is whole again after a change of
// configuration, or once an Envoy has run for HealthyAfter.
type RestartBudget struct {
	Max          int
	Delay        time.Duration
	HealthyAfter time.Duration
}

// DefaultSupervisorConfig runs "envoy" from PATH with Istio's timings: 45s of
// draining on hot restart, the parent gone after 60s, and 5s of draining on
// shutdown; ten restarts from 200ms to 102s apart.
func DefaultSupervisorConfig() SupervisorConfig {
	return SupervisorConfig{
		Binary:            "envoy",
		AdminPort:         15000,
		LogLevel:          "warning",
		DrainTime:         45 * time.Second,
		ParentShutdown:    60 * time.Second,
		ParentGrace:       5 * time.Second,
		DrainDuration:     5 * time.Second,
		StopTimeout:       10 * time.Second,
		ChildReadyTimeout: 2 * time.Minute,
		Restarts:          RestartBudget{Max: 10, Delay: 200 * time.Millisecond, HealthyAfter: time.Minute},
		Watch:             DefaultWatch(),
	}
}

// ErrRestartBudget is returned (wrapped) when Envoy crashed more often in a
// row than the restart budget allows: the agent exits and its pod restarts.
var ErrRestartBudget = errors.New("agent: Envoy keeps crashing; restart budget spent")

// Supervisor runs Envoy: it hot restarts it when its bootstrap or the files
// the bootstrap names change, restarts it after a crash within a budget,
// and drains and stops it when its context ends.
//
// Hot restart: the new Envoy gets the next epoch (--restart-epoch, only
// ever increasing while one is running); real Envoy hands the listeners
// over from its parent, which drains and exits by itself after
// ParentShutdown. The supervisor only reaps it, and sends it SIGTERM if it
// is still there ParentGrace later.
//
// Only one hot restart is under way at a time: a change while the new
// Envoy initialises waits until it is LIVE (or abandoned); a third epoch
// would shut the initialising one's admin API down before it was seen LIVE.
//
// Which Envoy serves: Envoy's new epoch asks its parent to shut its admin
// API down as it starts (server.cc, sendParentAdminShutdownRequest), long
// before it holds the listeners, and the parent never gets it back, even
// when the new epoch is abandoned. So the admin address tells whose state it
// is only while no newer epoch has started; the supervisor tracks the Envoy
// that holds the listeners (Serving) for readiness to follow.
//
// Crash: when the newest Envoy exits, the supervisor stops any parent still
// running and starts again at epoch 0: hot restart needs a live parent
// to take the listeners from (the crashed one was the parent-to-be), and
// Envoy's shared memory is re-created only by an epoch 0 with no other
// Envoy of the same base ID alive (Istio's agent did the same). The
// gateway serves nothing until the new Envoy is up.
type Supervisor struct {
	cfg   SupervisorConfig
	log   *slog.Logger
	admin *http.Client

	// pendingMu guards pending, a bootstrap handed to Update and not yet
	// taken by Run; wake tells Run there is one.
	pendingMu sync.Mutex
	pending   []byte
	wake      chan struct{}

	// Owned by Run's goroutine.
	bootstrap []byte
	procs     map[int]*envoyProc // every Envoy not yet reaped, by epoch
	latest    *envoyProc         // the newest, nil after it exited
	spent     int                // restarts spent of the budget
	want      bool               // an Envoy is to be started (epoch 0) once none runs and retry is nil
	retry     *time.Timer        // the backoff before that start
	// hotRetry, when not nil, is the backoff before a hot restart is tried
	// again (the last one failed: its new Envoy did not start, exited, or
	// never turned LIVE); hotFailures counts them since the last change.
	hotRetry    *time.Timer
	hotFailures int
	// hotPending: a hot restart was asked for while the new Envoy of the
	// last one still initialised; it is started once that one is LIVE.
	hotPending bool
	exits      chan *envoyProc
	// lives gets each new Envoy of a hot restart that turned LIVE (from watchChild).
	lives   chan *envoyProc
	stopped chan struct{} // closed when Run returns

	// servingMu guards serving, adminHandedOver and servingGen, written by
	// Run's goroutine and read by readiness probes (Serving).
	servingMu sync.Mutex
	// serving is the Envoy known to hold the listeners: the newest one seen
	// LIVE, nil when none is known (none yet, or it exited).
	serving *envoyProc
	// adminHandedOver: a newer Envoy was started since serving was, and
	// shut serving's admin down (Envoy does so whether or not it then turns LIVE).
	adminHandedOver bool
	servingGen      uint64 // counts changes of the two above
}

// NewSupervisor returns a supervisor that will run Envoy with bootstrap.
func NewSupervisor(cfg SupervisorConfig, bootstrap []byte, log *slog.Logger) *Supervisor {
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	return &Supervisor{
		cfg:       cfg,
		log:       log.With("component", "envoy-supervisor"),
		admin:     &http.Client{Timeout: 2 * time.Second},
		wake:      make(chan struct{}, 1),
		bootstrap: bootstrap,
		procs:     map[int]*envoyProc{},
		exits:     make(chan *envoyProc),
		lives:     make(chan *envoyProc),
		stopped:   make(chan struct{}),
	}
}

// Update hands the supervisor a new bootstrap: Envoy is hot restarted with
// it unless it is the one Envoy runs with. It does not block.
func (s *Supervisor) Update(bootstrap []byte) {
	s.pendingMu.Lock()
	s.pending = bytes.Clone(bootstrap)
	s.pendingMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// envoyProc is one Envoy process.
type envoyProc struct {
	epoch     int
	cmd       *exec.Cmd
	bootstrap string // the file it was started with
	started   time.Time
	done      chan struct{} // closed once it exited and was reaped; err is set then
	err       error
	stopOnce  sync.Once
	stopping  atomic.Bool // the supervisor sent it SIGTERM
	// parent is the Envoy this one took over from (a hot restart), nil for epoch 0.
	parent *envoyProc
	// reap SIGTERMs a parent that outlived ParentShutdown+ParentGrace,
	// counted from when its child turned LIVE (real Envoy starts the parent
	// shutdown timer then). Set from a watcher goroutine: guarded by reapMu.
	reapMu sync.Mutex
	reap   *time.Timer
}

// setReap arms the parent's reap timer (once).
func (p *envoyProc) setReap(t *time.Timer) {
	p.reapMu.Lock()
	defer p.reapMu.Unlock()
	if p.reap != nil {
		t.Stop()
		return
	}
	p.reap = t
}

// stopReap disarms the reap timer; a parent whose child failed serves on.
func (p *envoyProc) stopReap() {
	p.reapMu.Lock()
	defer p.reapMu.Unlock()
	if p.reap != nil {
		p.reap.Stop()
		p.reap = nil
	}
}

// Run runs Envoy until ctx ends, then drains and stops it and returns nil.
// It returns an error when Envoy cannot be run at all, or keeps crashing
// (ErrRestartBudget).
func (s *Supervisor) Run(ctx context.Context) (err error) {
	defer close(s.stopped)
	if err := s.cfg.check(); err != nil {
		return err
	}
	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("bootstrap directory: %w", err)
	}

	// Watch the files the bootstrap names from now on: a change while the
	// first Envoy starts is not lost.
	changed := make(chan struct{}, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWatch()
	baseline := sumFiles(s.cfg.WatchFiles) // now, not when the goroutine gets to run
	wg.Go(func() {
		watchFiles(watchCtx, s.cfg.Watch, s.cfg.WatchFiles, &baseline, s.log, func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		})
	})

	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic in the Envoy supervisor; stopping Envoy", "panic", r, "stack", string(debug.Stack()))
			s.stopAll()
			err = fmt.Errorf("agent: Envoy supervisor panicked: %v", r)
		}
	}()

	s.want = true
	if err := s.startWanted(); err != nil {
		return err
	}
	for {
		var retry <-chan time.Time
		if s.retry != nil {
			retry = s.retry.C
		}
		select {
		case <-ctx.Done():
			return s.shutdown()
		case p := <-s.exits:
			if err := s.exited(p); err != nil {
				return err
			}
		case p := <-s.lives:
			s.childLive(p)
		case <-retry:
			s.retry = nil
		case <-hotRetryC(s.hotRetry):
			s.hotRetry = nil
			if s.latest != nil {
				s.hotRestart()
			}
		case <-s.wake:
			s.pendingMu.Lock()
			next := s.pending
			s.pending = nil
			s.pendingMu.Unlock()
			if next == nil || bytes.Equal(next, s.bootstrap) {
				continue
			}
			s.bootstrap = next
			s.restart("bootstrap changed")
		case <-changed:
			if s.cfg.CheckFiles != nil {
				if err := s.cfg.CheckFiles(); err != nil {
					s.log.Error("the files the bootstrap names changed but would not load; Envoy keeps running with the old ones", "files", s.cfg.WatchFiles, "error", err)
					continue
				}
			}
			s.restart("files the bootstrap names changed")
		}
		if err := s.startWanted(); err != nil {
			return err
		}
	}
}

func (cfg SupervisorConfig) check() error {
	switch {
	case cfg.Binary == "":
		return fmt.Errorf("%w: no Envoy binary (--envoy)", ErrInvalidConfig)
	case cfg.Dir == "":
		return fmt.Errorf("%w: no directory for Envoy's bootstrap", ErrInvalidConfig)
	case cfg.AdminPort < 1 || cfg.AdminPort > 65535:
		return fmt.Errorf("%w: Envoy's admin port %d: want 1 to 65535", ErrInvalidConfig, cfg.AdminPort)
	case cfg.DrainTime <= 0 || cfg.ParentShutdown <= 0 || ceilSeconds(cfg.ParentShutdown) <= ceilSeconds(cfg.DrainTime):
		return fmt.Errorf("%w: the parent shutdown time (%v, --parent-shutdown) must be longer than the drain time (%v, --drain-time): a parent exits once its listeners drained",
			ErrInvalidConfig, cfg.ParentShutdown, cfg.DrainTime)
	case cfg.DrainDuration < 0 || cfg.StopTimeout <= 0 || cfg.ParentGrace < 0:
		return fmt.Errorf("%w: negative drain duration, parent grace or non-positive stop timeout", ErrInvalidConfig)
	case cfg.BaseID < 0:
		return fmt.Errorf("%w: --base-id %d: want 0 or more", ErrInvalidConfig, cfg.BaseID)
	case cfg.LogLevel != "" && !slices.Contains([]string{"trace", "debug", "info", "warning", "warn", "error", "critical", "off"}, cfg.LogLevel):
		return fmt.Errorf("%w: Envoy log level %q: want trace, debug, info, warning, error, critical or off", ErrInvalidConfig, cfg.LogLevel)
	case cfg.ChildReadyTimeout <= 0:
		return fmt.Errorf("%w: a hot restart needs a positive time for the new Envoy to turn LIVE", ErrInvalidConfig)
	case cfg.Restarts.Max < 0 || cfg.Restarts.Delay <= 0:
		return fmt.Errorf("%w: the restart budget needs Max >= 0 and a positive Delay", ErrInvalidConfig)
	case len(cfg.WatchFiles) > 0 && cfg.Watch.Interval <= 0:
		return fmt.Errorf("%w: watching files needs a positive poll interval", ErrInvalidConfig)
	}
	if _, err := exec.LookPath(cfg.Binary); err != nil {
		return fmt.Errorf("%w: Envoy binary: %v (--envoy names it)", ErrInvalidConfig, err)
	}
	return nil
}

// restart asks for a hot restart (or, with no Envoy running, a start) now,
// with a whole restart budget: the configuration changed.
func (s *Supervisor) restart(reason string) {
	s.log.Info("restarting Envoy", "reason", reason)
	s.spent, s.hotFailures = 0, 0
	if s.retry != nil {
		s.retry.Stop()
		s.retry = nil
	}
	if s.hotRetry != nil {
		s.hotRetry.Stop()
		s.hotRetry = nil
	}
	if s.latest != nil {
		s.hotRestart()
		return
	}
	s.want = true
}

// maxEnvoys is how many Envoys may run at once: hot restart's domain
// sockets are numbered by epoch modulo 3.
const maxEnvoys = 3

// hotRestart starts the next epoch beside the running Envoy. Until the new
// one is LIVE the parent keeps the listeners (only its admin API goes); if
// it never gets there, the parent serves on and the hot restart is tried
// again later (see retryHot). While the new Envoy of an earlier hot restart
// still initialises, the hot restart waits for it (hotPending).
func (s *Supervisor) hotRestart() {
	parent := s.latest
	serving, _ := s.servingProc()
	if parent.parent != nil && serving != parent {
		s.log.Info("a hot restart waits until the new Envoy of the last one is LIVE", "epoch", parent.epoch)
		s.hotPending = true
		return
	}
	s.hotPending = false
	if len(s.procs) >= maxEnvoys {
		s.retryHot(fmt.Errorf("%d Envoys still running (older ones draining)", len(s.procs)))
		return
	}
	// The parent's admin API is still its own: ask it once whether it is
	// LIVE (an Envoy started as epoch 0 has not been seen LIVE by the
	// supervisor yet), as it is about to be shut down.
	if serving != parent && s.isLive(parent.epoch) {
		s.setServing(parent, false)
	}
	if serving, _ = s.servingProc(); serving == parent {
		s.setServing(parent, true) // before the child can ask for the admin
	}
	child, err := s.start(parent.epoch + 1)
	if err != nil {
		if serving == parent {
			s.setServing(parent, false) // no child ran: the admin is still the parent's
		}
		s.retryHot(err)
		return
	}
	child.parent = parent
	go s.watchChild(child, parent)
}

// childLive takes the new Envoy of a hot restart, seen LIVE, as the one
// that serves, and starts a hot restart that waited for it.
func (s *Supervisor) childLive(child *envoyProc) {
	if s.procs[child.epoch] != child || child.stopping.Load() {
		return // gone or going already
	}
	s.setServing(child, false)
	if s.hotPending && s.latest == child {
		s.hotRestart()
	}
}

// Serving says which Envoy holds the gateway's listeners, for readiness
// (it implements ServingEnvoy). It does not block.
func (s *Supervisor) Serving() Serving {
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	out := Serving{Generation: s.servingGen}
	if p := s.serving; p != nil && !p.stopping.Load() {
		out.Known, out.Epoch, out.AdminHandedOver = true, p.epoch, s.adminHandedOver
	}
	return out
}

// servingProc is the Envoy known to serve and whether its admin was handed over.
func (s *Supervisor) servingProc() (*envoyProc, bool) {
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	return s.serving, s.adminHandedOver
}

// setServing records p (nil: none known) as the Envoy that serves. Only Run's goroutine calls it.
func (s *Supervisor) setServing(p *envoyProc, adminHandedOver bool) {
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	if s.serving == p && s.adminHandedOver == adminHandedOver {
		return
	}
	if p != s.serving {
		s.log.Info("the Envoy serving the listeners changed", "epoch", epochOf(p))
	}
	s.serving, s.adminHandedOver = p, adminHandedOver
	s.servingGen++
}

// epochOf is p's epoch, -1 for none.
func epochOf(p *envoyProc) int {
	if p == nil {
		return -1
	}
	return p.epoch
}

// watchChild waits until the new Envoy of a hot restart is LIVE, then arms
// its parent's reap timer and hands it to Run (lives); it stops a child
// that does not get there in ChildReadyTimeout (its exit then ends the
// attempt).
func (s *Supervisor) watchChild(child, parent *envoyProc) {
	deadline := time.Now().Add(s.cfg.ChildReadyTimeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.isLive(child.epoch) {
			reapAfter := time.Duration(ceilSeconds(s.cfg.ParentShutdown))*time.Second + s.cfg.ParentGrace
			parent.setReap(time.AfterFunc(reapAfter, func() {
				s.log.Warn("Envoy parent still running after its shutdown time; stopping it", "epoch", parent.epoch, "after", reapAfter)
				parent.terminate(s.log, s.cfg.StopTimeout)
			}))
			select {
			case s.lives <- child:
			case <-s.stopped:
			}
			return
		}
		if time.Now().After(deadline) {
			s.log.Error("the new Envoy of a hot restart did not turn LIVE in time; stopping it (its parent serves on)",
				"epoch", child.epoch, "after", s.cfg.ChildReadyTimeout)
			child.terminate(s.log, s.cfg.StopTimeout)
			return
		}
		select {
		case <-child.done:
			return
		case <-s.stopped:
			return
		case <-tick.C:
		}
	}
}

// isLive reports whether the Envoy of epoch answers the admin API as LIVE
// (/server_info names the epoch: during a hot restart the admin port may
// still be the parent's).
func (s *Supervisor) isLive(epoch int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/server_info", s.cfg.AdminPort), nil)
	if err != nil {
		return false
	}
	req.Close = true // a new connection each time: a kept one may be the parent's
	resp, err := s.admin.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var info struct {
		State   string `json:"state"`
		Options struct {
			RestartEpoch int `json:"restart_epoch"`
		} `json:"command_line_options"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&info) != nil {
		return false
	}
	return info.State == "LIVE" && info.Options.RestartEpoch == epoch
}

// retryHot gives up on a hot restart for now: the running Envoy serves on
// with its configuration, and the restart is tried again (at the same
// epoch) after a backoff, 1s doubling up to a minute. It spends nothing of
// the crash budget.
func (s *Supervisor) retryHot(cause error) {
	delay := min(time.Second<<min(s.hotFailures, 6), time.Minute)
	s.hotFailures++
	s.log.Error("hot restart failed; the running Envoy keeps serving, and it is tried again", "error", cause, "in", delay)
	if s.hotRetry != nil {
		s.hotRetry.Stop()
	}
	s.hotRetry = time.NewTimer(delay)
}

// hotRetryC is t's channel, or nil (never ready) without a timer.
func hotRetryC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// startWanted starts epoch 0 when one is wanted, none runs and no backoff is under way.
func (s *Supervisor) startWanted() error {
	if !s.want || s.retry != nil || len(s.procs) > 0 {
		return nil
	}
	s.want = false
	if _, err := s.start(0); err != nil {
		s.log.Error("cannot start Envoy", "error", err)
		return s.crashed(err)
	}
	return nil
}

// start starts an Envoy with the current bootstrap at epoch.
func (s *Supervisor) start(epoch int) (*envoyProc, error) {
	path := filepath.Join(s.cfg.Dir, fmt.Sprintf("envoy-bootstrap-%d.json", epoch))
	if err := writeFileAtomic(path, s.bootstrap, 0o600); err != nil {
		return nil, fmt.Errorf("write bootstrap: %w", err)
	}
	cmd := exec.Command(s.cfg.Binary, s.args(path, epoch)...)
	cmd.Stdout, cmd.Stderr = s.cfg.Stdout, s.cfg.Stderr
	cmd.SysProcAttr = envoyProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.cfg.Binary, err)
	}
	p := &envoyProc{epoch: epoch, cmd: cmd, bootstrap: path, started: time.Now(), done: make(chan struct{})}
	s.procs[epoch], s.latest = p, p
	s.log.Info("Envoy started", "epoch", epoch, "pid", cmd.Process.Pid, "bootstrap", path)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
		select {
		case s.exits <- p:
		case <-s.stopped:
		}
	}()
	return p, nil
}

// args are Envoy's command line.
func (s *Supervisor) args(bootstrap string, epoch int) []string {
	args := []string{
		"-c", bootstrap,
		"--restart-epoch", strconv.Itoa(epoch),
		"--parent-shutdown-time-s", strconv.Itoa(ceilSeconds(s.cfg.ParentShutdown)),
		"--drain-time-s", strconv.Itoa(ceilSeconds(s.cfg.DrainTime)),
		// Every connection is told to go at once when a drain starts (the
		// default, gradual, spreads that over the drain time, longer than
		// the agent waits when it stops).
		"--drain-strategy", "immediate",
		"--base-id", strconv.Itoa(s.cfg.BaseID),
	}
	if s.cfg.LogLevel != "" {
		args = append(args, "--log-level", s.cfg.LogLevel)
	}
	if s.cfg.Concurrency > 0 {
		args = append(args, "--concurrency", strconv.Itoa(s.cfg.Concurrency))
	}
	return args
}

// exited reaps an Envoy. A parent's exit is expected; the newest Envoy's is a crash.
func (s *Supervisor) exited(p *envoyProc) error {
	delete(s.procs, p.epoch)
	p.stopReap()
	if serving, _ := s.servingProc(); serving == p {
		s.setServing(nil, false)
	}
	if err := os.Remove(p.bootstrap); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Debug("cannot remove an old bootstrap", "file", p.bootstrap, "error", err)
	}
	ran := time.Since(p.started).Round(time.Millisecond)
	if p != s.latest {
		s.log.Info("Envoy parent exited", "epoch", p.epoch, "status", exitStatus(p.err), "ran", ran, "stopped_by_agent", p.stopping.Load())
		return nil
	}
	if parent := p.parent; parent != nil && s.procs[parent.epoch] == parent && !parent.stopping.Load() {
		// A hot restart that did not take: the parent still serves (with
		// its admin API shut down by the child; see Serving). A hot restart
		// that waited for this one is retried with it.
		s.latest = parent
		s.hotPending = false
		parent.stopReap()
		s.retryHot(fmt.Errorf("the new Envoy (epoch %d) exited: %s after %v", p.epoch, exitStatus(p.err), ran))
		return nil
	}
	s.latest, s.hotPending = nil, false
	s.log.Error("Envoy exited unexpectedly", "epoch", p.epoch, "status", exitStatus(p.err), "ran", ran)
	if ran >= s.cfg.Restarts.HealthyAfter && s.cfg.Restarts.HealthyAfter > 0 {
		s.spent = 0
	}
	return s.crashed(fmt.Errorf("epoch %d: %s after %v", p.epoch, exitStatus(p.err), ran))
}

// crashed handles the loss of the newest Envoy (or a failure to start
// one): any parent is stopped, and epoch 0 is started after the backoff,
// unless the budget is spent.
func (s *Supervisor) crashed(cause error) error {
	for _, q := range s.procs {
		s.log.Warn("stopping an Envoy parent: the Envoy it handed over to is gone", "epoch", q.epoch)
		q.terminate(s.log, s.cfg.StopTimeout)
	}
	if s.spent >= s.cfg.Restarts.Max {
		s.stopAll()
		return fmt.Errorf("%w: %d restarts in a row did not keep it running (last: %v)", ErrRestartBudget, s.spent, cause)
	}
	delay := s.cfg.Restarts.Delay << s.spent
	if delay <= 0 || delay > time.Hour {
		delay = time.Hour
	}
	s.spent++
	s.log.Warn("restarting Envoy after a delay", "delay", delay, "restart", s.spent, "budget", s.cfg.Restarts.Max)
	s.want = true
	s.retry = time.NewTimer(delay)
	return nil
}

// shutdown drains the newest Envoy, then stops every Envoy.
func (s *Supervisor) shutdown() error {
	if s.retry != nil {
		s.retry.Stop()
	}
	if p := s.latest; p != nil {
		if err := s.drainListeners(); err != nil {
			s.log.Warn("cannot start Envoy's drain; stopping it at once", "error", err)
		} else {
			s.log.Info("draining Envoy before stopping it", "epoch", p.epoch, "for", s.cfg.DrainDuration)
			t := time.NewTimer(s.cfg.DrainDuration)
			select {
			case <-t.C:
			case <-p.done:
				s.log.Warn("Envoy exited while draining", "epoch", p.epoch, "status", exitStatus(p.err))
			}
			t.Stop()
		}
	}
	s.stopAll()
	s.log.Info("Envoy stopped")
	return nil
}

// drainListeners asks the newest Envoy to drain gracefully.
func (s *Supervisor) drainListeners() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://127.0.0.1:%d/drain_listeners?graceful", s.cfg.AdminPort)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := s.admin.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// stopAll sends every Envoy SIGTERM (SIGKILL after StopTimeout) and waits until all exited.
func (s *Supervisor) stopAll() {
	for _, p := range s.procs {
		p.terminate(s.log, s.cfg.StopTimeout)
	}
	for _, p := range s.procs {
		<-p.done
		p.stopReap()
		_ = os.Remove(p.bootstrap)
		s.log.Info("Envoy exited", "epoch", p.epoch, "status", exitStatus(p.err))
		delete(s.procs, p.epoch)
	}
	s.latest = nil
	s.setServing(nil, false)
}

// terminate sends SIGTERM once, and SIGKILL if the process is still there after timeout.
func (p *envoyProc) terminate(log *slog.Logger, timeout time.Duration) {
	p.stopOnce.Do(func() {
		p.stopping.Store(true)
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			return // already exited
		}
		go func() {
			t := time.NewTimer(timeout)
			defer t.Stop()
			select {
			case <-p.done:
			case <-t.C:
				log.Warn("Envoy did not exit after SIGTERM; killing it", "epoch", p.epoch, "after", timeout)
				_ = p.cmd.Process.Kill()
			}
		}()
	})
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// ceilSeconds is d in whole seconds, rounded up, at least 1: Envoy's flags take seconds.
func ceilSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
