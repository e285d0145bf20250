package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/navemesh/nave/relay"
)

// Clients is what /debug/clients serves: the node's xDS clients and what
// the relay asks the hub for on their behalf.
type Clients struct {
	Clients []relay.ClientStatus `json:"clients"`
	// Upstream is, per type, the resource names the relay subscribes to
	// ("*": every resource).
	Upstream map[string][]string `json:"upstream"`
}

// serveAdmin runs the admin HTTP server on lis until ctx ends: /healthz
// and /readyz (alive and serving: a node agent is ready while the hub is
// away, since it serves the last good state), /metrics and /debug/clients.
func serveAdmin(ctx context.Context, lis net.Listener, r *relay.Relay, reg *prometheus.Registry, log *slog.Logger) error {
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/clients", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(Clients{Clients: r.Clients(), Upstream: r.Subscriptions()})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Info("node agent admin serving", "addr", lis.Addr().String())
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("node agent: admin server: %w", err)
	}
	return nil
}
