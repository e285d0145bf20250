package importwriter

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// This file holds what the Writer keeps of the objects it owns: its
// informers' transform (leanImported) and the kept forms, each with a sum
// of the part the writer owns (ownedSum), and the writes it remembers
// until its informers have seen them (writtenObjects).

// leanImported is the transform of the writer's informers: it keeps of each
// object what the writer reads or compares, so that a cluster's imports
// (a cluster imports its own exports too) cost it little memory: of what
// the writer owns of each, a sum (ownedSum), which tells whether it is as
// desired. An EndpointSlice is kept as a keptSlice, a ServiceImport as a
// keptServiceImport, a Service as a keptService. It is idempotent.
func leanImported(obj any) (any, error) {
	switch o := obj.(type) {
	case *discoveryv1.EndpointSlice:
		return keepSlice(o), nil
	case *corev1.Service:
		return keepService(o), nil
	case *unstructured.Unstructured:
		return leanServiceImport(o), nil
	}
	return obj, nil
}

// keptSlice is what the writer keeps of an imported EndpointSlice: its
// metadata, with the labels Nave owns apart (a map would cost more than
// they do), what packing needs to know of it (imports.Prev: each
// endpoint's first address and sum), and the sum of its owned part. It
// keeps no endpoint: the import's endpoints are in the state the hub sent,
// and a slice that differs from the desired one is patched without being
// read (slicePatch).
type keptSlice struct {
	metav1.ObjectMeta // without labels: see GetLabels
	labels            [len(sliceLabelKeys)]string
	hasLabel          [len(sliceLabelKeys)]bool
	prev              imports.Prev
	readable          bool   // it reads as an imported slice (importedSlice)
	owned             string // ownedSum(sliceOwned(the slice))
}

func keepSlice(es *discoveryv1.EndpointSlice) *keptSlice {
	k := &keptSlice{owned: ownedSum(sliceOwned(es)), ObjectMeta: metav1.ObjectMeta{
		Namespace: es.Namespace, Name: es.Name, UID: es.UID, ResourceVersion: es.ResourceVersion}}
	for i, key := range sliceLabelKeys {
		k.labels[i], k.hasLabel[i] = es.Labels[key]
	}
	if s, ok := importedSlice(es); ok {
		k.prev, k.readable = s.Prev(), true
	}
	return k
}

// GetLabels returns the labels of the slice Nave owns (a new map; nil when it has none).
func (k *keptSlice) GetLabels() map[string]string {
	var labels map[string]string
	for i, key := range sliceLabelKeys {
		if k.hasLabel[i] {
			if labels == nil {
				labels = make(map[string]string, len(sliceLabelKeys))
			}
			labels[key] = k.labels[i]
		}
	}
	return labels
}

// label returns one of the slice's labels: "" when it has none, or it is
// not one of those Nave owns (no other is kept).
func (k *keptSlice) label(key string) string {
	if i := slices.Index(sliceLabelKeys[:], key); i >= 0 {
		return k.labels[i]
	}
	return ""
}

// slicePatch is the merge patch that makes an imported slice, known by
// what the writer keeps of it, have the owned part want (sliceOwned): its
// owned labels that differ, and the rest of what Nave owns whole (a merge
// patch replaces a list whole, so nothing of the old endpoints is needed).
func slicePatch(cur *keptSlice, want map[string]any) map[string]any {
	wantMeta, _ := want["metadata"].(map[string]any)
	have := map[string]any{}
	for k, v := range cur.GetLabels() {
		have[k] = v
	}
	meta := mergePatch(map[string]any{"labels": have}, map[string]any{"labels": wantMeta["labels"]})
	if meta == nil {
		meta = map[string]any{}
	}
	meta["ownerReferences"] = nullIfEmpty(wantMeta["ownerReferences"])
	patch := map[string]any{"metadata": meta}
	for _, k := range []string{"addressType", "endpoints", "ports"} {
		patch[k] = nullIfEmpty(want[k])
	}
	return patch
}

