// Package convergence traces each change of a service from the moment a
// hub replica receives it to the moment each xDS client acknowledges it,
// every stage on the replica's own clock.
//
// A change is traced when the replica applies it (Received). When the xDS
// server has translated it (Translated), it names the resources a client
// must be sent to hold it: the service's endpoints (EDS) when they
// changed, else its clusters, routes or listeners. A response that carries
// one of them, sent after the translation, is the change's push to that
// client (Pushed); the client's ACK of that response is its convergence
// (Answered). Each ACK observes the stages' histograms:
//   - hub_apply_to_push: received -> pushed;
//   - push_to_ack: pushed -> acknowledged;
//   - hub_to_ack: received -> acknowledged;
//   - end_to_end: source + spoke + spoke_to_hub + hub_to_ack, for a change
//     whose spoke said where it began.
//
// A spoke says, with each update, where the changes it carries began
// (Origins, before the update is applied): how long its source took to
// show it the change (source: only a directory source knows when a file
// changed), how long it took to send it (spoke), and its estimate of the
// one-way delay to the hub (spoke_to_hub: half its round trip less the
// hub's time, see fedv1.Update.link_nanos). Those are observed as they
// arrive. Every stage is a duration measured on one clock, so clock skew
// between machines cannot make a figure negative or absurd. A replica's
// copy of a change carries no origin (replication does not forward it).
//
// Memory is bounded: at most Config.MaxTraces changes are kept (the oldest
// go first), each with its Config.SlowestClients slowest clients, and a
// change stops collecting pushes after Config.Window.
package convergence

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/xdstype"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/syncstatus"
)

// MetricConvergence is the histogram of each stage's duration, by stage
// and origin cluster.
const MetricConvergence = "nave_convergence_seconds"

// Stages of a change, as MetricConvergence labels them.
const (
	StageSource      = "source"
	StageSpoke       = "spoke"
	StageSpokeToHub  = "spoke_to_hub"
	StageApplyToPush = "hub_apply_to_push"
	StagePushToAck   = "push_to_ack"
	StageHubToAck    = "hub_to_ack"
	StageEndToEnd    = "end_to_end"
)

// Config bounds what a Tracer keeps.
type Config struct {
	// Replica names the replica in the traces it shows.
	Replica string
	// MaxTraces is how many changes are kept (the newest).
	MaxTraces int
	// SlowestClients is how many clients each change keeps (the slowest).
	SlowestClients int
	// Window is how long after its translation a change collects pushes.
	Window time.Duration
}

// DefaultConfig keeps 1,024 changes, the 5 slowest clients of each, and
// collects pushes for a minute.
func DefaultConfig() Config {
	return Config{MaxTraces: 1024, SlowestClients: 5, Window: time.Minute}
}

// A trace, its origin and a client's times are the admin API's JSON, the
// same types (adminapi), so that the hub serves them without converting them.
type (
	// Trace is one change as a replica saw it through.
	Trace = adminapi.Trace
	// Origin is where a change began, in milliseconds each measured on one
	// clock (0: unknown).
	Origin = adminapi.Origin
	// ClientTime is how long one client took to hold a change.
	ClientTime = adminapi.ClientTime
)

// originTotal is the origin's part of a change's end-to-end time.
func originTotal(o *Origin) time.Duration {
	return time.Duration((o.Source + o.Spoke + o.SpokeToHub) * float64(time.Millisecond))
}

// Tracer traces changes; its methods are safe for concurrent use and never
// block beyond a short lock.
type Tracer struct {
	cfg     Config
	now     func() time.Time
	seconds *prometheus.HistogramVec

	// open counts the changes collecting pushes: Pushed returns at once
	// when there are none, without taking the lock.
	open atomic.Int64

	// tracesMu guards the fields below.
	tracesMu sync.Mutex
	nextID   uint64
	// nextExpiry is when the earliest collecting change's window ends.
	nextExpiry time.Time
	// traces are the kept changes, oldest first.
	traces []*trace
	// untranslated holds, by service, changes the xDS server has not translated yet.
	untranslated map[registry.ServiceKey][]*trace
	// byResource holds, by type URL and resource name, the changes collecting pushes of it.
	byResource map[string]map[string][]*trace
	// inFlight holds, by stream and type URL, the traced changes its last response carried.
	inFlight map[syncstatus.Stream]map[string]flight
	// origins holds, by cluster and service, the origin of a change not applied yet.
	origins map[registry.ClusterID]map[registry.ServiceKey]pendingOrigin
}

