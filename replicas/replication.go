package replicas

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/internal/backoff"
	"github.com/navemesh/nave/internal/changelog"
	"github.com/navemesh/nave/registry"
)

// Hub-to-hub replication: every replica holds every cluster's shards. A
// spoke streams to one replica, its home, and the home sends the cluster's
// changes to every peer replica. Each replica runs a ReplicationServer (its
// peers subscribe to it) and a Replicator (it subscribes to each peer).
// Every cluster's data carries a Stamp, and a replica applies data only over
// older data, so a stale home can never overwrite newer data.

// Store is what replication needs from a hub replica's state.
type Store interface {
	// Replicas returns every cluster the replica holds and a channel closed
	// at the next change of any of them. Must not block; the returned values
	// are immutable. A cluster that leaves the map is not removed at peers:
	// to remove a cluster's data everywhere, keep it with no shards and a
	// newer stamp.
	Replicas() (map[registry.ClusterID]Cluster, <-chan struct{})
	// ApplyReplica applies a cluster's data received from a peer. It returns
	// ErrStale (wrapped) when the replica holds newer (or, for a delta,
	// different) data, and ErrBaseMismatch when a delta's base is not what
	// the replica holds (the caller then asks for a full state). It must not
	// block for long.
	ApplyReplica(ctx context.Context, from string, u Update) error
}

// Cluster is what a replica holds for one cluster.
type Cluster struct {
	Stamp   Stamp
	Digest  registry.Hash
	Network registry.Network
	// Gateways are the gateways the cluster announces for its network (immutable).
	Gateways []registry.Gateway
	Shards   Shards // nil: none
	// Changed, when not nil, names the services each change of the
	// cluster's data touched, up to this one (each change adds to it, one
	// that keeps the stamp too: the export policy's enforcement, a peer's
	// full state at the held stamp). A subscriber sent the cluster at an
	// earlier position of it is sent a delta of just those.
	Changed *changelog.Log[registry.ServiceKey]
	// Local: the cluster's latest change originated at this replica (a spoke
	// session here, or a decision of this replica as leader, e.g. dropping a
	// dead cluster): this replica sends its changes to subscribers. Changes a
	// replica received from peers are not forwarded (each change goes from
	// its origin to every peer directly).
	Local bool
	// Origin names the replica where the latest change originated, when it
	// is not this one (Update.Origin of the update applied), for
	// operators; it may be empty.
	Origin string
}

// Shards is one cluster's shards as a replica holds them: immutable.
// registry.ClusterView is one, ShardMap another.
type Shards interface {
	Len() int
	Get(registry.ServiceKey) (*registry.Shard, bool)
	All() iter.Seq2[registry.ServiceKey, *registry.Shard] // in no order
}

// ShardMap is Shards held in a map (which must not change once held).
type ShardMap map[registry.ServiceKey]*registry.Shard

func (m ShardMap) Len() int { return len(m) }

func (m ShardMap) Get(k registry.ServiceKey) (*registry.Shard, bool) {
	s, ok := m[k]
	return s, ok
}

func (m ShardMap) All() iter.Seq2[registry.ServiceKey, *registry.Shard] { return maps.All(m) }

// Update is a cluster's data received from a peer.
type Update struct {
	Cluster  registry.ClusterID
	Network  registry.Network
	Gateways []registry.Gateway
	Stamp    Stamp
	// Base is nil for a full state (replaces the cluster's shards: apply when
	// Stamp >= held stamp — equal means a resync) and otherwise the exact
	// stamp this delta applies on top of (apply only when held == *Base and
	// Stamp > *Base).
	Base *Stamp
	// Change is validated and normalized: for a full state, Replace with all
	// shards in Upserts; for a delta, Upserts and Removes.
	Change registry.Change
	// Origin is the replica the change came from.
	Origin string
}

// ErrStale marks replicated data that is not newer than what the replica
// holds: it is ignored.
var ErrStale = errors.New("replicas: the replica holds newer data")

// ErrBaseMismatch marks a replicated delta whose base is not what the
// replica holds: the replica asks the peer for a full state instead.
var ErrBaseMismatch = errors.New("replicas: delta base is not what the replica holds")

// ErrPartlyRefused marks an update applied without what this replica's
// policy refuses (the export policy): it holds the update's stamp with
// another digest than the peer, and asks for nothing again on that account.
var ErrPartlyRefused = errors.New("replicas: applied without what this replica refuses")

// ReplicationConfig is what an operator tunes of both sides of hub-to-hub
// replication: its intervals and bounds.
type ReplicationConfig struct {
	// DigestInterval is how often a replica sends subscribers the digests of
	// the clusters whose changes originate at it (anti-entropy), and how long
	// a subscriber tolerates holding older data than such a digest says.
	DigestInterval time.Duration
	// MinBackoff and MaxBackoff bound the exponential, jittered delay before
	// a subscription to a peer is opened again.
	MinBackoff, MaxBackoff time.Duration
	// MaxBufferedBytes bounds the chunks of one update a subscriber buffers
	// until the last one; a larger update is dropped.
	MaxBufferedBytes int
}

// DefaultReplicationConfig returns the intervals and bounds replicas use in
// production. Fields left zero take these values.
func DefaultReplicationConfig() ReplicationConfig {
	return ReplicationConfig{
		DigestInterval:   15 * time.Second,
		MinBackoff:       200 * time.Millisecond,
		MaxBackoff:       10 * time.Second,
		MaxBufferedBytes: 256 << 20,
	}
}

