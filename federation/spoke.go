package federation

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/exportpolicy"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/internal/backoff"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// State is a cluster's complete state: one shard per exported service. A nil
// shard names a service the cluster has but cannot publish in its current
// form (invalid): the hub keeps whatever it holds for it.
type State = map[registry.ServiceKey]*registry.Shard

// SpokeConfig is what an operator tunes of the spoke side of the
// federation protocol: who the spoke is, and its timings.
type SpokeConfig struct {
	SpokeID string
	Build   string
	// DigestInterval is how often the spoke sends the digest of what the hub
	// acknowledged, so the hub can ask for a resync when they differ.
	DigestInterval time.Duration
	// MinBackoff and MaxBackoff bound the exponential, jittered reconnect delay.
	MinBackoff, MaxBackoff time.Duration
	// HealthyAfter is how long a session must last before the backoff resets.
	HealthyAfter time.Duration
}

// SpokeWiring is what the spoke process hands its publisher at start,
// beside its SpokeConfig: the cluster it publishes, the hub it publishes
// to, and what hears from it.
type SpokeWiring struct {
	Cluster registry.ClusterID
	Network registry.Network
	// HubAddr is the hub's address (the connection's gRPC target), whose
	// port is probed while waiting to reconnect: the next session starts as
	// soon as the hub answers again, not when a delay that grew while it was
	// away ends. Empty probes nothing.
	HubAddr string
	// Status, if not nil, is told where the session stands each time that
	// changes (for health and debug). It is called from Run's goroutine and
	// must not block.
	Status func(SessionStatus)
	// OnReport, if not nil, is told what there is to report about the desired
	// services (see Reports) each time that changes, starting from nothing,
	// and once when the hub first reports its conflict set, even an empty
	// one: so a callee can tell "nothing to report" from "not known yet". It
	// is called from Run's goroutine and must not block; the Reports are the
	// callee's to keep, but must not be modified.
	OnReport func(Reports)
	// OnImports, if not nil, takes the import stream: it is given the imports
	// the cluster must hold each time the hub changes them (see ImportState),
	// and the publisher sends nothing before SetNamespaces has named the
	// cluster's namespaces. It is called from Run's goroutine and must not block.
	OnImports func(ImportState)
	// Origins, if not nil, holds when the spoke saw each service change;
	// each update sends those of the services it changes (see
	// fedv1.ChangeOrigin), so that the hub can trace a change from its source.
	Origins *Origins
}

// spokeSetup is a publisher's SpokeConfig and SpokeWiring together.
type spokeSetup struct {
	SpokeConfig
	SpokeWiring
}

// Reports says, for each desired service with something to report, what the
// hub (or the spoke itself) found. Services without an entry are published as
// they are, without conflicts, as far as the spoke knows. A service that
// leaves the desired state leaves the reports.
type Reports map[registry.ServiceKey]ServiceReport

// ServiceReport is what there is to report about one exported service.
type ServiceReport struct {
	// Refused says why the hub does not hold the service's current form: the
	// hub's reason for refusing it, or the spoke's own for a shard too large
	// for the hub's message budget. The hub keeps the last form it accepted.
	// It stays until the hub accepts a form equal to the desired one, so a
	// retry in flight does not clear it. Empty when nothing was refused.
	Refused string
	// Conflicts are the hub's explanations of the merge conflicts between
	// this cluster's export of the service and other clusters' (see
	// ExplainConflicts), as of the hub's last report: they outlive a broken
	// session until the next session's hub reports again.
	Conflicts []Explanation
}

func (r ServiceReport) equal(o ServiceReport) bool {
	return r.Refused == o.Refused && slices.Equal(r.Conflicts, o.Conflicts)
}

// DefaultSpokeConfig returns the intervals a spoke uses in production.
func DefaultSpokeConfig() SpokeConfig {
	return SpokeConfig{
		DigestInterval: 30 * time.Second,
		MinBackoff:     200 * time.Millisecond,
		MaxBackoff:     30 * time.Second,
		HealthyAfter:   10 * time.Second,
	}
}

// SessionStatus is the publisher's view of its session, for health and debug.
type SessionStatus struct {
	Connected bool
	Resumed   bool // the session continued where the last one left off (no full state)
	// Synced: the hub has acknowledged this session's state (its full state, or the resume).
	Synced       bool
	Epoch        uint64
	AckedVersion uint64
	Services     int // services the hub has acknowledged
	Rejected     int // services the hub refused in their current form
}