type pendingOrigin struct {
	Origin
	at time.Time
}

type trace struct {
	Trace
	typeURL string
	// originAt is when the update that carried the change's origin arrived.
	originAt time.Time
	// version is the registry version that holds the change.
	version uint64
	// published holds, by cache version prefix, the version of that cache
	// that first holds the change: a response of an older version does not
	// carry it.
	published map[string]uint64
	until     time.Time // collects pushes until then
}

// maxInFlight bounds the changes one stream's unanswered response carries.
const maxInFlight = 256

type flight struct {
	nonce   string
	node    string
	carried []carried
}

// carried is a change a response carried, and when it was first pushed.
type carried struct {
	tr *trace
	at time.Time
}

// New returns a tracer whose histograms are registered on reg (nil: not registered).
func New(cfg Config, reg prometheus.Registerer) *Tracer {
	def := DefaultConfig()
	cfg.MaxTraces = cmp.Or(max(cfg.MaxTraces, 0), def.MaxTraces)
	cfg.SlowestClients = cmp.Or(max(cfg.SlowestClients, 0), def.SlowestClients)
	cfg.Window = cmp.Or(max(cfg.Window, 0), def.Window)
	t := &Tracer{cfg: cfg, now: time.Now,
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricConvergence,
			Help:    "How long each stage of a change took, each on one clock: source (the source's change -> the spoke saw it), spoke (saw -> sent), spoke_to_hub (one-way estimate), hub_apply_to_push (applied -> pushed to a client), push_to_ack (pushed -> the client's ACK), hub_to_ack (applied -> ACK), end_to_end (their sum); by origin cluster.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"stage", "cluster"}),
		untranslated: map[registry.ServiceKey][]*trace{},
		byResource:   map[string]map[string][]*trace{},
		inFlight:     map[syncstatus.Stream]map[string]flight{},
		origins:      map[registry.ClusterID]map[registry.ServiceKey]pendingOrigin{},
	}
	if reg != nil {
		reg.MustRegister(t.seconds)
	}
	return t
}

// SpokeOrigin is where a spoke says the change of one service began.
type SpokeOrigin struct {
	Service         registry.ServiceKey
	ResourceVersion string
	// Source and Spoke are the stages on the spoke's clock (0: unknown).
	Source, Spoke time.Duration
}

// Origins records where the changes of an update from cluster's spoke
// began, before the update is applied (link: the spoke's estimate of its
// delay to the hub, 0 unknown), and observes those stages. An origin whose
// change is not applied within maxPendingOrigin is dropped.
func (t *Tracer) Origins(cluster registry.ClusterID, link time.Duration, origins []SpokeOrigin) {
	now := t.now()
	c := string(cluster)
	if link > 0 {
		t.seconds.WithLabelValues(StageSpokeToHub, c).Observe(link.Seconds())
	}
	source, spoke := t.seconds.WithLabelValues(StageSource, c), t.seconds.WithLabelValues(StageSpoke, c)
	for _, o := range origins {
		if o.Source > 0 {
			source.Observe(o.Source.Seconds())
		}
		if o.Spoke > 0 {
			spoke.Observe(o.Spoke.Seconds())
		}
	}
	t.tracesMu.Lock()
	defer t.tracesMu.Unlock()
	byService := t.origins[cluster]
	if byService == nil {
		byService = map[registry.ServiceKey]pendingOrigin{}
		t.origins[cluster] = byService
	}
	for k, o := range byService {
		if now.Sub(o.at) > maxPendingOrigin {
			delete(byService, k)
		}
	}
	for _, o := range origins {
		if _, replaces := byService[o.Service]; !replaces && len(byService) >= t.cfg.MaxTraces {
			continue
		}
		byService[o.Service] = pendingOrigin{at: now, Origin: Origin{ResourceVersion: o.ResourceVersion, Source: ms(o.Source), Spoke: ms(o.Spoke), SpokeToHub: ms(link)}}
	}
}