func nullIfEmpty(v any) any {
	if isEmpty(v) {
		return nil
	}
	return v
}

// keptService is what the writer keeps of a derived Service: its metadata
// without labels, annotations and owner references; the import it belongs
// to (its label multicluster.kubernetes.io/service-name); the annotations
// the writer set when it created it (createdAnnotations); what decides
// whether it must be made anew (needsRecreate) and its IPs; and, for the
// rest of what the writer owns (serviceOwned), the sum of it. A derived
// Service changes only with the exported service's ports and properties,
// so the writer reads it from the API server when its sum is not the
// desired one.
type keptService struct {
	metav1.ObjectMeta
	service      string
	created      [len(createdAnnotations)]string
	hasCreated   [len(createdAnnotations)]bool
	typ          corev1.ServiceType
	clusterIP    string
	clusterIPs   []string
	families     []corev1.IPFamily
	familyPolicy corev1.IPFamilyPolicy
	owned        string
}

func keepService(svc *corev1.Service) *keptService {
	k := &keptService{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID, ResourceVersion: svc.ResourceVersion},
		service:    svc.Labels[mcsv1beta1.LabelServiceName], owned: ownedSum(serviceOwned(svc)),
		typ: svc.Spec.Type, clusterIP: svc.Spec.ClusterIP, clusterIPs: svc.Spec.ClusterIPs, families: svc.Spec.IPFamilies,
		familyPolicy: deref(svc.Spec.IPFamilyPolicy),
	}
	for i, key := range createdAnnotations {
		k.created[i], k.hasCreated[i] = svc.Annotations[key]
	}
	return k
}

// GetLabels returns the labels of the derived Service the writer reads (a
// new map). ManagedByLabel is always there: the writer keeps only
// Services that have it (its informer selects them, and it remembers a
// write only after checking the Service is Nave's).
func (k *keptService) GetLabels() map[string]string {
	labels := map[string]string{ManagedByLabel: ManagedByValue}
	if k.service != "" {
		labels[mcsv1beta1.LabelServiceName] = k.service
	}
	return labels
}

// label returns one of the labels GetLabels returns ("" for any other).
func (k *keptService) label(key string) string {
	switch key {
	case ManagedByLabel:
		return ManagedByValue
	case mcsv1beta1.LabelServiceName:
		return k.service
	}
	return ""
}

// annotation returns one of createdAnnotations, and whether the Service has it.
func (k *keptService) annotation(key string) (string, bool) {
	i := slices.Index(createdAnnotations[:], key)
	if i < 0 {
		panic("keptService.annotation: " + key + " is not kept")
	}
	return k.created[i], k.hasCreated[i]
}

// keptServiceImport is what the writer keeps of a ServiceImport: its
// metadata without labels and annotations; for its labels, annotations and
// spec, which the writer owns whole, their sum (ownedSum of
// serviceImportOwned); and for its status, which the writer merges its
// conditions into, the sum of what it compares of it (statusSum). A
// ServiceImport changes with the exported service's ports and properties,
// its clusterset IPs, and when a source cluster goes stale or comes back
// (StaleClustersAnnotation), not with endpoints; so the writer reads it
// from the API server when a sum is not the desired one, rather than keep
// every import's spec, labels, annotations and conditions.
type keptServiceImport struct {
	metav1.ObjectMeta
	owned  string
	status string
	bare   bool // its status is empty: no clusters, no conditions (the writer knows it without reading it)
}

// leanServiceImport is what the writer keeps of a ServiceImport of either version.
func leanServiceImport(u *unstructured.Unstructured) *keptServiceImport {
	si := typedServiceImport(u)
	k := &keptServiceImport{owned: ownedSum(serviceImportOwned(si)), status: statusSum(toMap(&si.Status)), ObjectMeta: si.ObjectMeta,
		bare: len(si.Status.Clusters) == 0 && len(si.Status.Conditions) == 0}
	k.Labels, k.Annotations = nil, nil
	return k
}