// ReplicationWiring is what the hub process hands both sides of
// replication at start, beside their ReplicationConfig: who the replica is,
// the bounds it shares with its spokes' sessions, and what observes it.
type ReplicationWiring struct {
	// ReplicaID names this replica to its peers; unique among them.
	ReplicaID string
	// PeerToken returns the secret replicas present to each other (see
	// federation.PeerTokens), read at every RPC so that a reloaded token
	// file takes effect at once; nil sends none (development).
	PeerToken func() string
	// MaxMessageBytes bounds every message a replica sends a subscriber
	// (updates are chunked to fit): the federation's
	// (federation.HubConfig), the same on every replica, since a
	// subscriber receives messages of up to twice its own. Zero: the
	// federation's default.
	MaxMessageBytes int
	// Limits bound each shard, and the services of each full state, received
	// from a peer: the federation's, the same validation as a spoke's updates.
	// Zero: registry.DefaultLimits.
	Limits registry.Limits
	// Hooks observe replication, for metrics.
	Hooks ReplicationHooks
}

// bounded returns w with the federation's default bounds where it sets
// none: a zero bound would refuse every message and every shard.
func (w ReplicationWiring) bounded() ReplicationWiring {
	if w.MaxMessageBytes <= 0 {
		w.MaxMessageBytes = federation.DefaultHubConfig().MaxMessageBytes
	}
	if w.Limits == (registry.Limits{}) {
		w.Limits = registry.DefaultLimits()
	}
	return w
}

// replicationSetup is a ReplicationConfig and ReplicationWiring together.
type replicationSetup struct {
	ReplicationConfig
	ReplicationWiring
}

// ReplicationHooks are optional observation hooks; nil fields are skipped.
// They are called from replication goroutines, concurrently, and must not
// block. Their values are few (cluster IDs and fixed words), fit for labels.
type ReplicationHooks struct {
	// Sent: an update of cluster (all its chunks) went to a subscriber; kind
	// is "full" or "delta".
	Sent func(cluster registry.ClusterID, kind string)
	// Applied: an update of cluster received from a peer was handled; result
	// is "applied", "stale" (the replica holds newer data: ignored),
	// "mismatch" (a delta on another base: a resync follows), "dropped"
	// (invalid, or larger than MaxBufferedBytes: nothing of it applied) or
	// "error" (the store refused it).
	Applied func(cluster registry.ClusterID, result string)
	// Resync: this replica asked a peer for a full state of cluster; reason
	// is "base" (a delta on another base), "digest" (same stamp, other
	// digest) or "behind" (an older stamp for longer than a digest interval).
	Resync func(cluster registry.ClusterID, reason string)
}

// withDefaults fills in the intervals and bounds left zero, so no zero can
// stall a loop or refuse everything.
func (cfg ReplicationConfig) withDefaults() ReplicationConfig {
	def := DefaultReplicationConfig()
	if cfg.DigestInterval <= 0 {
		cfg.DigestInterval = def.DigestInterval
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = def.MinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(def.MaxBackoff, cfg.MinBackoff)
	}
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = def.MaxBufferedBytes
	}
	return cfg
}

func (h ReplicationHooks) sent(c registry.ClusterID, kind string) {
	if h.Sent != nil {
		h.Sent(c, kind)
	}
}

func (h ReplicationHooks) applied(c registry.ClusterID, result string) {
	if h.Applied != nil {
		h.Applied(c, result)
	}
}

func (h ReplicationHooks) resync(c registry.ClusterID, reason string) {
	if h.Resync != nil {
		h.Resync(c, reason)
	}
}

// replicaHelloTimeout bounds the wait for a new subscription's hello.
const replicaHelloTimeout = 10 * time.Second

// errSubscriptionSuperseded ends a subscription when the same replica subscribes again.
var errSubscriptionSuperseded = errors.New("replicas: superseded by a newer subscription of the same replica")

// ReplicationServer serves the Replication service: it sends each
// subscribing peer a catch-up, then the changes of the clusters whose
// changes originate at this replica.
type ReplicationServer struct {
	fedv1.UnimplementedReplicationServer
	store Store
	cfg   replicationSetup
	log   *slog.Logger

	subscribersMu sync.Mutex
	subscribers   map[string]*subscriberEntry // by replica ID: the newest subscription of each
}

type subscriberEntry struct {
	cancel context.CancelCauseFunc
}

// NewReplicationServer returns a server that replicates store to subscribers.
func NewReplicationServer(store Store, cfg ReplicationConfig, w ReplicationWiring, log *slog.Logger) *ReplicationServer {
	return &ReplicationServer{
		store: store, cfg: replicationSetup{cfg.withDefaults(), w.bounded()},
		log:         log.With("component", "replication"),
		subscribers: map[string]*subscriberEntry{},
	}
}

// Subscribers returns the IDs of the replicas subscribed now, sorted.
func (s *ReplicationServer) Subscribers() []string {
	s.subscribersMu.Lock()
	defer s.subscribersMu.Unlock()
	return slices.Sorted(maps.Keys(s.subscribers))
}

