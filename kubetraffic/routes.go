// Package kubetraffic reads traffic policy from Kubernetes objects into
// package traffic's model: Gateway API GRPCRoutes and HTTPRoutes whose
// parent is a Service (the GAMMA mesh pattern), and Nave's TrafficPolicy
// (kubetraffic/v1alpha1, GEP-713 policy attachment). It also says what
// each object's status should hold: a route's parents[] conditions
// (Accepted, ResolvedRefs) and a policy's ancestors[].
//
// Everything here is pure: objects in, model and conditions out. The
// spoke's sources read the objects and write the statuses.
package kubetraffic

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// ControllerName is the controller Nave writes route and policy statuses as.
const ControllerName gwv1.GatewayController = "nave.io/spoke"

// The API groups and kinds routes refer to.
const (
	groupCore     = ""
	kindService   = "Service"
	groupMCS      = "multicluster.x-k8s.io"
	kindImport    = "ServiceImport"
	groupGateway  = gwv1.GroupName
	kindGRPCRoute = "GRPCRoute"
	kindHTTPRoute = "HTTPRoute"
)

// Parent is what a route needs to know of a Service it names as its parent.
type Parent struct {
	Service *corev1.Service
	// Exported: the spoke publishes the Service, so its routes travel with it.
	Exported bool
}

// Lookup finds a Service of the cluster (ok false: none of that name).
type Lookup func(namespace, name string) (Parent, bool)

// Attachment is a route as it attaches to one Service named by one of its
// parentRefs: the route's model when it is accepted, and the conditions
// its status shows for that parent.
type Attachment struct {
	Service   registry.ServiceKey
	ParentRef gwv1.ParentReference
	// Route is the model carried with the Service; nil when not accepted.
	Route        *traffic.Route
	Accepted     metav1.Condition
	ResolvedRefs metav1.Condition
}

// rule is a route rule in the form both kinds share, before conversion.
type ruleInput struct {
	matches  []traffic.Match
	backends []gwv1.BackendRef
	filters  []filterInput
	timeout  *gwv1.Duration
	retry    *gwv1.HTTPRouteRetry
	problems []string // what Nave cannot apply, found while reading the rule
}

type filterInput struct {
	kind   string
	header *gwv1.HTTPHeaderFilter
}

// FromGRPCRoute converts a GRPCRoute: one Attachment per parentRef that names
// a Service (parentRefs naming anything else, such as a Gateway, are not
// Nave's and are left out).
func FromGRPCRoute(r *gwv1.GRPCRoute, services Lookup) []Attachment {
	var rules []ruleInput
	for _, rule := range r.Spec.Rules {
		in := ruleInput{}
		for _, m := range rule.Matches {
			var tm traffic.Match
			if mm := m.Method; mm != nil {
				tm.Method = &traffic.MethodMatch{Type: traffic.Exact, Service: deref(mm.Service), Method: deref(mm.Method)}
				if mm.Type != nil && *mm.Type == gwv1.GRPCMethodMatchRegularExpression {
					tm.Method.Type = traffic.RegularExpression
				}
			}
			for _, h := range m.Headers {
				tm.Headers = addHeaderMatch(tm.Headers, headerMatch(h.Type != nil && *h.Type == gwv1.GRPCHeaderMatchRegularExpression, string(h.Name), h.Value))
			}
			in.matches = append(in.matches, tm)
		}
		for _, f := range rule.Filters {
			in.filters = append(in.filters, filterInput{kind: string(f.Type), header: f.RequestHeaderModifier})
		}
		for _, b := range rule.BackendRefs {
			in.addBackend(b.BackendRef, len(b.Filters))
		}
		in.sessionPersistence(rule.SessionPersistence)
		rules = append(rules, in)
	}
	return attach(traffic.GRPCRoute, &r.ObjectMeta, r.Spec.ParentRefs, len(r.Spec.Hostnames) > 0, rules, services)
}

