// Package syncstatus tracks what every xDS client of a server holds: per
// stream, its node, what it subscribes to and, per type, the version sent
// and the version acknowledged, and its last NACK. A go-control-plane
// server feeds it from its callbacks.
package syncstatus

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"
	"unicode/utf8"
	"unique"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/navemesh/nave/adminapi"
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

// maxRejectedNames bounds the resource names a NACK keeps of the response
// it rejected, and maxDetail the bytes of its error detail.
const (
	maxRejectedNames = 8
	maxDetail        = 1024
)

// What a server knows of its clients is the admin API's JSON, the same
// types (adminapi), so that the hub serves it without converting it.
type (
	// Stream names a stream within one server: state-of-the-world and delta
	// streams are numbered apart.
	Stream = adminapi.Stream
	// Client is what a server knows of one xDS stream.
	Client = adminapi.Client
	// Locality is a client's locality as its node gives it.
	Locality = adminapi.NodeLocality
	// Type is one stream's exchange for one type.
	Type = adminapi.Exchange
	// NACK is a client's rejection of a response.
	NACK = adminapi.NACK
	// Difference is one resource a client holds otherwise than the server
	// would send it now.
	Difference = adminapi.Difference
)

// Tracker tracks the streams of one xDS server. Its methods are safe for
// concurrent use and do not block beyond a short lock.
type Tracker struct {
	replica string
	now     func() time.Time

	// streamsMu guards streams.
	streamsMu sync.Mutex
	streams   map[Stream]*stream
}

