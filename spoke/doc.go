// Package spoke is the spoke process: sources of a cluster's Services and
// EndpointSlices, shard building, and the session that streams shards to the hub.
package spoke
