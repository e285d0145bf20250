package relay

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"
)

// ClientStatus is what the relay knows of one local stream.
type ClientStatus struct {
	// StreamID numbers the stream within its view: the node's, or, when
	// Gateway is set, that gateway's.
	StreamID int64 `json:"streamID"`
	// Gateway is the node ID of the gateway whose view serves the stream
	// ("": the node's view).
	Gateway string `json:"gateway,omitempty"`
	// NodeID is the ID the client's node gave ("" until its first request).
	NodeID         string    `json:"nodeID"`
	ConnectedSince time.Time `json:"connectedSince"`
	// Types holds, by type label (lds, rds, cds, eds), what was sent and acknowledged.
	Types map[string]TypeStatus `json:"types"`
}

// TypeStatus is one local stream's exchange for one type.
type TypeStatus struct {
	// Sent is the version last sent, Acked the version last acknowledged.
	Sent  string `json:"sent"`
	Acked string `json:"acked"`
	// LastNACK is the last rejection (nil: none).
	LastNACK *NACK `json:"lastNACK,omitempty"`
}

// NACK is a response a local client rejected.
type NACK struct {
	// Version is the version rejected (as far as the relay knows: the one
	// it sent with Nonce), Nonce the nonce of that response.
	Version string `json:"version"`
	Nonce   string `json:"nonce"`
	// Detail is the client's error_detail message.
	Detail string    `json:"detail"`
	At     time.Time `json:"at"`
}

// subscription is what one stream (or the union of streams) subscribes to for one type.
type subscription struct {
	wildcard bool
	names    map[string]struct{}
}

func (s subscription) empty() bool { return !s.wildcard && len(s.names) == 0 }

func (s subscription) equal(o subscription) bool {
	return s.wildcard == o.wildcard && maps.Equal(s.names, o.names)
}

// requestNames is the resource_names a request for s carries: "*" alone
// for wildcard (explicit, since an empty list is wildcard only on a
// stream's first request), else the sorted names.
func (s subscription) requestNames() []string {
	if s.wildcard {
		return []string{"*"}
	}
	return slices.Sorted(maps.Keys(s.names))
}

// intersect returns what both s and o cover.
func (s subscription) intersect(o subscription) subscription {
	switch {
	case s.wildcard && o.wildcard:
		return subscription{wildcard: true, names: maps.Clone(s.names)}
	case s.wildcard:
		return subscription{names: maps.Clone(o.names)}
	case o.wildcard:
		return subscription{names: maps.Clone(s.names)}
	}
	out := subscription{names: map[string]struct{}{}}
	for name := range s.names {
		if _, ok := o.names[name]; ok {
			out.names[name] = struct{}{}
		}
	}
	return out
}

// wants says whether name is covered by s.
func (s subscription) wants(name string) bool {
	if s.wildcard {
		return true
	}
	_, ok := s.names[name]
	return ok
}

// localStream is one local client stream.
type localStream struct {
	node  string
	since time.Time
	// subs holds the stream's subscription per type URL.
	subs map[string]subscription
	// types holds the stream's exchange per type URL.
	types map[string]*typeExchange
	// pending is the stream's last request not yet seen by CreateWatch;
	// pendingNACK says it rejects the last response sent for its type.
	pending     *discovery.DiscoveryRequest
	pendingNACK bool
}

type typeExchange struct {
	sent, sentNonce, acked string
	nack                   *NACK
	// rejectingLast says the client's last word on the last response it
	// was sent is a NACK.
	rejectingLast bool
}

func (x *typeExchange) rejecting() bool { return x.rejectingLast }

// localStreams tracks the local streams. The go-control-plane server calls
// OnStreamRequest and then CreateWatch with the same request, on the
// stream's goroutine; pending maps that request to its stream, since a
// watch does not say which stream it belongs to.
type localStreams struct {
	metrics *metrics
	log     *slog.Logger
	// gateway is the gateway whose view the streams are of ("": the node's).
	gateway string
	// maxNames bounds the resource names of a local request and of the union
	// per type (Config.MaxResourceNames).
	maxNames int
	clock    clock.PassiveClock
	// changed is called (without mu held) after a subscription or a
	// rejection changed; it must not block.
	changed func()

	// mu guards streams and pending.
	mu      sync.Mutex
	streams map[int64]*localStream
	pending map[*discovery.DiscoveryRequest]int64
}

func newLocalStreams(m *metrics, log *slog.Logger, maxNames int, clk clock.PassiveClock, changed func()) *localStreams {
	return &localStreams{metrics: m, log: log, maxNames: maxNames, clock: clk, changed: changed,
		streams: map[int64]*localStream{}, pending: map[*discovery.DiscoveryRequest]int64{}}
}

