package spoke

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/importwriter"
	"github.com/navemesh/nave/internal/backoff"
	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/registry"
)

// ServiceExportResource is the Kubernetes Multi-Cluster Services API's
// ServiceExport, at its storage version: one in a Service's namespace with
// the Service's name exports it.
var ServiceExportResource = mcsv1beta1.SchemeGroupVersion.WithResource(mcsv1beta1.ServiceExportPluralName)

// serviceExportVersions are the ServiceExport versions a spoke reads and
// writes, preferred first: it uses the first the cluster serves.
var serviceExportVersions = []schema.GroupVersionResource{
	ServiceExportResource,
	mcsv1alpha1.SchemeGroupVersion.WithResource(mcsv1alpha1.ServiceExportPluralName),
}

// DefaultExportsRecheck is how often a spoke started without the
// ServiceExport CRD looks for it again, so that installing it later needs
// no restart.
const DefaultExportsRecheck = 30 * time.Second

// NamespaceFilter selects the namespaces whose services may federate.
type NamespaceFilter struct {
	// Include, when not empty, names the only namespaces that federate.
	Include []string
	// Exclude names namespaces that never federate.
	Exclude []string
}

// DefaultExcludedNamespaces are Kubernetes' own namespaces.
var DefaultExcludedNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

func (f NamespaceFilter) allows(ns string) bool {
	return (len(f.Include) == 0 || slices.Contains(f.Include, ns)) && !slices.Contains(f.Exclude, ns)
}

// KubeSource watches a Kubernetes API server through shared informers on
// Services, EndpointSlices, Nodes and (when its CRD is installed)
// ServiceExports, and builds the cluster's state from them. A Service
// federates when a ServiceExport of the same name exists in its namespace,
// when it is labelled nave.io/export=true, or, with ExportAll, always.
//
// Informer callbacks only put the affected service's key on a rate-limited
// queue; one goroutine rebuilds each queued service from the caches and
// publishes the state once the queue is drained. Nothing is published before
// every cache has synced, so the first state is complete. The informers keep
// only the fields Nave reads (see strip), and the API server leaves out the
// Services and EndpointSlices the import writer made (notImportedSelector),
// so a large cluster does not cost the spoke its memory.
//
// While it leads (see WriteStatus), the source also writes the Valid and
// Conflict conditions of every ServiceExport.
type KubeSource struct {
	// ExportsRecheck is how often to look for the ServiceExport CRD while it
	// is not installed (DefaultExportsRecheck unless changed before Run).
	ExportsRecheck time.Duration
	// Origins, if not nil, is told when the informers delivered each
	// Service and EndpointSlice change, and its resourceVersion (set before Run).
	Origins *federation.Origins

	client *kubeclient.Client
	opts   BuildOptions
	filter NamespaceFilter
	log    *slog.Logger

	services   corelisters.ServiceLister
	slicesIdx  cache.Indexer
	nodes      corelisters.NodeLister
	namespaces corelisters.NamespaceLister
	// onNamespaces is told the cluster's namespaces (OnNamespaces); guarded by nsMu.
	nsMu         sync.Mutex
	onNamespaces func([]string)
	// The network gateways its Services offer (OnGateways).
	gateways  gatewayServices
	exports   atomic.Pointer[exportWatch] // nil until the ServiceExport informer has synced
	synced    chan struct{}               // closed once the first state is published
	nodesLive atomic.Bool                 // node events matter: the initial build is done
	queue     workqueue.TypedRateLimitingInterface[registry.ServiceKey]

	// status is what the ServiceExport conditions are made of; guarded by statusMu.
	statusMu     sync.Mutex
	problems     map[registry.ServiceKey]string // services the spoke cannot build, and why
	reports      federation.Reports             // what the hub said about this cluster's services
	reportsKnown bool                           // the current hub session has reported
	// statusQueue holds the ServiceExports whose conditions may be out of
	// date; it is fed only while WriteStatus runs (writing), which starts by
	// queueing every ServiceExport.
	statusQueue workqueue.TypedRateLimitingInterface[registry.ServiceKey]
	writing     atomic.Bool

	// traffic holds each traffic kind's cache once its CRD is watched (traffic.go).
	traffic [trafficKinds]atomic.Pointer[trafficWatch]
	// trafficStatusQueue holds the routes and policies whose status may be
	// out of date (fed only while WriteStatus runs, as statusQueue).
	trafficStatusQueue workqueue.TypedRateLimitingInterface[trafficObject]
}

