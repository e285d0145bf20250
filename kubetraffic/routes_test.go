package kubetraffic_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/kubetraffic"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// The routes of these tests live in namespace shop, are called cart-route,
// are at generation 3 and were created at rtCreated.
const (
	rtNS         = "shop"
	rtName       = "cart-route"
	rtGeneration = 3
)

var rtCreated = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

func rtPtr[T any](v T) *T { return &v }

// rtLookup knows Services of namespace shop: cart (exported; ports grpc 8080
// and http 9090), orders (exported; port grpc 7070), internal (not
// exported) and ghost (found, but without a Service).
func rtLookup(namespace, name string) (kubetraffic.Parent, bool) {
	if namespace != rtNS {
		return kubetraffic.Parent{}, false
	}
	svc := func(ports ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Spec: corev1.ServiceSpec{Ports: ports}}
	}
	switch name {
	case "cart":
		return kubetraffic.Parent{Service: svc(corev1.ServicePort{Name: "grpc", Port: 8080}, corev1.ServicePort{Name: "http", Port: 9090}), Exported: true}, true
	case "orders":
		return kubetraffic.Parent{Service: svc(corev1.ServicePort{Name: "grpc", Port: 7070}), Exported: true}, true
	case "internal":
		return kubetraffic.Parent{Service: svc(corev1.ServicePort{Name: "grpc", Port: 8080})}, true
	case "ghost":
		return kubetraffic.Parent{Exported: true}, true
	}
	return kubetraffic.Parent{}, false
}

// rtParent is a parentRef naming a Service.
func rtParent(name string) gwv1.ParentReference {
	return gwv1.ParentReference{Group: rtPtr(gwv1.Group("")), Kind: rtPtr(gwv1.Kind("Service")), Name: gwv1.ObjectName(name)}
}

// rtParentWith is rtParent changed by f.
func rtParentWith(name string, f func(*gwv1.ParentReference)) gwv1.ParentReference {
	p := rtParent(name)
	f(&p)
	return p
}

// rtSvcRef is a backendRef to a Service (group and kind unset) of the route's namespace.
func rtSvcRef(name string, port int32) gwv1.BackendRef {
	return gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(name), Port: rtPtr(port)}}
}

// rtRef is a backendRef changed by f.
func rtRef(name string, port int32, f func(*gwv1.BackendRef)) gwv1.BackendRef {
	b := rtSvcRef(name, port)
	f(&b)
	return b
}

// rtImportRef is a backendRef to a ServiceImport.
func rtImportRef(name string, port *int32, weight *int32) gwv1.BackendRef {
	return gwv1.BackendRef{Weight: weight, BackendObjectReference: gwv1.BackendObjectReference{
		Group: rtPtr(gwv1.Group("multicluster.x-k8s.io")), Kind: rtPtr(gwv1.Kind("ServiceImport")), Name: gwv1.ObjectName(name), Port: port}}
}

func rtGRPCBackends(refs ...gwv1.BackendRef) []gwv1.GRPCBackendRef {
	out := make([]gwv1.GRPCBackendRef, 0, len(refs))
	for _, r := range refs {
		out = append(out, gwv1.GRPCBackendRef{BackendRef: r})
	}
	return out
}

func rtHTTPBackends(refs ...gwv1.BackendRef) []gwv1.HTTPBackendRef {
	out := make([]gwv1.HTTPBackendRef, 0, len(refs))
	for _, r := range refs {
		out = append(out, gwv1.HTTPBackendRef{BackendRef: r})
	}
	return out
}

func rtMeta() metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: rtNS, Name: rtName, Generation: rtGeneration, CreationTimestamp: metav1.NewTime(rtCreated)}
}

// rtGRPC is a GRPCRoute whose parent is Service cart and whose one rule sends
// everything to cart:8080, changed by f.
func rtGRPC(f func(*gwv1.GRPCRoute)) *gwv1.GRPCRoute {
	r := &gwv1.GRPCRoute{ObjectMeta: rtMeta(), Spec: gwv1.GRPCRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{rtParent("cart")}},
		Rules:           []gwv1.GRPCRouteRule{{BackendRefs: rtGRPCBackends(rtSvcRef("cart", 8080))}},
	}}
	if f != nil {
		f(r)
	}
	return r
}

// rtHTTP is an HTTPRoute like rtGRPC's GRPCRoute.
func rtHTTP(f func(*gwv1.HTTPRoute)) *gwv1.HTTPRoute {
	r := &gwv1.HTTPRoute{ObjectMeta: rtMeta(), Spec: gwv1.HTTPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{rtParent("cart")}},
		Rules:           []gwv1.HTTPRouteRule{{BackendRefs: rtHTTPBackends(rtSvcRef("cart", 8080))}},
	}}
	if f != nil {
		f(r)
	}
	return r
}

// rtCart is the backend cart:8080 of weight 1.
var rtCart = traffic.Backend{Kind: traffic.BackendService, Name: "cart", Port: 8080, Weight: 1}

// rtModel is the model of a route named cart-route.
func rtModel(kind traffic.RouteKind, port int32, rules ...traffic.Rule) *traffic.Route {
	return &traffic.Route{Kind: kind, Name: rtName, CreatedAt: rtCreated, Port: port, Rules: rules}
}

// rtCond is an expected condition: its status, reason and a part of its
// message. The zero rtCond is the condition's True, with the reason named
// as the condition (Accepted, ResolvedRefs).
type rtCond struct {
	status metav1.ConditionStatus
	reason gwv1.RouteConditionReason
	msg    []string // each is in the message
}