// Publisher streams a cluster's state to a hub: it opens a session, sends the
// full state (or resumes), then sends each change as a delta against what the
// hub has acknowledged, and reconnects with backoff when the session breaks.
type Publisher struct {
	cfg    spokeSetup
	client fedv1.FederationClient
	// conn is the connection to the hub when it can be told to connect at
	// once (a *grpc.ClientConn), for when the hub answers again; else nil.
	conn backoff.Conn
	log  *slog.Logger

	// Owned by Run's goroutine.
	// link is the last estimate of the one-way delay to the hub (see estimateLink).
	link time.Duration
	// desired is the source's latest state, as taken; dirty names the
	// services whose publishable form may differ from what the hub
	// acknowledged (every other service's does not), which the next delta
	// looks at: one change costs the same however large the cluster.
	desired     State
	dirty       map[registry.ServiceKey]struct{}
	acked       State // what the hub holds; valid when ackedKnown
	ackedHashes map[registry.ServiceKey]registry.Hash
	ackedDigest registry.Hash
	ackedKnown  bool
	// ackedEpoch is the epoch of the session in which the hub last applied an
	// update, or that resumed (the hub re-stamps what it holds with it): what
	// the hub reports as its held epoch, and so what lets a later session resume.
	ackedEpoch   uint64
	ackedVersion uint64
	// maxBytes is the hub's message budget, from the welcome.
	maxBytes int
	// sessionEpoch is the epoch of the current (or last) session.
	sessionEpoch uint64
	version      uint64
	// rejected holds the hash of each shard the hub refused; it is not sent
	// again until it changes, and the last accepted form stays published.
	rejected map[registry.ServiceKey]registry.Hash
	// unpermitted holds the services the hub's export policy refused: no
	// form of them is published (the hub holds none), whatever their shard.
	// Forgotten with each session and each resync the hub asks for: its
	// policy may have changed (the hub asks for a resync when it does).
	unpermitted map[registry.ServiceKey]bool
	// refusals holds why each desired service's current form is not what
	// the hub holds (the hub's reason, or too large): kept until the hub
	// acknowledges the desired form, or the service leaves the desired state.
	refusals map[registry.ServiceKey]string
	// conflicts is the last conflict set the hub reported; conflictsKnown
	// says some hub has reported one, and conflictsTold that OnReport has
	// been called since.
	conflicts                     Conflicts
	conflictsKnown, conflictsTold bool
	// reported is what OnReport was last told.
	reported Reports
	// tooBig holds the hash of each shard too large for the current hub's
	// message budget (forgotten with each session: the budget may change).
	tooBig map[registry.ServiceKey]registry.Hash
	// retained names services a full state asked the hub to retain and that
	// have not been sent since: the hub may hold a shard the spoke never saw.
	retained map[registry.ServiceKey]bool
	// trafficTaken: the current hub takes routes and policies
	// (CapabilityTraffic). For a hub that does not, bare holds each desired
	// shard with traffic beside its form without (one form per shard, so
	// that what the hub acknowledged compares as the same pointer).
	trafficTaken bool
	bare         map[registry.ServiceKey][2]*registry.Shard
	nonce        uint64
	// imports is what the hub last said the cluster must hold (never nil).
	imports *ImportState

	// The cluster's namespaces (SetNamespaces), and the writer's last report (ImportsWritten).
	nsMu      sync.Mutex
	ns        []string
	nsKnown   bool
	nsChanged chan struct{}
	written   chan [2]uint64

	// The imports the cluster cannot hold (ImportProblems).
	problemsMu      sync.Mutex
	problems        []ImportProblem
	problemsChanged chan struct{}

	// The gateways the cluster announces for its network (SetGateways).
	gwMu      sync.Mutex
	gws       []registry.Gateway
	gwKnown   bool
	gwChanged chan struct{}
}

// NewPublisher returns a publisher that talks to the hub over conn.
func NewPublisher(cfg SpokeConfig, w SpokeWiring, conn grpc.ClientConnInterface, log *slog.Logger) *Publisher {
	redial, _ := conn.(backoff.Conn)
	return &Publisher{
		cfg: spokeSetup{cfg, w}, client: fedv1.NewFederationClient(conn), conn: redial,
		log:          log.With("component", "publisher"),
		ackedHashes:  map[registry.ServiceKey]registry.Hash{},
		dirty:        map[registry.ServiceKey]struct{}{},
		rejected:     map[registry.ServiceKey]registry.Hash{},
		unpermitted:  map[registry.ServiceKey]bool{},
		tooBig:       map[registry.ServiceKey]registry.Hash{},
		refusals:     map[registry.ServiceKey]string{},
		bare:         map[registry.ServiceKey][2]*registry.Shard{},
		trafficTaken: true, // until a hub says otherwise
		imports: &ImportState{Imports: map[registry.ServiceKey]*imports.Import{}, Removed: map[registry.ServiceKey]bool{},
			Retained: map[registry.ServiceKey]bool{}},
		nsChanged:       make(chan struct{}, 1),
		written:         make(chan [2]uint64, 1),
		problemsChanged: make(chan struct{}, 1),
		gwChanged:       make(chan struct{}, 1),
	}
}

