package convergence

import (
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/syncstatus"
)

var (
	api = registry.ServiceKey{Namespace: "default", Name: "api"}
	web = registry.ServiceKey{Namespace: "default", Name: "web"}
	eds = resource.EndpointType
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

func TestTraceStagesAndSlowestClients(t *testing.T) {
	tr, c, reg := newTracer(Config{Replica: "a", SlowestClients: 2})
	tr.Received("east", []registry.ServiceKey{api})
	if !tr.Tracing(api) || tr.Tracing(web) || tr.Collecting() {
		t.Fatal("a received change of api: api awaits translation, nothing collects pushes yet")
	}
	c.advance(2)
	tr.Translated(api, eds, []string{"cla-api"})
	if tr.Tracing(api) || !tr.Collecting() {
		t.Fatal("after translation api's change collects pushes")
	}
	// Three clients, pushed at +3, +4 and +5 ms.
	for i, node := range []string{"node-a", "node-b", "node-c"} {
		c.advance(1)
		tr.Pushed(stream(int64(i)), node, eds, "n1", []string{"other", "cla-api"})
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
		g.Translated == nil || g.Translated.Sub(g.Received) != 2*time.Millisecond || g.LastAck.Sub(g.Received) != 14*time.Millisecond {
		t.Fatalf("trace %+v", g)
	}
	// The two slowest, slowest first: node-b (pushed +4, acked +14) and node-c (pushed +5, acked +7).
	if len(g.Slowest) != 2 || g.Slowest[0].NodeID != "node-b" || g.Slowest[0].ApplyToPush != 4 || g.Slowest[0].PushToAck != 10 ||
		g.Slowest[0].HubToAck != 14 || g.Slowest[1].NodeID != "node-c" || g.Slowest[1].HubToAck != 7 {
		t.Fatalf("slowest clients %+v", g.Slowest)
	}
	if n, err := testutil.GatherAndCount(reg, MetricConvergence); err != nil || n != 3 {
		t.Fatalf("%s: %d series (%v), want one per stage", MetricConvergence, n, err)
	}
	for _, stage := range []string{StageApplyToPush, StagePushToAck, StageHubToAck} {
		if got := histogramCount(t, reg, stage); got != 3 {
			t.Errorf("%s observed %d times, want 3 (one per client)", stage, got)
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

func TestPushesThatDoNotCarryTheChange(t *testing.T) {
	tr, c, _ := newTracer(Config{})
	tr.Received("east", []registry.ServiceKey{api, web})
	tr.Translated(api, eds, []string{"cla-api"})
	tr.Translated(web, "", nil) // nothing a client is sent changed
	c.advance(1)
	tr.Pushed(stream(1), "n", eds, "1", []string{"cla-web"})                  // another resource
	tr.Pushed(stream(2), "n", resource.ClusterType, "1", []string{"cla-api"}) // another type
	tr.Answered(stream(1), eds, "1", true)
	tr.Answered(stream(2), resource.ClusterType, "1", true)
	tr.Pushed(stream(3), "n", eds, "7", []string{"cla-api"})
	tr.Answered(stream(3), eds, "6", true) // an answer to another response
	tr.Answered(stream(3), eds, "7", false)
	a, w := tr.Traces(api, 0)[0], tr.Traces(web, 0)[0]
	if a.Pushed != 1 || a.Acked != 0 || a.Nacked != 1 || len(a.Slowest) != 0 {
		t.Errorf("api: %+v; want one push, rejected", a)
	}
	if !w.NoChange || w.Pushed != 0 {
		t.Errorf("web: %+v; want no client-visible change", w)
	}
	if all := tr.Traces(registry.ServiceKey{}, 0); len(all) != 2 || all[0].Service != web {
		t.Errorf("all traces, newest first: %+v", all)
	}
}

func TestNewerChangeSupersedesAndWindowCloses(t *testing.T) {
	tr, c, _ := newTracer(Config{Window: 100 * time.Millisecond})
	tr.Received("east", []registry.ServiceKey{api})
	tr.Translated(api, eds, []string{"cla-api"})
	tr.Received("east", []registry.ServiceKey{api})
	tr.Translated(api, eds, []string{"cla-api"})
	tr.Pushed(stream(1), "n", eds, "1", []string{"cla-api"})
	tr.Answered(stream(1), eds, "1", true)
	got := tr.Traces(api, 0)
	if got[0].Acked != 1 || got[1].Acked != 0 {
		t.Fatalf("the newer change should take the push, the older none: %+v", got)
	}
	// Past the window nothing collects, not even the newer change.
	c.advance(200)
	tr.Received("east", []registry.ServiceKey{web})
	tr.Translated(web, eds, []string{"cla-web"}) // expires what is past its window
	tr.Pushed(stream(2), "n", eds, "1", []string{"cla-api"})
	tr.Answered(stream(2), eds, "1", true)
	if got := tr.Traces(api, 1)[0]; got.Acked != 1 || got.Pushed != 1 {
		t.Fatalf("a push after the window counted: %+v", got)
	}
}

func TestOldestChangesAreEvicted(t *testing.T) {
	tr, _, _ := newTracer(Config{MaxTraces: 3})
	for range 5 {
		tr.Received("east", []registry.ServiceKey{api})
		tr.Translated(api, eds, []string{"cla-api"})
	}
	got := tr.Traces(registry.ServiceKey{}, 0)
	if len(got) != 3 || got[0].ID != 5 || got[2].ID != 3 {
		t.Fatalf("kept %+v; want changes 5, 4, 3", got)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if n := len(tr.byResource[eds]["cla-api"]); n != 1 || tr.open.Load() != 1 {
		t.Errorf("%d changes collect pushes of cla-api (open %d); want only the newest", n, tr.open.Load())
	}
}