func (l *localStreams) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamOpenFunc: func(_ context.Context, id int64, _ string) error {
			l.open(id)
			return nil
		},
		StreamClosedFunc: func(id int64, _ *core.Node) {
			l.close(id)
		},
		StreamRequestFunc: l.request,
		StreamResponseFunc: func(_ context.Context, id int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			l.response(id, req.GetTypeUrl(), resp)
		},
	}
}

func (l *localStreams) open(id int64) {
	l.mu.Lock()
	l.streams[id] = &localStream{since: l.clock.Now(), subs: map[string]subscription{}, types: map[string]*typeExchange{}}
	l.mu.Unlock()
	l.metrics.streams.Inc()
}

func (l *localStreams) close(id int64) {
	l.mu.Lock()
	s := l.streams[id]
	delete(l.streams, id)
	if s != nil && s.pending != nil {
		delete(l.pending, s.pending)
	}
	subscribed := s != nil && (len(s.subs) > 0 || s.rejecting())
	l.mu.Unlock()
	if s == nil {
		return
	}
	l.metrics.streams.Dec()
	l.log.Debug("local stream closed", "stream", id, "node", s.node)
	if subscribed {
		l.changed()
	}
}

// request records a local request: who sent it, and whether it ACKs or
// NACKs. A request naming more than maxNames resources ends its stream.
func (l *localStreams) request(id int64, req *discovery.DiscoveryRequest) error {
	if n := len(req.GetResourceNames()); n > l.maxNames {
		l.log.Warn("local request names too many resources; ending its stream", "stream", id, "node", req.GetNode().GetId(),
			"type", typeLabel(req.GetTypeUrl()), "names", n, "max", l.maxNames)
		return status.Errorf(codes.ResourceExhausted, "relay: a request may name at most %d resources, this one names %d", l.maxNames, n)
	}
	var nack *NACK
	repeated, rejectionChanged := false, false
	l.mu.Lock()
	s := l.streams[id]
	if s == nil {
		l.mu.Unlock()
		return nil
	}
	if s.pending != nil {
		delete(l.pending, s.pending)
	}
	s.pending, s.pendingNACK = req, false
	l.pending[req] = id
	if node := req.GetNode().GetId(); node != "" {
		s.node = node
	}
	// Only the relayed types are recorded: a client may name any type URL.
	if typeLabel(req.GetTypeUrl()) != typeOther {
		x := s.exchange(req.GetTypeUrl())
		wasRejecting := x.rejecting()
		switch {
		case req.GetErrorDetail() != nil:
			nack = &NACK{Nonce: req.GetResponseNonce(), Detail: req.GetErrorDetail().GetMessage(), At: l.clock.Now()}
			if req.GetResponseNonce() != "" && req.GetResponseNonce() == x.sentNonce {
				nack.Version = x.sent
				s.pendingNACK = true
				x.rejectingLast = true
			}
			repeated = x.nack != nil && x.nack.Nonce == nack.Nonce
			x.nack = nack
		case req.GetResponseNonce() != "":
			x.acked = req.GetVersionInfo()
			// An ACK of the last response: its nonce and version. A request
			// after a NACK (a subscription change) names the nonce with the
			// version the client still holds: it rejects on.
			if req.GetResponseNonce() == x.sentNonce && req.GetVersionInfo() == x.sent {
				x.rejectingLast = false
			}
		}
		rejectionChanged = x.rejecting() != wasRejecting || (nack != nil && x.rejecting())
	}
	node := s.node
	l.mu.Unlock()
	if rejectionChanged {
		// The relay reports its clients' rejections upstream (upstream.report).
		l.changed()
	}
	if nack != nil {
		l.metrics.nacks.WithLabelValues(typeLabel(req.GetTypeUrl())).Inc()
		// Once per stream per nonce at Warn.
		level := slog.LevelWarn
		if repeated {
			level = slog.LevelDebug
		}
		l.log.Log(context.Background(), level, "local client rejected a response (NACK)", "stream", id, "node", node, "type", typeLabel(req.GetTypeUrl()),
			"version", nack.Version, "nonce", nack.Nonce, "detail", nack.Detail)
	}
	return nil
}

func (s *localStream) exchange(typeURL string) *typeExchange {
	x := s.types[typeURL]
	if x == nil {
		x = &typeExchange{}
		s.types[typeURL] = x
	}
	return x
}

func (l *localStreams) response(id int64, typeURL string, resp *discovery.DiscoveryResponse) {
	if typeLabel(typeURL) == typeOther {
		return
	}
	l.mu.Lock()
	wasRejecting := false
	if s := l.streams[id]; s != nil {
		x := s.exchange(typeURL)
		wasRejecting = x.rejecting()
		x.sent, x.sentNonce, x.rejectingLast = resp.GetVersionInfo(), resp.GetNonce(), false
	}
	l.mu.Unlock()
	if wasRejecting {
		// No longer rejecting what it holds: the report upstream may clear.
		l.changed()
	}
}

