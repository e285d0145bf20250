package federation

import (
	"strconv"
	"strings"
	"testing"
	"time"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

func TestOriginsTakeWhatTheSpokeSaw(t *testing.T) {
	var none *Origins
	none.Saw(registry.ServiceKey{Namespace: "a", Name: "b"}, "1", time.Time{}) // a nil record records nothing
	if got := none.take([]registry.ServiceKey{{Namespace: "a", Name: "b"}}); got != nil {
		t.Fatalf("a nil record gave %v", got)
	}
	o := NewOrigins()
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	o.now = func() time.Time { return now }
	api, web, old := registry.ServiceKey{Namespace: "d", Name: "api"}, registry.ServiceKey{Namespace: "d", Name: "web"}, registry.ServiceKey{Namespace: "d", Name: "old"}
	o.Saw(old, "7", time.Time{})
	now = now.Add(time.Minute)
	o.Saw(api, "42", now.Add(-150*time.Millisecond)) // a file changed 150 ms before the spoke saw it
	o.Saw(web, "43", time.Time{})
	now = now.Add(2 * time.Millisecond)
	got := o.take([]registry.ServiceKey{api, old, {Namespace: "d", Name: "never"}})
	if len(got) != 1 || got[0].GetService().GetName() != "api" || got[0].GetResourceVersion() != "42" ||
		time.Duration(got[0].GetSourceNanos()) != 150*time.Millisecond || time.Duration(got[0].GetSpokeNanos()) != 2*time.Millisecond {
		t.Fatalf("took %v; want api's origin only (old's is too old to be this update's)", got)
	}
	if again := o.take([]registry.ServiceKey{api}); again != nil {
		t.Errorf("an origin was taken twice: %v", again)
	}
	if w := o.take([]registry.ServiceKey{web}); len(w) != 1 || w[0].GetSourceNanos() != 0 {
		t.Errorf("web (no change time): %v; want its origin with the source unknown", w)
	}
}

func TestReceivedOriginsAreChecked(t *testing.T) {
	key := func(ns, name string) *fedv1.ServiceKey { return &fedv1.ServiceKey{Namespace: ns, Name: name} }
	u := &fedv1.Update{
		Upserts: []*fedv1.Shard{{Service: key("d", "api")}, {Service: key("d", "web")}},
		Removes: []*fedv1.ServiceKey{key("d", "gone")},
		Origins: []*fedv1.ChangeOrigin{
			{Service: key("d", "api"), SourceNanos: int64(time.Millisecond), SpokeNanos: -5, ResourceVersion: strings.Repeat("9", 100)},
			{Service: key("d", "api"), SpokeNanos: int64(time.Millisecond)}, // a second origin of api: left out
			{Service: key("d", "other")}, // not changed by the update: left out
			{Service: key("d", "web"), SpokeNanos: int64(time.Hour), ResourceVersion: "1\x00\xff2"}, // absurd: unknown
			{Service: key("d", "gone"), SpokeNanos: int64(time.Millisecond)},
		},
	}
	got := receivedOrigins(u)
	if len(got) != 3 || got[0].Source != time.Millisecond || got[0].Spoke != 0 || len(got[0].ResourceVersion) != 64 ||
		got[1].Service.Name != "web" || got[1].Spoke != 0 || got[1].ResourceVersion != "1?\ufffd2" || got[2].Service.Name != "gone" {
		t.Fatalf("received %+v", got)
	}
	if bounded(-1) != 0 || bounded(int64(time.Hour)) != 0 || bounded(int64(time.Millisecond)) != time.Millisecond {
		t.Error("link bounds")
	}
}

// A burst of records (an informer relist) costs each Saw a constant share
// of the sweeps, and keeps what is recent.
func TestOriginsBurst(t *testing.T) {
	o := NewOrigins()
	for i := range 50_000 {
		o.Saw(registry.ServiceKey{Namespace: "d", Name: strconv.Itoa(i)}, "", time.Time{})
	}
	if len(o.byService) != 50_000 || o.swept < 4096 {
		t.Errorf("%d records, last sweep left %d", len(o.byService), o.swept)
	}
}

func TestLinkEstimate(t *testing.T) {
	p := &Publisher{}
	now := time.Now()
	p.estimateLink(pending{sentAt: now.Add(-10 * time.Millisecond)}, 4*time.Millisecond, now)
	if p.link != 3*time.Millisecond {
		t.Errorf("10 ms round trip, 4 ms at the hub: link %v, want 3 ms", p.link)
	}
	p.estimateLink(pending{sentAt: now}, time.Hour, now.Add(time.Millisecond)) // the hub's time exceeds the round trip: no estimate
	if p.link != 3*time.Millisecond {
		t.Errorf("an impossible answer changed the estimate to %v", p.link)
	}
}
