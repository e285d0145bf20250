package hub_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/registry"
)

// The export policy at a real hub: a hostile cluster's export of a service
// into a namespace the policy does not grant it is NACKed and never reaches
// the registry, while the honest cluster's export of it is untouched; a
// reload that forbids removes a held export even from a spoke that ignores
// the resync asked of it; a reload that permits lets it in.
func TestExportPolicyAtTheHub(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "export-policy.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(policy, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`rules: [{cluster: "*", namespaces: ["*"]}]`)
	h, _ := startHub(t, t.TempDir(), func(c *hub.Config) { c.ExportPolicyFile = policy })
	echo := registry.ServiceKey{Namespace: "default", Name: "echo"}
	clustersOf := func() []registry.ClusterID {
		var out []registry.ClusterID
		if svc := h.View().Registry.Service(echo); svc != nil {
			for _, sh := range svc.Shards {
				out = append(out, sh.Cluster)
			}
		}
		return out
	}
	send := func(stream fedv1.Federation_PublishClient, version uint64) *fedv1.HubMessage {
		t.Helper()
		u := &fedv1.Update{Nonce: fmt.Sprint(version), Version: version, Upserts: []*fedv1.Shard{shard("echo")}}
		if err := stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if m.GetResync() == nil && m.GetConflicts() == nil {
				return m
			}
		}
	}
	east, _ := session(t, h, "east")
	west, _ := session(t, h, "west")
	if m := send(east, 2); m.GetAck() == nil {
		t.Fatalf("east's export answered %v", m)
	}
	if m := send(west, 2); m.GetAck() == nil {
		t.Fatalf("west's export (every cluster everywhere) answered %v", m)
	}
	awaitCond(t, "both exports held", 5*time.Second, func() bool { return len(clustersOf()) == 2 })

	// west may now export into sandbox only. Its session ignores the resync
	// the hub asks for: the hub drops its export all the same.
	write("rules:\n- cluster: east\n  namespaces: [default]\n- cluster: west\n  namespaces: [sandbox]\n")
	awaitCond(t, "west's export removed", 5*time.Second, func() bool {
		c := clustersOf()
		return len(c) == 1 && c[0] == "east"
	})
	m := send(west, 3)
	if rj := m.GetNack().GetRejections(); len(rj) != 1 || !strings.HasPrefix(rj[0].GetReason(), "ExportNotPermitted: ") {
		t.Fatalf("west's export answered %v, want ExportNotPermitted", m)
	}
	if c := clustersOf(); len(c) != 1 || c[0] != "east" {
		t.Fatalf("default/echo is held from %v, want east alone", c)
	}
	_, body := get(t, "http://"+h.AdminAddr.String()+"/debug/clusters")
	var clusters []adminapi.ClusterStatus
	if err := json.Unmarshal([]byte(body), &clusters); err != nil {
		t.Fatal(err)
	}
	for _, c := range clusters {
		if reason := c.RefusedExports["default/echo"]; (c.Cluster == "west") != strings.HasPrefix(reason, "ExportNotPermitted") {
			t.Errorf("/debug/clusters: %s refused %v", c.Cluster, c.RefusedExports)
		}
	}

	// A version that does not load changes nothing (this one would permit
	// west, were its unknown field taken for nothing); one that permits lets it in.
	write(`rules: [{cluster: "*", namespaces: [default]}]` + "\nunknown: field\n")
	time.Sleep(3 * time.Second) // a few reload ticks (one a second): the refusal below checks nothing if none came
	if m := send(west, 4); m.GetNack() == nil {
		t.Fatalf("west's export under a policy that did not load answered %v", m)
	}
	write(`rules: [{cluster: "*", namespaces: [default]}]`)
	version := uint64(4)
	awaitCond(t, "west's export permitted", 5*time.Second, func() bool { version++; return send(west, version).GetAck() != nil })
	if len(clustersOf()) != 2 {
		t.Fatalf("default/echo is held from %v, want east and west", clustersOf())
	}
}
