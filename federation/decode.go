package federation

import (
	"fmt"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// Decoder turns the items of one update of a cluster's data (a spoke's or a
// peer replica's: the hub checks both the same way) into model values: each
// shard valid within the limits, each key valid, and no service named twice
// in the update. Items that fail come back as a *registry.ValidationError
// naming the service, or, for a shard that does not decode at all, another
// error.
type Decoder struct {
	Cluster registry.ClusterID
	Limits  registry.Limits
	// Held, when set, reports services named earlier by other means (the
	// chunks of a full state already taken): named again, they are refused too.
	Held func(registry.ServiceKey) bool
	seen map[registry.ServiceKey]bool
}

// Shard decodes an upsert.
func (d *Decoder) Shard(p *fedv1.Shard) (*registry.Shard, error) {
	sh, err := ShardFromProto(d.Cluster, p, d.Limits)
	if err != nil {
		return nil, err
	}
	if d.again(sh.Service) {
		return nil, &registry.ValidationError{Service: sh.Service, Reason: fmt.Sprintf("service %s appears twice", sh.Service)}
	}
	return sh, nil
}

// Key decodes a removed (what "remove") or retained (what "retain")
// service; twice is how a service named again is refused (with the key).
func (d *Decoder) Key(p *fedv1.ServiceKey, what, twice string) (registry.ServiceKey, error) {
	k := KeyFromProto(p)
	if err := registry.ValidateServiceKey(k); err != nil {
		return k, &registry.ValidationError{Service: k, Reason: fmt.Sprintf("%s: %v", what, err)}
	}
	if d.again(k) {
		return k, &registry.ValidationError{Service: k, Reason: fmt.Sprintf(twice, k)}
	}
	return k, nil
}

func (d *Decoder) again(k registry.ServiceKey) bool {
	if d.seen[k] || (d.Held != nil && d.Held(k)) {
		return true
	}
	if d.seen == nil {
		d.seen = map[registry.ServiceKey]bool{}
	}
	d.seen[k] = true
	return false
}
