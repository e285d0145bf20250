package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/limits"
)

// Groups: the clients of one locality group (and network) share one EDS
// cache, and the gateways of one audience group share one set of caches.
// Clients choose their group (their node says where they are), so the
// groups live in one table that bounds them:
//
//   - a stream holds the groups of its node from its first request on, and
//     lets go of them when it ends (or names another node); a group no
//     stream holds is idle, kept GroupIdleTimeout for clients that
//     reconnect, then freed;
//   - a group is made only for a node the table admits, before anything is
//     built for it: its key is at most MaxGroupKeyBytes; only an identity
//     the xDS policy grants every namespace may be a gateway; an identity
//     the policy restricts holds at most MaxGroupsPerIdentity locality
//     groups;
//   - at the bound (Config.MaxLocalityGroups, MaxAudienceGroups) a new
//     group takes the place of the least recently used idle one; when
//     every group is held, the new stream is refused (ResourceExhausted)
//     rather than served another group's priorities.

// GroupIdleTimeout is how long a group no stream holds is kept.
const GroupIdleTimeout = time.Minute

// MaxGroupKeyBytes bounds what a group is named by (a locality group:
// its region, zone, network and cluster together; a gateway group: its
// audience key): what MaxNodeFieldBytes admits of four fields, so that the table
// does not rely on the node's fields having been checked. Real ones are a
// few tens of bytes; a node naming a longer one is refused before any
// group is made for it.
const MaxGroupKeyBytes = 4 * MaxNodeFieldBytes

// maxGroupPrefixBytes bounds the version prefix of a group's caches (every
// version string its caches make starts with it): a longer one is replaced
// by a digest of itself.
const maxGroupPrefixBytes = 256

// MaxGroupsPerIdentity bounds the locality groups the streams of one
// identity the xDS policy restricts may hold together (an identity the
// policy grants every namespace, such as the node agents' that speak for
// every node, is bounded by the table alone).
const MaxGroupsPerIdentity = 16

// Metric names of the group table.
const (
	// MetricGroups is the number of groups by kind ("locality", "gateway") and state ("held", "idle").
	MetricGroups = "nave_xds_groups"
	// MetricGroupRefusals counts streams refused a group, by kind and bound
	// ("key_too_long", "not_a_gateway", "per_identity", "table_full").
	MetricGroupRefusals = "nave_xds_group_refusals_total"
)

// Group kinds and the bounds a stream can be refused at.
const (
	kindLocality = "locality"
	kindGateway  = "gateway"

	boundKeyTooLong  = "key_too_long"
	boundNotAGateway = "not_a_gateway"
	boundPerIdentity = "per_identity"
	boundTableFull   = "table_full"
)

// groupKey names a group: a locality group by its Client, a gateway group
// by its audience key.
type groupKey struct {
	gateway bool
	client  Client
	view    string
}

func (k groupKey) kind() string {
	if k.gateway {
		return kindGateway
	}
	return kindLocality
}

// keyBytes is how many bytes of the client's the key holds.
func (k groupKey) keyBytes() int {
	if k.gateway {
		return len(k.view)
	}
	return len(k.client.Locality.Region) + len(k.client.Locality.Zone) + len(k.client.Network) + len(k.client.Cluster)
}

// groupEntry is one group of the table. Its caches are set when it is made
// and never change; the rest is guarded by Server.stateMu.
type groupEntry struct {
	key  groupKey
	eds  *resourceCache // a locality group's, once a watch asked for endpoints (see groupCache)
	view *view          // a gateway group's
	// refs is how many streams hold the group; holders how many of them
	// each restricted identity has.
	refs    int
	holders map[string]int
	// idleSince is when the last stream let go (the group's LRU stamp).
	idleSince time.Time
}