// Run publishes what the source hands over to src until ctx ends, beginning
// with its whole state (it restarts src). Nothing is sent before the source
// has handed over a state: the first state sent is complete.
func (p *Publisher) Run(ctx context.Context, src *Changes) error {
	src.Restart()
	for full := false; !full; {
		select {
		case <-src.Ready():
			full = p.take(src)
		case <-ctx.Done():
			return nil
		}
	}
	for _, known := p.namespaces(); p.cfg.OnImports != nil && !known; _, known = p.namespaces() {
		// Without its namespaces the hub could not tell what the cluster imports.
		select {
		case <-src.Ready():
			p.take(src)
		case <-p.nsChanged:
		case <-ctx.Done():
			return nil
		}
	}
	retry := backoff.New(backoff.Config{Min: p.cfg.MinBackoff, Max: p.cfg.MaxBackoff, Target: p.cfg.HubAddr, Conn: p.conn})
	for {
		started := time.Now()
		err := p.safeSession(ctx, src)
		p.report(false, false, false)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(started) > p.cfg.HealthyAfter {
			retry.Reset()
		}
		wait := retry.Next()
		p.log.Warn("hub session ended; reconnecting", "err", err, "in", wait.Round(time.Millisecond))
		if !p.wait(ctx, retry, wait, src) {
			return nil
		}
	}
}

// wait waits d, or until the hub answers again (see backoff.Backoff.Start),
// keeping up with new states meanwhile; false when ctx ended.
func (p *Publisher) wait(ctx context.Context, retry *backoff.Backoff, d time.Duration, src *Changes) bool {
	w := retry.Start(ctx, d)
	defer w.Stop()
	for {
		select {
		case <-w.Done():
			if w.Answered() {
				p.log.Info("hub answers again; reconnecting now")
			}
			return ctx.Err() == nil
		case <-src.Ready():
			p.take(src)
			p.updateReports()
		}
	}
}

func (p *Publisher) safeSession(ctx context.Context, src *Changes) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in session: %v\n%s", r, debug.Stack())
		}
	}()
	return p.session(ctx, src)
}

// take applies what the source changed since the last take to desired, and
// marks it dirty; true when it took the whole state.
func (p *Publisher) take(src *Changes) bool {
	ch, ok := src.Take()
	if !ok {
		return false
	}
	if ch.Full {
		for k := range p.desired {
			if _, ok := ch.Set[k]; !ok {
				p.forget(k)
			}
		}
		p.desired = ch.Set
		markAll(p.dirty, p.desired)
		return true
	}
	for k, s := range ch.Set {
		p.desired[k] = s
		p.dirty[k] = struct{}{}
	}
	for _, k := range ch.Removed {
		p.forget(k)
		delete(p.desired, k)
	}
	return false
}

// markAll marks every service of m dirty.
func markAll[V any](dirty map[registry.ServiceKey]struct{}, m map[registry.ServiceKey]V) {
	for k := range m {
		dirty[k] = struct{}{}
	}
}

// forget marks a service dirty and forgets the hub's refusals of it: what
// the source hands over next is a new form.
func (p *Publisher) forget(k registry.ServiceKey) {
	p.dirty[k] = struct{}{}
	delete(p.rejected, k)
	delete(p.unpermitted, k)
}

// pending is an update sent and not yet answered.
type pending struct {
	nonce   string
	version uint64
	full    bool
	last    bool
	upserts []wireShard
	removes []registry.ServiceKey
	retain  []registry.ServiceKey
	origins []*fedv1.ChangeOrigin
	sentAt  time.Time
}

