package federation

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
)

// reportsOf makes cfg hand every Reports to the returned channel.
func reportsOf(cfg *spokeSetup) <-chan Reports {
	ch := make(chan Reports, 1000)
	cfg.OnReport = func(r Reports) { ch <- r }
	return ch
}

// awaitReports returns the first Reports that satisfies cond.
func awaitReports(t *testing.T, ch <-chan Reports, what string, cond func(Reports) bool) Reports {
	t.Helper()
	timeout := time.After(10 * time.Second)
	var last Reports
	for {
		select {
		case r := <-ch:
			if cond(r) {
				return r
			}
			last = r
		case <-timeout:
			t.Fatalf("never reported %s; last report %v", what, last)
		}
	}
}

func TestRefusedServiceIsReportedUntilAValidFormIsAccepted(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	cfg := fastSpoke()
	reports := reportsOf(&cfg)
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", cfg)
	a := testShard("east", "a", "10.0.0.1")
	b := testShard("east", "b", "10.0.0.2")
	p.states <- stateOf(a, b)
	p.awaitAcked(t, 2)

	badA := testShard("east", "a", "10.0.0.1")
	badA.Ports[0].Protocol = "QUIC" // the hub refuses it
	badB := testShard("east", "b", "10.0.0.2")
	badB.Ports[0].Protocol = "QUIC"
	p.states <- stateOf(badA, badB)
	got := awaitReports(t, reports, "both refusals", func(r Reports) bool { return len(r) == 2 })
	for _, k := range []registry.ServiceKey{a.Service, b.Service} {
		if !strings.Contains(got[k].Refused, "QUIC") || len(got[k].Conflicts) != 0 {
			t.Errorf("report of %s = %+v, want the hub's reason about QUIC", k, got[k])
		}
	}

	// a gets a valid form the hub accepts; b leaves the desired state.
	a2 := testShard("east", "a", "10.0.0.1", "10.0.0.3")
	p.states <- stateOf(a2)
	awaitReports(t, reports, "nothing", func(r Reports) bool { return len(r) == 0 })
	if got := h.store.registry().Service(a.Service); got == nil || !got.Shards[0].Equal(a2) {
		t.Fatal("the hub does not hold the accepted form of a")
	}
	select {
	case r := <-reports:
		t.Fatalf("reported %v after everything was cleared, with nothing changed", r)
	default:
	}
}

func TestTooLargeServiceIsReported(t *testing.T) {
	hcfg := DefaultHubConfig()
	hcfg.MaxMessageBytes = 8 << 10
	h := startHub(t, hcfg)
	cfg := fastSpoke()
	reports := reportsOf(&cfg)
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", cfg)

	var addrs []string
	for i := range 500 {
		addrs = append(addrs, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1))
	}
	huge := testShard("east", "big", addrs...)
	other := testShard("east", "other", "10.0.0.2")
	p.states <- stateOf(huge, other)
	got := awaitReports(t, reports, "the oversized service", func(r Reports) bool { return len(r) > 0 })
	if r := got[huge.Service]; len(got) != 1 || !strings.Contains(r.Refused, "message budget") {
		t.Fatalf("reports %+v, want only %s refused for its size", got, huge.Service)
	}
	p.awaitAcked(t, 1) // other still flows

	small := testShard("east", "big", "10.0.0.1")
	p.states <- stateOf(small, other)
	awaitReports(t, reports, "nothing", func(r Reports) bool { return len(r) == 0 })
	p.awaitAcked(t, 2)
}

// Conflicts reach both clusters' spokes over the protocol, whatever Store computes them.
func TestConflictsAreReportedToBothSpokes(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	eastCfg, westCfg := fastSpoke(), fastSpoke()
	eastReports, westReports := reportsOf(&eastCfg), reportsOf(&westCfg)
	east := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", eastCfg)
	west := startPublisher(t, dial(t, h.addr, testTokens["west"]), "west", westCfg)

	e := testShard("east", "api", "10.0.0.1")
	w := testShard("west", "api", "10.1.0.1")
	w.Ports[0].Name = "web" // same port, another name: a conflict, which east wins (equal age, lower ID)
	east.states <- stateOf(e)
	west.states <- stateOf(w)
	for cluster, ch := range map[registry.ClusterID]<-chan Reports{"east": eastReports, "west": westReports} {
		got := awaitReports(t, ch, "the conflict to "+string(cluster), func(r Reports) bool { return len(r[e.Service].Conflicts) > 0 })
		c := got[e.Service].Conflicts
		if len(c) != 1 || c[0].Kind != registry.PortConflict || !strings.Contains(c[0].Text, "kept east's, ignored west's") ||
			!strings.Contains(c[0].Text, "lower cluster ID, east") || got[e.Service].Refused != "" {
			t.Errorf("%s's report: %+v", cluster, got[e.Service])
		}
	}

	// The loser takes the winner's name: the conflict is gone for both.
	w2 := testShard("west", "api", "10.1.0.1")
	west.states <- stateOf(w2)
	awaitReports(t, eastReports, "no conflict to east", func(r Reports) bool { return len(r) == 0 })
	awaitReports(t, westReports, "no conflict to west", func(r Reports) bool { return len(r) == 0 })
}

