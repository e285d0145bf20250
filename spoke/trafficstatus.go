package spoke

import (
	"context"
	"encoding/json"
	"reflect"
	"runtime/debug"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/navemesh/nave/kubetraffic"
)

// trafficObject names a route or policy whose status the spoke writes.
type trafficObject struct {
	kind            trafficKind
	namespace, name string
}

// queueTrafficStatus queues an object's status, while status is written.
func (k *KubeSource) queueTrafficStatus(o trafficObject) {
	if k.writing.Load() {
		k.trafficStatusQueue.Add(o)
	}
}

// queueAllTrafficStatus queues the status of every route and policy watched.
func (k *KubeSource) queueAllTrafficStatus() {
	for kind := range trafficKinds {
		w := k.traffic[kind].Load()
		if w == nil {
			continue
		}
		for _, o := range w.indexer.List() {
			if u, ok := o.(*unstructured.Unstructured); ok {
				k.queueTrafficStatus(trafficObject{kind: kind, namespace: u.GetNamespace(), name: u.GetName()})
			}
		}
	}
}

// queueTrafficStatusOf queues the status of every route and policy naming
// Service key (its export may have come or gone).
func (k *KubeSource) queueTrafficStatusOf(key string) {
	for kind := range trafficKinds {
		w := k.traffic[kind].Load()
		if w == nil || !k.writing.Load() {
			continue
		}
		items, _ := w.indexer.ByIndex(byParentIndex, key)
		for _, o := range items {
			if u, ok := o.(*unstructured.Unstructured); ok {
				k.queueTrafficStatus(trafficObject{kind: kind, namespace: u.GetNamespace(), name: u.GetName()})
			}
		}
	}
}

// writeTrafficStatus keeps the status of every route and policy naming a
// Service current until ctx ends (WriteStatus runs it: only the leading
// spoke writes).
func (k *KubeSource) writeTrafficStatus(ctx context.Context) {
	wake := context.AfterFunc(ctx, func() { k.trafficStatusQueue.Add(trafficObject{kind: trafficKinds}) })
	defer wake()
	k.queueAllTrafficStatus()
	for {
		o, shutdown := k.trafficStatusQueue.Get()
		if shutdown {
			return
		}
		if ctx.Err() != nil {
			k.trafficStatusQueue.Done(o)
			return
		}
		k.writeTrafficStatusOf(ctx, o)
	}
}

func (k *KubeSource) writeTrafficStatusOf(ctx context.Context, o trafficObject) {
	defer k.trafficStatusQueue.Done(o)
	defer func() {
		if r := recover(); r != nil {
			k.log.Error("panic while writing a route's or policy's status; retrying", "kind", o.kind, "object", o.namespace+"/"+o.name,
				"panic", r, "stack", string(debug.Stack()))
			k.trafficStatusQueue.AddRateLimited(o)
		}
	}()
	if o.kind >= trafficKinds {
		return
	}
	w := k.traffic[o.kind].Load()
	if w == nil || !k.filter.allows(o.namespace) {
		k.trafficStatusQueue.Forget(o)
		return
	}
	obj, exists, _ := w.indexer.GetByKey(o.namespace + "/" + o.name)
	u, ok := obj.(*unstructured.Unstructured)
	if !exists || !ok {
		k.trafficStatusQueue.Forget(o)
		return
	}
	field, entries, err := k.statusEntries(o.kind, u)
	if err != nil {
		k.log.Warn("cannot read object for its status", "kind", o.kind, "object", o.namespace+"/"+o.name, "err", err)
		k.trafficStatusQueue.Forget(o)
		return
	}
	current, _, _ := unstructured.NestedSlice(u.Object, "status", field)
	next, changed := mergeStatusEntries(current, entries, time.Now())
	if !changed {
		k.trafficStatusQueue.Forget(o)
		return
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": u.GetResourceVersion()},
		"status":   map[string]any{field: next},
	})
	if err != nil {
		k.log.Error("cannot encode status", "kind", o.kind, "object", o.namespace+"/"+o.name, "err", err)
		return
	}
	_, err = k.client.Dynamic().Resource(trafficResources[o.kind]).Namespace(o.namespace).Patch(ctx, o.name,
		types.MergePatchType, patch, metav1.PatchOptions{FieldManager: statusFieldManager}, "status")
	switch {
	case err == nil || apierrors.IsNotFound(err):
		k.trafficStatusQueue.Forget(o)
	case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
		k.log.Error("cannot write status", "kind", o.kind, "object", o.namespace+"/"+o.name, "err", err)
		k.trafficStatusQueue.Forget(o)
	case ctx.Err() != nil:
	default:
		k.log.Warn("cannot write status; retrying", "kind", o.kind, "object", o.namespace+"/"+o.name, "err", err)
		k.trafficStatusQueue.AddRateLimited(o)
	}
}

