package xds

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/navemesh/nave/internal/xdstype"
)

// Metric names. Every xDS metric has the type label ("lds", "rds", "cds",
// "eds" or "other") where it says "by type".
const (
	// MetricConnectedClients is the number of open xDS streams (gauge).
	MetricConnectedClients = "nave_xds_connected_clients"
	// MetricResponses counts DiscoveryResponses sent, by type.
	MetricResponses = "nave_xds_responses_total"
	// MetricNACKs counts requests that rejected our last response, by type.
	MetricNACKs = "nave_xds_nacks_total"
	// MetricPushLatency is the time from Update being called to a response carrying
	// that change being sent, by type (best effort: pushes only, not replies to new requests).
	MetricPushLatency = "nave_xds_push_latency_seconds"
	// MetricInvalidResources counts generated resources that failed validation and were not published, by type.
	MetricInvalidResources = "nave_xds_invalid_resources_total"
	// MetricResourceUpdates counts resources published (added, changed or removed) in the caches, by type.
	MetricResourceUpdates = "nave_xds_resource_updates_total"
	// MetricUpdateDuration is how long Update took to translate and publish one registry change.
	MetricUpdateDuration = "nave_xds_update_duration_seconds"
	// MetricLocalityGroups is the number of locality groups with their own EDS cache.
	MetricLocalityGroups = "nave_xds_locality_groups"
	// MetricRefusedRequests counts requests refused (their stream ended), by reason.
	MetricRefusedRequests = "nave_xds_refused_requests_total"
	// MetricDeniedResources counts resource names clients asked for that their identity may not receive, by type ("*": a wildcard request).
	MetricDeniedResources = "nave_xds_denied_resources_total"
	// MetricThrottledRequests counts requests that waited for their stream's request rate.
	MetricThrottledRequests = "nave_xds_throttled_requests_total"
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
	connected      prometheus.Gauge
	responses      *prometheus.CounterVec
	nacks          *prometheus.CounterVec
	pushLatency    *prometheus.HistogramVec
	invalid        *prometheus.CounterVec
	updates        *prometheus.CounterVec
	updateDuration prometheus.Histogram
	groups         prometheus.Gauge
	refused        *prometheus.CounterVec
	denied         *prometheus.CounterVec
	throttled      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricConnectedClients, Help: "Open xDS streams.",
		}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricResponses, Help: "xDS responses sent, by type.",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricNACKs, Help: "xDS requests that rejected the previous response, by type.",
		}, []string{"type"}),
		pushLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MetricPushLatency, Help: "Time from a registry update to the xDS response carrying it, by type.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18), // 50µs .. ~6.5s
		}, []string{"type"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricInvalidResources, Help: "Generated xDS resources that failed validation and were not published, by type.",
		}, []string{"type"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricResourceUpdates, Help: "xDS resources added, changed or removed in the caches, by type.",
		}, []string{"type"}),
		updateDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricUpdateDuration, Help: "Time to translate and publish one registry change.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 20), // 10µs .. ~5s
		}),
		groups: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricLocalityGroups, Help: "Locality groups with their own EDS cache.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRefusedRequests, Help: "xDS requests refused and their streams ended, by reason (too_many_names, metadata_too_large, node_field_too_large).",
		}, []string{"reason"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricDeniedResources, Help: "Resources clients asked for that their identity may not receive (they get nothing of them), by type.",
		}, []string{"type"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricThrottledRequests, Help: "xDS requests that waited for their stream's request rate (the client was slowed, not refused).",
		}),
	}
	for _, r := range []string{reasonTooManyNames, reasonMetadataTooLarge, reasonNodeFieldTooLarge} {
		m.refused.WithLabelValues(r)
	}
	for _, t := range []string{typeLDS, typeRDS, typeCDS, typeEDS} {
		// Pre-create the series so dashboards show zeros rather than gaps.
		m.responses.WithLabelValues(t)
		m.nacks.WithLabelValues(t)
		m.invalid.WithLabelValues(t)
		m.updates.WithLabelValues(t)
		m.denied.WithLabelValues(t)
	}
	if reg != nil {
		reg.MustRegister(m.connected, m.responses, m.nacks, m.pushLatency, m.invalid, m.updates, m.updateDuration, m.groups, m.refused, m.denied, m.throttled)
	}
	return m
}