// Subscribe implements the Replication service.
func (s *ReplicationServer) Subscribe(stream fedv1.Replication_SubscribeServer) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic in subscription", "panic", p, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
	}()
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	msgs, errc := federation.Receive(ctx, stream.Recv)

	var hello *fedv1.ReplicaHello
	timer := time.NewTimer(replicaHelloTimeout)
	select {
	case <-ctx.Done():
		timer.Stop()
		return ctx.Err()
	case err := <-errc:
		timer.Stop()
		return err
	case <-timer.C:
		return status.Error(codes.DeadlineExceeded, "no hello")
	case m := <-msgs:
		timer.Stop()
		if hello = m.GetHello(); hello == nil {
			return status.Errorf(codes.InvalidArgument, "the first message must be a hello, not %T", m.GetKind())
		}
	}
	id := hello.GetReplicaId()
	switch {
	case id == "":
		return status.Error(codes.InvalidArgument, "hello: no replica ID")
	case id == s.cfg.ReplicaID:
		return status.Errorf(codes.FailedPrecondition, "replica %s cannot subscribe to itself", id)
	}
	held := map[registry.ClusterID]clusterDigest{}
	for _, d := range hello.GetHeld() {
		if cd, err := clusterDigestFromProto(d); err == nil {
			held[cd.cluster] = cd
		}
	}
	if err := stream.Send(&fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Welcome{Welcome: &fedv1.ReplicaWelcome{ReplicaId: s.cfg.ReplicaID}}}); err != nil {
		return fmt.Errorf("send welcome: %w", err)
	}
	defer s.register(id, cancel)()
	sub := &subscription{
		srv: s, stream: stream, to: id,
		log:    s.log.With("subscriber", id, "remote", federation.PeerAddr(ctx)),
		sent:   map[registry.ClusterID]sentCluster{},
		forced: map[registry.ClusterID]string{},
	}
	sub.log.Info("replica subscribed", "held", len(held))
	err = sub.run(ctx, held, msgs, errc)
	if cause := context.Cause(ctx); errors.Is(cause, errSubscriptionSuperseded) {
		err = status.Error(codes.Aborted, cause.Error())
	}
	sub.log.Info("subscription ended", "err", err)
	return err
}

// register makes the subscription the newest of replica id, ending an older
// one (a subscriber that reconnects before its old stream broke), and
// returns the function that unregisters it.
func (s *ReplicationServer) register(id string, cancel context.CancelCauseFunc) (release func()) {
	e := &subscriberEntry{cancel: cancel}
	s.subscribersMu.Lock()
	if old := s.subscribers[id]; old != nil {
		old.cancel(errSubscriptionSuperseded)
	}
	s.subscribers[id] = e
	s.subscribersMu.Unlock()
	return func() {
		s.subscribersMu.Lock()
		defer s.subscribersMu.Unlock()
		if s.subscribers[id] == e {
			delete(s.subscribers, id)
		}
	}
}

// subscription is one subscriber's stream, owned by its handler goroutine.
type subscription struct {
	srv    *ReplicationServer
	stream fedv1.Replication_SubscribeServer
	to     string
	log    *slog.Logger
	// sent is what the subscriber was last sent of each Local cluster: the
	// base of the next delta.
	sent map[registry.ClusterID]sentCluster
	// forced holds the clusters the subscriber asked to resync, and why.
	forced map[registry.ClusterID]string
}

type sentCluster struct {
	stamp    Stamp
	network  registry.Network
	gateways []registry.Gateway
	shards   Shards             // what was sent, for a delta the Changed log does not reach
	changed  changelog.Position // where what was sent is in the Changed log (a change may keep the stamp)
}

func sentOf(c Cluster) sentCluster {
	return sentCluster{stamp: c.Stamp, network: c.Network, gateways: c.Gateways, shards: c.Shards, changed: c.Changed.Position()}
}

func (s *subscription) run(ctx context.Context, held map[registry.ClusterID]clusterDigest, msgs <-chan *fedv1.ReplicaRequest, errc <-chan error) error {
	// Catch-up: everything the subscriber does not hold exactly so.
	snap, changed := s.srv.store.Replicas()
	for _, id := range slices.Sorted(maps.Keys(snap)) {
		c := snap[id]
		if h, ok := held[id]; ok && h.stamp == c.Stamp && h.digest == c.Digest {
			if c.Local {
				s.sent[id] = sentOf(c)
			}
			continue
		}
		if err := s.sendFull(id, c); err != nil {
			return err
		}
	}
	// The first digests end the catch-up.
	if err := s.sendDigests(snap); err != nil {
		return err
	}
	ticker := time.NewTicker(s.srv.cfg.DigestInterval)
	defer ticker.Stop()
	for {
		digestDue := false
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-msgs:
			if err := s.handle(m); err != nil {
				return err
			}
		case <-changed:
		case <-ticker.C:
			digestDue = true
		}
		// Whatever woke us, send what changed since, from the latest state:
		// changes that came in a burst go out as one update.
		snap, changed = s.srv.store.Replicas()
		if err := s.sync(snap); err != nil {
			return err
		}
		if digestDue {
			if err := s.sendDigests(snap); err != nil {
				return err
			}
		}
	}
}

func (s *subscription) handle(m *fedv1.ReplicaRequest) error {
	switch k := m.GetKind().(type) {
	case *fedv1.ReplicaRequest_Resync:
		id := registry.ClusterID(k.Resync.GetClusterId())
		if err := registry.ValidateClusterID(id); err != nil {
			return status.Errorf(codes.InvalidArgument, "resync: %v", err)
		}
		s.log.Info("subscriber asked for a resync", "cluster", id, "reason", k.Resync.GetReason())
		s.forced[id] = k.Resync.GetReason()
		return nil
	default:
		return status.Errorf(codes.InvalidArgument, "unexpected %T after the hello", k)
	}
}