func (p *Publisher) session(ctx context.Context, src *Changes) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.client.Publish(ctx, grpc.MaxCallRecvMsgSize(MaxImportMessageBytes))
	if err != nil {
		return fmt.Errorf("open session: %w", err)
	}
	hello := &fedv1.Hello{
		ClusterId: string(p.cfg.Cluster), Network: string(p.cfg.Network), SpokeId: p.cfg.SpokeID,
		SpokeBuild: p.cfg.Build, Capabilities: []string{"chunked-full-state", "digest", CapabilityServiceConflicts},
	}
	if p.ackedKnown {
		hello.AckedEpoch, hello.AckedVersion, hello.AckedDigest = p.ackedEpoch, p.ackedVersion, p.ackedDigest.String()
	}
	if p.cfg.OnImports != nil {
		hello.Capabilities = append(hello.Capabilities, CapabilityImports)
		hello.Namespaces, _ = p.namespaces()
	}
	gws, gwKnown := p.gateways()
	if gwKnown {
		hello.Gateways = &fedv1.NetworkGateways{Gateways: GatewaysToProto(gws)}
	}
	if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: hello}}); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("await welcome: %w", err)
	}
	welcome := first.GetWelcome()
	if welcome == nil {
		return fmt.Errorf("hub answered hello with %T, not a welcome", first.GetKind())
	}
	p.maxBytes = int(welcome.GetMaxMessageBytes())
	if p.maxBytes <= 0 {
		p.maxBytes = 1 << 20
	}
	p.sessionEpoch = welcome.GetEpoch()
	// The budget and the policy may differ at this hub: try those services again.
	markAll(p.dirty, p.tooBig)
	markAll(p.dirty, p.unpermitted)
	clear(p.tooBig)
	clear(p.unpermitted)
	if taken := slices.Contains(welcome.GetCapabilities(), CapabilityTraffic); taken != p.trafficTaken {
		// Every service's form may differ at this hub.
		p.trafficTaken = taken
		clear(p.bare)
		markAll(p.dirty, p.desired)
	}
	s := &spokeSession{p: p, stream: stream, epoch: welcome.GetEpoch(), resumed: welcome.GetResume(), gwLast: gws, gwSent: gwKnown,
		gwTaken: slices.Contains(welcome.GetCapabilities(), CapabilityGateways)}
	var nsChanged <-chan struct{}
	if p.cfg.OnImports != nil {
		s.imports, nsChanged = &spokeImports{s: s}, p.nsChanged
		s.imports.problemsTaken = slices.Contains(welcome.GetCapabilities(), CapabilityImportProblems)
		// An earlier hub's authority is not this one's: until this hub's
		// authoritative full state, nothing it does not name is deleted.
		held := *p.imports
		held.Authoritative = false
		p.imports = &held
	}
	s.needFull, s.synced = !s.resumed, s.resumed
	if s.needFull {
		p.ackedKnown = false
	} else {
		p.ackedEpoch = s.epoch // the hub re-stamped what it holds (see Store.Begin)
	}
	p.log.Info("hub session started", "epoch", s.epoch, "resume", s.resumed, "hub", welcome.GetHubId())

	defer func() {
		// What the hub never answered is looked at again: sent again, or
		// found acknowledged by the next session's resume. A full state the
		// hub has not taken whole took the place of every delta since the
		// last: all of it is looked at again.
		if s.needFull || s.fullSent {
			markAll(p.dirty, p.desired)
			markAll(p.dirty, p.acked)
			markAll(p.dirty, p.retained)
		}
		for _, u := range s.inflight {
			for _, w := range u.upserts {
				p.dirty[w.shard.Service] = struct{}{}
			}
			for _, k := range u.removes {
				p.dirty[k] = struct{}{}
			}
		}
	}()
	msgs, errc := Receive(ctx, stream.Recv)
	ticker := time.NewTicker(p.cfg.DigestInterval)
	defer ticker.Stop()
	s.report()
	if s.imports != nil {
		if err := s.imports.sendProblems(); err != nil { // what an earlier session's writer found
			return err
		}
	}
	for {
		if len(s.inflight) == 0 {
			if err := s.sendNext(); err != nil {
				return err
			}
		}
		p.updateReports()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			if status.Code(err) == codes.Aborted {
				return fmt.Errorf("superseded: %w", err)
			}
			return err
		case <-src.Ready():
			p.take(src)
		case <-ticker.C:
			if err := s.sendDigest(); err != nil {
				return err
			}
		case <-nsChanged:
			if err := s.imports.sendNamespaces(); err != nil {
				return err
			}
		case <-p.gwChanged:
			if err := s.sendGateways(); err != nil {
				return err
			}
		case <-p.problemsChanged:
			if s.imports != nil {
				if err := s.imports.sendProblems(); err != nil {
					return err
				}
			}
		case w := <-p.written:
			if s.imports != nil {
				if err := s.imports.sendWritten(w); err != nil {
					return err
				}
			}
		case m := <-msgs:
			if err := s.handle(m); err != nil {
				return err
			}
		}
	}
}

// spokeSession is one hub session's state, owned by Run's goroutine.
type spokeSession struct {
	p       *Publisher
	stream  fedv1.Federation_PublishClient
	epoch   uint64
	resumed bool
	// synced: the hub has acknowledged this session's state (its full state, or the resume).
	synced   bool
	needFull bool
	inflight []pending
	fullAcc  State // the chunks of the full state in flight, as acknowledged
	// fullSent: a full state was sent and its last chunk not yet acknowledged.
	fullSent bool
	spoiled  uint64 // a full-state version the hub refused: its later chunks are refused too
	// imports is the session's import stream; nil when the spoke does not take it.
	imports *spokeImports
	// gwLast is the gateway set the session last announced, valid when gwSent.
	gwLast []registry.Gateway
	gwSent bool
	// gwTaken: the hub takes gateway announcements after the hello (an older
	// hub would end the session on one; it reads them at the next hello).
	gwTaken bool
}

