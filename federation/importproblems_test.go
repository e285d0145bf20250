package federation

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// A spoke's report of imports blocked by a user's own objects reaches the
// hub's import status: the cluster is not written while one is blocked, and
// written again once the set is empty. Problems of imports the cluster
// does not hold are not kept.
func TestImportProblemsReachTheHub(t *testing.T) {
	src := newImportSource(true, testImport("default", "web", "10.0.0.1"), testImport("default", "api", "10.0.0.2"),
		testImport("other", "db", "10.0.0.3"))
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(src)
	_, pub, states := importSpoke(t, h, "default")
	s := awaitImports(t, states, "the full state", func(s ImportState) bool { return len(s.Imports) == 2 })
	pub.ImportsWritten(s.Epoch, s.Version)
	awaitImportStatus(t, h, "written", ImportStatus.Written)

	web := registry.ServiceKey{Namespace: "default", Name: "web"}
	blocked := ImportProblem{Service: web, Reason: ReasonBlockedByService,
		Message: "Service derived-abc exists and is not managed by Nave (no label app.kubernetes.io/managed-by=nave)"}
	pub.ImportProblems([]ImportProblem{
		{Service: registry.ServiceKey{Namespace: "other", Name: "db"}, Reason: ReasonBlockedByServiceImport, Message: "not this cluster's"},
		blocked,
	})
	st := awaitImportStatus(t, h, "blocked", func(st ImportStatus) bool { return st.BlockedCount > 0 })
	if st.Written() || st.BlockedCount != 1 || !slices.Equal(st.Blocked, []ImportProblem{blocked}) {
		t.Errorf("status with web blocked: written=%v %d blocked: %+v", st.Written(), st.BlockedCount, st.Blocked)
	}

	// The user's object goes; the writer writes the import and reports an empty set.
	pub.ImportProblems(nil)
	st = awaitImportStatus(t, h, "written again", ImportStatus.Written)
	if st.BlockedCount != 0 || len(st.Blocked) != 0 {
		t.Errorf("status after the problem cleared: %+v", st)
	}
}

// A spoke sends no ImportProblems to a hub that does not announce
// "import-problems" (an older hub, which would end the session on one).
func TestImportProblemsNotSentToAnOlderHub(t *testing.T) {
	old := &olderHub{got: make(chan *fedv1.SpokeMessage, 100), send: make(chan *fedv1.HubMessage, 10)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	fedv1.RegisterFederationServer(g, old)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)

	cfg := fastSpoke()
	states := make(chan ImportState, 10)
	cfg.OnImports = func(s ImportState) { states <- s }
	p := startPublisher(t, dial(t, lis.Addr().String(), ""), "east", cfg)
	p.pub.SetNamespaces([]string{"default"})
	p.states <- State{}
	// The problems are known before the hub's imports arrive; each import
	// update's ack comes after them, had they been sent.
	p.pub.ImportProblems([]ImportProblem{{Service: registry.ServiceKey{Namespace: "default", Name: "web"}, Reason: ReasonBlockedByService}})
	for v := uint64(1); v <= 2; v++ {
		old.send <- &fedv1.HubMessage{Kind: &fedv1.HubMessage_Imports{Imports: &fedv1.ImportUpdate{
			Version: v, Nonce: fmt.Sprintf("import-%d", v), FullState: v == 1, LastChunk: true,
			Upserts: []*fedv1.Import{ImportToProto(testImport("default", fmt.Sprintf("svc%d", v), "10.0.0.1"))}}}}
		timeout := time.After(10 * time.Second)
	await:
		for {
			select {
			case m := <-old.got:
				switch k := m.GetKind().(type) {
				case *fedv1.SpokeMessage_ImportProblems:
					t.Fatalf("the spoke sent %v to a hub without the capability", k)
				case *fedv1.SpokeMessage_ImportAck:
					if k.ImportAck.GetVersion() == v {
						break await
					}
				}
			case <-timeout:
				t.Fatalf("import update %d never acknowledged", v)
			}
		}
	}
}

// olderHub welcomes a session without the "import-problems" capability,
// sends what it is given and records what the spoke sends.
type olderHub struct {
	fedv1.UnimplementedFederationServer
	got  chan *fedv1.SpokeMessage
	send chan *fedv1.HubMessage
}