// groupTable is the bookkeeping of the groups. The groups themselves are
// published in Server.groups and Server.views, which Update and watches
// read; entries, byWho and counts are guarded by Server.stateMu, streams
// and byNode by mu (taken after stateMu, never before).
type groupTable struct {
	idleFor time.Duration
	now     func() time.Time
	// maxGateways is MaxAudienceGroups (smaller in tests).
	maxGateways int

	entries map[groupKey]*groupEntry
	// byWho counts, per restricted identity, the locality groups its streams hold.
	byWho map[string]int

	mu      sync.Mutex
	streams map[streamKey]*heldGroups
	byNode  map[*core.Node]*heldGroups

	groups  *prometheus.GaugeVec
	refused *prometheus.CounterVec
}

// heldGroups is what one stream holds: the groups of the node its requests carry.
type heldGroups struct {
	node      *core.Node
	eds, view *groupEntry
	who       string // a restricted identity; "" when unrestricted
}

func newGroupTable(reg prometheus.Registerer) *groupTable {
	t := &groupTable{
		idleFor:     GroupIdleTimeout,
		now:         time.Now,
		maxGateways: MaxAudienceGroups,
		entries:     map[groupKey]*groupEntry{},
		byWho:       map[string]int{},
		streams:     map[streamKey]*heldGroups{},
		byNode:      map[*core.Node]*heldGroups{},
		groups: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricGroups, Help: "Locality and gateway groups, by kind and state (held by open streams, or idle until they expire).",
		}, []string{"kind", "state"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricGroupRefusals, Help: "xDS streams refused a group (and ended), by kind and the bound they met.",
		}, []string{"kind", "bound"}),
	}
	for _, k := range []string{kindLocality, kindGateway} {
		for _, st := range []string{"held", "idle"} {
			t.groups.WithLabelValues(k, st)
		}
		for _, b := range []string{boundKeyTooLong, boundNotAGateway, boundPerIdentity, boundTableFull} {
			t.refused.WithLabelValues(k, b)
		}
	}
	if reg != nil {
		reg.MustRegister(t.groups, t.refused)
	}
	return t
}

// holdGroups makes the stream key hold the groups of the node its request
// carries, refusing the request (its stream ends) with a status saying
// which bound it met. A request without a node is the stream's earlier
// node's (a first one: an empty node, given to it as go-control-plane
// would), so that its watches find the stream's groups. Cheap when the
// node is the one the stream holds for.
func (s *Server) holdGroups(key streamKey, node **core.Node) error {
	t := s.table
	t.mu.Lock()
	old := t.streams[key]
	switch {
	case *node == nil && old != nil:
		*node = old.node
	case *node == nil:
		*node = &core.Node{}
	}
	t.mu.Unlock()
	if old != nil && old.node == *node {
		// The same node: the same groups, unless the topology moved its
		// cluster to another network (then the groups of the new one).
		if eds, _, _ := s.groupKeys(*node); eds == old.eds.key {
			return nil
		}
	}

	allow, who, restricted := s.streamIdentity(key)
	s.stateMu.Lock()
	if old != nil {
		// What the stream held goes first: it counts no more against its
		// identity's share (a stream moving to a new locality at its
		// identity's bound is not refused for the group it leaves).
		s.release(old)
	}
	held, err := s.acquire(*node, allow, who, restricted)
	s.stateMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if old != nil {
		delete(t.streams, key)
		if t.byNode[old.node] == old {
			delete(t.byNode, old.node)
		}
	}
	if err != nil {
		return err // the stream ends holding nothing
	}
	held.node = *node
	t.streams[key] = held
	t.byNode[held.node] = held
	return nil
}

// releaseGroups lets go of what a closed stream held.
func (s *Server) releaseGroups(key streamKey) {
	t := s.table
	t.mu.Lock()
	held := t.streams[key]
	if held != nil {
		delete(t.streams, key)
		if t.byNode[held.node] == held {
			delete(t.byNode, held.node)
		}
	}
	t.mu.Unlock()
	if held != nil {
		s.stateMu.Lock()
		s.release(held)
		s.stateMu.Unlock()
	}
}