type stream struct {
	// typeURL is the type of a stream of one type's service (LDS, RDS,
	// CDS or EDS), whose requests may name none ("": an ADS stream).
	typeURL string
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
	// named: a request named resources (after that an empty list asks
	// for none, not for every one: a legacy wildcard is only a first ask).
	named bool
	// resumed: a delta stream that reconnected holding versions of what
	// it subscribes to (initial_resource_versions).
	resumed bool
	// unresolved are resources the stream rejected that no response it
	// accepted since carried (all of them, if allUnresolved).
	unresolved    []string
	allUnresolved bool
	// truncated: the last response carried more names than sentNames keeps.
	truncated bool
	// subscribedAt is when the subscription last changed.
	subscribedAt time.Time
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

// Open records a new stream; typeURL is the type of a stream of one
// type's service ("" for ADS), for requests that name no type.
func (t *Tracker) Open(s Stream, typeURL string) {
	now := t.now()
	t.streamsMu.Lock()
	defer t.streamsMu.Unlock()
	t.streams[s] = &stream{typeURL: typeURL, since: now, types: map[string]*exchange{}}
}

// Close forgets a stream.
func (t *Tracker) Close(s Stream) {
	t.streamsMu.Lock()
	defer t.streamsMu.Unlock()
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
	if typeURL == "" {
		typeURL = st.typeURL
	}
	x := st.types[typeURL]
	if x == nil {
		x = &exchange{}
		st.types[typeURL] = x
	}
	return x
}

// Answer is what a request said of the last response of its type: Nonce
// is that response's ("": the request answered nothing, or a late one),
// ACK whether it accepted it, TypeURL the type (a request of a one-type
// service's stream may name none).
type Answer struct {
	Nonce   string
	ACK     bool
	TypeURL string
}

// Sent is what the tracker knew of a stream when a response was sent.
type Sent struct {
	// Asked is when the stream last asked for the type (zero: never).
	Asked time.Time
	// Acked is the version the stream acknowledged before this response
	// ("": none yet, so the response answers its first fetch).
	Acked string
	// SubscribedAt is when the stream last changed what it subscribes to:
	// a response after that may be a fetch of a new name, not a push.
	SubscribedAt time.Time
}

// answer applies the ACK or NACK a request carries for the response of
// nonce; a request answering an older response is a late one and changes
// nothing (go-control-plane ignores it too).
func (x *exchange) answer(nonce, version string, rejected bool, detail string, now time.Time) Answer {
	if nonce == "" || nonce != x.sentNonce || x.answered {
		return Answer{}
	}
	x.answered = true
	if rejected {
		x.rejecting = true
		x.nack = &NACK{Version: x.sent, Nonce: nonce, Resources: x.sentNames, Count: x.sentCount, Detail: truncate(detail, maxDetail), At: now}
		for _, n := range x.sentNames {
			if !slices.Contains(x.unresolved, n) {
				x.unresolved = append(x.unresolved, n)
			}
		}
		x.allUnresolved = x.allUnresolved || x.truncated
		return Answer{Nonce: nonce}
	}
	x.rejecting = false
	x.acked, x.ackedAt = version, now
	// What this response carried is held now. (go-control-plane does not
	// resend a rejected resource until it changes: until then, the stream
	// lacks it though it accepts everything else.)
	x.unresolved = slices.DeleteFunc(x.unresolved, func(n string) bool { return slices.Contains(x.sentNames, n) })
	if x.truncated {
		x.unresolved, x.allUnresolved = nil, false // more than the names kept: assume it carried them
	}
	x.pruneUnresolved()
	return Answer{Nonce: nonce, ACK: true}
}

// pruneUnresolved forgets rejected resources the stream no longer asks for.
func (x *exchange) pruneUnresolved() {
	if len(x.unresolved) > 0 && !x.wildcard {
		x.unresolved = slices.DeleteFunc(x.unresolved, func(n string) bool {
			if x.delta != nil {
				_, ok := x.delta[n]
				return !ok
			}
			return !slices.Contains(x.names, n)
		})
	}
	if len(x.unresolved) == 0 {
		x.unresolved = nil
	}
}

// Request records a state-of-the-world request: its subscription, and the
// ACK or NACK it carries, which it returns.
func (t *Tracker) Request(id int64, req *discovery.DiscoveryRequest) Answer {
	now := t.now()
	t.streamsMu.Lock()
	defer t.streamsMu.Unlock()
	x := t.exchangeLocked(Stream{ID: id}, req.GetNode(), req.GetTypeUrl())
	if x == nil {
		return Answer{}
	}
	x.asked = now
	names := req.GetResourceNames()
	if !sameNames(x.names, names) || x.subscribedAt.IsZero() {
		x.subscribedAt = now
	}
	x.names = names
	x.wildcard = !x.named && len(x.names) == 0 || slices.Contains(x.names, "*")
	x.named = x.named || len(x.names) > 0
	x.pruneUnresolved()
	a := x.answer(req.GetResponseNonce(), req.GetVersionInfo(), req.GetErrorDetail() != nil, req.GetErrorDetail().GetMessage(), now)
	a.TypeURL = cmp.Or(req.GetTypeUrl(), t.streams[Stream{ID: id}].typeURL)
	return a
}

// sameNames says whether two subscriptions are the same list: exactly up
// to 1,024 names; beyond (a gateway's, repeated with every ACK) by length,
// ends and middle, so that an ACK does not cost a walk of every name. A
// name swapped elsewhere in such a list goes unseen: its fetch may count
// as a push in a change's trace.
func sameNames(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) <= 1024 {
		return slices.Equal(a, b)
	}
	return a[0] == b[0] && a[len(a)-1] == b[len(b)-1] && a[len(a)/2] == b[len(b)/2]
}

