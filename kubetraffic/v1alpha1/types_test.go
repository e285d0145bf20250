package v1alpha1_test

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/kubetraffic/v1alpha1"
	"github.com/navemesh/nave/traffic"
)

func TestAddToSchemeRegistersTheKinds(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for kind, obj := range map[string]runtime.Object{
		"TrafficPolicy":     &v1alpha1.TrafficPolicy{},
		"TrafficPolicyList": &v1alpha1.TrafficPolicyList{},
	} {
		gvks, _, err := scheme.ObjectKinds(obj)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if want := v1alpha1.SchemeGroupVersion.WithKind(kind); len(gvks) != 1 || gvks[0] != want {
			t.Errorf("%T is %v, want %v", obj, gvks, want)
		}
		made, err := scheme.New(v1alpha1.SchemeGroupVersion.WithKind(kind))
		if err != nil || reflect.TypeOf(made) != reflect.TypeOf(obj) {
			t.Errorf("scheme.New(%s) = %T, %v", kind, made, err)
		}
	}
	if v1alpha1.SchemeGroupVersion.String() != "nave.io/v1alpha1" {
		t.Errorf("SchemeGroupVersion = %s", v1alpha1.SchemeGroupVersion)
	}
	if gr := v1alpha1.Resource("trafficpolicies"); gr.String() != "trafficpolicies.nave.io" {
		t.Errorf("Resource = %s, want trafficpolicies.nave.io (the CRD's name)", gr)
	}
}

// TestEnumsAreTheModels: the CRD's enums are the values package traffic
// validates, so a policy the API server takes reads into the model as is.
func TestEnumsAreTheModels(t *testing.T) {
	for _, pair := range [][2]string{
		{string(v1alpha1.RoundRobin), string(traffic.RoundRobin)},
		{string(v1alpha1.LeastRequest), string(traffic.LeastRequest)},
		{string(v1alpha1.RingHash), string(traffic.RingHash)},
		{string(v1alpha1.WeightedRoundRobin), string(traffic.WeightedRoundRobin)},
		{string(v1alpha1.LabelCluster), traffic.LabelCluster},
		{string(v1alpha1.LabelNetwork), traffic.LabelNetwork},
		{string(v1alpha1.LabelRegion), traffic.LabelRegion},
		{string(v1alpha1.LabelZone), traffic.LabelZone},
	} {
		if pair[0] != pair[1] {
			t.Errorf("v1alpha1 says %q, traffic %q", pair[0], pair[1])
		}
	}
	// Every retry code is one a policy's retry may name in the model.
	for _, code := range []v1alpha1.RetryCode{
		v1alpha1.RetryCancelled, v1alpha1.RetryDeadlineExceeded, v1alpha1.RetryInternal,
		v1alpha1.RetryResourceExhausted, v1alpha1.RetryUnavailable,
	} {
		p := &traffic.Policy{Name: "p", Retry: &traffic.Retry{Attempts: 1, GRPCCodes: []string{string(code)}}}
		if err := p.Validate(); err != nil {
			t.Errorf("retry code %s: %v", code, err)
		}
	}
}

func TestDeepCopyCopiesEverything(t *testing.T) {
	orig := &v1alpha1.TrafficPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"a": "b"}},
		Spec: v1alpha1.TrafficPolicySpec{
			TargetRefs:   []gwv1.LocalPolicyTargetReference{{Kind: "Service", Name: "echo"}},
			LoadBalancer: &v1alpha1.LoadBalancer{Algorithm: v1alpha1.LeastRequest, ChoiceCount: ptr[int32](3)},
			Locality: &v1alpha1.Locality{Distribute: []v1alpha1.Distribution{
				{From: "*", To: map[string]int32{"*": 100}},
			}},
			OutlierDetection: &v1alpha1.OutlierDetection{
				Interval:          ptr(gwv1.Duration("10s")),
				FailurePercentage: &v1alpha1.FailurePercentage{Threshold: 85, MinimumHosts: ptr[int32](5)},
			},
			Retry: &v1alpha1.Retry{Attempts: 2, Codes: []v1alpha1.RetryCode{v1alpha1.RetryUnavailable}},
		},
	}
	cp := orig.DeepCopyObject().(*v1alpha1.TrafficPolicy)
	if !reflect.DeepEqual(cp, orig) {
		t.Fatalf("the copy differs: %#v", cp)
	}
	cp.Labels["a"] = "changed"
	cp.Spec.TargetRefs[0].Name = "changed"
	*cp.Spec.LoadBalancer.ChoiceCount = 9
	cp.Spec.Locality.Distribute[0].To["*"] = 1
	*cp.Spec.OutlierDetection.Interval = "1s"
	*cp.Spec.OutlierDetection.FailurePercentage.MinimumHosts = 1
	cp.Spec.Retry.Codes[0] = v1alpha1.RetryInternal
	switch {
	case orig.Labels["a"] != "b", orig.Spec.TargetRefs[0].Name != "echo", *orig.Spec.LoadBalancer.ChoiceCount != 3,
		orig.Spec.Locality.Distribute[0].To["*"] != 100, *orig.Spec.OutlierDetection.Interval != "10s",
		*orig.Spec.OutlierDetection.FailurePercentage.MinimumHosts != 5, orig.Spec.Retry.Codes[0] != v1alpha1.RetryUnavailable:
		t.Errorf("changing the copy changed the original: %#v", orig)
	}
}

func ptr[T any](v T) *T { return &v }
