package kubetraffic_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/kubetraffic"
	"github.com/navemesh/nave/kubetraffic/v1alpha1"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

func tpDur(s string) *gwv1.Duration { d := gwv1.Duration(s); return &d }

func tpInt(v int32) *int32 { return &v }

// tpPolicy is a TrafficPolicy named name targeting Service cart.
func tpPolicy(name string, spec v1alpha1.TrafficPolicySpec) *v1alpha1.TrafficPolicy {
	spec.TargetRefs = []gwv1.LocalPolicyTargetReference{{Group: "", Kind: "Service", Name: "cart"}}
	return &v1alpha1.TrafficPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "TrafficPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec:       spec,
	}
}

func TestFromTrafficPolicy(t *testing.T) {
	type tc struct {
		name    string
		spec    v1alpha1.TrafficPolicySpec
		want    *traffic.Policy // nil: refused
		problem []string        // each is in the problem
	}
	valid := func(name string, spec v1alpha1.TrafficPolicySpec, want *traffic.Policy) tc {
		want.Name = "p"
		return tc{name: name, spec: spec, want: want}
	}
	invalid := func(name string, spec v1alpha1.TrafficPolicySpec, problem ...string) tc {
		return tc{name: name, spec: spec, problem: problem}
	}
	detector := &v1alpha1.OutlierDetection{ConsecutiveErrors: tpInt(5)}
	cases := []tc{
		valid("empty", v1alpha1.TrafficPolicySpec{}, &traffic.Policy{}),
		valid("every field", v1alpha1.TrafficPolicySpec{
			LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.RingHash, HashHeader: "X-Session-ID"},
			Locality: &v1alpha1.Locality{Distribute: []v1alpha1.Distribution{
				{From: "us-east1/*", To: map[string]int32{"us-west1": 30, "us-east1/b": 20, "us-east1/a": 50}},
				{From: "*", To: map[string]int32{"eu-west1/c/x": 100, "us-east1": 0}},
			}},
			OutlierDetection: &v1alpha1.OutlierDetection{
				Interval:           tpDur("10s"),
				BaseEjectionTime:   tpDur("30s"),
				MaxEjectionTime:    tpDur("5m"),
				MaxEjectionPercent: tpInt(20),
				ConsecutiveErrors:  tpInt(5),
				FailurePercentage:  &v1alpha1.FailurePercentage{Threshold: 85, MinimumHosts: tpInt(3), RequestVolume: tpInt(40)},
				SuccessRate:        &v1alpha1.SuccessRate{StdevFactor: tpInt(1900), MinimumHosts: tpInt(4), RequestVolume: tpInt(100)},
			},
			MaxRequests: tpInt(100),
			Timeout:     tpDur("1h30m"),
			Retry: &v1alpha1.Retry{Attempts: 3, Backoff: tpDur("25ms"),
				Codes: []v1alpha1.RetryCode{v1alpha1.RetryUnavailable, v1alpha1.RetryResourceExhausted}},
		}, &traffic.Policy{
			LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-session-id"},
			Locality: &traffic.LocalityPolicy{Distribute: []traffic.Distribution{
				{From: "us-east1/*", To: []traffic.LocalityWeight{{Locality: "us-east1/a", Weight: 50}, {Locality: "us-east1/b", Weight: 20}, {Locality: "us-west1", Weight: 30}}},
				{From: "*", To: []traffic.LocalityWeight{{Locality: "eu-west1/c/x", Weight: 100}, {Locality: "us-east1", Weight: 0}}},
			}},
			OutlierDetection: &traffic.OutlierDetection{
				Interval:           10 * time.Second,
				BaseEjectionTime:   30 * time.Second,
				MaxEjectionTime:    5 * time.Minute,
				MaxEjectionPercent: 20,
				ConsecutiveErrors:  5,
				FailurePercentage:  &traffic.FailurePercentage{Threshold: 85, MinimumHosts: 3, RequestVolume: 40},
				SuccessRate:        &traffic.SuccessRate{StdevFactor: 1900, MinimumHosts: 4, RequestVolume: 100},
			},
			MaxRequests: 100,
			Timeout:     90 * time.Minute,
			Retry:       &traffic.Retry{Attempts: 3, Backoff: 25 * time.Millisecond, GRPCCodes: []string{"unavailable", "resource-exhausted"}},
		}),
		valid("least request", v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.LeastRequest, ChoiceCount: tpInt(3)}},
			&traffic.Policy{LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.LeastRequest, ChoiceCount: 3}}),
		valid("weighted round robin", v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.WeightedRoundRobin}},
			&traffic.Policy{LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.WeightedRoundRobin}}),
		valid("locality off", v1alpha1.TrafficPolicySpec{Locality: &v1alpha1.Locality{Off: true}},
			&traffic.Policy{Locality: &traffic.LocalityPolicy{Off: true}}),
		valid("failover priority", v1alpha1.TrafficPolicySpec{Locality: &v1alpha1.Locality{
			FailoverPriority: []v1alpha1.LocalityLabel{v1alpha1.LabelNetwork, v1alpha1.LabelRegion, v1alpha1.LabelZone}}},
			&traffic.Policy{Locality: &traffic.LocalityPolicy{FailoverPriority: []string{traffic.LabelNetwork, traffic.LabelRegion, traffic.LabelZone}}}),
		valid("failover", v1alpha1.TrafficPolicySpec{Locality: &v1alpha1.Locality{
			Failover: []v1alpha1.RegionFailover{{From: "us-east1", To: "us-west1"}, {From: "us-west1", To: "us-east1"}}}},
			&traffic.Policy{Locality: &traffic.LocalityPolicy{Failover: []traffic.RegionFailover{{From: "us-east1", To: "us-west1"}, {From: "us-west1", To: "us-east1"}}}}),
		valid("failure percentage only", v1alpha1.TrafficPolicySpec{OutlierDetection: &v1alpha1.OutlierDetection{
			FailurePercentage: &v1alpha1.FailurePercentage{Threshold: 0}}},
			&traffic.Policy{OutlierDetection: &traffic.OutlierDetection{FailurePercentage: &traffic.FailurePercentage{}}}),
		valid("timeout 0s is none", v1alpha1.TrafficPolicySpec{Timeout: tpDur("0s")}, &traffic.Policy{}),

		invalid("timeout 1d", v1alpha1.TrafficPolicySpec{Timeout: tpDur("1d")}, `timeout: "1d" is not a Gateway API duration`),
		invalid("timeout beyond 24h", v1alpha1.TrafficPolicySpec{Timeout: tpDur("25h")}, `TrafficPolicy "p": timeout 25h0m0s is longer than 24h0m0s`),
		invalid("bad durations, all said", v1alpha1.TrafficPolicySpec{
			OutlierDetection: &v1alpha1.OutlierDetection{Interval: tpDur("10x"), BaseEjectionTime: tpDur("1.5s"), MaxEjectionTime: tpDur("-1s"), ConsecutiveErrors: tpInt(1)},
			Retry:            &v1alpha1.Retry{Attempts: 1, Backoff: tpDur("1w"), Codes: []v1alpha1.RetryCode{v1alpha1.RetryUnavailable}},
		}, `outlierDetection.interval: "10x"`, `outlierDetection.baseEjectionTime: "1.5s"`, `outlierDetection.maxEjectionTime: "-1s"`, "; ", `retry.backoff: "1w"`),
		invalid("interval beyond 24h", v1alpha1.TrafficPolicySpec{OutlierDetection: &v1alpha1.OutlierDetection{Interval: tpDur("24h1s"), ConsecutiveErrors: tpInt(1)}},
			"outlierDetection: interval 24h0m1s is longer than 24h0m0s"),
		invalid("unknown algorithm", v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: "Random"}},
			`loadBalancer: unknown algorithm "Random"`),
		invalid("choiceCount out of range", v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.LeastRequest, ChoiceCount: tpInt(11)}},
			"loadBalancer: choiceCount 11 is out of range 2-10"),
		invalid("choiceCount without LeastRequest", v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.RoundRobin, ChoiceCount: tpInt(3)}},
			"choiceCount is for LeastRequest"),
		invalid("hashHeader without RingHash", v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.RoundRobin, HashHeader: "x-a"}},
			"hashHeader is for RingHash"),
		invalid("reserved hashHeader", v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.RingHash, HashHeader: "Grpc-Foo"}},
			`loadBalancer: hashHeader: header "grpc-foo" is reserved`),
		invalid("two locality parts", v1alpha1.TrafficPolicySpec{Locality: &v1alpha1.Locality{Off: true,
			Failover: []v1alpha1.RegionFailover{{From: "a", To: "b"}}}},
			"locality: at most one of off, failoverPriority, failover and distribute"),
		invalid("unknown failoverPriority label", v1alpha1.TrafficPolicySpec{Locality: &v1alpha1.Locality{FailoverPriority: []v1alpha1.LocalityLabel{"kubernetes.io/hostname"}}},
			`failoverPriority label "kubernetes.io/hostname" is not one Nave knows`),
		invalid("failover to itself", v1alpha1.TrafficPolicySpec{Locality: &v1alpha1.Locality{Failover: []v1alpha1.RegionFailover{{From: "a", To: "a"}}}},
			`failover 1: from and to are both "a"`),
		invalid("distribution not summing to 100", v1alpha1.TrafficPolicySpec{Locality: &v1alpha1.Locality{Distribute: []v1alpha1.Distribution{
			{From: "us-east1", To: map[string]int32{"us-east1": 60, "us-west1": 30}}}}},
			"locality: distribute 1: weights sum to 90, not 100"),
		invalid("distribution locality too deep", v1alpha1.TrafficPolicySpec{Locality: &v1alpha1.Locality{Distribute: []v1alpha1.Distribution{
			{From: "a/b/c/d", To: map[string]int32{"a": 100}}}}},
			`from "a/b/c/d" is not region[/zone[/subzone]]`),
		invalid("no detector", v1alpha1.TrafficPolicySpec{OutlierDetection: &v1alpha1.OutlierDetection{Interval: tpDur("1s")}},
			"outlierDetection: names no detector"),
		invalid("maxEjectionPercent above 100", v1alpha1.TrafficPolicySpec{OutlierDetection: &v1alpha1.OutlierDetection{MaxEjectionPercent: tpInt(150), SuccessRate: &v1alpha1.SuccessRate{}}},
			"maxEjectionPercent 150 is above 100"),
		invalid("failure threshold above 100", v1alpha1.TrafficPolicySpec{OutlierDetection: &v1alpha1.OutlierDetection{FailurePercentage: &v1alpha1.FailurePercentage{Threshold: 101}}},
			"failurePercentage threshold 101 is above 100"),
		invalid("retry 0 attempts", v1alpha1.TrafficPolicySpec{Retry: &v1alpha1.Retry{Attempts: 0, Codes: []v1alpha1.RetryCode{v1alpha1.RetryUnavailable}}},
			"retry: attempts 0 is out of range 1-10"),
		invalid("retry without codes", v1alpha1.TrafficPolicySpec{Retry: &v1alpha1.Retry{Attempts: 1}},
			"retry: names no gRPC status to retry on"),
		invalid("retry code not retryable", v1alpha1.TrafficPolicySpec{Retry: &v1alpha1.Retry{Attempts: 1, Codes: []v1alpha1.RetryCode{"not-found"}}},
			`retry: gRPC status "not-found" cannot be retried on`),
		invalid("retry code twice", v1alpha1.TrafficPolicySpec{Retry: &v1alpha1.Retry{Attempts: 1, Codes: []v1alpha1.RetryCode{v1alpha1.RetryInternal, v1alpha1.RetryInternal}}},
			`gRPC status "internal" is named twice`),
		invalid("outlier detection with a detector but bad duration", v1alpha1.TrafficPolicySpec{OutlierDetection: detector, Timeout: tpDur("1d")},
			`timeout: "1d"`),
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tp := tpPolicy("p", c.spec)
			before := tp.DeepCopy()
			got, problem := kubetraffic.FromTrafficPolicy(tp)
			if !reflect.DeepEqual(tp, before) {
				t.Errorf("the policy object changed")
			}
			if c.want == nil {
				if got != nil {
					t.Errorf("policy %s, want none", rtJSON(got))
				}
				if problem == "" {
					t.Fatalf("no problem, want one saying %q", c.problem)
				}
				for _, p := range c.problem {
					if !strings.Contains(problem, p) {
						t.Errorf("problem %q does not say %q", problem, p)
					}
				}
				return
			}
			if problem != "" {
				t.Fatalf("problem %q, want none", problem)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("policy\n%s\nwant\n%s", rtJSON(got), rtJSON(c.want))
			}
		})
	}
}

