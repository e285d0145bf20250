package federation

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// importSource is a settable ImportSource whose sets follow one another (Then).
type importSource struct {
	mu      sync.Mutex
	set     *ImportSet
	changed chan struct{}
}

// importMap holds imps.
func importMap(imps ...*imports.Import) ImportMap {
	b := ImportMap{}.Builder()
	for _, imp := range imps {
		b.Set(imp.Service, imp)
	}
	return b.Map()
}

// heldIn says whether set holds an import of k.
func heldIn(set *ImportSet, k registry.ServiceKey) bool {
	imp, _ := set.Imports.Get(k)
	return imp != nil
}

func newImportSource(auth bool, imps ...*imports.Import) *importSource {
	return &importSource{changed: make(chan struct{}), set: NewImportSet(importMap(imps...), auth, []string{"243.0.0.0/16"})}
}

func (s *importSource) Imports() (*ImportSet, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.set, s.changed
}

// update replaces the set with the next one: imps put, keys removed, and
// the authority changed when auth is not nil.
func (s *importSource) update(put []*imports.Import, remove []registry.ServiceKey, auth *bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.set.Imports.Builder()
	var changed []registry.ServiceKey
	for _, imp := range put {
		b.Set(imp.Service, imp)
		changed = append(changed, imp.Service)
	}
	for _, k := range remove {
		b.Delete(k)
		changed = append(changed, k)
	}
	authoritative := s.set.Authoritative
	if auth != nil {
		authoritative = *auth
	}
	s.replace(s.set.Then(b.Map(), changed, authoritative))
}

// replace makes set the current one; s.mu is held.
func (s *importSource) replace(set *ImportSet) {
	s.set = set
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *importSource) put(imps ...*imports.Import) { s.update(imps, nil, nil) }

func (s *importSource) remove(keys ...registry.ServiceKey) { s.update(nil, keys, nil) }

func (s *importSource) setAuthoritative(auth bool) { s.update(nil, nil, &auth) }

// testImport is a ClusterSetIP import of ns/name from east with the given endpoint addresses.
func testImport(ns, name string, addrs ...string) *imports.Import {
	port := registry.ServicePort{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}
	imp := &imports.Import{
		Service: registry.ServiceKey{Namespace: ns, Name: name}, Ports: []registry.ServicePort{port},
		IPs:     []netip.Addr{netip.MustParseAddr("243.0.0.10")},
		Sources: []imports.Source{{Cluster: "east", Ports: []registry.ServicePort{port}}},
	}
	for _, a := range addrs {
		imp.Sources[0].Endpoints = append(imp.Sources[0].Endpoints, imports.Endpoint{
			Addresses: []netip.Addr{netip.MustParseAddr(a)}, Ports: []registry.EndpointPort{{Name: "grpc", Port: 9090}},
			Zone: "z1", Conditions: registry.Conditions{Ready: true, Serving: true},
		})
	}
	return imp
}

// importSpoke runs a publisher that takes the import stream and reports every state it is given.
func importSpoke(t *testing.T, h *testHub, namespaces ...string) (*publisher, *Publisher, <-chan ImportState) {
	t.Helper()
	states := make(chan ImportState, 100)
	cfg := fastSpoke()
	cfg.OnImports = func(s ImportState) { states <- s }
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", cfg)
	pub := p.pub
	pub.SetNamespaces(namespaces)
	p.states <- State{}
	return p, pub, states
}

func awaitImports(t *testing.T, states <-chan ImportState, what string, cond func(ImportState) bool) ImportState {
	t.Helper()
	// Generous: a failure is a hang, and the big import takes seconds to
	// decode and check under -race on a busy machine (10 s was not enough).
	timeout := time.After(time.Minute)
	for {
		select {
		case s := <-states:
			if cond(s) {
				return s
			}
		case <-timeout:
			t.Fatalf("never got imports: %s", what)
		}
	}
}

func keysOf(s ImportState) []string {
	var out []string
	for k := range s.Imports {
		out = append(out, k.String())
	}
	slices.Sort(out)
	return out
}