func TestExplainConflicts(t *testing.T) {
	at := func(s string) time.Time { tm, _ := time.Parse(time.RFC3339, s); return tm }
	shard := func(c registry.ClusterID, exported time.Time, name string) *registry.Shard {
		s := testShard(c, "api")
		s.ExportedAt, s.Ports[0].Name = exported, name
		return s
	}
	for _, tc := range []struct {
		name   string
		shards []*registry.Shard
		want   []string // in the text that both clusters get
	}{
		{
			name:   "oldest export wins",
			shards: []*registry.Shard{shard("east", at("2025-02-01T00:00:00Z"), "grpc"), shard("west", at("2025-01-01T00:00:00Z"), "web")},
			want: []string{`port 8080/TCP`, `name="web" in west but name="grpc" in east`, "kept west's, ignored east's",
				"west exported the service first (at 2025-01-01T00:00:00Z, east at 2025-02-01T00:00:00Z), and the oldest export wins"},
		},
		{
			name:   "a tie goes to the lower cluster ID",
			shards: []*registry.Shard{shard("west", at("2025-01-01T00:00:00Z"), "web"), shard("east", at("2025-01-01T00:00:00Z"), "grpc")},
			want:   []string{"kept east's, ignored west's", "same time (at 2025-01-01T00:00:00Z), so the lower cluster ID, east, wins"},
		},
		{
			name:   "an unknown export time counts as oldest",
			shards: []*registry.Shard{shard("west", time.Time{}, "web"), shard("east", at("2025-01-01T00:00:00Z"), "grpc")},
			want:   []string{"kept west's, ignored east's", "west exported the service first (at an unknown time, which counts as oldest, east at 2025-01-01T00:00:00Z)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := registry.New()
			for _, s := range tc.shards {
				reg, _ = reg.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
			}
			got := ExplainConflicts(reg.Service(tc.shards[0].Service))
			if len(got) != 2 || len(got["east"]) != 1 || len(got["west"]) != 1 || got["east"][0] != got["west"][0] {
				t.Fatalf("ExplainConflicts = %q, want one text for each cluster, the same", got)
			}
			if got["east"][0].Kind != registry.PortConflict {
				t.Errorf("kind = %q, want PortConflict", got["east"][0].Kind)
			}
			for _, w := range tc.want {
				if !strings.Contains(got["east"][0].Text, w) {
					t.Errorf("%q does not say %q", got["east"][0].Text, w)
				}
			}
		})
	}
	if got := ExplainConflicts(nil); got != nil {
		t.Errorf("ExplainConflicts(nil) = %v", got)
	}
}

// A spoke with nothing to report is still told so once the hub has reported
// its (empty) conflict set: "nothing to report" is then known, not assumed.
func TestEmptyConflictSetIsReportedOnce(t *testing.T) {
	h := startHub(t, DefaultHubConfig())
	cfg := fastSpoke()
	reports := reportsOf(&cfg)
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", cfg)
	p.states <- stateOf(testShard("east", "a", "10.0.0.1"))
	p.awaitAcked(t, 1)
	if r := awaitReports(t, reports, "the empty conflict set", func(Reports) bool { return true }); len(r) != 0 {
		t.Fatalf("reported %v, want nothing", r)
	}
	p.states <- stateOf(testShard("east", "a", "10.0.0.1", "10.0.0.2"))
	p.awaitAcked(t, 1)
	select {
	case r := <-reports:
		t.Fatalf("reported %v again with nothing changed", r)
	case <-time.After(200 * time.Millisecond):
	}
}
