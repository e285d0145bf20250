package registry

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// IPFamily is a Service's IP family as Kubernetes names it.
type IPFamily string

// The IP families.
const (
	IPv4 IPFamily = "IPv4"
	IPv6 IPFamily = "IPv6"
)

// Properties are what an import mirrors of an exported Service besides its
// ports and type (Kubernetes MCS): each is resolved across the exporting
// clusters oldest export first, like the type. Kubernetes' defaults are the
// zero values ("" is sessionAffinity None and internalTrafficPolicy
// Cluster), so a shard from a spoke that predates a property hashes and
// compares as it always did.
type Properties struct {
	// SessionAffinity is "ClientIP", or "" for None.
	SessionAffinity string `json:"sessionAffinity,omitempty"`
	// SessionAffinityTimeout is ClientIP affinity's timeout in seconds (0: Kubernetes' default).
	SessionAffinityTimeout int32 `json:"sessionAffinityTimeout,omitempty"`
	// InternalTrafficPolicy is "Local", or "" for Cluster.
	InternalTrafficPolicy string `json:"internalTrafficPolicy,omitempty"`
	// TrafficDistribution is the Service's trafficDistribution ("" when unset).
	TrafficDistribution string `json:"trafficDistribution,omitempty"`
	// IPFamilies are the Service's IP families, in its order (empty: not stated).
	IPFamilies []IPFamily `json:"ipFamilies,omitempty"`
	// Labels and Annotations are the ServiceExport's exportedLabels and
	// exportedAnnotations, which every import carries.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// The Kubernetes values of the properties whose default is "".
const (
	SessionAffinityClientIP    = "ClientIP"
	InternalTrafficPolicyLocal = "Local"
)

// Limits on a shard's properties (Kubernetes' own bounds, or below them).
const (
	maxSessionAffinityTimeout = 86400 // seconds, as Kubernetes allows
	maxExportedMetadataBytes  = 64 << 10
	maxTrafficDistribution    = 63
)

// Equal reports whether two sets of properties say the same thing (nil and
// empty maps and lists alike).
func (p *Properties) Equal(o *Properties) bool {
	return p.SessionAffinity == o.SessionAffinity && p.SessionAffinityTimeout == o.SessionAffinityTimeout &&
		p.InternalTrafficPolicy == o.InternalTrafficPolicy && p.TrafficDistribution == o.TrafficDistribution &&
		slices.Equal(p.IPFamilies, o.IPFamilies) && maps.Equal(p.Labels, o.Labels) && maps.Equal(p.Annotations, o.Annotations)
}

// validate checks the properties' values and sizes; it returns a problem or "".
func (p *Properties) validate() string {
	switch p.SessionAffinity {
	case "", SessionAffinityClientIP:
	default:
		return fmt.Sprintf("unknown sessionAffinity %s", quoted(string(p.SessionAffinity)))
	}
	if p.SessionAffinityTimeout < 0 || p.SessionAffinityTimeout > maxSessionAffinityTimeout {
		return fmt.Sprintf("sessionAffinity timeout %d is out of range 0-%d", p.SessionAffinityTimeout, maxSessionAffinityTimeout)
	}
	if p.SessionAffinityTimeout != 0 && p.SessionAffinity != SessionAffinityClientIP {
		return "a sessionAffinity timeout without ClientIP affinity"
	}
	switch p.InternalTrafficPolicy {
	case "", InternalTrafficPolicyLocal:
	default:
		return fmt.Sprintf("unknown internalTrafficPolicy %s", quoted(string(p.InternalTrafficPolicy)))
	}
	if len(p.TrafficDistribution) > maxTrafficDistribution || !qualifiedName(p.TrafficDistribution) {
		return fmt.Sprintf("trafficDistribution %s is not a qualified name", quoted(p.TrafficDistribution))
	}
	if len(p.IPFamilies) > 2 {
		return fmt.Sprintf("%d IP families, at most 2", len(p.IPFamilies))
	}
	for i, f := range p.IPFamilies {
		if f != IPv4 && f != IPv6 {
			return fmt.Sprintf("unknown IP family %s", quoted(string(f)))
		}
		if i > 0 && f == p.IPFamilies[0] {
			return fmt.Sprintf("IP family %s twice", f)
		}
	}
	size := 0
	for what, m := range map[string]map[string]string{"label": p.Labels, "annotation": p.Annotations} {
		for k, v := range m {
			if !metadataKey(k) {
				return fmt.Sprintf("exported %s key %s is not a qualified name", what, quoted(k))
			}
			if what == "label" && (len(v) > 63 || !labelValue(v)) {
				return fmt.Sprintf("exported label %s has an invalid value %s", quoted(k), quoted(v))
			}
			size += len(k) + len(v)
		}
	}
	if size > maxExportedMetadataBytes {
		return fmt.Sprintf("exported labels and annotations take %d bytes, more than the limit of %d", size, maxExportedMetadataBytes)
	}
	return ""
}

// metadataKey: a Kubernetes label or annotation key, [prefix/]name with a
// DNS subdomain prefix (at most 253 characters) and a qualified name.
func metadataKey(k string) bool {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		name, prefix = prefix, ""
	} else if prefix == "" || len(prefix) > 253 || !dnsSubdomain(prefix) {
		return false
	}
	return name != "" && len(name) <= 63 && qualifiedName(name)
}

