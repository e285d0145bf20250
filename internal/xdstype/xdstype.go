// Package xdstype names xDS resource types the short way Nave's metrics
// and logs label them, and holds the node metadata keys Nave reads (shared
// by the hub and the node agent, which links nothing of the hub).
package xdstype

import (
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

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

// MetadataGateway names a gateway's role (NAVE_GATEWAY): a node that has it
// is an Envoy gateway, served listeners of its own (package gateways).
const MetadataGateway = "NAVE_GATEWAY"

// WireName reads a resource's name from its encoding without decoding the
// rest: it is field 1 (a string) of each type Nave serves (Listener,
// RouteConfiguration and Cluster's name, ClusterLoadAssignment's
// cluster_name). The last occurrence wins, as in a full decode.
func WireName(b []byte) (string, error) {
	name := ""
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "", protowire.ParseError(n)
			}
			name, b = string(v), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
	}
	return name, nil
}
