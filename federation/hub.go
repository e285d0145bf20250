package federation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/navemesh/nave/exportpolicy"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/limits"
	"github.com/navemesh/nave/registry"
)

// ErrSuperseded marks an update from a session whose epoch is no longer the cluster's newest.
var ErrSuperseded = errors.New("federation: session superseded by a newer epoch")

// Reasons the hub refuses what a spoke sends, for its rate-limited log.
const (
	refusedHello    = "hello"
	refusedUpdate   = "update"
	refusedGateways = "gateways"
	refusedDigest   = "digest_mismatch"
)

// ErrOverLimit marks a change that would make a cluster hold more than its limits allow.
var ErrOverLimit = errors.New("federation: over the cluster's limits")

// LimitError refuses a change that would take a cluster over its limits. It
// names the services that would grow the cluster, so the spoke can hold just
// those back and everything else still flows.
type LimitError struct {
	Services []registry.ServiceKey
	Reason   string
}

func (e *LimitError) Error() string { return e.Reason }

// Unwrap makes errors.Is(err, ErrOverLimit) true.
func (e *LimitError) Unwrap() error { return ErrOverLimit }

// Held is what the hub holds for a cluster: the (epoch, version) of the last
// update applied, and the digest of the cluster's shards.
type Held struct {
	Epoch   uint64
	Version uint64
	Digest  registry.Hash
}

// Session describes a live spoke session.
type Session struct {
	Cluster  registry.ClusterID
	Network  registry.Network
	SpokeID  string
	Build    string
	Epoch    uint64
	Started  time.Time
	RemoteIP string
	// Gateways are the gateways the spoke announced for the cluster's
	// network in its hello, when GatewaysKnown (otherwise the hub keeps
	// what it holds).
	Gateways      []registry.Gateway
	GatewaysKnown bool
	// Acked is what the spoke says the hub last acknowledged to it: when the
	// hub holds exactly that, the session resumes (see Resumes).
	Acked Held
}

// Resumes reports whether a session that finds held continues from it,
// without a full state: the hub holds exactly what the spoke had acknowledged.
func (s Session) Resumes(held Held) bool {
	return s.Acked.Epoch != 0 && held == s.Acked
}

// Store is what a hub session needs from the process that owns the merged
// registry. Implementations serialize calls per cluster themselves.
type Store interface {
	// Begin starts session s: from then on Apply fails with ErrSuperseded for
	// every older epoch of the cluster. It returns what the hub holds, read
	// after that fence, so no older session can change it afterwards. It fails
	// with ErrSuperseded when a newer session of the cluster has begun. When
	// the session resumes (s.Resumes of what it returns), the store re-stamps
	// what it holds with the session's epoch (same version and digest): the
	// newer epoch is what fences older sessions at every hub replica, and the
	// spoke takes the session's epoch as its acknowledged one.
	Begin(ctx context.Context, s Session) (Held, error)
	// Held returns what the hub holds for the cluster.
	Held(ctx context.Context, cluster registry.ClusterID) (Held, error)
	// Apply applies a validated change stamped with (epoch, version) and returns
	// the digest of what the hub then holds for the cluster. It fails with
	// ErrSuperseded when a newer epoch of the cluster has begun, and with a
	// *LimitError (changing nothing) when the cluster would exceed its limits.
	Apply(ctx context.Context, epoch, version uint64, change registry.Change) (registry.Hash, error)
	// End reports that session s is over.
	End(s Session)
	// SetGateways records the gateways (validated, normalized) the cluster's
	// session of epoch announces for its network. It fails with
	// ErrSuperseded when a newer epoch of the cluster has begun.
	SetGateways(ctx context.Context, cluster registry.ClusterID, epoch uint64, gws []registry.Gateway) error
	// Conflicts returns the merge conflicts that concern the cluster, and a
	// channel that is closed once they have changed (the session then asks
	// again: only the latest set matters). It must not block, and the set
	// returned must never be modified.
	Conflicts(cluster registry.ClusterID) (Conflicts, <-chan struct{})
}

// CapabilityServiceConflicts is the capability a spoke announces in its hello
// when it understands ServiceConflicts; other spokes are never sent one.
const CapabilityServiceConflicts = "service-conflicts"

// Conflicts are the merge conflicts that concern one cluster: for each service
// it exports, one explanation per property on which its export and another
// cluster's disagree, whichever won (see ExplainConflicts). Services without
// conflicts have no entry.
type Conflicts map[registry.ServiceKey][]Explanation

// Explanation is one merge conflict as the clusters concerned are told it.
type Explanation struct {
	// Kind is the Kubernetes MCS reason ("PortConflict", ...); empty from a
	// hub that predates kinds.
	Kind registry.ConflictKind
	// Text says what differs, whose value the hub kept and why.
	Text string
}