// FromHTTPRoute converts an HTTPRoute, as FromGRPCRoute does a GRPCRoute.
func FromHTTPRoute(r *gwv1.HTTPRoute, services Lookup) []Attachment {
	var rules []ruleInput
	for _, rule := range r.Spec.Rules {
		in := ruleInput{retry: rule.Retry}
		if t := rule.Timeouts; t != nil {
			in.timeout = t.Request
			if t.BackendRequest != nil {
				in.problems = append(in.problems, "timeouts.backendRequest is not supported (timeouts.request is)")
			}
		}
		for _, m := range rule.Matches {
			var tm traffic.Match
			if p := m.Path; p != nil {
				tm.Path = &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/"}
				if p.Value != nil {
					tm.Path.Value = *p.Value
				}
				if p.Type != nil {
					tm.Path.Type = traffic.MatchType(*p.Type)
				}
			}
			for _, h := range m.Headers {
				tm.Headers = addHeaderMatch(tm.Headers, headerMatch(h.Type != nil && *h.Type == gwv1.HeaderMatchRegularExpression, string(h.Name), h.Value))
			}
			if len(m.QueryParams) > 0 {
				in.problems = append(in.problems, "matches[].queryParams are not supported (proxyless gRPC has no query)")
			}
			if m.Method != nil {
				in.problems = append(in.problems, "matches[].method is not supported")
			}
			in.matches = append(in.matches, tm)
		}
		for _, f := range rule.Filters {
			in.filters = append(in.filters, filterInput{kind: string(f.Type), header: f.RequestHeaderModifier})
		}
		for _, b := range rule.BackendRefs {
			in.addBackend(b.BackendRef, len(b.Filters))
		}
		in.sessionPersistence(rule.SessionPersistence)
		rules = append(rules, in)
	}
	return attach(traffic.HTTPRoute, &r.ObjectMeta, r.Spec.ParentRefs, len(r.Spec.Hostnames) > 0, rules, services)
}

// addBackend adds a rule's backendRef; Nave applies no filters of a backendRef.
func (in *ruleInput) addBackend(b gwv1.BackendRef, filters int) {
	if filters > 0 {
		in.problems = append(in.problems, "backendRefs[].filters are not supported")
	}
	in.backends = append(in.backends, b)
}

// sessionPersistence notes a rule's session persistence, which Nave does not apply.
func (in *ruleInput) sessionPersistence(sp *gwv1.SessionPersistence) {
	if sp != nil {
		in.problems = append(in.problems, "sessionPersistence is not supported (a TrafficPolicy's RingHash keeps a key on one endpoint)")
	}
}

// addHeaderMatch adds h unless a match of an equivalent name (header names
// are case-insensitive) came first: the Gateway API considers only the first.
func addHeaderMatch(matches []traffic.HeaderMatch, h traffic.HeaderMatch) []traffic.HeaderMatch {
	for _, m := range matches {
		if m.Name == h.Name {
			return matches
		}
	}
	return append(matches, h)
}

func headerMatch(regex bool, name, value string) traffic.HeaderMatch {
	t := traffic.Exact
	if regex {
		t = traffic.RegularExpression
	}
	return traffic.HeaderMatch{Type: t, Name: strings.ToLower(name), Value: value}
}

// attach builds the route's model once and attaches it to each Service parent.
func attach(kind traffic.RouteKind, meta *metav1.ObjectMeta, parents []gwv1.ParentReference, hostnames bool, rules []ruleInput,
	services Lookup) []Attachment {
	route, resolved, problem := build(kind, meta, rules)
	if problem == "" && hostnames {
		problem = "hostnames are not supported on a route whose parent is a Service"
	}
	var out []Attachment
	attachedTo := map[registry.ServiceKey]bool{}
	for _, ref := range parents {
		if group(ref.Group, groupGateway) != groupCore || deref(ref.Kind) != kindService {
			continue // not a Service: another controller's
		}
		ns := meta.Namespace
		if ref.Namespace != nil && *ref.Namespace != "" {
			ns = string(*ref.Namespace)
		}
		a := Attachment{
			Service:      registry.ServiceKey{Namespace: ns, Name: string(ref.Name)},
			ParentRef:    ref,
			ResolvedRefs: resolved,
		}
		port, reason, message := attachTo(meta, ref, services, problem)
		if reason == "" && attachedTo[a.Service] {
			// The model carries one port per route and Service.
			reason, message = gwv1.RouteReasonUnsupportedValue,
				fmt.Sprintf("the route already attaches to another port of Service %s: Nave carries a route on one port of a Service, or on all (a parentRef without port or sectionName)", a.Service.Name)
		}
		if reason != "" {
			a.Accepted = condition(meta, gwv1.RouteConditionAccepted, false, reason, message)
			out = append(out, a)
			continue
		}
		r := route
		r.Port = port
		a.Route = &r
		attachedTo[a.Service] = true
		a.Accepted = condition(meta, gwv1.RouteConditionAccepted, true, gwv1.RouteReasonAccepted, "Nave carries the route with the Service to every cluster")
		out = append(out, a)
	}
	return out
}

