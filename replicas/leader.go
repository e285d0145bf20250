package replicas

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/navemesh/nave/internal/backoff"
)

// LeaderConfig configures Lead.
type LeaderConfig struct {
	// Prefix is the root of the hub's keys in etcd, as for NewCatalog; the
	// election lives under Prefix+"leader/".
	Prefix string
	// ID names this replica: the election's value, what CurrentLeader returns. Required.
	ID string
	// SessionTTL is the TTL, in seconds, of the lease behind the etcd session.
	// A leader cut off from etcd ends its term before the lease can expire;
	// another replica takes over once it has (a leader that stops resigns at once).
	SessionTTL int
	// MinBackoff and MaxBackoff bound the exponential, jittered pause between
	// campaigns after an error (etcd unreachable, a term that panicked).
	MinBackoff, MaxBackoff time.Duration
}

// DefaultLeaderConfig returns what Lead uses for fields left zero (ID has no default).
func DefaultLeaderConfig() LeaderConfig {
	return LeaderConfig{Prefix: "/nave/", SessionTTL: 5, MinBackoff: 200 * time.Millisecond, MaxBackoff: 10 * time.Second}
}

// cleanupTimeout bounds resigning and revoking the session when a campaign
// ends: with etcd unreachable they cannot succeed, and the lease expires anyway.
const cleanupTimeout = 2 * time.Second

// electionPrefix is the prefix concurrency.Election gets (it adds the "/").
func electionPrefix(prefix string) string {
	prefix = cmp.Or(prefix, DefaultLeaderConfig().Prefix)
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return prefix + "leader"
}

