package convergence

import (
	"strconv"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/syncstatus"
)

var (
	api = registry.ServiceKey{Namespace: "default", Name: "api"}
	web = registry.ServiceKey{Namespace: "default", Name: "web"}
	eds = resource.EndpointType
	cds = resource.ClusterType
)

type clock struct{ now time.Time }

func (c *clock) advance(ms int) { c.now = c.now.Add(time.Duration(ms) * time.Millisecond) }

func newTracer(cfg Config) (*Tracer, *clock, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	t := New(cfg, reg)
	c := &clock{now: time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)}
	t.now = func() time.Time { return c.now }
	return t, c, reg
}

func stream(id int64) syncstatus.Stream { return syncstatus.Stream{ID: id} }

// holding is a stream that acknowledged version v of cache "eds-" and
// subscribed long ago.
func holding(v string) syncstatus.Sent {
	return syncstatus.Sent{Acked: v, SubscribedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// translate translates api's change at registry version 1, published in cache "eds-" at version 5.
func translate(tr *Tracer, key registry.ServiceKey, upTo uint64, names ...string) {
	tr.Translated(key, upTo, eds, names, map[string]uint64{"eds-": 5})
}

func TestTraceStagesAndSlowestClients(t *testing.T) {
	tr, c, reg := newTracer(Config{Replica: "a", SlowestClients: 2})
	tr.Origins("east", 3*time.Millisecond, []SpokeOrigin{{Service: api, ResourceVersion: "42", Source: 0, Spoke: 2 * time.Millisecond}})
	tr.Received("east", []registry.ServiceKey{api}, 1, true)
	if !tr.Tracing(api) || tr.Tracing(web) || tr.Collecting() {
		t.Fatal("a received change of api: api awaits translation, nothing collects pushes yet")
	}
	c.advance(2)
	translate(tr, api, 1, "cla-api")
	if tr.Tracing(api) || !tr.Collecting() {
		t.Fatal("after translation api's change collects pushes")
	}
	// Three clients, pushed at +3, +4 and +5 ms.
	for i, node := range []string{"node-a", "node-b", "node-c"} {
		c.advance(1)
		tr.Pushed(stream(int64(i)), node, eds, "n1", "eds-5", []string{"other", "cla-api"}, holding("eds-4"))
	}
	c.advance(1) // +6
	tr.Answered(stream(0), eds, "n1", true)
	c.advance(1) // +7
	tr.Answered(stream(2), eds, "n1", true)
	c.advance(7) // +14
	tr.Answered(stream(1), eds, "n1", true)
	tr.Answered(stream(1), eds, "n1", true) // a repeated answer counts once

	got := tr.Traces(api, 0)
	if len(got) != 1 {
		t.Fatalf("%d traces of api, want 1", len(got))
	}
	g := got[0]
	if g.Replica != "a" || g.Cluster != "east" || g.Type != "eds" || g.Pushed != 3 || g.Acked != 3 || g.Nacked != 0 ||
		g.Translated == nil || g.Translated.Sub(g.Received) != 2*time.Millisecond || g.LastAck.Sub(g.Received) != 14*time.Millisecond ||
		g.Origin == nil || g.Origin.ResourceVersion != "42" || g.Origin.Spoke != 2 || g.Origin.SpokeToHub != 3 {
		t.Fatalf("trace %+v (origin %+v)", g, g.Origin)
	}
	// The two slowest, slowest first: node-b (pushed +4, acked +14) and node-c (pushed +5, acked +7).
	if len(g.Slowest) != 2 || g.Slowest[0].NodeID != "node-b" || g.Slowest[0].ApplyToPush != 4 || g.Slowest[0].PushToAck != 10 ||
		g.Slowest[0].HubToAck != 14 || g.Slowest[0].EndToEnd != 19 || g.Slowest[1].NodeID != "node-c" || g.Slowest[1].HubToAck != 7 {
		t.Fatalf("slowest clients %+v", g.Slowest)
	}
	for stage, want := range map[string]uint64{StageApplyToPush: 3, StagePushToAck: 3, StageHubToAck: 3, StageEndToEnd: 3, StageSpoke: 1, StageSpokeToHub: 1, StageSource: 0} {
		if got := histogramCount(t, reg, stage); got != want {
			t.Errorf("%s observed %d times, want %d", stage, got, want)
		}
	}
}

func histogramCount(t *testing.T, reg *prometheus.Registry, stage string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && l.GetValue() == stage {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// Responses that do not carry a change are not its pushes: another
// resource, another type, a cache version before the change, a client
// that held it already, a client that subscribed after the change (a
// fetch), another cache (prefix).
func TestResponsesThatDoNotCarryTheChange(t *testing.T) {
	tr, c, _ := newTracer(Config{})
	tr.Received("east", []registry.ServiceKey{api, web}, 1, true)
	translate(tr, api, 1, "cla-api")
	tr.Translated(web, 1, "", nil, nil) // nothing a client is sent changed
	c.advance(1)
	recent := syncstatus.Sent{Acked: "eds-4", SubscribedAt: c.now}
	for i, p := range []struct {
		typeURL, version string
		names            []string
		before           syncstatus.Sent
	}{
		{eds, "eds-5", []string{"cla-web"}, holding("eds-4")},
		{cds, "eds-5", []string{"cla-api"}, holding("eds-4")},
		{eds, "eds-4", []string{"cla-api"}, holding("eds-3")},
		{eds, "eds-6", []string{"cla-api"}, holding("eds-5")},
		{eds, "eds-5", []string{"cla-api"}, recent},
		{eds, "gw-eds-9", []string{"cla-api"}, holding("gw-eds-8")},
	} {
		tr.Pushed(stream(int64(i)), "n", p.typeURL, "1", p.version, p.names, p.before)
		tr.Answered(stream(int64(i)), p.typeURL, "1", true)
	}
	tr.Pushed(stream(9), "n", eds, "7", "eds-5", []string{"cla-api"}, holding("eds-4"))
	tr.Answered(stream(9), eds, "6", true) // an answer to another response
	tr.Answered(stream(9), eds, "7", false)
	a, w := tr.Traces(api, 0)[0], tr.Traces(web, 0)[0]
	if a.Pushed != 1 || a.Acked != 0 || a.Nacked != 1 || len(a.Slowest) != 0 {
		t.Errorf("api: %+v; want one push (stream 9's), rejected", a)
	}
	if !w.NoChange || w.Pushed != 0 {
		t.Errorf("web: %+v; want no client-visible change", w)
	}
	if all := tr.Traces(registry.ServiceKey{}, 0); len(all) != 2 || all[0].Service != web {
		t.Errorf("all traces, newest first: %+v", all)
	}
}

// A change received while the xDS server translates an older registry is
// the next translation's; two changes of one service in one translation
// are both carried by its pushes; a later translation supersedes both.
func TestTranslationTakesWhatItHolds(t *testing.T) {
	tr, _, _ := newTracer(Config{})
	tr.Received("east", []registry.ServiceKey{api}, 1, true)
	tr.Received("west", []registry.ServiceKey{api}, 2, true)
	tr.Received("east", []registry.ServiceKey{api}, 3, true) // after the registry being translated was taken
	translate(tr, api, 2, "cla-api")
	if !tr.Tracing(api) {
		t.Fatal("the change at version 3 is not translated yet")
	}
	tr.Pushed(stream(1), "n", eds, "1", "eds-5", []string{"cla-api"}, holding("eds-4"))
	tr.Answered(stream(1), eds, "1", true)
	got := tr.Traces(api, 0) // newest first: 3, 2, 1
	if got[0].Translated != nil || got[1].Acked != 1 || got[2].Acked != 1 {
		t.Fatalf("traces %+v; want 1 and 2 acknowledged, 3 untranslated", got)
	}
	tr.Translated(api, 3, eds, []string{"cla-api"}, map[string]uint64{"eds-": 6})
	tr.Pushed(stream(2), "n", eds, "1", "eds-6", []string{"cla-api"}, holding("eds-4"))
	tr.Answered(stream(2), eds, "1", true)
	got = tr.Traces(api, 0)
	if got[0].Acked != 1 || got[1].Acked != 1 || got[2].Acked != 1 {
		t.Fatalf("traces %+v; want the push at 6 counted for 3 only (1 and 2 superseded)", got)
	}
}

// A change carried on by a second response before the first is answered
// keeps the time of its own first push; one that joins later has its own.
func TestCarriedOnKeepsEachPushTime(t *testing.T) {
	tr, c, _ := newTracer(Config{})
	tr.Received("east", []registry.ServiceKey{api}, 1, true)
	translate(tr, api, 1, "cla-api")
	c.advance(1)
	tr.Pushed(stream(1), "n", eds, "1", "eds-5", []string{"cla-api"}, holding("eds-4"))
	c.advance(50)
	tr.Received("east", []registry.ServiceKey{web}, 2, true)
	tr.Translated(web, 2, eds, []string{"cla-web"}, map[string]uint64{"eds-": 6})
	c.advance(1)
	tr.Pushed(stream(1), "n", eds, "2", "eds-6", []string{"cla-web"}, holding("eds-4"))
	c.advance(1)
	tr.Answered(stream(1), eds, "2", true)
	a, w := tr.Traces(api, 0)[0], tr.Traces(web, 0)[0]
	if a.Acked != 1 || a.Slowest[0].ApplyToPush != 1 || w.Acked != 1 || w.Slowest[0].ApplyToPush != 1 || w.Slowest[0].PushToAck != 1 {
		t.Fatalf("api %+v, web %+v", a.Slowest, w.Slowest)
	}
}

func TestWindowCloses(t *testing.T) {
	tr, c, _ := newTracer(Config{Window: 100 * time.Millisecond})
	tr.Received("east", []registry.ServiceKey{api}, 1, true)
	translate(tr, api, 1, "cla-api")
	c.advance(200)
	tr.Pushed(stream(2), "n", eds, "1", "eds-5", []string{"cla-api"}, holding("eds-4"))
	tr.Answered(stream(2), eds, "1", true)
	if got := tr.Traces(api, 1)[0]; got.Pushed != 0 || tr.Collecting() {
		t.Fatalf("a push after the window counted: %+v (collecting %v)", got, tr.Collecting())
	}
}

func TestOldestChangesAreEvicted(t *testing.T) {
	tr, _, _ := newTracer(Config{MaxTraces: 3})
	for i := range 5 {
		tr.Received("east", []registry.ServiceKey{api}, uint64(i+1), true)
		translate(tr, api, uint64(i+1), "cla-api")
	}
	got := tr.Traces(registry.ServiceKey{}, 0)
	if len(got) != 3 || got[0].ID != 5 || got[2].ID != 3 {
		t.Fatalf("kept %+v; want changes 5, 4, 3", got)
	}
	tr.tracesMu.Lock()
	defer tr.tracesMu.Unlock()
	if n := len(tr.byResource[eds]["cla-api"]); n != 1 || tr.open.Load() != 1 {
		t.Errorf("%d changes collect pushes of cla-api (open %d); want only the newest", n, tr.open.Load())
	}
}

func TestSplitVersion(t *testing.T) {
	for v, want := range map[string]struct {
		prefix string
		n      uint64
		ok     bool
	}{"a-eds-us/z1-12": {"a-eds-us/z1-", 12, true}, "nave-7": {"nave-", 7, true}, "": {"", 0, false}, "x-": {"", 0, false}} {
		p, n, ok := splitVersion(v)
		if p != want.prefix || n != want.n || ok != want.ok {
			t.Errorf("splitVersion(%q) = %q %d %v", v, p, n, ok)
		}
	}
}

// BenchmarkPushAndACK is the tracer's cost of one traced push and its ACK
// while 64 changes collect pushes (the hot path: every response of a
// collecting type, then its ACK).
func BenchmarkPushAndACK(b *testing.B) {
	tr := New(Config{}, nil)
	for i := range 64 {
		key := registry.ServiceKey{Namespace: "bench", Name: "svc-" + strconv.Itoa(i)}
		tr.Received("east", []registry.ServiceKey{key}, uint64(i+1), true)
		tr.Translated(key, uint64(i+1), eds, []string{"cla-" + strconv.Itoa(i)}, map[string]uint64{"eds-": 5})
	}
	before := holding("eds-4")
	names := []string{"cla-7"}
	b.ReportAllocs()
	for b.Loop() {
		tr.Pushed(stream(1), "n", eds, "1", "eds-5", names, before)
		tr.Answered(stream(1), eds, "1", true)
	}
}
