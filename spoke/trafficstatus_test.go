package spoke

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/kubetraffic"
)

// The times of the merges: t0 the first, t1 the next (not on a second:
// lastTransitionTime holds seconds).
var (
	msT0 = time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	msT1 = time.Date(2024, 5, 1, 10, 7, 5, 700_000_000, time.UTC)
)

func msPtr[T any](v T) *T { return &v }

// msParentRef is a parentRef naming Service name, as statusEntries makes it.
func msParentRef(t *testing.T, name string, port *int32) map[string]any {
	t.Helper()
	ref := gwv1.ParentReference{Group: msPtr(gwv1.Group("")), Kind: msPtr(gwv1.Kind("Service")), Name: gwv1.ObjectName(name), Port: port}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&ref)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// msCond is a condition as kubetraffic makes it (no lastTransitionTime).
func msCond(typ string, ok bool, reason, message string, generation int64) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: generation,
		LastTransitionTime: metav1.NewTime(time.Time{})}
}

func msAccepted(gen int64) metav1.Condition {
	return msCond("Accepted", true, "Accepted", "Nave carries the route with the Service to every cluster", gen)
}

func msResolved(gen int64) metav1.Condition {
	return msCond("ResolvedRefs", true, "ResolvedRefs", "every backend resolves", gen)
}

func msEntry(ref map[string]any, conds ...metav1.Condition) statusEntry {
	return statusEntry{ref: ref, refField: "parentRef", conditions: conds}
}

// msAPI is v as the API server hands it back: JSON, numbers int64.
func msAPI(t *testing.T, v []any) []any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out []any
	if err := utiljson.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// msOthers are other controllers' entries: one for a Gateway, one for
// Service cart (as Nave's), as the API server holds them.
func msOthers(t *testing.T) []any {
	t.Helper()
	return msAPI(t, []any{
		map[string]any{
			"parentRef":      map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"},
			"controllerName": "example.com/gateway-controller",
			"conditions": []any{map[string]any{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
				"observedGeneration": 1, "lastTransitionTime": "2020-01-01T00:00:00Z"}},
		},
		map[string]any{
			"parentRef":      map[string]any{"group": "", "kind": "Service", "name": "cart"},
			"controllerName": "istio.io/gateway-controller",
			"conditions": []any{map[string]any{"type": "Accepted", "status": "False", "reason": "NoMatchingParent", "message": "not mine",
				"observedGeneration": 1, "lastTransitionTime": "2021-01-01T00:00:00Z"}},
		},
	})
}

// msNaves are Nave's entries of a status: each entry's reference's name, and
// its conditions.
type msNave struct {
	name  string
	conds []metav1.Condition
}

// msSplit parts a merged status into other controllers' entries (as they
// are) and Nave's (decoded).
func msSplit(t *testing.T, status []any) (others []any, naves []msNave) {
	t.Helper()
	for _, e := range status {
		m, ok := e.(map[string]any)
		if !ok {
			t.Fatalf("entry %#v is not an object", e)
		}
		if m["controllerName"] != string(kubetraffic.ControllerName) {
			others = append(others, m)
			continue
		}
		var ref map[string]any
		for _, f := range []string{"parentRef", "ancestorRef"} {
			if r, ok := m[f].(map[string]any); ok {
				ref = r
			}
		}
		if ref == nil {
			t.Fatalf("Nave's entry %#v has no reference", m)
		}
		b, err := json.Marshal(m["conditions"])
		if err != nil {
			t.Fatal(err)
		}
		var conds []metav1.Condition
		if err := json.Unmarshal(b, &conds); err != nil {
			t.Fatalf("conditions %s: %v", b, err)
		}
		name, _ := ref["name"].(string)
		naves = append(naves, msNave{name: name, conds: conds})
	}
	return others, naves
}

