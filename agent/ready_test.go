package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// get asks the agent's status server for path.
func get(t testing.TB, base, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// serveStatus serves r's handler on 127.0.0.1:0 until the test ends.
func serveStatus(t testing.TB, r *Readiness) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: r.Handler()}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return "http://" + lis.Addr().String()
}

// awaitStatus polls the status server until path answers code, and returns the body.
func awaitStatus(t testing.TB, base, path string, code int) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, body := get(t, base, path)
		if got == code {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s answered %d %q for 15s, want %d", path, got, body, code)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReadinessFollowsEnvoy(t *testing.T) {
	connected := filepath.Join(t.TempDir(), "connected")
	t.Setenv("FAKEENVOY_CONNECTED_FILE", connected)
	s, _, _ := testSupervisor(t, nil)
	ready := NewReadiness(s.cfg.AdminPort, s)
	base := serveStatus(t, ready)

	// Before Envoy is up: not ready, and the agent says why; live all along.
	if code, body := get(t, base, ReadyPath); code != http.StatusServiceUnavailable || !strings.Contains(body, "does not answer") {
		t.Errorf("before Envoy: %d %q, want 503 saying Envoy's admin does not answer", code, body)
	}
	if code, _ := get(t, base, LivePath); code != http.StatusOK {
		t.Errorf("%s: %d, want 200", LivePath, code)
	}

	// Envoy up, LIVE and connected: ready.
	cancel, wait := runSupervisor(t, s)
	awaitStatus(t, base, ReadyPath, http.StatusOK)

	// Envoy loses the hub: still ready (fail-static), it holds its configuration.
	if err := os.WriteFile(connected, []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if code, body := get(t, base, ReadyPath); code != http.StatusOK {
			t.Fatalf("a configured gateway that lost the hub: %d %q, want still ready", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A gateway never configured is not ready without the hub.
	fresh := serveStatus(t, NewReadiness(s.cfg.AdminPort, s))
	if code, body := get(t, fresh, ReadyPath); code != http.StatusServiceUnavailable || !strings.Contains(body, "not connected to the hub") {
		t.Errorf("never configured, disconnected: %d %q, want 503 saying why", code, body)
	}

	// Shutting down: not ready at once, while Envoy still answers.
	ready.Drain()
	if code, body := get(t, base, ReadyPath); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Errorf("draining: %d %q, want 503 draining", code, body)
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

func TestReadinessReadsEnvoysAnswers(t *testing.T) {
	const configured = "cluster_manager.cds.update_success: 3\nlistener_manager.lds.update_success: 1\n"
	for _, tc := range []struct {
		name        string
		ready       string
		readyStatus int
		stats       string
		want        string // "" for ready
	}{
		{"live, connected, configured", "LIVE\n", 200, configured + "control_plane.connected_state: 1\n", ""},
		{"initializing", "PRE_INITIALIZING\n", 503, configured + "control_plane.connected_state: 1\n", "not live"},
		{"not connected", "LIVE\n", 200, configured + "control_plane.connected_state: 0\n", "not connected to the hub"},
		{"no such stat", "LIVE\n", 200, "\n", "reports no control_plane.connected_state"},
		{"live after the initial fetch timed out, with nothing", "LIVE\n", 200,
			"cluster_manager.cds.update_success: 0\ncontrol_plane.connected_state: 1\nlistener_manager.lds.update_success: 0\n", "not accepted clusters"},
		{"clusters but no listeners yet", "LIVE\n", 200,
			"cluster_manager.cds.update_success: 2\ncontrol_plane.connected_state: 1\nlistener_manager.lds.update_success: 0\n", "not accepted listeners"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.readyStatus)
				io.WriteString(w, tc.ready)
			})
			mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("filter") != statsFilter {
					t.Errorf("stats filter %q", r.URL.Query().Get("filter"))
				}
				io.WriteString(w, tc.stats)
			})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: mux}
			go srv.Serve(lis)
			defer srv.Close()
			r := NewReadiness(lis.Addr().(*net.TCPAddr).Port, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err = r.Check(ctx)
			if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Check = %v, want %q", err, tc.want)
			}
		})
	}
}
