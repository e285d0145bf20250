package spoke

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/navemesh/nave/federation"
)

// LeaderElection configures the coordination.k8s.io Lease through which one
// of several spoke replicas of a cluster (the candidates' Deployment) is the one that
// streams to the hub; the others keep their caches warm and take over when
// the leader's lease runs out (or at once, when it stops cleanly and
// releases the lease).
type LeaderElection struct {
	Enabled bool
	// Namespace and Name name the Lease.
	Namespace, Name string
	// LeaseDuration is how long a standby waits after the leader's last
	// renewal before it takes over; RenewDeadline is how long after its last
	// successful renewal the leader stops streaming (shorter than
	// LeaseDuration by more than RetryPeriod/2, so a leader stops before a
	// standby starts); RetryPeriod is how often both try.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// StandBack is how long a leader that gave up the Lease (it could not
	// reach the hub, see Config.GiveUpAfter) stays out of the election, so
	// that a standby takes it; then it is a candidate again. 0: LeaseDuration.
	StandBack time.Duration
}

// DefaultLeaderElection returns the Lease settings `nave spoke --source kube`
// starts with: Lease nave-spoke in the pod's namespace (POD_NAMESPACE, else
// the service account's namespace, else nave-system), and client-go's usual
// 15s/10s/2s timing.
func DefaultLeaderElection() LeaderElection {
	return LeaderElection{
		Enabled: true, Namespace: podNamespace(), Name: "nave-spoke",
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
	}
}

func podNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "nave-system"
}

// lead runs term whenever this replica holds the Lease, as identity, until
// ctx ends. A term gets a context that ends when leadership does, and
// before a standby can take over: if the Lease cannot be renewed, the term
// ends RenewDeadline after the last successful renewal (a standby waits
// LeaseDuration), whatever client-go is still trying. When ctx ends, the
// term ends first and the Lease is released after, so the next leader
// starts only once this one has stopped. Terms never overlap.
func lead(ctx context.Context, client kubernetes.Interface, cfg LeaderElection, identity string, log *slog.Logger, term func(context.Context)) error {
	return leadOrGiveUp(ctx, client, cfg, identity, log, func(ctx context.Context) error {
		term(ctx)
		return nil
	})
}

// errHubUnreachable ends a term that could not reach the hub: its leader
// gives up the Lease (see leadOrGiveUp).
var errHubUnreachable = errors.New("spoke: the hub is unreachable")

// leadOrGiveUp is lead whose terms may give up: a term that returns an
// error wrapping errHubUnreachable (after it ended its own work) releases
// the Lease at once, so a standby, on another node and maybe another
// network path, takes it within RetryPeriod; this replica stays out of the
// election for StandBack before it is a candidate again. A standby that
// cannot reach the hub either gives it up in turn; a lone candidate takes
// it back after StandBack and tries again.
func leadOrGiveUp(ctx context.Context, client kubernetes.Interface, cfg LeaderElection, identity string, log *slog.Logger, term func(context.Context) error) error {
	log = log.With("component", "leader-election", "lease", cfg.Namespace+"/"+cfg.Name, "identity", identity)
	standBack := cmp.Or(cfg.StandBack, cfg.LeaseDuration)
	for ctx.Err() == nil {
		lock := &renewalLock{Interface: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
		}}
		// The elector outlives ctx until the term has ended, so that it releases the Lease last.
		electorCtx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
		var terms sync.Mutex // held while a term runs; abandoned is set once no term may start
		abandoned := false
		var gaveUp error // why the term gave up the Lease; guarded by terms
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:          lock,
			LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
			// A replica that stops cleanly hands over at once instead of after LeaseDuration.
			ReleaseOnCancel: true,
			Name:            cfg.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(leading context.Context) {
					terms.Lock()
					defer terms.Unlock()
					if abandoned {
						return
					}
					tctx, end := context.WithCancel(ctx)
					defer end()
					defer context.AfterFunc(leading, end)()
					go lock.fence(tctx, cfg.RenewDeadline, cfg.RetryPeriod/2, func() {
						log.Warn("lease not renewed in time; stopping before a standby takes over", "renewDeadline", cfg.RenewDeadline)
						end()
					})
					log.Info("leading: streaming this cluster to the hub")
					if err := term(tctx); errors.Is(err, errHubUnreachable) && ctx.Err() == nil {
						// The term has ended; releasing the Lease comes after (ReleaseOnCancel).
						gaveUp = err
						log.Warn("giving up the Lease: this replica cannot reach the hub; a standby may take over",
							"err", err, "standBack", standBack)
						stopElector()
					}
				},
				OnStoppedLeading: func() { log.Info("not leading") },
				OnNewLeader: func(id string) {
					if id != identity {
						log.Info("standing by", "leader", id)
					}
				},
			},
		})
		if err != nil {
			stopElector()
			return fmt.Errorf("leader election: %w", err)
		}
		// When ctx ends: the term (which ends with ctx) first, then the elector.
		stopWatching := context.AfterFunc(ctx, func() {
			terms.Lock()
			abandoned = true
			terms.Unlock()
			stopElector()
		})
		elector.Run(electorCtx) // returns when leadership ends (or the elector is stopped)
		stopWatching()
		stopElector()
		terms.Lock() // a term that is running ends with its leadership; none starts after this
		abandoned = true
		standingBack := gaveUp != nil
		terms.Unlock()
		if standingBack {
			select {
			case <-ctx.Done():
			case <-time.After(standBack):
				log.Info("a candidate for the Lease again after giving it up", "stoodBack", standBack)
			}
		}
	}
	return nil
}