// TestMergeStatusEntriesFirst: Nave's first entries join other controllers'.
func TestMergeStatusEntriesFirst(t *testing.T) {
	for _, tc := range []struct {
		name    string
		current []any
		entries []statusEntry
		changed bool
	}{
		{"nothing at all", nil, nil, false},
		{"others only, Nave has nothing", msOthers(t), nil, false},
		{"Nave's first entry", nil, []statusEntry{msEntry(msParentRef(t, "cart", nil), msAccepted(2), msResolved(2))}, true},
		{"Nave's first entry beside others'", msOthers(t), []statusEntry{msEntry(msParentRef(t, "cart", nil), msAccepted(2), msResolved(2))}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := msAPI(t, tc.current)
			next, changed := mergeStatusEntries(tc.current, tc.entries, msT0)
			if changed != tc.changed {
				t.Errorf("changed = %v, want %v", changed, tc.changed)
			}
			if !reflect.DeepEqual(msAPI(t, tc.current), before) {
				t.Errorf("current was changed")
			}
			others, naves := msSplit(t, next)
			if len(others) != len(before) || (len(before) > 0 && !reflect.DeepEqual(others, before)) {
				t.Errorf("others' entries\n%v\nwant\n%v", others, before)
			}
			if len(naves) != len(tc.entries) {
				t.Fatalf("%d Nave entries, want %d", len(naves), len(tc.entries))
			}
			for i, e := range tc.entries {
				if len(naves[i].conds) != len(e.conditions) {
					t.Fatalf("entry %d: %d conditions, want %d", i, len(naves[i].conds), len(e.conditions))
				}
				for j, c := range e.conditions {
					g := naves[i].conds[j]
					if !g.LastTransitionTime.Time.Equal(msT0) {
						t.Errorf("entry %d: %s lastTransitionTime %v, want %v", i, c.Type, g.LastTransitionTime.Time, msT0)
					}
					g.LastTransitionTime, c.LastTransitionTime = metav1.Time{}, metav1.Time{}
					if !reflect.DeepEqual(g, c) {
						t.Errorf("entry %d: condition %+v, want %+v", i, g, c)
					}
				}
			}
			// What the spoke writes (JSON) reads back as the same entries.
			if tc.changed {
				if _, err := json.Marshal(map[string]any{"status": map[string]any{"parents": next}}); err != nil {
					t.Errorf("cannot encode: %v", err)
				}
			}
		})
	}
}

