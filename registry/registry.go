package registry

import (
	"cmp"
	"iter"
	"maps"
	"slices"
)

// Registry is the merged view of every cluster's shards. It is immutable:
// Apply returns a new Registry and leaves the old one valid, so readers may
// keep a Registry as long as they like without locks.
type Registry struct {
	version  uint64
	services map[ServiceKey]*Service
	clusters map[ClusterID]*clusterShards
}

// clusterShards is everything one cluster published. Treated as immutable.
type clusterShards struct {
	shards    map[ServiceKey]heldShard
	digest    Hash
	endpoints int
}

type heldShard struct {
	shard *Shard
	hash  Hash
}

// New returns an empty registry at version 0.
func New() *Registry {
	return &Registry{services: map[ServiceKey]*Service{}, clusters: map[ClusterID]*clusterShards{}}
}

// Version increases by one with every Apply that changed something.
func (r *Registry) Version() uint64 { return r.version }

// Service returns the merged service, or nil.
func (r *Registry) Service(k ServiceKey) *Service { return r.services[k] }

// Services returns every merged service, sorted by key.
func (r *Registry) Services() []*Service {
	out := slices.Collect(maps.Values(r.services))
	slices.SortFunc(out, func(a, b *Service) int { return a.Key.Compare(b.Key) })
	return out
}

// All yields every merged service, in no order (cheaper than Services).
func (r *Registry) All() iter.Seq[*Service] { return maps.Values(r.services) }

// Len is the number of merged services.
func (r *Registry) Len() int { return len(r.services) }

// ClusterSummary describes what one cluster contributes.
type ClusterSummary struct {
	Cluster   ClusterID `json:"cluster"`
	Services  int       `json:"services"`
	Endpoints int       `json:"endpoints"`
	Digest    Hash      `json:"digest"`
}

// Cluster summarizes what one cluster contributes (zero counts and ZeroHash for nothing).
func (r *Registry) Cluster(id ClusterID) ClusterSummary {
	c := r.clusters[id]
	if c == nil {
		return ClusterSummary{Cluster: id}
	}
	return ClusterSummary{Cluster: id, Services: len(c.shards), Endpoints: c.endpoints, Digest: c.digest}
}

// ClusterDigest is the digest of everything the cluster published (ZeroHash for nothing).
func (r *Registry) ClusterDigest(id ClusterID) Hash {
	if c := r.clusters[id]; c != nil {
		return c.digest
	}
	return ZeroHash
}

// ClusterShards returns the cluster's shards keyed by service. The map must not be modified.
func (r *Registry) ClusterShards(id ClusterID) map[ServiceKey]*Shard {
	c := r.clusters[id]
	if c == nil {
		return nil
	}
	out := make(map[ServiceKey]*Shard, len(c.shards))
	for k, h := range c.shards {
		out[k] = h.shard
	}
	return out
}

// Change is one cluster's update: shards to upsert and services to remove.
// With Replace, the upserts are the cluster's full state and every other
// service of the cluster is removed, except those named in Retain, which keep
// whatever shard they have. Shards must be valid and normalized.
type Change struct {
	Cluster ClusterID
	Replace bool
	Upserts []*Shard
	Removes []ServiceKey
	Retain  []ServiceKey
}

// Apply returns the registry with the change applied and what changed. An
// upsert equal to what is held changes nothing, so a full state that matches
// the held state yields an empty Diff (make-before-break).
func (r *Registry) Apply(c Change) (*Registry, Diff) {
	old := r.clusters[c.Cluster]
	next := &clusterShards{shards: map[ServiceKey]heldShard{}}
	if old != nil {
		next.digest, next.endpoints = old.digest, old.endpoints
		if !c.Replace {
			next.shards = maps.Clone(old.shards)
		} else {
			next.shards = make(map[ServiceKey]heldShard, len(c.Upserts))
		}
	}
	touched := map[ServiceKey]bool{}
	drop := func(k ServiceKey, h heldShard) {
		next.digest = next.digest.Xor(h.hash)
		next.endpoints -= len(h.shard.Endpoints)
		touched[k] = true
	}
	if c.Replace && old != nil {
		// Start from nothing: every held shard counts as dropped unless re-upserted
		// unchanged below, or retained.
		retain := make(map[ServiceKey]bool, len(c.Retain))
		for _, k := range c.Retain {
			retain[k] = true
		}
		for k, h := range old.shards {
			if retain[k] {
				next.shards[k] = h
				continue
			}
			drop(k, h)
		}
	}
	for _, k := range c.Removes {
		if h, ok := next.shards[k]; ok {
			delete(next.shards, k)
			drop(k, h)
		}
	}
	for _, s := range c.Upserts {
		h := heldShard{shard: s, hash: s.Hash()}
		if prev, ok := next.shards[s.Service]; ok {
			drop(s.Service, prev)
		}
		next.shards[s.Service] = h
		next.digest = next.digest.Xor(h.hash)
		next.endpoints += len(s.Endpoints)
		touched[s.Service] = true
	}

	out := &Registry{version: r.version + 1, services: r.services, clusters: r.clusters}
	var diff Diff
	for k := range touched {
		var before *Shard
		if old != nil {
			if h, ok := old.shards[k]; ok {
				before = h.shard
			}
		}
		var after *Shard
		if h, ok := next.shards[k]; ok {
			after = h.shard
		}
		if before.Equal(after) {
			continue
		}
		if diff.Services == nil {
			out.services = maps.Clone(r.services)
		}
		prev := r.services[k]
		svc := rebuild(k, prev, c.Cluster, after, out.version)
		if svc == nil {
			delete(out.services, k)
		} else {
			out.services[k] = svc
		}
		diff.Services = append(diff.Services, serviceDiff(prev, svc))
	}
	if diff.Services == nil {
		return r, Diff{Version: r.version}
	}
	out.clusters = maps.Clone(r.clusters)
	if len(next.shards) == 0 {
		delete(out.clusters, c.Cluster)
	} else {
		out.clusters[c.Cluster] = next
	}
	slices.SortFunc(diff.Services, func(a, b ServiceDiff) int { return a.Key.Compare(b.Key) })
	diff.Version = out.version
	return out, diff
}

// rebuild returns the service with cluster's shard replaced by s (nil removes it), or nil when no shard is left.
func rebuild(k ServiceKey, prev *Service, cluster ClusterID, s *Shard, version uint64) *Service {
	var shards []*Shard
	if prev != nil {
		shards = make([]*Shard, 0, len(prev.Shards)+1)
		for _, old := range prev.Shards {
			if old.Cluster != cluster {
				shards = append(shards, old)
			}
		}
	}
	if s != nil {
		shards = append(shards, s)
	}
	if len(shards) == 0 {
		return nil
	}
	slices.SortFunc(shards, func(a, b *Shard) int { return cmp.Compare(a.Cluster, b.Cluster) })
	svc := merge(k, shards)
	svc.Revision = version
	svc.ShapeRevision = version
	if prev != nil && prev.sameShape(svc) {
		svc.ShapeRevision = prev.ShapeRevision
	}
	return svc
}
