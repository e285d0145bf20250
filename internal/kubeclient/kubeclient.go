// Package kubeclient is the spoke's Kubernetes client: typed clients of the
// few built-in resources it reads and writes (Services, Nodes, Namespaces,
// EndpointSlices, Leases and ServiceCIDRs), a dynamic client for the MCS CRDs, and
// informers over either. It stands in for client-go's typed clientset, whose
// scheme registers every built-in API group at start: about 8 MiB of every
// spoke pod's memory for some fifty groups it never uses. Requests are
// what a clientset and a dynamic client made from the same config would
// send: the same content types (protobuf for built-in types), one HTTP
// client, one rate limiter for the typed clients and one for the dynamic one.
package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
)

// The scheme of the four built-in groups the spoke uses, and what encodes
// and decodes them (and the options of their requests).
var (
	scheme         = newScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"}) // Status, and the options of every request
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, coordinationv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(fmt.Sprintf("kubeclient: scheme: %v", err)) // a programming error: the groups are fixed
		}
	}
	return s
}

// RequestTimeout bounds one request of the spoke's that is not a list or a
// watch: a read, a write, a discovery.
const RequestTimeout = 30 * time.Second

// Client reaches one cluster's API server.
type Client struct {
	core, discovery, coordination, networking *rest.RESTClient
	dynamic                                   *dynamic.DynamicClient
}