// hubFailures counts a term's hub sessions in a row that failed (the
// connection, the hello or the stream broke before the hub acknowledged
// the spoke's state), for Config.GiveUpAfter. Owned by the publisher's
// goroutine (its status callback).
type hubFailures struct {
	limit  int
	failed int
	synced bool // the current session has been acknowledged
}

// observe takes the publisher's status; it returns an error wrapping
// errHubUnreachable once limit sessions in a row have failed.
func (f *hubFailures) observe(s federation.SessionStatus) error {
	switch {
	case s.Connected && s.Synced:
		f.synced, f.failed = true, 0
	case !s.Connected: // a session (or an attempt at one) ended
		if !f.synced {
			f.failed++
		}
		f.synced = false
		if f.limit > 0 && f.failed >= f.limit {
			return fmt.Errorf("%w: %d sessions in a row failed", errHubUnreachable, f.failed)
		}
	}
	return nil
}

// renewalLock is a Lease lock that remembers when this replica last
// renewed it successfully (when the request was sent, to be safe).
type renewalLock struct {
	resourcelock.Interface
	renewed atomic.Int64 // unix nanoseconds
}

func (l *renewalLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.record(r, func() error { return l.Interface.Create(ctx, r) })
}

func (l *renewalLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.record(r, func() error { return l.Interface.Update(ctx, r) })
}

func (l *renewalLock) record(r resourcelock.LeaderElectionRecord, write func() error) error {
	sent := time.Now()
	err := write()
	if err == nil && r.HolderIdentity == l.Identity() {
		l.renewed.Store(sent.UnixNano())
	}
	return err
}

// fence calls expired once the last renewal is older than deadline, checking every tick, until ctx ends.
func (l *renewalLock) fence(ctx context.Context, deadline, tick time.Duration, expired func()) {
	t := time.NewTicker(max(tick, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if time.Since(time.Unix(0, l.renewed.Load())) > deadline {
				expired()
				return
			}
		}
	}
}

// latestState holds the newest complete state a source produced, for
// whichever publisher currently streams.
type latestState struct {
	mu      sync.Mutex
	state   State
	has     bool
	changed chan struct{} // closed by the next set
}

func newLatestState() *latestState { return &latestState{changed: make(chan struct{})} }

// set stores st (the source's publish callback).
func (l *latestState) set(st State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state, l.has = st, true
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *latestState) get() (State, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state, l.has, l.changed
}

// feed sends the newest state to out, and each newer one, until ctx ends. A
// state not yet taken when a newer one arrives is never sent.
func (l *latestState) feed(ctx context.Context, out chan<- State) {
	for {
		st, has, changed := l.get()
		var send chan<- State
		if has {
			send = out
		}
		select {
		case send <- st:
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}