// TestMergeStatusEntriesAgain: a merge over Nave's entries of an earlier
// merge (at msT0) as the API server holds them, at msT1.
func TestMergeStatusEntriesAgain(t *testing.T) {
	cart := func() map[string]any { return msParentRef(t, "cart", nil) }
	cart9090 := func() map[string]any { return msParentRef(t, "cart", msPtr(int32(9090))) }
	orders := func() map[string]any { return msParentRef(t, "orders", nil) }
	base := []statusEntry{msEntry(cart(), msAccepted(2), msResolved(2))}
	type ltt map[string]time.Time // condition type: its lastTransitionTime
	t1 := msT1.Truncate(time.Second)
	for _, tc := range []struct {
		name    string
		first   []statusEntry // Nave's entries at msT0
		next    []statusEntry // and at msT1
		changed bool
		want    map[string]ltt // Nave's entries, by reference name (and port), and their conditions' times
		// returnsCurrent: the merge hands back current as it is.
		returnsCurrent bool
	}{
		{
			name: "same conditions", first: base, next: []statusEntry{msEntry(cart(), msAccepted(2), msResolved(2))},
			changed: false, returnsCurrent: true, want: map[string]ltt{"cart": {"Accepted": msT0, "ResolvedRefs": msT0}},
		},
		{
			name: "same conditions in another order", first: base, next: []statusEntry{msEntry(cart(), msResolved(2), msAccepted(2))},
			changed: false, want: map[string]ltt{"cart": {"Accepted": msT0, "ResolvedRefs": msT0}},
		},
		{
			name:  "reason changed",
			first: base, next: []statusEntry{msEntry(cart(), msAccepted(2), msCond("ResolvedRefs", true, "Other", "every backend resolves", 2))},
			changed: true, want: map[string]ltt{"cart": {"Accepted": msT0, "ResolvedRefs": msT0}},
		},
		{
			name:  "message changed",
			first: base, next: []statusEntry{msEntry(cart(), msCond("Accepted", true, "Accepted", "another message", 2), msResolved(2))},
			changed: true, want: map[string]ltt{"cart": {"Accepted": msT0, "ResolvedRefs": msT0}},
		},
		{
			name: "observedGeneration changed", first: base, next: []statusEntry{msEntry(cart(), msAccepted(3), msResolved(3))},
			changed: true, want: map[string]ltt{"cart": {"Accepted": msT0, "ResolvedRefs": msT0}},
		},
		{
			name:  "status changed",
			first: base, next: []statusEntry{msEntry(cart(), msCond("Accepted", false, "UnsupportedValue", "rule 1: no", 3), msResolved(3))},
			changed: true, want: map[string]ltt{"cart": {"Accepted": t1, "ResolvedRefs": msT0}},
		},
		{
			name:  "status changed back",
			first: []statusEntry{msEntry(cart(), msCond("Accepted", false, "UnsupportedValue", "rule 1: no", 2), msResolved(2))},
			next:  base, changed: true, want: map[string]ltt{"cart": {"Accepted": t1, "ResolvedRefs": msT0}},
		},
		{
			name: "a condition fewer", first: base, next: []statusEntry{msEntry(cart(), msAccepted(2))},
			changed: true, want: map[string]ltt{"cart": {"Accepted": msT0}},
		},
		{
			name: "a condition more", first: []statusEntry{msEntry(cart(), msAccepted(2))}, next: base,
			changed: true, want: map[string]ltt{"cart": {"Accepted": msT0, "ResolvedRefs": t1}},
		},
		{
			name:  "a condition of another type",
			first: base, next: []statusEntry{msEntry(cart(), msAccepted(2), msCond("Other", true, "ResolvedRefs", "every backend resolves", 2))},
			changed: true, want: map[string]ltt{"cart": {"Accepted": msT0, "Other": t1}},
		},
		{
			name: "entry removed", first: base, next: nil,
			changed: true, want: map[string]ltt{},
		},
		{
			name:    "one of two entries removed",
			first:   []statusEntry{msEntry(cart(), msAccepted(2), msResolved(2)), msEntry(orders(), msAccepted(2), msResolved(2))},
			next:    []statusEntry{msEntry(orders(), msAccepted(2), msResolved(2))},
			changed: true, want: map[string]ltt{"orders": {"Accepted": msT0, "ResolvedRefs": msT0}},
		},
		{
			name:    "entry added",
			first:   base,
			next:    []statusEntry{msEntry(cart(), msAccepted(2), msResolved(2)), msEntry(orders(), msAccepted(2), msResolved(2))},
			changed: true, want: map[string]ltt{"cart": {"Accepted": msT0, "ResolvedRefs": msT0}, "orders": {"Accepted": t1, "ResolvedRefs": t1}},
		},
		{
			name:  "entry's reference changed (a port added)",
			first: base, next: []statusEntry{msEntry(cart9090(), msAccepted(2), msResolved(2))},
			changed: true, want: map[string]ltt{"cart": {"Accepted": t1, "ResolvedRefs": t1}},
		},
		{
			name:    "two entries, same conditions",
			first:   []statusEntry{msEntry(cart(), msAccepted(2), msResolved(2)), msEntry(cart9090(), msAccepted(2), msResolved(2))},
			next:    []statusEntry{msEntry(cart(), msAccepted(2), msResolved(2)), msEntry(cart9090(), msAccepted(2), msResolved(2))},
			changed: false, want: map[string]ltt{"cart": {"Accepted": msT0, "ResolvedRefs": msT0}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			merged, changed := mergeStatusEntries(msOthers(t), tc.first, msT0)
			if !changed && len(tc.first) > 0 {
				t.Fatalf("the first merge changed nothing")
			}
			current := msAPI(t, merged)
			snapshot := msAPI(t, current)
			next, changed := mergeStatusEntries(current, tc.next, msT1)
			if changed != tc.changed {
				t.Errorf("changed = %v, want %v", changed, tc.changed)
			}
			if !reflect.DeepEqual(current, snapshot) {
				t.Errorf("current was changed")
			}
			if tc.returnsCurrent && !reflect.DeepEqual(next, current) {
				t.Errorf("unchanged, yet the status is\n%v\nnot\n%v", next, current)
			}
			others, naves := msSplit(t, next)
			if !reflect.DeepEqual(others, msOthers(t)) {
				t.Errorf("others' entries\n%v\nwant\n%v", others, msOthers(t))
			}
			if len(naves) != len(tc.next) {
				t.Fatalf("%d Nave entries, want %d: %+v", len(naves), len(tc.next), naves)
			}
			for i, e := range tc.next {
				n := naves[i]
				if n.name != e.ref["name"] {
					t.Errorf("entry %d names %q, want %q", i, n.name, e.ref["name"])
				}
				if len(n.conds) != len(e.conditions) {
					t.Fatalf("entry %d: %d conditions, want %d", i, len(n.conds), len(e.conditions))
				}
				for j, c := range e.conditions {
					g := n.conds[j]
					if want, ok := tc.want[n.name][c.Type]; !ok {
						t.Errorf("entry %d: no expected time for condition %s", i, c.Type)
					} else if !g.LastTransitionTime.Time.Equal(want) {
						t.Errorf("entry %d: %s lastTransitionTime %v, want %v", i, c.Type, g.LastTransitionTime.Time, want)
					}
					g.LastTransitionTime, c.LastTransitionTime = metav1.Time{}, metav1.Time{}
					if !reflect.DeepEqual(g, c) {
						t.Errorf("entry %d: condition %+v, want %+v", i, g, c)
					}
				}
			}
		})
	}
}