func rtFalse(reason gwv1.RouteConditionReason, msg ...string) rtCond {
	return rtCond{status: metav1.ConditionFalse, reason: reason, msg: msg}
}

// rtWant is an expected attachment.
type rtWant struct {
	service  string         // the parent Service's name (namespace shop); "": not checked
	parent   string         // the parentRef's name; "" is service
	accepted rtCond         // zero: True, Accepted
	resolved rtCond         // zero: True, ResolvedRefs
	route    *traffic.Route // the model carried; nil when not accepted
}

type rtCase struct {
	name string
	got  func() []kubetraffic.Attachment
	want []rtWant
}

func rtJSON(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}

func rtCheckCond(t *testing.T, which string, got metav1.Condition, want rtCond, typ gwv1.RouteConditionType, okReason gwv1.RouteConditionReason) {
	t.Helper()
	if want.status == "" {
		want.status, want.reason = metav1.ConditionTrue, okReason
	}
	if got.Type != string(typ) {
		t.Errorf("%s: type = %q, want %q", which, got.Type, typ)
	}
	if got.Status != want.status || got.Reason != string(want.reason) {
		t.Errorf("%s: %s/%s (%q), want %s/%s", which, got.Status, got.Reason, got.Message, want.status, want.reason)
	}
	for _, m := range want.msg {
		if !strings.Contains(got.Message, m) {
			t.Errorf("%s: message %q does not say %q", which, got.Message, m)
		}
	}
	if got.Message == "" {
		t.Errorf("%s: no message", which)
	}
	if got.ObservedGeneration != rtGeneration {
		t.Errorf("%s: observedGeneration = %d, want %d", which, got.ObservedGeneration, rtGeneration)
	}
}

func rtRun(t *testing.T, cases []rtCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.got()
			if len(got) != len(tc.want) {
				t.Fatalf("%d attachments, want %d:\n%s", len(got), len(tc.want), rtJSON(got))
			}
			for i, w := range tc.want {
				a := got[i]
				if want := (registry.ServiceKey{Namespace: rtNS, Name: w.service}); w.service != "" && a.Service != want {
					t.Errorf("attachment %d: service %v, want %v", i, a.Service, want)
				}
				parent := w.parent
				if parent == "" {
					parent = w.service
				}
				if string(a.ParentRef.Name) != parent {
					t.Errorf("attachment %d: parentRef %q, want %q", i, a.ParentRef.Name, parent)
				}
				rtCheckCond(t, fmt.Sprintf("attachment %d: Accepted", i), a.Accepted, w.accepted, gwv1.RouteConditionAccepted, gwv1.RouteReasonAccepted)
				rtCheckCond(t, fmt.Sprintf("attachment %d: ResolvedRefs", i), a.ResolvedRefs, w.resolved, gwv1.RouteConditionResolvedRefs, gwv1.RouteReasonResolvedRefs)
				switch {
				case w.route == nil && a.Route != nil:
					t.Errorf("attachment %d: carries a route, want none:\n%s", i, rtJSON(a.Route))
				case w.route != nil && a.Route == nil:
					t.Errorf("attachment %d: carries no route, want:\n%s", i, rtJSON(w.route))
				case w.route != nil:
					if !a.Route.CreatedAt.Equal(w.route.CreatedAt) {
						t.Errorf("attachment %d: createdAt %v, want %v", i, a.Route.CreatedAt, w.route.CreatedAt)
					}
					g, wr := *a.Route, *w.route
					g.CreatedAt, wr.CreatedAt = time.Time{}, time.Time{}
					if !reflect.DeepEqual(g, wr) {
						t.Errorf("attachment %d: route\n%s\nwant\n%s", i, rtJSON(a.Route), rtJSON(w.route))
					}
				}
			}
		})
	}
}

func grpcCase(name string, f func(*gwv1.GRPCRoute), want ...rtWant) rtCase {
	return rtCase{name: name, got: func() []kubetraffic.Attachment { return kubetraffic.FromGRPCRoute(rtGRPC(f), rtLookup) }, want: want}
}

func httpCase(name string, f func(*gwv1.HTTPRoute), want ...rtWant) rtCase {
	return rtCase{name: name, got: func() []kubetraffic.Attachment { return kubetraffic.FromHTTPRoute(rtHTTP(f), rtLookup) }, want: want}
}

// rtUnsupported is the attachment to cart of a route refused for msg.
func rtUnsupported(msg ...string) rtWant {
	return rtWant{service: "cart", accepted: rtFalse(gwv1.RouteReasonUnsupportedValue, msg...)}
}

