package adminapi

import (
	"time"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// RoutesInfo is the traffic of one service as its clients get it: what
// /debug/routes?service=NS/NAME serves (/debug/routes: []RoutesInfo, every
// service with routes or a policy, sorted). It names where each part came
// from: every cluster's routes and policy are merged (registry's
// mergeTraffic), each route from the oldest export that has it, the policy
// from the oldest export that has one. Durations are in nanoseconds, as
// package traffic encodes them.
type RoutesInfo struct {
	Service registry.ServiceKey `json:"service"`
	// RouteCount counts the merged routes, each once whatever ports it attaches to.
	RouteCount int `json:"routeCount"`
	// Ports are the service's ports that clients resolve (TCP), each with
	// the routes attached to it.
	Ports []PortRoutes `json:"ports"`
	// Unattached are routes whose port is none of those: no client gets them.
	Unattached []RouteInfo `json:"unattached,omitempty"`
	// Policy is the TrafficPolicy that wins (nil: none, the clients'
	// defaults), PolicyCluster the cluster it came from.
	Policy        *traffic.Policy    `json:"policy,omitempty"`
	PolicyCluster registry.ClusterID `json:"policyCluster,omitempty"`
	// Conflicts are the service's RouteConflicts and PolicyConflicts: a
	// cluster's route or policy that lost to another cluster's.
	Conflicts []registry.Conflict `json:"conflicts,omitempty"`
	// Exports are what each exporting cluster exported, oldest export
	// first (the order the hub merges them in).
	Exports []TrafficExport `json:"exports"`
}

// PortRoutes is one service port and the routes attached to it.
type PortRoutes struct {
	Port registry.ServicePort `json:"port"`
	// Target is what a gRPC client dials (xds:///host:port).
	Target string `json:"target"`
	// Routes are the routes attached to the port (the port's own, and
	// those of every port), by kind and name. None: every request goes to
	// the port's own endpoints.
	Routes []RouteInfo `json:"routes,omitempty"`
	// Invalid, when set, says why the port's routes make a resource the
	// hub does not publish: clients get the port as if no route attached.
	Invalid string `json:"invalid,omitempty"`
}

// RouteInfo is one merged GRPCRoute or HTTPRoute.
type RouteInfo struct {
	Kind traffic.RouteKind `json:"kind"`
	Name string            `json:"name"`
	// Cluster is the oldest export that has the route: its form is the one clients get.
	Cluster registry.ClusterID `json:"cluster"`
	// CreatedAt is its oldest creation among the clusters that export it
	// alike: it orders routes whose rules match alike.
	CreatedAt time.Time `json:"createdAt,omitzero"`
	// Port is the service port the route attaches to (0: every port).
	Port  int32      `json:"port,omitempty"`
	Rules []RuleInfo `json:"rules"`
}

// RuleInfo is one rule of a route (traffic.Rule), its backends resolved
// for the port.
type RuleInfo struct {
	// Matches are ORed; none matches every request.
	Matches []traffic.Match `json:"matches,omitempty"`
	// Backends share the rule's requests by weight. Without one of weight
	// above 0, the rule fails its requests (gRPC: UNAVAILABLE).
	Backends []BackendInfo `json:"backends,omitempty"`
	// Timeout and Retry are the rule's own (0, nil: the policy's, if any).
	Timeout    time.Duration    `json:"timeout,omitempty"`
	Retry      *traffic.Retry   `json:"retry,omitempty"`
	SetHeaders []traffic.Header `json:"setHeaders,omitempty"`
}

// BackendInfo is one backendRef of a rule.
type BackendInfo struct {
	Kind traffic.BackendKind `json:"kind"`
	Name string              `json:"name"`
	// Port is the backend's service port (a ServiceImport's 0 resolved
	// to the port the request came to).
	Port   int32 `json:"port"`
	Weight int32 `json:"weight"`
	// XDSCluster is the xDS Cluster the requests go to.
	XDSCluster string `json:"xdsCluster"`
	// Exported: a cluster exports the service port. Otherwise its Cluster
	// is a placeholder with no endpoints, and its requests fail
	// UNAVAILABLE.
	Exported bool `json:"exported"`
	// Clusters are the clusters that export the service port. A Service
	// backend is the client's own cluster's endpoints: a client of another
	// cluster gets none.
	Clusters []registry.ClusterID `json:"clusters,omitempty"`
}

// TrafficExport is what one cluster exported of a service's traffic.
type TrafficExport struct {
	Cluster    registry.ClusterID `json:"cluster"`
	ExportedAt time.Time          `json:"exportedAt"`
	Routes     []RouteName        `json:"routes,omitempty"`
	// Policy names its TrafficPolicy ("": none).
	Policy string `json:"policy,omitempty"`
}

// RouteName names a route.
type RouteName struct {
	Kind traffic.RouteKind `json:"kind"`
	Name string            `json:"name"`
}

// ErrorInfo is the JSON of an error /debug/routes answers: 400 for a
// malformed service, 404 for one no cluster exports.
type ErrorInfo struct {
	Error string `json:"error"`
}