// ExplainConflicts words each conflict of a merged service for the two
// clusters it concerns, winner and loser alike: the property, both values,
// whose value the hub kept, and why (the oldest export wins; ties go to the
// lower cluster ID). The texts of each cluster are in the service's conflict
// order. A nil service has no conflicts.
func ExplainConflicts(svc *registry.Service) map[registry.ClusterID][]Explanation {
	if svc == nil || len(svc.Conflicts) == 0 {
		return nil
	}
	exportedAt := func(c registry.ClusterID) time.Time {
		for _, sh := range svc.Shards {
			if sh.Cluster == c {
				return sh.ExportedAt
			}
		}
		return time.Time{}
	}
	out := make(map[registry.ClusterID][]Explanation, 2)
	for _, c := range svc.Conflicts {
		won, lost := exportedAt(c.Winner), exportedAt(c.Loser)
		why := fmt.Sprintf("%s exported the service first (%s, %s %s), and the oldest export wins",
			c.Winner, exportTime(won), c.Loser, exportTime(lost))
		if won.Equal(lost) {
			why = fmt.Sprintf("both exported the service at the same time (%s), so the lower cluster ID, %s, wins",
				exportTime(won), c.Winner)
		}
		e := Explanation{Kind: c.Kind, Text: c.String() + ": " + why}
		out[c.Winner] = append(out[c.Winner], e)
		out[c.Loser] = append(out[c.Loser], e)
	}
	return out
}

// exportTime renders an export time; an unknown one counts as the oldest.
func exportTime(t time.Time) string {
	if t.IsZero() {
		return "at an unknown time, which counts as oldest"
	}
	return "at " + t.UTC().Format(time.RFC3339)
}

// EpochIssuer issues session epochs: monotonic per cluster, across restarts and replicas.
type EpochIssuer interface {
	NextEpoch(ctx context.Context, cluster registry.ClusterID) (uint64, error)
}

// HubConfig is what an operator tunes of the hub side of the federation
// protocol: its bounds.
type HubConfig struct {
	// Limits bound each shard and each cluster.
	Limits registry.Limits
	// MaxMessageBytes is announced to spokes as their chunk budget; the gRPC
	// server's receive limit must be above it (a shard alone may reach it).
	MaxMessageBytes int
	// MaxFullStateBytes bounds what the chunks of one full state hold,
	// decoded (registry.Shard.HeldBytes), while they are buffered until its
	// last chunk. The default holds the largest cluster the default limits
	// admit (500,000 endpoints, about 120 MB) twice over.
	MaxFullStateBytes int
	// HelloTimeout bounds the wait for a new stream's Hello.
	HelloTimeout time.Duration
	// UpdatesPerSecond and UpdateBurst bound how fast one cluster's updates,
	// digests and gateway announcements are taken, together (0: no bound).
	// A spoke beyond them is slowed, not refused: the hub takes its next update only when the rate allows,
	// so the spoke coalesces its changes meanwhile and nothing queues.
	UpdatesPerSecond float64
	UpdateBurst      int
}

// DefaultHubConfig returns limits that fit large clusters and bound memory.
func DefaultHubConfig() HubConfig {
	return HubConfig{
		Limits:            registry.DefaultLimits(),
		MaxMessageBytes:   4 << 20,
		MaxFullStateBytes: 256 << 20,
		HelloTimeout:      10 * time.Second,
		UpdatesPerSecond:  100,
		UpdateBurst:       200,
	}
}

// HubWiring is what the hub process hands its federation server at start,
// beside its HubConfig: who the hub is and what it works with. The zero
// value is a hub without a name that traces, refuses and counts nothing.
type HubWiring struct {
	// HubID names the hub to its spokes (the welcome's hub_id).
	HubID string
	// Clock stamps when a session starts (nil: the system's); the hub
	// passes its liveness clock, which the session's start feeds.
	Clock clock.PassiveClock
	// Origins, if not nil, is told, before each update is applied, where
	// the changes it carries began (see fedv1.ChangeOrigin) and the spoke's
	// estimate of its one-way delay to the hub (0: none). It must not block.
	Origins func(cluster registry.ClusterID, link time.Duration, origins []ReceivedOrigin)
	// ExportAllowed, if not nil, says whether cluster may export into
	// namespace (the hub's export policy): an update that exports a service
	// elsewhere is NACKed for that service, with a reason that begins
	// "ExportNotPermitted:" (see exportpolicy.Refusal), and nothing of it is
	// applied. nil: every cluster may export everywhere. It must not block.
	ExportAllowed func(cluster registry.ClusterID, namespace string) bool
	// Metrics observe the sessions.
	Metrics HubMetrics
}

// hubSetup is a hub server's HubConfig and HubWiring together.
type hubSetup struct {
	HubConfig
	HubWiring
}

