package spoke

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/kubetraffic"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// Traffic policy: the spoke watches the routes and policies that attach to
// Services (Gateway API GRPCRoutes and HTTPRoutes, Nave's TrafficPolicies)
// once their CRDs are installed, and carries each exported Service's in its
// shard (see kubetraffic for what is read, and how).

// trafficKind is one kind of object the spoke reads traffic policy from.
type trafficKind int

const (
	kindGRPCRoute trafficKind = iota
	kindHTTPRoute
	kindTrafficPolicy
	trafficKinds
)

// trafficResources are the resources of each kind, by the versions served.
var trafficResources = [trafficKinds]schema.GroupVersionResource{
	kindGRPCRoute:     schema.GroupVersion(gwv1.GroupVersion).WithResource("grpcroutes"),
	kindHTTPRoute:     schema.GroupVersion(gwv1.GroupVersion).WithResource("httproutes"),
	kindTrafficPolicy: kubetraffic.TrafficPolicyResource,
}

func (t trafficKind) String() string {
	return [trafficKinds]string{"GRPCRoute", "HTTPRoute", "TrafficPolicy"}[t]
}

// byParentIndex indexes routes by the Services they name as parents, and
// policies by the Services they target ("namespace/name").
const byParentIndex = "byParent"

// trafficWatch is one kind's informer cache.
type trafficWatch struct {
	kind    trafficKind
	indexer cache.Indexer
}

// parentsOf lists the Services an object of kind names: a route's
// parentRefs of kind Service, a policy's targetRefs.
func parentsOf(kind trafficKind, u *unstructured.Unstructured) []registry.ServiceKey {
	field := "parentRefs"
	if kind == kindTrafficPolicy {
		field = "targetRefs"
	}
	refs, _, _ := unstructured.NestedSlice(u.Object, "spec", field)
	var out []registry.ServiceKey
	for _, r := range refs {
		ref, ok := r.(map[string]any)
		if !ok {
			continue
		}
		group, _ := ref["group"].(string)
		kindName, _ := ref["kind"].(string)
		name, _ := ref["name"].(string)
		ns, _ := ref["namespace"].(string)
		if group != "" || kindName != "Service" || name == "" || ns != "" && ns != u.GetNamespace() {
			continue
		}
		out = append(out, registry.ServiceKey{Namespace: u.GetNamespace(), Name: name})
	}
	return out
}

// trafficInstalled asks discovery which traffic kinds the API server serves.
func (k *KubeSource) trafficInstalled() ([trafficKinds]bool, error) {
	var out [trafficKinds]bool
	for kind, gvr := range trafficResources {
		ctx, cancel := context.WithTimeout(context.Background(), kubeclient.RequestTimeout)
		served, err := k.client.Resources(ctx, gvr.GroupVersion())
		cancel()
		if err != nil {
			return out, err
		}
		out[kind] = slices.Contains(served, gvr.Resource)
	}
	return out, nil
}

// watchTraffic starts the informers of the installed kinds and waits for
// them to sync; the others are looked for every ExportsRecheck, and watched
// once installed.
func (k *KubeSource) watchTraffic(ctx context.Context, installed [trafficKinds]bool, wg *sync.WaitGroup) error {
	missing := false
	for kind := range trafficKinds {
		if !installed[kind] {
			missing = true
			continue
		}
		switch err := k.watchTrafficKind(ctx, kind, wg); {
		case errors.Is(err, errForbidden):
			missing = true // looked for again, as if not installed
		case err != nil:
			return err
		}
	}
	if missing {
		wg.Go(func() { k.awaitTraffic(ctx, wg) })
	}
	return nil
}

// awaitTraffic looks for the traffic CRDs not yet watched until each is installed.
func (k *KubeSource) awaitTraffic(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTicker(k.ExportsRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		installed, err := k.trafficInstalled()
		if err != nil {
			k.log.Warn("cannot tell whether the Gateway API and TrafficPolicy CRDs are installed", "err", err)
			continue
		}
		waiting := false
		for kind := range trafficKinds {
			switch {
			case k.traffic[kind].Load() != nil:
			case installed[kind]:
				k.log.Info("CRD installed; watching it", "kind", kind.String())
				switch err := k.watchTrafficKind(ctx, kind, wg); {
				case errors.Is(err, errForbidden):
					waiting = true
					continue
				case err != nil:
					k.log.Error("cannot watch", "kind", kind.String(), "err", err)
					return
				}
				k.enqueueAll()
			default:
				waiting = true
			}
		}
		if !waiting {
			return
		}
	}
}

// errForbidden: the spoke may not list a traffic kind (its RBAC predates
// traffic policy, or leaves it out on purpose).
var errForbidden = errors.New("forbidden")

