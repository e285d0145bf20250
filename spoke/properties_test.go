package spoke

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/navemesh/nave/registry"
)

// What an import mirrors of the Service reaches its shard, with
// Kubernetes' defaults as the registry's empty values.
func TestBuildShardsProperties(t *testing.T) {
	tests := []struct {
		name    string
		spec    func(*corev1.ServiceSpec)
		want    registry.Properties
		invalid string
	}{
		{name: "API server defaults", spec: func(s *corev1.ServiceSpec) {
			s.SessionAffinity = corev1.ServiceAffinityNone
			s.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyCluster)
			s.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
		}, want: registry.Properties{IPFamilies: []registry.IPFamily{registry.IPv4}}},
		{name: "everything set", spec: func(s *corev1.ServiceSpec) {
			s.SessionAffinity = corev1.ServiceAffinityClientIP
			s.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](600)}}
			s.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			s.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferClose)
			s.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
		}, want: registry.Properties{
			SessionAffinity: registry.SessionAffinityClientIP, SessionAffinityTimeout: 600,
			InternalTrafficPolicy: registry.InternalTrafficPolicyLocal, TrafficDistribution: "PreferClose",
			IPFamilies: []registry.IPFamily{registry.IPv6, registry.IPv4},
		}},
		{name: "a timeout without ClientIP affinity is ignored, as Kubernetes does", spec: func(s *corev1.ServiceSpec) {
			s.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](600)}}
		}},
		{name: "unknown affinity", spec: func(s *corev1.ServiceSpec) { s.SessionAffinity = "Cookie" }, invalid: "unknown sessionAffinity"},
		{name: "a headless service states no IP families", spec: func(s *corev1.ServiceSpec) {
			s.ClusterIP = corev1.ClusterIPNone
			s.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := svc("web", port("http", 80))
			tt.spec(&s.Spec)
			shards, invalid, _ := BuildShards(Objects{Services: []*corev1.Service{s}}, BuildOptions{Cluster: "east"})
			k := registry.ServiceKey{Namespace: "shop", Name: "web"}
			if tt.invalid != "" {
				if err := invalid[k]; err == nil || !strings.Contains(err.Error(), tt.invalid) {
					t.Fatalf("invalid = %v, want %q", err, tt.invalid)
				}
				return
			}
			if shards[k] == nil {
				t.Fatalf("no shard: %v", invalid[k])
			}
			if got := shards[k].Properties; !got.Equal(&tt.want) {
				t.Errorf("properties = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// The informers' transform keeps what the properties are made of.
func TestStripKeepsProperties(t *testing.T) {
	s := svc("web", port("http", 80))
	s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
	s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	s.Spec.TrafficDistribution = ptr("PreferClose")
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	s.Spec.Selector = map[string]string{"app": "web"}
	want := properties(&s.Spec)
	if _, err := strip(s); err != nil {
		t.Fatal(err)
	}
	if got := properties(&s.Spec); !got.Equal(&want) || s.Spec.Selector != nil {
		t.Errorf("after strip: %+v (selector %v), want %+v and no selector", got, s.Spec.Selector, want)
	}
}