// attachTo is the Service port a route attaches to through ref (0: every
// port), or why it cannot attach.
func attachTo(meta *metav1.ObjectMeta, ref gwv1.ParentReference, services Lookup, problem string) (int32, gwv1.RouteConditionReason, string) {
	if ns := string(deref(ref.Namespace)); ns != "" && ns != meta.Namespace {
		return 0, gwv1.RouteReasonNotAllowedByListeners, "Nave takes producer routes only: a route in its parent Service's namespace"
	}
	parent, ok := services(meta.Namespace, string(ref.Name))
	switch {
	case !ok || parent.Service == nil:
		return 0, gwv1.RouteReasonNoMatchingParent, fmt.Sprintf("Service %s/%s does not exist", meta.Namespace, ref.Name)
	case !parent.Exported:
		return 0, gwv1.RouteReasonNoMatchingParent, fmt.Sprintf("Service %s/%s is not exported (no ServiceExport)", meta.Namespace, ref.Name)
	case problem != "":
		return 0, gwv1.RouteReasonUnsupportedValue, problem
	}
	port, p := parentPort(ref, parent.Service)
	if p != "" {
		return 0, gwv1.RouteReasonNoMatchingParent, p
	}
	return port, "", ""
}

// parentPort is the Service port the parentRef names (its port, or its
// sectionName: a port's name), 0 for every port; or why it names none.
func parentPort(ref gwv1.ParentReference, svc *corev1.Service) (int32, string) {
	var port int32
	if ref.SectionName != nil {
		for _, p := range svc.Spec.Ports {
			if p.Name == string(*ref.SectionName) {
				port = p.Port
			}
		}
		if port == 0 {
			return 0, fmt.Sprintf("Service %s has no port named %q", svc.Name, *ref.SectionName)
		}
	}
	if ref.Port != nil {
		if port != 0 && port != *ref.Port {
			return 0, fmt.Sprintf("sectionName %q is port %d, not %d", *ref.SectionName, port, *ref.Port)
		}
		port = *ref.Port
		found := false
		for _, p := range svc.Spec.Ports {
			found = found || p.Port == port
		}
		if !found {
			return 0, fmt.Sprintf("Service %s has no port %d", svc.Name, port)
		}
	}
	return port, ""
}

// build converts the rules into the route's model, and the ResolvedRefs
// condition of its backends. problem says why the route cannot be
// accepted as a whole ("" when it can).
func build(kind traffic.RouteKind, meta *metav1.ObjectMeta, rules []ruleInput) (traffic.Route, metav1.Condition, string) {
	route := traffic.Route{Kind: kind, Name: meta.Name, CreatedAt: meta.CreationTimestamp.Time}
	resolved := condition(meta, gwv1.RouteConditionResolvedRefs, true, gwv1.RouteReasonResolvedRefs, "every backend resolves")
	var problems []string
	for i, in := range rules {
		rule := traffic.Rule{Matches: in.matches}
		for _, p := range in.problems {
			problems = append(problems, fmt.Sprintf("rule %d: %s", i+1, p))
		}
		for _, f := range in.filters {
			switch {
			case f.kind == string(gwv1.HTTPRouteFilterRequestHeaderModifier) && f.header != nil && len(f.header.Add) == 0 && len(f.header.Remove) == 0:
				for _, h := range f.header.Set {
					rule.SetHeaders = append(rule.SetHeaders, traffic.Header{Name: strings.ToLower(string(h.Name)), Value: h.Value})
				}
			case f.kind == string(gwv1.HTTPRouteFilterRequestHeaderModifier):
				problems = append(problems, fmt.Sprintf("rule %d: a RequestHeaderModifier may only set headers (add and remove are not supported)", i+1))
			default:
				problems = append(problems, fmt.Sprintf("rule %d: filter %s is not supported", i+1, f.kind))
			}
		}
		if in.timeout != nil {
			d, err := parseDuration(*in.timeout)
			if err != nil {
				problems = append(problems, fmt.Sprintf("rule %d: timeouts.request: %v", i+1, err))
			} else {
				rule.Timeout = d
			}
		}
		if in.retry != nil {
			retry, p := retryOf(in.retry)
			if p != "" {
				problems = append(problems, fmt.Sprintf("rule %d: retry: %s", i+1, p))
			}
			rule.Retry = retry
		}
		for _, b := range in.backends {
			tb, reason, message := backendOf(meta.Namespace, b)
			if reason != "" {
				if resolved.Status == metav1.ConditionTrue {
					resolved = condition(meta, gwv1.RouteConditionResolvedRefs, false, reason, fmt.Sprintf("rule %d: %s", i+1, message))
				}
				continue // its share of the requests fails, as the Gateway API says
			}
			rule.Backends = append(rule.Backends, tb)
		}
		route.Rules = append(route.Rules, rule)
	}
	if len(problems) == 0 {
		set := traffic.Set{Routes: []traffic.Route{route}}
		set.Normalize()
		route = set.Routes[0]
		if err := route.Validate(); err != nil {
			problems = append(problems, strings.TrimPrefix(err.Error(), traffic.ErrInvalid.Error()+": "))
		}
	}
	return route, resolved, strings.Join(problems, "; ")
}