// HubMetrics are optional observation hooks; nil fields are skipped.
type HubMetrics struct {
	// Update reports an applied or refused update; result is "ack", "nack" (bad input) or "error" (the hub's own trouble).
	Update func(cluster registry.ClusterID, full bool, result string)
	Resync func(cluster registry.ClusterID, reason string)
	// Throttled reports an update (digest, announcement) that waited for the cluster's update rate.
	Throttled func(cluster registry.ClusterID)
}

// HubServer serves the Federation service: one session per spoke stream.
type HubServer struct {
	fedv1.UnimplementedFederationServer
	cfg    hubSetup
	store  Store
	epochs EpochIssuer
	log    *slog.Logger
	// refusals logs what spokes send that the hub refuses, rate-limited per reason.
	refusals *limits.RefusalLog

	sessionsMu sync.Mutex
	sessions   map[registry.ClusterID]*liveSession // the newest session per cluster
	// rates are the clusters' update rates, kept across their sessions (a
	// reconnect gets no fresh burst): dropped once no session holds one and
	// it has filled up again.
	rates map[registry.ClusterID]*rate.Limiter

	// imports, when set, feeds the import stream of spokes that take it.
	imports      ImportSource
	importsMu    sync.Mutex
	importStatus map[registry.ClusterID]ImportStatus

	// refused holds, per cluster, the exports its live session sent that
	// the export policy refused and that the session has not sent (or
	// removed) since, with the reason: what /debug shows of them.
	refusedMu sync.Mutex
	refused   map[registry.ClusterID]refusedExports
}

type liveSession struct {
	epoch  uint64
	cancel context.CancelCauseFunc
	// resync asks the session to ask its spoke for a full state (the reason).
	resync chan string
}

// refusedExports are the exports one session's spoke sent that the policy refused.
type refusedExports struct {
	epoch    uint64
	services map[registry.ServiceKey]string
}

// NewHubServer returns a hub server that applies what spokes send to store.
func NewHubServer(cfg HubConfig, w HubWiring, store Store, epochs EpochIssuer, log *slog.Logger) *HubServer {
	h := &HubServer{
		cfg: hubSetup{cfg, w}, store: store, epochs: epochs,
		log:      log.With("component", "federation"),
		sessions: map[registry.ClusterID]*liveSession{}, rates: map[registry.ClusterID]*rate.Limiter{},
		importStatus: map[registry.ClusterID]ImportStatus{},
		refused:      map[registry.ClusterID]refusedExports{},
	}
	h.refusals = limits.NewRefusalLog(h.log, 0, 0)
	return h
}

// now is the time by the hub's clock.
func (h *HubServer) now() time.Time {
	if h.cfg.Clock == nil {
		return time.Now()
	}
	return h.cfg.Clock.Now()
}

// ServeImports makes the hub send imports from src to every spoke that takes
// the import stream. Call it before the server serves.
func (h *HubServer) ServeImports(src ImportSource) { h.imports = src }

