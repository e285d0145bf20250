// Package xdstype names xDS resource types the short way Nave's metrics
// and logs label them, and holds the node metadata keys Nave reads (shared
// by the hub and the node agent, which links nothing of the hub).
package xdstype

import "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

// Labels of the types Nave serves, and of any other.
const (
	LDS   = "lds"
	RDS   = "rds"
	CDS   = "cds"
	EDS   = "eds"
	Other = "other"
)

// Label is the short label of a type URL.
func Label(typeURL string) string {
	switch typeURL {
	case resource.ListenerType:
		return LDS
	case resource.RouteType:
		return RDS
	case resource.ClusterType:
		return CDS
	case resource.EndpointType:
		return EDS
	default:
		return Other
	}
}

// Node metadata keys: the network a node is on (NETWORK), else the cluster
// it runs in (CLUSTER_ID), whose network the hub knows.
const (
	MetadataNetwork = "NETWORK"
	MetadataCluster = "CLUSTER_ID"
)
