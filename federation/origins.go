package federation

import (
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

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

	// byServiceMu guards byService and swept.
	byServiceMu sync.Mutex
	byService   map[registry.ServiceKey]Origin
	// swept is how many records were left by the last sweep of old ones.
	swept int
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
	// Records of changes that altered nothing sent are never taken: drop the
	// old ones whenever the record has doubled since the last sweep (so a
	// burst costs each Saw a constant share of the sweeps).
	if len(o.byService) > max(4096, 2*o.swept) {
		for k, v := range o.byService {
			if now.Sub(v.SeenAt) > maxOriginAge {
				delete(o.byService, k)
			}
		}
		o.swept = len(o.byService)
	}
}

// clear forgets every record.
func (o *Origins) clear() {
	if o == nil {
		return
	}
	o.byServiceMu.Lock()
	defer o.byServiceMu.Unlock()
	clear(o.byService)
	o.swept = 0
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

// receivedOrigins checks what an update says of its origins: only those
// of services the update upserts or removes count, at most one each (the
// first).
func receivedOrigins(u *fedv1.Update) []ReceivedOrigin {
	changed := make(map[registry.ServiceKey]bool, len(u.GetUpserts())+len(u.GetRemoves()))
	for _, sh := range u.GetUpserts() {
		changed[KeyFromProto(sh.GetService())] = true
	}
	for _, k := range u.GetRemoves() {
		changed[KeyFromProto(k)] = true
	}
	out := make([]ReceivedOrigin, 0, min(len(u.GetOrigins()), len(changed)))
	for _, p := range u.GetOrigins() {
		key := KeyFromProto(p.GetService())
		if !changed[key] {
			continue
		}
		changed[key] = false // one origin per service
		out = append(out, ReceivedOrigin{Service: key, ResourceVersion: printable(p.GetResourceVersion(), 64),
			Source: bounded(p.GetSourceNanos()), Spoke: bounded(p.GetSpokeNanos())})
	}
	return out
}

// printable is s cut to at most n bytes of printable runes (a
// resourceVersion is digits; anything else a peer sends is shown as ?).
func printable(s string, n int) string {
	out := make([]rune, 0, min(len(s), n))
	size := 0
	for _, r := range s {
		if !unicode.IsPrint(r) {
			r = '?'
		}
		if size+utf8.RuneLen(r) > n {
			break
		}
		size += utf8.RuneLen(r)
		out = append(out, r)
	}
	return string(out)
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