// TestMergeStatusEntriesAncestors: a policy's ancestors merge as a route's parents do.
func TestMergeStatusEntriesAncestors(t *testing.T) {
	ref := func() map[string]any { return map[string]any{"group": "", "kind": "Service", "name": "cart"} }
	entry := func(c metav1.Condition) []statusEntry {
		return []statusEntry{{ref: ref(), refField: "ancestorRef", conditions: []metav1.Condition{c}}}
	}
	accepted := msCond("Accepted", true, "Accepted", "Nave carries the policy with Service cart to every cluster", 1)
	conflicted := msCond("Accepted", false, "Conflicted", "TrafficPolicy a, older, targets Service cart too: it applies", 1)
	other := msAPI(t, []any{map[string]any{
		"ancestorRef": ref(), "controllerName": "example.com/policy",
		"conditions": []any{map[string]any{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
			"lastTransitionTime": "2020-01-01T00:00:00Z"}},
	}})

	first, changed := mergeStatusEntries(other, entry(accepted), msT0)
	if !changed {
		t.Fatalf("first merge: unchanged")
	}
	current := msAPI(t, first)
	if _, changed := mergeStatusEntries(current, entry(accepted), msT1); changed {
		t.Errorf("same again: changed")
	}
	next, changed := mergeStatusEntries(current, entry(conflicted), msT1)
	if !changed {
		t.Errorf("conflicted: unchanged")
	}
	others, naves := msSplit(t, next)
	if !reflect.DeepEqual(others, other) {
		t.Errorf("others' entries\n%v\nwant\n%v", others, other)
	}
	if len(naves) != 1 || len(naves[0].conds) != 1 {
		t.Fatalf("Nave's entries %+v", naves)
	}
	if c := naves[0].conds[0]; c.Reason != "Conflicted" || !c.LastTransitionTime.Time.Equal(msT1.Truncate(time.Second)) {
		t.Errorf("condition %+v, want Conflicted since %v", c, msT1.Truncate(time.Second))
	}
	if m := next[len(next)-1].(map[string]any); m["ancestorRef"] == nil || m["parentRef"] != nil {
		t.Errorf("Nave's entry %v is not an ancestor", m)
	}
	if _, changed := mergeStatusEntries(msAPI(t, next), nil, msT1); !changed {
		t.Errorf("policy gone: unchanged")
	}
}

// TestMergeStatusEntriesDuplicate: when the status holds Nave's entry for a
// reference twice (written by hand, or by an older spoke), the merge
// leaves one, and so must report a change for it to be written.
func TestMergeStatusEntriesDuplicate(t *testing.T) {
	entries := []statusEntry{msEntry(msParentRef(t, "cart", nil), msAccepted(2), msResolved(2))}
	merged, _ := mergeStatusEntries(nil, entries, msT0)
	current := msAPI(t, append(merged, merged...))
	next, changed := mergeStatusEntries(current, entries, msT1)
	if len(next) != 1 {
		t.Fatalf("%d entries, want 1", len(next))
	}
	if !changed {
		t.Errorf("two entries merged into one, yet unchanged: the status keeps both")
	}
}
