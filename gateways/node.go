// Package gateways builds the Envoy configuration Nave serves to gateways:
// an east-west gateway's TLS-passthrough and HTTP/2 listeners into its
// network, and an ingress gateway's listeners for the services it exposes.
// A gateway is an Envoy node whose metadata names its role, network and
// what it exposes (see Node); its endpoints follow its locality like any
// client's.
package gateways

// The node metadata a gateway sets (the agent, `nave gateway`, writes them
// into Envoy's bootstrap).
const (
	// MetadataRole is the gateway's role: RoleEastWest or RoleIngress.
	MetadataRole = "NAVE_GATEWAY"
	// MetadataNetwork and MetadataCluster are the gateway's network and
	// cluster (as any client names them: xds.MetadataNetwork, xds.MetadataCluster).
	MetadataNetwork = "NETWORK"
	MetadataCluster = "CLUSTER_ID"
	// MetadataExposeNamespaces (ingress) is a comma-separated list of the
	// namespaces whose services the gateway exposes ("*": every namespace).
	MetadataExposeNamespaces = "NAVE_EXPOSE_NAMESPACES"
	// MetadataExposeSelector (ingress) is a label selector ("k=v,k2=v2")
	// the exposed services' exported labels must match.
	MetadataExposeSelector = "NAVE_EXPOSE_SELECTOR"
	// MetadataListeners (ingress) lists the gateway's listeners, comma
	// separated, each PORT/MODE where MODE is http (plaintext HTTP/1.1 and
	// HTTP/2), https:SECRET (TLS terminated with the certificate that the
	// SDS secret SECRET holds) or passthrough (TLS routed by SNI to the
	// service it names, untouched). Default: 8080/http.
	MetadataListeners = "NAVE_INGRESS_LISTENERS"
)

// Roles a gateway can have.
const (
	RoleEastWest = "east-west"
	RoleIngress  = "ingress"
)

// Default ports of an east-west gateway's listeners.
const (
	// EastWestTLSPort takes TLS from other networks and routes it by SNI
	// (outbound_.PORT_._.HOSTNAME, Istio's convention) without terminating it.
	EastWestTLSPort = 15443
	// EastWestHTTP2Port takes plaintext HTTP/2 (gRPC) from other networks and
	// routes it by :authority (HOSTNAME:PORT).
	EastWestHTTP2Port = 15444
)