// heldFor returns what the stream whose requests carry node holds (nil:
// no open stream's node).
func (s *Server) heldFor(node *core.Node) *heldGroups {
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	return s.table.byNode[node]
}

// streamIdentity is what the xDS policy said of a stream when it opened:
// its Restriction and identity, and whether it is restricted.
func (s *Server) streamIdentity(key streamKey) (Restriction, string, bool) {
	if s.cfg.Restrict == nil {
		return nil, "", false
	}
	s.restrict.mu.Lock()
	defer s.restrict.mu.Unlock()
	r := s.restrict.byStream[key]
	if r == nil {
		return denyAll, "", true
	}
	return r.allow, r.who, r.allow != nil
}

// groupKeys returns the key of node's locality group, and for a gateway
// its view's key: they follow the network topology (a node naming only its
// cluster is on that cluster's network), so a stream's may change while
// its node does not.
func (s *Server) groupKeys(node *core.Node) (eds groupKey, viewKey string, gateway bool) {
	viewKey, client, gateway := s.classify(node)
	if !gateway {
		client = clientOf(node, s.topo.Load())
	} else if client.Network == "" {
		client.Network = clientOf(node, s.topo.Load()).Network
	}
	return groupKey{client: client}, viewKey, gateway
}

// acquire takes a reference on node's groups for a stream of identity who
// (allow: its Restriction), making them if the table admits them. Called
// with stateMu held.
func (s *Server) acquire(node *core.Node, allow Restriction, who string, restricted bool) (*heldGroups, error) {
	s.expireGroups()
	eds, viewKey, gateway := s.groupKeys(node)
	if n := eds.keyBytes(); n > MaxGroupKeyBytes {
		return nil, s.refuse(eds, boundKeyTooLong, codes.InvalidArgument,
			"the node's locality group (region, zone, network and cluster) is %d bytes; at most %d", n, MaxGroupKeyBytes)
	}
	held := &heldGroups{}
	if restricted {
		held.who = who
	}
	if gateway {
		vk := groupKey{gateway: true, view: viewKey}
		if n := vk.keyBytes(); n > MaxGroupKeyBytes {
			return nil, s.refuse(vk, boundKeyTooLong, codes.InvalidArgument, "the gateway's group key is %d bytes; at most %d", n, MaxGroupKeyBytes)
		}
		if s.cfg.Restrict != nil && allow != nil {
			// A gateway's resources carry every namespace's services: the policy
			// decides before anything is built for it.
			return nil, s.refuse(vk, boundNotAGateway, codes.PermissionDenied,
				"identity %q may not be a gateway: the xDS policy must grant a gateway's identity every namespace (\"*\")", limits.Truncate(who))
		}
		v, err := s.take(vk, "")
		if err != nil {
			return nil, err
		}
		held.view = v
	}
	e, err := s.take(eds, held.who)
	if err != nil {
		if held.view != nil {
			s.drop(held.view, "")
		}
		return nil, err
	}
	held.eds = e
	s.publishGroupMetrics()
	return held, nil
}

// take takes a reference on the group key for a stream of restricted
// identity who ("": unrestricted, or no stream), making it if needed.
// Called with stateMu held.
func (s *Server) take(key groupKey, who string) (*groupEntry, error) {
	t := s.table
	e := t.entries[key]
	if e == nil {
		if who != "" && t.byWho[who] >= MaxGroupsPerIdentity {
			return nil, s.refuse(key, boundPerIdentity, codes.ResourceExhausted,
				"identity %q holds %d locality groups; at most %d per identity", limits.Truncate(who), t.byWho[who], MaxGroupsPerIdentity)
		}
		if s.countGroups(key.gateway) >= s.groupBound(key.gateway) && !s.evictIdle(key.gateway) {
			return nil, s.refuse(key, boundTableFull, codes.ResourceExhausted,
				"all %d %s groups are held by open streams; try again later", s.groupBound(key.gateway), key.kind())
		}
		e = s.makeGroup(key)
	}
	e.refs++
	if who != "" {
		if e.holders == nil {
			e.holders = map[string]int{}
		}
		if e.holders[who] == 0 {
			t.byWho[who]++
		}
		e.holders[who]++
	}
	return e, nil
}