// sync answers the resync requests, then sends every Local cluster that
// changed since it was last sent: a delta on top of what was sent, or a full
// state when nothing was.
func (s *subscription) sync(snap map[registry.ClusterID]Cluster) error {
	for id := range s.sent {
		if c, ok := snap[id]; !ok || !c.Local {
			// Another replica's now: what the subscriber holds is theirs to
			// change. Should it come back here, it starts with a full state.
			delete(s.sent, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(s.forced)) {
		c, ok := snap[id]
		if !ok {
			s.log.Info("subscriber asked for a resync of a cluster this replica does not hold", "cluster", id)
			continue
		}
		if err := s.sendFull(id, c); err != nil {
			return err
		}
	}
	clear(s.forced)
	for _, id := range slices.Sorted(maps.Keys(snap)) {
		c := snap[id]
		if !c.Local {
			continue
		}
		prev, ok := s.sent[id]
		switch {
		case ok && prev.stamp == c.Stamp && prev.network == c.Network && slices.Equal(prev.gateways, c.Gateways):
			continue // unchanged (or just resynced)
		case ok && prev.stamp.Less(c.Stamp):
			if err := s.sendDelta(id, prev, c); err != nil {
				return err
			}
		default:
			// Nothing sent yet, or changed without a newer stamp: only a full
			// state (applied at an equal stamp too) says it.
			if err := s.sendFull(id, c); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *subscription) head(id registry.ClusterID, c Cluster) *fedv1.ReplicaUpdate {
	origin := c.Origin
	if c.Local {
		origin = s.srv.cfg.ReplicaID
	}
	return &fedv1.ReplicaUpdate{ClusterId: string(id), Network: string(c.Network), Stamp: stampToProto(c.Stamp), Origin: origin,
		Gateways: federation.GatewaysToProto(c.Gateways)}
}

func (s *subscription) sendFull(id registry.ClusterID, c Cluster) error {
	head := s.head(id, c)
	head.FullState = true
	var shards []*registry.Shard
	if c.Shards != nil {
		shards = make([]*registry.Shard, 0, c.Shards.Len())
		for _, sh := range c.Shards.All() {
			shards = append(shards, sh)
		}
	}
	slices.SortFunc(shards, func(a, b *registry.Shard) int { return a.Service.Compare(b.Service) })
	chunks, err := sendChunked(head, nil, shards, s.srv.cfg.MaxMessageBytes, s.sendUpdate)
	if err != nil {
		return err
	}
	s.log.Debug("sent full state", "cluster", id, "stamp", c.Stamp, "services", len(shards), "chunks", chunks)
	s.srv.cfg.Hooks.sent(id, "full")
	if c.Local {
		s.sent[id] = sentOf(c)
	}
	return nil
}

func (s *subscription) sendDelta(id registry.ClusterID, prev sentCluster, c Cluster) error {
	upserts, removes := changesSince(prev, c)
	slices.SortFunc(upserts, func(a, b *registry.Shard) int { return a.Service.Compare(b.Service) })
	slices.SortFunc(removes, registry.ServiceKey.Compare)
	head := s.head(id, c)
	head.Base = stampToProto(prev.stamp)
	chunks, err := sendChunked(head, removes, upserts, s.srv.cfg.MaxMessageBytes, s.sendUpdate)
	if err != nil {
		return err
	}
	s.log.Debug("sent delta", "cluster", id, "base", prev.stamp, "stamp", c.Stamp,
		"upserts", len(upserts), "removes", len(removes), "chunks", chunks)
	s.srv.cfg.Hooks.sent(id, "delta")
	s.sent[id] = sentOf(c)
	return nil
}

// changesSince returns what takes a subscriber from prev to c: the services
// c.Changed names since what prev was sent, else those that differ.
func changesSince(prev sentCluster, c Cluster) (upserts []*registry.Shard, removes []registry.ServiceKey) {
	keys, ok := c.Changed.Since(prev.changed)
	if !ok {
		return compareShards(prev.shards, c.Shards)
	}
	for _, k := range keys {
		if sh, ok := get(c.Shards, k); ok {
			upserts = append(upserts, sh)
		} else if _, had := get(prev.shards, k); had {
			removes = append(removes, k)
		}
	}
	return upserts, removes
}

// compareShards returns what takes a holder of old to cur, by comparing every shard.
func compareShards(old, cur Shards) (upserts []*registry.Shard, removes []registry.ServiceKey) {
	if cur != nil {
		for k, sh := range cur.All() {
			if o, _ := get(old, k); o != sh && !o.Equal(sh) {
				upserts = append(upserts, sh)
			}
		}
	}
	if old != nil {
		for k := range old.All() {
			if _, ok := get(cur, k); !ok {
				removes = append(removes, k)
			}
		}
	}
	return upserts, removes
}

// get is s.Get for s that may be nil.
func get(s Shards, k registry.ServiceKey) (*registry.Shard, bool) {
	if s == nil {
		return nil, false
	}
	return s.Get(k)
}

// count is s.Len for s that may be nil.
func count(s Shards) int {
	if s == nil {
		return 0
	}
	return s.Len()
}

func (s *subscription) sendUpdate(u *fedv1.ReplicaUpdate) error {
	if err := s.stream.Send(&fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Update{Update: u}}); err != nil {
		return fmt.Errorf("send update: %w", err)
	}
	return nil
}

// sendDigests sends the digest of every Local cluster.
func (s *subscription) sendDigests(snap map[registry.ClusterID]Cluster) error {
	d := &fedv1.ReplicaDigests{}
	for _, id := range slices.Sorted(maps.Keys(snap)) {
		if c := snap[id]; c.Local {
			d.Clusters = append(d.Clusters, clusterDigestOf(id, c))
		}
	}
	if err := s.stream.Send(&fedv1.ReplicaMessage{Kind: &fedv1.ReplicaMessage_Digests{Digests: d}}); err != nil {
		return fmt.Errorf("send digests: %w", err)
	}
	return nil
}

// replicaEnvelopeBytes is room left in every message for what surrounds the
// update (the message's own tag and length, last_chunk).
const replicaEnvelopeBytes = 16

// sendChunked sends an update (head, with removes and upserts) as chunks of
// no more than maxBytes each, in order, the last one marked; there is always
// at least one. It encodes one chunk at a time, so a full state of any size
// costs one chunk of memory. A shard larger than a chunk alone still goes,
// alone: the hub accepts no such shard from a spoke, so only a peer with a
// larger budget than this replica's can have one.
func sendChunked(head *fedv1.ReplicaUpdate, removes []registry.ServiceKey, upserts []*registry.Shard, maxBytes int, send func(*fedv1.ReplicaUpdate) error) (chunks int, err error) {
	budget := maxBytes - proto.Size(head) - replicaEnvelopeBytes
	next := func() *fedv1.ReplicaUpdate {
		return &fedv1.ReplicaUpdate{
			ClusterId: head.ClusterId, Network: head.Network, Stamp: head.Stamp,
			FullState: head.FullState, Base: head.Base, Origin: head.Origin, Gateways: head.Gateways,
		}
	}
	cur := next()
	flush := func(last bool) error {
		cur.LastChunk = last
		chunks++
		err := send(cur)
		cur = next()
		return err
	}
	c := federation.Chunker{Budget: budget}
	// room flushes the chunk when an item of n bytes does not fit in it.
	room := func(n int) error {
		if c.Next(n) {
			return flush(false)
		}
		return nil
	}
	for _, k := range removes {
		p := federation.KeyToProto(k)
		if err := room(federation.ItemBytes(p)); err != nil {
			return chunks, err
		}
		cur.Removes = append(cur.Removes, p)
	}
	for _, sh := range upserts {
		p := federation.ShardToProto(sh)
		if err := room(federation.ItemBytes(p)); err != nil {
			return chunks, err
		}
		cur.Upserts = append(cur.Upserts, p)
	}
	return chunks, flush(true)
}

// PeerStatus is where this replica's subscription to one peer stands.
type PeerStatus struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// Connected: the peer welcomed the current subscription.
	Connected bool `json:"connected"`
	// Synced: the peer has caught this replica up (it holds everything the
	// peer held when the subscription began, or newer).
	Synced bool `json:"synced"`
	// LastError says why the last subscription ended.
	LastError string `json:"lastError,omitempty"`
}

// Replicator keeps this replica subscribed to every peer and applies what
// they send to its store.
type Replicator struct {
	store    Store
	cfg      replicationSetup
	log      *slog.Logger
	dialOpts []grpc.DialOption

	peersMu      sync.Mutex
	peers        map[string]string // the peers to follow: replica ID -> address
	peersChanged chan struct{}     // one pending notice of a change of peers

	statusMu sync.Mutex
	status   map[string]*PeerStatus
}

// NewReplicator returns a replicator that reaches peers over transport
// (TLS, or insecure.NewCredentials() on a trusted network) and presents
// w.PeerToken to them; without transport security the token travels in
// clear, the operator's choice. Nothing happens before Run.
func NewReplicator(store Store, cfg ReplicationConfig, w ReplicationWiring, transport credentials.TransportCredentials, log *slog.Logger) *Replicator {
	cfg, w = cfg.withDefaults(), w.bounded()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		// A chunk may exceed the budget by what surrounds it, and a shard
		// can be as large as a peer's budget.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(2 * w.MaxMessageBytes)),
		// Detects a peer that stopped answering (e.g. SIGSTOPped) while its
		// kernel keeps the connection open; the hub allows pings every 10s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// Reconnect as quickly as subscriptions retry, not gRPC's default of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: cfg.MinBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: cfg.MaxBackoff},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if w.PeerToken != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(federation.TokenFunc{
			Get: w.PeerToken, AllowInsecure: transport.Info().SecurityProtocol == "insecure",
		}))
	}
	return &Replicator{
		store: store, cfg: replicationSetup{cfg, w}, dialOpts: opts,
		log:          log.With("component", "replication"),
		peersChanged: make(chan struct{}, 1),
		status:       map[string]*PeerStatus{},
	}
}

