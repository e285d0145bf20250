package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/internal/kubetest"
)

// gatewayCRDsDir holds the Gateway API CRDs `make generate` copies from the module.
var gatewayCRDsDir = filepath.Join(deployDir, "crds", "gateway-api")

// gatewayGroupVersion is the Gateway API's standard-channel group and version.
var gatewayGroupVersion = schema.GroupVersion{Group: gatewayv1.GroupName, Version: "v1"}

// TestGatewayAPIRoutes has a real API server take the Gateway API CRDs of
// deploy/crds/gateway-api and the routes Nave reads, written with the same
// module's Go types and created with strict field validation (so a field the
// types have and the CRD lacks fails): a GAMMA GRPCRoute whose parent is a
// Service, and an HTTPRoute whose weighted backends are a Service (this
// cluster's endpoints) and a ServiceImport (every cluster's, GEP-1748). Then
// it checks which HTTPRoute file is which: the standard CRD refuses `retry`,
// the experimental one, applied over it, keeps it.
func TestGatewayAPIRoutes(t *testing.T) {
	c := kubetest.StartClusters(t, "gatewayapi")[0]
	standard, err := filepath.Glob(filepath.Join(gatewayCRDsDir, "standard", "*.yaml"))
	if err != nil || len(standard) != 3 {
		t.Fatalf("want GRPCRoute, HTTPRoute and ReferenceGrant in %s/standard, have %v (%v): run `make generate`", gatewayCRDsDir, standard, err)
	}
	c.Apply(t, standard...)

	grpcRoute := &gatewayv1.GRPCRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: gatewayGroupVersion.String(), Kind: "GRPCRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "echo"},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{serviceParent("echo")}},
			Rules: []gatewayv1.GRPCRouteRule{{
				Matches: []gatewayv1.GRPCRouteMatch{{Method: &gatewayv1.GRPCMethodMatch{
					Type: ptr(gatewayv1.GRPCMethodMatchExact), Service: ptr("echo.Echo"), Method: ptr("Say"),
				}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{
					{BackendRef: serviceBackend("echo-v1", 90)},
					{BackendRef: serviceBackend("echo-v2", 10)},
				},
			}},
		},
	}
	got := &gatewayv1.GRPCRoute{}
	if err := createRoute(t, c, "grpcroutes", grpcRoute, got); err != nil {
		t.Fatalf("create GRPCRoute: %v", err)
	}
	sameJSON(t, "GRPCRoute parentRefs", got.Spec.ParentRefs, grpcRoute.Spec.ParentRefs)
	sameJSON(t, "GRPCRoute backendRefs", got.Spec.Rules[0].BackendRefs, grpcRoute.Spec.Rules[0].BackendRefs)

	httpRoute := &gatewayv1.HTTPRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: gatewayGroupVersion.String(), Kind: "HTTPRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{serviceParent("web")}},
			Rules: []gatewayv1.HTTPRouteRule{{
				BackendRefs: []gatewayv1.HTTPBackendRef{
					{BackendRef: serviceBackend("web", 80)},
					{BackendRef: gatewayv1.BackendRef{
						BackendObjectReference: gatewayv1.BackendObjectReference{
							Group: ptr(gatewayv1.Group("multicluster.x-k8s.io")),
							Kind:  ptr(gatewayv1.Kind("ServiceImport")),
							Name:  "web",
							Port:  ptr(gatewayv1.PortNumber(backendPort)),
						},
						Weight: ptr[int32](20),
					}},
				},
				Timeouts: &gatewayv1.HTTPRouteTimeouts{Request: ptr(gatewayv1.Duration("5s"))},
			}},
		},
	}
	gotHTTP := &gatewayv1.HTTPRoute{}
	if err := createRoute(t, c, "httproutes", httpRoute, gotHTTP); err != nil {
		t.Fatalf("create HTTPRoute: %v", err)
	}
	sameJSON(t, "HTTPRoute parentRefs", gotHTTP.Spec.ParentRefs, httpRoute.Spec.ParentRefs)
	sameJSON(t, "HTTPRoute backendRefs", gotHTTP.Spec.Rules[0].BackendRefs, httpRoute.Spec.Rules[0].BackendRefs)
	sameJSON(t, "HTTPRoute timeouts", gotHTTP.Spec.Rules[0].Timeouts, httpRoute.Spec.Rules[0].Timeouts)

	// retry is the experimental channel's: the standard CRD does not know it.
	retrying := httpRoute.DeepCopy()
	retrying.Name = "web-retry"
	retrying.Spec.Rules[0].Retry = &gatewayv1.HTTPRouteRetry{
		Codes: []gatewayv1.HTTPRouteRetryStatusCode{503}, Attempts: ptr(2), Backoff: ptr(gatewayv1.Duration("100ms")),
	}
	err = createRoute(t, c, "httproutes", retrying, &gatewayv1.HTTPRoute{})
	if err == nil || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("the standard HTTPRoute CRD took spec.rules[0].retry (error %v): is deploy/crds/gateway-api/standard/httproutes.yaml the experimental one?", err)
	}
	t.Logf("the standard HTTPRoute CRD refuses retry: %v", err)
	c.Apply(t, filepath.Join(gatewayCRDsDir, "experimental", "httproutes.yaml"))
	// The API server serves the new schema shortly after the CRD changes.
	gotRetry := &gatewayv1.HTTPRoute{}
	await(t, "the experimental HTTPRoute CRD to take retry", func() bool {
		err := createRoute(t, c, "httproutes", retrying, gotRetry)
		if err != nil && !strings.Contains(err.Error(), "retry") {
			t.Fatalf("create HTTPRoute with retry: %v", err)
		}
		return err == nil
	})
	sameJSON(t, "HTTPRoute retry", gotRetry.Spec.Rules[0].Retry, retrying.Spec.Rules[0].Retry)
}