// qualifiedName: ^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$, or empty.
func qualifiedName(s string) bool { return labelValue(s) }

// ConflictKind names what a conflict is about, with the Kubernetes MCS
// API's ServiceExport condition reasons.
type ConflictKind string

// The conflict kinds (the upstream reasons of a ServiceExport's Conflict condition).
const (
	PortConflict                  ConflictKind = "PortConflict"
	TypeConflict                  ConflictKind = "TypeConflict"
	SessionAffinityConflict       ConflictKind = "SessionAffinityConflict"
	SessionAffinityConfigConflict ConflictKind = "SessionAffinityConfigConflict"
	LabelsConflict                ConflictKind = "LabelsConflict"
	AnnotationsConflict           ConflictKind = "AnnotationsConflict"
	InternalTrafficPolicyConflict ConflictKind = "InternalTrafficPolicyConflict"
	TrafficDistributionConflict   ConflictKind = "TrafficDistributionConflict"
	IPFamilyConflict              ConflictKind = "IPFamilyConflict"
	// Nave's own: a route, or the policy, that two clusters export differently.
	RouteConflict  ConflictKind = "RouteConflict"
	PolicyConflict ConflictKind = "PolicyConflict"
)

// property is one of Properties, as merge resolves it.
type property struct {
	kind  ConflictKind
	name  string
	same  func(a, b *Properties) bool
	value func(p *Properties) string
}

// properties lists the properties in the order merge reports their conflicts.
var properties = []property{
	{SessionAffinityConflict, "sessionAffinity",
		func(a, b *Properties) bool { return a.SessionAffinity == b.SessionAffinity },
		func(p *Properties) string { return orDefault(p.SessionAffinity, "None") }},
	{SessionAffinityConfigConflict, "sessionAffinityConfig",
		func(a, b *Properties) bool { return a.SessionAffinityTimeout == b.SessionAffinityTimeout },
		func(p *Properties) string {
			if p.SessionAffinityTimeout == 0 {
				return "the default timeout"
			}
			return fmt.Sprintf("timeout %ds", p.SessionAffinityTimeout)
		}},
	{InternalTrafficPolicyConflict, "internalTrafficPolicy",
		func(a, b *Properties) bool { return a.InternalTrafficPolicy == b.InternalTrafficPolicy },
		func(p *Properties) string { return orDefault(p.InternalTrafficPolicy, "Cluster") }},
	{TrafficDistributionConflict, "trafficDistribution",
		func(a, b *Properties) bool { return a.TrafficDistribution == b.TrafficDistribution },
		func(p *Properties) string { return orDefault(p.TrafficDistribution, "unset") }},
	{IPFamilyConflict, "ipFamilies",
		// A shard that states no families (from a spoke that predates them) conflicts with none.
		func(a, b *Properties) bool {
			return len(a.IPFamilies) == 0 || len(b.IPFamilies) == 0 || slices.Equal(a.IPFamilies, b.IPFamilies)
		},
		func(p *Properties) string { return fmt.Sprint(p.IPFamilies) }},
	{LabelsConflict, "exported labels",
		func(a, b *Properties) bool { return maps.Equal(a.Labels, b.Labels) },
		func(p *Properties) string { return describeMap(p.Labels) }},
	{AnnotationsConflict, "exported annotations",
		func(a, b *Properties) bool { return maps.Equal(a.Annotations, b.Annotations) },
		func(p *Properties) string { return describeMap(p.Annotations) }},
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// describeMap renders a label or annotation map briefly, keys sorted.
func describeMap(m map[string]string) string {
	if len(m) == 0 {
		return "none"
	}
	keys := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for i, k := range keys {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more", len(keys)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		v := m[k]
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		fmt.Fprintf(&b, "%s=%q", k, v)
	}
	return b.String()
}

// mergeProperties resolves every property oldest export first (byAge is
// sorted oldest first) and appends a conflict for each shard that disagrees
// with the winner. IP families come from the oldest shard that states any.
func mergeProperties(svc *Service, byAge []*Shard) {
	oldest := byAge[0]
	svc.Properties = oldest.Properties
	svc.IPFamilies = firstStating(byAge).IPFamilies
	for _, p := range properties {
		winner := oldest
		if p.kind == IPFamilyConflict {
			winner = firstStating(byAge)
		}
		for _, s := range byAge {
			if s == winner || p.same(&winner.Properties, &s.Properties) {
				continue
			}
			svc.Conflicts = append(svc.Conflicts, Conflict{
				Kind: p.kind, Property: p.name, Winner: winner.Cluster, Loser: s.Cluster,
				Reason: fmt.Sprintf("%s in %s but %s in %s", p.value(&winner.Properties), winner.Cluster, p.value(&s.Properties), s.Cluster),
			})
		}
	}
}

// firstStating is the oldest shard that states its IP families (the oldest of all when none does).
func firstStating(byAge []*Shard) *Shard {
	for _, s := range byAge {
		if len(s.IPFamilies) > 0 {
			return s
		}
	}
	return byAge[0]
}
