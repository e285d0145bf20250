package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"time"
)

// The agent's status endpoints (on its status port, 15021 by default, as Istio's).
const (
	// ReadyPath answers 200 when the gateway can take traffic: the first
	// time, Envoy is LIVE, connected to the hub and has accepted listeners
	// and clusters from it; from then on, Envoy is LIVE (fail-static: a hub
	// outage must not take a configured gateway out of its Service, as the
	// hub keeps serving a lost cluster's endpoints); 503 with the reason
	// otherwise, and while the agent shuts down. "Envoy" is the one that
	// holds the listeners: during a hot restart, the parent until the new
	// Envoy is LIVE, and the parent again when the new one is abandoned.
	ReadyPath = "/healthz/ready"
	// LivePath answers 200 while the agent runs.
	LivePath = "/healthz/live"
)

// The stats readiness reads: the gauge Envoy keeps at 1 while its ADS
// stream to the hub is up, and how many listener and cluster updates it
// accepted.
const (
	connectedStat = "control_plane.connected_state"
	ldsStat       = "listener_manager.lds.update_success"
	cdsStat       = "cluster_manager.cds.update_success"
)

// statsFilter asks /stats for exactly those stats.
var statsFilter = "^(" + strings.Join([]string{regexp.QuoteMeta(connectedStat), regexp.QuoteMeta(ldsStat), regexp.QuoteMeta(cdsStat)}, "|") + ")$"

// ServingEnvoy says which Envoy holds the gateway's listeners (the
// Supervisor does). Serving must not block: probes call it.
type ServingEnvoy interface {
	Serving() Serving
}

// Serving is which Envoy holds the gateway's listeners.
type Serving struct {
	// Known: an Envoy seen LIVE holds them, the one of Epoch. Not known
	// before the first hot restart (the only Envoy's admin API says), and
	// after the one that held them exited or is being stopped.
	Known bool
	Epoch int
	// AdminHandedOver: a newer Envoy has started since, and shut this
	// one's admin API down, as Envoy's new epoch does when it starts; the
	// admin address answers for the newer one, or nothing if it was
	// abandoned. This one serves on, LIVE as it was seen: an Envoy leaves
	// LIVE only to drain, which a parent does once its new Envoy is LIVE,
	// and that one is then the one serving.
	AdminHandedOver bool
	// Generation changes whenever the rest does.
	Generation uint64
}

// Readiness decides whether the gateway is ready, from Envoy's admin API
// and, during and after hot restarts, from which Envoy serves.
type Readiness struct {
	admin    string // http://127.0.0.1:PORT
	serving  ServingEnvoy
	client   *http.Client
	draining atomic.Bool
	// configured: the gateway has been ready once (connected and configured).
	configured atomic.Bool
}

// NewReadiness asks the Envoy whose admin API is on 127.0.0.1:adminPort;
// serving (nil: none, a single Envoy that is never hot restarted) says
// which Envoy holds the listeners.
func NewReadiness(adminPort int, serving ServingEnvoy) *Readiness {
	return &Readiness{
		admin:   fmt.Sprintf("http://127.0.0.1:%d", adminPort),
		serving: serving,
		client:  &http.Client{Timeout: time.Second},
	}
}

// Drain makes the gateway not ready from now on: it is shutting down, and
// load balancers should stop sending it new connections.
func (r *Readiness) Drain() { r.draining.Store(true) }

// Check returns nil when the gateway is ready, else why it is not.
func (r *Readiness) Check(ctx context.Context) error {
	if r.draining.Load() {
		return errors.New("the gateway is draining: it is shutting down")
	}
	if r.serving == nil {
		return r.checkAdmin(ctx)
	}
	// A hot restart may start while the admin API is asked: an answer is
	// taken only if which Envoy serves did not change meanwhile.
	for {
		before := r.serving.Serving()
		if before.Known && before.AdminHandedOver {
			// Its admin API is gone; the admin address is a newer Envoy's
			// (initialising) or nobody's (abandoned).
			return nil
		}
		err := r.checkAdmin(ctx)
		if r.serving.Serving().Generation == before.Generation || ctx.Err() != nil {
			return err
		}
	}
}

// checkAdmin asks the Envoy holding the admin address.
func (r *Readiness) checkAdmin(ctx context.Context) error {
	status, body, err := r.get(ctx, "/ready")
	if err != nil {
		return fmt.Errorf("the admin API of Envoy does not answer (is Envoy running?): %w", err)
	}
	if state := strings.TrimSpace(string(body)); status != http.StatusOK || state != "LIVE" {
		return fmt.Errorf("the gateway's Envoy is not live: /ready answered %d %q", status, state)
	}
	if r.configured.Load() {
		return nil // it holds its configuration, hub or no hub
	}
	status, body, err = r.get(ctx, "/stats?filter="+url.QueryEscape(statsFilter))
	if err != nil {
		return fmt.Errorf("the stats of Envoy: %w", err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("the stats of Envoy: /stats answered %d", status)
	}
	connected, ok := statValue(body, connectedStat)
	switch {
	case !ok:
		return fmt.Errorf("the gateway's Envoy reports no %s: has it an ADS config?", connectedStat)
	case connected != "1":
		return fmt.Errorf("the gateway's Envoy is not connected to the hub (%s is %s)", connectedStat, connected)
	}
	for _, st := range []struct{ name, what string }{{cdsStat, "clusters"}, {ldsStat, "listeners"}} {
		if n, _ := statValue(body, st.name); n == "" || n == "0" {
			return fmt.Errorf("the gateway's Envoy has not accepted %s from the hub yet (%s is %q)", st.what, st.name, n)
		}
	}
	r.configured.Store(true)
	return nil
}

func (r *Readiness) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.admin+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, body, err
}

// statValue finds "name: value" in the text of Envoy's /stats.
func statValue(stats []byte, name string) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(stats))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// Handler serves ReadyPath and LivePath.
func (r *Readiness) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ReadyPath, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second) // within the probe's timeout
		defer cancel()
		if err := r.Check(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET "+LivePath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "live")
	})
	return mux
}
