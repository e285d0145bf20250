package kubetest_test

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/navemesh/nave/internal/kubetest"
)

// TestClusters starts two clusters once and checks everything that needs one.
func TestClusters(t *testing.T) {
	clusters := kubetest.StartClusters(t, "east", "west")
	east, west := clusters[0], clusters[1]

	t.Run("separate", func(t *testing.T) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "only-in-east"}}
		if _, err := east.Client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := west.Client.CoreV1().Namespaces().Get(t.Context(), ns.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("west: namespace of east: got %v, want NotFound", err)
		}
	})

	t.Run("spoke credentials", func(t *testing.T) { testSpokeCredentials(t, east) })
	t.Run("apply and dry run", func(t *testing.T) { testApply(t, west) })
	t.Run("endpoint addresses", func(t *testing.T) { testEndpointAddresses(t, east) })
}

// testSpokeCredentials checks that the spoke kubeconfig is the nave-spoke
// ServiceAccount's user, which RBAC bound to that ServiceAccount governs.
func testSpokeCredentials(t *testing.T, c *kubetest.Cluster) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.SpokeKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	spoke := kubernetes.NewForConfigOrDie(cfg)
	review, err := spoke.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; u.Username != kubetest.SpokeUser || !slices.Contains(u.Groups, "system:serviceaccounts:nave-system") {
		t.Fatalf("spoke is %q in %v", u.Username, u.Groups)
	}
	listServices := func(ctx context.Context) error {
		_, err := spoke.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		return err
	}
	if err := listServices(t.Context()); !apierrors.IsForbidden(err) {
		t.Fatalf("spoke lists services before RBAC: got %v, want Forbidden", err)
	}

	c.Apply(t, writeManifest(t, `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: service-reader
rules:
- apiGroups: [""]
  resources: [services]
  verbs: [list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: nave-spoke-service-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: service-reader
subjects:
- kind: ServiceAccount
  name: nave-spoke
  namespace: nave-system
`))
	// The authorizer learns of the binding through its informers.
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return listServices(ctx) == nil, nil
	}); err != nil {
		t.Fatalf("spoke still may not list services after RBAC: %v", listServices(t.Context()))
	}
}

// testApply applies a CRD and a custom resource of it from one file, then
// checks that DryRun accepts valid objects and names the rejected ones.
func testApply(t *testing.T, c *kubetest.Cluster) {
	file := writeManifest(t, `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.nave.io
spec:
  group: test.nave.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1}
---
# Widgets without a namespace land in "default".
apiVersion: test.nave.io/v1
kind: Widget
metadata:
  name: small
spec:
  size: 1
`)
	c.Apply(t, file)
	if _, err := c.Dynamic.Resource(widgets).Namespace("default").Get(t.Context(), "small", metav1.GetOptions{}); err != nil {
		t.Fatalf("applied widget: %v", err)
	}
	c.Apply(t, file) // applying again updates in place

	c.Apply(t, writeManifest(t, `
apiVersion: v1
kind: Namespace
metadata:
  name: restricted
  labels: {pod-security.kubernetes.io/enforce: restricted}
`))
	objs := kubetest.ReadManifests(t, writeManifest(t, `
apiVersion: test.nave.io/v1
kind: Widget
metadata:
  name: big
spec:
  size: 100
---
apiVersion: test.nave.io/v1
kind: Widget
metadata:
  name: empty
spec:
  size: 0
---
# Accepted, with a warning: the namespace would refuse its pods.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: root
  namespace: restricted
spec:
  selector: {matchLabels: {app: root}}
  template:
    metadata: {labels: {app: root}}
    spec:
      containers: [{name: root, image: root}]
`))
	err := c.DryRun(t.Context(), objs...)
	if err == nil || !strings.Contains(err.Error(), objs[1].Source+": Widget empty") {
		t.Fatalf("dry run: got %v, want the empty widget (%s) rejected", err, objs[1].Source)
	}
	if !strings.Contains(err.Error(), objs[2].Source+": Deployment restricted/root: warning: would violate PodSecurity") {
		t.Fatalf("dry run: got %v, want a warning about the Deployment (%s)", err, objs[2].Source)
	}
	if strings.Contains(err.Error(), objs[0].Source) {
		t.Fatalf("dry run rejected the valid widget: %v", err)
	}
	if _, err := c.Dynamic.Resource(widgets).Namespace("default").Get(t.Context(), "big", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("dry run stored a widget: %v", err)
	}
}

var widgets = schema.GroupVersionResource{Group: "test.nave.io", Version: "v1", Resource: "widgets"}

// TestHosts serves TCP on two test hosts and reaches them from the root namespace.
func TestHosts(t *testing.T) {
	hosts := []*kubetest.Host{kubetest.NewHost(t), kubetest.NewHost(t)}
	if hosts[0].IP == hosts[1].IP {
		t.Fatalf("two hosts share %v", hosts[0].IP)
	}
	for _, h := range hosts {
		l, err := h.Listen("tcp", "0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = conn.Write([]byte(h.Netns + "\n"))
				_ = conn.Close()
			}
		}()
		conn, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatalf("dial %s in %s: %v", l.Addr(), h.Netns, err)
		}
		line, err := bufio.NewReader(conn).ReadString('\n')
		_ = conn.Close()
		if err != nil || line != h.Netns+"\n" {
			t.Fatalf("%s answered %q, %v", l.Addr(), line, err)
		}
	}
}

// testEndpointAddresses checks that the API server takes a test host's
// address in an EndpointSlice, and rejects loopback.
func testEndpointAddresses(t *testing.T, c *kubetest.Cluster) {
	host := kubetest.NewHost(t)
	slice := func(name, ip string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}}},
		}
	}
	eps := c.Client.DiscoveryV1().EndpointSlices("default")
	if _, err := eps.Create(t.Context(), slice("echo-host", host.IP.String()), metav1.CreateOptions{}); err != nil {
		t.Fatalf("EndpointSlice with a test host's address: %v", err)
	}
	if _, err := eps.Create(t.Context(), slice("echo-loopback", "127.0.0.1"), metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("EndpointSlice with a loopback address: got %v, want Invalid", err)
	}
}

// writeManifest writes YAML to a file of its own and returns its path.
func writeManifest(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
