package spoke

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/navemesh/nave/exportpolicy"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/internal/mcsstatus"
	"github.com/navemesh/nave/registry"
)

// The ServiceExport conditions a spoke writes, and their reasons (the
// Kubernetes MCS API's; InvalidService, RefusedByHub and ExportNotPermitted
// are Nave's own).
const (
	// ConditionValid says whether the export is valid and the hub took it.
	ConditionValid = "Valid"
	// ConditionReady says whether the export is in the clusterset: the hub holds it.
	ConditionReady = mcsstatus.ConditionReady
	// ConditionConflict says whether the export conflicts with another cluster's
	// export of the service; its reason names the conflicting properties
	// (PortConflict, TypeConflict, ...), several joined by commas.
	ConditionConflict = "Conflict"

	ReasonValid              = "Valid"
	ReasonNoService          = "NoService"
	ReasonInvalidServiceType = "InvalidServiceType"
	ReasonInvalidService     = "InvalidService"
	ReasonRefusedByHub       = "RefusedByHub"
	ReasonExportNotPermitted = exportpolicy.ReasonNotPermitted
	ReasonExported           = "Exported"
	ReasonFailed             = "Failed"
	ReasonNoConflicts        = "NoConflicts"
	// reasonConflict stands for a conflict whose kind a hub did not say (one that predates kinds).
	reasonConflict = "ConflictFound"
)

// statusFieldManager owns the conditions the spoke writes.
const statusFieldManager = "nave-spoke"

// WriteStatus keeps the Valid and Conflict conditions of every ServiceExport
// current until ctx ends: only the spoke that leads calls it, once the
// source has synced (it waits for that). A write that fails is retried with
// backoff; one that races another writer is retried once the cache has the
// newer object.
func (k *KubeSource) WriteStatus(ctx context.Context) {
	select {
	case <-k.synced:
	case <-ctx.Done():
		return
	}
	k.writing.Store(true)
	defer k.writing.Store(false)
	wake := context.AfterFunc(ctx, func() { k.statusQueue.Add(registry.ServiceKey{}) })
	defer wake()
	k.queueAllStatus() // anything may have changed while another spoke led
	done := make(chan struct{})
	go func() { defer close(done); k.writeTrafficStatus(ctx) }()
	defer func() { <-done }()
	for {
		key, shutdown := k.statusQueue.Get()
		if shutdown {
			return
		}
		if ctx.Err() != nil {
			k.statusQueue.Done(key)
			return
		}
		k.writeStatus(ctx, key)
	}
}

// queueAllStatus queues the status of every ServiceExport.
func (k *KubeSource) queueAllStatus() {
	l := k.exports.Load()
	if l == nil || !k.writing.Load() {
		return
	}
	exps, _ := l.lister.List(labelsEverything)
	for _, o := range exps {
		if u, ok := o.(*unstructured.Unstructured); ok {
			k.statusQueue.Add(registry.ServiceKey{Namespace: u.GetNamespace(), Name: u.GetName()})
		}
	}
}

func (k *KubeSource) writeStatus(ctx context.Context, key registry.ServiceKey) {
	defer k.statusQueue.Done(key)
	defer func() {
		if r := recover(); r != nil {
			k.log.Error("panic while writing ServiceExport status; retrying", "service", key, "panic", r, "stack", string(debug.Stack()))
			k.statusQueue.AddRateLimited(key)
		}
	}()
	if key == (registry.ServiceKey{}) {
		return
	}
	export, watch := k.export(key), k.exports.Load()
	if export == nil || !k.filter.allows(key.Namespace) {
		// Not ours to speak for: another spoke (or controller) may own that namespace.
		k.statusQueue.Forget(key)
		return
	}
	current, _, _ := unstructured.NestedSlice(export.Object, "status", "conditions")
	conds, changed := mcsstatus.MergeConditions(current, k.conditions(key), export.GetGeneration(), time.Now())
	if !changed {
		k.statusQueue.Forget(key)
		return
	}
	// A merge patch replaces the whole list, so it names the resourceVersion
	// it was computed from: a concurrent change fails it, and it is retried.
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": export.GetResourceVersion()},
		"status":   map[string]any{"conditions": conds},
	})
	if err != nil {
		k.log.Error("cannot encode ServiceExport status", "service", key, "err", err)
		return
	}
	_, err = k.client.Dynamic().Resource(watch.resource).Namespace(key.Namespace).Patch(ctx, key.Name,
		types.MergePatchType, patch, metav1.PatchOptions{FieldManager: statusFieldManager}, "status")
	switch {
	case err == nil || apierrors.IsNotFound(err):
		k.statusQueue.Forget(key)
	case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
		// Retrying cannot help; the next change of the export or its service tries again.
		k.log.Error("cannot write ServiceExport status", "service", key, "err", err)
		k.statusQueue.Forget(key)
	case ctx.Err() != nil:
	default:
		k.log.Warn("cannot write ServiceExport status; retrying", "service", key, "err", err)
		k.statusQueue.AddRateLimited(key)
	}
}

