package registry

import (
	"cmp"
	"iter"
	"maps"
	"slices"

	"github.com/navemesh/nave/internal/pmap"
)

// Registry is the merged view of every cluster's shards. It is immutable:
// Apply returns a new Registry and leaves the old one valid, so readers may
// keep a Registry as long as they like without locks. Its maps are
// persistent (pmap): a new Registry shares all but what changed with the
// old, so an Apply costs what it changes, not what the registry holds.
type Registry struct {
	version  uint64
	services pmap.Map[ServiceKey, *Service]
	clusters pmap.Map[ClusterID, *clusterShards]
}

// clusterShards is everything one cluster published. Treated as immutable.
type clusterShards struct {
	shards    pmap.Map[ServiceKey, heldShard]
	digest    Hash
	endpoints int
}

type heldShard struct {
	shard *Shard
	hash  Hash
}

// New returns an empty registry at version 0.
func New() *Registry { return &Registry{} }

// Version increases by one with every Apply that changed something.
func (r *Registry) Version() uint64 { return r.version }

// Service returns the merged service, or nil.
func (r *Registry) Service(k ServiceKey) *Service {
	s, _ := r.services.Get(k)
	return s
}

// Services returns every merged service, sorted by key.
func (r *Registry) Services() []*Service {
	out := slices.AppendSeq(make([]*Service, 0, r.services.Len()), r.services.Values())
	slices.SortFunc(out, func(a, b *Service) int { return a.Key.Compare(b.Key) })
	return out
}

// All yields every merged service, in no order (cheaper than Services).
func (r *Registry) All() iter.Seq[*Service] { return r.services.Values() }

// Len is the number of merged services.
func (r *Registry) Len() int { return r.services.Len() }

// ClusterSummary describes what one cluster contributes.
type ClusterSummary struct {
	Cluster   ClusterID `json:"cluster"`
	Services  int       `json:"services"`
	Endpoints int       `json:"endpoints"`
	Digest    Hash      `json:"digest"`
}

// Cluster summarizes what one cluster contributes (zero counts and ZeroHash for nothing).
func (r *Registry) Cluster(id ClusterID) ClusterSummary {
	v := r.ClusterView(id)
	s := ClusterSummary{Cluster: id, Services: v.Len(), Digest: v.Digest()}
	if v.c != nil {
		s.Endpoints = v.c.endpoints
	}
	return s
}

// ClusterDigest is the digest of everything the cluster published (ZeroHash for nothing).
func (r *Registry) ClusterDigest(id ClusterID) Hash { return r.ClusterView(id).Digest() }

// ClusterShards returns the cluster's shards keyed by service, or nil for
// nothing. It builds the map: ClusterView reads the shards without copying.
// The map must not be modified.
func (r *Registry) ClusterShards(id ClusterID) map[ServiceKey]*Shard {
	v := r.ClusterView(id)
	if v.c == nil {
		return nil
	}
	out := make(map[ServiceKey]*Shard, v.Len())
	maps.Insert(out, v.All())
	return out
}

// ClusterView is one cluster's shards in one registry version: immutable,
// cheap to take. The zero value is an empty cluster.
type ClusterView struct{ c *clusterShards }

// ClusterView returns the view of the cluster's shards, in O(1).
func (r *Registry) ClusterView(id ClusterID) ClusterView {
	c, _ := r.clusters.Get(id)
	return ClusterView{c}
}

// Len is the number of services the cluster exports.
func (v ClusterView) Len() int {
	if v.c == nil {
		return 0
	}
	return v.c.shards.Len()
}

// Get returns the cluster's shard of the service.
func (v ClusterView) Get(k ServiceKey) (*Shard, bool) {
	if v.c == nil {
		return nil, false
	}
	h, ok := v.c.shards.Get(k)
	return h.shard, ok
}

// All yields every shard of the cluster by service, in no order.
func (v ClusterView) All() iter.Seq2[ServiceKey, *Shard] {
	return func(yield func(ServiceKey, *Shard) bool) {
		if v.c == nil {
			return
		}
		for k, h := range v.c.shards.All() {
			if !yield(k, h.shard) {
				return
			}
		}
	}
}

// Digest is the digest of the cluster's shards (ZeroHash for nothing).
func (v ClusterView) Digest() Hash {
	if v.c == nil {
		return ZeroHash
	}
	return v.c.digest
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
	old := r.ClusterView(c.Cluster)
	var next clusterShards
	if old.c != nil {
		next = *old.c
	}
	held := next.shards
	if c.Replace {
		// Start from nothing: every held shard counts as dropped unless re-upserted
		// unchanged below, or retained.
		next.shards = pmap.Map[ServiceKey, heldShard]{}
	}
	shards := next.shards.Builder()
	touched := map[ServiceKey]bool{}
	drop := func(k ServiceKey, h heldShard) {
		next.digest = next.digest.Xor(h.hash)
		next.endpoints -= len(h.shard.Endpoints)
		touched[k] = true
	}
	if c.Replace {
		retain := make(map[ServiceKey]bool, len(c.Retain))
		for _, k := range c.Retain {
			retain[k] = true
		}
		for k, h := range held.All() {
			if retain[k] {
				shards.Set(k, h)
				continue
			}
			drop(k, h)
		}
	}
	for _, k := range c.Removes {
		if h, ok := shards.Delete(k); ok {
			drop(k, h)
		}
	}
	for _, s := range c.Upserts {
		h := heldShard{shard: s, hash: s.Hash()}
		if same, ok := held.Get(s.Service); ok && same.hash == h.hash && same.shard.Equal(s) {
			// The held shard stays, not an equal copy: what others keep by
			// its pointer (the snapshot's compressed blocks) survives a full
			// state that changes nothing.
			h = same
		}
		if prev, ok := shards.Set(s.Service, h); ok {
			drop(s.Service, prev)
		}
		next.digest = next.digest.Xor(h.hash)
		next.endpoints += len(s.Endpoints)
		touched[s.Service] = true
	}

	out := &Registry{version: r.version + 1, clusters: r.clusters}
	services := r.services.Builder()
	var diff Diff
	for k := range touched {
		before, _ := old.Get(k)
		h, _ := shards.Get(k)
		if before.Equal(h.shard) {
			continue
		}
		prev := r.Service(k)
		svc := rebuild(k, prev, c.Cluster, h.shard, out.version)
		if svc == nil {
			services.Delete(k)
		} else {
			services.Set(k, svc)
		}
		diff.Services = append(diff.Services, serviceDiff(prev, svc))
	}
	if diff.Services == nil {
		return r, Diff{Version: r.version}
	}
	out.services = services.Map()
	if next.shards = shards.Map(); next.shards.Len() == 0 {
		out.clusters = r.clusters.Delete(c.Cluster)
	} else {
		out.clusters = r.clusters.Set(c.Cluster, &next)
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
