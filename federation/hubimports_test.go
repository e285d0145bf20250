package federation

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// importSession is a session of cluster east (epoch 1) on a hub of its own
// that takes its imports from src in chunks of maxBytes; it has no import
// stream yet.
func importSession(src ImportSource, maxBytes int) (*hubSession, *sessionStream) {
	h := &HubServer{importStatus: map[registry.ClusterID]ImportStatus{}}
	h.cfg.MaxMessageBytes = maxBytes
	h.ServeImports(src)
	stream := &sessionStream{}
	return &hubSession{h: h, cluster: "east", epoch: 1, log: slog.New(slog.DiscardHandler), stream: stream}, stream
}

// sentUpdates returns the import updates sent since the last call.
func sentUpdates(t testing.TB, stream *sessionStream) []*fedv1.ImportUpdate {
	t.Helper()
	var out []*fedv1.ImportUpdate
	for _, m := range stream.sent {
		if m.GetImports() == nil {
			t.Fatalf("sent %v", m)
		}
		out = append(out, m.GetImports())
	}
	stream.sent = nil
	return out
}

func ackMessage(u *fedv1.ImportUpdate) *fedv1.SpokeMessage {
	return &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportAck{ImportAck: &fedv1.Ack{Nonce: u.GetNonce(), Version: u.GetVersion()}}}
}

func nackMessage(u *fedv1.ImportUpdate, refused ...registry.ServiceKey) *fedv1.SpokeMessage {
	n := &fedv1.Nack{Nonce: u.GetNonce(), Version: u.GetVersion()}
	for _, k := range refused {
		n.Rejections = append(n.Rejections, &fedv1.Rejection{Service: KeyToProto(k), Reason: "refused " + k.Name})
	}
	return &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportNack{ImportNack: n}}
}

