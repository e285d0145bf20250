// Package syncstatus tracks what every xDS client of a server holds: per
// stream, its node, what it subscribes to and, per type, the version sent
// and the version acknowledged, and its last NACK. A go-control-plane
// server feeds it from its callbacks.
package syncstatus

import (
	"cmp"
	"slices"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/navemesh/nave/internal/xdstype"
)

// States of a client, worst first.
const (
	// Nacked: it rejected the last response of some type it was sent.
	Nacked = "NACKED"
	// Stale: a response sent to it is not acknowledged yet.
	Stale = "STALE"
	// Synced: it acknowledged every response it was sent.
	Synced = "SYNCED"
)

// maxRejectedNames bounds the resource names a NACK keeps of the response it rejected.
const maxRejectedNames = 8

// Stream names a stream within one server: state-of-the-world and delta
// streams are numbered apart.
type Stream struct {
	Delta bool  `json:"delta"`
	ID    int64 `json:"id"`
}

// Client is what a server knows of one xDS stream.
type Client struct {
	Stream  Stream `json:"stream"`
	Replica string `json:"replica"`
	// NodeID is the ID the client's node gave; Cluster its node's cluster.
	NodeID   string   `json:"nodeID"`
	Cluster  string   `json:"cluster,omitempty"`
	Locality Locality `json:"locality"`
	// ConnectedSince is when the stream opened.
	ConnectedSince time.Time `json:"connectedSince"`
	// State is Nacked, Stale or Synced. StaleSince is when the oldest
	// response it has not answered was sent (nil: none).
	State      string     `json:"state"`
	StaleSince *time.Time `json:"staleSince,omitempty"`
	// Types holds, by type label (lds, rds, cds, eds), the stream's exchange.
	Types map[string]Type `json:"types"`
}

// Locality is a client's locality as its node gives it.
type Locality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	SubZone string `json:"subZone,omitempty"`
}

// Type is one stream's exchange for one type.
type Type struct {
	// Wildcard: it asks for every resource of the type; Subscribed counts
	// the names it asks for, and Names lists them (only in Server.Client).
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
	// Rejecting: it rejected the version last sent (LastNACK says why).
	Rejecting bool `json:"rejecting,omitempty"`
	// LastNACK is the last rejection, kept after the stream accepts a later
	// response (nil: none).
	LastNACK *NACK `json:"lastNACK,omitempty"`
	// Differences are, when asked for one client (Server.Client), what it
	// holds that differs from what the server would send it now.
	Differences []Difference `json:"differences,omitempty"`
}

// NACK is a response a client rejected.
type NACK struct {
	// Version and Nonce are those of the response rejected.
	Version string `json:"version"`
	Nonce   string `json:"nonce"`
	// Resources names (up to maxRejectedNames of) the resources that
	// response carried, of Count in all.
	Resources []string `json:"resources,omitempty"`
	Count     int      `json:"count"`
	// Detail is the client's error detail.
	Detail string    `json:"detail"`
	At     time.Time `json:"at"`
}

// Difference is one resource a client holds otherwise than the server
// would now send it.
type Difference struct {
	Resource string `json:"resource"`
	// Held is the version the client acknowledged ("": none), Current the
	// version of the server's last change of the resource ("": the server
	// has no such resource).
	Held    string `json:"held"`
	Current string `json:"current"`
	Reason  string `json:"reason"`
}

// Tracker tracks the streams of one xDS server. Its methods are safe for
// concurrent use and do not block beyond a short lock.
type Tracker struct {
	replica string
	now     func() time.Time

	// mu guards streams.
	mu      sync.Mutex
	streams map[Stream]*stream
}

type stream struct {
	// node is the node the stream's requests carry (go-control-plane keeps
	// it for the stream; it is not copied).
	node  *core.Node
	since time.Time
	types map[string]*exchange // by type URL
}

// exchange is one stream's exchange for one type.
type exchange struct {
	// names is the subscription: for state-of-the-world streams, the last
	// request's own slice (never copied: go-control-plane holds the same
	// one); for delta streams, a set kept from subscribes and unsubscribes.
	names    []string
	delta    map[string]struct{}
	wildcard bool
	// asked is when the stream last asked for the type (any request).
	asked time.Time
	// The last response sent: its version, nonce, when, and the names it
	// carried (up to maxRejectedNames, of sentCount).
	sent, sentNonce string
	sentAt          time.Time
	sentNames       []string
	sentCount       int
	answered        bool
	acked           string
	ackedAt         time.Time
	rejecting       bool
	nack            *NACK
}