// exportWatch is the ServiceExport informer's cache, and the version it watches.
type exportWatch struct {
	lister   cache.GenericLister
	resource schema.GroupVersionResource
}

// NewKubeSource returns a source over client. opts.ExportAll exports every
// service (of the namespaces filter allows).
func NewKubeSource(client *kubeclient.Client, opts BuildOptions, filter NamespaceFilter, log *slog.Logger) *KubeSource {
	if log == nil {
		log = slog.Default()
	}
	rl := func() workqueue.TypedRateLimiter[registry.ServiceKey] {
		return workqueue.DefaultTypedControllerRateLimiter[registry.ServiceKey]()
	}
	log = log.With("component", "kubesource")
	return &KubeSource{
		ExportsRecheck: DefaultExportsRecheck,
		client:         client, opts: opts, filter: filter,
		synced:      make(chan struct{}),
		log:         log,
		gateways:    gatewayServices{log: log},
		problems:    map[registry.ServiceKey]string{},
		queue:       workqueue.NewTypedRateLimitingQueueWithConfig(rl(), workqueue.TypedRateLimitingQueueConfig[registry.ServiceKey]{Name: "services"}),
		statusQueue: workqueue.NewTypedRateLimitingQueueWithConfig(rl(), workqueue.TypedRateLimitingQueueConfig[registry.ServiceKey]{Name: "serviceexport-status"}),
		trafficStatusQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[trafficObject](),
			workqueue.TypedRateLimitingQueueConfig[trafficObject]{Name: "traffic-status"}),
	}
}

// Name identifies the source in logs and status.
func (k *KubeSource) Name() string { return "kube" }

// Synced is closed once the caches have synced and the first state is published.
func (k *KubeSource) Synced() <-chan struct{} { return k.synced }

// onNode reports whether an endpoint of es runs on node.
func onNode(es *discoveryv1.EndpointSlice, node string) bool {
	for i := range es.Endpoints {
		if n := es.Endpoints[i].NodeName; n != nil && *n == node {
			return true
		}
	}
	return false
}

// byServiceIndex indexes the EndpointSlice cache by "namespace/service".
const byServiceIndex = "service"