// ackAll acknowledges every update sent, until none is left in flight.
func ackAll(t testing.TB, im *hubImports, stream *sessionStream) {
	t.Helper()
	for us := sentUpdates(t, stream); len(us) > 0; us = sentUpdates(t, stream) {
		for _, u := range us {
			if err := im.handle(ackMessage(u)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// delta checks that one update was sent, a delta, and returns it.
func delta(t *testing.T, stream *sessionStream, what string) *fedv1.ImportUpdate {
	t.Helper()
	us := sentUpdates(t, stream)
	if len(us) != 1 || us[0].GetFullState() {
		t.Fatalf("%s: sent %v, want one delta", what, us)
	}
	return us[0]
}

func upsertKeys(u *fedv1.ImportUpdate) []registry.ServiceKey {
	var out []registry.ServiceKey
	for _, imp := range u.GetUpserts() {
		out = append(out, KeyFromProto(imp.GetService()))
	}
	return out
}

func removeKeys(u *fedv1.ImportUpdate) []registry.ServiceKey {
	var out []registry.ServiceKey
	for _, k := range u.GetRemoves() {
		out = append(out, KeyFromProto(k))
	}
	return out
}

// A session looks at the services that changed since the set it last saw,
// not at every import: what changed while an update was in flight goes
// next, and a set the chain does not reach is compared whole.
func TestHubImportsLookAtWhatChanged(t *testing.T) {
	src := newImportSource(true, manyImports(1000, "svc")...)
	s, stream := importSession(src, 4<<20)
	im := newHubImports(s, []string{"default"})
	s.imports = im
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	ackAll(t, im, stream)

	web := testImport("default", "svc-007", "10.0.0.9")
	src.put(web)
	set, _ := src.Imports()
	im.follow(set)
	if got := im.lookAt(); !slices.Equal(got, []registry.ServiceKey{web.Service}) || im.whole {
		t.Fatalf("after one change the session looks at %d services (whole=%v), want the one", len(got), im.whole)
	}
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	u := delta(t, stream, "one change")
	if !slices.Equal(upsertKeys(u), []registry.ServiceKey{web.Service}) || len(u.GetRemoves()) != 0 {
		t.Fatalf("one change sent %v", u)
	}

	// While the update is in flight, another change is kept for the next one.
	api := testImport("default", "svc-008", "10.0.0.9")
	src.put(api)
	if err := im.next(); err != nil || len(stream.sent) != 0 {
		t.Fatalf("sent %v (%v) while an update is in flight", stream.sent, err)
	}
	if _, dirty := im.dirty[api.Service]; !dirty || len(im.dirty) != 1 {
		t.Fatalf("dirty %v, want %s", im.dirty, api.Service)
	}
	if err := im.handle(ackMessage(u)); err != nil {
		t.Fatal(err)
	}
	if u = delta(t, stream, "the change made in flight"); !slices.Equal(upsertKeys(u), []registry.ServiceKey{api.Service}) {
		t.Fatalf("after the ack sent %v", u)
	}
	if err := im.handle(ackMessage(u)); err != nil {
		t.Fatal(err)
	}

	gone := key("svc-009")
	src.remove(gone)
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	if u = delta(t, stream, "a removal"); !slices.Equal(removeKeys(u), []registry.ServiceKey{gone}) || len(u.GetUpserts()) != 0 {
		t.Fatalf("a removal sent %v", u)
	}
	if err := im.handle(ackMessage(u)); err != nil {
		t.Fatal(err)
	}

	// A set that does not follow the last one: compared whole, to the same delta.
	db := testImport("default", "svc-010", "10.0.0.9")
	src.mu.Lock()
	src.replace(&ImportSet{Imports: src.set.Imports.Set(db.Service, db), Authoritative: true, CIDRs: src.set.CIDRs})
	src.mu.Unlock()
	set, _ = src.Imports()
	im.follow(set)
	if n := len(im.lookAt()); !im.whole || n != 999 {
		t.Fatalf("after a set out of reach the session looks at %d services (whole=%v), want all 999", n, im.whole)
	}
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	if u = delta(t, stream, "a set out of reach"); !slices.Equal(upsertKeys(u), []registry.ServiceKey{db.Service}) || len(u.GetRemoves()) != 0 {
		t.Fatalf("a set out of reach sent %v", u)
	}
	if err := im.handle(ackMessage(u)); err != nil {
		t.Fatal(err)
	}
	if st := s.h.ImportStatuses()[0]; st.Imports != 999 || st.Acked != 999 || st.Pending != 0 || len(im.dirty) != 0 || im.whole {
		t.Errorf("at rest: %+v, %d dirty (whole=%v)", st, len(im.dirty), im.whole)
	}
}

// The services of a refused delta were not applied: the ones not refused
// are sent again, the refused ones not until they change.
func TestHubImportsLookAgainAtWhatWasRefused(t *testing.T) {
	src := newImportSource(true, testImport("default", "web", "10.0.0.1"))
	s, stream := importSession(src, 4<<20)
	im := newHubImports(s, []string{"default"})
	s.imports = im
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	ackAll(t, im, stream)
	good, bad := testImport("default", "good", "10.0.0.2"), testImport("default", "bad", "10.0.0.3")
	src.put(good, bad)
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	u := delta(t, stream, "two new imports")
	if err := im.handle(nackMessage(u, bad.Service)); err != nil {
		t.Fatal(err)
	}
	if u = delta(t, stream, "after the refusal"); !slices.Equal(upsertKeys(u), []registry.ServiceKey{good.Service}) {
		t.Fatalf("after the refusal sent %v, want good again", u)
	}
	if err := im.handle(ackMessage(u)); err != nil {
		t.Fatal(err)
	}
	if us := sentUpdates(t, stream); len(us) != 0 {
		t.Fatalf("sent %v after the ack, want nothing (bad is refused in that form)", us)
	}
	st := s.h.ImportStatuses()[0]
	if st.Imports != 3 || st.Acked != 2 || st.Pending != 1 || !slices.Equal(st.PendingServices, []string{"default/bad"}) || len(st.Refused) != 1 {
		t.Errorf("status %+v", st)
	}
	fixed := testImport("default", "bad", "10.0.0.4")
	src.put(fixed)
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	if u = delta(t, stream, "the fixed import"); !slices.Equal(upsertKeys(u), []registry.ServiceKey{fixed.Service}) {
		t.Fatalf("the fixed import: sent %v", u)
	}
}

// importModel is the pool of services TestHubImportsAgainstWhole changes:
// namespaces a, b and c, six services each, each in one of four forms, the
// last of which the spoke refuses.
type importModel struct {
	rng  *rand.Rand
	keys []registry.ServiceKey
}

const refusedForm = 3

func (m *importModel) form(k registry.ServiceKey) *imports.Import {
	f := m.rng.IntN(refusedForm + 1)
	imp := testImport(k.Namespace, k.Name, fmt.Sprintf("10.0.%d.1", f))
	if f == refusedForm {
		imp.Sources[0].Cluster = "refused"
	}
	return imp // a new one each time: equal forms are not always the same pointer
}

func (m *importModel) someKeys(n int) []registry.ServiceKey {
	var out []registry.ServiceKey
	for range n {
		out = append(out, m.keys[m.rng.IntN(len(m.keys))])
	}
	return out
}

func (m *importModel) namespaces() []string {
	var out []string
	for _, ns := range []string{"a", "b", "c", "d"} {
		if m.rng.IntN(3) > 0 {
			out = append(out, ns)
		}
	}
	return out
}

// importModelCounts counts what a run of TestHubImportsAgainstWhole went
// through, so that the test fails if it stops exercising what it should.
type importModelCounts struct {
	fulls, deltas, acks, nacks, retains, stale, unreached, namespaces, problems, ended int
}

// TestHubImportsAgainstWhole drives a session and the whole-comparing model
// (wholeImports, the code before) through the same random sequence of set
// changes (some out of the chain's reach), acks, nacks (some naming what was
// not sent), stale answers, namespace changes, problem sets and writes: both
// must send the same messages and publish the same status at every step.
func TestHubImportsAgainstWhole(t *testing.T) {
	var total importModelCounts
	for seed := range uint64(60) {
		runImportModel(t, seed, 400, &total)
	}
	t.Logf("%+v", total)
	for name, n := range map[string]int{"full states": total.fulls, "deltas": total.deltas, "acks": total.acks,
		"nacks": total.nacks, "retain lists": total.retains, "stale answers": total.stale,
		"sets out of reach": total.unreached, "namespace changes": total.namespaces, "problem sets": total.problems} {
		if n < 10 {
			t.Errorf("only %d %s", n, name)
		}
	}
}

func runImportModel(t *testing.T, seed uint64, steps int, counts *importModelCounts) {
	m := &importModel{rng: rand.New(rand.NewPCG(seed, 11))}
	for _, ns := range []string{"a", "b", "c"} {
		for i := range 6 {
			m.keys = append(m.keys, registry.ServiceKey{Namespace: ns, Name: fmt.Sprint("s", i)})
		}
	}
	var initial []*imports.Import
	for _, k := range m.someKeys(8) {
		initial = append(initial, m.form(k))
	}
	src := newImportSource(m.rng.IntN(2) == 0, initial...)
	namespaces := m.namespaces()
	s, stream := importSession(src, 700) // a few imports a chunk
	ws, wstream := importSession(src, 700)
	im, whole := newHubImports(s, namespaces), newWholeImports(ws, namespaces)
	s.imports = im

	var queue []*fedv1.ImportUpdate // chunks sent and not answered, oldest first
	var spoiled []*fedv1.ImportUpdate
	step := func(what string, a, b func() error) bool {
		t.Helper()
		errA, errB := a(), b()
		if (errA == nil) != (errB == nil) {
			t.Fatalf("seed %d, %s: error %v, the model's %v", seed, what, errA, errB)
		}
		got, want := sentUpdates(t, stream), sentUpdates(t, wstream)
		if len(got) != len(want) {
			t.Fatalf("seed %d, %s: sent %d chunks, the model %d:\n%v\n%v", seed, what, len(got), len(want), got, want)
		}
		for i := range got {
			if !proto.Equal(got[i], want[i]) {
				t.Fatalf("seed %d, %s: sent\n%v\nthe model\n%v", seed, what, got[i], want[i])
			}
			if got[i].GetFullState() && got[i].GetNonce() == fmt.Sprintf("import-%d.0", got[i].GetVersion()) {
				counts.fulls++
			} else if !got[i].GetFullState() {
				counts.deltas++
			}
			if len(got[i].GetRetain()) > 0 {
				counts.retains++
			}
		}
		queue = append(queue, got...)
		sts, wsts := s.h.ImportStatuses(), ws.h.ImportStatuses()
		if len(sts) != 1 || len(wsts) != 1 {
			t.Fatalf("seed %d, %s: %d statuses, the model %d", seed, what, len(sts), len(wsts))
		}
		st, wst := sts[0], wsts[0]
		st.UpdatedAt, wst.UpdatedAt = time.Time{}, time.Time{}
		if !reflect.DeepEqual(st, wst) {
			t.Fatalf("seed %d, %s: status\n%+v\nthe model's\n%+v", seed, what, st, wst)
		}
		return errA == nil
	}
	handle := func(what string, msg *fedv1.SpokeMessage) bool {
		return step(what, func() error { return im.handle(msg) }, func() error { return whole.handle(msg) })
	}
	if !step("the start", im.next, whole.next) {
		return
	}
	for range steps {
		ok := true
		switch r := m.rng.IntN(100); {
		case r < 35: // the hub's set changes
			var put []*imports.Import
			for _, k := range m.someKeys(m.rng.IntN(3)) {
				put = append(put, m.form(k))
			}
			var auth *bool
			if m.rng.IntN(8) == 0 {
				a := !src.set.Authoritative
				auth = &a
			}
			src.update(put, m.someKeys(m.rng.IntN(2)), auth)
			if m.rng.IntN(15) == 0 { // a set the session's chain does not reach
				src.mu.Lock()
				src.replace(&ImportSet{Imports: src.set.Imports, Authoritative: src.set.Authoritative, CIDRs: src.set.CIDRs})
				src.mu.Unlock()
				counts.unreached++
			}
			if m.rng.IntN(4) > 0 { // else the session sees it with the next change
				ok = step("a set change", im.next, whole.next)
			}
		case r < 75 && len(queue) > 0: // the spoke answers the oldest chunk
			u := queue[0]
			queue = queue[1:]
			var refused []registry.ServiceKey
			for _, imp := range u.GetUpserts() {
				if imp.GetSources()[0].GetClusterId() == "refused" {
					refused = append(refused, KeyFromProto(imp.GetService()))
				}
			}
			switch n := m.rng.IntN(150); {
			case n == 0: // a service the update may not name (alone, it ends the session)
				refused = append(refused, m.someKeys(1)...)
			case n < 15 && len(u.GetUpserts()) > 0: // a form the hub thinks good
				refused = append(refused, KeyFromProto(u.GetUpserts()[m.rng.IntN(len(u.GetUpserts()))].GetService()))
			}
			if len(refused) == 0 {
				counts.acks++
				ok = handle("an ack", ackMessage(u))
				break
			}
			counts.nacks++
			// The spoke drops the rest of the update, though it may still answer it.
			spoiled = spoiled[:0]
			for len(queue) > 0 && queue[0].GetVersion() == u.GetVersion() {
				spoiled, queue = append(spoiled, queue[0]), queue[1:]
			}
			ok = handle("a nack", nackMessage(u, refused...))
		case r < 80 && len(spoiled) > 0 && spoiled[0].GetVersion() != im.version: // (else it is an error)
			u := spoiled[m.rng.IntN(len(spoiled))]
			counts.stale++
			ok = handle("a stale answer", ackMessage(u))
		case r < 84:
			counts.namespaces++
			ok = handle("namespaces", &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Namespaces{
				Namespaces: &fedv1.Namespaces{Names: m.namespaces()}}})
		case r < 95:
			keys := m.someKeys(m.rng.IntN(4))
			slices.SortFunc(keys, registry.ServiceKey.Compare)
			ps := &fedv1.ImportProblems{Omitted: uint32(m.rng.IntN(3))}
			for _, k := range slices.Compact(keys) {
				ps.Problems = append(ps.Problems, &fedv1.ImportProblem{Service: KeyToProto(k), Reason: ReasonBlockedByService})
			}
			counts.problems++
			ok = handle("problems", &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportProblems{ImportProblems: ps}})
		default:
			v := uint64(m.rng.IntN(int(im.version) + 2))
			ok = handle("written", &fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportsWritten{ImportsWritten: &fedv1.ImportsWritten{Version: v}}})
		}
		if !ok {
			counts.ended++
			return // both ended the session alike
		}
	}
}

// A new form of an import the spoke refused, while it holds an older one,
// stays refused through acknowledgements of other services' changes: it
// was sent again, and refused again, after every one.
func TestHubImportsKeepARefusalOverAnOlderForm(t *testing.T) {
	web, db := testImport("default", "web", "10.0.0.1"), testImport("default", "db", "10.0.0.2")
	src := newImportSource(true, web, db)
	s, stream := importSession(src, 4<<20)
	im := newHubImports(s, []string{"default"})
	s.imports = im
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	ackAll(t, im, stream)
	src.put(testImport("default", "web", "10.0.0.9"))
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	if err := im.handle(nackMessage(delta(t, stream, "web's new form"), web.Service)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		src.put(testImport("default", "db", fmt.Sprintf("10.0.1.%d", i)))
		if err := im.next(); err != nil {
			t.Fatal(err)
		}
		u := delta(t, stream, "db's change")
		if !slices.Equal(upsertKeys(u), []registry.ServiceKey{db.Service}) {
			t.Fatalf("db's change %d sent %v", i, u)
		}
		if err := im.handle(ackMessage(u)); err != nil {
			t.Fatal(err)
		}
		if us := sentUpdates(t, stream); len(us) != 0 {
			t.Fatalf("after db's change %d was acknowledged, sent %v: web's refused form again", i, us)
		}
	}
	if st := s.h.ImportStatuses()[0]; len(st.Refused) != 1 || st.Pending != 1 {
		t.Errorf("status %+v, want web refused and pending", st)
	}
	// A form the spoke takes ends the refusal.
	src.put(testImport("default", "web", "10.0.0.10"))
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	if err := im.handle(ackMessage(delta(t, stream, "web's next form"))); err != nil {
		t.Fatal(err)
	}
	if st := s.h.ImportStatuses()[0]; len(st.Refused) != 0 || st.Pending != 0 || st.Acked != 2 {
		t.Errorf("status %+v, want everything acknowledged, nothing refused", st)
	}
}

// An import the spoke keeps in its own form stays kept when the delta that
// gave it the hub's form again is refused: once the hub has it no more, a
// remove goes to the spoke (none went, and the spoke kept it until its
// next full state).
func TestHubImportsRemoveWhatTheSpokeKeepsAfterARefusal(t *testing.T) {
	web := testImport("default", "web", "10.0.0.1")
	src := newImportSource(true, web)
	s, stream := importSession(src, 4<<20)
	im := newHubImports(s, []string{"default"})
	s.imports = im
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	us := sentUpdates(t, stream)
	if len(us) != 1 || !us[0].GetFullState() {
		t.Fatalf("sent %v, want a full state", us)
	}
	if err := im.handle(nackMessage(us[0], web.Service)); err != nil {
		t.Fatal(err)
	}
	us = sentUpdates(t, stream)
	if len(us) != 1 || !us[0].GetFullState() || len(us[0].GetRetain()) != 1 {
		t.Fatalf("after the refusal sent %v, want a full state retaining web", us)
	}
	if err := im.handle(ackMessage(us[0])); err != nil {
		t.Fatal(err)
	}
	src.put(testImport("default", "web", "10.0.0.2"))
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	if err := im.handle(nackMessage(delta(t, stream, "web's new form"), web.Service)); err != nil {
		t.Fatal(err)
	}
	if us := sentUpdates(t, stream); len(us) != 0 {
		t.Fatalf("after the refusal sent %v, want nothing", us)
	}
	src.remove(web.Service)
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	if u := delta(t, stream, "web gone from the hub"); !slices.Equal(removeKeys(u), []registry.ServiceKey{web.Service}) {
		t.Fatalf("web gone from the hub sent %v, want its remove", u)
	}
}

// While a spoke leaves an update unanswered, services that come and go do
// not pile up in the session: past what the set and the acked state hold,
// the next delta compares whole, and sends what it should.
func TestHubImportsDirtyIsBoundedWhileInFlight(t *testing.T) {
	src := newImportSource(true, manyImports(10, "svc")...)
	s, stream := importSession(src, 4<<20)
	im := newHubImports(s, []string{"default"})
	s.imports = im
	if err := im.next(); err != nil {
		t.Fatal(err)
	}
	full := sentUpdates(t, stream) // left unanswered for now
	var last *imports.Import
	for i := range 2000 {
		next := testImport("default", fmt.Sprintf("churn-%d", i), "10.0.0.1")
		src.put(next)
		if last != nil {
			src.remove(last.Service)
		}
		last = next
		if err := im.next(); err != nil {
			t.Fatal(err)
		}
		if bound := im.set.Imports.Len() + im.acked.Len() + 64; len(im.dirty) > bound {
			t.Fatalf("after %d changes in flight the session holds %d dirty services, more than %d", i+1, len(im.dirty), bound)
		}
	}
	for _, u := range full {
		if err := im.handle(ackMessage(u)); err != nil {
			t.Fatal(err)
		}
	}
	u := delta(t, stream, "after the answer")
	if !slices.Equal(upsertKeys(u), []registry.ServiceKey{last.Service}) || len(u.GetRemoves()) != 0 {
		t.Fatalf("after the answer sent %v, want the one churned service that is left", u)
	}
}
