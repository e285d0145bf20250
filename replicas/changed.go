package replicas

import (
	"iter"
	"maps"

	"github.com/navemesh/nave/registry"
)

// Shards is one cluster's shards as a replica holds them: immutable.
// registry.ClusterView is one, ShardMap another.
type Shards interface {
	Len() int
	Get(registry.ServiceKey) (*registry.Shard, bool)
	All() iter.Seq2[registry.ServiceKey, *registry.Shard] // in no order
}

// ShardMap is Shards held in a map (which must not change once held).
type ShardMap map[registry.ServiceKey]*registry.Shard

func (m ShardMap) Len() int { return len(m) }

func (m ShardMap) Get(k registry.ServiceKey) (*registry.Shard, bool) {
	s, ok := m[k]
	return s, ok
}

func (m ShardMap) All() iter.Seq2[registry.ServiceKey, *registry.Shard] { return maps.All(m) }

// Changed says which services of a cluster changed from one stamp to the
// next, and links to what changed before: a subscriber holding the cluster
// at an earlier stamp is sent just those services. A change may keep the
// stamp (the export policy's enforcement, a peer's full state at the held
// stamp): a link From a stamp To the same one, which Since counts too. The chain is cut after
// maxChangedLinks links, or once it names more services than the cluster
// holds (with a margin): a subscriber that far behind gets the difference
// found by comparing, which then costs no more.
type Changed struct {
	From, To Stamp
	Keys     []registry.ServiceKey
	prev     *Changed
	links    int // in the chain, this one included
	keys     int // named in the chain
}

// maxChangedLinks bounds a chain's length.
const maxChangedLinks = 64

// Then returns the change from from to to, naming keys, after c (which may
// be nil: nothing earlier is known). held is how many services the cluster
// holds after it.
func (c *Changed) Then(from, to Stamp, keys []registry.ServiceKey, held int) *Changed {
	next := &Changed{From: from, To: to, Keys: keys, prev: c, links: 1, keys: len(keys)}
	if c != nil && c.To == from && c.links < maxChangedLinks && c.keys+len(keys) <= 2*held+64 {
		next.links, next.keys = c.links+1, c.keys+len(keys)
	} else {
		next.prev = nil
	}
	return next
}

// Since returns the services that changed since the change that made stamp
// s (possibly some twice): every content held at s and later is covered.
// False when the chain does not reach back to that change.
func (c *Changed) Since(s Stamp) ([]registry.ServiceKey, bool) {
	var out []registry.ServiceKey
	for n := c; n != nil; n = n.prev {
		if n.To == s && n.From != s {
			return out, true
		}
		out = append(out, n.Keys...)
	}
	return nil, false
}