// maxPendingOrigin is how long an origin waits for the change it came
// with to be applied: an apply takes milliseconds; one that failed (a
// refused update, a superseded session) must leave nothing for a later
// change of the service to inherit.
const maxPendingOrigin = 5 * time.Second

// Received records that the replica applied a change of cluster's
// services, making registry version, at its clock's now. fromSpoke says
// the change came from the cluster's spoke (not a replica's copy): then
// the origins its update carried are the change's.
func (t *Tracer) Received(cluster registry.ClusterID, services []registry.ServiceKey, version uint64, fromSpoke bool) {
	now := t.now()
	t.tracesMu.Lock()
	defer t.tracesMu.Unlock()
	pending := t.origins[cluster]
	if !fromSpoke {
		pending = nil
	}
	for _, key := range services {
		t.nextID++
		tr := &trace{Trace: Trace{ID: t.nextID, Replica: t.cfg.Replica, Cluster: cluster, Service: key, Received: now}, version: version}
		if o, ok := pending[key]; ok {
			delete(pending, key)
			if now.Sub(o.at) <= maxPendingOrigin {
				tr.Origin, tr.originAt = &o.Origin, o.at
			}
		}
		t.traces = append(t.traces, tr)
		t.untranslated[key] = append(t.untranslated[key], tr)
	}
	t.evictLocked()
}

// evictLocked drops the oldest changes beyond MaxTraces.
func (t *Tracer) evictLocked() {
	for len(t.traces) > t.cfg.MaxTraces {
		old := t.traces[0]
		t.traces[0] = nil
		t.traces = t.traces[1:]
		t.forgetLocked(old)
	}
}

// forgetLocked stops a change from collecting pushes.
func (t *Tracer) forgetLocked(tr *trace) {
	if list := t.untranslated[tr.Service]; len(list) > 0 {
		if list = slices.DeleteFunc(list, func(x *trace) bool { return x == tr }); len(list) == 0 {
			delete(t.untranslated, tr.Service)
		} else {
			t.untranslated[tr.Service] = list
		}
	}
	if tr.typeURL == "" || tr.until.IsZero() {
		return
	}
	tr.until = time.Time{}
	t.open.Add(-1)
	byName := t.byResource[tr.typeURL]
	for _, name := range tr.Resources {
		list := slices.DeleteFunc(byName[name], func(x *trace) bool { return x == tr })
		if len(list) == 0 {
			delete(byName, name)
		} else {
			byName[name] = list
		}
	}
	if len(byName) == 0 {
		delete(t.byResource, tr.typeURL)
	}
}

// Tracing says whether a change of key awaits translation.
func (t *Tracer) Tracing(key registry.ServiceKey) bool {
	t.tracesMu.Lock()
	defer t.tracesMu.Unlock()
	return len(t.untranslated[key]) > 0
}

