package hub

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/replicas"
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
	metricClusterStale      = "nave_hub_cluster_stale"
	metricClusterRestored   = "nave_hub_cluster_restored"
	metricClusterDataAge    = "nave_hub_cluster_data_age_seconds"
	metricLeader            = "nave_hub_leader"
	metricEtcdUp            = "nave_hub_etcd_up"
	metricMembers           = "nave_hub_members"
	metricSnapshotRevision  = "nave_hub_snapshot_revision"
	metricSnapshotBytes     = "nave_hub_snapshot_bytes"
	metricSnapshotSeconds   = "nave_hub_snapshot_save_seconds"
	metricReplication       = "nave_hub_replication_updates_total"
	metricNetworkGateways   = "nave_hub_network_gateways"
	metricTLSRefused        = "nave_tls_refused_handshakes_total"
	metricLimitsRefused     = "nave_refused_total"
	metricThrottled         = "nave_federation_throttled_updates_total"
	metricXDSWithheld       = "nave_hub_xds_withheld"
)

type metrics struct {
	connected        prometheus.Gauge
	clusterServices  *prometheus.GaugeVec
	clusterEndpoints *prometheus.GaugeVec
	services         prometheus.Gauge
	version          prometheus.Gauge
	updates          *prometheus.CounterVec
	resyncs          *prometheus.CounterVec

	clusterStale, clusterRestored, clusterDataAge *prometheus.GaugeVec
	leader, etcdUp, members                       prometheus.Gauge
	snapshotRevision, snapshotBytes               prometheus.Gauge
	snapshotSeconds                               prometheus.Histogram
	replication                                   *prometheus.CounterVec
	// networkGateways, and the networks it has series of (owned by observe's caller: the state goroutine).
	networkGateways *prometheus.GaugeVec
	networks        map[registry.Network]bool
	tlsRefused      *prometheus.CounterVec
	limitsRefused   *prometheus.CounterVec
	throttled       *prometheus.CounterVec
	xdsWithheld     *prometheus.GaugeVec
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
	perCluster := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"cluster"})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m.clusterStale = perCluster(metricClusterStale, "1 while no replica has had a live spoke of the cluster for longer than the grace (its endpoints are kept until its policy says otherwise).")
	m.clusterRestored = perCluster(metricClusterRestored, "1 while the cluster's data comes from the persisted snapshot, not yet confirmed by a live spoke.")
	m.clusterDataAge = perCluster(metricClusterDataAge, "Seconds since a live spoke last served the cluster (0 while one does).")
	m.leader = gauge(metricLeader, "1 while this replica is the leader (persists snapshots, drops dead clusters).")
	m.etcdUp = gauge(metricEtcdUp, "1 while etcd answers; 0 means degraded: persistence, leader duties and new spoke sessions pause.")
	m.members = gauge(metricMembers, "Hub replicas in the gossip group, this one included.")
	m.snapshotRevision = gauge(metricSnapshotRevision, "Revision of the last snapshot this replica saved or restored.")
	m.snapshotBytes = gauge(metricSnapshotBytes, "Size of the last snapshot this replica saved.")
	m.snapshotSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricSnapshotSeconds,
		Help:    "Time the leader took to save a snapshot (encode and write); the next save waits at least ten times as long.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)})
	m.replication = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricReplication,
		Help: "Hub-to-hub replication: updates sent (by kind), received (by result: applied, partly_refused (without what the export policy refuses), stale, mismatch, dropped, error) and resyncs asked (by reason)."}, []string{"direction", "result"})
	m.networkGateways = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricNetworkGateways,
		Help: "Gateway addresses clients on other networks can be handed, per network a cluster names; 0: the network's endpoints reach no other network."}, []string{"network"})
	m.networks = map[registry.Network]bool{}
	m.tlsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricTLSRefused,
		Help: "Client certificates refused at the TLS handshake, by port (federation, xds) and reason (expired, untrusted, revoked, no_identity, foreign_trust_domain, no_client_certificate, invalid)."}, []string{"port", "reason"})
	m.limitsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricLimitsRefused,
		Help: "Connections and streams refused by a limit, by port (federation, xds) and reason (max_connections, max_connections_per_peer, max_streams_per_peer, no_first_message)."}, []string{"port", "reason"})
	m.throttled = prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricThrottled,
		Help: "Updates of a cluster that waited for its update rate (the spoke was slowed, not refused)."}, []string{"cluster"})
	m.xdsWithheld = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricXDSWithheld,
		Help: "1 while this replica withholds xDS, by reason: catalog (etcd has not answered the read of the cluster catalog), snapshot (nor the restore of the persisted registry), clusters (a cold start waits for clusters the catalog names). /readyz says the same."}, []string{"reason"})
	m.etcdUp.Set(1)
	m.members.Set(1)
	reg.MustRegister(m.connected, m.clusterServices, m.clusterEndpoints, m.services, m.version, m.updates, m.resyncs,
		m.clusterStale, m.clusterRestored, m.clusterDataAge, m.leader, m.etcdUp, m.members, m.snapshotRevision, m.snapshotBytes, m.snapshotSeconds, m.replication,
		m.networkGateways, m.tlsRefused, m.limitsRefused, m.throttled, m.xdsWithheld)
	return m
}

