package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/navemesh/nave/internal/adminhttp"
	"github.com/navemesh/nave/relay"
)

// Clients is what /debug/clients serves: the node's xDS clients and what
// the relay asks the hub for on their behalf.
type Clients struct {
	Clients []relay.ClientStatus `json:"clients"`
	// Upstream is, per type, the resource names the relay subscribes to
	// for the node ("*": every resource).
	Upstream map[string][]string `json:"upstream"`
	// Gateways are the gateways served a view of their own, and what the
	// relay subscribes to in their name.
	Gateways []relay.GatewayStatus `json:"gateways"`
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
		_ = enc.Encode(Clients{Clients: r.Clients(), Upstream: r.Subscriptions(), Gateways: r.Gateways()})
	})
	log.Info("node agent admin serving", "addr", lis.Addr().String())
	if err := adminhttp.Serve(ctx, lis, mux); err != nil {
		return fmt.Errorf("node agent: admin server: %w", err)
	}
	return nil
}