// rejecting says the stream rejects the last response of some type it was sent.
func (s *localStream) rejecting() bool {
	for _, x := range s.types {
		if x.rejecting() {
			return true
		}
	}
	return false
}

// rejection is a local stream rejecting the last response of a type it
// was sent.
type rejection struct {
	key                   rejectionKey
	node, version, detail string
	at                    time.Time // when the client rejected it
}

// rejectionKey names one rejection: the stream and the response it
// rejects. A rejection is reported upstream once.
type rejectionKey struct {
	stream int64
	nonce  string
}

// Bounds of what the relay quotes of a local client upstream: a client's
// node ID and error detail are its own, and the report must stay a small,
// valid message.
const (
	maxReportedNode   = 128
	maxReportedDetail = 512
)

// message is the error detail the relay reports upstream for r.
func (r rejection) message() string {
	return fmt.Sprintf("relay: a local client rejects the last response: node %q version %q: %s",
		truncate(r.node, maxReportedNode), r.version, truncate(r.detail, maxReportedDetail))
}

// truncate cuts s to at most n bytes on a character boundary (a proto
// string must be valid UTF-8: a cut inside a character fails the send).
func truncate(s string, n int) string {
	if len(s) <= n {
		return strings.ToValidUTF8(s, "")
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}

// rejections returns, per type URL, the local streams rejecting the last
// response they were sent, by stream ID.
func (l *localStreams) rejections() map[string][]rejection {
	out := map[string][]rejection{}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, s := range l.streams {
		for t, x := range s.types {
			if x.rejecting() {
				out[t] = append(out[t], rejection{key: rejectionKey{id, x.nack.Nonce}, node: s.node, version: x.nack.Version, detail: x.nack.Detail, at: x.nack.At})
			}
		}
	}
	for _, rs := range out {
		slices.SortFunc(rs, func(a, b rejection) int { return cmp.Compare(a.key.stream, b.key.stream) })
	}
	return out
}

// subscribe records the subscription of the stream that sent req, and says
// whether req rejects the last response sent to that stream for its type.
func (l *localStreams) subscribe(req *cache.Request, sub cache.Subscription) (nackOfLast bool) {
	next := subscription{wildcard: sub.IsWildcard(), names: maps.Clone(sub.SubscribedResources())}
	if next.names == nil {
		next.names = map[string]struct{}{}
	}
	l.mu.Lock()
	id, ok := l.pending[req]
	delete(l.pending, req)
	s := l.streams[id]
	if !ok || s == nil {
		l.mu.Unlock()
		l.log.Warn("a watch from an unknown stream; its subscription is not relayed", "type", typeLabel(req.GetTypeUrl()))
		return false
	}
	nackOfLast = s.pendingNACK
	s.pending, s.pendingNACK = nil, false
	prev, had := s.subs[req.GetTypeUrl()]
	s.subs[req.GetTypeUrl()] = next
	l.mu.Unlock()
	if !had || !prev.equal(next) {
		l.changed()
	}
	return nackOfLast
}

// union returns, per type URL, the union of every local stream's subscription.
func (l *localStreams) union() map[string]subscription {
	out := make(map[string]subscription, len(relayedTypes))
	for _, t := range relayedTypes {
		out[t] = subscription{names: map[string]struct{}{}}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.streams {
		for t, sub := range s.subs {
			u, ok := out[t]
			if !ok {
				continue
			}
			u.wildcard = u.wildcard || sub.wildcard
			for name := range sub.names {
				u.names[name] = struct{}{}
			}
			out[t] = u
		}
	}
	// The hub refuses a request naming too many resources (and ends the
	// stream): past the bound, the type is asked for as a wildcard.
	for t, u := range out {
		if !u.wildcard && len(u.names) > l.maxNames {
			u.wildcard = true
			out[t] = u
		}
	}
	return out
}

func (l *localStreams) status() []ClientStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]ClientStatus, 0, len(l.streams))
	for id, s := range l.streams {
		c := ClientStatus{StreamID: id, Gateway: l.gateway, NodeID: s.node, ConnectedSince: s.since, Types: map[string]TypeStatus{}}
		for t, x := range s.types {
			ts := TypeStatus{Sent: x.sent, Acked: x.acked}
			if x.nack != nil {
				n := *x.nack
				ts.LastNACK = &n
			}
			c.Types[typeLabel(t)] = ts
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b ClientStatus) int { return cmp.Compare(a.StreamID, b.StreamID) })
	return out
}