// New returns a client of the API server cfg describes. Its typed clients
// share one rate limiter (cfg.QPS and cfg.Burst, unless cfg.RateLimiter is
// set), as a clientset's do; the dynamic client has one of its own, as a
// dynamic client made from cfg would. All share one HTTP client.
func New(cfg *rest.Config) (*Client, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	dc := c // before the typed clients' limiter is set: the dynamic client makes its own
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("kubeclient: burst must be above 0 with a QPS of %v", c.QPS)
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("kubeclient: %w", err)
	}
	group := func(gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
		gc := c
		gc.GroupVersion, gc.APIPath = &gv, apiPath
		gc.NegotiatedSerializer = codecs.WithoutConversion()
		rc, err := rest.RESTClientForConfigAndClient(&gc, httpClient)
		if err != nil {
			return nil, fmt.Errorf("kubeclient: %s: %w", gv, err)
		}
		return rc, nil
	}
	var out Client
	if out.core, err = group(corev1.SchemeGroupVersion, "/api"); err != nil {
		return nil, err
	}
	if out.discovery, err = group(discoveryv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if out.coordination, err = group(coordinationv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if out.networking, err = group(networkingv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if out.dynamic, err = dynamic.NewForConfigAndClient(&dc, httpClient); err != nil {
		return nil, fmt.Errorf("kubeclient: dynamic: %w", err)
	}
	return &out, nil
}

// Typed is the client of one built-in resource: the methods of client-go's
// typed clients the spoke uses, with their signatures, sending the same
// requests (protobuf preferred).
// It is not client-go's gentype: that package also holds the fake clients
// of client-go's tests, whose imports (server-side apply's field managers,
// OpenAPI models, YAML and JSON libraries) would ride in every binary with
// their init work.
type Typed[T Object, L runtime.Object] struct {
	rc        *rest.RESTClient
	resource  string
	namespace string // "": every namespace, or a cluster-scoped resource
	newObject func() T
	newList   func() L
}

// Object is a Kubernetes object of a built-in type.
type Object interface {
	runtime.Object
	metav1.Object
}

// typed returns resource's client in namespace ("": every namespace, or a
// cluster-scoped resource).
func typed[T Object, L runtime.Object](rc *rest.RESTClient, resource, namespace string, newObject func() T, newList func() L) *Typed[T, L] {
	return &Typed[T, L]{rc: rc, resource: resource, namespace: namespace, newObject: newObject, newList: newList}
}

// on starts a request of the resource, with its namespace if it has one.
func (c *Typed[T, L]) on(r *rest.Request) *rest.Request {
	return r.UseProtobufAsDefault().NamespaceIfScoped(c.namespace, c.namespace != "").Resource(c.resource)
}

// into runs r and decodes its answer into a new object.
func (c *Typed[T, L]) into(ctx context.Context, r *rest.Request) (T, error) {
	out := c.newObject()
	return out, r.Do(ctx).Into(out)
}

// listTimeout is the timeout a list or watch asks the API server for, as the request's too.
func listTimeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// Get reads the object called name.
func (c *Typed[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	return c.into(ctx, c.on(c.rc.Get()).Name(name).VersionedParams(&opts, parameterCodec))
}

// List reads the objects opts selects.
func (c *Typed[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := c.newList()
	err := c.on(c.rc.Get()).VersionedParams(&opts, parameterCodec).Timeout(listTimeout(opts)).Do(ctx).Into(out)
	return out, err
}

// Watch watches the objects opts selects.
func (c *Typed[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.on(c.rc.Get()).VersionedParams(&opts, parameterCodec).Timeout(listTimeout(opts)).Watch(ctx)
}

// Create creates obj.
func (c *Typed[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	return c.into(ctx, c.on(c.rc.Post()).VersionedParams(&opts, parameterCodec).Body(obj))
}

// Update replaces obj (guarded by its resourceVersion, if it has one).
func (c *Typed[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	return c.into(ctx, c.on(c.rc.Put()).Name(obj.GetName()).VersionedParams(&opts, parameterCodec).Body(obj))
}

// Patch patches the object called name (or its subresources).
func (c *Typed[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	return c.into(ctx, c.on(c.rc.Patch(pt)).Name(name).SubResource(subresources...).VersionedParams(&opts, parameterCodec).Body(data))
}

// Delete deletes the object called name.
func (c *Typed[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.on(c.rc.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}

// Services returns the client of namespace's Services ("": every namespace).
func (c *Client) Services(namespace string) *Typed[*corev1.Service, *corev1.ServiceList] {
	return typed(c.core, "services", namespace, func() *corev1.Service { return &corev1.Service{} },
		func() *corev1.ServiceList { return &corev1.ServiceList{} })
}

// Nodes returns the client of Nodes.
func (c *Client) Nodes() *Typed[*corev1.Node, *corev1.NodeList] {
	return typed(c.core, "nodes", "", func() *corev1.Node { return &corev1.Node{} },
		func() *corev1.NodeList { return &corev1.NodeList{} })
}

// Namespaces returns the client of Namespaces.
func (c *Client) Namespaces() *Typed[*corev1.Namespace, *corev1.NamespaceList] {
	return typed(c.core, "namespaces", "", func() *corev1.Namespace { return &corev1.Namespace{} },
		func() *corev1.NamespaceList { return &corev1.NamespaceList{} })
}

// EndpointSlices returns the client of namespace's EndpointSlices ("": every namespace).
func (c *Client) EndpointSlices(namespace string) *Typed[*discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList] {
	return typed(c.discovery, "endpointslices", namespace, func() *discoveryv1.EndpointSlice { return &discoveryv1.EndpointSlice{} },
		func() *discoveryv1.EndpointSliceList { return &discoveryv1.EndpointSliceList{} })
}

// Leases returns the client of namespace's Leases.
func (c *Client) Leases(namespace string) *Typed[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return typed(c.coordination, "leases", namespace, func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
}

// ServiceCIDRs returns the client of ServiceCIDRs.
func (c *Client) ServiceCIDRs() *Typed[*networkingv1.ServiceCIDR, *networkingv1.ServiceCIDRList] {
	return typed(c.networking, "servicecidrs", "", func() *networkingv1.ServiceCIDR { return &networkingv1.ServiceCIDR{} },
		func() *networkingv1.ServiceCIDRList { return &networkingv1.ServiceCIDRList{} })
}

// Dynamic returns the client of resources the scheme does not hold (CRDs).
func (c *Client) Dynamic() dynamic.Interface { return c.dynamic }

// Resources returns the names of the resources (and subresources, as
// "serviceimports/status") the API server serves in gv: none when it does
// not serve gv (a CRD's version is served once the CRD is established).
// An error means it could not tell.
func (c *Client) Resources(ctx context.Context, gv schema.GroupVersion) ([]string, error) {
	path := "/apis/" + gv.String()
	if gv.Group == "" {
		path = "/api/" + gv.Version
	}
	body, err := c.core.Get().AbsPath(path).SetHeader("Accept", "application/json").Do(ctx).Raw()
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discover %s: %w", gv, err)
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("discover %s: %w", gv, err)
	}
	names := make([]string, len(list.APIResources))
	for i, r := range list.APIResources {
		names[i] = r.Name
	}
	return names, nil
}

// ListWatcher lists and watches one resource: a typed client, or a dynamic one.
type ListWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// NewInformer returns an informer of what lw lists, whose cache holds
// objects like example. tweak, if not nil, changes every list and watch (a
// label selector). The cache has no index: a lister's Get reads it by key,
// and listing one namespace (which the spoke never does) scans it, and
// client-go logs a warning; an index costs a set entry per object, and a
// set per value.
func NewInformer[L runtime.Object](lw ListWatcher[L], example runtime.Object, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	opts := func(o metav1.ListOptions) metav1.ListOptions {
		if tweak != nil {
			tweak(&o)
		}
		return o
	}
	return cache.NewSharedIndexInformerWithOptions(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return lw.List(ctx, opts(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return lw.Watch(ctx, opts(o))
		},
	}, example, cache.SharedIndexInformerOptions{Indexers: cache.Indexers{}}) // not nil: AddIndexers writes to it
}

// Informers start, sync and stop together, as an informer factory's do.
type Informers []cache.SharedIndexInformer

// SetTransform makes f every informer's transform; before Start.
func (is Informers) SetTransform(f cache.TransformFunc) error {
	for _, inf := range is {
		if err := inf.SetTransform(f); err != nil {
			return err
		}
	}
	return nil
}

// Start runs every informer until ctx ends; wait returns once all have stopped.
func (is Informers) Start(ctx context.Context) (wait func()) {
	var running sync.WaitGroup
	for _, inf := range is {
		running.Go(func() { inf.RunWithContext(ctx) })
	}
	return running.Wait
}

// WaitForSync waits until every informer has synced (true), or done is closed (false).
func (is Informers) WaitForSync(done <-chan struct{}) bool {
	synced := make([]cache.InformerSynced, len(is))
	for i, inf := range is {
		synced[i] = inf.HasSynced
	}
	return cache.WaitForCacheSync(done, synced...)
}

// Tombstone unwraps the final state of an object whose deletion an informer missed.
func Tombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}