// SetPeers sets the peers to subscribe to (replica ID -> replication
// address), replacing the last set: subscriptions to peers that left end,
// new peers are subscribed to. It never blocks; Run applies the latest set.
// This replica's own ID is ignored.
func (r *Replicator) SetPeers(peers map[string]string) {
	r.peersMu.Lock()
	r.peers = maps.Clone(peers)
	r.peersMu.Unlock()
	select {
	case r.peersChanged <- struct{}{}:
	default: // a notice is pending; it will read the latest set
	}
}

// Status returns where the subscription to each peer stands, sorted by ID.
func (r *Replicator) Status() []PeerStatus {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	out := make([]PeerStatus, 0, len(r.status))
	for _, id := range slices.Sorted(maps.Keys(r.status)) {
		out = append(out, *r.status[id])
	}
	return out
}

func (r *Replicator) setStatus(id string, update func(*PeerStatus)) {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	if s := r.status[id]; s != nil {
		update(s)
	}
}

// peerRun is the goroutine that follows one peer.
type peerRun struct {
	addr   string
	cancel context.CancelFunc
	done   chan struct{}
}

func (p *peerRun) stop() {
	p.cancel()
	<-p.done
}

// Run follows the peers SetPeers names until ctx ends, then ends every
// subscription before it returns.
func (r *Replicator) Run(ctx context.Context) {
	running := map[string]*peerRun{}
	defer func() {
		for id, p := range running {
			p.stop()
			r.forget(id)
		}
	}()
	for {
		r.reconcile(ctx, running)
		select {
		case <-ctx.Done():
			return
		case <-r.peersChanged:
		}
	}
}