// release lets go of a stream's groups. Called with stateMu held.
func (s *Server) release(h *heldGroups) {
	if h.view != nil {
		s.drop(h.view, "")
	}
	if h.eds != nil {
		s.drop(h.eds, h.who)
	}
	s.expireGroups()
	s.publishGroupMetrics()
}

// drop takes a reference off e; the last makes it idle. Called with stateMu held.
func (s *Server) drop(e *groupEntry, who string) {
	t := s.table
	if who != "" {
		if e.holders[who]--; e.holders[who] <= 0 {
			delete(e.holders, who)
			if t.byWho[who]--; t.byWho[who] <= 0 {
				delete(t.byWho, who)
			}
		}
	}
	if e.refs--; e.refs <= 0 {
		e.refs = 0
		e.idleSince = t.now()
	}
}

// groupBound is the bound of a kind of group.
func (s *Server) groupBound(gateway bool) int {
	if gateway {
		return s.table.maxGateways
	}
	return s.cfg.MaxLocalityGroups
}

// countGroups is how many groups of a kind the table holds. Called with stateMu held.
func (s *Server) countGroups(gateway bool) int {
	n := 0
	for k := range s.table.entries {
		if k.gateway == gateway {
			n++
		}
	}
	return n
}

// evictIdle frees the least recently used idle group of a kind, and
// reports whether there was one. Called with stateMu held.
func (s *Server) evictIdle(gateway bool) bool {
	var lru *groupEntry
	for _, e := range s.table.entries {
		if e.key.gateway == gateway && e.refs == 0 && (lru == nil || e.idleSince.Before(lru.idleSince)) {
			lru = e
		}
	}
	if lru == nil {
		return false
	}
	s.freeGroup(lru)
	return true
}

// expireGroups frees the groups idle for longer than the idle timeout.
// Called with stateMu held.
func (s *Server) expireGroups() {
	t := s.table
	now := t.now()
	for _, e := range t.entries {
		if e.refs == 0 && now.Sub(e.idleSince) >= t.idleFor {
			s.freeGroup(e)
		}
	}
}

// makeGroup makes the group key's entry; a gateway group's caches are
// made and published now, filled with what is published. Called with
// stateMu held.
func (s *Server) makeGroup(key groupKey) *groupEntry {
	e := &groupEntry{key: key, idleSince: s.table.now()}
	if key.gateway {
		prefix := s.cfg.VersionPrefix + groupPrefix("gw-"+key.view+"-")
		e.view = &view{key: key.view,
			lds: newResourceCache(resource.ListenerType, prefix+"lds-", s.log, nil, nil),
			rds: newResourceCache(resource.RouteType, prefix+"rds-", s.log, nil, nil),
			cds: newResourceCache(resource.ClusterType, prefix+"cds-", s.log, nil, nil),
		}
		if s.built {
			s.buildView(e.view, time.Now())
		}
		next := maps.Clone(*s.views.Load())
		next[key.view] = e.view
		s.views.Store(&next)
		s.log.Info("new gateway group", "group", limits.Truncate(key.view))
	}
	// A locality group's EDS cache is built on the first EDS watch (see
	// groupCache): a stream holds its group from its first request, so
	// that it is admitted or refused at once, but a client that never asks
	// for endpoints costs no cache, and no change is traced to one.
	s.table.entries[key] = e
	return e
}

// groupPrefix is prefix, or a digest of it when it is longer than
// maxGroupPrefixBytes (still unique per group, as far as SHA-256 is; still
// ending in "-" before the counter).
func groupPrefix(prefix string) string {
	if len(prefix) <= maxGroupPrefixBytes {
		return prefix
	}
	sum := sha256.Sum256([]byte(prefix))
	return "h" + hex.EncodeToString(sum[:16]) + "-"
}

