package identity

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/internal/watched"
)

// Policy says which namespaces' services each client identity may receive.
// The first rule whose identity matches applies; an identity no rule
// matches may receive nothing.
type Policy struct {
	Rules []Rule `json:"rules"`
}

// Rule grants the identities it matches the services of Namespaces.
type Rule struct {
	// Identity is a SPIFFE ID, a prefix of one ending in "/*", or "*" (any).
	Identity string `json:"identity"`
	// Namespaces are namespaces, "*" (every one) or "$namespace": the
	// namespace an Istio-style identity (spiffe://TD/ns/NS/sa/SA) names.
	Namespaces []string `json:"namespaces"`
}

// OwnNamespace in a rule's namespaces stands for the identity's own namespace.
const OwnNamespace = "$namespace"

// PolicyFile is a policy file read again when it changes; a version that
// does not load changes nothing.
type PolicyFile struct{ f *watched.File[*Policy] }

// OpenPolicy reads a policy file (YAML).
func OpenPolicy(path string) (*PolicyFile, error) {
	f, err := watched.Open("policy", path, parsePolicy, nil)
	if err != nil {
		return nil, err
	}
	return &PolicyFile{f}, nil
}

// Policy returns the policy the file last held when it read cleanly.
func (f *PolicyFile) Policy() *Policy { return f.f.Get() }

// Reload reads the file again and reports whether the policy changed.
// Call it from one goroutine at a time.
func (f *PolicyFile) Reload() (bool, error) { return f.f.Reload() }

func parsePolicy(path string, b []byte) (*Policy, error) {
	var p Policy
	if err := yaml.UnmarshalStrict(b, &p); err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	if p.Rules == nil {
		// What a file caught half-written says; a policy granting nothing says `rules: []`.
		return nil, fmt.Errorf("policy %s: no rules", path)
	}
	for i, r := range p.Rules {
		pattern := r.Identity
		if prefix, ok := strings.CutSuffix(r.Identity, "/*"); ok {
			pattern = prefix + "/any" // a prefix may be a whole trust domain
		}
		if r.Identity != "*" {
			if _, err := Parse(pattern); err != nil {
				return nil, fmt.Errorf("policy %s: rule %d: %w", path, i+1, err)
			}
		}
		if len(r.Namespaces) == 0 {
			return nil, fmt.Errorf("policy %s: rule %d (%s) grants no namespace", path, i+1, r.Identity)
		}
	}
	return &p, nil
}

// Allows returns what id may receive: all of it, or the namespaces allowed.
func (p *Policy) Allows(id ID) (all bool, namespaces []string) {
	s := id.String()
	for _, r := range p.Rules {
		prefix, wild := strings.CutSuffix(r.Identity, "/*")
		if r.Identity != "*" && s != r.Identity && !(wild && strings.HasPrefix(s, prefix+"/")) {
			continue
		}
		for _, ns := range r.Namespaces {
			switch ns {
			case "*":
				return true, nil
			case OwnNamespace:
				if own, ok := id.Namespace(); ok {
					namespaces = append(namespaces, own)
				}
			default:
				namespaces = append(namespaces, ns)
			}
		}
		slices.Sort(namespaces)
		return false, slices.Compact(namespaces)
	}
	return false, nil
}

// Namespace returns the namespace an Istio-style workload identity
// (spiffe://TD/ns/NS/sa/SA) names.
func (id ID) Namespace() (string, bool) {
	parts := strings.Split(id.Path, "/")
	if len(parts) != 5 || parts[1] != "ns" || parts[3] != "sa" || parts[2] == "" {
		return "", false
	}
	return parts[2], true
}