// Publish implements the Federation service.
func (h *HubServer) Publish(stream fedv1.Federation_PublishServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)

	msgs, errc := Receive(ctx, stream.Recv)
	hello, err := h.recvHello(ctx, msgs, errc)
	if err != nil {
		return err
	}
	// Checked before anything of the hello is kept: the catalog, every
	// replica and the operator's tools hold what a session names.
	if err := ValidateHello(hello); err != nil {
		h.refusals.Warn(refusedHello, "refused a spoke's hello", "remote", PeerAddr(ctx), "err", err)
		return status.Error(codes.InvalidArgument, err.Error())
	}
	cluster := registry.ClusterID(hello.GetClusterId())
	if authed, ok := authenticatedCluster(ctx); ok && authed != cluster {
		return status.Errorf(codes.PermissionDenied, "credential of cluster %q cannot publish for cluster %q", authed, cluster)
	}
	epoch, err := h.epochs.NextEpoch(ctx, cluster)
	if err != nil {
		return status.Errorf(codes.Unavailable, "issue epoch for cluster %s: %v", cluster, err)
	}
	sess := Session{
		Cluster: cluster, Network: registry.Network(hello.GetNetwork()), SpokeID: hello.GetSpokeId(),
		Build: hello.GetSpokeBuild(), Epoch: epoch, Started: h.now(), RemoteIP: PeerAddr(ctx),
	}
	h.sessionGateways(&sess, hello)
	var acked registry.Hash
	if err := acked.UnmarshalText([]byte(hello.GetAckedDigest())); err == nil {
		sess.Acked = Held{Epoch: hello.GetAckedEpoch(), Version: hello.GetAckedVersion(), Digest: acked}
	}
	log := h.log.With("cluster", cluster, "epoch", epoch, "spoke", sess.SpokeID)
	// Fence first, then read what the hub holds: an older session of the
	// cluster can no longer change it between that read and the resume decision.
	resync := make(chan string, 1)
	if err := h.supersede(cluster, epoch, cancel, resync); err != nil {
		log.Info("spoke session superseded by a newer one before it began")
		return status.Error(codes.Aborted, err.Error())
	}
	defer h.release(cluster, epoch)
	defer h.store.End(sess) // even when Begin fails: it may have begun before it failed
	held, err := h.store.Begin(ctx, sess)
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, ErrSuperseded) {
		// A newer session ended this one while it began: Begin saw only
		// its context cancelled.
		err = cause
	}
	if errors.Is(err, ErrSuperseded) {
		log.Info("spoke session superseded by a newer one while it began")
		return status.Error(codes.Aborted, err.Error())
	}
	if err != nil {
		return status.Errorf(codes.Unavailable, "start session of cluster %s: %v", cluster, err)
	}
	resume := sess.Resumes(held)

	if err := stream.Send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Welcome{Welcome: &fedv1.Welcome{
		Epoch: epoch, Resume: resume, HubId: h.cfg.HubID, MaxMessageBytes: uint32(h.cfg.MaxMessageBytes),
		Capabilities: h.welcomeCapabilities(),
	}}}); err != nil {
		return err
	}
	log.Info("spoke session started", "resume", resume, "remote", sess.RemoteIP, "build", sess.Build)

	// Versions are ordered within a spoke process: a resumed session continues
	// them, a new one (perhaps a restarted spoke) may start again from 1.
	s := &hubSession{h: h, cluster: cluster, epoch: epoch, log: log, stream: stream, resync: resync,
		wantConflicts: slices.Contains(hello.GetCapabilities(), CapabilityServiceConflicts)}
	s.rate = h.rate(cluster)
	if h.imports != nil && slices.Contains(hello.GetCapabilities(), CapabilityImports) {
		s.imports = newHubImports(s, hello.GetNamespaces())
		defer h.dropImportStatus(cluster, epoch)
		err = s.imports.next()
	}
	if resume && err == nil {
		s.version = held.Version
		err = s.synced()
	}
	if err == nil {
		err = s.run(ctx, msgs, errc)
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrSuperseded) {
		log.Info("spoke session superseded by a newer one")
		return status.Error(codes.Aborted, cause.Error())
	}
	switch {
	case err == nil || errors.Is(err, io.EOF):
		log.Info("spoke session ended")
		return nil
	case errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled:
		log.Info("spoke went away")
		return status.Error(codes.Canceled, "spoke went away")
	default:
		log.Warn("spoke session failed", "err", limits.Truncate(err.Error()))
		return err
	}
}

// Bounds of a hello's strings, checked before anything of the session is
// kept: the catalog (one etcd write for every cluster), every replica and
// the operator's tools hold them.
const (
	MaxSpokeIDBytes    = 256
	MaxSpokeBuildBytes = 256
)

// ValidateHello checks what a session's hello names: the cluster ID (a
// DNS label), the network (empty, or a label value of at most 63
// characters), the spoke's ID and build (at most MaxSpokeIDBytes and
// MaxSpokeBuildBytes). The error never repeats an over-long value.
func ValidateHello(hello *fedv1.Hello) error {
	if err := registry.ValidateClusterID(registry.ClusterID(hello.GetClusterId())); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if err := registry.ValidateNetwork(registry.Network(hello.GetNetwork())); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if n := len(hello.GetSpokeId()); n > MaxSpokeIDBytes {
		return fmt.Errorf("hello: spoke_id is %d bytes; at most %d", n, MaxSpokeIDBytes)
	}
	if n := len(hello.GetSpokeBuild()); n > MaxSpokeBuildBytes {
		return fmt.Errorf("hello: spoke_build is %d bytes; at most %d", n, MaxSpokeBuildBytes)
	}
	return nil
}

