package spoke

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/nettest"
)

// leaseHolder is who holds the test's Lease ("" when it is free or absent).
func (f *kubeFixture) leaseHolder() string {
	l, err := f.kc.CoordinationV1().Leases(testElection.Namespace).Get(f.t.Context(), testElection.Name, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func awaitHolder(t *testing.T, f *kubeFixture, want string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); f.leaseHolder() != want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the Lease is held by %q after %v, want %q", f.leaseHolder(), within, want)
		}
	}
}

// spokeProcessEnv makes the test binary run one spoke (TestSpokeProcess)
// with the JSON spokeProcess it holds: one spoke per process, as in
// production (Run routes client-go's global klog into its logger).
const spokeProcessEnv = "NAVE_TEST_SPOKE_PROCESS"

type spokeProcess struct {
	ID, HubAddr, Kubeconfig string
	GiveUpAfter             int
	StandBack               time.Duration
}

// TestSpokeProcess is the spoke of startSpokeProcess; it runs only there.
func TestSpokeProcess(t *testing.T) {
	env := os.Getenv(spokeProcessEnv)
	if env == "" {
		t.Skip("runs as a spoke process of another test")
	}
	var p spokeProcess
	if err := json.Unmarshal([]byte(env), &p); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Cluster, cfg.Source, cfg.Kubeconfig, cfg.Region = "east", "kube", p.Kubeconfig, "default-region"
	cfg.HubAddr, cfg.Imports, cfg.GiveUpAfter = p.HubAddr, false, p.GiveUpAfter
	cfg.LeaderElection = testElection
	cfg.LeaderElection.StandBack = p.StandBack
	cfg.Federation.SpokeID, cfg.Federation.MinBackoff, cfg.Federation.MaxBackoff = p.ID, 10*time.Millisecond, 50*time.Millisecond
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, cfg, slog.Default().With("replica", p.ID)); err != nil {
		t.Fatal(err)
	}
}

// startSpokeProcess runs a spoke of cluster east in a process of its own
// until the test ends; its log is in the test's temporary directory.
func startSpokeProcess(t *testing.T, p spokeProcess) {
	t.Helper()
	env, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "spoke-"+p.ID+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSpokeProcess$", "-test.v")
	cmd.Env = append(os.Environ(), spokeProcessEnv+"="+string(env))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		err := cmd.Wait()
		logFile.Close()
		if err != nil || t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("spoke %s: %v; its log:\n%s", p.ID, err, b)
		}
	})
}

// Two spoke replicas, each a process: a leads but cannot reach the hub
// (nothing listens at its address, as behind a broken network path), b
// can. After GiveUpAfter failed sessions a gives the Lease up at once; b
// takes it and streams; a, back as a candidate after StandBack, does not
// take it back.
func TestLeaderThatCannotReachTheHubGivesUpTheLease(t *testing.T) {
	f := newKubeFixture(t, true)
	hcfg := hub.DefaultConfig()
	hcfg.ID, hcfg.DataDir = "hub", t.TempDir()
	hcfg.FederationAddr, hcfg.XDSAddr, hcfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	hubCtx, stopHub := context.WithCancel(context.Background())
	h, err := hub.Start(hubCtx, hcfg, slog.New(slog.DiscardHandler))
	if err != nil {
		stopHub()
		t.Fatal(err)
	}
	t.Cleanup(func() { stopHub(); _ = h.Wait() })
	nowhere, err := nettest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}

	standBack := time.Second
	startSpokeProcess(t, spokeProcess{ID: "a", HubAddr: nowhere, Kubeconfig: f.cluster.SpokeKubeconfig, GiveUpAfter: 3, StandBack: standBack})
	awaitHolder(t, f, "a", 60*time.Second)
	startSpokeProcess(t, spokeProcess{ID: "b", HubAddr: h.FederationAddr.String(), Kubeconfig: f.cluster.SpokeKubeconfig, GiveUpAfter: 3, StandBack: standBack})

	awaitHolder(t, f, "b", 60*time.Second)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c := h.View().Clusters["east"]; c.Connected && c.SpokeID == "b" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b leads but does not stream to the hub: %+v", h.View().Clusters["east"])
		}
	}
	// a stands back, then campaigns again: b, which reaches the hub, keeps the Lease.
	for end := time.Now().Add(3 * standBack); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if holder := f.leaseHolder(); holder != "b" {
			t.Fatalf("the Lease went to %q while b streams to the hub", holder)
		}
	}
}