// reconcile ends the subscriptions to peers no longer wanted (or moved to
// another address) and starts those to new peers.
func (r *Replicator) reconcile(ctx context.Context, running map[string]*peerRun) {
	r.peersMu.Lock()
	want := r.peers
	r.peersMu.Unlock()
	for id, p := range running {
		if addr, ok := want[id]; !ok || addr != p.addr {
			r.log.Info("unsubscribing from peer", "peer", id, "addr", p.addr)
			p.stop()
			delete(running, id)
			r.forget(id)
		}
	}
	for id, addr := range want {
		if _, ok := running[id]; ok || id == r.cfg.ReplicaID {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		p := &peerRun{addr: addr, cancel: cancel, done: make(chan struct{})}
		running[id] = p
		r.statusMu.Lock()
		r.status[id] = &PeerStatus{ID: id, Addr: addr}
		r.statusMu.Unlock()
		go func() {
			defer close(p.done)
			r.follow(pctx, id, addr)
		}()
	}
}

func (r *Replicator) forget(id string) {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	delete(r.status, id)
}

// follow keeps a subscription to one peer open until ctx ends, opening it
// again after exponential, jittered backoff whenever it breaks.
func (r *Replicator) follow(ctx context.Context, id, addr string) {
	log := r.log.With("peer", id, "addr", addr)
	conn, err := grpc.NewClient(addr, r.dialOpts...)
	if err != nil {
		// Only a malformed address gets here: wait for the next set of peers.
		log.Error("cannot subscribe to peer", "err", err)
		r.setStatus(id, func(s *PeerStatus) { s.LastError = err.Error() })
		<-ctx.Done()
		return
	}
	defer conn.Close()
	client := fedv1.NewReplicationClient(conn)
	// The wait ends early once the peer's port answers again.
	retry := backoff.New(backoff.Config{Min: r.cfg.MinBackoff, Max: r.cfg.MaxBackoff, Target: addr, Conn: conn})
	for {
		synced, err := r.safeSession(ctx, client, id, log)
		r.setStatus(id, func(s *PeerStatus) {
			s.Connected, s.Synced = false, false
			if err != nil {
				s.LastError = err.Error()
			}
		})
		if ctx.Err() != nil {
			return
		}
		if synced {
			retry.Reset() // it worked for a while: retry soon
		}
		d := retry.Next()
		log.Warn("subscription to peer ended; subscribing again", "err", err, "in", d.Round(time.Millisecond))
		if !retry.Sleep(ctx, d) {
			return
		}
	}
}

func (r *Replicator) safeSession(ctx context.Context, client fedv1.ReplicationClient, id string, log *slog.Logger) (synced bool, err error) {
	s := &peerSession{
		r: r, peer: id, log: log,
		asked:   map[registry.ClusterID]time.Time{},
		behind:  map[registry.ClusterID]time.Time{},
		refused: map[registry.ClusterID]Stamp{},
	}
	defer func() {
		if p := recover(); p != nil {
			synced, err = s.synced, fmt.Errorf("panic in subscription: %v\n%s", p, debug.Stack())
		}
	}()
	err = s.run(ctx, client)
	return s.synced, err
}

// peerSession is one subscription to a peer, owned by its follow goroutine.
type peerSession struct {
	r      *Replicator
	peer   string
	log    *slog.Logger
	stream fedv1.Replication_SubscribeClient
	synced bool
	// partial is the update whose chunks are arriving.
	partial *inbound
	// asked holds when a resync of each cluster was asked for: not again
	// before a digest interval passed (the answer is on its way).
	asked map[registry.ClusterID]time.Time
	// behind holds since when the peer's digests have said it holds a newer
	// stamp of a cluster than this replica.
	behind map[registry.ClusterID]time.Time
	// refused holds the stamp of each cluster's last update dropped as
	// invalid or too large: a digest of that stamp asks for no resync,
	// which would only bring the same update again.
	refused map[registry.ClusterID]Stamp
}

func (s *peerSession) run(ctx context.Context, client fedv1.ReplicationClient) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Subscribe(ctx)
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	s.stream = stream
	snap, _ := s.r.store.Replicas()
	hello := &fedv1.ReplicaHello{ReplicaId: s.r.cfg.ReplicaID}
	for _, id := range slices.Sorted(maps.Keys(snap)) {
		hello.Held = append(hello.Held, clusterDigestOf(id, snap[id]))
	}
	if err := s.send(&fedv1.ReplicaRequest{Kind: &fedv1.ReplicaRequest_Hello{Hello: hello}}); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("await welcome: %w", err)
	}
	welcome := first.GetWelcome()
	switch {
	case welcome == nil:
		return fmt.Errorf("peer answered the hello with %T, not a welcome", first.GetKind())
	case welcome.GetReplicaId() != s.peer:
		// Membership is behind: the address now belongs to another replica.
		return fmt.Errorf("the peer at this address is replica %q, not %q", welcome.GetReplicaId(), s.peer)
	}
	s.r.setStatus(s.peer, func(st *PeerStatus) { st.Connected = true })
	s.log.Info("subscribed to peer", "held", len(hello.Held))
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch k := m.GetKind().(type) {
		case *fedv1.ReplicaMessage_Update:
			err = s.update(ctx, k.Update)
		case *fedv1.ReplicaMessage_Digests:
			err = s.digests(k.Digests)
		default:
			err = fmt.Errorf("unexpected %T from the peer", k)
		}
		if err != nil {
			return err
		}
	}
}

