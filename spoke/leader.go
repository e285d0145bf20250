package spoke

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/lease"
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
	// LeaseDuration, so a leader stops before a standby starts); RetryPeriod
	// is how often both try (shorter than RenewDeadline).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// StandBack is how long a leader that gave up the Lease (it could not
	// reach the hub, see Config.GiveUpAfter) stays out of the election, so
	// that a standby takes it; then it is a candidate again. 0: LeaseDuration.
	StandBack time.Duration
}

// DefaultLeaderElection returns the Lease settings `nave spoke --source kube`
// starts with: Lease nave-spoke in the pod's namespace (POD_NAMESPACE, else
// the service account's namespace, else nave-system), and the lease
// package's timing (client-go's usual 15s/10s/2s).
func DefaultLeaderElection() LeaderElection {
	d := lease.DefaultConfig()
	return LeaderElection{
		Enabled: true, Namespace: podNamespace(), Name: "nave-spoke",
		LeaseDuration: d.LeaseDuration, RenewDeadline: d.RenewDeadline, RetryPeriod: d.RetryPeriod,
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

// errHubUnreachable ends a term that could not reach the hub: its leader
// gives up the Lease (see leadOrGiveUp).
var errHubUnreachable = errors.New("spoke: the hub is unreachable")

// leadOrGiveUp runs term whenever this replica holds the Lease, as
// identity, until ctx ends. A term gets a context that ends when leadership
// does, and before a standby can take over: if the Lease cannot be renewed,
// the term ends RenewDeadline after the last successful renewal (a standby
// waits LeaseDuration). The Lease is released only once the term has
// ended, so the next leader starts only once this one has stopped. Terms
// never overlap.
//
// A term may give up: one that returns an error wrapping errHubUnreachable
// (after it ended its own work) releases the Lease at once, so a standby,
// on another node and maybe another network path, takes it within
// RetryPeriod; this replica stays out of the election for StandBack before
// it is a candidate again. A standby that cannot reach the hub gives it up
// in turn; a lone candidate takes it back after StandBack and tries again.
//
// A term that panics ends its leadership; once the Lease is released,
// leadOrGiveUp returns an error (the process stops, as it would have
// without the election).
func leadOrGiveUp(ctx context.Context, client *kubeclient.Client, cfg LeaderElection, identity string, log *slog.Logger, term func(context.Context) error) error {
	// The lease package names its component, the Lease and identity itself.
	lc := lease.Config{Name: cfg.Name, Identity: identity, Log: log.With("namespace", cfg.Namespace),
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod}
	log = log.With("component", "leader-election", "lease", cfg.Namespace+"/"+cfg.Name, "identity", identity)
	standBack := cmp.Or(cfg.StandBack, cfg.LeaseDuration)
	for ctx.Err() == nil {
		var gaveUp, panicked error // set by the term, read once lease.Run (which waits for it) returned
		err := lease.Run(ctx, client.Leases(cfg.Namespace), lc, lease.Callbacks{
			Leading: func(leading context.Context) {
				log.Info("leading: streaming this cluster to the hub")
				defer func() {
					if r := recover(); r != nil {
						panicked = fmt.Errorf("leader election: the term panicked: %v", r)
						log.Error("the term panicked; releasing the Lease and stopping", "panic", r, "stack", string(debug.Stack()))
					}
				}()
				if err := term(leading); errors.Is(err, errHubUnreachable) && ctx.Err() == nil {
					gaveUp = err
					log.Warn("giving up the Lease: this replica cannot reach the hub; a standby may take over",
						"err", err, "standBack", standBack)
				}
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		if panicked != nil {
			return panicked
		}
		if gaveUp != nil {
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