// A lone candidate that cannot reach the hub gives the Lease up too (it
// cannot know there is no standby), stands back, and takes it again to try
// once more.
func TestLoneLeaderThatCannotReachTheHubRetries(t *testing.T) {
	f := newKubeFixture(t, false)
	rc, err := clientcmd.BuildConfigFromFlags("", f.cluster.SpokeKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	election := testElection
	election.StandBack = time.Second
	starts := make(chan time.Time, 10)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- leadOrGiveUp(ctx, newKubeClient(t, rc), election, "a", slog.Default(), func(context.Context) error {
			starts <- time.Now()
			return fmt.Errorf("%w: 5 sessions in a row failed", errHubUnreachable)
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	first := nextStart(t, starts, 30*time.Second)
	awaitHolder(t, f, "", 5*time.Second) // released at once
	second := nextStart(t, starts, 3*election.StandBack+5*time.Second)
	if gap := second.Sub(first); gap < election.StandBack {
		t.Errorf("took the Lease back %v after giving it up, want to stand back %v first", gap, election.StandBack)
	}
}

// A term that panics releases the Lease, and the election returns an error
// (the process stops, as it did before there was an election), instead of
// running the failing term again and again.
func TestTermThatPanicsReleasesTheLeaseAndStops(t *testing.T) {
	f := newKubeFixture(t, false)
	rc, err := clientcmd.BuildConfigFromFlags("", f.cluster.SpokeKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	terms := 0
	err = leadOrGiveUp(t.Context(), newKubeClient(t, rc), testElection, "a", slog.Default(), func(context.Context) error {
		terms++
		panic("a bug in the term")
	})
	if err == nil || !strings.Contains(err.Error(), "a bug in the term") {
		t.Fatalf("leadOrGiveUp: %v, want the panic's error", err)
	}
	if terms != 1 {
		t.Errorf("%d terms ran, want 1", terms)
	}
	if got := f.leaseHolder(); got != "" {
		t.Errorf("the Lease is held by %q, want it released", got)
	}
}

func nextStart(t *testing.T, starts <-chan time.Time, within time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-starts:
		return at
	case <-time.After(within):
		t.Fatalf("no term within %v", within)
		return time.Time{}
	}
}

// The sessions that count: failed ones in a row, until the hub acknowledges one.
func TestHubFailuresCountSessionsInARow(t *testing.T) {
	f := &hubFailures{limit: 3}
	down := federation.SessionStatus{}
	welcomed := federation.SessionStatus{Connected: true}
	synced := federation.SessionStatus{Connected: true, Synced: true}
	// Two attempts fail; the third is welcomed, then breaks before the hub acknowledged the state.
	for i, s := range []federation.SessionStatus{down, down, welcomed} {
		if err := f.observe(s); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if err := f.observe(down); !errors.Is(err, errHubUnreachable) {
		t.Fatalf("after 3 failed sessions: %v, want errHubUnreachable", err)
	}
	f = &hubFailures{limit: 3}
	for _, s := range []federation.SessionStatus{down, down, welcomed, synced, down, down, down} {
		if err := f.observe(s); err != nil {
			t.Fatalf("a synced session in between resets the count: %v", err)
		}
	}
	if err := f.observe(down); err == nil {
		t.Fatal("3 failed sessions after the synced one: no give up")
	}
	if err := (&hubFailures{}).observe(down); err != nil {
		t.Fatalf("limit 0 gives up: %v", err)
	}
}
