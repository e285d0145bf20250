package importwriter

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/internal/mcsstatus"
	"github.com/navemesh/nave/registry"
)

// The writer's informers keep only part of each object (leanImported):
// whatever it reads and compares must come out of the cache as it went in,
// or the writer would rewrite objects forever, or miss a change by someone
// else.
func TestLeanImportedKeepsWhatTheWriterReads(t *testing.T) {
	key := registry.ServiceKey{Namespace: "shop", Name: "web"}
	imp := iwImport(t, key, []string{"10.200.0.10"},
		iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(1, 3), props: registry.Properties{
			SessionAffinity: registry.SessionAffinityClientIP, SessionAffinityTimeout: 300,
			IPFamilies: []registry.IPFamily{registry.IPv4, registry.IPv6},
			Labels:     map[string]string{"example.com/team": "shop"}, Annotations: map[string]string{"example.com/owner": "alice"}}})
	owner := metav1.OwnerReference{APIVersion: "multicluster.x-k8s.io/v1beta1", Kind: "ServiceImport", Name: "web",
		UID: "si-uid", Controller: refTo(true)}
	// What the API server adds, and what others may add, to every object.
	server := func(m *metav1.ObjectMeta) {
		m.UID, m.ResourceVersion, m.Generation = types.UID("uid-"+m.Name), "4711", 3
		m.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		m.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationUpdate,
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{}}`)}}
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		m.Labels["example.com/someone-else"] = "x"
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations["example.com/someone-else"] = "x"
	}

	t.Run("EndpointSlice", func(t *testing.T) {
		s := imports.Slices(imp, nil)[0]
		orig := desiredSlice(key, &s, owner, imports.DerivedServiceName(key))
		server(&orig.ObjectMeta)
		got, err := leanImported(orig.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		es := got.(*keptSlice)
		if es.owned != ownedSum(sliceOwned(orig)) {
			t.Errorf("owned sum %q, want that of %v", es.owned, sliceOwned(orig))
		}
		want, _ := importedSlice(orig)
		if !es.readable || !reflect.DeepEqual(es.prev, want.Prev()) {
			t.Errorf("kept for packing %+v, want %+v", es.prev, want.Prev())
		}
		k, _ := objectKey(kindEndpointSlice, es)
		if !owned(es) || k != key || es.UID != orig.UID || es.ResourceVersion != orig.ResourceVersion || es.Name != orig.Name {
			t.Errorf("metadata %+v", es.ObjectMeta)
		}
		if es.ManagedFields != nil || es.Annotations != nil || es.OwnerReferences != nil || es.Labels != nil {
			t.Errorf("kept what the writer never reads, or labels as a map: %+v", es.ObjectMeta)
		}
		ownedLabels := maps.Clone(orig.Labels)
		maps.DeleteFunc(ownedLabels, func(k, _ string) bool { return !slices.Contains(sliceLabelKeys[:], k) })
		if got, want := es.GetLabels(), ownedLabels; len(want) < 4 || !maps.Equal(got, want) {
			t.Errorf("labels %v, want those Nave owns: %v", got, want)
		}
		if got := es.label(mcsv1beta1.LabelSourceCluster); got != orig.Labels[mcsv1beta1.LabelSourceCluster] || got == "" {
			t.Errorf("source cluster label %q", got)
		}
		if again, _ := leanImported(es); again != es {
			t.Error("not idempotent")
		}
	})

	t.Run("Service", func(t *testing.T) {
		orig := desiredService(imp, owner)
		server(&orig.ObjectMeta)
		orig.Annotations[requestedIPsAnnotation] = "10.200.0.10"
		orig.Annotations[refusedAnnotation] = "not in any range"
		orig.Annotations[refusedCIDRsAnnotation] = ""
		// A cluster that is not dual-stack gives the first family of PreferDualStack.
		orig.Spec.ClusterIP, orig.Spec.ClusterIPs, orig.Spec.IPFamilies = "10.96.0.7", []string{"10.96.0.7"}, []corev1.IPFamily{corev1.IPv4Protocol}
		orig.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}
		got, err := leanImported(orig.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		svc := got.(*keptService)
		if svc.owned != ownedSum(serviceOwned(orig)) {
			t.Errorf("owned sum %q, want that of %v", svc.owned, serviceOwned(orig))
		}
		other := desiredService(imp, owner)
		other.Spec.Ports[0].Port++
		if svc.owned == ownedSum(serviceOwned(other)) {
			t.Error("a Service with another port has the same sum")
		}
		if !reflect.DeepEqual(serviceIPs(svc), orig.Spec.ClusterIPs) {
			t.Errorf("IPs %v, want %v", serviceIPs(svc), orig.Spec.ClusterIPs)
		}
		for _, l := range []string{ManagedByLabel, mcsv1beta1.LabelServiceName, "example.com/other"} {
			if got, want := label(svc, l), orig.Labels[l]; got != want {
				t.Errorf("label %s: %q, want %q", l, got, want)
			}
		}
		k, _ := objectKey(kindService, svc)
		if !owned(svc) || k != key || svc.UID != orig.UID || svc.ResourceVersion != orig.ResourceVersion || svc.Name != orig.Name {
			t.Errorf("metadata %+v, labels %v", svc.ObjectMeta, svc.GetLabels())
		}
		if svc.ManagedFields != nil || svc.Labels != nil || svc.Annotations != nil || svc.OwnerReferences != nil {
			t.Errorf("kept what the sum stands for: %+v", svc.ObjectMeta)
		}
		for _, a := range createdAnnotations {
			if v, ok := svc.annotation(a); !ok || v != orig.Annotations[a] {
				t.Errorf("annotation %s: %q, want %q", a, v, orig.Annotations[a])
			}
		}
		// What decides whether it is made anew is kept.
		r := &importRun{}
		desired := desiredService(imp, owner)
		for _, tc := range []struct {
			change    func(*corev1.Service)
			requested string
			want      string // a prefix of the reason; "" for none
		}{
			{nil, "10.200.0.10", ""},
			{nil, "10.200.0.20", "the clusterset IPs changed"},
			{nil, "", "the clusterset IPs changed"},
			{func(s *corev1.Service) { delete(s.Annotations, requestedIPsAnnotation) }, "", "the clusterset IPs changed"},
			{func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }, "10.200.0.10", "its type"},
			{func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }, "10.200.0.10", "its type"},
			{func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} }, "10.200.0.10", "its IP families"},
			{func(s *corev1.Service) { s.Spec.IPFamilyPolicy = refTo(corev1.IPFamilyPolicySingleStack) }, "10.200.0.10", "its IP families"},
		} {
			s := orig.DeepCopy()
			if tc.change != nil {
				tc.change(s)
			}
			if got := r.needsRecreate(keepService(s), desired, tc.requested); !strings.HasPrefix(got, tc.want) || (tc.want == "") != (got == "") {
				t.Errorf("needsRecreate(%q) = %q, want %q...", tc.requested, got, tc.want)
			}
		}
		if again, _ := leanImported(svc); again != svc {
			t.Error("not idempotent")
		}
	})

	t.Run("ServiceImport", func(t *testing.T) {
		for _, version := range []string{mcsv1beta1.GroupVersion.String(), mcsv1alpha1.GroupVersion.String()} {
			si := desiredServiceImport(imp, []string{"10.200.0.10"})
			server(&si.ObjectMeta)
			si.Status = mcsv1beta1.ServiceImportStatus{
				Clusters: []mcsv1beta1.ClusterStatus{{Cluster: "east"}, {Cluster: "west"}},
				Conditions: []metav1.Condition{
					{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonReady, Message: "written",
						ObservedGeneration: 3, LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))},
					{Type: "SomeoneElses", Status: metav1.ConditionFalse, Reason: "Because", Message: "theirs",
						LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC))},
				},
			}
			// As the dynamic client decodes it: JSON's types, integers as int64.
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(mustJSONBytes(t, toMap(si), version)); err != nil {
				t.Fatal(err)
			}
			got, err := leanImported(u.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			lean, ok := got.(*keptServiceImport)
			if !ok {
				t.Fatalf("%s: cached as %T", version, got)
			}
			// The owned part is kept as its sum: that of the object as the API server has it.
			owned := map[string]any{"metadata": pick(u.Object["metadata"], "labels", "annotations"), "spec": u.Object["spec"]}
			if got, want := lean.owned, ownedSum(owned); got != want {
				t.Errorf("%s: owned sum %q, want %q", version, got, want)
			}
			if got, want := lean.owned, ownedSum(serviceImportOwned(desiredServiceImport(imp, []string{"10.200.0.10"}))); got == want {
				t.Errorf("%s: the sum of a ServiceImport with others' labels and annotations is the desired one's", version)
			}
			// The status is kept as the sum of what the writer compares of it.
			if got, want := lean.status, statusSum(u.Object["status"].(map[string]any)); got != want {
				t.Errorf("%s: status sum %q, want %q", version, got, want)
			}
			ready := mcsstatus.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonReady, Message: "written"}
			clusters := []any{map[string]any{"cluster": "east"}, map[string]any{"cluster": "west"}}
			if lean.status != wantedSum([]mcsstatus.Condition{ready}, clusters, 3) {
				t.Errorf("%s: the status sum is not that of the status the writer wrote", version)
			}
			if lean.bare {
				t.Errorf("%s: a status with conditions kept as bare", version)
			}
			noStatus := u.DeepCopy()
			delete(noStatus.Object, "status")
			if kept, _ := leanImported(noStatus); !kept.(*keptServiceImport).bare {
				t.Errorf("%s: a ServiceImport without status not kept as bare", version)
			}
			if lean.UID != si.UID || lean.ResourceVersion != si.ResourceVersion || lean.Generation != si.Generation ||
				lean.Name != si.Name || lean.Namespace != si.Namespace || lean.ManagedFields != nil {
				t.Errorf("%s: metadata %+v", version, lean.ObjectMeta)
			}
			if lean.Labels != nil || lean.Annotations != nil {
				t.Errorf("%s: kept what the sum stands for: %+v", version, lean.ObjectMeta)
			}
			if again, _ := leanImported(lean); again != lean {
				t.Errorf("%s: not idempotent", version)
			}
		}

		// One that does not read as a ServiceImport keeps its metadata: the writer writes the rest anew.
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": mcsv1beta1.GroupVersion.String(), "kind": "ServiceImport",
			"metadata": map[string]any{"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "9", "generation": int64(2),
				"labels": map[string]any{ManagedByLabel: ManagedByValue}},
			"spec": map[string]any{"ports": "not a list"},
		}}
		got, _ := leanImported(u)
		lean := got.(*keptServiceImport)
		if lean.Name != "web" || lean.UID != "u1" || lean.ResourceVersion != "9" || lean.Generation != 2 ||
			lean.Labels != nil || lean.owned == ownedSum(serviceImportOwned(desiredServiceImport(imp, []string{"10.200.0.10"}))) {
			t.Errorf("unreadable ServiceImport cached as %+v (the writer must find it unlike the desired one)", lean)
		}
	})
}

// A slice the writer keeps no copy of is patched with what it owns whole:
// the patch makes the slice the desired one, and leaves what others wrote.
func TestSlicePatchMakesTheSliceDesired(t *testing.T) {
	key := registry.ServiceKey{Namespace: "shop", Name: "web"}
	owner := metav1.OwnerReference{APIVersion: "multicluster.x-k8s.io/v1beta1", Kind: "ServiceImport", Name: "web",
		UID: "si-uid", Controller: refTo(true)}
	imp := iwImport(t, key, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(1, 3)})
	s := imports.Slices(imp, nil)[0]
	orig := desiredSlice(key, &s, owner, imports.DerivedServiceName(key))
	orig.UID, orig.ResourceVersion = "uid-1", "7"
	orig.Labels["example.com/someone-else"] = "x"
	orig.Annotations = map[string]string{"example.com/someone-else": "x"}
	cur := keepSlice(orig.DeepCopy())

	changes := map[string]func(d *discoveryv1.EndpointSlice){
		"an endpoint not ready": func(d *discoveryv1.EndpointSlice) { d.Endpoints[0].Conditions.Ready = refTo(false) },
		"an endpoint less":      func(d *discoveryv1.EndpointSlice) { d.Endpoints = d.Endpoints[1:] },
		"no derived Service":    func(d *discoveryv1.EndpointSlice) { delete(d.Labels, discoveryv1.LabelServiceName) },
		"another port":          func(d *discoveryv1.EndpointSlice) { d.Ports[0].Port = refTo(int32(8081)) },
		"no ports":              func(d *discoveryv1.EndpointSlice) { d.Ports = nil },
		"another owner":         func(d *discoveryv1.EndpointSlice) { d.OwnerReferences[0].UID = "si-uid-2" },
	}
	for name, change := range changes {
		desired := desiredSlice(key, &s, owner, imports.DerivedServiceName(key))
		change(desired)
		want := sliceOwned(desired)
		if ownedSum(want) == cur.owned {
			t.Errorf("%s: the desired slice has the cached sum", name)
			continue
		}
		doc, err := json.Marshal(orig)
		if err != nil {
			t.Fatal(err)
		}
		patch, err := json.Marshal(slicePatch(cur, want))
		if err != nil {
			t.Fatal(err)
		}
		out, err := jsonpatch.MergePatch(doc, patch)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got discoveryv1.EndpointSlice
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if d := mergePatch(sliceOwned(&got), want); d != nil {
			t.Errorf("%s: after the patch, %v still differs", name, d)
		}
		if got.Labels["example.com/someone-else"] != "x" || got.Annotations["example.com/someone-else"] != "x" || got.UID != orig.UID {
			t.Errorf("%s: the patch changed what Nave does not own: %+v", name, got.ObjectMeta)
		}
	}
}

// The sum of an owned part stands in for it in the cache: two parts have
// the same sum exactly when mergePatch finds nothing to change between them.
func TestOwnedSumIsMergePatchEquality(t *testing.T) {
	parts := []map[string]any{
		{},
		{"spec": nil},
		{"spec": map[string]any{}},
		{"spec": map[string]any{"ips": []any{}}},
		{"spec": map[string]any{"ips": nil, "type": "Headless"}},
		{"spec": map[string]any{"type": "Headless"}},
		{"spec": map[string]any{"type": "ClusterSetIP"}},
		{"spec": map[string]any{"type": "ClusterSetIP", "ips": []any{"10.0.0.1"}}},
		{"spec": map[string]any{"type": "ClusterSetIP", "ips": []any{"10.0.0.2"}}},
		{"spec": map[string]any{"type": "ClusterSetIP", "ips": []any{"10.0.0.1", "10.0.0.2"}}},
		{"spec": map[string]any{"ports": []any{map[string]any{"port": int64(80)}}}},
		{"spec": map[string]any{"ports": []any{map[string]any{"port": int64(80), "name": nil}}}},
		{"spec": map[string]any{"ports": []any{map[string]any{"port": int64(81)}}}},
		{"spec": map[string]any{"sessionAffinityConfig": map[string]any{"clientIP": map[string]any{}}}},
		{"spec": map[string]any{"sessionAffinityConfig": map[string]any{"clientIP": map[string]any{"timeoutSeconds": nil}}}},
		{"spec": map[string]any{"sessionAffinityConfig": map[string]any{"clientIP": map[string]any{"timeoutSeconds": int64(300)}}}},
		{"metadata": map[string]any{"labels": map[string]any{"a": "1"}}},
		{"metadata": map[string]any{"labels": map[string]any{"a": "1"}, "annotations": map[string]any{}}},
		{"metadata": map[string]any{"labels": map[string]any{"a": "2"}}},
		{"metadata": map[string]any{"labels": map[string]any{"a": "1", "b": "1"}}},
		{"metadata": map[string]any{"annotations": map[string]any{"a": "1"}}},
	}
	for i, a := range parts {
		for j, b := range parts {
			alike := mergePatch(a, b) == nil && mergePatch(b, a) == nil
			if same := ownedSum(a) == ownedSum(b); same != alike {
				t.Errorf("%v and %v: same sum %v, mergePatch finds them alike %v", a, b, same, alike)
			}
			if i == j && !alike {
				t.Errorf("%v is not alike itself", a)
			}
		}
	}
}

// A kept ServiceImport's status sum is the wanted one exactly when
// statusUpdate finds nothing to write: otherwise the writer would miss a
// status change, or read the ServiceImport at every sync.
func TestStatusSumIsStatusUpdateEquality(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ready := mcsstatus.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonReady, Message: "written"}
	refused := mcsstatus.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonRefused, Message: "no"}
	ip := mcsstatus.Condition{Type: ConditionClusterSetIP, Status: metav1.ConditionTrue, Reason: ReasonAllocated, Message: "10.200.0.1"}
	wants := [][]mcsstatus.Condition{{ready}, {refused}, {ready, ip}}
	east := []any{map[string]any{"cluster": "east"}}
	both := []any{map[string]any{"cluster": "east"}, map[string]any{"cluster": "west"}}
	clusterLists := [][]any{{}, east, both}
	cond := func(c mcsstatus.Condition, generation int64, transition time.Time) metav1.Condition {
		return metav1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message,
			ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(transition)}
	}
	theirs := metav1.Condition{Type: "SomeoneElses", Status: metav1.ConditionTrue, Reason: "Because", Message: "theirs",
		LastTransitionTime: metav1.NewTime(now)}
	// Generation 0: a ServiceImport without a status subresource, whose
	// conditions carry no observed generation.
	for _, g := range []int64{3, 0} {
		var statuses []mcsv1beta1.ServiceImportStatus
		statuses = append(statuses, mcsv1beta1.ServiceImportStatus{})
		for _, want := range wants {
			for _, clusters := range []([]mcsv1beta1.ClusterStatus){nil, {{Cluster: "east"}}, {{Cluster: "east"}, {Cluster: "west"}}} {
				var conds []metav1.Condition
				for _, c := range want {
					conds = append(conds, cond(c, g, now))
				}
				statuses = append(statuses,
					mcsv1beta1.ServiceImportStatus{Clusters: clusters, Conditions: conds},
					mcsv1beta1.ServiceImportStatus{Clusters: clusters, Conditions: append(slices.Clone(conds), theirs)},
					mcsv1beta1.ServiceImportStatus{Clusters: clusters, Conditions: append([]metav1.Condition{theirs}, conds...)},
					mcsv1beta1.ServiceImportStatus{Clusters: clusters, Conditions: append(slices.Clone(conds), cond(ip, g, now))},
					mcsv1beta1.ServiceImportStatus{Clusters: clusters, Conditions: append(slices.Clone(conds), cond(refused, g, now))},
				)
				stale, untimed, moved, flipped, reasoned := slices.Clone(conds), slices.Clone(conds), slices.Clone(conds), slices.Clone(conds), slices.Clone(conds)
				stale[0].ObservedGeneration = 2
				untimed[0].LastTransitionTime = metav1.Time{}
				moved[0].Message += "!"
				flipped[len(flipped)-1].Status = metav1.ConditionUnknown
				reasoned[len(reasoned)-1].Reason += "Too"
				for _, c := range [][]metav1.Condition{stale, untimed, moved, flipped, reasoned} {
					statuses = append(statuses, mcsv1beta1.ServiceImportStatus{Clusters: clusters, Conditions: c})
				}
			}
		}
		for _, st := range statuses {
			current := toMap(&st)
			for _, want := range wants {
				for _, clusters := range clusterLists {
					unchanged := statusUpdate(current, want, clusters, g, now.Add(time.Hour)) == nil
					if same := statusSum(current) == wantedSum(want, clusters, g); same != unchanged {
						t.Errorf("generation %d, status %+v, want %v in %v: same sum %v, nothing to write %v", g, st, want, clusters, same, unchanged)
					}
				}
			}
		}
	}
	// What the writer writes reads as wanted.
	for _, g := range []int64{3, 0} {
		written := statusUpdate(map[string]any{}, wants[2], both, g, now)
		if statusUpdate(written, wants[2], both, g, now.Add(time.Hour)) != nil || statusSum(written) != wantedSum(wants[2], both, g) {
			t.Errorf("generation %d: the status the writer wrote is not as wanted: %v", g, written)
		}
	}
}

func mustJSONBytes(t *testing.T, m map[string]any, apiVersion string) []byte {
	t.Helper()
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(apiVersion)
	u.SetKind(mcsv1beta1.ServiceImportKindName)
	b, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The writer's own writes coming back from its informers are told apart
// from everyone else's changes: only the version it wrote (or the deletion
// of the object it deleted) is its own, and it is its own once.
func TestWrittenObjectsTellTheWritersOwnEvents(t *testing.T) {
	key := registry.ServiceKey{Namespace: "ns", Name: "web"}
	slice := func(uid, rv string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", UID: types.UID(uid),
			ResourceVersion: rv, Labels: map[string]string{mcsv1beta1.LabelServiceName: "web"}}}
	}
	for _, tc := range []struct {
		name  string
		write func(w *writtenObjects)
		event *discoveryv1.EndpointSlice
		gone  bool
		own   bool
	}{
		{"the version it wrote", func(w *writtenObjects) { w.put(kindEndpointSlice, key, slice("u1", "10")) }, slice("u1", "10"), false, true},
		{"a newer version", func(w *writtenObjects) { w.put(kindEndpointSlice, key, slice("u1", "10")) }, slice("u1", "11"), false, false},
		{"an older version", func(w *writtenObjects) { w.put(kindEndpointSlice, key, slice("u1", "10")) }, slice("u1", "9"), false, false},
		{"another object of that name", func(w *writtenObjects) { w.put(kindEndpointSlice, key, slice("u1", "10")) }, slice("u2", "10"), false, false},
		{"its deletion by someone", func(w *writtenObjects) { w.put(kindEndpointSlice, key, slice("u1", "10")) }, slice("u1", "10"), true, false},
		{"nothing written", func(*writtenObjects) {}, slice("u1", "10"), false, false},
		{"the deletion it made", func(w *writtenObjects) { w.deleted(kindEndpointSlice, key, slice("u1", "10")) }, slice("u1", "10"), true, true},
		{"a recreation after its deletion", func(w *writtenObjects) { w.deleted(kindEndpointSlice, key, slice("u1", "10")) }, slice("u2", "12"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWrittenObjects()
			tc.write(w)
			if got := w.observe(kindEndpointSlice, tc.event, tc.gone); got != tc.own {
				t.Fatalf("observe: own = %v, want %v", got, tc.own)
			}
			if w.observe(kindEndpointSlice, tc.event, tc.gone) {
				t.Fatal("the same event was the writer's own twice")
			}
		})
	}
	t.Run("an earlier version it wrote, then the later one", func(t *testing.T) {
		w := newWrittenObjects()
		w.put(kindEndpointSlice, key, slice("u1", "10"))
		w.put(kindEndpointSlice, key, slice("u1", "12"))
		if w.observe(kindEndpointSlice, slice("u1", "11"), false) {
			t.Fatal("a version between the writer's two was its own")
		}
		if !w.observe(kindEndpointSlice, slice("u1", "10"), false) {
			t.Fatal("the earlier version it wrote was not its own")
		}
		if !w.observe(kindEndpointSlice, slice("u1", "12"), false) {
			t.Fatal("the later version was not the writer's own")
		}
		if w.observe(kindEndpointSlice, slice("u1", "10"), false) {
			t.Fatal("the earlier version was its own after the cache caught up")
		}
	})
	t.Run("an earlier version of another object of that name", func(t *testing.T) {
		w := newWrittenObjects()
		w.put(kindEndpointSlice, key, slice("u1", "10"))
		w.put(kindEndpointSlice, key, slice("u2", "12")) // deleted and made again
		if w.observe(kindEndpointSlice, slice("u1", "10"), false) {
			t.Fatal("the replaced object's version was taken for the writer's own")
		}
	})
	t.Run("a ServiceImport", func(t *testing.T) {
		si := func(rv string) *keptServiceImport { // as the cache and put keep it
			return &keptServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "s1", ResourceVersion: rv}}
		}
		w := newWrittenObjects()
		w.put(kindServiceImport, key, si("7"))
		if w.observe(kindServiceImport, si("8"), false) {
			t.Fatal("a newer ServiceImport was the writer's own")
		}
		w.put(kindServiceImport, key, si("9"))
		if !w.observe(kindServiceImport, si("9"), false) {
			t.Fatal("the ServiceImport the writer wrote was not its own")
		}
	})
}

// What the writer wrote stands in for the cached object, of the type its
// accessors read: a write the cache has not caught up with is never lost
// to a type mismatch (which would make the writer create it again).
func TestWrittenObjectsResolveAsTheCacheKeepsThem(t *testing.T) {
	key := registry.ServiceKey{Namespace: "shop", Name: "web"}
	idx := func() cache.Indexer {
		return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{byImportIndex: func(obj any) ([]string, error) {
			if k, ok := objectKey(kindEndpointSlice, obj.(metav1.Object)); ok {
				return []string{k.String()}, nil
			}
			return nil, nil
		}})
	}
	r := &importRun{written: newWrittenObjects(), serviceImports: idx(), endpointSlices: idx(), services: idx()}
	owner := metav1.OwnerReference{APIVersion: "multicluster.x-k8s.io/v1beta1", Kind: "ServiceImport", Name: "web", UID: "si-uid"}
	imp := iwImport(t, key, []string{"10.200.0.10"}, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(1, 3)})
	s := imports.Slices(imp, nil)[0]
	es := desiredSlice(key, &s, owner, imports.DerivedServiceName(key))
	es.UID, es.ResourceVersion = "es-uid", "5"
	svc := desiredService(imp, owner)
	svc.UID, svc.ResourceVersion = "svc-uid", "6"
	si := &unstructured.Unstructured{Object: toMap(desiredServiceImport(imp, []string{"10.200.0.10"}))}
	si.SetUID("si-uid")
	si.SetResourceVersion("7")

	r.written.put(kindEndpointSlice, key, es)
	r.written.put(kindService, key, svc)
	r.written.put(kindServiceImport, key, leanServiceImport(si))
	if got := r.slicesOf(key); len(got) != 1 || got[0].UID != "es-uid" || got[0].owned != ownedSum(sliceOwned(desiredSlice(key, &s, owner, imports.DerivedServiceName(key)))) {
		t.Errorf("slices %+v", got)
	}
	if got := r.servicesOf(key); len(got) != 1 || got[0].UID != "svc-uid" || got[0].owned != ownedSum(serviceOwned(desiredService(imp, owner))) {
		t.Errorf("services %+v", got)
	}
	if got := r.serviceImport(key); got == nil || got.UID != "si-uid" || got.owned == "" {
		t.Errorf("ServiceImport %+v", got)
	}
}

// The writer's informer events queue an import unless they are its own
// write coming back: a change by anyone else is synced (and undone).
func TestOnlyOthersChangesQueueAnImport(t *testing.T) {
	key := registry.ServiceKey{Namespace: "ns", Name: "web"}
	r := &importRun{written: newWrittenObjects(), queue: workqueue.NewTypedRateLimitingQueue(
		workqueue.DefaultTypedControllerRateLimiter[registry.ServiceKey]())}
	defer r.queue.ShutDown()
	r.state.Store(&federation.ImportState{})
	slice := func(rv string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", UID: "u1",
			ResourceVersion: rv, Labels: map[string]string{mcsv1beta1.LabelServiceName: "web"}}}
	}
	r.written.put(kindEndpointSlice, key, slice("10"))
	r.observe(kindEndpointSlice, slice("10"), false) // its own write, back
	if n := r.queue.Len(); n != 0 {
		t.Fatalf("the writer's own write queued %d imports", n)
	}
	r.observe(kindEndpointSlice, slice("11"), false) // someone else's change
	if n := r.queue.Len(); n != 1 {
		t.Fatalf("someone else's change queued %d imports, want 1", n)
	}
	if got, _ := r.queue.Get(); got != key {
		t.Fatalf("queued %v, want %v", got, key)
	}
	r.queue.Done(key)
	r.observe(kindEndpointSlice, cache.DeletedFinalStateUnknown{Key: "ns/web-1", Obj: keepSlice(slice("11"))}, true) // deleted by someone
	if n := r.queue.Len(); n != 1 {
		t.Fatalf("a deletion by someone else queued %d imports, want 1", n)
	}
}