func awaitImportStatus(t *testing.T, h *testHub, what string, cond func(ImportStatus) bool) ImportStatus {
	t.Helper()
	var last []ImportStatus
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		last = h.srv.ImportStatuses()
		if len(last) == 1 && cond(last[0]) {
			return last[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("import status never %s: %+v", what, last)
	return ImportStatus{}
}

func TestImportStream(t *testing.T) {
	src := newImportSource(true, testImport("default", "web", "10.0.0.1"), testImport("other", "db", "10.0.0.2"))
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(src)
	_, pub, states := importSpoke(t, h, "default")

	// The full state names what the cluster's namespaces import, authoritatively.
	first := awaitImports(t, states, "the full state", func(s ImportState) bool { return len(s.Imports) > 0 })
	if got := keysOf(first); !slices.Equal(got, []string{"default/web"}) || !first.Authoritative || !slices.Equal(first.CIDRs, []string{"243.0.0.0/16"}) {
		t.Fatalf("first state: %v authoritative=%v cidrs=%v", got, first.Authoritative, first.CIDRs)
	}
	if !first.Imports[registry.ServiceKey{Namespace: "default", Name: "web"}].Equal(testImport("default", "web", "10.0.0.1")) {
		t.Errorf("the import changed on the wire: %+v", first.Imports)
	}
	if !first.Deletable(registry.ServiceKey{Namespace: "default", Name: "gone"}) {
		t.Error("after an authoritative full state, an import the hub does not name is not deletable")
	}

	// Deltas: a changed import, a new one.
	src.put(testImport("default", "web", "10.0.0.1", "10.0.0.3"), testImport("default", "api", "10.0.0.4"))
	s := awaitImports(t, states, "the delta", func(s ImportState) bool { return len(s.Imports) == 2 })
	if web := s.Imports[registry.ServiceKey{Namespace: "default", Name: "web"}]; len(web.Sources[0].Endpoints) != 2 {
		t.Errorf("web after the delta: %+v", web)
	}
	// A namespace appears: its imports arrive.
	pub.SetNamespaces([]string{"default", "other"})
	s = awaitImports(t, states, "the new namespace's import", func(s ImportState) bool { return len(s.Imports) == 3 })
	// An import goes: it is removed, and deletable.
	src.remove(registry.ServiceKey{Namespace: "default", Name: "api"})
	s = awaitImports(t, states, "the removal", func(s ImportState) bool { return len(s.Imports) == 2 })
	if !s.Deletable(registry.ServiceKey{Namespace: "default", Name: "api"}) || s.Deletable(registry.ServiceKey{Namespace: "default", Name: "web"}) {
		t.Errorf("deletable after the removal: api %v, web %v", s.Deletable(registry.ServiceKey{Namespace: "default", Name: "api"}),
			s.Deletable(registry.ServiceKey{Namespace: "default", Name: "web"}))
	}

	// The hub shows what the spoke acknowledged and wrote.
	st := awaitImportStatus(t, h, "acked", func(st ImportStatus) bool { return st.AckedVersion == s.Version && st.Pending == 0 })
	if st.Written() || st.Imports != 2 || st.Acked != 2 || !st.Authoritative || st.Namespaces != 2 {
		t.Errorf("status before the write: %+v", st)
	}
	pub.ImportsWritten(s.Epoch, s.Version)
	awaitImportStatus(t, h, "written", ImportStatus.Written)
}

func TestImportFullStateIsChunkedAndAppliedOnce(t *testing.T) {
	var imps []*imports.Import
	for i := range 50 {
		imps = append(imps, testImport("default", "svc-"+string(rune('a'+i%26))+string(rune('a'+i/26)), "10.0.0.1", "10.0.0.2"))
	}
	src := newImportSource(true, imps...)
	cfg := DefaultHubConfig()
	cfg.MaxMessageBytes = 1024 // a few imports a chunk
	h := startHub(t, cfg)
	h.srv.ServeImports(src)
	_, _, states := importSpoke(t, h, "default")
	first := awaitImports(t, states, "the full state", func(ImportState) bool { return true })
	if len(first.Imports) != 50 {
		t.Fatalf("the first state the writer saw has %d imports, want all 50 at once", len(first.Imports))
	}
}

// A full state that is not authoritative (the hub has not heard from every
// cluster it knows) adds and updates, and deletes nothing; the next
// authoritative one may delete.
func TestNonAuthoritativeFullStateDeletesNothing(t *testing.T) {
	src := newImportSource(true, testImport("default", "old", "10.0.0.1"))
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(src)
	p, _, states := importSpoke(t, h, "default")
	awaitImports(t, states, "the first hub's state", func(s ImportState) bool { return len(s.Imports) == 1 })

	// The spoke moves to a hub that knows less (a cold start).
	p.stop()
	h2 := startHub(t, DefaultHubConfig())
	cold := newImportSource(false, testImport("default", "new", "10.0.0.2"))
	h2.srv.ServeImports(cold)
	// The same publisher (it keeps its imports across sessions) connects to the second hub.
	restartPublisher(t, p, h2)
	s := awaitImports(t, states, "the cold hub's state", func(s ImportState) bool { return len(s.Imports) == 2 })
	old := registry.ServiceKey{Namespace: "default", Name: "old"}
	if s.Authoritative || s.Deletable(old) {
		t.Fatalf("after a non-authoritative full state: %v authoritative=%v deletable(old)=%v", keysOf(s), s.Authoritative, s.Deletable(old))
	}
	// The hub hears from every cluster: an authoritative full state follows.
	cold.setAuthoritative(true)
	s = awaitImports(t, states, "the authoritative state", func(s ImportState) bool { return s.Authoritative })
	if got := keysOf(s); !slices.Equal(got, []string{"default/new"}) || !s.Deletable(old) {
		t.Errorf("after the authoritative full state: %v deletable(old)=%v", got, s.Deletable(old))
	}
}

// restartPublisher runs a stopped publisher again, against another hub.
func restartPublisher(t *testing.T, p *publisher, h *testHub) {
	t.Helper()
	p.pub.client = fedv1.NewFederationClient(dial(t, h.addr, testTokens["east"]))
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan struct{})
	go func() { defer close(p.done); _ = p.pub.Run(ctx, p.src) }()
	p.states <- State{}
}

// An import the spoke cannot take is refused by name; the others flow, and
// the refused form is not sent again until it changes.
func TestRefusedImportIsNotResent(t *testing.T) {
	bad := testImport("default", "bad", "10.0.0.1")
	bad.Sources[0].Cluster = "Not_A_Label"
	src := newImportSource(true, testImport("default", "good", "10.0.0.2"), bad)
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(src)
	_, _, states := importSpoke(t, h, "default")
	s := awaitImports(t, states, "the good import", func(s ImportState) bool { return len(s.Imports) == 1 })
	if keysOf(s)[0] != "default/good" {
		t.Fatalf("imports: %v", keysOf(s))
	}
	// Refused, and the full state sent again without it acknowledged.
	st := awaitImportStatus(t, h, "refused", func(st ImportStatus) bool {
		return len(st.Refused) == 1 && st.Pending == 1 && st.AckedVersion == st.SentVersion
	})
	sent := st.SentVersion
	src.put(testImport("default", "good", "10.0.0.2", "10.0.0.3"))
	awaitImports(t, states, "the next delta", func(s ImportState) bool {
		return len(s.Imports[registry.ServiceKey{Namespace: "default", Name: "good"}].Sources[0].Endpoints) == 2
	})
	// The spoke may apply the update before the hub records sending it.
	st = awaitImportStatus(t, h, "the update acknowledged", func(st ImportStatus) bool { return st.AckedVersion > sent })
	if st.SentVersion != sent+1 || len(st.Refused) != 1 {
		t.Errorf("after one more change: %+v, want exactly one more update (after %d) and the refusal kept", st, sent)
	}
	// Fixed, it flows.
	fixed := testImport("default", "bad", "10.0.0.1")
	src.put(fixed)
	awaitImports(t, states, "the fixed import", func(s ImportState) bool { return len(s.Imports) == 2 })
	awaitImportStatus(t, h, "without refusals", func(st ImportStatus) bool { return len(st.Refused) == 0 && st.Pending == 0 })
}

func manyImports(n int, prefix string) []*imports.Import {
	var out []*imports.Import
	for i := range n {
		out = append(out, testImport("default", fmt.Sprintf("%s-%03d", prefix, i), "10.0.0.1", "10.0.0.2"))
	}
	return out
}

// A delta larger than one message travels in chunks of one version, applied together.
func TestImportDeltaLargerThanOneMessage(t *testing.T) {
	src := newImportSource(true, testImport("default", "first", "10.0.0.1"))
	cfg := DefaultHubConfig()
	cfg.MaxMessageBytes = 1024
	h := startHub(t, cfg)
	h.srv.ServeImports(src)
	_, _, states := importSpoke(t, h, "default")
	first := awaitImports(t, states, "the first import", func(s ImportState) bool { return len(s.Imports) == 1 })
	src.put(manyImports(50, "d")...)
	last := awaitImports(t, states, "the delta", func(s ImportState) bool { return len(s.Imports) > 1 })
	if len(last.Imports) != 51 || last.Epoch != first.Epoch {
		t.Errorf("after a chunked delta: %d imports, epoch %d -> %d; want all 51 at once in the same session", len(last.Imports), first.Epoch, last.Epoch)
	}
}

// A refusal in the middle of a chunked full state drops that full state
// whole; the hub sends it again without the refused import, in the same session.
func TestImportRefusalInTheMiddleOfAFullState(t *testing.T) {
	imps := manyImports(50, "f")
	imps[25].Sources[0].Cluster = "Not_A_Label"
	src := newImportSource(true, imps...)
	cfg := DefaultHubConfig()
	cfg.MaxMessageBytes = 1024
	h := startHub(t, cfg)
	h.srv.ServeImports(src)
	_, _, states := importSpoke(t, h, "default")
	s := awaitImports(t, states, "the full state without the refused import", func(ImportState) bool { return true })
	if len(s.Imports) != 49 || s.Epoch != 1 || s.Imports[imps[25].Service] != nil {
		t.Fatalf("first state: %d imports at epoch %d, want the 49 good ones in the first session", len(s.Imports), s.Epoch)
	}
	if st := awaitImportStatus(t, h, "refused", func(st ImportStatus) bool { return len(st.Refused) == 1 }); st.Epoch != 1 {
		t.Errorf("status %+v, want the first session", st)
	}
}

// A new hub that is not authoritative and whose first full state the spoke
// refuses deletes nothing: the earlier hub's authority does not carry over.
func TestImportRefusedFirstFullStateOfAColdHubDeletesNothing(t *testing.T) {
	src := newImportSource(true, testImport("default", "old", "10.0.0.1"))
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(src)
	p, _, states := importSpoke(t, h, "default")
	awaitImports(t, states, "the first hub's state", func(s ImportState) bool { return len(s.Imports) == 1 && s.Authoritative })
	p.stop()
	bad := testImport("default", "bad", "10.0.0.1")
	bad.Sources[0].Cluster = "Not_A_Label"
	h2 := startHub(t, DefaultHubConfig())
	h2.srv.ServeImports(newImportSource(false, testImport("default", "new", "10.0.0.2"), bad))
	restartPublisher(t, p, h2)
	s := awaitImports(t, states, "the cold hub's state", func(s ImportState) bool {
		return s.Imports[registry.ServiceKey{Namespace: "default", Name: "new"}] != nil
	})
	old := registry.ServiceKey{Namespace: "default", Name: "old"}
	if s.Authoritative || s.Deletable(old) {
		t.Errorf("from a cold hub: authoritative=%v deletable(old)=%v imports=%v", s.Authoritative, s.Deletable(old), keysOf(s))
	}
}

// An import the spoke holds, whose new form it refuses, survives an
// authoritative full state that cannot name it (retain).
func TestImportRefusedFormIsRetained(t *testing.T) {
	src := newImportSource(true, testImport("default", "k", "10.0.0.1"), testImport("default", "other", "10.0.0.3"))
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(src)
	p, _, states := importSpoke(t, h, "default")
	awaitImports(t, states, "the first hub's state", func(s ImportState) bool { return len(s.Imports) == 2 && s.Authoritative })
	p.stop()
	bad := testImport("default", "k", "10.0.0.1", "10.0.0.2")
	bad.Sources[0].Cluster = "Not_A_Label"
	h2 := startHub(t, DefaultHubConfig())
	h2.srv.ServeImports(newImportSource(true, bad, testImport("default", "other", "10.0.0.4")))
	restartPublisher(t, p, h2)
	s := awaitImports(t, states, "the second hub's state", func(s ImportState) bool {
		o := s.Imports[registry.ServiceKey{Namespace: "default", Name: "other"}]
		return o != nil && o.Sources[0].Endpoints[0].Addresses[0].String() == "10.0.0.4"
	})
	k := registry.ServiceKey{Namespace: "default", Name: "k"}
	if !s.Authoritative || s.Deletable(k) || !s.Imports[k].Equal(testImport("default", "k", "10.0.0.1")) {
		t.Errorf("the refused import: authoritative=%v deletable=%v held=%+v; want the last good form kept", s.Authoritative, s.Deletable(k), s.Imports[k])
	}
}

// Both ends send a long chunked state at once, the spoke its shards and the
// hub its imports: neither stops reading while it sends, so both arrive.
func TestBothEndsSendLargeStatesAtOnce(t *testing.T) {
	var imps []*imports.Import
	for i := range 4000 {
		imps = append(imps, testImport("default", fmt.Sprintf("imp-%04d", i), "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"))
	}
	cfg := DefaultHubConfig()
	cfg.MaxMessageBytes = 16 << 10
	h := startHub(t, cfg)
	h.srv.ServeImports(newImportSource(true, imps...))
	states := make(chan ImportState, 10)
	scfg := fastSpoke()
	scfg.OnImports = func(s ImportState) { states <- s }
	p := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", scfg)
	p.pub.SetNamespaces([]string{"default"})
	st := State{}
	for i := range 4000 {
		s := testShard("east", fmt.Sprintf("exp-%04d", i), "10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4")
		st[s.Service] = s
	}
	p.states <- st
	awaitImports(t, states, "4,000 imports", func(s ImportState) bool { return len(s.Imports) == 4000 })
	p.awaitAcked(t, 4000)
}

// An import larger than the hub's chunk budget travels whole.
func TestImportLargerThanTheChunkBudget(t *testing.T) {
	big := testImport("default", "big")
	big.Sources = nil
	for c := range 12 {
		src := imports.Source{Cluster: registry.ClusterID(fmt.Sprintf("c%02d", c)), Ports: testImport("default", "x").Sources[0].Ports}
		for i := range 9000 {
			src.Endpoints = append(src.Endpoints, imports.Endpoint{
				Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(c), byte(i >> 8), byte(i)})},
				Ports:     []registry.EndpointPort{{Name: "grpc", Port: 9090}},
				Hostname:  fmt.Sprintf("pod-%05d", i), Zone: "zone-a", Conditions: registry.Conditions{Ready: true, Serving: true},
			})
		}
		big.Sources = append(big.Sources, src)
	}
	if n := proto.Size(ImportToProto(big)); n <= DefaultHubConfig().MaxMessageBytes || n > MaxImportMessageBytes {
		t.Fatalf("the import is %d bytes; the test wants more than the chunk budget", n)
	}
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(newImportSource(true, big))
	_, _, states := importSpoke(t, h, "default")
	s := awaitImports(t, states, "the big import", func(s ImportState) bool { return len(s.Imports) == 1 })
	if got := s.Imports[big.Service]; len(got.Sources) != 12 || len(got.Sources[11].Endpoints) != 9000 {
		t.Errorf("the big import arrived with %d sources", len(got.Sources))
	}
}

