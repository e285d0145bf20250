package spoke

import (
	"context"
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
)

// LeaderElection configures the coordination.k8s.io Lease through which one
// of several spoke replicas of a cluster (a DaemonSet) is the one that
// streams to the hub; the others keep their caches warm and take over when
// the leader's lease runs out (or at once, when it stops cleanly and
// releases the lease).
type LeaderElection struct {
	Enabled bool
	// Namespace and Name name the Lease.
	Namespace, Name string
	// LeaseDuration is how long a standby waits after the leader's last
	// renewal before it takes over; RenewDeadline is how long the leader
	// keeps trying to renew before it stops streaming (shorter than
	// LeaseDuration, so a leader stops before a standby starts); RetryPeriod
	// is how often both try.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
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
// ctx ends. Each term gets a context that ends when leadership does; lead
// waits for a term to return before it competes again, so two terms never
// overlap. (client-go starts a term on its own goroutine: one that has not
// begun when leadership ends begins with its context already ended, and
// so can send nothing.)
func lead(ctx context.Context, client kubernetes.Interface, cfg LeaderElection, identity string, log *slog.Logger, term func(context.Context)) error {
	log = log.With("component", "leader-election", "lease", cfg.Namespace+"/"+cfg.Name, "identity", identity)
	for ctx.Err() == nil {
		var begun atomic.Bool
		ended := make(chan struct{}, 1)
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
				Client:     client.CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
			},
			LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
			// A replica that stops cleanly hands over at once instead of after LeaseDuration.
			ReleaseOnCancel: true,
			Name:            cfg.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(tctx context.Context) {
					begun.Store(true)
					defer func() { ended <- struct{}{} }()
					log.Info("leading: streaming this cluster to the hub")
					term(tctx)
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
			return fmt.Errorf("leader election: %w", err)
		}
		elector.Run(ctx) // returns when leadership ends (or ctx does)
		if begun.Load() {
			<-ended
		}
	}
	return nil
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