// watchTrafficKind starts one kind's informer and waits for it to sync. A
// kind the spoke may not list is not waited for (errForbidden): Services
// federate without its objects, and it is looked for again later.
func (k *KubeSource) watchTrafficKind(ctx context.Context, kind trafficKind, wg *sync.WaitGroup) error {
	inf := kubeclient.NewInformer(k.client.Dynamic().Resource(trafficResources[kind]), &unstructured.Unstructured{}, nil)
	if err := inf.SetTransform(strip); err != nil {
		return fmt.Errorf("strip %ss: %w", kind, err)
	}
	forbidden := make(chan struct{})
	var once sync.Once
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) {
			once.Do(func() { close(forbidden) })
			return
		}
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		return fmt.Errorf("watch %ss: %w", kind, err)
	}
	if err := inf.AddIndexers(cache.Indexers{byParentIndex: func(obj any) ([]string, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return nil, nil
		}
		var keys []string
		for _, p := range parentsOf(kind, u) {
			keys = append(keys, p.String())
		}
		return keys, nil
	}}); err != nil {
		return fmt.Errorf("index %ss: %w", kind, err)
	}
	// A change rebuilds the Services the object names, before and after it.
	changed := func(obj any) {
		u, ok := kubeclient.Tombstone(obj).(*unstructured.Unstructured)
		if !ok {
			return
		}
		for _, key := range parentsOf(kind, u) {
			k.queue.Add(key)
			// The others naming the Service too: which policy wins may have changed.
			k.queueTrafficStatusOf(key.String())
		}
		k.queueTrafficStatus(trafficObject{kind: kind, namespace: u.GetNamespace(), name: u.GetName()})
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed, DeleteFunc: changed, UpdateFunc: func(old, cur any) { changed(old); changed(cur) },
	}); err != nil {
		return fmt.Errorf("watch %ss: %w", kind, err)
	}
	infCtx, stop := context.WithCancel(ctx)
	wg.Go(func() { inf.RunWithContext(infCtx) })
	synced := make(chan struct{})
	go func() {
		defer close(synced)
		cache.WaitForCacheSync(infCtx.Done(), inf.HasSynced)
	}()
	select {
	case <-synced:
		if ctx.Err() != nil {
			stop()
			return ctx.Err()
		}
	case <-forbidden:
		stop()
		<-synced
		k.log.Warn("may not list them (RBAC): Services federate without them; looking again later", "kind", kind.String(),
			"resource", trafficResources[kind].String())
		return errForbidden
	}
	context.AfterFunc(ctx, stop) // the informer runs until ctx ends
	k.traffic[kind].Store(&trafficWatch{kind: kind, indexer: inf.GetIndexer()})
	k.queueAllTrafficStatus() // what the add events queued before the cache was stored found none
	return nil
}

// parentLookup is kubetraffic's view of the cluster's Services.
func (k *KubeSource) parentLookup(namespace, name string) (kubetraffic.Parent, bool) {
	svc, err := k.services.Services(namespace).Get(name)
	if err != nil {
		return kubetraffic.Parent{}, false
	}
	return kubetraffic.Parent{Service: svc, Exported: k.isExported(svc)}, true
}

// isExported reports whether the spoke exports svc: by label or ServiceExport,
// neither imported nor ExternalName (see build).
func (k *KubeSource) isExported(svc *corev1.Service) bool {
	if !k.filter.allows(svc.Namespace) || imported(svc) || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return false
	}
	return k.opts.ExportAll || svc.Labels[ExportLabel] == "true" ||
		k.export(registry.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}) != nil
}

// objectsNaming lists the objects of kind that name Service key.
func (k *KubeSource) objectsNaming(kind trafficKind, key registry.ServiceKey) []*unstructured.Unstructured {
	w := k.traffic[kind].Load()
	if w == nil {
		return nil
	}
	items, _ := w.indexer.ByIndex(byParentIndex, key.String())
	out := make([]*unstructured.Unstructured, 0, len(items))
	for _, o := range items {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	// Oldest first, then by name: the Gateway API's order for routes, and
	// GEP-713's for policies (the oldest of two conflicting wins).
	slices.SortFunc(out, func(a, b *unstructured.Unstructured) int {
		return cmp.Or(a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time), cmp.Compare(a.GetName(), b.GetName()))
	})
	return out
}

// attachments converts a route object into its attachments.
func (k *KubeSource) attachments(kind trafficKind, u *unstructured.Unstructured) ([]kubetraffic.Attachment, error) {
	switch kind {
	case kindGRPCRoute:
		var r gwv1.GRPCRoute
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
			return nil, err
		}
		return kubetraffic.FromGRPCRoute(&r, k.parentLookup), nil
	case kindHTTPRoute:
		var r gwv1.HTTPRoute
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
			return nil, err
		}
		return kubetraffic.FromHTTPRoute(&r, k.parentLookup), nil
	}
	return nil, fmt.Errorf("%s is not a route", kind)
}

// trafficOf is what Service key's shard carries: the routes accepted for
// it and the policy that wins for it. A set that does not pass validation
// as a whole (too many routes, too large) is left out, and said why: the
// Service itself still federates.
func (k *KubeSource) trafficOf(key registry.ServiceKey) (traffic.Set, string) {
	var set traffic.Set
	for _, kind := range []trafficKind{kindGRPCRoute, kindHTTPRoute} {
		for _, u := range k.objectsNaming(kind, key) {
			as, err := k.attachments(kind, u)
			if err != nil {
				k.log.Warn("cannot read route", "kind", kind.String(), "route", u.GetNamespace()+"/"+u.GetName(), "err", err)
				continue
			}
			for _, a := range as {
				if a.Service != key || a.Route == nil {
					continue
				}
				if _, dup := set.Route(a.Route.Kind, a.Route.Name); dup {
					continue // a second parentRef to the same Service: its first port is the one carried
				}
				set.Routes = append(set.Routes, *a.Route)
			}
		}
	}
	if p, ok := k.policyOf(key); ok {
		set.Policy = p
	}
	set.Normalize()
	if err := set.Validate(); err != nil {
		return traffic.Set{}, err.Error()
	}
	return set, ""
}

// policyOf is the TrafficPolicy that wins for Service key: the oldest valid
// one targeting it (see kubetraffic.Resolve).
func (k *KubeSource) policyOf(key registry.ServiceKey) (*traffic.Policy, bool) {
	objs := k.objectsNaming(kindTrafficPolicy, key)
	if len(objs) == 0 {
		return nil, false
	}
	results := kubetraffic.ResolvePolicies(key, objs)
	for _, r := range results {
		if r.Winner {
			return r.Policy, true
		}
	}
	return nil, false
}
