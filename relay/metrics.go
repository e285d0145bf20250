package relay

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/navemesh/nave/internal/xdstype"
)

// Metric names.
const (
	MetricNACKs              = "nave_relay_nacks_total"
	MetricUpstreamConnected  = "nave_relay_upstream_connected"
	MetricUpstreamResponses  = "nave_relay_upstream_responses_total"
	MetricUpstreamNACKs      = "nave_relay_upstream_nacks_total"
	MetricReportedNACKs      = "nave_relay_reported_nacks_total"
	MetricStreams            = "nave_relay_streams"
	MetricUpstreamReconnects = "nave_relay_upstream_reconnects_total"
	MetricGateways           = "nave_relay_gateways"
	MetricGatewayUpstreams   = "nave_relay_gateway_upstreams_connected"
)

// Short type labels (package xdstype).
const (
	typeLDS   = xdstype.LDS
	typeRDS   = xdstype.RDS
	typeCDS   = xdstype.CDS
	typeEDS   = xdstype.EDS
	typeOther = xdstype.Other
)

func typeLabel(typeURL string) string { return xdstype.Label(typeURL) }

type metrics struct {
	nacks             *prometheus.CounterVec
	upstreamConnected prometheus.Gauge
	upstreamResponses *prometheus.CounterVec
	upstreamNACKs     *prometheus.CounterVec
	reportedNACKs     *prometheus.CounterVec
	streams           prometheus.Gauge
	reconnects        prometheus.Counter
	gateways          prometheus.Gauge
	gatewayUpstreams  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricNACKs,
			Help: "Responses the relay's local clients (gateways included) rejected, by type."}, []string{"type"}),
		upstreamConnected: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricUpstreamConnected,
			Help: "1 while the relay's stream to the hub for its node is open, else 0 (none is opened while no local client subscribes)."}),
		upstreamResponses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricUpstreamResponses,
			Help: "Responses received from the hub, on the node's stream and the gateways', by type."}, []string{"type"}),
		upstreamNACKs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricUpstreamNACKs,
			Help: "Responses from the hub the relay could not decode and rejected (the node's stream and the gateways'), by type."}, []string{"type"}),
		reportedNACKs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricReportedNACKs,
			Help: "Local clients' rejections the relay reported to the hub (as a NACK of the hub's last response), by type."}, []string{"type"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricStreams,
			Help: "Open local xDS streams (gateways' included)."}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricUpstreamReconnects,
			Help: "Upstream streams (the node's and the gateways') that ended and were retried."}),
		gateways: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricGateways,
			Help: "Gateways served a view of their own (an upstream stream in their name), those without a stream kept a while included."}),
		gatewayUpstreams: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricGatewayUpstreams,
			Help: "The relay's open streams to the hub in a gateway's name."}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.nacks, m.upstreamConnected, m.upstreamResponses, m.upstreamNACKs, m.reportedNACKs, m.streams, m.reconnects, m.gateways, m.gatewayUpstreams} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("relay: register metrics: %w", err)
	}
	return m, nil
}