func (h *HubServer) recvHello(ctx context.Context, msgs <-chan *fedv1.SpokeMessage, errc <-chan error) (*fedv1.Hello, error) {
	timer := time.NewTimer(h.cfg.HelloTimeout)
	defer timer.Stop()
	select {
	case m := <-msgs:
		if m.GetHello() == nil {
			return nil, status.Error(codes.InvalidArgument, "the first message of a session must be a hello")
		}
		return m.GetHello(), nil
	case err := <-errc:
		return nil, err
	case <-timer.C:
		return nil, status.Errorf(codes.DeadlineExceeded, "no hello within %s", h.cfg.HelloTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// supersede makes (cluster, epoch) the cluster's live session and ends an
// older one. It fails when a newer session has already begun (two spokes of
// one cluster racing): the newest epoch always wins.
func (h *HubServer) supersede(cluster registry.ClusterID, epoch uint64, cancel context.CancelCauseFunc, resync chan string) error {
	h.sessionsMu.Lock()
	defer h.sessionsMu.Unlock()
	if old := h.sessions[cluster]; old != nil {
		if old.epoch > epoch {
			return fmt.Errorf("%w (epoch %d > %d)", ErrSuperseded, old.epoch, epoch)
		}
		old.cancel(fmt.Errorf("%w (epoch %d > %d)", ErrSuperseded, epoch, old.epoch))
	}
	h.sessions[cluster] = &liveSession{epoch: epoch, cancel: cancel, resync: resync}
	return nil
}

// rate returns the cluster's update rate (nil: none), shared by its
// sessions, old and new: a spoke that reconnects gets no fresh burst.
// Limiters no session holds are dropped once full again, as another
// cluster's session begins.
func (h *HubServer) rate(cluster registry.ClusterID) *rate.Limiter {
	if h.cfg.UpdatesPerSecond <= 0 {
		return nil
	}
	h.sessionsMu.Lock()
	defer h.sessionsMu.Unlock()
	now := time.Now()
	for id, l := range h.rates {
		if _, live := h.sessions[id]; !live && id != cluster && l.TokensAt(now) >= float64(l.Burst()) {
			delete(h.rates, id)
		}
	}
	l := h.rates[cluster]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(h.cfg.UpdatesPerSecond), max(1, h.cfg.UpdateBurst))
		h.rates[cluster] = l
	}
	return l
}

func (h *HubServer) release(cluster registry.ClusterID, epoch uint64) {
	h.sessionsMu.Lock()
	if s := h.sessions[cluster]; s != nil && s.epoch == epoch {
		delete(h.sessions, cluster)
	}
	h.sessionsMu.Unlock()
	h.refusedMu.Lock()
	defer h.refusedMu.Unlock()
	if r, ok := h.refused[cluster]; ok && r.epoch == epoch {
		delete(h.refused, cluster)
	}
}

// Resync asks the live session of every cluster that concerns for a full
// state from its spoke, saying why. The export policy's reload calls it
// for the clusters whose grant changed: a spoke sends again what the hub
// refused before (now perhaps permitted), and stops sending what the new
// policy refuses. It never blocks: a session already asked is not asked twice.
func (h *HubServer) Resync(concerns func(registry.ClusterID) bool, reason string) {
	h.sessionsMu.Lock()
	defer h.sessionsMu.Unlock()
	for cluster, s := range h.sessions {
		if concerns(cluster) {
			select {
			case s.resync <- reason:
			default:
			}
		}
	}
}

// RefusedExports returns the services the export policy refused of each
// cluster's live session (and that it has not sent or removed since), with
// the reasons. The maps returned are copies.
func (h *HubServer) RefusedExports() map[registry.ClusterID]map[registry.ServiceKey]string {
	h.refusedMu.Lock()
	defer h.refusedMu.Unlock()
	out := make(map[registry.ClusterID]map[registry.ServiceKey]string, len(h.refused))
	for id, r := range h.refused {
		if len(r.services) > 0 {
			out[id] = maps.Clone(r.services)
		}
	}
	return out
}

// noteRefused records the exports of rj the policy refused (with the
// session's epoch), and forgets those the session has since sent and had
// applied (settled).
func (h *HubServer) noteRefused(cluster registry.ClusterID, epoch uint64, rj rejection, settled []registry.ServiceKey) {
	h.refusedMu.Lock()
	defer h.refusedMu.Unlock()
	r := h.refused[cluster]
	if r.epoch != epoch {
		if r.epoch > epoch {
			return // a newer session speaks for the cluster
		}
		r = refusedExports{epoch: epoch, services: map[registry.ServiceKey]string{}}
	}
	for _, k := range settled {
		delete(r.services, k)
	}
	for _, x := range rj {
		if x.GetService() != nil && strings.HasPrefix(x.GetReason(), exportpolicy.ReasonNotPermitted+":") {
			r.services[KeyFromProto(x.GetService())] = x.GetReason()
		}
	}
	h.refused[cluster] = r
}

// hubSession is one stream's state, owned by the stream's goroutine.
type hubSession struct {
	h       *HubServer
	cluster registry.ClusterID
	epoch   uint64
	version uint64 // last applied version
	log     *slog.Logger
	stream  fedv1.Federation_PublishServer

	// A full state in progress: its version, the chunks received so far and their size.
	fullVersion uint64
	full        map[registry.ServiceKey]*registry.Shard
	fullRetain  []registry.ServiceKey
	fullBytes   int
	// spoiled is a full-state version one of whose chunks was rejected: its
	// later chunks are rejected too, so a partial full state is never applied.
	spoiled uint64

	// wantConflicts: the spoke understands ServiceConflicts.
	wantConflicts bool
	// isSynced: the hub holds this session's state (it resumed, or applied an update).
	isSynced bool
	// conflictsChanged is closed once the cluster's conflicts have changed;
	// nil (never ready) until the session is synced.
	conflictsChanged <-chan struct{}
	// sentConflicts is the set the spoke was last sent, valid when conflictsSent.
	sentConflicts Conflicts
	conflictsSent bool

	// imports is the session's import stream; nil when the spoke does not take it.
	imports *hubImports
	// rate bounds how fast updates are applied (nil: no bound).
	rate *rate.Limiter
	// resync receives the hub's requests to ask the spoke for a full state.
	resync <-chan string
}

// importsChanged is closed once the hub's import set changes (nil: never).
func (s *hubSession) importsChanged() <-chan struct{} {
	if s.imports == nil {
		return nil
	}
	return s.imports.changed
}

func (s *hubSession) run(ctx context.Context, msgs <-chan *fedv1.SpokeMessage, errc <-chan error) error {
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case err := <-errc:
			return err
		case <-s.conflictsChanged:
			if err := s.sendConflicts(); err != nil {
				return err
			}
		case <-s.importsChanged():
			if err := s.imports.next(); err != nil {
				return err
			}
		case reason := <-s.resync:
			s.log.Info("asking spoke for a resync", "reason", reason)
			if s.h.cfg.Metrics.Resync != nil {
				s.h.cfg.Metrics.Resync(s.cluster, "export_policy")
			}
			if err := s.send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Resync{Resync: &fedv1.ResyncRequest{Reason: reason}}}); err != nil {
				return err
			}
		case m := <-msgs:
			var err error
			switch k := m.GetKind().(type) {
			case *fedv1.SpokeMessage_Update:
				received := time.Now() // the hub's time on an update (Ack.hub_nanos) includes its wait for the rate
				if err := s.throttle(ctx); err != nil {
					return err
				}
				err = s.update(ctx, k.Update, received)
			case *fedv1.SpokeMessage_Digest:
				// Digests and announcements share the update rate: a flood of
				// them slows its spoke, not the hub (each may cost a resync
				// or a topology rebuild).
				if err := s.throttle(ctx); err != nil {
					return err
				}
				err = s.digest(ctx, k.Digest)
			case *fedv1.SpokeMessage_Gateways:
				if err := s.throttle(ctx); err != nil {
					return err
				}
				err = s.gateways(ctx, k.Gateways)
			case *fedv1.SpokeMessage_Namespaces, *fedv1.SpokeMessage_ImportAck, *fedv1.SpokeMessage_ImportNack, *fedv1.SpokeMessage_ImportsWritten,
				*fedv1.SpokeMessage_ImportProblems:
				if s.imports == nil {
					return status.Errorf(codes.InvalidArgument, "%T without the %q capability", k, CapabilityImports)
				}
				err = s.imports.handle(m)
			default:
				return status.Errorf(codes.InvalidArgument, "unexpected %T after hello", k)
			}
			if err != nil {
				return err
			}
		}
	}
}