// inbound is an update whose chunks are arriving.
type inbound struct {
	cluster  registry.ClusterID
	network  registry.Network
	gateways []registry.Gateway
	origin   string
	stamp    Stamp
	base     *Stamp
	upserts  []*registry.Shard
	removes  []registry.ServiceKey
	dec      *federation.Decoder // across the update's chunks
	bytes    int
	// dropped says why the update will not be applied; its remaining chunks are skipped.
	dropped string
}

func newInbound(u *fedv1.ReplicaUpdate) *inbound {
	in := &inbound{
		cluster: registry.ClusterID(u.GetClusterId()), network: registry.Network(u.GetNetwork()),
		origin: u.GetOrigin(), stamp: stampFromProto(u.GetStamp()),
	}
	in.dec = &federation.Decoder{Cluster: in.cluster}
	if !u.GetFullState() {
		b := stampFromProto(u.GetBase())
		in.base = &b
	}
	gws, gwErr := federation.GatewaysFromProto(u.GetGateways())
	in.gateways = gws
	switch {
	case registry.ValidateClusterID(in.cluster) != nil:
		in.dropped = fmt.Sprintf("cluster ID %q is not a DNS label", in.cluster)
	case u.GetStamp() == nil:
		in.dropped = "no stamp"
	case gwErr != nil:
		in.dropped = gwErr.Error()
	case u.GetFullState() && u.GetBase() != nil:
		in.dropped = "a full state has no base"
	case !u.GetFullState() && (u.GetBase() == nil || !in.base.Less(in.stamp)):
		in.dropped = fmt.Sprintf("a delta to %s needs an older base, not %s", in.stamp, stampFromProto(u.GetBase()))
	}
	return in
}

// continues reports whether u is a chunk of the same update as in.
func (in *inbound) continues(u *fedv1.ReplicaUpdate) bool {
	return string(in.cluster) == u.GetClusterId() && in.stamp == stampFromProto(u.GetStamp()) &&
		(in.base == nil) == u.GetFullState() && (in.base == nil || *in.base == stampFromProto(u.GetBase()))
}

// add validates and buffers a chunk, exactly as a spoke's update is checked.
func (in *inbound) add(u *fedv1.ReplicaUpdate, lim registry.Limits, maxBytes int) {
	if in.dropped != "" {
		return
	}
	if in.bytes += proto.Size(u); in.bytes > maxBytes {
		in.drop(fmt.Sprintf("larger than the %d bytes a replica buffers", maxBytes))
		return
	}
	if in.base == nil && len(u.GetRemoves()) > 0 {
		in.drop("a full state cannot remove services")
		return
	}
	in.dec.Limits = lim
	for _, p := range u.GetUpserts() {
		sh, err := in.dec.Shard(p)
		if err != nil {
			in.drop(err.Error())
			return
		}
		in.upserts = append(in.upserts, sh)
	}
	for _, p := range u.GetRemoves() {
		k, err := in.dec.Key(p, "remove", "service %s is both upserted and removed")
		if err != nil {
			in.drop(err.Error())
			return
		}
		in.removes = append(in.removes, k)
	}
	if in.base == nil && len(in.upserts) > lim.MaxServicesPerCluster {
		in.drop(fmt.Sprintf("more than %d services", lim.MaxServicesPerCluster))
	}
}

func (in *inbound) drop(reason string) {
	in.dropped, in.upserts, in.removes, in.dec = reason, nil, nil, nil
}

func (in *inbound) kind() string {
	if in.base == nil {
		return "full"
	}
	return "delta"
}

// update buffers a chunk and applies the update once its last chunk arrived.
func (s *peerSession) update(ctx context.Context, u *fedv1.ReplicaUpdate) error {
	if s.partial != nil && !s.partial.continues(u) {
		s.log.Warn("peer abandoned an update before its last chunk", "cluster", s.partial.cluster, "stamp", s.partial.stamp)
		s.partial = nil
	}
	if s.partial == nil {
		s.partial = newInbound(u)
	}
	in := s.partial
	in.add(u, s.r.cfg.Limits, s.r.cfg.MaxBufferedBytes)
	if !u.GetLastChunk() {
		return nil
	}
	s.partial = nil
	hooks := s.r.cfg.Hooks
	log := s.log.With("cluster", in.cluster, "stamp", in.stamp, "kind", in.kind())
	if in.dropped != "" {
		log.Error("dropped an invalid update from a peer; nothing of it applied", "reason", in.dropped)
		hooks.applied(in.cluster, "dropped")
		s.refused[in.cluster] = in.stamp
		if in.base == nil {
			delete(s.asked, in.cluster) // the answer came
		}
		return nil
	}
	origin := in.origin
	if origin == "" {
		origin = s.peer
	}
	ru := Update{Cluster: in.cluster, Network: in.network, Gateways: in.gateways, Stamp: in.stamp, Base: in.base, Origin: origin,
		Change: registry.Change{Cluster: in.cluster, Replace: in.base == nil, Upserts: in.upserts, Removes: in.removes}}
	err := s.r.store.ApplyReplica(ctx, s.peer, ru)
	switch {
	case err == nil:
		log.Debug("applied an update from a peer", "upserts", len(in.upserts), "removes", len(in.removes))
		hooks.applied(in.cluster, "applied")
		delete(s.refused, in.cluster)
	case errors.Is(err, ErrPartlyRefused):
		log.Info("applied an update from a peer without what this replica refuses", "why", err)
		hooks.applied(in.cluster, "partly_refused")
		s.refused[in.cluster] = in.stamp // its digest differs here for good: no resync for it
	case errors.Is(err, ErrStale):
		log.Debug("ignored a stale update from a peer", "why", err)
		hooks.applied(in.cluster, "stale")
	case errors.Is(err, ErrBaseMismatch):
		log.Info("a delta from a peer does not apply here; asking for a full state", "why", err)
		hooks.applied(in.cluster, "mismatch")
		return s.resync(in.cluster, "base", err.Error())
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		log.Error("could not apply an update from a peer", "err", err)
		hooks.applied(in.cluster, "error")
	}
	if in.base == nil {
		delete(s.asked, in.cluster) // the answer came
	}
	return nil
}

