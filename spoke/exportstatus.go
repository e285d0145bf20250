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
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/navemesh/nave/exportpolicy"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// The ServiceExport conditions a spoke writes, and their reasons (the
// Kubernetes MCS API's; InvalidService, RefusedByHub and ExportNotPermitted
// are Nave's own).
const (
	// ConditionValid says whether the export is valid and the hub took it.
	ConditionValid = "Valid"
	// ConditionReady says whether the export is in the clusterset: the hub holds it.
	ConditionReady = "Ready"
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

// exportCondition is the part of a condition the spoke decides.
type exportCondition struct {
	Type    string
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

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
	conds, changed := mergeConditions(current, k.conditions(key), export.GetGeneration(), time.Now())
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

// maxConditionMessage bounds a condition's message (the API allows 32768 bytes).
const maxConditionMessage = 4096

// conditions returns what the Valid and Conflict conditions of a service's
// export should say. What depends on the hub is left out (so left as it is)
// until the current hub session has reported.
func (k *KubeSource) conditions(key registry.ServiceKey) []exportCondition {
	k.statusMu.Lock()
	problem, report, known := k.problems[key], k.reports[key], k.reportsKnown
	k.statusMu.Unlock()

	var out []exportCondition
	// Ready follows Valid: the export is in the clusterset exactly when it is valid and the hub holds it.
	invalid := func(reason, format string, args ...any) {
		msg := truncate(fmt.Sprintf(format, args...))
		out = append(out,
			exportCondition{Type: ConditionValid, Status: metav1.ConditionFalse, Reason: reason, Message: msg},
			exportCondition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonFailed, Message: msg})
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
			exportCondition{Type: ConditionValid, Status: metav1.ConditionTrue, Reason: ReasonValid,
				Message: "the service is valid for export"},
			exportCondition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonExported,
				Message: "the hub holds the export"})
	}
	switch {
	case !known:
	case len(report.Conflicts) > 0:
		out = append(out, exportCondition{Type: ConditionConflict, Status: metav1.ConditionTrue,
			Reason: conflictReason(report.Conflicts), Message: truncate(conflictMessage(report.Conflicts))})
	default:
		out = append(out, exportCondition{Type: ConditionConflict, Status: metav1.ConditionFalse, Reason: ReasonNoConflicts,
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

func truncate(msg string) string {
	if len(msg) <= maxConditionMessage {
		return msg
	}
	const more = "... (truncated)"
	cut := maxConditionMessage - len(more)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + more
}

// mergeConditions returns the conditions list with want applied: conditions
// of other types are kept, a condition whose content is unchanged keeps its
// transition time, and changed reports whether anything differs. A
// generation of 0 writes no observedGeneration (see ensureStatus).
func mergeConditions(current []any, want []exportCondition, generation int64, now time.Time) (out []any, changed bool) {
	out = make([]any, 0, len(current)+len(want))
	byType := map[string]map[string]any{}
	for _, c := range current {
		m, ok := c.(map[string]any)
		if !ok {
			changed = true // garbage in our status: dropped
			continue
		}
		typ, _ := m["type"].(string)
		byType[typ] = m
	}
	for _, c := range current {
		if m, ok := c.(map[string]any); ok && !isOurs(m["type"], want) {
			out = append(out, m)
		}
	}
	for _, w := range want {
		old := byType[w.Type]
		transition := now.UTC().Format(time.RFC3339)
		if old != nil && old["status"] == string(w.Status) {
			if t, ok := old["lastTransitionTime"].(string); ok && t != "" {
				transition = t
			}
		}
		c := map[string]any{
			"type": w.Type, "status": string(w.Status), "reason": w.Reason, "message": w.Message,
			"lastTransitionTime": transition,
		}
		if generation != 0 {
			c["observedGeneration"] = generation
		}
		if old == nil || old["status"] != c["status"] || old["reason"] != c["reason"] ||
			old["message"] != c["message"] || old["lastTransitionTime"] != c["lastTransitionTime"] ||
			!sameGeneration(old["observedGeneration"], generation) {
			changed = true
		}
		out = append(out, c)
	}
	return out, changed
}

func isOurs(typ any, want []exportCondition) bool {
	for _, w := range want {
		if typ == w.Type {
			return true
		}
	}
	return false
}

// sameGeneration compares a generation decoded from JSON (int64 or float64;
// absent matches 0) with g.
func sameGeneration(v any, g int64) bool {
	switch n := v.(type) {
	case nil:
		return g == 0
	case int64:
		return n == g
	case float64:
		return n == float64(g)
	}
	return false
}