// statusEntry is one of Nave's entries in a route's status.parents or a
// policy's status.ancestors: the reference it is about and its conditions.
type statusEntry struct {
	ref        map[string]any // parentRef or ancestorRef, as the API server holds it
	refField   string         // "parentRef" or "ancestorRef"
	conditions []metav1.Condition
}

// statusEntries are Nave's entries in the object's status: the field
// (parents or ancestors) and one entry per Service it names.
func (k *KubeSource) statusEntries(kind trafficKind, u *unstructured.Unstructured) (string, []statusEntry, error) {
	if kind == kindTrafficPolicy {
		results, err := k.policyStatus(u)
		return "ancestors", results, err
	}
	as, err := k.attachments(kind, u)
	if err != nil {
		return "", nil, err
	}
	out := make([]statusEntry, 0, len(as))
	for _, a := range as {
		ref, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&a.ParentRef)
		if err != nil {
			return "", nil, err
		}
		out = append(out, statusEntry{ref: ref, refField: "parentRef", conditions: []metav1.Condition{a.Accepted, a.ResolvedRefs}})
	}
	return "parents", out, nil
}

// policyStatus is a TrafficPolicy's ancestors: one per Service it targets.
func (k *KubeSource) policyStatus(u *unstructured.Unstructured) ([]statusEntry, error) {
	var out []statusEntry
	for _, key := range parentsOf(kindTrafficPolicy, u) {
		results := kubetraffic.ResolvePolicies(key, k.objectsNaming(kindTrafficPolicy, key))
		for _, r := range results {
			if r.Name != u.GetName() {
				continue
			}
			cond := r.Accepted
			switch parent, ok := k.parentLookup(key.Namespace, key.Name); {
			case !ok:
				cond = kubetraffic.TargetNotFound(u.GetGeneration(), key)
			case !parent.Exported:
				cond = kubetraffic.TargetNotExported(u.GetGeneration(), key)
			}
			ref := map[string]any{"group": "", "kind": "Service", "name": key.Name}
			out = append(out, statusEntry{ref: ref, refField: "ancestorRef", conditions: []metav1.Condition{cond}})
		}
	}
	return out, nil
}

// mergeStatusEntries replaces Nave's entries (those whose controllerName is
// kubetraffic.ControllerName) in current with entries, keeping every other
// controller's, and reports whether that changes anything. A condition
// that did not change keeps its lastTransitionTime.
func mergeStatusEntries(current []any, entries []statusEntry, now time.Time) ([]any, bool) {
	var out []any
	ours := map[string]map[string]any{} // Nave's current entries, by their reference's JSON
	held := 0                           // Nave's current entries, repeats counted
	for _, e := range current {
		m, ok := e.(map[string]any)
		if !ok {
			continue
		}
		if m["controllerName"] == string(kubetraffic.ControllerName) {
			held++
			for _, field := range []string{"parentRef", "ancestorRef"} {
				if ref, ok := m[field]; ok {
					b, _ := json.Marshal(ref)
					ours[string(b)] = m
				}
			}
			continue
		}
		out = append(out, m)
	}
	changed := false
	seen := 0
	for _, e := range entries {
		b, _ := json.Marshal(e.ref)
		old := ours[string(b)]
		if old != nil {
			seen++
		}
		var oldConds []metav1.Condition
		if old != nil {
			if raw, err := json.Marshal(old["conditions"]); err == nil {
				_ = json.Unmarshal(raw, &oldConds)
			}
		}
		conds := make([]any, 0, len(e.conditions))
		for _, c := range e.conditions {
			c.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
			for _, o := range oldConds {
				if o.Type == c.Type && o.Status == c.Status {
					c.LastTransitionTime = o.LastTransitionTime
				}
			}
			same := false
			for _, o := range oldConds {
				if o.Type == c.Type {
					same = o.Status == c.Status && o.Reason == c.Reason && o.Message == c.Message && o.ObservedGeneration == c.ObservedGeneration
				}
			}
			changed = changed || !same
			m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&c)
			conds = append(conds, m)
		}
		changed = changed || old == nil || len(oldConds) != len(e.conditions)
		out = append(out, map[string]any{e.refField: e.ref, "controllerName": string(kubetraffic.ControllerName), "conditions": conds})
	}
	changed = changed || seen != held
	if !changed && reflect.DeepEqual(out, current) {
		return current, false
	}
	return out, changed
}