// throttle waits until the cluster's update rate allows another update,
// digest or gateway announcement.
func (s *hubSession) throttle(ctx context.Context) error {
	if s.rate == nil || s.rate.Allow() {
		return nil
	}
	if s.h.cfg.Metrics.Throttled != nil {
		s.h.cfg.Metrics.Throttled(s.cluster)
	}
	return s.rate.Wait(ctx)
}

// rejection is an update the session refuses; nothing of it is applied.
type rejection []*fedv1.Rejection

func (r rejection) Error() string {
	switch len(r) {
	case 0:
		return "no reason given" // a peer's NACK may name none
	case 1:
		return r[0].GetReason()
	}
	return fmt.Sprintf("%s (and %d more)", r[0].GetReason(), len(r)-1)
}

func reject(service *registry.ServiceKey, format string, args ...any) rejection {
	rj := &fedv1.Rejection{Reason: fmt.Sprintf(format, args...)}
	if service != nil {
		rj.Service = KeyToProto(*service)
	}
	return rejection{rj}
}

func (s *hubSession) update(ctx context.Context, u *fedv1.Update, received time.Time) error {
	// Origins say where a delta's changes began (a full state is a resync:
	// it carries none), only of services the update changes.
	if s.h.cfg.Origins != nil && !u.GetFullState() && len(u.GetOrigins()) > 0 {
		if origins := receivedOrigins(u); len(origins) > 0 {
			s.h.cfg.Origins(s.cluster, bounded(u.GetLinkNanos()), origins)
		}
	}
	digest, applied, err := s.apply(ctx, u)
	var rj rejection
	if s.h.cfg.Metrics.Update != nil && (applied || err != nil) {
		result := "ack"
		switch {
		case errors.As(err, &rj):
			result = "nack"
		case err != nil:
			result = "error"
		}
		s.h.cfg.Metrics.Update(s.cluster, u.GetFullState(), result)
	}
	switch {
	case errors.As(err, &rj):
		s.h.noteRefused(s.cluster, s.epoch, rj, nil)
		s.h.refusals.Warn(refusedUpdate, "update rejected", "cluster", s.cluster, "epoch", s.epoch,
			"version", u.GetVersion(), "nonce", u.GetNonce(), "reason", rj.Error())
		return s.send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Nack{Nack: &fedv1.Nack{
			Nonce: u.GetNonce(), Version: u.GetVersion(), Rejections: rj,
		}}})
	case err != nil:
		return err
	}
	ack := &fedv1.Ack{Nonce: u.GetNonce(), Version: u.GetVersion(), HubNanos: int64(time.Since(received))}
	if applied {
		ack.Digest = digest.String()
	}
	if err := s.send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Ack{Ack: ack}}); err != nil {
		return err
	}
	if applied && !s.isSynced {
		return s.synced()
	}
	return nil
}