func (s *spokeSession) report() { s.p.report(true, s.resumed, s.synced) }

// report tells the status callback where the session stands.
func (p *Publisher) report(connected, resumed, synced bool) {
	if p.cfg.Status == nil {
		return
	}
	p.cfg.Status(SessionStatus{Connected: connected, Resumed: resumed, Synced: synced, Epoch: p.sessionEpoch,
		AckedVersion: p.ackedVersion, Services: len(p.acked), Rejected: len(p.rejected) + len(p.tooBig) + len(p.unpermitted)})
}

// sendNext sends the full state, if the session needs one, or the delta
// between the publishable state and what the hub acknowledged.
func (s *spokeSession) sendNext() error {
	var batch []pending
	if s.needFull {
		batch, s.needFull, s.fullSent, s.fullAcc = s.p.fullState(), false, true, State{}
	} else {
		batch = s.p.delta()
	}
	for i := range batch {
		u := encodeUpdate(batch[i])
		u.LinkNanos = int64(s.p.link)
		if err := s.stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
			return fmt.Errorf("send update: %w", err)
		}
		if i == 0 && len(s.inflight) == 0 {
			// Only an update the hub takes at once measures the link: a later
			// one of a batch also waits for the hub's work on those before it.
			batch[i].sentAt = time.Now()
		}
	}
	s.inflight = batch
	return nil
}

// sendDigest sends the digest of what the hub acknowledged, when nothing is in flight.
func (s *spokeSession) sendDigest() error {
	p := s.p
	if len(s.inflight) > 0 || !p.ackedKnown {
		return nil
	}
	d := &fedv1.Digest{Version: p.ackedVersion, Digest: p.ackedDigest.String(), Services: uint32(len(p.acked))}
	if err := s.stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Digest{Digest: d}}); err != nil {
		return fmt.Errorf("send digest: %w", err)
	}
	return nil
}

func (s *spokeSession) handle(m *fedv1.HubMessage) error {
	switch k := m.GetKind().(type) {
	case *fedv1.HubMessage_Resync:
		s.p.log.Warn("hub asked for a resync", "reason", k.Resync.GetReason())
		s.needFull = true
		markAll(s.p.dirty, s.p.unpermitted) // should the full state be lost with the session
		clear(s.p.unpermitted)              // the full state tries them again
		return nil
	case *fedv1.HubMessage_Ack:
		u, err := s.answered(k.Ack.GetNonce())
		if err != nil {
			return err
		}
		s.p.estimateLink(u, time.Duration(k.Ack.GetHubNanos()), time.Now())
		return s.acked(u, k.Ack.GetDigest())
	case *fedv1.HubMessage_Nack:
		u, err := s.answered(k.Nack.GetNonce())
		if err != nil {
			return err
		}
		return s.refused(u, k.Nack)
	case *fedv1.HubMessage_Conflicts:
		s.p.conflictsFrom(k.Conflicts)
		return nil
	case *fedv1.HubMessage_Imports:
		if s.imports == nil {
			return fmt.Errorf("the hub sent imports, which this spoke did not ask for")
		}
		return s.imports.update(k.Imports)
	default:
		return fmt.Errorf("unexpected %T from the hub", k)
	}
}

// answered takes the oldest update in flight, which the hub answers in order.
func (s *spokeSession) answered(nonce string) (pending, error) {
	if len(s.inflight) == 0 || s.inflight[0].nonce != nonce {
		return pending{}, fmt.Errorf("answer for nonce %q, which is not the oldest update in flight", nonce)
	}
	u := s.inflight[0]
	s.inflight = s.inflight[1:]
	return u, nil
}

