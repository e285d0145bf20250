package adminapi

import (
	"time"

	"github.com/navemesh/nave/registry"
)

// TraceInfo is what /debug/trace serves: one replica's last traced changes
// (?service=NS/NAME: of one service; ?limit=N: at most N, default 20),
// newest first.
type TraceInfo struct {
	Replica string  `json:"replica"`
	Traces  []Trace `json:"traces"`
}

// Trace is one change as a replica saw it through (convergence.Trace).
type Trace struct {
	ID      uint64              `json:"id"`
	Replica string              `json:"replica"`
	Cluster registry.ClusterID  `json:"cluster"`
	Service registry.ServiceKey `json:"service"`
	// Origin is where the change began, as its spoke said (nil: it did not
	// say: a resync, or a replica's copy).
	Origin *Origin `json:"origin,omitempty"`
	// Received is when the replica applied the change (its clock), and
	// Translated when its xDS resources were published ("": not yet).
	Received   time.Time  `json:"received"`
	Translated *time.Time `json:"translated,omitempty"`
	// Type is the xDS type a client must be sent to hold the change (lds,
	// rds, cds or eds), Resources the resources of that type it changed.
	// NoChange: the change altered nothing any client is sent.
	Type      string   `json:"type,omitempty"`
	Resources []string `json:"resources,omitempty"`
	NoChange  bool     `json:"noChange,omitempty"`
	// Pushed counts the responses that carried it, Acked the clients that
	// acknowledged one, Nacked those that rejected one.
	Pushed int `json:"pushed"`
	Acked  int `json:"acked"`
	Nacked int `json:"nacked"`
	// Slowest are the clients that took longest to acknowledge it.
	Slowest []ClientTime `json:"slowest,omitempty"`
	// LastAck is when the last client acknowledged it.
	LastAck *time.Time `json:"lastAck,omitempty"`
}

// Origin is where a change began, in milliseconds each measured on one
// clock (0: unknown).
type Origin struct {
	ResourceVersion string  `json:"resourceVersion,omitempty"`
	Source          float64 `json:"sourceMs"`
	Spoke           float64 `json:"spokeMs"`
	SpokeToHub      float64 `json:"spokeToHubMs"`
}

// ClientTime is how long one client took to hold a change.
type ClientTime struct {
	NodeID string `json:"nodeID"`
	Stream Stream `json:"stream"`
	// ApplyToPush, PushToAck and HubToAck are the stages, in milliseconds;
	// EndToEnd adds the change's origin (0: no origin).
	ApplyToPush float64 `json:"applyToPushMs"`
	PushToAck   float64 `json:"pushToAckMs"`
	HubToAck    float64 `json:"hubToAckMs"`
	EndToEnd    float64 `json:"endToEndMs,omitempty"`
}
