package replicas

import "fmt"

// Stamp orders the states of one cluster across hub replicas: the epoch of
// the spoke session that produced it (a fencing token from etcd, larger for
// every new session of the cluster) and the version within that session.
// A replica applies a cluster's data only over older data: a home replica
// that lost its spoke without noticing holds an older epoch, so it can never
// overwrite what a newer session produced.
type Stamp struct {
	Epoch   uint64 `json:"epoch"`
	Version uint64 `json:"version"`
}

// Less reports whether s is older than o.
func (s Stamp) Less(o Stamp) bool {
	return s.Epoch < o.Epoch || s.Epoch == o.Epoch && s.Version < o.Version
}

// IsZero reports whether s stamps nothing (no data yet).
func (s Stamp) IsZero() bool { return s == Stamp{} }

func (s Stamp) String() string { return fmt.Sprintf("%d.%d", s.Epoch, s.Version) }
