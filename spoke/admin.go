package spoke

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/internal/adminhttp"
)

// Metric names of the spoke.
const (
	metricConnected     = "nave_spoke_connected"
	metricEpoch         = "nave_spoke_epoch"
	metricAckedVersion  = "nave_spoke_acked_version"
	metricAckedServices = "nave_spoke_acked_services"
	metricRefused       = "nave_spoke_refused_services"
	metricLastAck       = "nave_spoke_last_ack_timestamp_seconds"
	metricStates        = "nave_spoke_source_states_total"
	metricLeader        = "nave_spoke_leader"
)

// monitor turns the publisher's session status into metrics and readiness.
type monitor struct {
	reg         *prometheus.Registry
	synced      atomic.Bool // a hub session is up and has acknowledged this spoke's state
	leading     atomic.Bool // this replica publishes (always, without leader election)
	sourceReady atomic.Bool // the source has produced a complete state

	leader prometheus.Gauge

	connectedGauge, epoch, ackedVersion, ackedServices, refused, lastAck prometheus.Gauge
	states                                                               prometheus.Counter
	lastVersion                                                          uint64 // owned by the publisher's goroutine
}

func newMonitor() *monitor {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m := &monitor{
		reg:            prometheus.NewRegistry(),
		connectedGauge: gauge(metricConnected, "1 while the spoke has a session with the hub."),
		epoch:          gauge(metricEpoch, "Epoch of the current (or last) hub session."),
		ackedVersion:   gauge(metricAckedVersion, "Version of the last update the hub acknowledged."),
		ackedServices:  gauge(metricAckedServices, "Services the hub holds for this cluster, as acknowledged."),
		refused:        gauge(metricRefused, "Services the hub refused (or that are too large) in their current form."),
		lastAck:        gauge(metricLastAck, "When the hub last acknowledged an update (unix seconds); a stall shows as an old value while the source changes."),
		leader:         gauge(metricLeader, "1 while this replica is the one that streams the cluster to the hub."),
		states: prometheus.NewCounter(prometheus.CounterOpts{Name: metricStates,
			Help: "What the source handed over: its complete state, then each burst of changes of the cluster's exported services."}),
	}
	m.reg.MustRegister(m.leader, m.connectedGauge, m.epoch, m.ackedVersion, m.ackedServices, m.refused, m.lastAck, m.states,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observe is the publisher's status callback (its goroutine; must not block).
func (m *monitor) observe(s federation.SessionStatus) {
	m.synced.Store(s.Connected && s.Synced)
	m.connectedGauge.Set(b2f(s.Connected))
	m.epoch.Set(float64(s.Epoch))
	m.ackedVersion.Set(float64(s.AckedVersion))
	m.ackedServices.Set(float64(s.Services))
	m.refused.Set(float64(s.Rejected))
	if s.AckedVersion != m.lastVersion {
		m.lastVersion = s.AckedVersion
		m.lastAck.Set(float64(time.Now().Unix()))
	}
}

func (m *monitor) setLeading(b bool) {
	m.leading.Store(b)
	m.leader.Set(b2f(b))
}

// ready: the leader once the hub has acknowledged its state; a standby once
// its source is ready to take over.
func (m *monitor) ready() (bool, string) {
	if m.leading.Load() {
		return m.synced.Load(), "the hub has not acknowledged this spoke's state"
	}
	return m.sourceReady.Load(), "standby: the source has not synced"
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// serve runs the admin HTTP server on lis until ctx ends: /healthz (alive),
// /readyz (a hub session is up and has acknowledged the spoke's state; for a
// standby replica, its source is ready) and /metrics.
func (m *monitor) serve(ctx context.Context, lis net.Listener, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := m.ready(); !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	log.Info("spoke admin serving", "addr", lis.Addr().String())
	if err := adminhttp.Serve(ctx, lis, mux); err != nil {
		return fmt.Errorf("admin server: %w", err)
	}
	return nil
}
