package federation

import (
	"sync"
	"time"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// maxOriginAge is how long a change the spoke saw stays attributable: a
// change reaches the publisher within milliseconds, so an older record is
// of a change that altered nothing the hub is sent, and a later update of
// the service (a resync) must not inherit it.
const maxOriginAge = 30 * time.Second

// Origin is where a change of one service began, as its source saw it.
type Origin struct {
	// ResourceVersion is the Kubernetes object's resourceVersion ("": none).
	ResourceVersion string
	// ChangedAt is when the source says the change happened, on this
	// machine's clock (zero: the source does not say).
	ChangedAt time.Time
	// SeenAt is when the spoke saw it.
	SeenAt time.Time
}

// Origins records, per service, the last change a source saw, for the
// publisher to send with the update that carries it (see
// fedv1.ChangeOrigin). Safe for concurrent use; a nil *Origins records
// nothing.
type Origins struct {
	now func() time.Time

	// byServiceMu guards byService.
	byServiceMu sync.Mutex
	byService   map[registry.ServiceKey]Origin
}

// NewOrigins returns an empty record.
func NewOrigins() *Origins {
	return &Origins{now: time.Now, byService: map[registry.ServiceKey]Origin{}}
}

// Saw records that the spoke saw a change of a service now: of the object
// at resourceVersion, made at changedAt (zero: unknown).
func (o *Origins) Saw(key registry.ServiceKey, resourceVersion string, changedAt time.Time) {
	if o == nil {
		return
	}
	now := o.now()
	o.byServiceMu.Lock()
	defer o.byServiceMu.Unlock()
	o.byService[key] = Origin{ResourceVersion: resourceVersion, ChangedAt: changedAt, SeenAt: now}
	if len(o.byService) > 4096 { // a burst the publisher has not caught up with: drop what is too old
		for k, v := range o.byService {
			if now.Sub(v.SeenAt) > maxOriginAge {
				delete(o.byService, k)
			}
		}
	}
}

// take returns, as sent now, the origins of the services keys names that
// the spoke saw change within maxOriginAge, and forgets them.
func (o *Origins) take(keys []registry.ServiceKey) []*fedv1.ChangeOrigin {
	if o == nil || len(keys) == 0 {
		return nil
	}
	now := o.now()
	o.byServiceMu.Lock()
	defer o.byServiceMu.Unlock()
	var out []*fedv1.ChangeOrigin
	for _, k := range keys {
		v, ok := o.byService[k]
		if !ok {
			continue
		}
		delete(o.byService, k)
		spoke := now.Sub(v.SeenAt)
		if spoke < 0 || spoke > maxOriginAge {
			continue
		}
		co := &fedv1.ChangeOrigin{Service: KeyToProto(k), ResourceVersion: v.ResourceVersion, SpokeNanos: int64(spoke)}
		if src := v.SeenAt.Sub(v.ChangedAt); !v.ChangedAt.IsZero() && src >= 0 && src <= maxOriginAge {
			co.SourceNanos = int64(src)
		}
		out = append(out, co)
	}
	return out
}

// ReceivedOrigin is a ChangeOrigin as the hub takes it: checked, its
// durations within (0, maxOriginAge] or else 0 (unknown).
type ReceivedOrigin struct {
	Service         registry.ServiceKey
	ResourceVersion string
	Source, Spoke   time.Duration
}

// receivedOrigins checks what an update says of its origins, leaving out
// those of invalid services and at most one per service (the first).
func receivedOrigins(in []*fedv1.ChangeOrigin) []ReceivedOrigin {
	out := make([]ReceivedOrigin, 0, len(in))
	seen := make(map[registry.ServiceKey]bool, len(in))
	for _, p := range in {
		key := KeyFromProto(p.GetService())
		if registry.ValidateServiceKey(key) != nil || seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, ReceivedOrigin{Service: key, ResourceVersion: truncateTo(p.GetResourceVersion(), 64),
			Source: bounded(p.GetSourceNanos()), Spoke: bounded(p.GetSpokeNanos())})
	}
	return out
}

// bounded is a duration a peer sent, or 0 (unknown) when it is not
// within (0, maxOriginAge].
func bounded(nanos int64) time.Duration {
	d := time.Duration(nanos)
	if d <= 0 || d > maxOriginAge {
		return 0
	}
	return d
}

// BoundedLink is Update.link_nanos checked as bounded checks durations.
func BoundedLink(nanos int64) time.Duration { return bounded(nanos) }

func truncateTo(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