// acked records what the hub applied and checks its digest against ours.
func (s *spokeSession) acked(u pending, hubDigest string) error {
	p := s.p
	hadRetained := len(p.retained) > 0
	if u.full {
		for _, sh := range u.upserts {
			s.fullAcc[sh.shard.Service] = sh.shard
		}
		if !u.last {
			return nil // applied with the last chunk
		}
		p.resetAcked(s.fullAcc)
		p.retained = make(map[registry.ServiceKey]bool, len(u.retain))
		for _, k := range u.retain {
			p.retained[k] = true
		}
		s.synced, s.fullSent = true, false
	} else {
		p.applyAcked(u)
	}
	p.ackedEpoch, p.ackedVersion = s.epoch, u.version
	if hadRetained || len(p.retained) > 0 {
		// The hub holds shards of retained services that the spoke does not
		// know, so only the hub can compute the digest.
		if err := p.ackedDigest.UnmarshalText([]byte(hubDigest)); err != nil {
			return fmt.Errorf("hub acked with digest %q: %w", hubDigest, err)
		}
	} else if hubDigest != p.ackedDigest.String() {
		p.log.Warn("hub's digest differs from ours after an update; sending the full state", "hub", hubDigest, "spoke", p.ackedDigest)
		s.needFull = true
	}
	s.report()
	return nil
}

// refused records what the hub refused; a refused full state is sent again without it.
func (s *spokeSession) refused(u pending, n *fedv1.Nack) error {
	if u.full && u.version == s.spoiled {
		return nil // the rest of a full state the hub already refused
	}
	if err := s.p.rejectedBy(u, n); err != nil {
		return err
	}
	if u.full {
		s.spoiled, s.needFull = u.version, true
	}
	s.report()
	return nil
}

// rejectedBy records the services the hub refused. A rejection that names no
// service means the session itself is off: end it and start anew.
func (p *Publisher) rejectedBy(u pending, n *fedv1.Nack) error {
	sent := map[registry.ServiceKey]*registry.Shard{}
	for _, s := range u.upserts {
		sent[s.shard.Service] = s.shard
		p.dirty[s.shard.Service] = struct{}{} // not applied: looked at again, with what the hub refused
	}
	for _, k := range u.removes {
		p.dirty[k] = struct{}{}
	}
	for _, r := range n.GetRejections() {
		k := KeyFromProto(r.GetService())
		p.log.Error("hub rejected a service", "service", k, "version", u.version, "reason", r.GetReason())
		s, ok := sent[k]
		if r.GetService() == nil || !ok {
			return fmt.Errorf("hub rejected update %d: %s", u.version, r.GetReason())
		}
		p.refusals[k] = r.GetReason()
		if strings.HasPrefix(r.GetReason(), exportpolicy.ReasonNotPermitted+":") {
			p.unpermitted[k] = true // nor its last accepted form: the delta removes it
			continue
		}
		p.rejected[k] = s.Hash()
	}
	return nil
}

// conflictsFrom takes the hub's conflict set, which replaces the last one.
func (p *Publisher) conflictsFrom(m *fedv1.ServiceConflicts) {
	set := make(Conflicts, len(m.GetServices()))
	for _, sc := range m.GetServices() {
		k := KeyFromProto(sc.GetService())
		for i, text := range sc.GetConflicts() {
			e := Explanation{Text: text}
			if i < len(sc.GetReasons()) {
				e.Kind = registry.ConflictKind(sc.GetReasons()[i])
			}
			set[k] = append(set[k], e)
		}
	}
	if len(set) > 0 || len(p.conflicts) > 0 {
		p.log.Info("hub reported conflicts", "services", len(set))
	}
	p.conflicts, p.conflictsKnown = set, true
}

// updateReports tells OnReport what there is to report, when that changed.
// It looks only at services with a refusal or a conflict, so it is cheap
// enough to call after every event.
func (p *Publisher) updateReports() {
	for k := range p.refusals {
		s, ok := p.desired[k]
		s = p.wireForm(k, s)
		if old := p.acked[k]; !ok || s == nil || (!p.unpermitted[k] && old != nil && (old == s || old.Equal(s))) {
			// Gone, withheld by the spoke itself, or the hub holds the desired form.
			delete(p.refusals, k)
		}
	}
	next := make(Reports, len(p.refusals)+len(p.conflicts))
	for k, reason := range p.refusals {
		next[k] = ServiceReport{Refused: reason}
	}
	for k, texts := range p.conflicts {
		if _, ok := p.desired[k]; ok {
			r := next[k]
			r.Conflicts = texts
			next[k] = r
		}
	}
	if maps.EqualFunc(next, p.reported, ServiceReport.equal) && (p.conflictsTold || !p.conflictsKnown) {
		return
	}
	p.conflictsTold = p.conflictsKnown
	p.reported = next
	if p.cfg.OnReport != nil {
		p.cfg.OnReport(next) // never modified here: the next change makes a new map
	}
}

func (p *Publisher) resetAcked(s State) {
	p.acked = s
	p.ackedHashes = make(map[registry.ServiceKey]registry.Hash, len(s))
	p.ackedDigest = registry.ZeroHash
	for k, sh := range s {
		h := sh.Hash()
		p.ackedHashes[k] = h
		p.ackedDigest = p.ackedDigest.Xor(h)
	}
	p.ackedKnown = true
}

