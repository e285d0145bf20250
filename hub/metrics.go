package hub

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// Metric names of the hub and its federation server.
const (
	metricClustersConnected = "nave_hub_clusters_connected"
	metricClusterServices   = "nave_hub_cluster_services"
	metricClusterEndpoints  = "nave_hub_cluster_endpoints"
	metricServices          = "nave_hub_services"
	metricRegistryVersion   = "nave_hub_registry_version"
	metricUpdates           = "nave_federation_updates_total"
	metricResyncs           = "nave_federation_resyncs_total"
)

type metrics struct {
	connected        prometheus.Gauge
	clusterServices  *prometheus.GaugeVec
	clusterEndpoints *prometheus.GaugeVec
	services         prometheus.Gauge
	version          prometheus.Gauge
	updates          *prometheus.CounterVec
	resyncs          *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: metricClustersConnected,
			Help: "Clusters whose spoke has a live session with this hub."}),
		clusterServices: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricClusterServices,
			Help: "Services a cluster publishes."}, []string{"cluster"}),
		clusterEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricClusterEndpoints,
			Help: "Endpoints a cluster publishes (all conditions)."}, []string{"cluster"}),
		services: prometheus.NewGauge(prometheus.GaugeOpts{Name: metricServices,
			Help: "Merged services in the registry."}),
		version: prometheus.NewGauge(prometheus.GaugeOpts{Name: metricRegistryVersion,
			Help: "Version of the merged registry; increases with every change."}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricUpdates,
			Help: "Spoke updates by cluster, kind (full, delta) and result (ack, nack, error)."}, []string{"cluster", "kind", "result"}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricResyncs,
			Help: "Resyncs the hub asked spokes for, by cluster and reason."}, []string{"cluster", "reason"}),
	}
	reg.MustRegister(m.connected, m.clusterServices, m.clusterEndpoints, m.services, m.version, m.updates, m.resyncs)
	return m
}

// observe updates the gauges from a new view (called on the state goroutine; cheap).
func (m *metrics) observe(v View) {
	connected := 0
	for id, c := range v.Clusters {
		if c.Connected {
			connected++
		}
		m.clusterServices.WithLabelValues(string(id)).Set(float64(c.Services))
		m.clusterEndpoints.WithLabelValues(string(id)).Set(float64(c.Endpoints))
	}
	m.connected.Set(float64(connected))
	m.services.Set(float64(v.Registry.Len()))
	m.version.Set(float64(v.Registry.Version()))
}

func (m *metrics) federationHooks() federation.HubMetrics {
	return federation.HubMetrics{
		Update: func(c registry.ClusterID, full bool, result string) {
			kind := "delta"
			if full {
				kind = "full"
			}
			m.updates.WithLabelValues(string(c), kind, result).Inc()
		},
		Resync: func(c registry.ClusterID, reason string) { m.resyncs.WithLabelValues(string(c), reason).Inc() },
	}
}
