package kubetraffic

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/kubetraffic/v1alpha1"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// TrafficPolicyResource is the TrafficPolicy resource the spoke watches.
var TrafficPolicyResource = v1alpha1.SchemeGroupVersion.WithResource("trafficpolicies")

// The policy condition reasons (GEP-713's, from the Gateway API).
const (
	policyAccepted       = string(gwv1.PolicyReasonAccepted)
	policyConflicted     = string(gwv1.PolicyReasonConflicted)
	policyInvalid        = string(gwv1.PolicyReasonInvalid)
	policyTargetNotFound = string(gwv1.PolicyReasonTargetNotFound)
)

// PolicyResult is what became of one TrafficPolicy targeting one Service.
type PolicyResult struct {
	Name string
	// Policy is its model, nil when it is invalid.
	Policy *traffic.Policy
	// Winner: it is the policy the Service's shard carries.
	Winner bool
	// Accepted is its condition for the Service (status.ancestors[]).
	Accepted metav1.Condition
}

// ResolvePolicies resolves the TrafficPolicies that target Service key
// (objs, sorted oldest first, then by name, as GEP-713 orders conflicting
// policies): the oldest valid one wins; the others are Conflicted, and the
// invalid ones Invalid.
func ResolvePolicies(key registry.ServiceKey, objs []*unstructured.Unstructured) []PolicyResult {
	out := make([]PolicyResult, 0, len(objs))
	var winner string
	for _, u := range objs {
		r := PolicyResult{Name: u.GetName()}
		p, problem := policyFrom(u)
		switch {
		case problem != "":
			r.Accepted = policyCondition(u.GetGeneration(), false, policyInvalid, problem)
		case winner != "":
			r.Policy = p
			r.Accepted = policyCondition(u.GetGeneration(), false, policyConflicted,
				fmt.Sprintf("TrafficPolicy %s, older, targets Service %s too: it applies", winner, key.Name))
		default:
			winner, r.Policy, r.Winner = u.GetName(), p, true
			r.Accepted = policyCondition(u.GetGeneration(), true, policyAccepted,
				fmt.Sprintf("Nave carries the policy with Service %s to every cluster", key.Name))
		}
		out = append(out, r)
	}
	return out
}

// TargetNotFound is the condition of a policy whose target Service does not exist.
func TargetNotFound(generation int64, key registry.ServiceKey) metav1.Condition {
	return policyCondition(generation, false, policyTargetNotFound, fmt.Sprintf("Service %s does not exist", key))
}

// TargetNotExported is the condition of a policy whose target Service the
// spoke does not export: nothing carries the policy to any cluster.
func TargetNotExported(generation int64, key registry.ServiceKey) metav1.Condition {
	return policyCondition(generation, false, policyTargetNotFound,
		fmt.Sprintf("Service %s is not exported (no ServiceExport): no cluster gets the policy", key))
}

func policyCondition(generation int64, ok bool, reason, message string) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{Type: string(gwv1.PolicyConditionAccepted), Status: status, Reason: reason, Message: cut(message),
		ObservedGeneration: generation}
}

// policyFrom converts a TrafficPolicy into the model, or says why it cannot.
func policyFrom(u *unstructured.Unstructured) (*traffic.Policy, string) {
	var tp v1alpha1.TrafficPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &tp); err != nil {
		return nil, fmt.Sprintf("cannot read the policy: %v", err)
	}
	return FromTrafficPolicy(&tp)
}

// FromTrafficPolicy converts a TrafficPolicy into the model, or says why it
// cannot (a value the model refuses, or a duration it cannot parse).
func FromTrafficPolicy(tp *v1alpha1.TrafficPolicy) (*traffic.Policy, string) {
	spec := &tp.Spec
	p := &traffic.Policy{Name: tp.Name, MaxRequests: uint32(max(deref(spec.MaxRequests), 0))}
	var problems []string
	duration := func(field string, d *gwv1.Duration) time.Duration {
		if d == nil {
			return 0
		}
		v, err := parseDuration(*d)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", field, err))
		}
		return v
	}
	p.Timeout = duration("timeout", spec.Timeout)
	if lb := spec.LoadBalancer; lb != nil {
		p.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.Algorithm(lb.Algorithm),
			ChoiceCount: uint32(max(deref(lb.ChoiceCount), 0)), HashHeader: strings.ToLower(string(lb.HashHeader))}
	}
	if l := spec.Locality; l != nil {
		tl := &traffic.LocalityPolicy{Off: l.Off}
		for _, label := range l.FailoverPriority {
			tl.FailoverPriority = append(tl.FailoverPriority, string(label))
		}
		for _, f := range l.Failover {
			tl.Failover = append(tl.Failover, traffic.RegionFailover{From: f.From, To: f.To})
		}
		for _, d := range l.Distribute {
			td := traffic.Distribution{From: d.From}
			for _, to := range sortedKeys(d.To) {
				td.To = append(td.To, traffic.LocalityWeight{Locality: to, Weight: uint32(max(d.To[to], 0))})
			}
			tl.Distribute = append(tl.Distribute, td)
		}
		p.Locality = tl
	}
	if o := spec.OutlierDetection; o != nil {
		to := &traffic.OutlierDetection{
			Interval:           duration("outlierDetection.interval", o.Interval),
			BaseEjectionTime:   duration("outlierDetection.baseEjectionTime", o.BaseEjectionTime),
			MaxEjectionTime:    duration("outlierDetection.maxEjectionTime", o.MaxEjectionTime),
			MaxEjectionPercent: uint32(max(deref(o.MaxEjectionPercent), 0)),
			ConsecutiveErrors:  uint32(max(deref(o.ConsecutiveErrors), 0)),
		}
		if f := o.FailurePercentage; f != nil {
			to.FailurePercentage = &traffic.FailurePercentage{Threshold: uint32(max(f.Threshold, 0)),
				MinimumHosts: uint32(max(deref(f.MinimumHosts), 0)), RequestVolume: uint32(max(deref(f.RequestVolume), 0))}
		}
		if s := o.SuccessRate; s != nil {
			to.SuccessRate = &traffic.SuccessRate{StdevFactor: uint32(max(deref(s.StdevFactor), 0)),
				MinimumHosts: uint32(max(deref(s.MinimumHosts), 0)), RequestVolume: uint32(max(deref(s.RequestVolume), 0))}
		}
		p.OutlierDetection = to
	}
	if r := spec.Retry; r != nil {
		tr := &traffic.Retry{Attempts: r.Attempts, Backoff: duration("retry.backoff", r.Backoff)}
		for _, c := range r.Codes {
			tr.GRPCCodes = append(tr.GRPCCodes, string(c))
		}
		p.Retry = tr
	}
	if len(problems) > 0 {
		return nil, strings.Join(problems, "; ")
	}
	set := traffic.Set{Policy: p}
	set.Normalize()
	if err := p.Validate(); err != nil {
		return nil, strings.TrimPrefix(err.Error(), traffic.ErrInvalid.Error()+": ")
	}
	return p, ""
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
