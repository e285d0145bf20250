// Package adminapi is the hub's admin API as its readers see it: the JSON
// of every /debug/* path, which the hub serves (hub/admin.go) and navectl
// and the dashboard (dashboard/ui/app.js) read.
//
//	/debug/hub        Coordination
//	/debug/clusters   []ClusterStatus
//	/debug/networks   []NetworkStatus
//	/debug/services   []ServiceInfo
//	/debug/endpoints  EndpointsInfo (?service=NS/NAME&region=R&zone=Z&network=N)
//	/debug/imports    ImportsInfo
//	/debug/topology   TopologyInfo
//	/debug/clients    ClientsInfo (?node=ID)
//	/debug/trace      TraceInfo (?service=NS/NAME&limit=N)
//	/debug/routes     []RoutesInfo, or RoutesInfo (?service=NS/NAME)
//
// It imports nothing of Nave but registry and traffic, so a client of the admin API
// links neither the hub nor gRPC. The hub's packages that produce this data
// (syncstatus, convergence, federation, xds) use these types as their own
// (type aliases), so the hub serves what they produce without converting it.
package adminapi

import (
	"time"

	"github.com/navemesh/nave/registry"
)

// Coordination is what /debug/hub shows of the replicas working together.
type Coordination struct {
	ID       string `json:"id"`
	Leader   string `json:"leader"`   // as this replica last saw it ("" unknown)
	IsLeader bool   `json:"isLeader"` // this replica leads
	Degraded string `json:"degraded"` // why persistence and leader duties pause ("" when etcd answers)
	Members  []Peer `json:"members"`  // replicas in the gossip group (just this one without --join)
	Snapshot Saved  `json:"snapshot"` // the last snapshot this replica saved or restored
	Restored int    `json:"restored"` // clusters still served from the snapshot
}

// Peer is one replica as gossip shows it.
type Peer struct {
	Name        string `json:"name"`
	Federation  string `json:"federation"`
	XDS         string `json:"xds"`
	Admin       string `json:"admin"`
	Self        bool   `json:"self,omitempty"`
	HomeOf      int    `json:"homeOf"`      // clusters whose spoke it serves
	Unconverged int    `json:"unconverged"` // clusters it holds at another stamp than this replica
}

// Saved describes a persisted snapshot.
type Saved struct {
	Revision uint64    `json:"revision"`
	At       time.Time `json:"at,omitzero"`
	Bytes    int       `json:"bytes,omitempty"`
	Clusters int       `json:"clusters"`
	Restored bool      `json:"restored,omitempty"` // loaded at start, not saved by this replica
}

// ClusterStatus is one cluster as /debug/clusters shows it.
type ClusterStatus struct {
	Cluster registry.ClusterID `json:"cluster"`
	Network registry.Network   `json:"network,omitempty"`
	// Gateways are the east-west gateways the cluster announced for its network.
	Gateways     []registry.Gateway `json:"gateways,omitempty"`
	Connected    bool               `json:"connected"`
	SpokeID      string             `json:"spokeID,omitempty"`
	Build        string             `json:"build,omitempty"`
	Remote       string             `json:"remote,omitempty"`
	Epoch        uint64             `json:"epoch"`
	Version      uint64             `json:"version"`
	Digest       registry.Hash      `json:"digest"`
	Services     int                `json:"services"`
	Endpoints    int                `json:"endpoints"`
	SessionStart time.Time          `json:"sessionStart,omitzero"`
	LastUpdate   time.Time          `json:"lastUpdate,omitzero"`
	LastSeen     time.Time          `json:"lastSeen,omitzero"`
	// Home is the replica whose spoke session serves the cluster ("" when none does).
	Home string `json:"home,omitempty"`
	// Origin is the replica the cluster's latest data came from.
	Origin string `json:"origin,omitempty"`
	// Restored: the data comes from the persisted snapshot and no live spoke has confirmed it yet.
	Restored bool `json:"restored,omitempty"`
	// LiveAt is when a live spoke last served the cluster at some replica:
	// as this replica saw it, or as the leader recorded it in the catalog
	// (which survives a restart); for a cluster neither has seen live, when
	// this replica first knew of it.
	LiveAt time.Time `json:"liveAt,omitzero"`
	// Stale: no live spoke at any replica for longer than the grace; the
	// endpoints are kept until the cluster's policy says otherwise.
	Stale bool `json:"stale,omitempty"`
	// Dropped: its drop policy removed the stale cluster's endpoints.
	Dropped bool `json:"dropped,omitempty"`
	// RefusedExports are the services (namespace/name) the export policy
	// refused of the cluster's live session at this replica, with the reasons.
	RefusedExports map[string]string `json:"refusedExports,omitempty"`
}

// DataAge is how old the cluster's data is: zero while a live spoke serves
// it, else the time since one last did.
func (c ClusterStatus) DataAge(now time.Time) time.Duration {
	if c.Home != "" || c.LiveAt.IsZero() {
		return 0
	}
	return now.Sub(c.LiveAt)
}

// NetworkStatus is one network as /debug/networks shows it.
type NetworkStatus struct {
	Network registry.Network `json:"network"`
	// Clusters are the clusters on the network.
	Clusters []registry.ClusterID `json:"clusters"`
	// Gateways are the gateways announced for it, with who announced each.
	Gateways []GatewayStatus `json:"gateways,omitempty"`
	// Reachable: another network's clients can be handed a gateway of this
	// one (an IP address). Without one, its endpoints reach only clients on
	// the network itself.
	Reachable bool `json:"reachable"`
	// Services and Endpoints count what the network's clusters export.
	Services  int `json:"services"`
	Endpoints int `json:"endpoints"`
}

// GatewayStatus is one announced gateway.
type GatewayStatus struct {
	registry.Gateway
	// Clusters announced it.
	Clusters []registry.ClusterID `json:"clusters"`
	// Resolved are the addresses a DNS name resolved to (handed to clients in its place).
	Resolved []string `json:"resolved,omitempty"`
	// Usable: clients can be handed it (an IP address, or a name that resolved).
	Usable bool `json:"usable"`
}

// ServiceInfo is one merged service as /debug/services shows it.
type ServiceInfo struct {
	Service   registry.ServiceKey    `json:"service"`
	Hostname  string                 `json:"hostname"`
	Clusters  []registry.ClusterID   `json:"clusters"`
	Ports     []registry.ServicePort `json:"ports"`
	Headless  bool                   `json:"headless,omitempty"`
	Healthy   int                    `json:"healthy"`
	Draining  int                    `json:"draining"`
	NotReady  int                    `json:"notReady"`
	Conflicts []registry.Conflict    `json:"conflicts,omitempty"`
	Revision  uint64                 `json:"revision"`
}

// TopologyInfo is what /debug/topology serves: every cluster's endpoints
// (of every service, each counted once per service) by locality and health.
type TopologyInfo struct {
	Localities []LocalityCount `json:"localities"`
}

// LocalityCount is one cluster's endpoints in one region and zone.
type LocalityCount struct {
	Region   string             `json:"region"`
	Zone     string             `json:"zone"`
	Cluster  registry.ClusterID `json:"cluster"`
	Healthy  int                `json:"healthy"`
	Draining int                `json:"draining"`
	NotReady int                `json:"notReady"`
}