// statusSum is the sum of what ensureStatus compares of a ServiceImport's
// status (as toMap gives it): its clusters, whether a condition is not an
// object, and of each of the writer's conditions (the last of its type) the
// status, reason, message, observed generation and whether it has a
// transition time. Others' conditions are not in it: the writer keeps them
// as they are.
func statusSum(status map[string]any) string {
	ours, malformed := map[string]any{}, false
	conditions, _ := status["conditions"].([]any)
	for _, c := range conditions {
		m, ok := c.(map[string]any)
		if !ok {
			malformed = true
			continue
		}
		if typ, _ := m["type"].(string); typ == ConditionReady || typ == ConditionClusterSetIP {
			t, _ := m["lastTransitionTime"].(string)
			ours[typ] = map[string]any{"status": m["status"], "reason": m["reason"], "message": m["message"],
				"observedGeneration": m["observedGeneration"], "timed": t != ""}
		}
	}
	return ownedSum(map[string]any{"clusters": status["clusters"], "conditions": ours, "malformed": malformed})
}

// typedServiceImport is a ServiceImport of either version (they have the
// same fields) typed, without managedFields. One that does not read as a
// ServiceImport keeps only its metadata, so that the writer writes the
// rest anew.
func typedServiceImport(u *unstructured.Unstructured) *mcsv1beta1.ServiceImport {
	si := &mcsv1beta1.ServiceImport{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, si); err != nil {
		si = &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: u.GetName(),
			UID: u.GetUID(), ResourceVersion: u.GetResourceVersion(), Generation: u.GetGeneration(),
			Labels: u.GetLabels(), Annotations: u.GetAnnotations()}}
	}
	si.ManagedFields = nil
	return si
}

// ownedSum is a digest of an owned part: owned parts that mergePatch finds
// alike (a missing key, null, an empty list and an empty object are alike)
// have the same sum, and different sums mean different parts.
func ownedSum(m map[string]any) string {
	b, err := json.Marshal(withoutEmpty(m)) // encoding/json sorts map keys
	if err != nil {
		panic(err) // maps of JSON values always encode
	}
	sum := sha256.Sum256(b)
	return base64.RawStdEncoding.EncodeToString(sum[:16])
}

// withoutEmpty is m without the empty values (isEmpty) of it and of the
// objects in it, as mergePatch compares them (lists are compared whole).
func withoutEmpty(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch {
		case isEmpty(v):
		case isMap(v):
			out[k] = withoutEmpty(v.(map[string]any))
		default:
			out[k] = v
		}
	}
	return out
}

func isMap(v any) bool {
	_, ok := v.(map[string]any)
	return ok
}

// writtenObjects remembers what the writer wrote until its informers have
// seen it, so that a sync never works from an object older than its own
// last write: that would make a patch that fails on its resourceVersion,
// or, for an object just created, a second create. Entries leave once the
// cache holds the written version (or a newer one) or the object is gone.
type writtenObjects struct {
	mu sync.Mutex
	m  map[writtenGroup]map[string]writtenObj
}

// writtenGroup is the objects of one kind that belong to one import.
type writtenGroup struct {
	kind objKind
	key  registry.ServiceKey
}

// writtenObj is an object as the API server returned it from a write (or a
// read after one), kept as the cache keeps it (see put), or,
// when obj is nil, the UID of an object the writer deleted. earlier holds
// the versions of the same object the writer wrote before obj (a sync that
// creates a ServiceImport and then writes its status writes it twice; a
// later sync may write it again before the first write comes back), until
// the cache catches up.
type writtenObj struct {
	obj     metav1.Object
	uid     types.UID
	earlier []string
}

// maxEarlier bounds writtenObj.earlier: a sync writes an object at most a
// few times.
const maxEarlier = 4

func newWrittenObjects() *writtenObjects {
	return &writtenObjects{m: map[writtenGroup]map[string]writtenObj{}}
}

