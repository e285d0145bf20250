package kubeclient_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/internal/kubetest"
)

// contentTypes records the Content-Type of every request body and the
// Accept of every request, by path.
type contentTypes struct {
	mu     sync.Mutex
	sent   map[string]string // "POST /api/v1/namespaces/default/services" -> Content-Type
	accept map[string]string
}

func (c *contentTypes) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		c.mu.Lock()
		key := r.Method + " " + r.URL.Path
		c.sent[key], c.accept[key] = r.Header.Get("Content-Type"), r.Header.Get("Accept")
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClient reads, writes and watches built-in and custom resources on a
// real kube-apiserver, as client-go's clientset would: built-in objects
// travel as protobuf, and errors keep their reason.
func TestClient(t *testing.T) {
	cluster := kubetest.StartClusters(t, "east")[0]
	seen := &contentTypes{sent: map[string]string{}, accept: map[string]string{}}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = 50, 100
	cfg.WrapTransport = seen.wrap
	c, err := kubeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	// An informer with a label selector sees what matches it, and listers read its cache.
	inf := kubeclient.NewInformer(c.Services(""), &corev1.Service{}, func(o *metav1.ListOptions) { o.LabelSelector = "team=a" })
	informers := start(t, inf)
	if !informers.WaitForSync(ctx.Done()) {
		t.Fatal("the informer did not sync")
	}
	lister := corelisters.NewServiceLister(inf.GetIndexer())

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Labels: map[string]string{"team": "a"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
	created, err := c.Services("default").Create(ctx, svc, metav1.CreateOptions{FieldManager: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if created.UID == "" || created.Spec.ClusterIP == "" {
		t.Fatalf("created Service lacks what the API server sets: %+v", created)
	}
	if _, err := c.Services("default").Create(ctx, svc, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating it again: %v, want AlreadyExists", err)
	}
	other := svc.DeepCopy()
	other.Name, other.Labels = "other", map[string]string{"team": "b"}
	if _, err := c.Services("default").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	patched, err := c.Services("default").Patch(ctx, "web", types.MergePatchType, []byte(`{"metadata":{"annotations":{"a":"b"}}}`), metav1.PatchOptions{})
	if err != nil || patched.Annotations["a"] != "b" {
		t.Fatalf("patch: %v, %v", patched, err)
	}
	await(t, "the informer holding the patched Service, and not the other", func() bool {
		got, err := lister.Services("default").Get("web")
		_, otherErr := lister.Services("default").Get("other")
		return err == nil && got.Annotations["a"] == "b" && apierrors.IsNotFound(otherErr)
	})
	// Update and Delete keep their guards: a stale resourceVersion, a wrong UID.
	stale := created.DeepCopy()
	stale.Labels["team"] = "c"
	if _, err := c.Services("default").Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("update from a stale version: %v, want Conflict", err)
	}
	patched.Spec.Ports[0].Name = "web"
	updated, err := c.Services("default").Update(ctx, patched, metav1.UpdateOptions{FieldManager: "test"})
	if err != nil || updated.Spec.Ports[0].Name != "web" || updated.ResourceVersion == patched.ResourceVersion {
		t.Fatalf("update: %v, %v", updated, err)
	}
	status, err := c.Services("default").Patch(ctx, "web", types.MergePatchType,
		[]byte(`{"status":{"conditions":[{"type":"Tested","status":"True","reason":"Test","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`),
		metav1.PatchOptions{}, "status")
	if err != nil || len(status.Status.Conditions) != 1 {
		t.Fatalf("patch the status subresource: %v, %v", status, err)
	}
	wrongUID := types.UID("not-" + string(created.UID))
	if err := c.Services("default").Delete(ctx, "web", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &wrongUID}}); !apierrors.IsConflict(err) {
		t.Fatalf("delete with another UID as a precondition: %v, want Conflict", err)
	}
	if err := c.Services("default").Delete(ctx, "web", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &created.UID}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Services("default").Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: %v, want NotFound", err)
	}
	await(t, "the informer dropping the deleted Service", func() bool {
		_, err := lister.Services("default").Get("web")
		return apierrors.IsNotFound(err)
	})

	// The other built-in resources.
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default"}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}}
	if _, err := c.EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	list, err := c.EndpointSlices("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=web-1"})
	if err != nil || len(list.Items) != 1 || list.Items[0].Endpoints[0].Addresses[0] != "10.0.0.1" {
		t.Fatalf("list EndpointSlices: %v, %v", list, err)
	}
	if _, err := c.Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leases("default").Get(ctx, "none", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get a missing Lease: %v, want NotFound", err)
	}
	if _, err := c.ServiceCIDRs().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	// A watch sees a change, and ends when it asked to.
	w, err := c.EndpointSlices("default").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, TimeoutSeconds: ptr(int64(2))})
	if err != nil {
		t.Fatal(err)
	}
	watched := es.DeepCopy()
	watched.Name = "watched"
	if _, err := c.EndpointSlices("default").Create(ctx, watched, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	opened, sawAdded, tooLong := time.Now(), false, time.After(30*time.Second)
	for open := true; open; {
		select {
		case ev, ok := <-w.ResultChan(): // closed when the watch ends
			o, _ := ev.Object.(*discoveryv1.EndpointSlice)
			switch {
			case !ok:
				open = false
			case ev.Type == watch.Error:
				t.Fatalf("watch error: %v", ev.Object)
			case ev.Type == watch.Added && o != nil && o.Name == "watched":
				sawAdded = true
			}
		case <-tooLong:
			t.Fatal("a watch of 2 s still open after 30 s")
		}
	}
	if !sawAdded || time.Since(opened) < time.Second {
		t.Fatalf("the watch saw the created EndpointSlice: %v; it ended after %v, want about 2 s", sawAdded, time.Since(opened))
	}

	// Built-in objects travel as protobuf, as client-go's typed clients send them.
	seen.mu.Lock()
	sent, accept := seen.sent["POST /api/v1/namespaces/default/services"], seen.accept["GET /api/v1/namespaces/default/services/web"]
	seen.mu.Unlock()
	if sent != "application/vnd.kubernetes.protobuf" || !strings.HasPrefix(accept, "application/vnd.kubernetes.protobuf") {
		t.Errorf("a Service was created as %q and read accepting %q, want protobuf", sent, accept)
	}

	// Discovery: a CRD's group is not served until the CRD is installed.
	gv := schema.GroupVersion{Group: "multicluster.x-k8s.io", Version: "v1beta1"}
	if names, err := c.Resources(ctx, gv); err != nil || len(names) != 0 {
		t.Fatalf("resources of %s before its CRDs: %v, %v; want none", gv, names, err)
	}
	cluster.Apply(t, "../../deploy/crds/serviceimports.yaml")
	names, err := c.Resources(ctx, gv)
	if err != nil || !slices.Contains(names, "serviceimports") || !slices.Contains(names, "serviceimports/status") {
		t.Fatalf("resources of %s: %v, %v; want serviceimports and its status", gv, names, err)
	}
	if names, err := c.Resources(ctx, corev1.SchemeGroupVersion); err != nil || !slices.Contains(names, "services") {
		t.Fatalf("resources of the core group: %v, %v", names, err)
	}

	// The dynamic client and its informer.
	gvr := gv.WithResource("serviceimports")
	si := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gv.String(), "kind": "ServiceImport",
		"metadata": map[string]any{"name": "web", "namespace": "default"},
		"spec":     map[string]any{"type": "ClusterSetIP", "ports": []any{map[string]any{"port": int64(80), "protocol": "TCP"}}},
	}}
	dinf := kubeclient.NewInformer(c.Dynamic().Resource(gvr), &unstructured.Unstructured{}, nil)
	start(t, dinf)
	if _, err := c.Dynamic().Resource(gvr).Namespace("default").Create(ctx, si, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	generic := cache.NewGenericLister(dinf.GetIndexer(), gvr.GroupResource())
	await(t, "the dynamic informer holding the ServiceImport", func() bool {
		_, err := generic.ByNamespace("default").Get("web")
		return err == nil
	})

	t.Run("RateLimiters", func(t *testing.T) { testRateLimiters(t, cluster.Config, gvr) })
}

