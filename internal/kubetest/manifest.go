package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// FieldManager is the server-side apply field manager of Apply and DryRun.
const FieldManager = "nave-e2e"

// establishTimeout bounds the wait for an applied CRD to be served.
const establishTimeout = 30 * time.Second

// Object is one Kubernetes object of a manifest file.
type Object struct {
	// Source says where the object came from: "path:N", N counting the file's YAML documents from 1.
	Source string
	*unstructured.Unstructured
}

// ReadManifests decodes every object of the given multi-document YAML files,
// in order, skipping empty documents. A document without a kind fails the test.
func ReadManifests(t testing.TB, files ...string) []Object {
	t.Helper()
	var objs []Object
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for doc := 1; ; doc++ {
			y, err := r.Read()
			if err == io.EOF {
				break
			}
			source := fmt.Sprintf("%s:%d", file, doc)
			if err != nil {
				t.Fatalf("%s: %v", source, err)
			}
			j, err := yaml.YAMLToJSON(y)
			if err != nil {
				t.Fatalf("%s: %v", source, err)
			}
			if j = bytes.TrimSpace(j); bytes.Equal(j, []byte("null")) || len(j) == 0 {
				continue // only comments or nothing
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(j); err != nil {
				t.Fatalf("%s: %v", source, err)
			}
			objs = append(objs, Object{Source: source, Unstructured: u})
		}
	}
	return objs
}

// Apply creates or updates every object of the given manifest files, in
// order, by server-side apply as FieldManager (taking over conflicting
// fields). Namespaced objects without a namespace go to "default". An applied
// CustomResourceDefinition is waited for until it is Established and its
// kinds are known to the cluster's REST mapper, so later objects may use it.
func (c *Cluster) Apply(t testing.TB, files ...string) {
	t.Helper()
	c.ApplyObjects(t, ReadManifests(t, files...)...)
}

// ApplyObjects is Apply for objects already read.
func (c *Cluster) ApplyObjects(t testing.TB, objs ...Object) {
	t.Helper()
	for _, o := range objs {
		if _, err := c.apply(t.Context(), o, false); err != nil {
			t.Fatalf("%s: apply %s: %v", o.Source, describe(o), err)
		}
		if o.GroupVersionKind().GroupKind() == crdKind {
			if err := c.awaitEstablished(t.Context(), o.GetName()); err != nil {
				t.Fatalf("%s: %v", o.Source, err)
			}
		}
	}
}

// DryRun server-side applies every object with DryRun=All, so the API server
// validates each (schema, defaults, admission, RBAC objects, custom resources
// against their CRD) and stores nothing. It returns, joined and prefixed by
// the object's source, every rejection and every warning: warnings name
// objects that would fail later (a pod template that its namespace's Pod
// Security level forbids) or soon (a deprecated API). Nil when all pass.
func (c *Cluster) DryRun(ctx context.Context, objs ...Object) error {
	var errs []error
	for _, o := range objs {
		w := &warnings{}
		_, err := c.apply(context.WithValue(ctx, warningsKey{}, w), o, true)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", o.Source, describe(o), err))
		}
		for _, msg := range w.list() {
			errs = append(errs, fmt.Errorf("%s: %s: warning: %s", o.Source, describe(o), msg))
		}
	}
	return errors.Join(errs...)
}

// apply server-side applies one object.
func (c *Cluster) apply(ctx context.Context, o Object, dryRun bool) (*unstructured.Unstructured, error) {
	gvk := o.GroupVersionKind()
	m, err := c.mapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	obj := o.DeepCopy()
	var r dynamic.ResourceInterface = c.Dynamic.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace("default")
		}
		r = c.Dynamic.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	opts := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return r.Apply(ctx, obj.GetName(), obj, opts)
}

// mapping finds the resource of a kind, refreshing discovery once when the
// kind is unknown (a CRD may have been applied by someone else since).
func (c *Cluster) mapping(gk schema.GroupKind, version string) (*meta.RESTMapping, error) {
	m, err := c.mapper.RESTMapping(gk, version)
	if meta.IsNoMatchError(err) {
		c.mapper.Reset()
		m, err = c.mapper.RESTMapping(gk, version)
	}
	return m, err
}

var (
	crdKind     = schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}
	crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// awaitEstablished waits until a CRD is Established and discovery serves its kind.
func (c *Cluster) awaitEstablished(ctx context.Context, name string) error {
	var state string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, establishTimeout, true, func(ctx context.Context) (bool, error) {
		crd, err := c.Dynamic.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			state = err.Error()
			return false, nil
		}
		if !established(crd) {
			state = "not Established"
			return false, nil
		}
		group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
		c.mapper.Reset()
		if _, err := c.mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind}); err != nil {
			state = err.Error()
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s: %s: %w", name, state, err)
	}
	return nil
}

// established reports whether a CRD's Established condition is True.
func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// describe names an object for messages: Kind namespace/name.
func describe(o Object) string {
	if ns := o.GetNamespace(); ns != "" {
		return fmt.Sprintf("%s %s/%s", o.GetKind(), ns, o.GetName())
	}
	return fmt.Sprintf("%s %s", o.GetKind(), o.GetName())
}

// warnings collects the API server's warnings about the requests whose
// context carries it (under warningsKey).
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

type warningsKey struct{}

func (w *warnings) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}

// warningRouter hands warnings to the collector in the request's context,
// and logs them as client-go does by default when there is none.
type warningRouter struct{}

func (warningRouter) HandleWarningHeaderWithContext(ctx context.Context, code int, agent, msg string) {
	w, ok := ctx.Value(warningsKey{}).(*warnings)
	if !ok || code != 299 || msg == "" {
		rest.WarningLogger{}.HandleWarningHeaderWithContext(ctx, code, agent, msg)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}
