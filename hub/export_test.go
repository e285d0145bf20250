package hub

import (
	"context"

	"github.com/navemesh/nave/adminapi"
)

// NoSaveOnStop makes h stop as a crashed replica would as far as its
// snapshot goes: no last save (the catalog's last write still happens).
// Tests of cold starts need a snapshot that lacks clusters.
func (h *Hub) NoSaveOnStop() { h.coord.noSaveOnStop.Store(true) }

// CheckLiveness evaluates every cluster's liveness now, by the liveness
// clock, as the hub's one-second tick does.
func (h *Hub) CheckLiveness(ctx context.Context) error { return h.state.tick(ctx) }

// CollectDead drops, as the leader's loop does, the clusters whose drop
// policy is due by the liveness clock.
func (h *Hub) CollectDead(ctx context.Context) { h.coord.collect(ctx) }

// clusterStatus is c as the hub holds it.
func clusterStatus(c adminapi.ClusterStatus) ClusterStatus { return ClusterStatus{ClusterStatus: c} }
