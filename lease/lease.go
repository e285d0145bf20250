// Package lease elects one holder at a time of a coordination.k8s.io/v1 Lease.
//
// It does what client-go's tools/leaderelection does for a Lease lock, without
// linking client-go's typed clientset: tools/leaderelection imports
// resourcelock, which imports the typed clients and with them
// k8s.io/client-go/kubernetes/scheme (about 8 MiB of RSS per process). It also
// orders a handover: the holder's Leading has returned before the Lease is
// released, so the next holder starts only once this one has stopped.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Store reads and writes Leases of one namespace. Its methods have the
// signatures of client-go's typed LeaseInterface, which the spoke's own
// client (internal/kubeclient) has too.
//
// Errors are judged with k8s.io/apimachinery/pkg/api/errors: NotFound,
// AlreadyExists and Conflict mean what they mean for the API server; any
// other error is retried. Every method must return once its ctx ends: Run
// bounds each request by a context, and cannot return while one is still
// running.
type Store interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
}

// Config configures Run.
type Config struct {
	// Name names the Lease (its namespace is the Store's). Required.
	Name string
	// Identity is what this candidate writes as the Lease's holder: unique
	// among the candidates (a pod name), and stable across restarts, so that
	// a restarted holder takes its Lease back at once. Required.
	Identity string
	// LeaseDuration is how long a candidate waits, after it last saw the
	// Lease change, before it takes the Lease from another holder. It is
	// written to the Lease in whole seconds, rounded up.
	LeaseDuration time.Duration
	// RenewDeadline is how long after its last successful renewal (from when
	// that request was sent) the holder keeps leading without another one.
	// Shorter than LeaseDuration, so that a holder cut off from the API
	// server stops leading before another candidate can start.
	RenewDeadline time.Duration
	// RetryPeriod is how often a candidate tries to take the Lease and the
	// holder renews it. Shorter than RenewDeadline, so that the holder gets
	// more than one try before its deadline.
	RetryPeriod time.Duration
	// Log receives what happens to the Lease; nil logs nothing.
	Log *slog.Logger
}

