package adminapi

import (
	"net/netip"

	"github.com/navemesh/nave/registry"
)

// EndpointsInfo is what /debug/endpoints shows: the assignment a client in
// the given locality receives for every port of the service.
type EndpointsInfo struct {
	Service registry.ServiceKey `json:"service"`
	Client  registry.Locality   `json:"client"`
	// Network is the client's network ("": a client that names none).
	Network registry.Network `json:"network,omitempty"`
	Ports   []PortAssignment `json:"ports"`
}

// PortAssignment is one port's xDS target and assignment.
type PortAssignment struct {
	Port       registry.ServicePort `json:"port"`
	Target     string               `json:"target"`
	Assignment Assignment           `json:"assignment"`
}

// Assignment is the endpoint assignment of one service port as seen by
// clients of one locality group: the plain-data form of a
// ClusterLoadAssignment (xds.Assignment).
type Assignment struct {
	Service registry.ServiceKey `json:"service"`
	Port    int32               `json:"port"`
	// ClusterName is the ClusterLoadAssignment's cluster_name (the Cluster's EDS service name).
	ClusterName string `json:"clusterName"`
	// Client is the locality group the assignment was computed for (zero: no locality).
	Client registry.Locality `json:"client"`
	// Network is the client's network ("" for a client that names none: it
	// is handed every endpoint directly).
	Network registry.Network `json:"network,omitempty"`
	// Priorities are contiguous from 0; tiers without endpoints are skipped.
	Priorities []Priority `json:"priorities"`
	// Skipped lists the localities left out because none of their endpoints is healthy.
	Skipped []registry.Locality `json:"skipped,omitempty"`
	// Shadowed lists endpoints left out because another cluster names the same
	// address and port (overlapping pod networks): only one of them, the
	// healthiest, then the one of the lowest cluster ID, is handed out.
	Shadowed []Endpoint `json:"shadowed,omitempty"`
	// Unreachable lists the networks whose healthy endpoints the client is not
	// handed because the network has no gateway it could dial.
	Unreachable []UnreachableNetwork `json:"unreachable,omitempty"`
}

// Priority is one failover tier.
type Priority struct {
	Priority   uint32              `json:"priority"`
	Localities []LocalityEndpoints `json:"localities"`
}

// LocalityEndpoints are the endpoints of one locality within a priority.
type LocalityEndpoints struct {
	Locality registry.Locality `json:"locality"`
	// Weight is the number of healthy endpoints in the locality (always > 0).
	Weight    uint32     `json:"weight"`
	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is one address:port handed to clients.
type Endpoint struct {
	Cluster registry.ClusterID `json:"cluster,omitempty"`
	Address netip.Addr         `json:"address"`
	Port    int32              `json:"port"`
	// Weight is the endpoint's weight within its locality (1 for a plain
	// endpoint; for a gateway, the healthy endpoints it stands for).
	Weight uint32 `json:"weight"`
	// Health is what the endpoint tells clients: HEALTHY or DRAINING.
	Health string `json:"health"`
	// Gateway, when set, names the network whose gateway the address is,
	// handed out in place of that network's endpoints (Cluster is empty).
	Gateway registry.Network `json:"gateway,omitempty"`
}

// UnreachableNetwork is a network whose healthy endpoints a client cannot be
// handed: the network has no gateway that can be dialled.
type UnreachableNetwork struct {
	Network registry.Network `json:"network"`
	// Endpoints is how many healthy endpoints it holds for the service port.
	Endpoints uint32 `json:"endpoints"`
}