// conditions returns what the Valid and Conflict conditions of a service's
// export should say. What depends on the hub is left out (so left as it is)
// until the current hub session has reported.
func (k *KubeSource) conditions(key registry.ServiceKey) []mcsstatus.Condition {
	k.statusMu.Lock()
	problem, report, known := k.problems[key], k.reports[key], k.reportsKnown
	k.statusMu.Unlock()

	var out []mcsstatus.Condition
	// Ready follows Valid: the export is in the clusterset exactly when it is valid and the hub holds it.
	invalid := func(reason, format string, args ...any) {
		msg := mcsstatus.Truncate(fmt.Sprintf(format, args...))
		out = append(out,
			mcsstatus.Condition{Type: ConditionValid, Status: metav1.ConditionFalse, Reason: reason, Message: msg},
			mcsstatus.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonFailed, Message: msg})
	}
	svc, err := k.services.Services(key.Namespace).Get(key.Name)
	switch {
	case err != nil:
		// The source's caches leave out the Services Nave made for imports.
		invalid(ReasonNoService, "no Service %s in this namespace (Services Nave makes for imports do not federate)", key.Name)
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		invalid(ReasonInvalidServiceType, "ExternalName services do not federate")
	case problem != "":
		invalid(ReasonInvalidService, "%s", problem)
	case !known:
	case strings.HasPrefix(report.Refused, exportpolicy.ReasonNotPermitted+":"):
		// The hub's export policy does not let this cluster export into the namespace.
		invalid(ReasonExportNotPermitted, "%s", report.Refused)
	case report.Refused != "":
		invalid(ReasonRefusedByHub, "%s", report.Refused)
	default:
		out = append(out,
			mcsstatus.Condition{Type: ConditionValid, Status: metav1.ConditionTrue, Reason: ReasonValid,
				Message: "the service is valid for export"},
			mcsstatus.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonExported,
				Message: "the hub holds the export"})
	}
	switch {
	case !known:
	case len(report.Conflicts) > 0:
		out = append(out, mcsstatus.Condition{Type: ConditionConflict, Status: metav1.ConditionTrue,
			Reason: conflictReason(report.Conflicts), Message: mcsstatus.Truncate(conflictMessage(report.Conflicts))})
	default:
		out = append(out, mcsstatus.Condition{Type: ConditionConflict, Status: metav1.ConditionFalse, Reason: ReasonNoConflicts,
			Message: "no other cluster exports the service differently"})
	}
	return out
}

// conflictReason joins the conflicts' kinds, sorted and each once, with commas.
func conflictReason(conflicts []federation.Explanation) string {
	var kinds []string
	for _, c := range conflicts {
		kinds = append(kinds, cmp.Or(string(c.Kind), reasonConflict))
	}
	slices.Sort(kinds)
	return strings.Join(slices.Compact(kinds), ",")
}

func conflictMessage(conflicts []federation.Explanation) string {
	texts := make([]string, len(conflicts))
	for i, c := range conflicts {
		texts[i] = c.Text
	}
	return strings.Join(texts, "; ")
}
