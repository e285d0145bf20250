package exportpolicy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/navemesh/nave/registry"
)

const example = `
rules:
- cluster: hostile
  namespaces: [sandbox]
- cluster: east
  namespaces: [demo, team-*]
- cluster: prod-*
  namespaces: ["*"]
`

func TestAllows(t *testing.T) {
	p, err := Parse("example", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cluster, namespace string
		want               bool
	}{
		{"hostile", "sandbox", true},
		{"hostile", "demo", false}, // the first matching rule applies, even where a later one would allow
		{"east", "demo", true},
		{"east", "team-a", true},
		{"east", "team-", true},
		{"east", "team", false},
		{"east", "demo2", false},
		{"prod-1", "anything", true},
		{"prod", "demo", false},
		{"west", "demo", false}, // no rule: nowhere
	} {
		if got := p.Allows(registry.ClusterID(tc.cluster), tc.namespace); got != tc.want {
			t.Errorf("Allows(%s, %s) = %v, want %v", tc.cluster, tc.namespace, got, tc.want)
		}
	}
	var none *Policy
	if !none.Allows("anyone", "anywhere") {
		t.Error("no policy must allow every export")
	}
	empty, err := Parse("empty", []byte("rules: []"))
	if err != nil || empty.Allows("east", "demo") {
		t.Errorf("rules: [] must allow nothing (err %v)", err)
	}
	wild, _ := Parse("wild", []byte("rules: [{cluster: '*', namespaces: [demo]}]"))
	if !wild.Allows("anyone", "demo") || wild.Allows("anyone", "other") {
		t.Error("cluster * must match every cluster")
	}
}

func TestSame(t *testing.T) {
	p, _ := Parse("p", []byte(example))
	q, _ := Parse("q", []byte("rules: [{cluster: east, namespaces: [demo, team-*]}, {cluster: '*', namespaces: ['*']}]"))
	for _, tc := range []struct {
		a, b    *Policy
		cluster registry.ClusterID
		want    bool
	}{
		{p, q, "east", true},
		{p, q, "hostile", false},
		{p, q, "west", false},
		{nil, q, "west", true}, // no policy grants "*", as q's last rule does
		{nil, p, "east", false},
		{nil, nil, "east", true},
	} {
		if got := tc.a.Same(tc.b, tc.cluster); got != tc.want {
			t.Errorf("Same for %s = %v, want %v", tc.cluster, got, tc.want)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for name, raw := range map[string]string{
		"no rules":        "other: 1\n",
		"rules null":      "rules:\n",
		"unknown field":   "rules: [{cluster: east, namespaces: [demo], identity: x}]",
		"no namespace":    "rules: [{cluster: east}]",
		"empty cluster":   "rules: [{cluster: '', namespaces: [demo]}]",
		"inner star":      "rules: [{cluster: 'a*b', namespaces: [demo]}]",
		"empty namespace": "rules: [{cluster: east, namespaces: ['']}]",
		"not yaml":        "rules: [",
	} {
		if _, err := Parse(name, []byte(raw)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "export-policy.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("an empty file opened: %v", err)
	}
	write(example)
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Policy().Allows("hostile", "demo") {
		t.Fatal("hostile may export into demo")
	}
	for _, bad := range []string{"", "   \n", "rules: [", "other: 1"} {
		write(bad)
		if changed, err := f.Reload(); err == nil || changed {
			t.Errorf("reload of %q: changed %v, err %v", bad, changed, err)
		}
		if f.Policy().Allows("hostile", "demo") || !f.Policy().Allows("east", "demo") {
			t.Errorf("a version that does not load (%q) changed the policy", bad)
		}
	}
	write("rules: [{cluster: '*', namespaces: ['*']}]")
	if changed, err := f.Reload(); err != nil || !changed {
		t.Fatalf("reload: changed %v, err %v", changed, err)
	}
	if !f.Policy().Allows("hostile", "demo") {
		t.Error("the reloaded policy does not apply")
	}
	if changed, err := f.Reload(); err != nil || changed {
		t.Errorf("reload of the same file: changed %v, err %v", changed, err)
	}
}