// synced marks the session synced: the hub holds its state, so what the hub
// reports about that state (its conflicts) now means something to the spoke.
func (s *hubSession) synced() error {
	s.isSynced = true
	return s.sendConflicts()
}

// sendConflicts sends the conflicts that concern the cluster, unless the spoke
// was last sent the same set, and arms the notice of their next change. Only
// the session's goroutine calls it: it alone sends on the stream.
func (s *hubSession) sendConflicts() error {
	if !s.wantConflicts {
		return nil
	}
	set, changed := s.h.store.Conflicts(s.cluster)
	s.conflictsChanged = changed
	if s.conflictsSent && maps.EqualFunc(set, s.sentConflicts, slices.Equal) {
		return nil
	}
	msg := &fedv1.ServiceConflicts{Services: make([]*fedv1.ServiceConflict, 0, len(set))}
	for _, k := range slices.SortedFunc(maps.Keys(set), registry.ServiceKey.Compare) {
		if len(set[k]) > 0 {
			sc := &fedv1.ServiceConflict{Service: KeyToProto(k)}
			for _, e := range set[k] {
				sc.Conflicts, sc.Reasons = append(sc.Conflicts, e.Text), append(sc.Reasons, string(e.Kind))
			}
			msg.Services = append(msg.Services, sc)
		}
	}
	if err := s.send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Conflicts{Conflicts: msg}}); err != nil {
		return err
	}
	s.log.Debug("sent conflicts", "services", len(msg.Services))
	s.sentConflicts, s.conflictsSent = set, true
	return nil
}

// apply validates and applies an update. It returns a rejection for bad
// input, leaving the cluster's state exactly as it was, and applied=false for
// a full-state chunk that was only buffered.
func (s *hubSession) apply(ctx context.Context, u *fedv1.Update) (digest registry.Hash, applied bool, err error) {
	v := u.GetVersion()
	if v <= s.version {
		return digest, false, reject(nil, "version %d is not above the last applied version %d", v, s.version)
	}
	if u.GetFullState() && v == s.spoiled {
		return digest, false, reject(nil, "full state %d was already rejected", v)
	}
	if u.GetFullState() && len(u.GetRemoves()) > 0 {
		s.full, s.spoiled = nil, v
		return digest, false, reject(nil, "a full state cannot remove services")
	}
	if s.full != nil && (!u.GetFullState() || v != s.fullVersion) {
		s.full = nil // the spoke abandoned the full state in progress
	}
	if !u.GetFullState() && len(u.GetRetain()) > 0 {
		return digest, false, reject(nil, "only a full state can retain services")
	}
	lim := s.h.cfg.Limits
	upserts, removes, retain, rj := s.decode(u)
	if len(rj) > 0 {
		if u.GetFullState() {
			s.full, s.spoiled = nil, v // a rejected chunk spoils its whole full state
		}
		return digest, false, rj
	}

	change := registry.Change{Cluster: s.cluster, Upserts: upserts, Removes: removes}
	if u.GetFullState() {
		if s.full == nil {
			s.full, s.fullVersion, s.fullRetain, s.fullBytes = map[registry.ServiceKey]*registry.Shard{}, v, nil, 0
		}
		for _, sh := range upserts {
			s.fullBytes += sh.HeldBytes() // what the buffer holds, 10 to 16 times the wire's bytes
		}
		if s.fullBytes > s.h.cfg.MaxFullStateBytes {
			s.full, s.spoiled = nil, v
			return digest, false, reject(nil, "full state would hold more than %d bytes decoded", s.h.cfg.MaxFullStateBytes)
		}
		if room := lim.MaxServicesPerCluster - len(s.full); len(upserts) > room {
			// Name the services past the limit: the spoke holds those back and sends the rest again.
			s.full, s.spoiled = nil, v
			var over rejection
			for _, sh := range upserts[max(room, 0):] {
				over = append(over, reject(&sh.Service, "the cluster would hold more than %d services", lim.MaxServicesPerCluster)...)
			}
			return digest, false, over
		}
		for _, sh := range upserts {
			s.full[sh.Service] = sh
		}
		s.fullRetain = append(s.fullRetain, retain...)
		if !u.GetLastChunk() {
			return digest, false, nil
		}
		change = registry.Change{Cluster: s.cluster, Replace: true, Upserts: make([]*registry.Shard, 0, len(s.full)), Retain: s.fullRetain}
		for _, sh := range s.full {
			change.Upserts = append(change.Upserts, sh)
		}
		s.full, s.fullRetain = nil, nil
	}
	digest, err = s.h.store.Apply(ctx, s.epoch, v, change)
	if errors.Is(err, ErrSuperseded) {
		return digest, false, status.Error(codes.Aborted, err.Error())
	}
	if le := (*LimitError)(nil); errors.As(err, &le) {
		var over rejection
		for _, k := range le.Services {
			over = append(over, reject(&k, "%s", le.Reason)...)
		}
		if len(over) == 0 {
			over = reject(nil, "%s", le.Reason)
		}
		return digest, false, over
	}
	if err != nil {
		return digest, false, status.Errorf(codes.Unavailable, "apply update: %v", err)
	}
	s.version = v
	settled := slices.Clone(change.Removes)
	for _, sh := range change.Upserts {
		settled = append(settled, sh.Service)
	}
	s.h.noteRefused(s.cluster, s.epoch, nil, settled)
	return digest, true, nil
}