// DefaultConfig returns client-go's usual timing, 15s/10s/2s; Name and
// Identity are left for the caller (Run requires them).
func DefaultConfig() Config {
	return Config{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
}

// Callbacks are what Run tells its caller. Both are called from goroutines
// that Run waits for before it returns.
type Callbacks struct {
	// Leading runs, in a goroutine of its own, while this identity holds the
	// Lease; its ctx ends when leadership does. Run waits for it to return
	// before it releases the Lease, so it should return soon after its ctx
	// ends: until it does, no other candidate can take over (Run keeps
	// renewing the Lease meanwhile). A panic in it is logged and ends the
	// leadership as if it had returned. Required.
	Leading func(ctx context.Context)
	// NewLeader, if set, is told each identity seen holding the Lease when it
	// differs from the last one it was told, or the Lease was free in between
	// (this identity included, once it takes the Lease; a free Lease is not
	// reported). It is called from Run's own goroutine and must not block.
	NewLeader func(identity string)
}

// ErrInvalidConfig is wrapped by Run's error when Config or Callbacks cannot work.
var ErrInvalidConfig = errors.New("lease: invalid config")

// Why leadership ended; context causes of leadCtx and log values.
var (
	errLeadingReturned = errors.New("the Leading callback returned")
	errRenewDeadline   = errors.New("the Lease was not renewed within RenewDeadline")
	errTakenOver       = errors.New("another identity holds the Lease")
	errDeleted         = errors.New("the Lease was deleted")
)

// Run competes for the Lease until it has held it once, then returns: callers
// loop to stand again. It tries at once, then every RetryPeriod (jittered by
// ±10%). It takes the Lease when it is absent (creating it), free, held by
// this identity already (a restart), or held by another identity whose record
// has not changed for LeaseDuration by this process's clock (the holder's
// clock may be skewed, so its RenewTime is never compared with local time).
// The wait uses the longer of LeaseDuration and the LeaseDurationSeconds
// written in the Lease, so a holder configured with a longer duration is
// never cut short.
//
// While it holds the Lease, Run calls cb.Leading and renews the Lease every
// RetryPeriod. Leading's ctx ends when ctx ends, when Leading returns on its
// own, when a renewal finds another identity holding the Lease (or the Lease
// deleted), or when no renewal has succeeded for RenewDeadline since the last
// successful one was sent (the acquiring write counts as one). The deadline
// is kept by a timer, and each request's context ends with it, so that a hung
// request cannot stretch it. One failed renewal does not end leadership.
//
// After Leading's ctx ends, Run waits for Leading to return (renewing the
// Lease meanwhile, unless it was lost) and then, if this identity still holds
// the Lease, releases it: it clears the holder and sets LeaseDurationSeconds
// to 1, so that a standby takes over within its RetryPeriod. A Lease lost to
// another identity or to the deadline is not written again.
//
// Run calls Leading at most once, so its terms never overlap, and not at all
// if ctx ended before the Lease was taken (a Lease taken just as ctx ended is
// released at once). Every goroutine Run starts has ended
// when it returns. Run returns an error wrapping ErrInvalidConfig when cfg or
// cb cannot work, and nil otherwise, including when ctx ended (callers check
// ctx themselves); failed requests are logged and retried.
func Run(ctx context.Context, store Store, cfg Config, cb Callbacks) error {
	if err := validate(store, cfg, cb); err != nil {
		return err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &elector{
		store: store, cfg: cfg, cb: cb,
		log: log.With("component", "lease", "lease", cfg.Name, "identity", cfg.Identity),
	}
	held, sent, ok := e.acquire(ctx)
	if !ok {
		return nil
	}
	e.lead(ctx, held, sent)
	return nil
}

// ValidTiming returns an error unless 0 < retryPeriod < renewDeadline <
// leaseDuration, the timing Run requires (see Config).
func ValidTiming(leaseDuration, renewDeadline, retryPeriod time.Duration) error {
	switch {
	case retryPeriod <= 0:
		return fmt.Errorf("RetryPeriod %v is not positive", retryPeriod)
	case renewDeadline <= retryPeriod:
		return fmt.Errorf("RenewDeadline %v is not longer than RetryPeriod %v", renewDeadline, retryPeriod)
	case leaseDuration <= renewDeadline:
		return fmt.Errorf("LeaseDuration %v is not longer than RenewDeadline %v", leaseDuration, renewDeadline)
	}
	return nil
}

func validate(store Store, cfg Config, cb Callbacks) error {
	var problems []error
	check := func(bad bool, msg string, args ...any) {
		if bad {
			problems = append(problems, fmt.Errorf(msg, args...))
		}
	}
	check(store == nil, "no Store")
	check(cfg.Name == "", "no Lease name")
	check(cfg.Identity == "", "no identity")
	if err := ValidTiming(cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod); err != nil {
		problems = append(problems, err)
	}
	check(cb.Leading == nil, "no Leading callback")
	if len(problems) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(problems...))
	}
	return nil
}

// elector is the state of one Run. Its fields are owned by Run's goroutine.
type elector struct {
	store Store
	cfg   Config
	cb    Callbacks
	log   *slog.Logger

	// observed is the Lease as last read or written, and observedAt the
	// local time at which its holder, renewTime or resourceVersion last
	// changed: expiry is judged by this process's clock only.
	observed   *coordinationv1.Lease
	observedAt time.Time
	// reported is the holder last told to NewLeader; "" after a free Lease.
	reported string
}

// acquire tries until it holds the Lease or ctx ends. It returns the Lease as
// written and when the successful request was sent.
func (e *elector) acquire(ctx context.Context) (*coordinationv1.Lease, time.Time, bool) {
	retry := time.NewTimer(0)
	defer retry.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return nil, time.Time{}, false
		case <-retry.C:
		}
		if held, sent, ok := e.tryAcquire(ctx); ok {
			return held, sent, true
		}
		retry.Reset(jitter(e.cfg.RetryPeriod))
	}
	return nil, time.Time{}, false
}