// Run watches the cluster until ctx ends; see KubeSource. It fails only when
// the informers cannot be set up or ctx ends before the caches sync.
func (k *KubeSource) Run(ctx context.Context, out Sink) error {
	defer k.queue.ShutDown()
	defer k.statusQueue.ShutDown()
	defer k.trafficStatusQueue.ShutDown()
	// The Services and EndpointSlices the import writer made never federate
	// (they are other clusters' services, see imported): the API server
	// leaves them out, so that a cluster, which imports its own exports too,
	// does not cache every exported service twice. The import writer's own
	// informers cache them.
	local := func(o *metav1.ListOptions) { o.LabelSelector = notImportedSelector }
	svcInf := kubeclient.NewInformer(k.client.Services(""), &corev1.Service{}, local)
	esInf := kubeclient.NewInformer(k.client.EndpointSlices(""), &discoveryv1.EndpointSlice{}, local)
	nodeInf := kubeclient.NewInformer(k.client.Nodes(), &corev1.Node{}, nil)
	nsInf := kubeclient.NewInformer(k.client.Namespaces(), &corev1.Namespace{}, nil)
	informers := kubeclient.Informers{svcInf, esInf, nodeInf, nsInf}
	if err := informers.SetTransform(strip); err != nil {
		return fmt.Errorf("strip cached objects: %w", err)
	}
	k.services = corelisters.NewServiceLister(svcInf.GetIndexer())
	k.nodes = corelisters.NewNodeLister(nodeInf.GetIndexer())
	k.namespaces = corelisters.NewNamespaceLister(nsInf.GetIndexer())
	k.slicesIdx = esInf.GetIndexer()
	if err := esInf.AddIndexers(cache.Indexers{
		byServiceIndex: func(obj any) ([]string, error) {
			if es, ok := obj.(*cachedSlice); ok {
				if key, ok := es.belongs(); ok {
					return []string{key.String()}, nil
				}
			}
			return nil, nil
		},
	}); err != nil {
		return fmt.Errorf("index endpointslices: %w", err)
	}

	enqueueService := func(obj any) {
		if svc, ok := kubeclient.Tombstone(obj).(*corev1.Service); ok {
			key := registry.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
			if k.nodesLive.Load() { // after the initial list: a change
				k.Origins.Saw(key, svc.ResourceVersion, time.Time{})
			}
			k.enqueue(key)
		}
		if isGatewayService(obj) {
			k.gatewaysChanged()
		}
	}
	enqueueSlice := func(obj any) {
		if es, ok := kubeclient.Tombstone(obj).(*cachedSlice); ok {
			if key, ok := es.belongs(); ok {
				if k.nodesLive.Load() {
					k.Origins.Saw(key, es.ResourceVersion, time.Time{})
				}
				k.queue.Add(key)
			}
		}
	}
	// A node's labels give its endpoints their region (and zone, when the
	// slice has none): a change rebuilds the services with endpoints on it.
	// Before the initial build, which reads every node, events are moot.
	nodeChanged := func(old, cur any) {
		o, ok1 := kubeclient.Tombstone(old).(*corev1.Node)
		c, ok2 := kubeclient.Tombstone(cur).(*corev1.Node)
		if !k.nodesLive.Load() || ok1 && ok2 && maps.Equal(o.Labels, c.Labels) {
			return // the status updates every node sends: nothing Nave reads
		}
		// Label changes are rare (and so are Nodes added and deleted, which
		// come here too): a scan of every slice costs less than an index of
		// slices by node, which holds an entry per node of every slice.
		node := cmp.Or(c, o)
		for _, obj := range k.slicesIdx.List() {
			es, ok := obj.(*cachedSlice)
			if !ok || !onNode(&es.EndpointSlice, node.Name) {
				continue
			}
			if key, ok := es.belongs(); ok {
				k.Origins.Saw(key, node.ResourceVersion, time.Time{}) // the change began with the Node's
				k.queue.Add(key)
			}
		}
	}
	for _, reg := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{svcInf, cache.ResourceEventHandlerFuncs{AddFunc: enqueueService, DeleteFunc: enqueueService,
			UpdateFunc: func(old, cur any) {
				enqueueService(cur)
				if isGatewayService(old) && !isGatewayService(cur) {
					k.gatewaysChanged() // no longer a gateway
				}
			}}},
		{esInf, cache.ResourceEventHandlerFuncs{AddFunc: enqueueSlice, DeleteFunc: enqueueSlice,
			UpdateFunc: func(old, cur any) { enqueueSlice(old); enqueueSlice(cur) }}},
		{nodeInf, cache.ResourceEventHandlerFuncs{AddFunc: func(cur any) { nodeChanged(nil, cur) },
			DeleteFunc: func(old any) { nodeChanged(old, nil) }, UpdateFunc: nodeChanged}},
		// Namespaces only matter by name (which services the cluster imports).
		{nsInf, cache.ResourceEventHandlerFuncs{AddFunc: func(any) { k.namespacesChanged() },
			DeleteFunc: func(any) { k.namespacesChanged() }}},
	} {
		if _, err := reg.inf.AddEventHandler(reg.h); err != nil {
			return fmt.Errorf("watch: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	stopped := informers.Start(ctx)
	defer func() { cancel(); stopped() }() // the informers stop with ctx

	// ServiceExports, when their CRD is installed: now, or later.
	var exportsDone sync.WaitGroup
	defer exportsDone.Wait()
	exportsCtx, stopExports := context.WithCancel(ctx)
	defer stopExports()
	// Not knowing must not pass for "not installed": the first state would
	// leave out every service exported by a ServiceExport.
	gvr, installed, err := k.serviceExportsInstalled()
	for retry := backoff.New(backoff.Config{Min: time.Second, Max: 30 * time.Second}); err != nil; {
		wait := retry.Next()
		k.log.Warn("cannot tell whether the ServiceExport CRD is installed; holding the first state back", "err", err, "retry", wait)
		if !retry.Sleep(ctx, wait) {
			return ctx.Err()
		}
		gvr, installed, err = k.serviceExportsInstalled()
	}
	if installed {
		if err := k.watchServiceExports(exportsCtx, gvr, &exportsDone); err != nil {
			return err
		}
	} else {
		k.log.Info("ServiceExport CRD not installed; services federate by label until it is", "label", ExportLabel+"=true")
		exportsDone.Go(func() { k.awaitServiceExports(exportsCtx, &exportsDone) })
	}

	// Routes and policies, when their CRDs are installed: now, or later.
	// As for ServiceExports, not knowing holds the first state back.
	served, err := k.trafficInstalled()
	for retry := backoff.New(backoff.Config{Min: time.Second, Max: 30 * time.Second}); err != nil; {
		wait := retry.Next()
		k.log.Warn("cannot tell whether the Gateway API and TrafficPolicy CRDs are installed; holding the first state back", "err", err, "retry", wait)
		if !retry.Sleep(ctx, wait) {
			return ctx.Err()
		}
		served, err = k.trafficInstalled()
	}
	if err := k.watchTraffic(exportsCtx, served, &exportsDone); err != nil {
		return err
	}

	k.log.Info("waiting for caches to sync")
	if !informers.WaitForSync(ctx.Done()) {
		return ctx.Err() // caches sync unless ctx ends
	}
	// Everything that exists now is in the caches: build it all before publishing once.
	state := State{}
	k.nodesLive.Store(true)
	k.enqueueAll()
	for k.queue.Len() > 0 {
		key, _ := k.queue.Get()
		k.process(state, key)
	}
	k.log.Info("caches synced; publishing the cluster's state", "services", len(state))
	out.Set(maps.Clone(state))
	close(k.synced)
	k.namespacesChanged()
	k.gatewaysChanged()

	go func() { <-ctx.Done(); k.queue.ShutDown() }()
	// Hand the changes over once the queue is drained, so that a burst of
	// changes is one; under a steady stream of changes, at least every
	// maxPublishDelay. Only the changed services go: the cost of a change
	// does not grow with the cluster.
	var dirtySince time.Time
	changed := map[registry.ServiceKey]struct{}{}
	for {
		key, shutdown := k.queue.Get()
		if shutdown {
			return nil
		}
		if k.process(state, key) {
			changed[key] = struct{}{}
			if dirtySince.IsZero() {
				dirtySince = time.Now()
			}
		}
		if !dirtySince.IsZero() && (k.queue.Len() == 0 || time.Since(dirtySince) > maxPublishDelay) {
			handOver(out, state, changed)
			changed, dirtySince = map[registry.ServiceKey]struct{}{}, time.Time{}
		}
	}
}

// handOver hands the changed services of state to out.
func handOver(out Sink, state State, changed map[registry.ServiceKey]struct{}) {
	set := make(State, len(changed))
	var removed []registry.ServiceKey
	for key := range changed {
		if s, ok := state[key]; ok {
			set[key] = s
		} else {
			removed = append(removed, key)
		}
	}
	out.Apply(set, removed)
}

// maxPublishDelay bounds how long a change waits for the queue to drain.
const maxPublishDelay = 100 * time.Millisecond

// enqueue queues a service and its ServiceExport's status.
func (k *KubeSource) enqueue(key registry.ServiceKey) {
	k.queue.Add(key)
	k.queueStatus(key)
	k.queueTrafficStatusOf(key.String()) // whether the Service is exported may have changed
}

// queueStatus queues a ServiceExport's status, while status is written.
func (k *KubeSource) queueStatus(key registry.ServiceKey) {
	if k.writing.Load() {
		k.statusQueue.Add(key)
	}
}

// enqueueAll queues every service and ServiceExport in the caches.
func (k *KubeSource) enqueueAll() {
	svcs, _ := k.services.List(labelsEverything)
	for _, s := range svcs {
		k.enqueue(registry.ServiceKey{Namespace: s.Namespace, Name: s.Name})
	}
	if l := k.exports.Load(); l != nil {
		exps, _ := l.lister.List(labelsEverything)
		for _, o := range exps {
			if u, ok := o.(*unstructured.Unstructured); ok {
				k.enqueue(registry.ServiceKey{Namespace: u.GetNamespace(), Name: u.GetName()})
			}
		}
	}
}

// process rebuilds one service into state and reports whether state changed.
func (k *KubeSource) process(state State, key registry.ServiceKey) (changed bool) {
	defer k.queue.Done(key)
	defer func() {
		if r := recover(); r != nil {
			k.log.Error("panic while building a service; retrying", "service", key, "panic", r, "stack", string(debug.Stack()))
			k.queue.AddRateLimited(key)
			changed = false
		}
	}()
	shard, exported, problem := k.build(key)
	k.setProblem(key, problem)
	k.queue.Forget(key)
	old, had := state[key]
	switch {
	case !exported:
		delete(state, key)
		return had
	case problem != "" && had:
		// Keep the last good form; the hub keeps serving it.
		k.log.Warn("invalid service; still publishing its last good form", "service", key, "problem", problem)
		return false
	case problem != "":
		// nil: the service exists but cannot be sent; a hub that holds a form
		// of it (from an earlier spoke) keeps that form.
		k.log.Warn("invalid service; the hub keeps whatever it holds for it", "service", key, "problem", problem)
		state[key] = nil
		return !had
	}
	if had && old != nil && old.Equal(shard) {
		return false
	}
	state[key] = shard
	return true
}

// build builds a service's shard from the caches. exported says whether the
// service should be in the state at all; problem, when not empty, says why
// it cannot be built (shard is nil then).
func (k *KubeSource) build(key registry.ServiceKey) (shard *registry.Shard, exported bool, problem string) {
	if !k.filter.allows(key.Namespace) {
		return nil, false, ""
	}
	svc, err := k.services.Services(key.Namespace).Get(key.Name)
	if err != nil {
		return nil, false, ""
	}
	export := k.export(key)
	if !k.opts.ExportAll && svc.Labels[ExportLabel] != "true" && export == nil || imported(svc) {
		return nil, false, ""
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, false, ""
	}
	items, _ := k.slicesIdx.ByIndex(byServiceIndex, key.String())
	eslices := make([]*discoveryv1.EndpointSlice, 0, len(items))
	nodes := map[string]*corev1.Node{}
	for _, o := range items {
		es := &o.(*cachedSlice).EndpointSlice
		eslices = append(eslices, es)
		for _, e := range es.Endpoints {
			if e.NodeName == nil {
				continue
			}
			if _, seen := nodes[*e.NodeName]; !seen {
				nodes[*e.NodeName], _ = k.nodes.Get(*e.NodeName) // nil when the cache has none
			}
		}
	}
	shard, errs, err := serviceShard(key, svc, eslices, nodes, k.opts, k.opts.limits())
	for _, err := range errs {
		k.log.Warn("ignored invalid input; the rest of the service is published", "error", err)
	}
	if err != nil {
		return nil, true, err.Error()
	}
	if export != nil {
		// MCS: a service is exported when its ServiceExport is created; conflicts go to the oldest export.
		if t := export.GetCreationTimestamp(); !t.IsZero() {
			shard.ExportedAt = t.Time
		}
		// Every import carries the export's exportedLabels and exportedAnnotations.
		shard.Labels = exportedMetadata(export, "exportedLabels")
		shard.Annotations = exportedMetadata(export, "exportedAnnotations")
		if err := shard.Validate(k.opts.limits()); err != nil {
			return nil, true, err.Error()
		}
	}
	var left string
	if shard.Traffic, left = k.trafficOf(key); left != "" {
		// The Service federates without its routes and policy.
		k.log.Warn("routes and policy of the service left out", "service", key, "problem", left)
	}
	return shard, true, ""
}

// exportedMetadata reads a ServiceExport's spec.exportedLabels or
// spec.exportedAnnotations (nil when empty or not a string map).
func exportedMetadata(export *unstructured.Unstructured, field string) map[string]string {
	m, _, err := unstructured.NestedStringMap(export.Object, "spec", field)
	if err != nil || len(m) == 0 {
		return nil
	}
	return m
}

// export returns the service's ServiceExport, or nil.
func (k *KubeSource) export(key registry.ServiceKey) *unstructured.Unstructured {
	l := k.exports.Load()
	if l == nil {
		return nil
	}
	o, err := l.lister.ByNamespace(key.Namespace).Get(key.Name)
	if err != nil {
		return nil
	}
	u, _ := o.(*unstructured.Unstructured)
	return u
}

// serviceExportsInstalled asks the API server's discovery for the
// ServiceExport resource, and returns the preferred version it serves.
func (k *KubeSource) serviceExportsInstalled() (schema.GroupVersionResource, bool, error) {
	for _, gvr := range serviceExportVersions {
		ctx, cancel := context.WithTimeout(context.Background(), kubeclient.RequestTimeout)
		served, err := k.client.Resources(ctx, gvr.GroupVersion())
		cancel()
		if err != nil {
			return gvr, false, err
		}
		if slices.Contains(served, gvr.Resource) {
			return gvr, true, nil
		}
	}
	return schema.GroupVersionResource{}, false, nil
}

// awaitServiceExports looks for the ServiceExport CRD until it is installed, then watches it.
func (k *KubeSource) awaitServiceExports(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTicker(k.ExportsRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		gvr, ok, err := k.serviceExportsInstalled()
		if err != nil {
			k.log.Warn("cannot tell whether the ServiceExport CRD is installed", "err", err)
			continue
		}
		if ok {
			k.log.Info("ServiceExport CRD installed; watching ServiceExports", "version", gvr.Version)
			if err := k.watchServiceExports(ctx, gvr, wg); err != nil {
				k.log.Error("cannot watch ServiceExports", "err", err)
				return
			}
			k.enqueueAll()
			return
		}
	}
}

// watchServiceExports starts the ServiceExport informer and waits for it to
// sync (or ctx to end: then it returns ctx's error).
func (k *KubeSource) watchServiceExports(ctx context.Context, gvr schema.GroupVersionResource, wg *sync.WaitGroup) error {
	inf := kubeclient.NewInformer(k.client.Dynamic().Resource(gvr), &unstructured.Unstructured{}, nil)
	if err := inf.SetTransform(strip); err != nil {
		return fmt.Errorf("strip ServiceExports: %w", err)
	}
	onExport := func(obj any) {
		if u, ok := kubeclient.Tombstone(obj).(*unstructured.Unstructured); ok {
			k.enqueue(registry.ServiceKey{Namespace: u.GetNamespace(), Name: u.GetName()})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onExport, DeleteFunc: onExport, UpdateFunc: func(_, cur any) { onExport(cur) },
	}); err != nil {
		return fmt.Errorf("watch ServiceExports: %w", err)
	}
	wg.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	k.exports.Store(&exportWatch{lister: cache.NewGenericLister(inf.GetIndexer(), gvr.GroupResource()), resource: gvr})
	return nil
}

// OnNamespaces makes the source tell f the cluster's namespaces, now (once
// its caches have synced) and whenever one is created or deleted, until the
// next call replaces f (nil: nobody). f must not block.
func (k *KubeSource) OnNamespaces(f func([]string)) {
	k.nsMu.Lock()
	k.onNamespaces = f
	k.nsMu.Unlock()
	k.namespacesChanged()
}

func (k *KubeSource) namespacesChanged() {
	select {
	case <-k.synced:
	default:
		return // told once the caches have synced
	}
	k.nsMu.Lock()
	defer k.nsMu.Unlock()
	if k.onNamespaces == nil {
		return
	}
	list, _ := k.namespaces.List(labelsEverything)
	names := make([]string, len(list))
	for i, ns := range list {
		names[i] = ns.Name
	}
	k.onNamespaces(names)
}

func (k *KubeSource) setProblem(key registry.ServiceKey, problem string) {
	k.statusMu.Lock()
	defer k.statusMu.Unlock()
	if k.problems[key] == problem {
		return
	}
	if problem == "" {
		delete(k.problems, key)
	} else {
		k.problems[key] = problem
	}
	k.queueStatus(key)
}

// SetReports takes what the hub reported about this cluster's services (the
// publisher's callback: it must not block, and does not).
func (k *KubeSource) SetReports(r federation.Reports) {
	k.statusMu.Lock()
	old, known := k.reports, k.reportsKnown
	k.reports, k.reportsKnown = r, true
	k.statusMu.Unlock()
	if !known {
		k.queueAllStatus() // conditions held back until now
		return
	}
	for key := range r {
		k.queueStatus(key)
	}
	for key := range old {
		if _, ok := r[key]; !ok {
			k.queueStatus(key)
		}
	}
}

// forgetReports forgets what an earlier hub session reported: until the
// next session reports, the conditions that depend on the hub stay as they
// are rather than flap.
func (k *KubeSource) forgetReports() {
	k.statusMu.Lock()
	defer k.statusMu.Unlock()
	k.reports, k.reportsKnown = nil, false
}

// strip is the informers' transform: it keeps only what Nave reads of each
// object (and what a ServiceExport status update needs), so that the caches
// of a large cluster stay small. It changes the object in place, as informer
// transforms may, and is idempotent. An EndpointSlice is cached as a
// cachedSlice.
func strip(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		gateway := o.Labels[NetworkGatewayLabel] != ""
		o.ManagedFields, o.OwnerReferences = nil, nil
		o.Annotations = keepLabels(o.Annotations, NetworkGatewayPortAnnotation)
		o.Labels = keptLabels.share(keepLabels(o.Labels, ExportLabel, importwriter.ManagedByLabel, NetworkGatewayLabel))
		spec := corev1.ServiceSpec{Type: o.Spec.Type, ClusterIP: o.Spec.ClusterIP, Ports: o.Spec.Ports,
			SessionAffinity: o.Spec.SessionAffinity, SessionAffinityConfig: o.Spec.SessionAffinityConfig,
			InternalTrafficPolicy: o.Spec.InternalTrafficPolicy, TrafficDistribution: o.Spec.TrafficDistribution,
			IPFamilies: o.Spec.IPFamilies}
		if gateway {
			// A network gateway's addresses: its load balancer's, or its external IPs.
			spec.ExternalIPs = o.Spec.ExternalIPs
			o.Status = corev1.ServiceStatus{LoadBalancer: o.Status.LoadBalancer}
		} else {
			o.Status = corev1.ServiceStatus{}
		}
		o.Spec = spec
	case *discoveryv1.EndpointSlice:
		o.ManagedFields, o.Annotations, o.OwnerReferences = nil, nil, nil
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			e.TargetRef, e.DeprecatedTopology, e.Hints = nil, nil, nil
		}
		compactEndpoints(o)
		return cacheSlice(o), nil
	case *corev1.Namespace:
		o.ObjectMeta = metav1.ObjectMeta{Name: o.Name, ResourceVersion: o.ResourceVersion}
		o.Spec, o.Status = corev1.NamespaceSpec{}, corev1.NamespaceStatus{}
	case *corev1.Node:
		o.ManagedFields, o.Annotations, o.OwnerReferences = nil, nil, nil
		o.Labels = keptLabels.share(keepLabels(o.Labels, corev1.LabelTopologyRegion, corev1.LabelTopologyZone))
		o.Spec, o.Status = corev1.NodeSpec{}, corev1.NodeStatus{}
	case *unstructured.Unstructured:
		unstructured.RemoveNestedField(o.Object, "metadata", "managedFields")
		unstructured.RemoveNestedField(o.Object, "metadata", "annotations")
	}
	return obj, nil
}

func keepLabels(labels map[string]string, keep ...string) map[string]string {
	var out map[string]string
	for _, k := range keep {
		if v, ok := labels[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keep))
			}
			out[k] = v
		}
	}
	return out
}

var labelsEverything = labels.Everything()

// notImportedSelector selects the objects the import writer did not make:
// those without importwriter.ManagedByLabel=importwriter.ManagedByValue.
const notImportedSelector = importwriter.ManagedByLabel + "!=" + importwriter.ManagedByValue