// decode turns an update's upserts, removes and retains into model values. It
// collects a rejection for each one that is invalid, or that names a service
// already named in the update or in the full state in progress.
func (s *hubSession) decode(u *fedv1.Update) (upserts []*registry.Shard, removes, retain []registry.ServiceKey, rj rejection) {
	dec := Decoder{Cluster: s.cluster, Limits: s.h.cfg.Limits, Held: func(k registry.ServiceKey) bool { return s.full[k] != nil }}
	refuse := func(err error) {
		var ve *registry.ValidationError
		if errors.As(err, &ve) {
			rj = append(rj, reject(&ve.Service, "%s", ve.Reason)...)
		} else {
			rj = append(rj, reject(nil, "%v", err)...)
		}
	}
	upserts = make([]*registry.Shard, 0, len(u.GetUpserts()))
	for _, p := range u.GetUpserts() {
		sh, err := dec.Shard(p)
		switch {
		case err != nil:
			refuse(err)
		case !s.exportAllowed(sh.Service):
			// Before anything of it is applied: it reaches no client and no import.
			rj = append(rj, reject(&sh.Service, "%s", exportpolicy.Refusal(s.cluster, sh.Service.Namespace))...)
		default:
			upserts = append(upserts, sh)
		}
	}
	keys := func(list []*fedv1.ServiceKey, what, twice string) []registry.ServiceKey {
		out := make([]registry.ServiceKey, 0, len(list))
		for _, p := range list {
			if k, err := dec.Key(p, what, twice); err != nil {
				refuse(err)
			} else {
				out = append(out, k)
			}
		}
		return out
	}
	removes = keys(u.GetRemoves(), "remove", "service %s is both upserted and removed")
	retain = keys(u.GetRetain(), "retain", "service %s is both sent and retained")
	// The hub holds no form of a service the policy refuses: nothing to retain.
	retain = slices.DeleteFunc(retain, func(k registry.ServiceKey) bool { return !s.exportAllowed(k) })
	return upserts, removes, retain, rj
}

// exportAllowed reports whether the export policy lets the cluster export k.
func (s *hubSession) exportAllowed(k registry.ServiceKey) bool {
	return s.h.cfg.ExportAllowed == nil || s.h.cfg.ExportAllowed(s.cluster, k.Namespace)
}

func (s *hubSession) digest(ctx context.Context, d *fedv1.Digest) error {
	if d.GetVersion() != s.version {
		return nil // an update is in flight; the next digest will tell
	}
	held, err := s.h.store.Held(ctx, s.cluster)
	if err != nil {
		return status.Errorf(codes.Unavailable, "read state: %v", err)
	}
	if held.Digest.String() == d.GetDigest() {
		return nil
	}
	reason := fmt.Sprintf("digest mismatch at version %d: spoke %s, hub %s", s.version, limits.Truncate(d.GetDigest()), held.Digest)
	s.h.refusals.Warn(refusedDigest, "asking spoke for a resync", "cluster", s.cluster, "epoch", s.epoch, "reason", reason)
	if s.h.cfg.Metrics.Resync != nil {
		s.h.cfg.Metrics.Resync(s.cluster, "digest")
	}
	return s.send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Resync{Resync: &fedv1.ResyncRequest{Reason: reason}}})
}

func (s *hubSession) send(m *fedv1.HubMessage) error {
	if err := s.stream.Send(m); err != nil {
		return fmt.Errorf("send to spoke: %w", err)
	}
	return nil
}