// tryAcquire makes one attempt: read the Lease, then create or take it if it may.
func (e *elector) tryAcquire(ctx context.Context) (*coordinationv1.Lease, time.Time, bool) {
	// A write that succeeds within RenewDeadline of its Get is one that
	// leaves time to lead before the deadline it starts.
	ctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline)
	defer cancel()
	cur, err := e.store.Get(ctx, e.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return e.create(ctx)
	}
	if err != nil {
		e.requestFailed(ctx, "read the Lease", err)
		return nil, time.Time{}, false
	}
	e.observe(cur)
	holder := holderOf(cur)
	if holder != "" && holder != e.cfg.Identity && time.Now().Before(e.observedAt.Add(e.expiry(cur))) {
		return nil, time.Time{}, false
	}
	now := time.Now()
	want := cur.DeepCopy()
	transitions := ptrValue(want.Spec.LeaseTransitions)
	if holder != e.cfg.Identity {
		transitions++
	}
	want.Spec.HolderIdentity = &e.cfg.Identity
	want.Spec.LeaseDurationSeconds = ptr(e.durationSeconds())
	want.Spec.AcquireTime = ptr(metav1.NewMicroTime(now))
	want.Spec.RenewTime = ptr(metav1.NewMicroTime(now))
	want.Spec.LeaseTransitions = &transitions
	got, err := e.store.Update(ctx, want, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		e.log.Debug("another candidate wrote the Lease first", "err", err)
		return nil, time.Time{}, false
	case err != nil:
		e.requestFailed(ctx, "take the Lease", err)
		return nil, time.Time{}, false
	}
	if holder == "" || holder == e.cfg.Identity {
		e.log.Info("acquired the Lease", "transitions", transitions)
	} else {
		e.log.Info("acquired the Lease", "from", holder, "transitions", transitions)
	}
	e.observe(got)
	return got, now, true
}

// create writes a new Lease held by this identity.
func (e *elector) create(ctx context.Context) (*coordinationv1.Lease, time.Time, bool) {
	now := time.Now()
	want := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: e.cfg.Name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &e.cfg.Identity,
			LeaseDurationSeconds: ptr(e.durationSeconds()),
			AcquireTime:          ptr(metav1.NewMicroTime(now)),
			RenewTime:            ptr(metav1.NewMicroTime(now)),
			LeaseTransitions:     ptr[int32](0),
		},
	}
	got, err := e.store.Create(ctx, want, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		e.log.Debug("another candidate created the Lease first")
		return nil, time.Time{}, false
	case err != nil:
		e.requestFailed(ctx, "create the Lease", err)
		return nil, time.Time{}, false
	}
	e.log.Info("acquired the Lease", "created", true)
	e.observe(got)
	return got, now, true
}

