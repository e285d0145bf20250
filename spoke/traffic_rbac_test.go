package spoke

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/navemesh/nave/registry"
)

// A cluster that serves the Gateway API CRDs (many do: a mesh or an
// ingress installed them) and a spoke whose ClusterRole does not grant
// routes and policies (an older release's RBAC, or an operator who leaves
// traffic policy out): the route informers' lists are Forbidden, and the
// spoke federates its Services without routes, saying why, rather than
// wait for a sync that never comes.
func TestTrafficForbiddenDoesNotHoldTheFirstStateBack(t *testing.T) {
	f := newKubeFixture(t, true)
	f.cluster.Apply(t, "../deploy/crds/gateway-api/standard/grpcroutes.yaml", "../deploy/crds/gateway-api/standard/httproutes.yaml",
		"../deploy/crds/trafficpolicies.yaml")
	roles := f.kc.RbacV1().ClusterRoles()
	role, err := roles.Get(t.Context(), "nave-spoke", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.Rules = slices.DeleteFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, "gateway.networking.k8s.io") || slices.Contains(r.APIGroups, "nave.io")
	})
	if _, err := roles.Update(t.Context(), role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := registry.ServiceKey{Namespace: "apps", Name: "web"}
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}},
		kubeService("apps", "web", exportLabel, corev1.ServicePort{Name: "http", Port: 80}))
	_, latest, _ := f.startSource(nil)
	await(t, latest, "the first state, with web", func(st State) bool { return st[web] != nil })
}

// The GRPCRoute CRD is installed while the spoke runs, and leads: the
// informer's add events queue each route's status before watchTrafficKind
// stores the kind's cache (after the sync), so the status worker may find
// no cache and forget them; once the cache is stored every route's status
// is queued again, so a route whose parent Service does not exist still
// gets its NoMatchingParent status.
func TestRouteStatusWhenTheCRDComesLater(t *testing.T) {
	f := newKubeFixture(t, true)
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}})
	_, latest, _ := f.startSource(func(_ *Config, k *KubeSource) { k.ExportsRecheck = 3 * time.Second })
	await(t, latest, "the first state", func(State) bool { return true })
	f.cluster.Apply(t, "../deploy/crds/gateway-api/standard/grpcroutes.yaml")
	routes := f.cluster.Dynamic.Resource(trafficResources[kindGRPCRoute]).Namespace("apps")
	route := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
		"metadata": map[string]any{"namespace": "apps", "name": "ghost"},
		"spec": map[string]any{
			"parentRefs": []any{map[string]any{"group": "", "kind": "Service", "name": "ghost", "port": int64(8080)}},
			"rules":      []any{map[string]any{}},
		},
	}}
	if _, err := routes.Create(t.Context(), route, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		u, err := routes.Get(t.Context(), "ghost", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		parents, _, _ := unstructured.NestedSlice(u.Object, "status", "parents")
		if len(parents) > 0 {
			t.Logf("status.parents: %v", parents)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("route ghost (parent Service ghost does not exist) has no status.parents 20 s after its CRD was installed")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
