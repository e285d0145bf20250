package e2e

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/internal/kubetest"
	tpv1 "github.com/navemesh/nave/kubetraffic/v1alpha1"
)

// trafficPolicyCRD is the CRD `make generate` writes from kubetraffic/v1alpha1.
var trafficPolicyCRD = filepath.Join(deployDir, "crds", "trafficpolicies.yaml")

// TestTrafficPolicyCRD has a real API server take the TrafficPolicy CRD of
// deploy/crds and policies written with kubetraffic/v1alpha1's Go types,
// created with strict field validation (so a field the types have and the
// CRD lacks fails): a policy setting every field, and one per locality form
// and load balancer option, each read back equal; a status written through
// the status subresource; then policies the CRD's schema and CEL rules must
// refuse, each with a message naming the field.
func TestTrafficPolicyCRD(t *testing.T) {
	c := kubetest.StartClusters(t, "trafficpolicy")[0]
	c.Apply(t, trafficPolicyCRD)
	policies := c.Dynamic.Resource(tpv1.SchemeGroupVersion.WithResource("trafficpolicies")).Namespace("default")

	full := fullTrafficPolicy("full")
	got, err := createTrafficPolicy(t, policies, full)
	if err != nil {
		t.Fatalf("create the full TrafficPolicy: %v", err)
	}
	if !reflect.DeepEqual(got.Spec, full.Spec) {
		sameJSON(t, "the full TrafficPolicy's spec", got.Spec, full.Spec)
		t.Errorf("the full TrafficPolicy's spec read back unequal:\n got %#v\nwant %#v", got.Spec, full.Spec)
	}
	if got.APIVersion != "nave.io/v1alpha1" || got.Kind != "TrafficPolicy" || got.Generation != 1 {
		t.Errorf("read back as %s %s generation %d", got.APIVersion, got.Kind, got.Generation)
	}

	// The other locality forms and load balancer options, one policy each.
	variants := map[string]func(*tpv1.TrafficPolicySpec){
		"ring-hash": func(s *tpv1.TrafficPolicySpec) {
			s.LoadBalancer = &tpv1.LoadBalancer{Algorithm: tpv1.RingHash, HashHeader: "X-User"}
		},
		"failover": func(s *tpv1.TrafficPolicySpec) {
			s.LoadBalancer = &tpv1.LoadBalancer{Algorithm: tpv1.WeightedRoundRobin}
			s.Locality = &tpv1.Locality{Failover: []tpv1.RegionFailover{
				{From: "us-east1", To: "us-west1"}, {From: "us-west1", To: "us-east1"},
			}}
		},
		"distribute": func(s *tpv1.TrafficPolicySpec) {
			s.Locality = &tpv1.Locality{Distribute: []tpv1.Distribution{
				{From: "us-east1/*", To: map[string]int32{"us-east1/us-east1-b": 80, "us-west1/*": 20}},
				{From: "*", To: map[string]int32{"*": 100}},
			}}
		},
		"off": func(s *tpv1.TrafficPolicySpec) {
			s.Locality = &tpv1.Locality{Off: true}
			s.OutlierDetection = &tpv1.OutlierDetection{SuccessRate: &tpv1.SuccessRate{}}
			s.Retry = &tpv1.Retry{Attempts: 1, Codes: []tpv1.RetryCode{tpv1.RetryUnavailable}}
		},
	}
	for name, change := range variants {
		p := fullTrafficPolicy(name)
		change(&p.Spec)
		got, err := createTrafficPolicy(t, policies, p)
		if err != nil {
			t.Errorf("create TrafficPolicy %s: %v", name, err)
			continue
		}
		if !reflect.DeepEqual(got.Spec, p.Spec) {
			sameJSON(t, "TrafficPolicy "+name+"'s spec", got.Spec, p.Spec)
		}
	}

	// The status subresource: the spoke writes ancestors[] there.
	got.Status = gatewayv1.PolicyStatus{Ancestors: []gatewayv1.PolicyAncestorStatus{{
		AncestorRef:    gatewayv1.ParentReference{Group: ptr(gatewayv1.Group("")), Kind: ptr(gatewayv1.Kind("Service")), Name: "echo"},
		ControllerName: "nave.io/spoke",
		Conditions: []metav1.Condition{{
			Type: string(gatewayv1.PolicyConditionAccepted), Status: metav1.ConditionTrue, Reason: string(gatewayv1.PolicyReasonAccepted),
			Message: "applied", ObservedGeneration: got.Generation,
			LastTransitionTime: metav1.NewTime(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)),
		}},
	}}}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(got)
	if err != nil {
		t.Fatal(err)
	}
	u, err := policies.UpdateStatus(t.Context(), &unstructured.Unstructured{Object: obj},
		metav1.UpdateOptions{FieldManager: kubetest.FieldManager, FieldValidation: metav1.FieldValidationStrict})
	if err != nil {
		t.Fatalf("update the full TrafficPolicy's status: %v", err)
	}
	withStatus := &tpv1.TrafficPolicy{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, withStatus); err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "the full TrafficPolicy's status", withStatus.Status, got.Status)
	if withStatus.Generation != got.Generation {
		t.Errorf("a status update moved the generation from %d to %d", got.Generation, withStatus.Generation)
	}

	for _, tt := range []struct {
		name   string
		change func(*tpv1.TrafficPolicySpec)
		// want are the parts of the API server's message: the field's path first.
		want []string
	}{
		{"algorithm Random", func(s *tpv1.TrafficPolicySpec) { s.LoadBalancer.Algorithm = "Random" },
			[]string{"spec.loadBalancer.algorithm", `Unsupported value: "Random"`}},
		{"choiceCount with RingHash", func(s *tpv1.TrafficPolicySpec) { s.LoadBalancer.Algorithm = tpv1.RingHash },
			[]string{"spec.loadBalancer.choiceCount", "choiceCount applies only to the LeastRequest algorithm"}},
		{"hashHeader with LeastRequest", func(s *tpv1.TrafficPolicySpec) { s.LoadBalancer.HashHeader = "x-user" },
			[]string{"spec.loadBalancer.hashHeader", "hashHeader applies only to the RingHash algorithm"}},
		{"choiceCount 11", func(s *tpv1.TrafficPolicySpec) { s.LoadBalancer.ChoiceCount = ptr[int32](11) },
			[]string{"spec.loadBalancer.choiceCount", "less than or equal to 10"}},
		{"hashHeader grpc-", func(s *tpv1.TrafficPolicySpec) {
			s.LoadBalancer = &tpv1.LoadBalancer{Algorithm: tpv1.RingHash, HashHeader: "Grpc-Timeout"}
		}, []string{"spec.loadBalancer.hashHeader", "grpc- headers are reserved"}},
		{"two locality forms", func(s *tpv1.TrafficPolicySpec) {
			s.Locality.Failover = []tpv1.RegionFailover{{From: "us-east1", To: "us-west1"}}
		}, []string{"spec.locality", "set at most one of off, failoverPriority, failover and distribute"}},
		{"off and distribute", func(s *tpv1.TrafficPolicySpec) {
			s.Locality = &tpv1.Locality{Off: true, Distribute: []tpv1.Distribution{{From: "*", To: map[string]int32{"*": 100}}}}
		}, []string{"spec.locality", "set at most one of"}},
		{"failoverPriority label foo", func(s *tpv1.TrafficPolicySpec) { s.Locality.FailoverPriority = []tpv1.LocalityLabel{"foo"} },
			[]string{"spec.locality.failoverPriority[0]", `Unsupported value: "foo"`}},
		{"failoverPriority label twice", func(s *tpv1.TrafficPolicySpec) {
			s.Locality.FailoverPriority = []tpv1.LocalityLabel{tpv1.LabelRegion, tpv1.LabelRegion}
		}, []string{"spec.locality.failoverPriority[1]", "Duplicate value"}},
		{"failover to itself", func(s *tpv1.TrafficPolicySpec) {
			s.Locality = &tpv1.Locality{Failover: []tpv1.RegionFailover{{From: "us-east1", To: "us-east1"}}}
		}, []string{"spec.locality.failover[0]", "from and to must be different regions"}},
		{"distribute weights sum to 90", func(s *tpv1.TrafficPolicySpec) {
			s.Locality = &tpv1.Locality{Distribute: []tpv1.Distribution{{From: "us-east1", To: map[string]int32{"us-east1": 60, "us-west1": 30}}}}
		}, []string{"spec.locality.distribute[0].to", "sum to 100"}},
		{"distribute to a bad locality", func(s *tpv1.TrafficPolicySpec) {
			s.Locality = &tpv1.Locality{Distribute: []tpv1.Distribution{{From: "us-east1", To: map[string]int32{"a/b/c/d": 100}}}}
		}, []string{"spec.locality.distribute[0].to", "region, region/zone or region/zone/subzone"}},
		{"outlierDetection with no detector", func(s *tpv1.TrafficPolicySpec) {
			s.OutlierDetection = &tpv1.OutlierDetection{Interval: ptr(gatewayv1.Duration("10s"))}
		}, []string{"spec.outlierDetection", "at least one detector"}},
		{"maxEjectionPercent 101", func(s *tpv1.TrafficPolicySpec) { s.OutlierDetection.MaxEjectionPercent = ptr[int32](101) },
			[]string{"spec.outlierDetection.maxEjectionPercent", "less than or equal to 100"}},
		{"interval 25h", func(s *tpv1.TrafficPolicySpec) { s.OutlierDetection.Interval = ptr(gatewayv1.Duration("25h")) },
			[]string{"spec.outlierDetection.interval", "interval must be at most 24h"}},
		{"timeout 1d", func(s *tpv1.TrafficPolicySpec) { s.Timeout = ptr(gatewayv1.Duration("1d")) },
			[]string{"spec.timeout", "should match"}},
		{"maxRequests 0", func(s *tpv1.TrafficPolicySpec) { s.MaxRequests = ptr[int32](0) },
			[]string{"spec.maxRequests", "greater than or equal to 1"}},
		{"retry code ok", func(s *tpv1.TrafficPolicySpec) { s.Retry.Codes = []tpv1.RetryCode{"ok"} },
			[]string{"spec.retry.codes[0]", `Unsupported value: "ok"`}},
		{"retry with no codes", func(s *tpv1.TrafficPolicySpec) { s.Retry.Codes = nil },
			[]string{"spec.retry.codes", "Required value"}},
		{"retry attempts 11", func(s *tpv1.TrafficPolicySpec) { s.Retry.Attempts = 11 },
			[]string{"spec.retry.attempts", "less than or equal to 10"}},
		{"targetRef kind Deployment", func(s *tpv1.TrafficPolicySpec) {
			s.TargetRefs[0] = gatewayv1.LocalPolicyTargetReference{Group: "apps", Kind: "Deployment", Name: "echo"}
		}, []string{"spec.targetRefs", "a TrafficPolicy targets only Services"}},
		{"no targetRefs", func(s *tpv1.TrafficPolicySpec) { s.TargetRefs = nil },
			[]string{"spec.targetRefs", "Required value"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := fullTrafficPolicy("refused")
			tt.change(&p.Spec)
			_, err := createTrafficPolicy(t, policies, p)
			if err == nil {
				t.Fatalf("the API server took %s", tt.name)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the API server refused it with %q, want it to say %q", err, w)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}

// fullTrafficPolicy is a TrafficPolicy of the default namespace that sets
// every field but those another excludes (RingHash's hashHeader, the
// locality forms but failoverPriority).
func fullTrafficPolicy(name string) *tpv1.TrafficPolicy {
	return &tpv1.TrafficPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: tpv1.SchemeGroupVersion.String(), Kind: "TrafficPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: tpv1.TrafficPolicySpec{
			TargetRefs: []gatewayv1.LocalPolicyTargetReference{
				{Group: "", Kind: "Service", Name: "echo"},
				{Group: "", Kind: "Service", Name: "web"},
			},
			LoadBalancer: &tpv1.LoadBalancer{Algorithm: tpv1.LeastRequest, ChoiceCount: ptr[int32](3)},
			Locality: &tpv1.Locality{FailoverPriority: []tpv1.LocalityLabel{
				tpv1.LabelNetwork, tpv1.LabelRegion, tpv1.LabelZone, tpv1.LabelCluster,
			}},
			OutlierDetection: &tpv1.OutlierDetection{
				Interval:           ptr(gatewayv1.Duration("10s")),
				BaseEjectionTime:   ptr(gatewayv1.Duration("30s")),
				MaxEjectionTime:    ptr(gatewayv1.Duration("5m")),
				MaxEjectionPercent: ptr[int32](50),
				ConsecutiveErrors:  ptr[int32](5),
				FailurePercentage:  &tpv1.FailurePercentage{Threshold: 85, MinimumHosts: ptr[int32](3), RequestVolume: ptr[int32](50)},
				SuccessRate:        &tpv1.SuccessRate{StdevFactor: ptr[int32](1900), MinimumHosts: ptr[int32](5), RequestVolume: ptr[int32](100)},
			},
			MaxRequests: ptr[int32](1024),
			Timeout:     ptr(gatewayv1.Duration("1m30s")),
			Retry: &tpv1.Retry{
				Attempts: 3,
				Backoff:  ptr(gatewayv1.Duration("100ms")),
				Codes: []tpv1.RetryCode{
					tpv1.RetryCancelled, tpv1.RetryDeadlineExceeded, tpv1.RetryInternal, tpv1.RetryResourceExhausted, tpv1.RetryUnavailable,
				},
			},
		},
	}
}

// createTrafficPolicy creates a policy with strict field validation, reads
// it back and decodes it. A policy of the same name from an
// earlier, refused attempt cannot exist, so a create is enough.
func createTrafficPolicy(t testing.TB, policies dynamic.ResourceInterface, p *tpv1.TrafficPolicy) (*tpv1.TrafficPolicy, error) {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policies.Create(t.Context(), &unstructured.Unstructured{Object: obj},
		metav1.CreateOptions{FieldManager: kubetest.FieldManager, FieldValidation: metav1.FieldValidationStrict}); err != nil {
		return nil, err
	}
	u, err := policies.Get(t.Context(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read back TrafficPolicy %s: %v", p.Name, err)
	}
	got := &tpv1.TrafficPolicy{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, got); err != nil {
		t.Fatalf("decode TrafficPolicy %s: %v", p.Name, err)
	}
	return got, nil
}
