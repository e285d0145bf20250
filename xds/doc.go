// Package xds translates Nave's merged registry into xDS resources and serves
// them, over go-control-plane, to proxyless gRPC clients and Envoy.
//
// Every TCP port of a merged service becomes an API Listener named
// <name>.<ns>.svc.clusterset.local:<port> (what follows xds:/// in a gRPC
// target), a RouteConfiguration of the same name, an EDS Cluster
// outbound|<port>||<hostname> and a ClusterLoadAssignment of that name.
// Listeners, routes and clusters are the same for every client; endpoint
// assignments depend on the client's locality group (its node's region and
// zone): see Assign.
//
// Translation (Assign, Listener, RouteConfiguration, Cluster,
// ClusterLoadAssignment, Translate) is pure. Server holds the caches: every
// resource is versioned on its own, so an endpoint change resends only the
// assignments it changed, over state-of-the-world or delta xDS. Nothing is
// published before it passes Validate: a client NACKs an invalid resource and
// the cache would resend it forever.
package xds