// CurrentLeader returns the ID of the replica that leads as etcd sees it, or
// "" when none does. prefix is LeaderConfig.Prefix.
func CurrentLeader(ctx context.Context, etcd *clientv3.Client, prefix string) (string, error) {
	resp, err := etcd.Get(ctx, electionPrefix(prefix)+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("read the current leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// Lead campaigns for leadership until ctx ends. Each time this replica wins,
// it runs term with a context that ends the moment leadership is lost: the
// etcd session ends (its keepalive failed for a TTL, or the client closed),
// the leader key is deleted (lease revoked, resigned elsewhere), the etcd
// member loses its quorum, etcd cannot confirm in time that the session lease
// still lives, or ctx ends. When term returns, Lead resigns, so another
// replica takes over at once, and campaigns again with a new session: at
// once after a term that lasted, after a jittered backoff after errors (etcd
// unreachable), a term that panicked (logged and recovered), returned on its
// own, or ended soon after it began.
//
// Terms of one Lead never overlap. A term ends before its lease can expire
// in etcd, so a replica cut off from etcd stops leading before another one
// can start; a handover by resigning is ordered by etcd. Only a replica whose
// key is deleted while it leads (a revoked lease) can briefly overlap with
// the next leader, until its watch tells it: writes that must never come from
// a deposed leader carry LeaderFence (SnapshotStore.Save does).
//
// Lead returns nil when ctx ends, and an error only when it can never lead:
// cfg.ID is empty or the etcd client was closed.
func Lead(ctx context.Context, etcd *clientv3.Client, cfg LeaderConfig, log *slog.Logger, term func(context.Context)) error {
	if cfg.ID == "" {
		return errors.New("lead: LeaderConfig.ID is empty")
	}
	def := DefaultLeaderConfig()
	cfg.Prefix = cmp.Or(cfg.Prefix, def.Prefix)
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = def.SessionTTL
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = def.MinBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	c := &candidate{etcd: etcd, cfg: cfg, term: term, log: log.With("component", "leader", "id", cfg.ID)}
	retry := backoff.New(backoff.Config{Min: cfg.MinBackoff, Max: cfg.MaxBackoff})
	// A campaign (or term) that lasted this long did not end in a tight loop:
	// the backoff starts over, and a term that ended cleanly is followed by a
	// new campaign at once.
	healthy := time.Duration(cfg.SessionTTL) * time.Second
	for {
		started := time.Now()
		err := c.campaign(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if etcd.Ctx().Err() != nil {
			return fmt.Errorf("lead: the etcd client is closed: %w", context.Cause(etcd.Ctx()))
		}
		if time.Since(started) >= healthy {
			retry.Reset()
			if err == nil {
				continue
			}
		}
		// Full jitter: replicas that failed together do not campaign together.
		wait := retry.Next()
		if err != nil {
			c.log.Warn("leader election: campaigning again", "err", err, "in", wait.Round(time.Millisecond))
		} else {
			c.log.Info("leadership ended soon after it began; campaigning again", "in", wait.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// candidate is one Lead loop; its fields do not change.
type candidate struct {
	etcd *clientv3.Client
	cfg  LeaderConfig
	term func(context.Context)
	log  *slog.Logger
}

// campaign runs one session: campaign, lead, resign. It returns nil after a
// term that ended because leadership was lost or ctx ended.
func (c *candidate) campaign(ctx context.Context) error {
	// The lease is granted here, under ctx, so an unreachable etcd cannot hold
	// Lead; the session itself lives until this function ends, not until ctx
	// does, so that leaving can still resign and revoke.
	grantCtx, cancel := context.WithTimeout(ctx, time.Duration(c.cfg.SessionTTL)*time.Second)
	lease, err := c.etcd.Grant(grantCtx, int64(c.cfg.SessionTTL))
	cancel()
	if err != nil {
		return fmt.Errorf("grant a session lease: %w", err)
	}
	sess, err := concurrency.NewSession(c.etcd, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(lease.TTL)),
		concurrency.WithContext(context.WithoutCancel(ctx)))
	if err == nil && sess == nil {
		err = errors.New("no keepalive")
	}
	if err != nil {
		revokeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		_, _ = c.etcd.Revoke(revokeCtx, lease.ID)
		cancel()
		return fmt.Errorf("start an etcd session: %w", err)
	}
	election := concurrency.NewElection(sess, electionPrefix(c.cfg.Prefix))
	won := false
	defer func() {
		alive := true
		select {
		case <-sess.Done():
			alive = false // expired or the client closed: nothing left to resign or revoke
		default:
		}
		sess.Orphan()
		if !alive {
			return
		}
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if won {
			if err := election.Resign(cleanup); err != nil {
				c.log.Warn("cannot resign; the lease will expire", "err", err)
			}
		}
		if _, err := c.etcd.Revoke(cleanup, lease.ID); err != nil {
			c.log.Debug("cannot revoke the session lease; it will expire", "err", err)
		}
	}()
	if err := c.win(ctx, sess, election); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	won = true
	return c.hold(ctx, sess, election, time.Duration(lease.TTL)*time.Second)
}

// win campaigns until this replica leads (nil), ctx ends or the session does.
func (c *candidate) win(ctx context.Context, sess *concurrency.Session, e *concurrency.Election) error {
	campaignCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-campaignCtx.Done():
		}
	}()
	done := make(chan error, 1)
	go func() { done <- e.Campaign(campaignCtx, c.cfg.ID) }()
	select {
	case err := <-done:
		select {
		case <-sess.Done():
			return errors.New("the etcd session ended while campaigning")
		default:
		}
		if err != nil {
			return fmt.Errorf("campaign: %w", err)
		}
		return nil
	case <-ctx.Done():
		cancel()
		// A cancelled Campaign resigns with the client's own context, which
		// waits for as long as etcd is unreachable: give it a moment, then
		// leave it to finish on its own (the lease expires regardless).
		select {
		case <-done:
		case <-time.After(cleanupTimeout):
			c.log.Warn("leaving a campaign to finish on its own: etcd does not answer")
		}
		return ctx.Err()
	}
}

// hold runs one term while this replica leads.
func (c *candidate) hold(ctx context.Context, sess *concurrency.Session, e *concurrency.Election, ttl time.Duration) error {
	// Learn how long the lease lasts for sure before the term starts.
	expiry, err := c.leaseExpiry(ctx, sess.Lease(), time.Now().Add(ttl))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("confirm the session lease: %w", err)
	}
	termCtx, end := context.WithCancelCause(context.WithValue(ctx, leaderFenceKey{}, leaderFence{key: e.Key(), rev: e.Rev()}))
	var guard sync.WaitGroup
	guard.Go(func() { c.guard(termCtx, end, sess, sess.Lease(), expiry, ttl) })
	guard.Go(func() { c.watchLeaderKey(termCtx, end, e) })

	c.log.Info("leading", "key", e.Key())
	started := time.Now()
	err = runTerm(termCtx, c.term, c.log)
	returned := termCtx.Err() == nil
	end(errors.New("the term returned"))
	guard.Wait()
	c.log.Info("no longer leading", "after", time.Since(started).Round(time.Millisecond), "why", context.Cause(termCtx))
	switch {
	case err != nil:
		return err
	case returned && ctx.Err() == nil:
		return errors.New("the term returned while this replica led")
	}
	return nil
}

// runTerm runs term, turning a panic into an error.
func runTerm(ctx context.Context, term func(context.Context), log *slog.Logger) (err error) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("leader term panicked", "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("the term panicked: %v", r)
		}
	}()
	term(ctx)
	return nil
}

var errLeaseGone = errors.New("the session lease is gone")

// guard ends the term (end) the moment leadership is lost, as far as this
// replica can tell; it returns when the term has ended, for whatever reason.
//
// The session's keepalive only gives up a whole TTL after its last answer,
// later than etcd expires the lease. So guard also asks for the lease's
// remaining TTL every quarter TTL, and ends the term when the last answer no
// longer vouches for the lease: before etcd can elect another leader.
func (c *candidate) guard(termCtx context.Context, end context.CancelCauseFunc, sess *concurrency.Session,
	lease clientv3.LeaseID, expiry time.Time, ttl time.Duration) {
	check := time.NewTicker(ttl / 4)
	defer check.Stop()
	deadline := time.NewTimer(time.Until(expiry))
	defer deadline.Stop()
	for {
		select {
		case <-termCtx.Done():
			return
		case <-sess.Done():
			end(errors.New("the etcd session ended"))
			return
		case <-deadline.C:
			end(errors.New("etcd did not confirm the session lease before it could expire"))
			return
		case <-check.C:
			next, err := c.leaseExpiry(termCtx, lease, expiry)
			switch {
			case errors.Is(err, errLeaseGone):
				end(err)
				return
			case err == nil && next.After(expiry):
				expiry = next
				deadline.Reset(time.Until(expiry))
			}
			// Any other error: the deadline stands, and ends the term if etcd stays silent.
		}
	}
}

// watchLeaderKey ends the term (end) the moment the leader key is deleted
// (lease revoked, resigned by an operator) or, as it watches WithRequireLeader,
// when the etcd member this client talks to loses its quorum. It runs apart
// from guard: Watch itself waits while etcd is unreachable.
func (c *candidate) watchLeaderKey(termCtx context.Context, end context.CancelCauseFunc, e *concurrency.Election) {
	watchCtx, cancel := context.WithCancel(clientv3.WithRequireLeader(termCtx))
	defer cancel()
	for wr := range c.etcd.Watch(watchCtx, e.Key(), clientv3.WithRev(e.Rev()+1)) {
		if err := wr.Err(); err != nil || wr.Canceled {
			end(fmt.Errorf("the watch on the leader key failed: %v", err))
			return
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				end(errors.New("the leader key was deleted"))
				return
			}
		}
	}
	end(errors.New("the watch on the leader key ended"))
}

// leaseExpiry asks etcd (its leader answers) how long the lease has left,
// waiting no later than until. etcd rounds the answer down to a second and
// computed it after the question was sent, so the lease lives at least until
// the time returned.
func (c *candidate) leaseExpiry(ctx context.Context, lease clientv3.LeaseID, until time.Time) (time.Time, error) {
	sent := time.Now()
	askCtx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	resp, err := c.etcd.TimeToLive(askCtx, lease)
	if err != nil {
		return time.Time{}, err
	}
	if resp.TTL <= 0 {
		return time.Time{}, errLeaseGone
	}
	return sent.Add(time.Duration(resp.TTL) * time.Second), nil
}

type leaderFenceKey struct{}

type leaderFence struct {
	key string
	rev int64
}

// LeaderFence returns, for the context of a leader term (the one Lead passes
// to term, or one derived from it), a comparison that holds in etcd exactly
// while that term's leadership does: a Txn with it among its conditions
// writes only if this replica still leads. A term ends as soon as this
// replica learns that it lost leadership, but only a fenced write is safe
// from a replica that has not learnt it yet. SnapshotStore.Save uses it.
func LeaderFence(ctx context.Context) (clientv3.Cmp, bool) {
	f, ok := ctx.Value(leaderFenceKey{}).(leaderFence)
	if !ok {
		return clientv3.Cmp{}, false
	}
	return clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev), true
}