func (p *Publisher) applyAcked(u pending) {
	if p.acked == nil {
		p.acked = State{}
	}
	drop := func(k registry.ServiceKey) {
		delete(p.retained, k)
		if h, ok := p.ackedHashes[k]; ok {
			p.ackedDigest = p.ackedDigest.Xor(h)
			delete(p.ackedHashes, k)
			delete(p.acked, k)
		}
	}
	for _, k := range u.removes {
		drop(k)
	}
	for _, w := range u.upserts {
		s := w.shard
		drop(s.Service)
		h := s.Hash()
		p.acked[s.Service], p.ackedHashes[s.Service] = s, h
		p.ackedDigest = p.ackedDigest.Xor(h)
	}
}

// publishable is what may be sent for each service (see publishableOf).
// Services with no such form are returned apart: a full state asks the hub
// to retain them.
func (p *Publisher) publishable() (st State, withheld []registry.ServiceKey) {
	st = make(State, len(p.desired))
	for k := range p.desired {
		switch s, form := p.publishableOf(k); form {
		case formSent:
			st[k] = s
		case formWithheld:
			withheld = append(withheld, k)
		}
	}
	return st, withheld
}

// The form publishableOf finds for a service.
const (
	formNone     = iota // none: gone, or the hub's policy refused every form of it
	formSent            // the shard returned
	formWithheld        // no form the hub would take (the spoke withholds it, the hub refused it, or it is too large) and none acknowledged
)

// publishableOf is what may be sent for service k: its desired shard, or,
// where the hub refused that form, the spoke withholds it (invalid) or it
// is too large, the form the hub last accepted.
func (p *Publisher) publishableOf(k registry.ServiceKey) (*registry.Shard, int) {
	s, ok := p.desired[k]
	if !ok {
		delete(p.rejected, k) // refused while it left: the next form is new
		delete(p.unpermitted, k)
		delete(p.bare, k)
		return nil, formNone
	}
	s = p.wireForm(k, s)
	if p.unpermitted[k] {
		return nil, formNone // neither sent nor retained: the hub must hold no form of it
	}
	if s != nil {
		if h, ok := p.rejected[k]; ok {
			if s.Hash() == h {
				s = nil
			} else {
				delete(p.rejected, k) // changed since: try again
			}
		}
	}
	if h, ok := p.tooBig[k]; ok && s != nil && s.Hash() == h {
		s = nil
	}
	if s != nil {
		return s, formSent
	}
	if old, ok := p.acked[k]; ok {
		return old, formSent
	}
	return nil, formWithheld
}

// wireForm is the form of desired shard s the current hub takes: s, or s
// without its routes and policy for a hub that does not take them.
func (p *Publisher) wireForm(k registry.ServiceKey, s *registry.Shard) *registry.Shard {
	if p.trafficTaken || s == nil || s.Traffic.IsZero() {
		return s
	}
	if b, ok := p.bare[k]; ok && b[0] == s {
		return b[1]
	}
	c := *s
	c.Traffic = traffic.Set{}
	p.bare[k] = [2]*registry.Shard{s, &c}
	return &c
}

// tooLarge records (and logs) a shard of n bytes, more than the hub's
// message budget alone: it is never sent, and its refusal is reported.
func (p *Publisher) tooLarge(s *registry.Shard, n int) {
	p.tooBig[s.Service] = s.Hash()
	p.refusals[s.Service] = fmt.Sprintf("the service's shard is %d bytes (%d endpoints), more than the hub's message budget of %d bytes",
		n, len(s.Endpoints), p.maxBytes-envelopeBytes)
	p.log.Error("service too large to publish; the hub keeps its last accepted form", "service", s.Service,
		"bytes", n, "limit", p.maxBytes-envelopeBytes, "endpoints", len(s.Endpoints))
}

// envelopeBytes is room left in every message for what surrounds the shards.
const envelopeBytes = 1 << 10

// fullState returns the chunks of the whole publishable state, in service
// order, the last one naming the services the hub should retain.
func (p *Publisher) fullState() []pending {
	st, withheld := p.publishable()
	shards := make([]wireShard, 0, len(st))
	for k, s := range st {
		var w wireShard
		ok := true
		if s == p.acked[k] {
			w = wireOf(s) // the acknowledged form is sent as it was
		} else {
			w, ok = p.encode(s)
		}
		if !ok {
			withheld = append(withheld, k)
			continue
		}
		shards = append(shards, w)
	}
	p.dirty = map[registry.ServiceKey]struct{}{} // all of it is in the full state (see session's cleanup, should it be lost)
	for k := range p.bare {
		if _, ok := p.desired[k]; !ok {
			delete(p.bare, k) // left while not dirty: no delta looks at it again
		}
	}
	slices.SortFunc(shards, func(a, b wireShard) int { return a.shard.Service.Compare(b.shard.Service) })
	p.cfg.Origins.clear() // a full state is a resync: what the spoke saw before is in it, and traced by no one
	p.version++
	var out []pending
	for _, chunk := range chunkShards(shards, p.maxBytes-envelopeBytes) {
		out = append(out, pending{nonce: p.nextNonce(), version: p.version, full: true, upserts: chunk})
	}
	out[len(out)-1].last = true
	out[len(out)-1].retain = withheld
	return out
}

