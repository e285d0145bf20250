package adminapi

import "time"

// ClientsInfo is what /debug/clients serves: the xDS clients of one replica
// and their sync status. With ?node=ID, only that node's streams, each with
// its subscribed names and what it holds that differs from what the
// replica would send it now.
type ClientsInfo struct {
	Replica string   `json:"replica"`
	Clients []Client `json:"clients"`
}

// States of a client (Client.State), worst first.
const (
	// Nacked: it rejected the last response of some type it was sent.
	Nacked = "NACKED"
	// Stale: a response sent to it is not acknowledged yet.
	Stale = "STALE"
	// Synced: it acknowledged every response it was sent.
	Synced = "SYNCED"
)

// Client is what a replica knows of one xDS stream (syncstatus.Client).
type Client struct {
	Stream  Stream `json:"stream"`
	Replica string `json:"replica"`
	// NodeID is the ID the client's node gave; Cluster its node's cluster.
	NodeID   string       `json:"nodeID"`
	Cluster  string       `json:"cluster,omitempty"`
	Locality NodeLocality `json:"locality"`
	// ConnectedSince is when the stream opened.
	ConnectedSince time.Time `json:"connectedSince"`
	// State is Nacked, Stale or Synced. StaleSince is when the oldest
	// response it has not answered was sent (nil: none).
	State      string     `json:"state"`
	StaleSince *time.Time `json:"staleSince,omitempty"`
	// Types holds, by type label (lds, rds, cds, eds), the stream's exchange.
	Types map[string]Exchange `json:"types"`
}

// Stream names a stream within one replica: state-of-the-world and delta
// streams are numbered apart.
type Stream struct {
	Delta bool  `json:"delta"`
	ID    int64 `json:"id"`
}

// NodeLocality is a client's locality as its node gives it.
type NodeLocality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	SubZone string `json:"subZone,omitempty"`
}

// Exchange is one stream's exchange of one xDS type.
type Exchange struct {
	// Wildcard: it asks for every resource of the type; Subscribed counts
	// the names it asks for, and Names lists them (only with ?node=ID).
	Wildcard   bool     `json:"wildcard,omitempty"`
	Subscribed int      `json:"subscribed"`
	Names      []string `json:"names,omitempty"`
	// Sent is the version last sent and SentAt when; Acked the version
	// last acknowledged and AckedAt when.
	Sent    string    `json:"sent,omitempty"`
	SentAt  time.Time `json:"sentAt,omitzero"`
	Acked   string    `json:"acked,omitempty"`
	AckedAt time.Time `json:"ackedAt,omitzero"`
	// Pending: the last response sent is not answered yet.
	Pending bool `json:"pending,omitempty"`
	// Rejecting: it rejected the version last sent, or lacks resources it
	// rejected before (Unresolved; LastNACK says why).
	Rejecting bool `json:"rejecting,omitempty"`
	// LastNACK is the last rejection, kept after the stream accepts a later
	// response (nil: none).
	LastNACK *NACK `json:"lastNACK,omitempty"`
	// Unresolved are resources it rejected that no response it accepted
	// since carried: it lacks them (AllUnresolved: more than the names a
	// NACK keeps; any it subscribes to may be missing).
	Unresolved    []string `json:"unresolved,omitempty"`
	AllUnresolved bool     `json:"allUnresolved,omitempty"`
	// Resumed: a delta stream that reconnected holding versions of what it
	// subscribes to; until it is sent anything, it holds those.
	Resumed bool `json:"resumed,omitempty"`
	// Differences are, with ?node=ID, what it holds that differs from what
	// the replica would send it now.
	Differences []Difference `json:"differences,omitempty"`
}

// NACK is a response a client rejected.
type NACK struct {
	// Version and Nonce are those of the response rejected.
	Version string `json:"version"`
	Nonce   string `json:"nonce"`
	// Resources names (some of) the resources that response carried, of
	// Count in all.
	Resources []string `json:"resources,omitempty"`
	Count     int      `json:"count"`
	// Detail is the client's error detail.
	Detail string    `json:"detail"`
	At     time.Time `json:"at"`
}

// Difference is one resource a client holds otherwise than the replica
// would now send it.
type Difference struct {
	Resource string `json:"resource"`
	// Held is the version the client acknowledged ("": none), Current the
	// version of the replica's last change of the resource ("": it has no
	// such resource).
	Held    string `json:"held"`
	Current string `json:"current"`
	Reason  string `json:"reason"`
}