func TestFromGRPCRoute(t *testing.T) {
	grpc := func(port int32, rules ...traffic.Rule) *traffic.Route {
		return rtModel(traffic.GRPCRoute, port, rules...)
	}
	plain := traffic.Rule{Backends: []traffic.Backend{rtCart}}
	rtRun(t, []rtCase{
		grpcCase("plain", nil, rtWant{service: "cart", route: grpc(0, plain)}),
		grpcCase("name and creation time to the second", func(r *gwv1.GRPCRoute) {
			r.Name = "other-route"
			r.CreationTimestamp = metav1.NewTime(time.Date(2023, 5, 6, 7, 8, 9, 500_000_000, time.FixedZone("X", 3600)))
		}, rtWant{service: "cart", route: &traffic.Route{Kind: traffic.GRPCRoute, Name: "other-route",
			CreatedAt: time.Date(2023, 5, 6, 6, 8, 9, 0, time.UTC), Rules: []traffic.Rule{plain}}}),
		grpcCase("exact method and header matches", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Matches = []gwv1.GRPCRouteMatch{
				{
					Method: &gwv1.GRPCMethodMatch{Service: rtPtr("shop.Cart"), Method: rtPtr("Get")}, // type unset: Exact
					Headers: []gwv1.GRPCHeaderMatch{
						{Name: "X-User", Value: "alice"},
						{Type: rtPtr(gwv1.GRPCHeaderMatchExact), Name: "X-Team", Value: "Blue"},
						{Type: rtPtr(gwv1.GRPCHeaderMatchRegularExpression), Name: "X-Env", Value: "prod-.*"},
					},
				},
				{Method: &gwv1.GRPCMethodMatch{Type: rtPtr(gwv1.GRPCMethodMatchExact), Service: rtPtr("shop.Cart")}},
				{Headers: []gwv1.GRPCHeaderMatch{{Name: "X-Only", Value: "1"}}},
			}
		}, rtWant{service: "cart", route: grpc(0, traffic.Rule{
			Matches: []traffic.Match{
				{
					Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "shop.Cart", Method: "Get"},
					Headers: []traffic.HeaderMatch{
						{Type: traffic.Exact, Name: "x-user", Value: "alice"},
						{Type: traffic.Exact, Name: "x-team", Value: "Blue"},
						{Type: traffic.RegularExpression, Name: "x-env", Value: "prod-.*"},
					},
				},
				{Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "shop.Cart"}},
				{Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-only", Value: "1"}}},
			},
			Backends: []traffic.Backend{rtCart},
		})}),
		grpcCase("regular expression method match", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Matches = []gwv1.GRPCRouteMatch{{Method: &gwv1.GRPCMethodMatch{
				Type: rtPtr(gwv1.GRPCMethodMatchRegularExpression), Service: rtPtr(`shop\..*`), Method: rtPtr("(Get|List).*")}}}
		}, rtWant{service: "cart", route: grpc(0, traffic.Rule{
			Matches:  []traffic.Match{{Method: &traffic.MethodMatch{Type: traffic.RegularExpression, Service: `shop\..*`, Method: "(Get|List).*"}}},
			Backends: []traffic.Backend{rtCart},
		})}),
		grpcCase("weighted Service and ServiceImport backends", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].BackendRefs = rtGRPCBackends(
				rtRef("cart", 8080, func(b *gwv1.BackendRef) { b.Weight = rtPtr(int32(3)) }),
				rtImportRef("cart", nil, nil),
				rtImportRef("cart", rtPtr(int32(8080)), rtPtr(int32(0))),
				rtRef("orders", 7070, func(b *gwv1.BackendRef) {
					b.Group, b.Kind, b.Namespace, b.Weight = rtPtr(gwv1.Group("")), rtPtr(gwv1.Kind("Service")), rtPtr(gwv1.Namespace(rtNS)), rtPtr(int32(2))
				}),
			)
		}, rtWant{service: "cart", route: grpc(0, traffic.Rule{Backends: []traffic.Backend{
			{Kind: traffic.BackendService, Name: "cart", Port: 8080, Weight: 3},
			{Kind: traffic.BackendServiceImport, Name: "cart", Weight: 1},
			{Kind: traffic.BackendServiceImport, Name: "cart", Port: 8080, Weight: 0},
			{Kind: traffic.BackendService, Name: "orders", Port: 7070, Weight: 2},
		}})}),
		grpcCase("rules in order, one without backends", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules = append(r.Spec.Rules, gwv1.GRPCRouteRule{Matches: []gwv1.GRPCRouteMatch{{Method: &gwv1.GRPCMethodMatch{Method: rtPtr("Drop")}}}})
		}, rtWant{service: "cart", route: grpc(0, plain, traffic.Rule{
			Matches: []traffic.Match{{Method: &traffic.MethodMatch{Type: traffic.Exact, Method: "Drop"}}},
		})}),
		grpcCase("RequestHeaderModifier set", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Filters = []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
				Set: []gwv1.HTTPHeader{{Name: "X-Tenant", Value: "blue"}, {Name: "x-zone", Value: "a"}}}}}
		}, rtWant{service: "cart", route: grpc(0, traffic.Rule{
			Backends:   []traffic.Backend{rtCart},
			SetHeaders: []traffic.Header{{Name: "x-tenant", Value: "blue"}, {Name: "x-zone", Value: "a"}},
		})}),
		grpcCase("RequestHeaderModifier add", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Filters = []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
				Set: []gwv1.HTTPHeader{{Name: "X-Tenant", Value: "blue"}}, Add: []gwv1.HTTPHeader{{Name: "X-Extra", Value: "1"}}}}}
		}, rtUnsupported("rule 1: a RequestHeaderModifier may only set headers")),
		grpcCase("RequestHeaderModifier remove, in rule 2", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules = append(r.Spec.Rules, gwv1.GRPCRouteRule{
				BackendRefs: rtGRPCBackends(rtSvcRef("cart", 8080)),
				Filters: []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestHeaderModifier,
					RequestHeaderModifier: &gwv1.HTTPHeaderFilter{Remove: []string{"X-Secret"}}}},
			})
		}, rtUnsupported("rule 2: a RequestHeaderModifier may only set headers")),
		grpcCase("ResponseHeaderModifier", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Filters = []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{
				Set: []gwv1.HTTPHeader{{Name: "X-Tenant", Value: "blue"}}}}}
		}, rtUnsupported("rule 1: filter ResponseHeaderModifier is not supported")),
		grpcCase("RequestMirror", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Filters = []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestMirror, RequestMirror: &gwv1.HTTPRequestMirrorFilter{
				BackendRef: gwv1.BackendObjectReference{Name: "cart", Port: rtPtr(int32(8080))}}}}
		}, rtUnsupported("rule 1: filter RequestMirror is not supported")),
		grpcCase("sessionPersistence", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].SessionPersistence = &gwv1.SessionPersistence{SessionName: rtPtr("s")}
		}, rtUnsupported("rule 1: sessionPersistence is not supported")),
		grpcCase("backendRef filters", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].BackendRefs[0].Filters = []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestHeaderModifier,
				RequestHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: "X-A", Value: "1"}}}}}
		}, rtUnsupported("rule 1: backendRefs[].filters are not supported")),
		grpcCase("hostnames", func(r *gwv1.GRPCRoute) {
			r.Spec.Hostnames = []gwv1.Hostname{"cart.example.com"}
		}, rtUnsupported("hostnames are not supported")),
		grpcCase("several problems, all said", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].SessionPersistence = &gwv1.SessionPersistence{}
			r.Spec.Rules = append(r.Spec.Rules, gwv1.GRPCRouteRule{Filters: []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestMirror}}})
		}, rtUnsupported("rule 1: sessionPersistence is not supported", "; ", "rule 2: filter RequestMirror is not supported")),
		grpcCase("backend in another namespace is left out", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].BackendRefs = rtGRPCBackends(
				rtRef("cart", 8080, func(b *gwv1.BackendRef) { b.Namespace = rtPtr(gwv1.Namespace("other")) }),
				rtSvcRef("orders", 7070),
			)
		}, rtWant{service: "cart", resolved: rtFalse(gwv1.RouteReasonRefNotPermitted, "rule 1: ", "other/cart"),
			route: grpc(0, traffic.Rule{Backends: []traffic.Backend{{Kind: traffic.BackendService, Name: "orders", Port: 7070, Weight: 1}}})}),
		grpcCase("ServiceImport in another namespace", func(r *gwv1.GRPCRoute) {
			b := rtImportRef("cart", nil, nil)
			b.Namespace = rtPtr(gwv1.Namespace("other"))
			r.Spec.Rules[0].BackendRefs = rtGRPCBackends(b)
		}, rtWant{service: "cart", resolved: rtFalse(gwv1.RouteReasonRefNotPermitted, "other/cart"), route: grpc(0, traffic.Rule{})}),
		grpcCase("backend of another kind is left out", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules = append(r.Spec.Rules, gwv1.GRPCRouteRule{BackendRefs: rtGRPCBackends(
				rtSvcRef("cart", 8080),
				rtRef("cfg", 80, func(b *gwv1.BackendRef) { b.Kind = rtPtr(gwv1.Kind("ConfigMap")) }),
			)})
		}, rtWant{service: "cart", resolved: rtFalse(gwv1.RouteReasonInvalidKind, "rule 2: ", "cfg", "ConfigMap"),
			route: grpc(0, plain, plain)}),
		grpcCase("Service in the MCS group is another kind", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].BackendRefs = rtGRPCBackends(rtRef("cart", 8080, func(b *gwv1.BackendRef) {
				b.Group, b.Kind = rtPtr(gwv1.Group("multicluster.x-k8s.io")), rtPtr(gwv1.Kind("Service"))
			}))
		}, rtWant{service: "cart", resolved: rtFalse(gwv1.RouteReasonInvalidKind, "cart"), route: grpc(0, traffic.Rule{})}),
		grpcCase("ServiceImport in the core group is another kind", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].BackendRefs = rtGRPCBackends(rtRef("cart", 8080, func(b *gwv1.BackendRef) { b.Kind = rtPtr(gwv1.Kind("ServiceImport")) }))
		}, rtWant{service: "cart", resolved: rtFalse(gwv1.RouteReasonInvalidKind, "cart"), route: grpc(0, traffic.Rule{})}),
		grpcCase("first unresolved backend is the one said", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].BackendRefs = rtGRPCBackends(rtRef("cfg", 80, func(b *gwv1.BackendRef) { b.Kind = rtPtr(gwv1.Kind("ConfigMap")) }))
			r.Spec.Rules = append(r.Spec.Rules, gwv1.GRPCRouteRule{BackendRefs: rtGRPCBackends(
				rtRef("cart", 8080, func(b *gwv1.BackendRef) { b.Namespace = rtPtr(gwv1.Namespace("other")) }))})
		}, rtWant{service: "cart", resolved: rtFalse(gwv1.RouteReasonInvalidKind, "rule 1: "), route: grpc(0, traffic.Rule{}, traffic.Rule{})}),
		grpcCase("unaccepted route still says its refs", func(r *gwv1.GRPCRoute) {
			r.Spec.Hostnames = []gwv1.Hostname{"cart.example.com"}
			r.Spec.Rules[0].BackendRefs = rtGRPCBackends(rtRef("cart", 8080, func(b *gwv1.BackendRef) { b.Namespace = rtPtr(gwv1.Namespace("other")) }))
		}, rtWant{service: "cart", accepted: rtFalse(gwv1.RouteReasonUnsupportedValue, "hostnames"),
			resolved: rtFalse(gwv1.RouteReasonRefNotPermitted, "other/cart")}),
		grpcCase("Gateway parents are not Nave's", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{
				{Name: "gw"}, // group and kind unset: a Gateway
				{Group: rtPtr(gwv1.Group(gwv1.GroupName)), Kind: rtPtr(gwv1.Kind("Gateway")), Name: "gw", Namespace: rtPtr(gwv1.Namespace("infra"))},
				{Kind: rtPtr(gwv1.Kind("Service")), Name: "cart"}, // group unset: the Gateway API's
				{Group: rtPtr(gwv1.Group("")), Name: "cart"},      // kind unset: Gateway
				{Group: rtPtr(gwv1.Group("multicluster.x-k8s.io")), Kind: rtPtr(gwv1.Kind("ServiceImport")), Name: "cart"},
			}
		}),
		grpcCase("parent Service in another namespace", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) { p.Namespace = rtPtr(gwv1.Namespace("other")) })}
		}, rtWant{parent: "cart", accepted: rtFalse(gwv1.RouteReasonNotAllowedByListeners, "namespace")}),
		grpcCase("parent namespace named as the route's", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) { p.Namespace = rtPtr(gwv1.Namespace(rtNS)) })}
		}, rtWant{service: "cart", route: grpc(0, plain)}),
		grpcCase("missing Service", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParent("nope")}
		}, rtWant{service: "nope", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, "Service shop/nope does not exist")}),
		grpcCase("lookup without a Service", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParent("ghost")}
		}, rtWant{service: "ghost", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, "Service shop/ghost does not exist")}),
		grpcCase("unexported Service", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParent("internal")}
		}, rtWant{service: "internal", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, "Service shop/internal is not exported")}),
		grpcCase("missing Service before a route problem", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParent("nope")}
			r.Spec.Hostnames = []gwv1.Hostname{"cart.example.com"}
		}, rtWant{service: "nope", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, "does not exist")}),
		grpcCase("parentRef port", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) { p.Port = rtPtr(int32(9090)) })}
		}, rtWant{service: "cart", route: grpc(9090, plain)}),
		grpcCase("parentRef sectionName is a port name", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) { p.SectionName = rtPtr(gwv1.SectionName("http")) })}
		}, rtWant{service: "cart", route: grpc(9090, plain)}),
		grpcCase("parentRef sectionName and port agree", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) {
				p.SectionName, p.Port = rtPtr(gwv1.SectionName("grpc")), rtPtr(int32(8080))
			})}
		}, rtWant{service: "cart", route: grpc(8080, plain)}),
		grpcCase("parentRef sectionName and port disagree", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) {
				p.SectionName, p.Port = rtPtr(gwv1.SectionName("grpc")), rtPtr(int32(9090))
			})}
		}, rtWant{service: "cart", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, `sectionName "grpc" is port 8080, not 9090`)}),
		grpcCase("parentRef port the Service lacks", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) { p.Port = rtPtr(int32(1234)) })}
		}, rtWant{service: "cart", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, "Service cart has no port 1234")}),
		grpcCase("parentRef sectionName the Service lacks", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) { p.SectionName = rtPtr(gwv1.SectionName("admin")) })}
		}, rtWant{service: "cart", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, `Service cart has no port named "admin"`)}),
		grpcCase("two Service parents, a Gateway between", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{
				rtParentWith("cart", func(p *gwv1.ParentReference) { p.SectionName = rtPtr(gwv1.SectionName("grpc")) }),
				{Name: "gw"},
				rtParent("orders"),
			}
		}, rtWant{service: "cart", route: grpc(8080, plain)}, rtWant{service: "orders", route: grpc(0, plain)}),
		grpcCase("two Service parents, one not exported", func(r *gwv1.GRPCRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParent("internal"), rtParent("cart")}
		}, rtWant{service: "internal", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, "not exported")}, rtWant{service: "cart", route: grpc(0, plain)}),
		grpcCase("17 rules", func(r *gwv1.GRPCRoute) {
			for len(r.Spec.Rules) < 17 {
				r.Spec.Rules = append(r.Spec.Rules, r.Spec.Rules[0])
			}
		}, rtUnsupported(`GRPCRoute "cart-route": 17 rules (at most 16)`)),
		grpcCase("no rules", func(r *gwv1.GRPCRoute) { r.Spec.Rules = nil },
			rtUnsupported(`GRPCRoute "cart-route": no rules`)),
		grpcCase("bad method regular expression", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Matches = []gwv1.GRPCRouteMatch{{Method: &gwv1.GRPCMethodMatch{
				Type: rtPtr(gwv1.GRPCMethodMatchRegularExpression), Method: rtPtr("Get(")}}}
		}, rtUnsupported(`GRPCRoute "cart-route": rule 1: match 1: method: regular expression "Get(": missing closing )`)),
		grpcCase("bad header regular expression", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Matches = []gwv1.GRPCRouteMatch{{Headers: []gwv1.GRPCHeaderMatch{
				{Type: rtPtr(gwv1.GRPCHeaderMatchRegularExpression), Name: "X-Env", Value: "[a-"}}}}
		}, rtUnsupported(`rule 1: match 1: header 1: regular expression "[a-"`)),
		grpcCase("exact method that is no gRPC name", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Matches = []gwv1.GRPCRouteMatch{{Method: &gwv1.GRPCMethodMatch{Method: rtPtr("Get.*")}}}
		}, rtUnsupported(`method "Get.*" is not a gRPC method name`)),
		// The Gateway API (GRPCHeaderMatch.name): "If multiple entries
		// specify equivalent header names, only the first entry with an
		// equivalent name MUST be considered for a match. Subsequent entries
		// with an equivalent header name MUST be ignored." The CRD admits
		// X-A and x-a (its list map key is case-sensitive).
		grpcCase("equivalent header names: the first is matched, the rest ignored", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Matches = []gwv1.GRPCRouteMatch{{Headers: []gwv1.GRPCHeaderMatch{{Name: "X-A", Value: "1"}, {Name: "x-a", Value: "2"}}}}
		}, rtWant{service: "cart", route: grpc(0, traffic.Rule{
			Matches:  []traffic.Match{{Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-a", Value: "1"}}}},
			Backends: []traffic.Backend{rtCart},
		})}),
		grpcCase("header set twice once lower-cased", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Filters = []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
				Set: []gwv1.HTTPHeader{{Name: "X-A", Value: "1"}, {Name: "x-a", Value: "2"}}}}}
		}, rtUnsupported(`header "x-a" is set twice`)),
		grpcCase("reserved header set", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].Filters = []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
				Set: []gwv1.HTTPHeader{{Name: "Grpc-Timeout", Value: "1S"}}}}}
		}, rtUnsupported(`is reserved`)),
		grpcCase("Service backend without a port", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].BackendRefs = rtGRPCBackends(gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: "cart"}})
		}, rtUnsupported("rule 1: backend 1: a Service backend needs a port")),
		grpcCase("backend weight out of range", func(r *gwv1.GRPCRoute) {
			r.Spec.Rules[0].BackendRefs[0].Weight = rtPtr(int32(1_000_001))
		}, rtUnsupported("weight 1000001 is out of range")),
		grpcCase("route name that is no DNS subdomain", func(r *gwv1.GRPCRoute) { r.Name = "Cart_Route" },
			rtWant{service: "cart", accepted: rtFalse(gwv1.RouteReasonUnsupportedValue, "name is not a DNS subdomain")}),
	})
}