// backendOf converts a backendRef, or says why it does not resolve.
func backendOf(namespace string, b gwv1.BackendRef) (traffic.Backend, gwv1.RouteConditionReason, string) {
	ref := b.BackendObjectReference
	weight := int32(1)
	if b.Weight != nil {
		weight = *b.Weight
	}
	if ns := string(deref(ref.Namespace)); ns != "" && ns != namespace {
		return traffic.Backend{}, gwv1.RouteReasonRefNotPermitted,
			fmt.Sprintf("backend %s/%s is in another namespace (Nave takes backends of the route's namespace only)", ns, ref.Name)
	}
	out := traffic.Backend{Name: string(ref.Name), Port: deref(ref.Port), Weight: weight}
	switch g, k := group(ref.Group, groupCore), deref(ref.Kind); {
	case g == groupCore && (k == "" || k == kindService):
		out.Kind = traffic.BackendService
	case g == groupMCS && k == kindImport:
		out.Kind = traffic.BackendServiceImport
	default:
		return traffic.Backend{}, gwv1.RouteReasonInvalidKind,
			fmt.Sprintf("backend %s is a %s/%s: Nave routes to Services and ServiceImports (%s)", ref.Name, g, k, groupMCS)
	}
	return out, "", ""
}

// retryOf converts an HTTPRoute's retry.
func retryOf(r *gwv1.HTTPRouteRetry) (*traffic.Retry, string) {
	out := &traffic.Retry{Attempts: 1}
	if r.Attempts != nil {
		if *r.Attempts < 1 || *r.Attempts > traffic.MaxRetryAttempts {
			return nil, fmt.Sprintf("attempts %d is out of range 1-%d", *r.Attempts, traffic.MaxRetryAttempts)
		}
		out.Attempts = int32(*r.Attempts)
	}
	if r.Backoff != nil {
		d, err := parseDuration(*r.Backoff)
		if err != nil {
			return nil, fmt.Sprintf("backoff: %v", err)
		}
		out.Backoff = d
	}
	for _, c := range r.Codes {
		out.HTTPCodes = append(out.HTTPCodes, int32(c))
	}
	if len(out.HTTPCodes) == 0 {
		out.HTTPCodes = []int32{503} // the codes default to what gateways retry: 503
	}
	return out, ""
}

// condition is a status condition of the object meta describes.
func condition(meta *metav1.ObjectMeta, t gwv1.RouteConditionType, ok bool, reason gwv1.RouteConditionReason, message string) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{Type: string(t), Status: status, Reason: string(reason), Message: cut(message),
		ObservedGeneration: meta.Generation, LastTransitionTime: metav1.NewTime(time.Time{})}
}

// cut keeps a condition message within what the API server admits (32,768 bytes).
func cut(s string) string {
	const limit = 1024
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}

// gatewayDuration is the Gateway API's duration syntax (GEP-2257).
var gatewayDuration = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

// parseDuration parses a Gateway API duration ("100ms", "1h30m").
func parseDuration(d gwv1.Duration) (time.Duration, error) {
	if !gatewayDuration.MatchString(string(d)) {
		return 0, fmt.Errorf("%q is not a Gateway API duration (such as 100ms or 1h30m)", d)
	}
	return time.ParseDuration(string(d))
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// group is a reference's group, def when unset.
func group(g *gwv1.Group, def string) string {
	if g == nil {
		return def
	}
	return string(*g)
}