// freeGroup unpublishes an idle group; its caches go with it. Called with stateMu held.
func (s *Server) freeGroup(e *groupEntry) {
	delete(s.table.entries, e.key)
	if e.key.gateway {
		next := maps.Clone(*s.views.Load())
		delete(next, e.key.view)
		s.views.Store(&next)
	} else {
		next := maps.Clone(*s.groups.Load())
		delete(next, e.key.client)
		s.groups.Store(&next)
	}
	s.log.Debug("freed an idle group", "kind", e.key.kind())
}

// refuse counts and logs (rate-limited) a stream refused a group, and
// returns the status it ends with.
func (s *Server) refuse(key groupKey, bound string, code codes.Code, format string, args ...any) error {
	s.table.refused.WithLabelValues(key.kind(), bound).Inc()
	msg := fmt.Sprintf(format, args...)
	s.refusals.Warn("group_"+bound, "refused an xDS stream a group", "kind", key.kind(), "bound", bound, "detail", msg)
	return status.Error(code, msg)
}

// publishGroupMetrics sets the group gauges. Called with stateMu held.
func (s *Server) publishGroupMetrics() {
	var counts [2][2]int // [gateway][idle]
	for _, e := range s.table.entries {
		g, idle := 0, 0
		if e.key.gateway {
			g = 1
		}
		if e.refs == 0 {
			idle = 1
		}
		counts[g][idle]++
	}
	for g, kind := range []string{kindLocality, kindGateway} {
		s.table.groups.WithLabelValues(kind, "held").Set(float64(counts[g][0]))
		s.table.groups.WithLabelValues(kind, "idle").Set(float64(counts[g][1]))
	}
	s.metrics.groups.Set(float64(len(*s.groups.Load())))
}

// edsCache returns the EDS cache of a node's locality group: the one its
// stream holds; for a node of no open stream (tests, benchmarks), the
// group's, made idle if the table admits it (nil if not). The cache is
// built on first use.
func (s *Server) edsCache(node *core.Node) *resourceCache {
	h := s.heldFor(node)
	key := groupKey{client: s.clientFor(node)}
	if h != nil {
		key = h.eds.key
	}
	if c := (*s.groups.Load())[key.client]; c != nil {
		return c
	}
	if key.keyBytes() > MaxGroupKeyBytes {
		return nil
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if h != nil {
		return s.groupCache(h.eds) // the stream's reference keeps the entry
	}
	e, err := s.take(key, "")
	if err != nil {
		return nil
	}
	s.drop(e, "")
	c := s.groupCache(e)
	s.publishGroupMetrics()
	return c
}

// groupCache returns a locality group's EDS cache, building and
// publishing it, filled with what is published now, on first use. Called
// with stateMu held.
func (s *Server) groupCache(e *groupEntry) *resourceCache {
	if e.eds != nil {
		return e.eds
	}
	group := e.key.client
	initial := make(map[string]types.Resource, len(s.endpoints))
	sums := make(map[string]uint64, len(s.endpoints))
	t := s.topo.Load()
	for name, pe := range s.endpoints {
		initial[name], sums[name] = pe.forClient(group, t)
	}
	e.eds = newResourceCache(resource.EndpointType, s.cfg.VersionPrefix+groupPrefix(edsPrefix(group)), s.log, initial, sums)
	next := maps.Clone(*s.groups.Load())
	next[group] = e.eds
	s.groups.Store(&next)
	s.metrics.groups.Set(float64(len(next)))
	s.log.Info("new locality group", "region", limits.Truncate(group.Locality.Region), "zone", limits.Truncate(group.Locality.Zone),
		"network", limits.Truncate(string(group.Network)), "assignments", len(initial))
	return e.eds
}
