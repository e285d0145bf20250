package spoke

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/registry"
)

// memorySource is a KubeSource over in-memory caches: services, and the
// objects of each traffic kind (indexed as watchTrafficKind indexes them).
func memorySource(t *testing.T, services []*corev1.Service, objs map[trafficKind][]*unstructured.Unstructured) *KubeSource {
	t.Helper()
	k := NewKubeSource(nil, BuildOptions{ExportAll: true}, NamespaceFilter{}, nil)
	svcIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, s := range services {
		if err := svcIdx.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	k.services = corelisters.NewServiceLister(svcIdx)
	for kind := range trafficKinds {
		idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{byParentIndex: func(obj any) ([]string, error) {
			var keys []string
			for _, p := range parentsOf(kind, obj.(*unstructured.Unstructured)) {
				keys = append(keys, p.String())
			}
			return keys, nil
		}})
		for _, o := range objs[kind] {
			if err := idx.Add(o); err != nil {
				t.Fatal(err)
			}
		}
		k.traffic[kind].Store(&trafficWatch{kind: kind, indexer: idx})
	}
	return k
}

func asUnstructured(t *testing.T, obj any) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// A GRPCRoute attached to two ports of one Service (two parentRefs, each
// with its sectionName: what the Gateway API's CEL rules ask for two refs
// to one parent): the shard carries it on the first port, and the second
// parent's status says it is not accepted, and why, rather than claim a
// route its clients never see.
func TestRouteOnTwoPortsOfOneService(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "echo"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
		{Name: "grpc", Port: 8080, Protocol: corev1.ProtocolTCP}, {Name: "admin", Port: 9090, Protocol: corev1.ProtocolTCP}}}}
	core, kind := gwv1.Group(""), gwv1.Kind("Service")
	grpcPort, adminPort := gwv1.SectionName("grpc"), gwv1.SectionName("admin")
	route := &gwv1.GRPCRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: "gateway.networking.k8s.io/v1", Kind: "GRPCRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "echo", Generation: 1, ResourceVersion: "1"},
		Spec: gwv1.GRPCRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{
				{Group: &core, Kind: &kind, Name: "echo", SectionName: &grpcPort},
				{Group: &core, Kind: &kind, Name: "echo", SectionName: &adminPort},
			}},
			Rules: []gwv1.GRPCRouteRule{{BackendRefs: []gwv1.GRPCBackendRef{{BackendRef: gwv1.BackendRef{
				BackendObjectReference: gwv1.BackendObjectReference{Group: &core, Kind: &kind, Name: "echo-v2", Port: ptrTo(gwv1.PortNumber(8080))}}}}}},
		},
	}
	k := memorySource(t, []*corev1.Service{svc}, map[trafficKind][]*unstructured.Unstructured{kindGRPCRoute: {asUnstructured(t, route)}})
	key := registry.ServiceKey{Namespace: "demo", Name: "echo"}
	set, problem := k.trafficOf(key)
	if problem != "" {
		t.Fatalf("trafficOf: %s", problem)
	}
	carried := map[int32]bool{}
	for _, r := range set.Routes {
		carried[r.Port] = true
	}
	_, entries, err := k.statusEntries(kindGRPCRoute, asUnstructured(t, route))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		section, _ := e.ref["sectionName"].(string)
		port := map[string]int32{"grpc": 8080, "admin": 9090}[section]
		if e.conditions[0].Status == metav1.ConditionTrue && !carried[port] {
			t.Errorf("parentRef sectionName %s (port %d) is Accepted, but the shard carries the route on ports %v only", section, port, carried)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// A TrafficPolicy targeting a Service the spoke does not export is not
// Accepted (no shard carries it), as a route on the same Service is
// NoMatchingParent: "not exported".
func TestPolicyOnAnUnexportedServiceIsNotAccepted(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "echo"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
		{Name: "grpc", Port: 8080, Protocol: corev1.ProtocolTCP}}}}
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "nave.io/v1alpha1", "kind": "TrafficPolicy",
		"metadata": map[string]any{"namespace": "demo", "name": "echo", "generation": int64(1)},
		"spec": map[string]any{
			"targetRefs":   []any{map[string]any{"group": "", "kind": "Service", "name": "echo"}},
			"loadBalancer": map[string]any{"algorithm": "LeastRequest"},
		},
	}}
	k := memorySource(t, []*corev1.Service{svc}, map[trafficKind][]*unstructured.Unstructured{kindTrafficPolicy: {policy}})
	k.opts.ExportAll = false // echo has no ServiceExport and no export label
	key := registry.ServiceKey{Namespace: "demo", Name: "echo"}
	if k.isExported(svc) {
		t.Fatal("echo is exported")
	}
	_, entries, err := k.statusEntries(kindTrafficPolicy, policy)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if c := e.conditions[0]; c.Status == metav1.ConditionTrue {
			t.Errorf("policy on %s, which the spoke does not export: %s %s %q", key, c.Status, c.Reason, c.Message)
		}
	}
}