// New returns a tracker of a server that calls itself replica.
func New(replica string) *Tracker {
	return &Tracker{replica: replica, now: time.Now, streams: map[Stream]*stream{}}
}

// Open records a new stream.
func (t *Tracker) Open(s Stream) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.streams[s] = &stream{since: now, types: map[string]*exchange{}}
}

// Close forgets a stream.
func (t *Tracker) Close(s Stream) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.streams, s)
}

// exchangeLocked returns the stream's exchange of a type (nil: no such stream).
func (t *Tracker) exchangeLocked(s Stream, node *core.Node, typeURL string) *exchange {
	st := t.streams[s]
	if st == nil {
		return nil
	}
	if node != nil {
		st.node = node
	}
	x := st.types[typeURL]
	if x == nil {
		x = &exchange{}
		st.types[typeURL] = x
	}
	return x
}

// answer applies the ACK or NACK a request carries for the response of
// nonce; a request answering an older response is a late one and changes
// nothing (go-control-plane ignores it too).
func (x *exchange) answer(nonce, version string, rejected *discovery.DiscoveryRequest, detail string, now time.Time) {
	if nonce == "" || nonce != x.sentNonce || x.answered {
		return
	}
	x.answered = true
	if rejected != nil {
		x.rejecting = true
		x.nack = &NACK{Version: x.sent, Nonce: nonce, Resources: x.sentNames, Count: x.sentCount, Detail: detail, At: now}
		return
	}
	x.rejecting = false
	x.acked, x.ackedAt = version, now
}

// Request records a state-of-the-world request: its subscription, and the
// ACK or NACK it carries.
func (t *Tracker) Request(id int64, req *discovery.DiscoveryRequest) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.exchangeLocked(Stream{ID: id}, req.GetNode(), req.GetTypeUrl())
	if x == nil {
		return
	}
	x.asked = now
	x.names = req.GetResourceNames()
	x.wildcard = len(x.names) == 0 || slices.Contains(x.names, "*")
	var rejected *discovery.DiscoveryRequest
	if req.GetErrorDetail() != nil {
		rejected = req
	}
	x.answer(req.GetResponseNonce(), req.GetVersionInfo(), rejected, req.GetErrorDetail().GetMessage(), now)
}

// DeltaRequest records a delta request: the names it subscribes and
// unsubscribes, and the ACK or NACK it carries.
func (t *Tracker) DeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.exchangeLocked(Stream{Delta: true, ID: id}, req.GetNode(), req.GetTypeUrl())
	if x == nil {
		return
	}
	x.asked = now
	if x.delta == nil {
		x.delta = map[string]struct{}{}
		x.wildcard = len(req.GetResourceNamesSubscribe()) == 0 // a first request that names nothing is a wildcard one
		for name := range req.GetInitialResourceVersions() {
			x.delta[name] = struct{}{}
		}
	}
	for _, name := range req.GetResourceNamesSubscribe() {
		if name == "*" {
			x.wildcard = true
			continue
		}
		x.delta[name] = struct{}{}
	}
	for _, name := range req.GetResourceNamesUnsubscribe() {
		if name == "*" {
			x.wildcard = false
			continue
		}
		delete(x.delta, name)
	}
	var rejected *discovery.DiscoveryRequest
	if req.GetErrorDetail() != nil {
		rejected = &discovery.DiscoveryRequest{}
	}
	// A delta ACK names no version: it accepts the one sent with the nonce.
	x.answer(req.GetResponseNonce(), x.sent, rejected, req.GetErrorDetail().GetMessage(), now)
}

// Response records a state-of-the-world response about to be sent, and
// returns when the stream last asked for its type (zero: never).
func (t *Tracker) Response(id int64, typeURL string, resp *discovery.DiscoveryResponse) (asked time.Time) {
	names, count := sentNames(resp)
	return t.sent(Stream{ID: id}, typeURL, resp.GetVersionInfo(), resp.GetNonce(), names, count)
}

