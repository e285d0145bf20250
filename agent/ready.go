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
	// otherwise, and while the agent shuts down.
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

// Readiness decides whether the gateway is ready, from Envoy's admin API.
type Readiness struct {
	admin    string // http://127.0.0.1:PORT
	client   *http.Client
	draining atomic.Bool
	// configured: the gateway has been ready once (connected and configured).
	configured atomic.Bool
}

// NewReadiness asks the Envoy whose admin API is on 127.0.0.1:adminPort.
func NewReadiness(adminPort int) *Readiness {
	return &Readiness{
		admin:  fmt.Sprintf("http://127.0.0.1:%d", adminPort),
		client: &http.Client{Timeout: time.Second},
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
