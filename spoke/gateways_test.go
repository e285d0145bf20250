package spoke

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/navemesh/nave/registry"
)

func TestServiceGateways(t *testing.T) {
	svc := func(annotation string, ports ...corev1.ServicePort) *corev1.Service {
		s := &corev1.Service{Spec: corev1.ServiceSpec{Ports: ports, ExternalIPs: []string{"198.51.100.1"}}}
		if annotation != "" {
			s.Annotations = map[string]string{NetworkGatewayPortAnnotation: annotation}
		}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.7"}, {Hostname: "gw.example.com"}}
		return s
	}
	tls := corev1.ServicePort{Name: "tls", Port: 15443}
	h2 := corev1.ServicePort{Name: "h2", Port: DefaultGatewayPort}
	udp := corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}
	for _, tc := range []struct {
		name    string
		svc     *corev1.Service
		port    int32
		problem string
	}{
		{"the default port", svc("", tls, h2), DefaultGatewayPort, ""},
		{"the first TCP port", svc("", udp, tls), 15443, ""},
		{"a port named by the annotation", svc("tls", tls, h2), 15443, ""},
		{"a port numbered by the annotation", svc("15443", h2, tls), 15443, ""},
		{"an annotation naming no port", svc("https", tls, h2), 0, "names no TCP port"},
		{"no TCP port", svc("", udp), 0, "no TCP port"},
	} {
		gws, problem := serviceGateways(tc.svc)
		if tc.problem != "" {
			if !contains(problem, tc.problem) || gws != nil {
				t.Errorf("%s: %v, %q; want the problem %q", tc.name, gws, problem, tc.problem)
			}
			continue
		}
		want := []registry.Gateway{{Address: "192.0.2.7", Port: tc.port}, {Address: "gw.example.com", Port: tc.port}, {Address: "198.51.100.1", Port: tc.port}}
		if problem != "" || !slices.Equal(gws, want) {
			t.Errorf("%s: %v, %q; want %v", tc.name, gws, problem, want)
		}
	}
	if _, problem := serviceGateways(&corev1.Service{Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{h2}}}); problem == "" {
		t.Error("a gateway Service without addresses offers gateways")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// A kube source finds its network's gateway Services on a real API server
// and follows their load balancer's addresses, ignoring other networks'.
func TestKubeSourceFindsGatewayServices(t *testing.T) {
	f := newKubeFixture(t, true)
	kube, _, _ := f.startSource(nil)
	var mu sync.Mutex
	var told [][]registry.Gateway
	kube.OnGateways("net-east", func(gws []registry.Gateway) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, gws)
	})
	awaitGateways := func(what string, want []registry.Gateway) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(told)
			var last []registry.Gateway
			if n > 0 {
				last = told[n-1]
			}
			mu.Unlock()
			if n > 0 && slices.Equal(last, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: told %v, want %v", what, last, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	awaitGateways("no gateway Service", nil)

	ctx := t.Context()
	gw := kubeService("nave-system", "eastwest", map[string]string{NetworkGatewayLabel: "net-east"},
		corev1.ServicePort{Name: "tls", Port: 15443}, corev1.ServicePort{Name: "h2", Port: DefaultGatewayPort})
	gw.Spec.Type = corev1.ServiceTypeLoadBalancer
	other := kubeService("nave-system", "other-network", map[string]string{NetworkGatewayLabel: "net-west"},
		corev1.ServicePort{Name: "h2", Port: DefaultGatewayPort})
	other.Spec.ExternalIPs = []string{"198.51.100.9"}
	f.create(gw, other)

	// The load balancer gets its addresses.
	created, err := f.kc.CoreV1().Services("nave-system").Get(ctx, "eastwest", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.7"}, {Hostname: "gw.east.example.com"}}
	if created, err = f.kc.CoreV1().Services("nave-system").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitGateways("the load balancer's addresses", []registry.Gateway{
		{Address: "192.0.2.7", Port: DefaultGatewayPort}, {Address: "gw.east.example.com", Port: DefaultGatewayPort}})

	// The annotation picks another port.
	created.Annotations = map[string]string{NetworkGatewayPortAnnotation: "tls"}
	if created, err = f.kc.CoreV1().Services("nave-system").Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitGateways("the annotated port", []registry.Gateway{{Address: "192.0.2.7", Port: 15443}, {Address: "gw.east.example.com", Port: 15443}})

	// Unlabelled, it is no gateway.
	created.Labels = nil
	if _, err = f.kc.CoreV1().Services("nave-system").Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitGateways("the label removed", nil)
}

// A directory source mirrors a cluster: its Services labelled as gateways of
// the network are announced, as a kube source's are, and follow its edits.
func TestDirSourceFindsGatewayServices(t *testing.T) {
	var mu sync.Mutex
	var told [][]registry.Gateway
	h := startDirSourceWith(t, copyTestdata(t), func(d *DirSource) {
		d.OnGateways("net-east", func(gws []registry.Gateway) {
			mu.Lock()
			defer mu.Unlock()
			told = append(told, gws)
		})
	}, nil)
	h.write("gateway.yaml", `apiVersion: v1
kind: Service
metadata:
  name: eastwest
  namespace: nave-system
  labels: {topology.nave.io/network-gateway: net-east}
spec:
  ports: [{name: tls, port: 15443}, {name: h2, port: 15444}]
  externalIPs: [192.0.2.7]
---
apiVersion: v1
kind: Service
metadata:
  name: other-network
  namespace: nave-system
  labels: {topology.nave.io/network-gateway: net-west}
spec:
  ports: [{name: h2, port: 15444}]
  externalIPs: [198.51.100.9]
`)
	await := func(what string, want []registry.Gateway) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			var last []registry.Gateway
			n := len(told)
			if n > 0 {
				last = told[n-1]
			}
			mu.Unlock()
			if n > 0 && slices.Equal(last, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: told %v, want %v", what, last, want)
			}
		}
	}
	go func() { // the harness's states channel is unbuffered: drain it
		for {
			select {
			case <-h.states:
			case <-t.Context().Done():
				return
			}
		}
	}()
	await("the gateway Service of net-east", []registry.Gateway{{Address: "192.0.2.7", Port: DefaultGatewayPort}})
	h.edit("gateway.yaml", "labels: {topology.nave.io/network-gateway: net-east}", "labels: {}")
	await("the label removed", nil)
}