// serviceParent is a GAMMA parent: the route applies to the callers of the Service.
func serviceParent(name string) gatewayv1.ParentReference {
	return gatewayv1.ParentReference{
		Group: ptr(gatewayv1.Group("")),
		Kind:  ptr(gatewayv1.Kind("Service")),
		Name:  gatewayv1.ObjectName(name),
		Port:  ptr(gatewayv1.PortNumber(backendPort)),
	}
}

// serviceBackend is a weighted backend that is a Service of the route's namespace.
func serviceBackend(name string, weight int32) gatewayv1.BackendRef {
	return gatewayv1.BackendRef{
		BackendObjectReference: gatewayv1.BackendObjectReference{
			Group: ptr(gatewayv1.Group("")),
			Kind:  ptr(gatewayv1.Kind("Service")),
			Name:  gatewayv1.ObjectName(name),
			Port:  ptr(gatewayv1.PortNumber(backendPort)),
		},
		Weight: ptr(weight),
	}
}

// createRoute creates a route with strict field validation, reads it back
// and decodes it into out. A route of the same name from an earlier,
// refused attempt cannot exist, so a create is enough.
func createRoute(t testing.TB, c *kubetest.Cluster, resource string, route metav1.Object, out any) error {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(route)
	if err != nil {
		t.Fatal(err)
	}
	client := c.Dynamic.Resource(gatewayGroupVersion.WithResource(resource)).Namespace(route.GetNamespace())
	if _, err := client.Create(t.Context(), &unstructured.Unstructured{Object: obj},
		metav1.CreateOptions{FieldManager: kubetest.FieldManager, FieldValidation: metav1.FieldValidationStrict}); err != nil {
		return err
	}
	u, err := client.Get(t.Context(), route.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read back %s %s: %v", resource, route.GetName(), err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatalf("decode %s %s: %v", resource, route.GetName(), err)
	}
	return nil
}

// sameJSON fails the test when got and want do not encode to the same JSON.
func sameJSON(t testing.TB, what string, got, want any) {
	t.Helper()
	g, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if string(g) != string(w) {
		t.Errorf("%s read back as %s, want %s", what, g, w)
	}
}