// Translated records that the xDS server is about to publish registry
// version upTo: the changes of key it holds (received at that version or
// before) are held by a client once it acknowledges a response of typeURL
// carrying one of resources, of a cache version at or above published's
// for that cache's prefix. An empty typeURL says they changed nothing a
// client is sent.
func (t *Tracer) Translated(key registry.ServiceKey, upTo uint64, typeURL string, resources []string, published map[string]uint64) {
	now := t.now()
	t.tracesMu.Lock()
	defer t.tracesMu.Unlock()
	var list, later []*trace
	for _, tr := range t.untranslated[key] {
		if tr.version <= upTo {
			list = append(list, tr)
		} else {
			later = append(later, tr) // received after this registry was taken: the next Update's
		}
	}
	if len(later) == 0 {
		delete(t.untranslated, key)
	} else {
		t.untranslated[key] = later
	}
	t.expireLocked(now)
	if typeURL != "" && len(resources) > 0 {
		t.supersedeLocked(typeURL, resources) // changes translated before: pushes from now on carry these too
	}
	for _, tr := range list {
		at := now
		tr.Translated = &at
		if typeURL == "" || len(resources) == 0 {
			tr.NoChange = true
			continue
		}
		tr.typeURL, tr.Type, tr.Resources, tr.published, tr.until = typeURL, xdstype.Label(typeURL), resources, published, now.Add(t.cfg.Window)
		if t.nextExpiry.IsZero() || tr.until.Before(t.nextExpiry) {
			t.nextExpiry = tr.until
		}
		t.open.Add(1)
		byName := t.byResource[typeURL]
		if byName == nil {
			byName = map[string][]*trace{}
			t.byResource[typeURL] = byName
		}
		for _, name := range resources {
			byName[name] = append(byName[name], tr)
		}
	}
}

// supersedeLocked stops the changes collecting pushes of resources: a
// push from now on carries a newer change of them (so that no client is
// counted twice for a change without a set of clients per change).
func (t *Tracer) supersedeLocked(typeURL string, resources []string) {
	var old []*trace
	for _, name := range resources {
		for _, tr := range t.byResource[typeURL][name] {
			if !slices.Contains(old, tr) {
				old = append(old, tr)
			}
		}
	}
	for _, tr := range old {
		t.forgetLocked(tr)
	}
}

// expireLocked stops changes past their window from collecting pushes.
func (t *Tracer) expireLocked(now time.Time) {
	if t.nextExpiry.IsZero() || now.Before(t.nextExpiry) {
		return
	}
	t.nextExpiry = time.Time{}
	for _, tr := range t.traces {
		switch {
		case tr.until.IsZero():
		case now.After(tr.until):
			t.forgetLocked(tr)
		case t.nextExpiry.IsZero() || tr.until.Before(t.nextExpiry):
			t.nextExpiry = tr.until
		}
	}
}

// Collecting says whether any change collects pushes (Pushed has work).
func (t *Tracer) Collecting() bool { return t.open.Load() > 0 }

// Pushed records a response of typeURL with nonce and version, carrying
// resources named names, about to be sent to a stream of node; before is
// what the stream's sync status said before it. A response counts as the
// push of a change when its cache version holds the change, the stream
// had acknowledged an earlier version of that cache (it did not hold the
// change yet), and the stream did not change its subscription since the
// change was translated (then the response may be a fetch of a new name).
func (t *Tracer) Pushed(s syncstatus.Stream, node, typeURL, nonce, version string, names []string, before syncstatus.Sent) {
	if !t.Collecting() {
		return
	}
	prefix, n, ok := splitVersion(version)
	if !ok {
		return
	}
	now := t.now()
	t.tracesMu.Lock()
	defer t.tracesMu.Unlock()
	t.expireLocked(now)
	heldPrefix, held, heldOK := splitVersion(before.Acked)
	byName := t.byResource[typeURL]
	var news []carried
	for _, name := range names {
		for _, tr := range byName[name] {
			first, ok := tr.published[prefix]
			switch {
			case !ok || n < first || !now.Before(tr.until):
			case !heldOK || heldPrefix != prefix || held >= first: // it held the change already, or another cache's state
			case tr.Translated != nil && !before.SubscribedAt.Before(*tr.Translated):
			case slices.ContainsFunc(news, func(c carried) bool { return c.tr == tr }):
			default:
				news = append(news, carried{tr: tr, at: now})
			}
		}
	}
	for _, c := range news {
		c.tr.Pushed++
	}
	flights := t.inFlight[s]
	prev, unanswered := flights[typeURL]
	if len(news) == 0 && !unanswered {
		return
	}
	if flights == nil {
		flights = map[string]flight{}
		t.inFlight[s] = flights
	}
	// Changes of an unanswered earlier response are carried on: the client
	// holds them once it acknowledges this one (as long as they are kept).
	for _, c := range prev.carried {
		if len(news) < maxInFlight && !c.tr.until.IsZero() && !slices.ContainsFunc(news, func(x carried) bool { return x.tr == c.tr }) {
			news = append(news, c)
		}
	}
	flights[typeURL] = flight{nonce: nonce, node: node, carried: news}
}

