package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/navemesh/nave/internal/nettest"
)

// The hub under test: a real `nave hub` process with its embedded etcd.

// buildHub builds ./cmd/nave of the module the bench belongs to into dir.
func buildHub(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find the module: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run the bench from inside the nave module (go run ./bench), or pass -nave-bin")
	}
	bin := filepath.Join(dir, "nave")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/nave")
	cmd.Dir = filepath.Dir(gomod)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build ./cmd/nave: %w\n%s", err, out)
	}
	return bin, nil
}

// hubProcess is one run of `nave hub`. Restarting keeps its ports, so
// clients and spokes reconnect to the same addresses.
type hubProcess struct {
	bin, logPath    string
	dataDir         string
	fed, xds, admin string
	extra           []string
	http            *http.Client

	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{}
	waitErr error
}

func newHubProcess(bin, logPath string, extra []string) (*hubProcess, error) {
	h := &hubProcess{bin: bin, logPath: logPath, extra: extra, http: &http.Client{Timeout: 30 * time.Second}}
	for _, p := range []*string{&h.fed, &h.xds, &h.admin} {
		addr, err := nettest.FreeAddr()
		if err != nil {
			return nil, err
		}
		*p = addr
	}
	return h, nil
}

// start runs the hub on dataDir; it returns once the process started.
func (h *hubProcess) start(dataDir string) error {
	if h.running() {
		return errors.New("hub already running")
	}
	h.dataDir = dataDir
	logf, err := os.OpenFile(h.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("hub log: %w", err)
	}
	fmt.Fprintf(logf, "==> %s nave hub on %s\n", time.Now().Format(time.RFC3339Nano), dataDir)
	args := append([]string{"hub", "--id", "bench-hub", "--data-dir", dataDir,
		"--federation-addr", h.fed, "--xds-addr", h.xds, "--admin-addr", h.admin, "--log-level", "warn"}, h.extra...)
	cmd := exec.Command(h.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so Ctrl-C reaches only the bench, which stops
	// it; killed by the kernel if the bench dies without doing so.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	h.started = time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", h.bin, err)
	}
	h.cmd, h.exited = cmd, make(chan struct{})
	go func() {
		h.waitErr = cmd.Wait()
		logf.Close()
		close(h.exited)
	}()
	return nil
}

func (h *hubProcess) running() bool {
	if h.cmd == nil {
		return false
	}
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

func (h *hubProcess) pid() int {
	if h.cmd == nil || h.cmd.Process == nil {
		return 0
	}
	return h.cmd.Process.Pid
}

// waitReady polls /readyz until the hub answers 200; it returns how long
// after start that was.
func (h *hubProcess) waitReady(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if !h.running() {
			return 0, fmt.Errorf("hub exited (%v) before it was ready; its log ends:\n%s", h.waitErr, h.logTail(20))
		}
		if _, code, err := h.get(ctx, "/readyz"); err == nil && code == http.StatusOK {
			return time.Since(h.started), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("hub not ready after %s: %w; its log ends:\n%s", timeout, ctx.Err(), h.logTail(20))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and waits for the hub to exit (SIGKILL after timeout);
// it returns how long the hub took.
func (h *hubProcess) stop(timeout time.Duration) (time.Duration, error) {
	if !h.running() {
		return 0, nil
	}
	start := time.Now()
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
		return time.Since(start), nil
	case <-time.After(timeout):
		_ = h.cmd.Process.Kill()
		<-h.exited
		return time.Since(start), fmt.Errorf("hub did not stop within %s of SIGTERM; killed", timeout)
	}
}

// kill ends the hub at once, if it runs.
func (h *hubProcess) kill() {
	if h.running() {
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
}

// logTail returns the last n lines of the hub's log.
func (h *hubProcess) logTail(n int) string {
	b, err := os.ReadFile(h.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (h *hubProcess) get(ctx context.Context, path string) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.admin+path, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := h.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return b, resp.StatusCode, err
}

func (h *hubProcess) getJSON(ctx context.Context, path string, v any) error {
	b, code, err := h.get(ctx, path)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, code, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// hubCluster is the part of /debug/clusters the bench reads.
type hubCluster struct {
	Cluster   string `json:"cluster"`
	Connected bool   `json:"connected"`
	Version   uint64 `json:"version"`
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"`
	Restored  bool   `json:"restored"`
	// LastUpdate is when the hub last applied a change of the cluster.
	LastUpdate time.Time `json:"lastUpdate"`
}

func (h *hubProcess) clusters(ctx context.Context) ([]hubCluster, error) {
	var out []hubCluster
	return out, h.getJSON(ctx, "/debug/clusters", &out)
}

// hubSnapshot is the part of /debug/hub the bench reads.
type hubSnapshot struct {
	Snapshot struct {
		Revision uint64    `json:"revision"`
		At       time.Time `json:"at"`
		Bytes    int       `json:"bytes"`
		Restored bool      `json:"restored"`
	} `json:"snapshot"`
	Restored int `json:"restored"`
}

func (h *hubProcess) coordination(ctx context.Context) (hubSnapshot, error) {
	var out hubSnapshot
	return out, h.getJSON(ctx, "/debug/hub", &out)
}

func (h *hubProcess) metrics(ctx context.Context) (promText, error) {
	b, code, err := h.get(ctx, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %d", code)
	}
	return parseProm(b), nil
}

// usage samples the hub's memory and CPU: from its /metrics, else /proc.
func (h *hubProcess) usage(ctx context.Context, phase string) (usageSample, error) {
	m, err := h.metrics(ctx)
	if err != nil {
		return usageSample{}, err
	}
	u := usageSample{Phase: phase, At: time.Now(),
		RSSBytes: m.sum("process_resident_memory_bytes", ""), CPUSeconds: m.sum("process_cpu_seconds_total", ""),
		HeapInuseBytes: m.sum("go_memstats_heap_inuse_bytes", ""), Goroutines: int(m.sum("go_goroutines", "")),
		XDSClients: int(m.sum("nave_xds_connected_clients", "")), LocalityGroups: int(m.sum("nave_xds_locality_groups", "")),
	}
	// The heap goal is what the last GC found live, grown by GOGC percent:
	// a steadier measure of live memory than RSS or heap in use.
	if gogc := m.sum("go_gc_gogc_percent", ""); gogc > 0 {
		u.LiveHeapBytes = m.sum("go_memstats_next_gc_bytes", "") / (1 + gogc/100)
	}
	u.GCs = int(m.sum("go_gc_duration_seconds_count", ""))
	u.StackInuseBytes = m.sum("go_memstats_stack_inuse_bytes", "")
	u.HeapFreeKeptBytes = m.sum("go_memstats_heap_idle_bytes", "") - m.sum("go_memstats_heap_released_bytes", "")
	u.PeakRSSBytes, _ = procPeakRSS(h.pid())
	if !m.has("process_resident_memory_bytes") {
		if rss, cpu, err := procUsage(h.pid()); err == nil {
			u.RSSBytes, u.CPUSeconds = rss, cpu
		}
	}
	return u, nil
}

// fetchProfile saves the hub's pprof profile at path (e.g.
// /debug/pprof/profile?seconds=20) to file; errNoPprof when the hub has none.
func (h *hubProcess) fetchProfile(ctx context.Context, path, file string) error {
	client := &http.Client{} // a CPU profile takes as long as it asks
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.admin+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return errNoPprof
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return os.WriteFile(file, b, 0o644)
}

var errNoPprof = errors.New("the hub serves no /debug/pprof (start it with --pprof)")
