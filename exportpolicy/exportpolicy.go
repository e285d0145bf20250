// Package exportpolicy says which clusters may export services into which
// namespaces: the hub refuses any other export (issue 24). It is pure (parse,
// match) but for File, which reads a policy file again when it changes.
package exportpolicy

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/internal/watched"
	"github.com/navemesh/nave/registry"
)

// ReasonNotPermitted begins the reason of every export the policy refuses,
// as the hub NACKs it and the spoke reports it on its ServiceExport.
const ReasonNotPermitted = "ExportNotPermitted"

// Policy says where each cluster may export. The first rule whose cluster
// matches applies; a cluster no rule matches may export nowhere. A nil
// *Policy allows every export (no policy file: every cluster of the
// clusterset is trusted, KEP-1645's namespace sameness).
type Policy struct {
	Rules []Rule `json:"rules"`
}

// Rule lets the clusters it matches export into Namespaces.
type Rule struct {
	// Cluster is a cluster ID, a prefix of one ending in "*", or "*" (any).
	Cluster string `json:"cluster"`
	// Namespaces are namespaces, prefixes of one ending in "*", or "*" (every one).
	Namespaces []string `json:"namespaces"`
}

// Parse reads a policy (YAML) from raw; path names it in errors. A policy
// without `rules:` is refused: it is what a file caught half-written says
// (`rules: []` lets no cluster export anything).
func Parse(path string, raw []byte) (*Policy, error) {
	var p Policy
	if err := yaml.UnmarshalStrict(raw, &p); err != nil {
		return nil, fmt.Errorf("export policy %s: %w", path, err)
	}
	if p.Rules == nil {
		return nil, fmt.Errorf("export policy %s: no rules", path)
	}
	for i, r := range p.Rules {
		if err := checkPattern(r.Cluster); err != nil {
			return nil, fmt.Errorf("export policy %s: rule %d: cluster: %w", path, i+1, err)
		}
		if len(r.Namespaces) == 0 {
			return nil, fmt.Errorf("export policy %s: rule %d (%s) grants no namespace", path, i+1, r.Cluster)
		}
		for _, ns := range r.Namespaces {
			if err := checkPattern(ns); err != nil {
				return nil, fmt.Errorf("export policy %s: rule %d (%s): namespace: %w", path, i+1, r.Cluster, err)
			}
		}
	}
	return &p, nil
}

// checkPattern accepts a name, a prefix of one ending in "*", or "*".
func checkPattern(s string) error {
	name, _ := strings.CutSuffix(s, "*")
	if s == "" {
		return fmt.Errorf("empty")
	}
	if strings.Contains(name, "*") {
		return fmt.Errorf("%q: a \"*\" only ends a pattern", s)
	}
	return nil
}

// match reports whether name matches pattern (exact, prefix*, or *).
func match(pattern, name string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return pattern == name
}

// rule is the rule that applies to cluster (nil: none).
func (p *Policy) rule(cluster registry.ClusterID) *Rule {
	for i := range p.Rules {
		if match(p.Rules[i].Cluster, string(cluster)) {
			return &p.Rules[i]
		}
	}
	return nil
}

// Allows reports whether cluster may export into namespace.
func (p *Policy) Allows(cluster registry.ClusterID, namespace string) bool {
	if p == nil {
		return true
	}
	r := p.rule(cluster)
	return r != nil && slices.ContainsFunc(r.Namespaces, func(pattern string) bool { return match(pattern, namespace) })
}

// Same reports whether p and o let cluster export into the same namespaces:
// when they do, a change from one to the other concerns none of its exports.
func (p *Policy) Same(o *Policy, cluster registry.ClusterID) bool {
	grant := func(p *Policy) []string {
		if p == nil {
			return []string{"*"}
		}
		if r := p.rule(cluster); r != nil {
			return r.Namespaces
		}
		return nil
	}
	return slices.Equal(grant(p), grant(o))
}

// Refusal is the reason the hub gives for an export p does not allow.
func Refusal(cluster registry.ClusterID, namespace string) string {
	return fmt.Sprintf("%s: the hub's export policy does not let cluster %s export into namespace %s", ReasonNotPermitted, cluster, namespace)
}

// File is a policy file read again when it changes; a version that does not
// load (empty, not YAML, no rules, a bad pattern) changes nothing.
type File struct{ f *watched.File[*Policy] }

// Open reads the policy file at path.
func Open(path string) (*File, error) {
	f, err := watched.Open("export policy", path, Parse, nil)
	if err != nil {
		return nil, err
	}
	return &File{f}, nil
}

// Policy returns the policy the file last held when it read cleanly.
func (f *File) Policy() *Policy { return f.f.Get() }

// Reload reads the file again and reports whether the policy changed.
// Call it from one goroutine at a time.
func (f *File) Reload() (bool, error) { return f.f.Reload() }