// splitVersion splits a cache version into its prefix and counter.
func splitVersion(v string) (prefix string, n uint64, ok bool) {
	i := len(v)
	for i > 0 && v[i-1] >= '0' && v[i-1] <= '9' {
		i--
	}
	if i == len(v) {
		return "", 0, false
	}
	n, err := strconv.ParseUint(v[i:], 10, 64)
	return v[:i], n, err == nil
}

// Answered records a stream's ACK (ok) or NACK of the response of typeURL with nonce.
func (t *Tracer) Answered(s syncstatus.Stream, typeURL, nonce string, ok bool) {
	now := t.now()
	t.tracesMu.Lock()
	defer t.tracesMu.Unlock()
	f, found := t.inFlight[s][typeURL]
	if !found || f.nonce != nonce {
		return
	}
	delete(t.inFlight[s], typeURL)
	for _, c := range f.carried {
		tr, at := c.tr, c.at
		if !ok {
			tr.Nacked++
			continue
		}
		tr.Acked++
		acked := now
		tr.LastAck = &acked
		ct := ClientTime{NodeID: f.node, Stream: s, ApplyToPush: ms(at.Sub(tr.Received)), PushToAck: ms(now.Sub(at)), HubToAck: ms(now.Sub(tr.Received))}
		cluster := string(tr.Cluster)
		t.seconds.WithLabelValues(StageApplyToPush, cluster).Observe(at.Sub(tr.Received).Seconds())
		t.seconds.WithLabelValues(StagePushToAck, cluster).Observe(now.Sub(at).Seconds())
		t.seconds.WithLabelValues(StageHubToAck, cluster).Observe(now.Sub(tr.Received).Seconds())
		if tr.Origin != nil {
			e2e := originTotal(tr.Origin) + now.Sub(tr.originAt) // from the update's arrival: its apply counts too
			ct.EndToEnd = ms(e2e)
			t.seconds.WithLabelValues(StageEndToEnd, cluster).Observe(e2e.Seconds())
		}
		tr.keepSlowest(ct, t.cfg.SlowestClients)
	}
}

func (tr *trace) keepSlowest(ct ClientTime, n int) {
	i, _ := slices.BinarySearchFunc(tr.Slowest, ct.HubToAck, func(c ClientTime, v float64) int { return cmp.Compare(v, c.HubToAck) })
	if i >= n {
		return
	}
	tr.Slowest = slices.Insert(tr.Slowest, i, ct)
	if len(tr.Slowest) > n {
		tr.Slowest = tr.Slowest[:n]
	}
}

// Closed forgets a stream.
func (t *Tracer) Closed(s syncstatus.Stream) {
	t.tracesMu.Lock()
	defer t.tracesMu.Unlock()
	delete(t.inFlight, s)
}

// Traces returns the kept changes of service (all, if it is the zero key),
// newest first, at most limit (0: all).
func (t *Tracer) Traces(service registry.ServiceKey, limit int) []Trace {
	t.tracesMu.Lock()
	defer t.tracesMu.Unlock()
	var out []Trace
	for i := len(t.traces) - 1; i >= 0 && (limit == 0 || len(out) < limit); i-- {
		tr := t.traces[i]
		if service != (registry.ServiceKey{}) && tr.Service != service {
			continue
		}
		c := tr.Trace
		c.Slowest = slices.Clone(c.Slowest)
		out = append(out, c)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
