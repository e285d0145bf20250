package federation

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/navemesh/nave/exportpolicy"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/registry"
)

// policyHub is a hub whose export policy a test swaps.
func policyHub(t *testing.T, yaml string) (*testHub, *atomic.Pointer[exportpolicy.Policy]) {
	t.Helper()
	var policy atomic.Pointer[exportpolicy.Policy]
	setPolicy(t, &policy, yaml)
	allowed := func(c registry.ClusterID, ns string) bool { return policy.Load().Allows(c, ns) }
	return startWiredHub(t, DefaultHubConfig(), HubWiring{ExportAllowed: allowed}), &policy
}

func setPolicy(t *testing.T, p *atomic.Pointer[exportpolicy.Policy], yaml string) {
	t.Helper()
	parsed, err := exportpolicy.Parse("test", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	p.Store(parsed)
}

func inNamespace(s *registry.Shard, ns string) *registry.Shard {
	s.Service.Namespace = ns
	return s
}

// shardsOf returns the clusters whose shards the hub merges into k.
func shardsOf(h *testHub, k registry.ServiceKey) []registry.ClusterID {
	svc := h.store.registry().Service(k)
	if svc == nil {
		return nil
	}
	var out []registry.ClusterID
	for _, sh := range svc.Shards {
		out = append(out, sh.Cluster)
	}
	return out
}

const eastDemoWestSandbox = `
rules:
- cluster: east
  namespaces: [demo]
- cluster: west
  namespaces: [sandbox*]
`

// A hostile cluster's export of demo/echo, which the policy does not let it
// export, is NACKed with ExportNotPermitted and never reaches the registry,
// while the honest cluster's export of the same service and the hostile
// cluster's permitted exports are untouched.
func TestExportPolicyRefusesAnExportOutsideTheClustersNamespaces(t *testing.T) {
	h, _ := policyHub(t, eastDemoWestSandbox)
	east := startPublisher(t, dial(t, h.addr, testTokens["east"]), "east", fastSpoke())
	honest := inNamespace(testShard("east", "echo", "10.0.0.1"), "demo")
	east.states <- stateOf(honest)
	east.awaitAcked(t, 1)

	cfg := fastSpoke()
	reports := reportsOf(&cfg)
	west := startPublisher(t, dial(t, h.addr, testTokens["west"]), "west", cfg)
	hostile := inNamespace(testShard("west", "echo", "10.9.9.9"), "demo")
	sandbox := inNamespace(testShard("west", "echo", "10.9.9.8"), "sandbox-1")
	west.states <- stateOf(hostile, sandbox)
	got := awaitReports(t, reports, "the refusal", func(r Reports) bool { return r[hostile.Service].Refused != "" })
	if reason := got[hostile.Service].Refused; !strings.HasPrefix(reason, "ExportNotPermitted: ") {
		t.Errorf("refusal %q does not begin with ExportNotPermitted", reason)
	}
	west.awaitAcked(t, 1) // the rest of the update applies
	if c := shardsOf(h, sandbox.Service); len(c) != 1 || c[0] != "west" {
		t.Fatalf("sandbox-1/echo is held from %v, want west", c)
	}
	if c := shardsOf(h, honest.Service); len(c) != 1 || c[0] != "east" {
		t.Fatalf("demo/echo is held from %v, want east alone", c)
	}
	if r := h.srv.RefusedExports(); len(r["west"]) != 1 || r["west"][hostile.Service] == "" || len(r["east"]) != 0 {
		t.Errorf("refused exports %v, want west's demo/echo", r)
	}

	// A later form of it is not sent (the policy is about its namespace), and
	// holds no form at the hub, while a new permitted export flows.
	moved := inNamespace(testShard("west", "echo", "10.9.9.7"), "demo")
	more := inNamespace(testShard("west", "more", "10.9.9.6"), "sandbox-2")
	west.states <- stateOf(moved, sandbox, more)
	west.awaitAcked(t, 2)
	if c := shardsOf(h, honest.Service); len(c) != 1 || c[0] != "east" {
		t.Fatalf("demo/echo is held from %v, want east alone", c)
	}
}

// A raw session sees the NACK name the refused service, and its retain of
// it hold nothing.
func TestExportPolicyNacksPerService(t *testing.T) {
	h, _ := policyHub(t, eastDemoWestSandbox)
	stream, _ := rawSession(t, dial(t, h.addr, testTokens["west"]), "west")
	hostile := inNamespace(testShard("west", "echo", "10.9.9.9"), "demo")
	m := sendUpdate(t, stream, &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true,
		Upserts: []*fedv1.Shard{ShardToProto(hostile)}})
	rj := m.GetNack().GetRejections()
	if len(rj) != 1 || KeyFromProto(rj[0].GetService()) != hostile.Service || !strings.HasPrefix(rj[0].GetReason(), "ExportNotPermitted:") {
		t.Fatalf("answer %v, want a NACK of demo/echo, ExportNotPermitted", m)
	}
	if m := sendUpdate(t, stream, &fedv1.Update{Nonce: "2", Version: 2, FullState: true, LastChunk: true,
		Retain: []*fedv1.ServiceKey{KeyToProto(hostile.Service)}}); m.GetAck() == nil {
		t.Fatalf("answer %v to a full state retaining it, want an ACK", m)
	}
	if c := shardsOf(h, hostile.Service); len(c) != 0 {
		t.Fatalf("demo/echo is held from %v", c)
	}
}

// A policy that newly forbids an export removes it once the hub asks the
// spoke for a resync; one that permits it again lets it in.
func TestExportPolicyReloadForbidsThenPermits(t *testing.T) {
	h, policy := policyHub(t, `rules: [{cluster: "*", namespaces: ["*"]}]`)
	cfg := fastSpoke()
	reports := reportsOf(&cfg)
	west := startPublisher(t, dial(t, h.addr, testTokens["west"]), "west", cfg)
	echo := inNamespace(testShard("west", "echo", "10.9.9.9"), "demo")
	other := inNamespace(testShard("west", "other", "10.9.9.8"), "sandbox")
	west.states <- stateOf(echo, other)
	west.awaitAcked(t, 2)

	setPolicy(t, policy, eastDemoWestSandbox)
	h.srv.Resync(func(c registry.ClusterID) bool { return c == "west" }, "the export policy changed")
	waitFor(t, func() bool { return len(shardsOf(h, echo.Service)) == 0 })
	awaitReports(t, reports, "the refusal", func(r Reports) bool {
		return strings.HasPrefix(r[echo.Service].Refused, "ExportNotPermitted:")
	})
	if len(shardsOf(h, other.Service)) != 1 {
		t.Fatal("the permitted export went too")
	}

	setPolicy(t, policy, `rules: [{cluster: west, namespaces: [demo, sandbox]}]`)
	h.srv.Resync(func(c registry.ClusterID) bool { return c == "west" }, "the export policy changed")
	waitFor(t, func() bool { return len(shardsOf(h, echo.Service)) == 1 })
	awaitReports(t, reports, "no refusal", func(r Reports) bool { return len(r) == 0 })
	waitFor(t, func() bool { return len(h.srv.RefusedExports()) == 0 })
}
