package adminapi

import (
	"time"

	"github.com/navemesh/nave/registry"
)

// ImportsInfo is what /debug/imports shows: every import of the clusterset,
// and how far each spoke session of this replica has taken them.
type ImportsInfo struct {
	// Authoritative: the hub holds every cluster it knows of (spokes may delete what it does not name).
	Authoritative bool           `json:"authoritative"`
	CIDRs         []string       `json:"clustersetCIDRs,omitempty"`
	Imports       []ImportInfo   `json:"imports"`
	Sessions      []ImportStatus `json:"sessions"`
}

// ImportInfo is one import as /debug/imports shows it.
type ImportInfo struct {
	Service  registry.ServiceKey    `json:"service"`
	Type     string                 `json:"type"`
	IPs      []string               `json:"ips,omitempty"`
	Ports    []registry.ServicePort `json:"ports"`
	Sources  []ImportSourceInfo     `json:"sources"`
	Revision string                 `json:"hash"`
	// Skipped are endpoint addresses left out ("cluster address: reason"): loopback, link-local, ...
	Skipped []string `json:"skipped,omitempty"`
}

// ImportSourceInfo is one source cluster of an import.
type ImportSourceInfo struct {
	Cluster   registry.ClusterID `json:"cluster"`
	Stale     bool               `json:"stale,omitempty"`
	Endpoints int                `json:"endpoints"`
	Ready     int                `json:"ready"`
}

// ImportStatus is where one spoke session's import stream stands
// (federation.ImportStatus).
type ImportStatus struct {
	Cluster    registry.ClusterID `json:"cluster"`
	Epoch      uint64             `json:"epoch"`
	Namespaces int                `json:"namespaces"`
	// Imports is how many imports the cluster should hold (of its namespaces).
	Imports int `json:"imports"`
	// Acked is how many the spoke has acknowledged as they are now; Pending
	// how many differ from what it acknowledged (sent or not yet sent).
	Acked   int `json:"acked"`
	Pending int `json:"pending"`
	// PendingServices names the first of them, sorted.
	PendingServices []string `json:"pendingServices,omitempty"`
	// NamespaceNames are the cluster's namespaces.
	NamespaceNames []string `json:"namespaceNames,omitempty"`
	// SentVersion, AckedVersion and WrittenVersion: the last update sent,
	// the last the spoke acknowledged, and the last it has written into its cluster.
	SentVersion    uint64 `json:"sentVersion"`
	AckedVersion   uint64 `json:"ackedVersion"`
	WrittenVersion uint64 `json:"writtenVersion"`
	// Authoritative: the spoke holds an authoritative full state (it may delete what the hub does not name).
	Authoritative bool `json:"authoritative"`
	// Refused names the services whose current form the spoke refused, with its reasons.
	Refused map[string]string `json:"refused,omitempty"`
	// Blocked are the imports the spoke's cluster cannot hold because an
	// object that is not Nave's holds a name they need (the first, by
	// service); BlockedCount is how many there are in all.
	Blocked      []ImportProblem `json:"blocked,omitempty"`
	BlockedCount int             `json:"blockedCount,omitempty"`
	UpdatedAt    time.Time       `json:"updatedAt"`
}

// Written says whether the spoke has written everything it acknowledged
// and acknowledged everything the cluster should hold, none of it blocked.
func (s ImportStatus) Written() bool {
	return s.Pending == 0 && len(s.Refused) == 0 && s.BlockedCount == 0 && s.WrittenVersion >= s.AckedVersion && s.AckedVersion > 0
}

// ImportProblem is an import the spoke's cluster cannot hold as the hub
// sent it (federation.ImportProblem).
type ImportProblem struct {
	Service registry.ServiceKey `json:"service"`
	// Reason is a CamelCase word (BlockedByServiceImport, BlockedByService,
	// BlockedByEndpointSlice).
	Reason string `json:"reason"`
	// Message names the object in the way, for operators.
	Message string `json:"message,omitempty"`
}