func (o *olderHub) Publish(stream fedv1.Federation_PublishServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Welcome{Welcome: &fedv1.Welcome{
		Epoch: 1, MaxMessageBytes: 1 << 20, Capabilities: []string{CapabilityGateways}}}}); err != nil {
		return err
	}
	go func() {
		for {
			select {
			case m := <-o.send:
				if stream.Send(m) != nil {
					return
				}
			case <-stream.Context().Done():
				return
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		o.got <- m
	}
}

// The hub announces "import-problems" only when it serves imports, and
// ends a session whose ImportProblems come without the import stream or
// are out of bounds.
func TestImportProblemsAreChecked(t *testing.T) {
	plain := startHub(t, DefaultHubConfig())
	if _, w := rawSession(t, dial(t, plain.addr, testTokens["east"]), "east"); slices.Contains(w.GetCapabilities(), CapabilityImportProblems) {
		t.Errorf("a hub serving no imports announces %v", w.GetCapabilities())
	}
	h := startHub(t, DefaultHubConfig())
	h.srv.ServeImports(newImportSource(true, testImport("default", "web", "10.0.0.1")))
	key := func(ns, name string) *fedv1.ServiceKey { return &fedv1.ServiceKey{Namespace: ns, Name: name} }
	problem := func(k *fedv1.ServiceKey, reason string) *fedv1.ImportProblem {
		return &fedv1.ImportProblem{Service: k, Reason: reason}
	}
	var many []*fedv1.ImportProblem
	for i := range MaxImportProblems + 1 {
		many = append(many, problem(key("default", "s"+strings.Repeat("a", i/26)+string(rune('a'+i%26))), "X"))
	}
	for _, tc := range []struct {
		name     string
		imports  bool
		problems []*fedv1.ImportProblem
		want     string
	}{
		{"without the import stream", false, []*fedv1.ImportProblem{problem(key("default", "web"), "X")}, "capability"},
		{"invalid service", true, []*fedv1.ImportProblem{problem(key("default", "Web!"), "X")}, "DNS-1035"},
		{"no service", true, []*fedv1.ImportProblem{problem(nil, "X")}, "DNS label"},
		{"unsorted", true, []*fedv1.ImportProblem{problem(key("default", "web"), "X"), problem(key("default", "api"), "X")}, "sorted"},
		{"duplicate", true, []*fedv1.ImportProblem{problem(key("default", "web"), "X"), problem(key("default", "web"), "Y")}, "sorted"},
		{"no reason", true, []*fedv1.ImportProblem{problem(key("default", "web"), "")}, "reason"},
		{"long reason", true, []*fedv1.ImportProblem{problem(key("default", "web"), strings.Repeat("R", 65))}, "reason"},
		{"too many", true, many, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hello := &fedv1.Hello{ClusterId: "east"}
			if tc.imports {
				hello.Capabilities, hello.Namespaces = []string{CapabilityImports}, []string{"default"}
			}
			stream, w, err := helloWith(t, h, hello)
			if err != nil || w == nil {
				t.Fatalf("no welcome: %v", err)
			}
			if !slices.Contains(w.GetCapabilities(), CapabilityImportProblems) {
				t.Errorf("welcome capabilities %v", w.GetCapabilities())
			}
			if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportProblems{
				ImportProblems: &fedv1.ImportProblems{Problems: tc.problems}}}); err != nil {
				t.Fatal(err)
			}
			for {
				_, err := stream.Recv()
				if err == nil {
					continue // the imports the hub sends
				}
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("session ended with %v, want InvalidArgument saying %q", err, tc.want)
				}
				return
			}
		})
	}
}

// helloWith opens a session of cluster east at h with hello.
func helloWith(t *testing.T, h *testHub, m *fedv1.Hello) (fedv1.Federation_PublishClient, *fedv1.Welcome, error) {
	return hello(t, dial(t, h.addr, testTokens["east"]), m)
}

// A problem set is bounded on the wire: at most MaxImportProblems (the rest
// counted), reasons and messages cut to their bounds, valid for the hub.
func TestImportProblemsToProtoIsBounded(t *testing.T) {
	var ps []ImportProblem
	for i := range MaxImportProblems + 5 {
		ps = append(ps, ImportProblem{Service: registry.ServiceKey{Namespace: "default", Name: "s" + strings.Repeat("a", i/26) + string(rune('a'+i%26))},
			Reason: strings.Repeat("R", 100), Message: strings.Repeat("é", 300)})
	}
	slices.SortFunc(ps, func(a, b ImportProblem) int { return a.Service.Compare(b.Service) })
	m := importProblemsToProto(ps)
	if len(m.GetProblems()) != MaxImportProblems || m.GetOmitted() != 5 {
		t.Fatalf("%d problems, %d omitted", len(m.GetProblems()), m.GetOmitted())
	}
	got, err := importProblemsFromProto(m)
	if err != nil {
		t.Fatal(err)
	}
	if p := got[0]; len(p.Reason) != maxProblemReasonBytes || len(p.Message) > 256 || strings.ContainsRune(p.Message, '\uFFFD') {
		t.Errorf("first problem: reason %d bytes, message %d bytes", len(p.Reason), len(p.Message))
	}
}
