package spoke

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Objects shaped like a real cluster's: what an informer would cache for
// them without strip.
func realisticNode(i int) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("node-%05d", i),
		Labels: map[string]string{
			corev1.LabelTopologyRegion: "us-east-1", corev1.LabelTopologyZone: "us-east-1a",
			"kubernetes.io/hostname": fmt.Sprintf("node-%05d", i), "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "m6i.2xlarge", "eks.amazonaws.com/nodegroup": "general-purpose",
		},
		Annotations:   map[string]string{"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
		ManagedFields: managedFields(6),
	}}
	for j := range 40 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("registry.example.com/team/app-%d@sha256:%064d", j, j), fmt.Sprintf("registry.example.com/team/app-%d:v1.%d.0", j, j)},
			SizeBytes: 123456789,
		})
	}
	for _, c := range []corev1.NodeConditionType{"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: "False", Reason: "KubeletHasSufficient" + string(c), Message: "kubelet has sufficient resources available"})
	}
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}
	n.Status.Allocatable = n.Status.Capacity
	return n
}

func realisticSlice(i int) *discoveryv1.EndpointSlice {
	port := int32(8080)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("svc-%d-abcde", i), Namespace: "apps",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", i), discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app.kubernetes.io/name": "app", "app.kubernetes.io/part-of": "shop",
			},
			Annotations:   map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-21T10:00:00Z"},
			ManagedFields: managedFields(1),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: fmt.Sprintf("svc-%d", i),
				UID: "0f0f0f0f-0000-0000-0000-000000000000", Controller: new(true), BlockOwnerDeletion: new(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: &port, Protocol: new(corev1.ProtocolTCP)}},
	}
	for j := range 10 {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", i/65536%256, i/256%256, j)},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)},
			NodeName:   new(fmt.Sprintf("node-%05d", j)),
			Zone:       new("us-east-1a"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "apps", Name: fmt.Sprintf("app-%d-7d9f8b6c5d-x%dz", i, j), UID: "1f1f1f1f-0000-0000-0000-000000000000"},
			Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "us-east-1a"}}},
		})
	}
	return es
}

func realisticService(i int) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("svc-%d", i), Namespace: "apps",
			Labels: map[string]string{ExportLabel: "true", "app.kubernetes.io/name": "app", "helm.sh/chart": "app-1.2.3"},
			Annotations: map[string]string{
				"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat(`{"apiVersion":"v1","kind":"Service"}`, 20),
				"meta.helm.sh/release-name":                        "shop",
			},
			ManagedFields: managedFields(2),
		},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.1.1", ClusterIPs: []string{"10.96.1.1"},
			Selector: map[string]string{"app.kubernetes.io/name": "app"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
}

func managedFields(n int) []metav1.ManagedFieldsEntry {
	out := make([]metav1.ManagedFieldsEntry, n)
	for i := range out {
		out[i] = metav1.ManagedFieldsEntry{Manager: fmt.Sprintf("manager-%d", i), Operation: "Update", APIVersion: "v1",
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(strings.Repeat(`{"f:metadata":{"f:labels":{}}},`, 30))}
	}
	return out
}

// retained measures the heap that n objects made by mk keep alive, with or
// without strip applied as the informers apply it.
func retained(n int, mk func(int) any, stripped bool) float64 {
	objs := make([]any, n)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range objs {
		objs[i] = mk(i)
		if stripped {
			objs[i], _ = strip(objs[i])
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(objs)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// BenchmarkInformerMemory reports the heap each cached object costs the
// spoke, as the API server sends it (raw) and as strip keeps it.
func BenchmarkInformerMemory(b *testing.B) {
	for _, kind := range []struct {
		name string
		mk   func(int) any
	}{
		{"Node", func(i int) any { return realisticNode(i) }},
		{"EndpointSlice-10-endpoints", func(i int) any { return realisticSlice(i) }},
		{"Service", func(i int) any { return realisticService(i) }},
	} {
		b.Run(kind.name, func(b *testing.B) {
			var raw, kept float64
			for b.Loop() {
				raw, kept = retained(2000, kind.mk, false), retained(2000, kind.mk, true)
			}
			b.ReportMetric(raw, "B/object-raw")
			b.ReportMetric(kept, "B/object-kept")
		})
	}
}