// A spoke that restarted (it holds nothing in memory) keeps an import whose
// new form it refuses: retained, it is not deletable under an authoritative
// full state; once the hub removes the service, it is.
func TestRetainedImportIsKeptThenRemoved(t *testing.T) {
	bad := testImport("default", "k", "10.0.0.1", "10.0.0.2")
	bad.Sources[0].Cluster = "Not_A_Label"
	src := newImportSource(true, bad, testImport("default", "other", "10.0.0.4"))
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(src)
	_, _, states := importSpoke(t, h, "default")
	k, other := registry.ServiceKey{Namespace: "default", Name: "k"}, registry.ServiceKey{Namespace: "default", Name: "other"}
	s := awaitImports(t, states, "the authoritative state", func(s ImportState) bool { return s.Imports[other] != nil && s.Authoritative })
	if s.Deletable(k) || !s.Retained[k] {
		t.Fatalf("a refused import the cluster may hold is deletable (retained=%v)", s.Retained[k])
	}
	src.remove(k)
	s = awaitImports(t, states, "k removed", func(s ImportState) bool { return s.Removed[k] })
	if !s.Deletable(k) || s.Retained[k] {
		t.Errorf("removed at the hub, k is still kept: deletable=%v retained=%v", s.Deletable(k), s.Retained[k])
	}
	awaitImportStatus(t, h, "without the refusal of a service that is gone", func(st ImportStatus) bool {
		return len(st.Refused) == 0 && st.Pending == 0
	})
}
