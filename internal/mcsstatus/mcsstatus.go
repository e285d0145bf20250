// Package mcsstatus merges the conditions a spoke decides into the status
// of the MCS objects it writes: ServiceExports (the spoke's export status)
// and ServiceImports (the import writer).
package mcsstatus

import (
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionReady is the type of the Ready condition of a ServiceExport (the
// export is in the clusterset) and of a ServiceImport (the import is written).
const ConditionReady = "Ready"

// Condition is the part of a condition the spoke decides.
type Condition struct {
	Type    string
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

// maxMessage bounds a condition's message (the API allows 32768 bytes).
const maxMessage = 4096

// Truncate cuts a condition's message to its bound, on a rune boundary,
// and says so.
func Truncate(msg string) string {
	if len(msg) <= maxMessage {
		return msg
	}
	const more = "... (truncated)"
	cut := maxMessage - len(more)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + more
}

// MergeConditions returns the conditions list with want applied: conditions
// of other types are kept, a condition whose content is unchanged keeps its
// transition time, and changed reports whether anything differs. A
// generation of 0 writes no observedGeneration (a ServiceImport without a
// status subresource: see the import writer's ensureStatus).
func MergeConditions(current []any, want []Condition, generation int64, now time.Time) (out []any, changed bool) {
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

func isOurs(typ any, want []Condition) bool {
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