// observe updates the gauges from a new view (called on the state goroutine; cheap).
func (m *metrics) observe(v View, now time.Time) {
	connected := 0
	for id, c := range v.Clusters {
		if c.Connected {
			connected++
		}
		if c.Dropped {
			m.forget(id) // its policy removed it: no series of it lingers
			continue
		}
		m.clusterServices.WithLabelValues(string(id)).Set(float64(c.Services))
		m.clusterEndpoints.WithLabelValues(string(id)).Set(float64(c.Endpoints))
		m.clusterStale.WithLabelValues(string(id)).Set(b2f(c.Stale))
		m.clusterRestored.WithLabelValues(string(id)).Set(b2f(c.Restored))
		m.clusterDataAge.WithLabelValues(string(id)).Set(c.DataAge(now).Seconds())
	}
	m.connected.Set(float64(connected))
	m.services.Set(float64(v.Registry.Len()))
	m.version.Set(float64(v.Registry.Version()))
	m.observeNetworks(v.Topology)
}

// observeNetworks sets each network's usable gateways (IP addresses, a
// name's included once resolved), and drops the series of networks gone.
func (m *metrics) observeNetworks(t registry.Networks) {
	now := map[registry.Network]bool{}
	for _, n := range t.Clusters {
		now[n] = true
	}
	for n := range m.networks {
		if !now[n] {
			m.networkGateways.DeleteLabelValues(string(n))
		}
	}
	for n := range now {
		usable := 0
		for _, g := range t.Gateways[n] {
			if _, ip := g.IP(); ip {
				usable++
			}
		}
		m.networkGateways.WithLabelValues(string(n)).Set(float64(usable))
	}
	m.networks = now
}

// forget deletes every series of a cluster.
func (m *metrics) forget(id registry.ClusterID) {
	for _, g := range []*prometheus.GaugeVec{m.clusterServices, m.clusterEndpoints, m.clusterStale, m.clusterRestored, m.clusterDataAge} {
		g.DeleteLabelValues(string(id))
	}
	for _, c := range []*prometheus.CounterVec{m.updates, m.resyncs, m.throttled} {
		c.DeletePartialMatch(prometheus.Labels{"cluster": string(id)})
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
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
		Resync:    func(c registry.ClusterID, reason string) { m.resyncs.WithLabelValues(string(c), reason).Inc() },
		Throttled: func(c registry.ClusterID) { m.throttled.WithLabelValues(string(c)).Inc() },
	}
}

func (m *metrics) replicationHooks() replicas.ReplicationHooks {
	return replicas.ReplicationHooks{
		Sent:    func(_ registry.ClusterID, kind string) { m.replication.WithLabelValues("sent", kind).Inc() },
		Applied: func(_ registry.ClusterID, result string) { m.replication.WithLabelValues("received", result).Inc() },
		Resync:  func(_ registry.ClusterID, reason string) { m.replication.WithLabelValues("resync", reason).Inc() },
	}
}