// digests compares the peer's digests with what this replica holds and asks
// for a resync where they differ for good (anti-entropy). The first digests
// end the catch-up.
func (s *peerSession) digests(m *fedv1.ReplicaDigests) error {
	if !s.synced {
		s.synced = true
		s.r.setStatus(s.peer, func(st *PeerStatus) { st.Synced = true })
		s.log.Info("caught up with peer")
	}
	snap, _ := s.r.store.Replicas()
	now := time.Now()
	named := make(map[registry.ClusterID]bool, len(m.GetClusters()))
	for _, p := range m.GetClusters() {
		d, err := clusterDigestFromProto(p)
		if err != nil {
			s.log.Warn("peer sent an invalid digest", "err", err)
			continue
		}
		named[d.cluster] = true
		held, ok := snap[d.cluster]
		switch {
		case ok && held.Stamp == d.stamp && held.Digest == d.digest:
			delete(s.behind, d.cluster)
		case ok && held.Stamp == d.stamp && s.refused[d.cluster] == d.stamp:
			delete(s.behind, d.cluster) // applied without what this replica refuses: the digests differ
		case ok && held.Stamp == d.stamp:
			delete(s.behind, d.cluster)
			why := fmt.Sprintf("same stamp %s, digest %s here and %s at the peer", d.stamp, held.Digest, d.digest)
			if err := s.resync(d.cluster, "digest", why); err != nil {
				return err
			}
		case ok && d.stamp.Less(held.Stamp):
			delete(s.behind, d.cluster) // this replica holds newer data
		case s.refused[d.cluster] == d.stamp && !d.stamp.IsZero():
			// That update was dropped here; asking again would bring it again.
		default:
			since, seen := s.behind[d.cluster]
			if !seen {
				s.behind[d.cluster] = now // may be in flight: give it an interval
				continue
			}
			if now.Sub(since) > s.r.cfg.DigestInterval {
				delete(s.behind, d.cluster)
				why := fmt.Sprintf("holding %s while the peer has held %s since %s", held.Stamp, d.stamp, since.Format(time.RFC3339))
				if err := s.resync(d.cluster, "behind", why); err != nil {
					return err
				}
			}
		}
	}
	for id := range s.behind {
		if !named[id] {
			delete(s.behind, id)
		}
	}
	return nil
}

// resync asks the peer for a full state of a cluster, unless it was asked
// less than a digest interval ago.
func (s *peerSession) resync(cluster registry.ClusterID, reason, why string) error {
	if at, ok := s.asked[cluster]; ok && time.Since(at) < s.r.cfg.DigestInterval {
		return nil
	}
	s.asked[cluster] = time.Now()
	s.log.Info("asking peer for a full state", "cluster", cluster, "reason", reason, "why", why)
	s.r.cfg.Hooks.resync(cluster, reason)
	req := &fedv1.ReplicaResync{ClusterId: string(cluster), Reason: reason + ": " + why}
	if err := s.send(&fedv1.ReplicaRequest{Kind: &fedv1.ReplicaRequest_Resync{Resync: req}}); err != nil {
		return fmt.Errorf("send resync: %w", err)
	}
	return nil
}

// send sends a request. When the stream has ended, Send only says io.EOF:
// the peer's reason (e.g. Unauthenticated) is what Recv returns.
func (s *peerSession) send(m *fedv1.ReplicaRequest) error {
	err := s.stream.Send(m)
	if errors.Is(err, io.EOF) {
		if _, rerr := s.stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
			return rerr
		}
	}
	return err
}

// clusterDigest is what a replica holds for a cluster, as digests carry it.
type clusterDigest struct {
	cluster registry.ClusterID
	stamp   Stamp
	digest  registry.Hash
}

func clusterDigestOf(id registry.ClusterID, c Cluster) *fedv1.ClusterDigest {
	return &fedv1.ClusterDigest{ClusterId: string(id), Stamp: stampToProto(c.Stamp), Digest: c.Digest.String(), Services: uint32(count(c.Shards))}
}

func clusterDigestFromProto(p *fedv1.ClusterDigest) (clusterDigest, error) {
	d := clusterDigest{cluster: registry.ClusterID(p.GetClusterId()), stamp: stampFromProto(p.GetStamp())}
	if err := registry.ValidateClusterID(d.cluster); err != nil {
		return d, err
	}
	if err := d.digest.UnmarshalText([]byte(p.GetDigest())); err != nil {
		return d, fmt.Errorf("cluster %s: %w", d.cluster, err)
	}
	return d, nil
}

func stampToProto(s Stamp) *fedv1.Stamp { return &fedv1.Stamp{Epoch: s.Epoch, Version: s.Version} }

func stampFromProto(p *fedv1.Stamp) Stamp {
	return Stamp{Epoch: p.GetEpoch(), Version: p.GetVersion()}
}