// delta returns the updates that take the hub from what it acknowledged to
// the publishable state, or nothing when they agree. Only dirty services can
// differ; withheld services are neither sent nor removed.
func (p *Publisher) delta() []pending {
	var upserts []wireShard
	var removes []registry.ServiceKey
	for k := range p.dirty {
		s, form := p.publishableOf(k)
		old, held := p.acked[k]
		switch {
		case form == formSent && held && (old == s || old.Equal(s)):
		case form == formSent:
			if w, ok := p.encode(s); ok { // else the hub keeps what it has
				upserts = append(upserts, w)
			}
		case held:
			removes = append(removes, k)
		case p.retained[k] && form == formNone:
			removes = append(removes, k) // gone, or refused by the policy: the hub may still hold a shard of it
		}
	}
	p.dirty = map[registry.ServiceKey]struct{}{} // not clear: its cost is the most it ever held
	if len(upserts) == 0 && len(removes) == 0 {
		return nil
	}
	slices.SortFunc(upserts, func(a, b wireShard) int { return a.shard.Service.Compare(b.shard.Service) })
	slices.SortFunc(removes, registry.ServiceKey.Compare)
	var out []pending
	for i, chunk := range chunkShards(upserts, p.maxBytes-envelopeBytes) {
		p.version++
		u := pending{nonce: p.nextNonce(), version: p.version, upserts: chunk}
		if i == 0 {
			u.removes = removes
		}
		keys := slices.Clone(u.removes)
		for _, s := range chunk {
			keys = append(keys, s.shard.Service)
		}
		u.origins = p.cfg.Origins.take(keys)
		out = append(out, u)
	}
	return out
}

// wireShard is a shard and its wire form, converted once.
type wireShard struct {
	shard *registry.Shard
	wire  *fedv1.Shard
	bytes int // as an item of an update (ItemBytes)
}

// encode converts s to its wire form, unless it is too large for the hub's
// message budget (tooLarge), which it is never sent.
func (p *Publisher) encode(s *registry.Shard) (wireShard, bool) {
	w := wireOf(s)
	if n := proto.Size(w.wire); n > p.maxBytes-envelopeBytes {
		p.tooLarge(s, n)
		return wireShard{}, false
	}
	return w, true
}

func wireOf(s *registry.Shard) wireShard {
	w := ShardToProto(s)
	return wireShard{shard: s, wire: w, bytes: ItemBytes(w)}
}

// chunkShards splits shards into groups whose encoding stays under budget
// (a shard larger than the budget gets a group of its own: only an
// acknowledged form, sent as it was, can be); there is always at least
// one, possibly empty, group.
func chunkShards(shards []wireShard, budget int) [][]wireShard {
	out := [][]wireShard{nil}
	c := Chunker{Budget: budget}
	for _, s := range shards {
		if c.Next(s.bytes) {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], s)
	}
	return out
}

func (p *Publisher) nextNonce() string {
	p.nonce++
	return strconv.FormatUint(p.nonce, 36)
}

func encodeUpdate(u pending) *fedv1.Update {
	out := &fedv1.Update{Nonce: u.nonce, Version: u.version, FullState: u.full, LastChunk: u.last}
	for _, s := range u.upserts {
		out.Upserts = append(out.Upserts, s.wire)
	}
	for _, k := range u.removes {
		out.Removes = append(out.Removes, KeyToProto(k))
	}
	for _, k := range u.retain {
		out.Retain = append(out.Retain, KeyToProto(k))
	}
	out.Origins = u.origins
	return out
}

// estimateLink takes the round trip of an acknowledged update (on this
// clock, answered at now) less the hub's time on it (on the hub's) as
// twice the one-way delay to the hub: each a duration on one clock, never
// a timestamp compared across machines. Only the session's goroutine
// calls it.
func (p *Publisher) estimateLink(u pending, hub time.Duration, now time.Time) {
	if u.sentAt.IsZero() || hub < 0 {
		return
	}
	if rtt := now.Sub(u.sentAt); hub <= rtt {
		p.link = (rtt - hub) / 2
	}
}