// lead runs Leading while it renews the Lease held since sent, then releases
// the Lease if it is still this identity's.
func (e *elector) lead(ctx context.Context, held *coordinationv1.Lease, sent time.Time) {
	deadline := sent.Add(e.cfg.RenewDeadline)
	if !time.Now().Before(deadline) {
		e.log.Warn("lost the Lease", "why", errRenewDeadline, "renewDeadline", e.cfg.RenewDeadline)
		return
	}
	if ctx.Err() != nil {
		e.release(ctx, held) // taken as ctx ended: Leading never starts after ctx ended
		return
	}
	leadCtx, endLead := context.WithCancelCause(ctx)
	defer endLead(nil)
	// Renewals go on after leadCtx ends, until Leading has returned: the
	// Lease stays held while the old leader winds down.
	renewCtx, stopRenewing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRenewing()

	// The deadline timer ends leadCtx on its own, whatever a request is doing.
	expired := make(chan struct{}) // closed by the timer's func, once it has ended leadCtx
	deadlineTimer := time.AfterFunc(time.Until(deadline), func() {
		endLead(errRenewDeadline)
		close(expired)
	})
	defer func() {
		if !deadlineTimer.Stop() {
			<-expired // its func started: let it finish before Run returns
		}
	}()

	leadingDone := make(chan struct{})
	go func() {
		defer close(leadingDone)
		defer stopRenewing()
		defer endLead(errLeadingReturned)
		defer func() {
			if r := recover(); r != nil {
				e.log.Error("Leading panicked", "panic", r, "stack", string(debug.Stack()))
			}
		}()
		e.cb.Leading(leadCtx)
	}()

	tick := time.NewTicker(e.cfg.RetryPeriod)
	defer tick.Stop()
	var lost error // why the Lease is no longer this identity's; nil while it is
	markLost := func(why error) {
		if lost != nil {
			return
		}
		lost = why
		endLead(why)
		tick.Stop() // a lost Lease is not written again
		if errors.Is(why, errRenewDeadline) {
			e.log.Warn("lost the Lease", "why", why, "renewDeadline", e.cfg.RenewDeadline)
		} else {
			e.log.Warn("lost the Lease", "why", why, "holder", holderOf(e.observed))
		}
	}
	leadEnded := leadCtx.Done()
	for waiting := true; waiting; {
		select {
		case <-leadingDone:
			waiting = false
		case <-leadEnded:
			leadEnded = nil
			switch why := context.Cause(leadCtx); {
			case errors.Is(why, errRenewDeadline):
				markLost(why)
			case errors.Is(why, errLeadingReturned):
				e.log.Info("leadership ends", "why", why)
			case lost == nil:
				e.log.Info("leadership ends", "why", "the context ended")
			}
		case <-tick.C:
			if !time.Now().Before(deadline) {
				markLost(errRenewDeadline) // the timer has fired or is about to
				continue
			}
			var renewedAt time.Time
			var why error
			if held, renewedAt, why = e.renew(renewCtx, held, deadline); why != nil {
				markLost(why)
				continue
			}
			if renewedAt.IsZero() {
				continue // failed; retried at the next tick, until the deadline
			}
			if !deadlineTimer.Stop() {
				markLost(errRenewDeadline) // renewed too late: leadCtx has ended
				continue
			}
			deadline = renewedAt.Add(e.cfg.RenewDeadline)
			deadlineTimer.Reset(time.Until(deadline))
		}
	}
	if !time.Now().Before(deadline) {
		markLost(errRenewDeadline)
	}
	if lost == nil {
		e.release(ctx, held)
	}
}

// renew makes one renewal of held, within deadline. It returns the Lease as
// it now is, when the successful request was sent (zero when it failed), and
// why the Lease is lost, if it is.
func (e *elector) renew(ctx context.Context, held *coordinationv1.Lease, deadline time.Time) (*coordinationv1.Lease, time.Time, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	sent := time.Now()
	want := held.DeepCopy()
	want.Spec.HolderIdentity = &e.cfg.Identity
	want.Spec.LeaseDurationSeconds = ptr(e.durationSeconds())
	want.Spec.RenewTime = ptr(metav1.NewMicroTime(sent))
	got, err := e.store.Update(ctx, want, metav1.UpdateOptions{})
	switch {
	case err == nil:
		e.observe(got)
		return got, sent, nil
	case apierrors.IsNotFound(err):
		return held, time.Time{}, errDeleted
	case !apierrors.IsConflict(err):
		e.requestFailed(ctx, "renew the Lease", err)
		return held, time.Time{}, nil
	}
	// Someone wrote the Lease since: another candidate, or an earlier
	// renewal of ours whose reply was lost. Read it to tell which.
	cur, err := e.store.Get(ctx, e.cfg.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return held, time.Time{}, errDeleted
	case err != nil:
		e.requestFailed(ctx, "read the Lease after a conflict", err)
		return held, time.Time{}, nil
	}
	e.observe(cur)
	if holderOf(cur) != e.cfg.Identity {
		return cur, time.Time{}, errTakenOver
	}
	return cur, time.Time{}, nil // still ours: the next renewal writes over the newer version
}