func (w *writtenObjects) set(kind objKind, key registry.ServiceKey, name string, e writtenObj) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := writtenGroup{kind, key}
	if w.m[g] == nil {
		w.m[g] = map[string]writtenObj{}
	}
	if prev, ok := w.m[g][name]; ok && prev.obj != nil && e.obj != nil && prev.obj.GetUID() == e.obj.GetUID() {
		e.earlier = append(prev.earlier, prev.obj.GetResourceVersion())
		if len(e.earlier) > maxEarlier {
			e.earlier = e.earlier[len(e.earlier)-maxEarlier:]
		}
	}
	w.m[g][name] = e
}

// put remembers an object the API server returned from a write (or a
// read), as the cache would hold it (leanImported), and returns that: a
// loaded writer may remember a write of every import at once.
func (w *writtenObjects) put(kind objKind, key registry.ServiceKey, o metav1.Object) metav1.Object {
	if lean, _ := leanImported(o); lean != nil {
		o = lean.(metav1.Object)
	}
	w.set(kind, key, o.GetName(), writtenObj{obj: o})
	return o
}

// deleted remembers that the writer deleted an object.
func (w *writtenObjects) deleted(kind objKind, key registry.ServiceKey, o metav1.Object) {
	w.set(kind, key, o.GetName(), writtenObj{uid: o.GetUID()})
}

// forget drops what is remembered of an object (the API server said it is gone).
func (w *writtenObjects) forget(kind objKind, key registry.ServiceKey, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := writtenGroup{kind, key}
	delete(w.m[g], name)
	if len(w.m[g]) == 0 {
		delete(w.m, g)
	}
}

// caughtUp reports whether the cache's version of an object makes the
// remembered write moot.
func (e writtenObj) caughtUp(cached metav1.Object, gone bool) bool {
	if e.obj == nil { // deleted
		return cached == nil || cached.GetUID() != e.uid || gone
	}
	if cached == nil {
		return false // created, not seen yet
	}
	if gone {
		return cached.GetUID() == e.obj.GetUID()
	}
	c, err := resourceversion.CompareResourceVersion(cached.GetResourceVersion(), e.obj.GetResourceVersion())
	return err != nil || c >= 0
}

// resolve returns the objects of a group as the writer must see them: the
// cached ones (by name), with its own writes the cache has not seen yet in
// their place. It changes and returns cached.
func (w *writtenObjects) resolve(kind objKind, key registry.ServiceKey, cached map[string]metav1.Object) map[string]metav1.Object {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := writtenGroup{kind, key}
	for name, e := range w.m[g] {
		c := cached[name]
		switch {
		case e.caughtUp(c, false):
			delete(w.m[g], name)
		case e.obj == nil:
			delete(cached, name)
		default:
			cached[name] = e.obj
		}
	}
	if len(w.m[g]) == 0 {
		delete(w.m, g)
	}
	return cached
}

// observe is told of every informer event, and drops the writes the cache
// has caught up with. It reports whether the event is the version the
// writer last knew of the object coming back: the version it wrote (or
// read back after a create that found the object there), or the deletion
// of the object it deleted; such an event holds nothing the writer does
// not know.
func (w *writtenObjects) observe(kind objKind, o metav1.Object, gone bool) (own bool) {
	key, ok := objectKey(kind, o)
	if !ok {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	g := writtenGroup{kind, key}
	e, ok := w.m[g][o.GetName()]
	if !ok {
		return false
	}
	if !e.caughtUp(o, gone) {
		// An earlier write of the writer's, which its later write was made
		// over (a patch guarded by the version before it, or a read after a
		// create found the object there, which retries): nothing new.
		return e.obj != nil && !gone && o.GetUID() == e.obj.GetUID() && slices.Contains(e.earlier, o.GetResourceVersion())
	}
	delete(w.m[g], o.GetName())
	if len(w.m[g]) == 0 {
		delete(w.m, g)
	}
	if e.obj == nil { // deleted by the writer
		return gone && o.GetUID() == e.uid
	}
	return !gone && o.GetUID() == e.obj.GetUID() && o.GetResourceVersion() == e.obj.GetResourceVersion()
}