func TestFromHTTPRoute(t *testing.T) {
	http := func(port int32, rules ...traffic.Rule) *traffic.Route {
		return rtModel(traffic.HTTPRoute, port, rules...)
	}
	plain := traffic.Rule{Backends: []traffic.Backend{rtCart}}
	with := func(f func(*traffic.Rule)) traffic.Rule {
		r := traffic.Rule{Backends: []traffic.Backend{rtCart}}
		f(&r)
		return r
	}
	timeout := func(d gwv1.Duration) func(*gwv1.HTTPRoute) {
		return func(r *gwv1.HTTPRoute) { r.Spec.Rules[0].Timeouts = &gwv1.HTTPRouteTimeouts{Request: &d} }
	}
	retry := func(rt *gwv1.HTTPRouteRetry) func(*gwv1.HTTPRoute) {
		return func(r *gwv1.HTTPRoute) { r.Spec.Rules[0].Retry = rt }
	}
	beyondInt32 := int64(1)<<32 + 1 // int32(beyondInt32) is 1
	rtRun(t, []rtCase{
		httpCase("plain", nil, rtWant{service: "cart", route: http(0, plain)}),
		httpCase("path matches", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{
				{Path: &gwv1.HTTPPathMatch{Type: rtPtr(gwv1.PathMatchExact), Value: rtPtr("/cart")}},
				{Path: &gwv1.HTTPPathMatch{Type: rtPtr(gwv1.PathMatchPathPrefix), Value: rtPtr("/api")}},
				{Path: &gwv1.HTTPPathMatch{Type: rtPtr(gwv1.PathMatchRegularExpression), Value: rtPtr("/v[0-9]+/.*")}},
				{Path: &gwv1.HTTPPathMatch{Value: rtPtr("/x")}},               // type unset: PathPrefix
				{Path: &gwv1.HTTPPathMatch{Type: rtPtr(gwv1.PathMatchExact)}}, // value unset: /
				{Path: &gwv1.HTTPPathMatch{}},
				{Headers: []gwv1.HTTPHeaderMatch{
					{Name: "X-User", Value: "alice"},
					{Type: rtPtr(gwv1.HeaderMatchRegularExpression), Name: "X-Env", Value: "prod-.*"},
				}},
			}
		}, rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) {
			r.Matches = []traffic.Match{
				{Path: &traffic.PathMatch{Type: traffic.Exact, Value: "/cart"}},
				{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/api"}},
				{Path: &traffic.PathMatch{Type: traffic.RegularExpression, Value: "/v[0-9]+/.*"}},
				{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/x"}},
				{Path: &traffic.PathMatch{Type: traffic.Exact, Value: "/"}},
				{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/"}},
				{Headers: []traffic.HeaderMatch{
					{Type: traffic.Exact, Name: "x-user", Value: "alice"},
					{Type: traffic.RegularExpression, Name: "x-env", Value: "prod-.*"},
				}},
			}
		}))}),
		httpCase("bad path regular expression", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: rtPtr(gwv1.PathMatchRegularExpression), Value: rtPtr("/(a")}}}
		}, rtUnsupported(`HTTPRoute "cart-route": rule 1: match 1: path: regular expression "/(a": missing closing )`)),
		httpCase("exact path without a slash", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: rtPtr(gwv1.PathMatchExact), Value: rtPtr("cart")}}}
		}, rtUnsupported(`path: "cart" does not start with /`)),
		httpCase("timeouts.request 100ms", timeout("100ms"),
			rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) { r.Timeout = 100 * time.Millisecond }))}),
		httpCase("timeouts.request 1h30m", timeout("1h30m"),
			rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) { r.Timeout = 90 * time.Minute }))}),
		httpCase("timeouts.request 10s500ms", timeout("10s500ms"),
			rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) { r.Timeout = 10500 * time.Millisecond }))}),
		httpCase("timeouts.request 0s is none", timeout("0s"), rtWant{service: "cart", route: http(0, plain)}),
		httpCase("timeouts.request 1d", timeout("1d"), rtUnsupported(`rule 1: timeouts.request: "1d" is not a Gateway API duration`)),
		httpCase("timeouts.request 1.5s", timeout("1.5s"), rtUnsupported(`rule 1: timeouts.request: "1.5s" is not a Gateway API duration`)),
		httpCase("timeouts.request without unit", timeout("100"), rtUnsupported(`"100" is not a Gateway API duration`)),
		httpCase("timeouts.request beyond the model's bound", timeout("25h"), rtUnsupported(`HTTPRoute "cart-route": rule 1: timeout 25h0m0s is longer than 24h0m0s`)),
		httpCase("timeouts.backendRequest", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Timeouts = &gwv1.HTTPRouteTimeouts{Request: rtPtr(gwv1.Duration("10s")), BackendRequest: rtPtr(gwv1.Duration("5s"))}
		}, rtUnsupported("rule 1: timeouts.backendRequest is not supported")),
		httpCase("retry", retry(&gwv1.HTTPRouteRetry{Attempts: rtPtr(3), Backoff: rtPtr(gwv1.Duration("100ms")),
			Codes: []gwv1.HTTPRouteRetryStatusCode{500, 502}}),
			rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) {
				r.Retry = &traffic.Retry{Attempts: 3, Backoff: 100 * time.Millisecond, HTTPCodes: []int32{500, 502}}
			}))}),
		httpCase("retry without codes retries 503", retry(&gwv1.HTTPRouteRetry{Attempts: rtPtr(2)}),
			rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) {
				r.Retry = &traffic.Retry{Attempts: 2, HTTPCodes: []int32{503}}
			}))}),
		httpCase("retry without attempts retries once", retry(&gwv1.HTTPRouteRetry{Codes: []gwv1.HTTPRouteRetryStatusCode{504}}),
			rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) {
				r.Retry = &traffic.Retry{Attempts: 1, HTTPCodes: []int32{504}}
			}))}),
		httpCase("retry with timeout", func(r *gwv1.HTTPRoute) {
			timeout("2s")(r)
			retry(&gwv1.HTTPRouteRetry{Attempts: rtPtr(1), Backoff: rtPtr(gwv1.Duration("1s"))})(r)
		}, rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) {
			r.Timeout = 2 * time.Second
			r.Retry = &traffic.Retry{Attempts: 1, Backoff: time.Second, HTTPCodes: []int32{503}}
		}))}),
		httpCase("retry backoff 1d", retry(&gwv1.HTTPRouteRetry{Attempts: rtPtr(2), Backoff: rtPtr(gwv1.Duration("1d"))}),
			rtUnsupported(`rule 1: retry: backoff: "1d" is not a Gateway API duration`)),
		httpCase("retry 11 attempts", retry(&gwv1.HTTPRouteRetry{Attempts: rtPtr(11)}),
			rtUnsupported("rule 1: retry: attempts 11 is out of range 1-10")),
		httpCase("retry 0 attempts", retry(&gwv1.HTTPRouteRetry{Attempts: rtPtr(0)}),
			rtUnsupported("retry: attempts 0 is out of range 1-10")),
		// The CRD bounds attempts below (1) only; an int beyond int32 must
		// not wrap into range.
		httpCase("retry attempts beyond int32", retry(&gwv1.HTTPRouteRetry{Attempts: rtPtr(int(beyondInt32))}),
			rtUnsupported("retry: attempts")),
		httpCase("retry code out of range", retry(&gwv1.HTTPRouteRetry{Attempts: rtPtr(1), Codes: []gwv1.HTTPRouteRetryStatusCode{200}}),
			rtUnsupported("HTTP status 200 is out of range 400-599")),
		// As for GRPCRoute: HTTPHeaderMatch.name says the first of equivalent
		// names MUST be considered, the rest MUST be ignored.
		httpCase("equivalent header names: the first is matched, the rest ignored", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Headers: []gwv1.HTTPHeaderMatch{
				{Name: "X-Env", Value: "prod"}, {Type: rtPtr(gwv1.HeaderMatchRegularExpression), Name: "x-env", Value: "dev.*"}}}}
		}, rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) {
			r.Matches = []traffic.Match{{Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-env", Value: "prod"}}}}
		}))}),
		httpCase("queryParams", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{QueryParams: []gwv1.HTTPQueryParamMatch{{Name: "q", Value: "1"}}}}
		}, rtUnsupported("rule 1: matches[].queryParams are not supported")),
		httpCase("method", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Method: rtPtr(gwv1.HTTPMethodPost)}}
		}, rtUnsupported("rule 1: matches[].method is not supported")),
		httpCase("RequestHeaderModifier set", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
				Set: []gwv1.HTTPHeader{{Name: "X-Tenant", Value: "blue"}}}}}
		}, rtWant{service: "cart", route: http(0, with(func(r *traffic.Rule) { r.SetHeaders = []traffic.Header{{Name: "x-tenant", Value: "blue"}} }))}),
		httpCase("RequestHeaderModifier remove", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
				Remove: []string{"X-Secret"}}}}
		}, rtUnsupported("rule 1: a RequestHeaderModifier may only set headers")),
		httpCase("URLRewrite", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{}}}
		}, rtUnsupported("rule 1: filter URLRewrite is not supported")),
		httpCase("sessionPersistence", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].SessionPersistence = &gwv1.SessionPersistence{SessionName: rtPtr("s")}
		}, rtUnsupported("rule 1: sessionPersistence is not supported")),
		httpCase("backendRef filters", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].BackendRefs[0].Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier,
				RequestHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: "X-A", Value: "1"}}}}}
		}, rtUnsupported("rule 1: backendRefs[].filters are not supported")),
		httpCase("hostnames", func(r *gwv1.HTTPRoute) { r.Spec.Hostnames = []gwv1.Hostname{"cart.example.com"} },
			rtUnsupported("hostnames are not supported")),
		httpCase("problems of two rules", func(r *gwv1.HTTPRoute) {
			r.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Method: rtPtr(gwv1.HTTPMethodGet)}}
			r.Spec.Rules = append(r.Spec.Rules, gwv1.HTTPRouteRule{Timeouts: &gwv1.HTTPRouteTimeouts{BackendRequest: rtPtr(gwv1.Duration("1s"))}})
		}, rtUnsupported("rule 1: matches[].method is not supported", "rule 2: timeouts.backendRequest is not supported")),
		httpCase("parentRef port and backends", func(r *gwv1.HTTPRoute) {
			r.Spec.ParentRefs = []gwv1.ParentReference{rtParentWith("cart", func(p *gwv1.ParentReference) { p.Port = rtPtr(int32(9090)) })}
			r.Spec.Rules[0].BackendRefs = rtHTTPBackends(
				rtRef("cart", 9090, func(b *gwv1.BackendRef) { b.Weight = rtPtr(int32(9)) }),
				rtImportRef("cart", nil, rtPtr(int32(1))),
				rtRef("cart", 9090, func(b *gwv1.BackendRef) { b.Namespace = rtPtr(gwv1.Namespace("other")) }),
			)
		}, rtWant{service: "cart", resolved: rtFalse(gwv1.RouteReasonRefNotPermitted, "other/cart"),
			route: http(9090, traffic.Rule{Backends: []traffic.Backend{
				{Kind: traffic.BackendService, Name: "cart", Port: 9090, Weight: 9},
				{Kind: traffic.BackendServiceImport, Name: "cart", Weight: 1},
			}})}),
		httpCase("Gateway parent only", func(r *gwv1.HTTPRoute) { r.Spec.ParentRefs = []gwv1.ParentReference{{Name: "gw"}} }),
		httpCase("unexported parent", func(r *gwv1.HTTPRoute) { r.Spec.ParentRefs = []gwv1.ParentReference{rtParent("internal")} },
			rtWant{service: "internal", accepted: rtFalse(gwv1.RouteReasonNoMatchingParent, "not exported")}),
		httpCase("17 rules", func(r *gwv1.HTTPRoute) {
			for len(r.Spec.Rules) < 17 {
				r.Spec.Rules = append(r.Spec.Rules, r.Spec.Rules[0])
			}
		}, rtUnsupported(`HTTPRoute "cart-route": 17 rules (at most 16)`)),
	})
}