// release hands the Lease back, if it is still this identity's, so that a
// standby takes it without waiting for LeaseDuration. It has a context of
// its own (ctx may have ended), bounded by RenewDeadline.
func (e *elector) release(ctx context.Context, held *coordinationv1.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RenewDeadline)
	defer cancel()
	for {
		now := metav1.NewMicroTime(time.Now())
		want := held.DeepCopy()
		want.Spec.HolderIdentity = nil
		want.Spec.LeaseDurationSeconds = ptr[int32](1)
		want.Spec.AcquireTime = &now
		want.Spec.RenewTime = &now
		got, err := e.store.Update(ctx, want, metav1.UpdateOptions{})
		switch {
		case err == nil:
			e.log.Info("released the Lease")
			e.observe(got)
			return
		case apierrors.IsNotFound(err):
			return
		case apierrors.IsConflict(err):
			// Written since our last write (a renewal whose reply was lost,
			// or another candidate): release it only if it is still ours.
			cur, getErr := e.store.Get(ctx, e.cfg.Name, metav1.GetOptions{})
			if getErr == nil {
				e.observe(cur)
				if holderOf(cur) != e.cfg.Identity {
					e.log.Info("not releasing the Lease: another identity holds it", "holder", holderOf(cur))
					return
				}
				held = cur
				continue
			}
			err = getErr
		}
		if ctx.Err() == nil {
			e.requestFailed(ctx, "release the Lease", err)
			select {
			case <-ctx.Done():
			case <-time.After(e.cfg.RetryPeriod):
				continue
			}
		}
		e.log.Warn("could not release the Lease; a standby takes it after LeaseDuration", "err", err)
		return
	}
}

// observe notes l as the Lease's current state, and reports a new holder.
func (e *elector) observe(l *coordinationv1.Lease) {
	if o := e.observed; o == nil || holderOf(o) != holderOf(l) || o.ResourceVersion != l.ResourceVersion ||
		!microTimeEqual(o.Spec.RenewTime, l.Spec.RenewTime) {
		e.observedAt = time.Now()
	}
	e.observed = l
	holder := holderOf(l)
	if holder == e.reported {
		return
	}
	e.reported = holder
	if holder == "" {
		return
	}
	if holder != e.cfg.Identity {
		e.log.Info("new leader observed", "leader", holder)
	}
	if e.cb.NewLeader != nil {
		e.cb.NewLeader(holder)
	}
}

// expiry is how long l's holder may go without a change before another
// candidate takes the Lease.
func (e *elector) expiry(l *coordinationv1.Lease) time.Duration {
	return max(e.cfg.LeaseDuration, time.Duration(ptrValue(l.Spec.LeaseDurationSeconds))*time.Second)
}

// durationSeconds is LeaseDuration as the Lease states it, rounded up so that
// others never wait less than this candidate promised.
func (e *elector) durationSeconds() int32 {
	return int32(min(math.Ceil(e.cfg.LeaseDuration.Seconds()), math.MaxInt32))
}

// requestFailed logs a failed request, unless it failed because its context ended.
func (e *elector) requestFailed(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		e.log.Debug("request ended with its context", "request", what, "err", err)
		return
	}
	e.log.Warn("request failed; retrying", "request", what, "err", err)
}

func holderOf(l *coordinationv1.Lease) string { return ptrValue(l.Spec.HolderIdentity) }

func microTimeEqual(a, b *metav1.MicroTime) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}

// jitter spreads d by ±10%, so that candidates started together do not keep trying together.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()-0.5)*0.2*float64(d))
}

func ptr[T any](v T) *T { return &v }

func ptrValue[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}