// tpObject is a TrafficPolicy as the spoke reads it: unstructured.
func tpObject(t *testing.T, name string, generation int64, created time.Time, spec v1alpha1.TrafficPolicySpec) *unstructured.Unstructured {
	t.Helper()
	tp := tpPolicy(name, spec)
	tp.Generation = generation
	tp.CreationTimestamp = metav1.NewTime(created)
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(tp)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func TestResolvePolicies(t *testing.T) {
	key := registry.ServiceKey{Namespace: "shop", Name: "cart"}
	t0 := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	good := v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.RoundRobin}}
	bad := v1alpha1.TrafficPolicySpec{Timeout: tpDur("1d")}
	unreadable := func(t *testing.T, name string, generation int64, created time.Time) *unstructured.Unstructured {
		u := tpObject(t, name, generation, created, good)
		if err := unstructured.SetNestedField(u.Object, "lots", "spec", "maxRequests"); err != nil {
			t.Fatal(err)
		}
		return u
	}
	type want struct {
		name       string
		winner     bool
		policy     bool // a model is given
		status     metav1.ConditionStatus
		reason     string
		msg        []string
		generation int64
	}
	accepted := func(name string, generation int64) want {
		return want{name: name, winner: true, policy: true, status: metav1.ConditionTrue, reason: "Accepted",
			msg: []string{"Service cart"}, generation: generation}
	}
	conflicted := func(name string, generation int64, winner string) want {
		return want{name: name, policy: true, status: metav1.ConditionFalse, reason: "Conflicted",
			msg: []string{"TrafficPolicy " + winner + ",", "Service cart"}, generation: generation}
	}
	invalidW := func(name string, generation int64, msg ...string) want {
		return want{name: name, status: metav1.ConditionFalse, reason: "Invalid", msg: msg, generation: generation}
	}
	cases := []struct {
		name string
		objs func(t *testing.T) []*unstructured.Unstructured
		want []want
	}{
		{"none", func(*testing.T) []*unstructured.Unstructured { return nil }, nil},
		{"one valid", func(t *testing.T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{tpObject(t, "a", 4, t0, good)}
		}, []want{accepted("a", 4)}},
		{"oldest valid wins, the rest conflict", func(t *testing.T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{
				tpObject(t, "old", 1, t0, good),
				tpObject(t, "mid", 2, t0.Add(time.Hour), good),
				tpObject(t, "new", 3, t0.Add(2*time.Hour), good),
			}
		}, []want{accepted("old", 1), conflicted("mid", 2, "old"), conflicted("new", 3, "old")}},
		{"an older invalid policy does not win", func(t *testing.T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{
				tpObject(t, "old", 7, t0, bad),
				tpObject(t, "mid", 8, t0.Add(time.Hour), good),
				tpObject(t, "new", 9, t0.Add(2*time.Hour), good),
			}
		}, []want{invalidW("old", 7, `timeout: "1d"`), accepted("mid", 8), conflicted("new", 9, "mid")}},
		{"a newer invalid policy is invalid, not conflicted", func(t *testing.T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{
				tpObject(t, "old", 1, t0, good),
				tpObject(t, "new", 2, t0.Add(time.Hour), bad),
			}
		}, []want{accepted("old", 1), invalidW("new", 2, "timeout")}},
		{"all invalid: no winner", func(t *testing.T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{
				tpObject(t, "a", 1, t0, bad),
				tpObject(t, "b", 1, t0, v1alpha1.TrafficPolicySpec{LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: "Random"}}),
			}
		}, []want{invalidW("a", 1, "timeout"), invalidW("b", 1, "unknown algorithm")}},
		{"an unreadable policy is invalid", func(t *testing.T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{
				unreadable(t, "old", 5, t0),
				tpObject(t, "new", 6, t0.Add(time.Hour), good),
			}
		}, []want{invalidW("old", 5, "cannot read the policy"), accepted("new", 6)}},
		{"a name the model refuses is invalid", func(t *testing.T) []*unstructured.Unstructured {
			return []*unstructured.Unstructured{
				tpObject(t, "Bad_Name", 1, t0, good),
				tpObject(t, "good", 1, t0.Add(time.Hour), good),
			}
		}, []want{invalidW("Bad_Name", 1, "name is not a DNS subdomain"), accepted("good", 1)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := kubetraffic.ResolvePolicies(key, c.objs(t))
			if len(got) != len(c.want) {
				t.Fatalf("%d results, want %d:\n%s", len(got), len(c.want), rtJSON(got))
			}
			winners := 0
			for i, w := range c.want {
				r := got[i]
				if r.Winner {
					winners++
				}
				if r.Name != w.name || r.Winner != w.winner || (r.Policy != nil) != w.policy {
					t.Errorf("result %d: %s winner %v policy %v, want %s winner %v policy %v", i, r.Name, r.Winner, r.Policy != nil, w.name, w.winner, w.policy)
				}
				if r.Policy != nil && r.Policy.Name != w.name {
					t.Errorf("result %d: policy named %q, want %q", i, r.Policy.Name, w.name)
				}
				cnd := r.Accepted
				if cnd.Type != "Accepted" || cnd.Status != w.status || cnd.Reason != w.reason || cnd.ObservedGeneration != w.generation {
					t.Errorf("result %d (%s): %s %s/%s generation %d (%q), want Accepted %s/%s generation %d",
						i, r.Name, cnd.Type, cnd.Status, cnd.Reason, cnd.ObservedGeneration, cnd.Message, w.status, w.reason, w.generation)
				}
				for _, m := range w.msg {
					if !strings.Contains(cnd.Message, m) {
						t.Errorf("result %d (%s): message %q does not say %q", i, r.Name, cnd.Message, m)
					}
				}
			}
			if winners > 1 {
				t.Errorf("%d winners", winners)
			}
		})
	}
}

func TestTargetNotFound(t *testing.T) {
	c := kubetraffic.TargetNotFound(7, registry.ServiceKey{Namespace: "shop", Name: "cart"})
	want := metav1.Condition{Type: "Accepted", Status: metav1.ConditionFalse, Reason: "TargetNotFound",
		Message: "Service shop/cart does not exist", ObservedGeneration: 7}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("condition %+v, want %+v", c, want)
	}
}