// DeltaResponse is Response for a delta stream.
func (t *Tracker) DeltaResponse(id int64, typeURL string, resp *discovery.DeltaDiscoveryResponse) (asked time.Time) {
	res := resp.GetResources()
	names := make([]string, 0, min(len(res), maxRejectedNames))
	for _, r := range res[:min(len(res), maxRejectedNames)] {
		names = append(names, r.GetName())
	}
	return t.sent(Stream{Delta: true, ID: id}, typeURL, resp.GetSystemVersionInfo(), resp.GetNonce(), names, len(res)+len(resp.GetRemovedResources()))
}

func (t *Tracker) sent(s Stream, typeURL, version, nonce string, names []string, count int) time.Time {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	x := t.exchangeLocked(s, nil, typeURL)
	if x == nil {
		return time.Time{}
	}
	x.sent, x.sentNonce, x.sentAt, x.sentNames, x.sentCount = version, nonce, now, names, count
	x.answered = false
	// A rejection stands while the server resends what was rejected (it
	// does when the NACK names an older version than the one rejected).
	if x.nack == nil || x.nack.Version != version {
		x.rejecting = false
	}
	return x.asked
}

// sentNames reads the names of (up to maxRejectedNames of) a response's
// resources from their encoding (field 1 is the name of every type Nave
// serves), without decoding them.
func sentNames(resp *discovery.DiscoveryResponse) ([]string, int) {
	res := resp.GetResources()
	names := make([]string, 0, min(len(res), maxRejectedNames))
	for _, a := range res[:min(len(res), maxRejectedNames)] {
		if name, err := xdstype.WireName(a.GetValue()); err == nil {
			names = append(names, name)
		}
	}
	return names, len(res)
}

// Clients returns every stream the tracker knows, by node ID and stream;
// nodeID, when not empty, keeps only that node's streams, with their
// subscribed names.
func (t *Tracker) Clients(nodeID string) []Client {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Client, 0, len(t.streams))
	for s, st := range t.streams {
		if nodeID != "" && st.node.GetId() != nodeID {
			continue
		}
		out = append(out, t.clientLocked(s, st, nodeID != ""))
	}
	slices.SortFunc(out, func(a, b Client) int {
		return cmp.Or(cmp.Compare(a.NodeID, b.NodeID), cmp.Compare(a.Stream.ID, b.Stream.ID), boolCompare(a.Stream.Delta, b.Stream.Delta))
	})
	return out
}

// Node returns the node of a stream (nil: unknown or no request yet), for
// what a server compares a client's holdings against.
func (t *Tracker) Node(s Stream) *core.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.streams[s]; st != nil {
		return st.node
	}
	return nil
}

func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	default:
		return 1
	}
}

func (t *Tracker) clientLocked(s Stream, st *stream, names bool) Client {
	l := st.node.GetLocality()
	c := Client{Stream: s, Replica: t.replica, NodeID: st.node.GetId(), Cluster: st.node.GetCluster(),
		Locality:       Locality{Region: l.GetRegion(), Zone: l.GetZone(), SubZone: l.GetSubZone()},
		ConnectedSince: st.since, State: Synced, Types: make(map[string]Type, len(st.types))}
	for typeURL, x := range st.types {
		ty := Type{Wildcard: x.wildcard, Sent: x.sent, SentAt: x.sentAt, Acked: x.acked, AckedAt: x.ackedAt,
			Pending: x.sentNonce != "" && !x.answered, Rejecting: x.rejecting, LastNACK: x.nack}
		if x.delta != nil {
			ty.Subscribed = len(x.delta)
			if names {
				ty.Names = slices.Sorted(func(yield func(string) bool) {
					for n := range x.delta {
						if !yield(n) {
							return
						}
					}
				})
			}
		} else {
			ty.Subscribed = len(x.names)
			if names {
				ty.Names = slices.Clone(x.names)
			}
		}
		if ty.Rejecting {
			c.State = Nacked
		}
		if ty.Pending && (c.StaleSince == nil || x.sentAt.Before(*c.StaleSince)) {
			at := x.sentAt
			c.StaleSince = &at
		}
		c.Types[xdstype.Label(typeURL)] = ty
	}
	if c.StaleSince != nil && c.State != Nacked {
		c.State = Stale
	}
	return c
}