// testRateLimiters: the typed clients share one rate limiter, as a
// clientset's do, and the dynamic client has its own, as one made from the
// same config would: a typed request that spent the typed clients' only
// token holds no dynamic request back.
func testRateLimiters(t *testing.T, rc *rest.Config, gvr schema.GroupVersionResource) {
	cfg := rest.CopyConfig(rc)
	cfg.QPS, cfg.Burst = 0.001, 1
	c, err := kubeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := c.Services("default").Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the first request: %v, want NotFound from the API server", err)
	}
	if _, err := c.Dynamic().Resource(gvr).Namespace("default").Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a dynamic request after it: %v, want NotFound from the API server", err)
	}
	short, cancelShort := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancelShort()
	if _, err := c.Nodes().Get(short, "missing", metav1.GetOptions{}); err == nil || apierrors.IsNotFound(err) {
		t.Fatalf("a second typed request: %v, want it held back by the rate limiter", err)
	}
}

// start runs inf until the test ends, and waits for it to stop.
func start(t *testing.T, inf cache.SharedIndexInformer) kubeclient.Informers {
	informers := kubeclient.Informers{inf}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := informers.Start(ctx)
	t.Cleanup(func() { cancel(); stopped() })
	return informers
}

func TestNewRefusesAQPSWithoutBurst(t *testing.T) {
	if _, err := kubeclient.New(&rest.Config{Host: "https://127.0.0.1:1", QPS: 5}); err == nil {
		t.Fatal("a QPS without a burst was accepted")
	}
}

func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func ptr[T any](v T) *T { return &v }