// TestFromRouteSharesNothing: attachments of one route to two parents do not
// share their ports, and the route's conversion does not change its object.
func TestFromRouteSharesNothing(t *testing.T) {
	r := rtGRPC(func(r *gwv1.GRPCRoute) {
		r.Spec.ParentRefs = []gwv1.ParentReference{
			rtParentWith("cart", func(p *gwv1.ParentReference) { p.Port = rtPtr(int32(8080)) }),
			rtParentWith("cart", func(p *gwv1.ParentReference) { p.Port = rtPtr(int32(9090)) }),
		}
		r.Spec.Rules[0].Matches = []gwv1.GRPCRouteMatch{{Headers: []gwv1.GRPCHeaderMatch{{Name: "X-Upper", Value: "v"}}}}
	})
	before := r.DeepCopy()
	as := kubetraffic.FromGRPCRoute(r, rtLookup)
	// The model carries one port per route and Service: the second
	// parentRef to another port of cart is not accepted, and says why.
	if len(as) != 2 || as[0].Route == nil || as[1].Route != nil {
		t.Fatalf("attachments:\n%s", rtJSON(as))
	}
	if as[0].Route.Port != 8080 {
		t.Errorf("port %d, want 8080", as[0].Route.Port)
	}
	if a := as[1].Accepted; a.Status != metav1.ConditionFalse || a.Reason != string(gwv1.RouteReasonUnsupportedValue) ||
		!strings.Contains(a.Message, "another port") {
		t.Errorf("second parent's Accepted = %+v, want False UnsupportedValue naming the other port", a)
	}
	for i := range as {
		if !reflect.DeepEqual(as[i].ParentRef, r.Spec.ParentRefs[i]) {
			t.Errorf("attachment %d: parentRef %+v, want %+v", i, as[i].ParentRef, r.Spec.ParentRefs[i])
		}
	}
	if !reflect.DeepEqual(r, before) {
		t.Errorf("the route object changed:\n%s\nwas\n%s", rtJSON(r), rtJSON(before))
	}
}