// DeltaRequest records a delta request: the names it subscribes and
// unsubscribes, and the ACK or NACK it carries, which it returns.
func (t *Tracker) DeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) Answer {
	now := t.now()
	t.streamsMu.Lock()
	defer t.streamsMu.Unlock()
	x := t.exchangeLocked(Stream{Delta: true, ID: id}, req.GetNode(), req.GetTypeUrl())
	if x == nil {
		return Answer{}
	}
	x.asked = now
	if x.delta == nil {
		x.delta = map[string]struct{}{}
		x.wildcard = len(req.GetResourceNamesSubscribe()) == 0 // a first request that names nothing is a wildcard one
		for name := range req.GetInitialResourceVersions() {
			x.delta[name] = struct{}{}
		}
		x.resumed = len(req.GetInitialResourceVersions()) > 0
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
	if len(req.GetResourceNamesSubscribe()) > 0 || len(req.GetResourceNamesUnsubscribe()) > 0 || x.subscribedAt.IsZero() {
		x.subscribedAt = now
	}
	x.pruneUnresolved()
	// A delta ACK names no version: it accepts the one sent with the nonce.
	a := x.answer(req.GetResponseNonce(), x.sent, req.GetErrorDetail() != nil, req.GetErrorDetail().GetMessage(), now)
	a.TypeURL = cmp.Or(req.GetTypeUrl(), t.streams[Stream{Delta: true, ID: id}].typeURL)
	return a
}

// Response records a state-of-the-world response about to be sent, and
// returns what the tracker knew of the stream before it (see Sent).
func (t *Tracker) Response(id int64, typeURL string, resp *discovery.DiscoveryResponse) Sent {
	names, count := sentNames(resp)
	return t.sent(Stream{ID: id}, typeURL, resp.GetVersionInfo(), resp.GetNonce(), names, count, nil)
}

// DeltaResponse is Response for a delta stream.
func (t *Tracker) DeltaResponse(id int64, typeURL string, resp *discovery.DeltaDiscoveryResponse) Sent {
	res := resp.GetResources()
	names := make([]string, 0, min(len(res), maxRejectedNames))
	for _, r := range res[:min(len(res), maxRejectedNames)] {
		names = append(names, unique.Make(r.GetName()).Value())
	}
	return t.sent(Stream{Delta: true, ID: id}, typeURL, resp.GetSystemVersionInfo(), resp.GetNonce(), names, len(res), resp.GetRemovedResources())
}

func (t *Tracker) sent(s Stream, typeURL, version, nonce string, names []string, count int, removed []string) Sent {
	now := t.now()
	t.streamsMu.Lock()
	defer t.streamsMu.Unlock()
	x := t.exchangeLocked(s, nil, typeURL)
	if x == nil {
		return Sent{}
	}
	before := Sent{Asked: x.asked, Acked: x.acked, SubscribedAt: x.subscribedAt}
	x.sent, x.sentNonce, x.sentAt, x.sentNames, x.sentCount = version, nonce, now, names, count
	x.truncated = count > len(names)
	x.answered = false
	// A resource the server removes is no longer missing.
	x.unresolved = slices.DeleteFunc(x.unresolved, func(n string) bool { return slices.Contains(removed, n) })
	// A rejection stands while the server resends what was rejected (it
	// does when the NACK names an older version than the one rejected).
	if x.nack == nil || x.nack.Version != version {
		x.rejecting = false
	}
	return before
}

// sentNames reads the names of (up to maxRejectedNames of) a response's
// resources from their encoding (field 1 is the name of every type Nave
// serves), without decoding them.
func sentNames(resp *discovery.DiscoveryResponse) ([]string, int) {
	res := resp.GetResources()
	names := make([]string, 0, min(len(res), maxRejectedNames))
	for _, a := range res[:min(len(res), maxRejectedNames)] {
		if name, err := xdstype.WireName(a.GetValue()); err == nil {
			names = append(names, unique.Make(name).Value()) // one copy of a name for every stream that was sent it
		}
	}
	return names, len(res)
}

// Clients returns every stream the tracker knows, by node ID and stream;
// nodeID, when not empty, keeps only that node's streams, with their
// subscribed names.
func (t *Tracker) Clients(nodeID string) []Client {
	t.streamsMu.Lock()
	defer t.streamsMu.Unlock()
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
	t.streamsMu.Lock()
	defer t.streamsMu.Unlock()
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
			Pending: x.sentNonce != "" && !x.answered, Rejecting: x.rejecting || len(x.unresolved) > 0 || x.allUnresolved, LastNACK: x.nack,
			Unresolved: slices.Clone(x.unresolved), AllUnresolved: x.allUnresolved, Resumed: x.resumed}
		if x.delta != nil {
			ty.Subscribed = len(x.delta)
			if names {
				ty.Names = slices.Sorted(maps.Keys(x.delta))
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

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
