package registry

import "fmt"

// ChangeKind says what happened to a service.
type ChangeKind int

// The kinds of change.
const (
	Added ChangeKind = iota
	Updated
	Removed
)

func (k ChangeKind) String() string {
	switch k {
	case Added:
		return "added"
	case Updated:
		return "updated"
	case Removed:
		return "removed"
	}
	return fmt.Sprintf("ChangeKind(%d)", int(k))
}

// ServiceDiff is what changed about one merged service.
type ServiceDiff struct {
	Key  ServiceKey
	Kind ChangeKind
	// ShapeChanged: ports, type or conflicts changed (listeners, routes and clusters must follow).
	ShapeChanged bool
	// EndpointsChanged: some cluster's endpoints changed (only endpoint assignments must follow).
	EndpointsChanged bool
}

// Diff is what one Apply changed, sorted by service key.
type Diff struct {
	Version  uint64
	Services []ServiceDiff
}

// Empty reports whether nothing changed.
func (d Diff) Empty() bool { return len(d.Services) == 0 }

func serviceDiff(prev, next *Service) ServiceDiff {
	switch {
	case prev == nil:
		return ServiceDiff{Key: next.Key, Kind: Added, ShapeChanged: true, EndpointsChanged: true}
	case next == nil:
		return ServiceDiff{Key: prev.Key, Kind: Removed, ShapeChanged: true, EndpointsChanged: true}
	}
	d := ServiceDiff{Key: next.Key, Kind: Updated, ShapeChanged: next.ShapeRevision != prev.ShapeRevision}
	// Endpoints changed unless every shard has the same endpoints behind the same ports
	// (a cluster's own port names decide which endpoint port serves a merged port).
	d.EndpointsChanged = len(prev.Shards) != len(next.Shards)
	for i := 0; !d.EndpointsChanged && i < len(next.Shards); i++ {
		a, b := prev.Shards[i], next.Shards[i]
		d.EndpointsChanged = a.Cluster != b.Cluster || !a.SamePorts(b) || !endpointsEqual(a, b)
	}
	return d
}

func endpointsEqual(a, b *Shard) bool {
	if len(a.Endpoints) != len(b.Endpoints) {
		return false
	}
	for i := range a.Endpoints {
		if !endpointEqual(a.Endpoints[i], b.Endpoints[i]) {
			return false
		}
	}
	return true
}
