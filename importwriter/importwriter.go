// Package importwriter writes a member cluster's MCS imports: the
// ServiceImports, derived Services and EndpointSlices the hub says the
// cluster must hold (a federation.ImportState), while the spoke leads.
package importwriter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/internal/mcsstatus"
	"github.com/navemesh/nave/registry"
)

// serviceImportVersions are the ServiceImport versions the writer writes,
// preferred first: it uses the first the cluster serves.
var serviceImportVersions = []schema.GroupVersionResource{
	mcsv1beta1.SchemeGroupVersion.WithResource(mcsv1beta1.ServiceImportPluralName),
	mcsv1alpha1.SchemeGroupVersion.WithResource(mcsv1alpha1.ServiceImportPluralName),
}

// Config configures a Writer.
type Config struct {
	// Cluster is this cluster's ID (for logs).
	Cluster registry.ClusterID
	// Written, if not nil, is told the session epoch and version of a state
	// once every import of it is written (each import's objects written, or
	// its problem reported on its ServiceImport). It is called from the
	// writer's goroutines, one call at a time, and must not block.
	Written func(epoch, version uint64)
	// Problems, if not nil, is told the imports the writer cannot write
	// because an object that is not Nave's (a user's own ServiceImport,
	// Service or EndpointSlice) holds a name they need: the whole set, each
	// time it changes. It is called from the writer's goroutines, one call
	// at a time, and must not block; the slice is the callee's.
	Problems func([]federation.ImportProblem)
	// BlockedRecheck is how often an import so blocked is written again:
	// the writer watches only its own objects, so it does not see the
	// user's go.
	BlockedRecheck time.Duration
	// Workers is how many imports are written at once.
	Workers int
	// ServiceCIDRSettle is how long after the writer made or changed
	// ServiceCIDR nave-clusterset a refusal of a clusterset IP in it is
	// taken for the API server not having caught up (and retried), rather
	// than a refusal (and the Service given a cluster IP of its own).
	ServiceCIDRSettle time.Duration
}

// DefaultConfig returns the configuration a spoke writes imports with.
func DefaultConfig(cluster registry.ClusterID) Config {
	return Config{Cluster: cluster, Workers: 4, ServiceCIDRSettle: 10 * time.Second, BlockedRecheck: 30 * time.Second}
}

// Writer keeps a member cluster's MCS imports equal to what the hub
// says the cluster must hold (a federation.ImportState): for each import a
// ServiceImport, its EndpointSlices (imports.Slices: sticky, deterministic
// names), and, for a ClusterSetIP import, a derived Service whose cluster
// IPs are the hub's clusterset IPs when the cluster takes them (through
// ServiceCIDR nave-clusterset) and the cluster's own otherwise.
//
// It touches only objects labelled ManagedByLabel=ManagedByValue, which it
// watches through label-selected informers; a user's object of the same
// name is left alone and reported. Its caches keep a sum of what it owns
// of each object (see keptSlice, keptServiceImport, keptService), and it
// writes only an object whose sum is not the desired one's, by a merge
// patch that carries the resourceVersion it was computed from: a slice's
// owned part whole, a ServiceImport's or derived Service's difference
// from the object read from the API server. So a restart (or a new leader)
// with an unchanged state writes nothing. It deletes an import's objects only when
// the state says the import may be deleted (ImportState.Deletable), and a
// source cluster's EndpointSlices only while the cluster still sends that
// source or the state is authoritative: a hub that has not heard from every
// cluster deletes nothing. Before the first state it writes nothing.
//
// Set may be called from any goroutine; Run writes while this spoke leads.
type Writer struct {
	client *kubeclient.Client
	cfg    Config
	log    *slog.Logger

	state   atomic.Pointer[federation.ImportState] // the newest state
	changed chan struct{}                          // wakes Run: a newer state
	running atomic.Bool

	writes [numKinds][numVerbs]atomic.Uint64
	failed atomic.Uint64
}

// New returns a writer over client.
func New(client *kubeclient.Client, cfg Config, log *slog.Logger) *Writer {
	if log == nil {
		log = slog.Default()
	}
	def := DefaultConfig(cfg.Cluster)
	if cfg.Workers <= 0 {
		cfg.Workers = def.Workers
	}
	if cfg.ServiceCIDRSettle <= 0 {
		cfg.ServiceCIDRSettle = def.ServiceCIDRSettle
	}
	if cfg.BlockedRecheck <= 0 {
		cfg.BlockedRecheck = def.BlockedRecheck
	}
	return &Writer{client: client, cfg: cfg, changed: make(chan struct{}, 1),
		log: log.With("component", "import-writer", "cluster", cfg.Cluster)}
}

// Set makes st the state to write; the newest state wins. It never blocks
// (the publisher's OnImports may call it).
func (w *Writer) Set(st federation.ImportState) {
	w.state.Store(&st)
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// verb is a kind of write.
type verb int

const (
	verbCreate verb = iota
	verbPatch
	verbDelete
	numVerbs
)

// WriteCounts counts the writes of one kind of object the API server took.
type WriteCounts struct{ Create, Patch, Delete uint64 }

// Total is the number of writes.
func (c WriteCounts) Total() uint64 { return c.Create + c.Patch + c.Delete }

// WriteStats counts a Writer's API writes since it was made.
// Status writes count as ServiceImport patches.
type WriteStats struct {
	ServiceImports, EndpointSlices, Services, ServiceCIDRs WriteCounts
	// Failed counts the writes the API server refused or that failed.
	Failed uint64
}

// Total is the number of writes the API server took.
func (s WriteStats) Total() uint64 {
	return s.ServiceImports.Total() + s.EndpointSlices.Total() + s.Services.Total() + s.ServiceCIDRs.Total()
}

// Stats returns the writer's write counts.
func (w *Writer) Stats() WriteStats {
	c := func(k objKind) WriteCounts {
		return WriteCounts{Create: w.writes[k][verbCreate].Load(), Patch: w.writes[k][verbPatch].Load(),
			Delete: w.writes[k][verbDelete].Load()}
	}
	return WriteStats{ServiceImports: c(kindServiceImport), EndpointSlices: c(kindEndpointSlice),
		Services: c(kindService), ServiceCIDRs: c(kindServiceCIDR), Failed: w.failed.Load()}
}

func (w *Writer) count(k objKind, v verb, err error) {
	if err != nil {
		w.failed.Add(1)
		return
	}
	w.writes[k][v].Add(1)
}

// importAPI is what the API server serves of what the writer writes.
type importAPI struct {
	imports      schema.GroupVersionResource // the ServiceImport version written
	importStatus bool                        // ServiceImports have a status subresource
	serviceCIDRs bool                        // networking.k8s.io/v1 ServiceCIDRs are served
}

// discover asks the API server's discovery what it serves; imports is zero
// when no ServiceImport version is served.
func (w *Writer) discover() (importAPI, error) {
	resources := func(gv schema.GroupVersion) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), kubeclient.RequestTimeout)
		defer cancel()
		return w.client.Resources(ctx, gv)
	}
	var api importAPI
	for _, gvr := range serviceImportVersions {
		served, err := resources(gvr.GroupVersion())
		if err != nil {
			return api, err
		}
		for _, name := range served {
			switch name {
			case gvr.Resource:
				api.imports = gvr
			case gvr.Resource + "/status":
				api.importStatus = true
			}
		}
		if api.imports.Resource != "" {
			break
		}
		api.importStatus = false
	}
	served, err := resources(networkingv1.SchemeGroupVersion)
	if err != nil {
		return api, err
	}
	api.serviceCIDRs = slices.Contains(served, "servicecidrs")
	return api, nil
}

// Run keeps the cluster's imports equal to the newest state until ctx ends
// (while this spoke leads). It waits for the ServiceImport CRD, starts its
// informers, waits for them to sync and for a first state, then writes. It
// returns nil when ctx ends, and an error only when it cannot start.
func (w *Writer) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("importwriter: the writer is already running")
	}
	defer w.running.Store(false)
	var api importAPI
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		var err error
		api, err = w.discover()
		switch {
		case err != nil:
			w.log.Warn("cannot discover the ServiceImport API; retrying", "err", err, "retry", wait)
		case api.imports.Resource == "":
			w.log.Warn("ServiceImport CRD not installed; imports are not written until it is", "retry", wait)
		}
		if err == nil && api.imports.Resource != "" {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	w.log.Info("writing imports", "serviceImports", api.imports.GroupVersion(), "statusSubresource", api.importStatus,
		"serviceCIDRs", api.serviceCIDRs)
	r := &importRun{
		w: w, log: w.log, api: api, written: newWrittenObjects(), dirty: map[registry.ServiceKey]uint64{},
		problems: map[registry.ServiceKey]federation.ImportProblem{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[registry.ServiceKey](),
			workqueue.TypedRateLimitingQueueConfig[registry.ServiceKey]{Name: "serviceimports"}),
	}
	return r.run(ctx)
}

// byImportIndex indexes EndpointSlices by the import they belong to, and the
// Services of an import that are not named as its derived Service
// (strays): that one is read by its name, since an index costs a set per
// value, and so one per import.
const byImportIndex = "import"

// cidrState is what the run knows of ServiceCIDR nave-clusterset.
type cidrState struct {
	want     []string       // the state's CIDRs
	inPlace  []netip.Prefix // the cidrs of the owned ServiceCIDR (nil: none)
	settled  bool           // the ServiceCIDR is as wanted (or cannot be), and settleUntil has passed
	until    time.Time      // refusals of IPs in want before then are retried
	attempts int            // failed attempts in a row
}

// importRun is one Run: caches, queue and progress, for one leadership term.
type importRun struct {
	w       *Writer
	log     *slog.Logger
	api     importAPI
	queue   workqueue.TypedRateLimitingInterface[registry.ServiceKey]
	written *writtenObjects

	serviceImports, endpointSlices, services cache.Indexer

	// state is the state being written; set by the run loop, under progressMu.
	state atomic.Pointer[federation.ImportState]
	cidrs atomic.Pointer[cidrState]

	// progressMu guards the progress towards the state's version: dirty
	// holds the imports the state changed that are not written yet, each
	// with the sequence number of the change.
	progressMu sync.Mutex
	dirty      map[registry.ServiceKey]uint64
	seq        uint64
	target     *federation.ImportState // the state Written will be told of
	reported   *federation.ImportState
	// problems are the imports blocked by objects that are not Nave's, as
	// of each one's last sync (see Config.Problems).
	problems map[registry.ServiceKey]federation.ImportProblem
}

func (r *importRun) run(ctx context.Context) error {
	defer r.queue.ShutDown()
	selector := labels.Set{ManagedByLabel: ManagedByValue}.AsSelector().String()
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = selector }
	esInf := kubeclient.NewInformer(r.w.client.EndpointSlices(""), &discoveryv1.EndpointSlice{}, tweak)
	svcInf := kubeclient.NewInformer(r.w.client.Services(""), &corev1.Service{}, tweak)
	siInf := kubeclient.NewInformer(r.w.client.Dynamic().Resource(r.api.imports), &unstructured.Unstructured{}, tweak)
	informers := kubeclient.Informers{siInf, esInf, svcInf}
	// The caches hold *keptServiceImport, *keptSlice and *keptService (see leanImported).
	if err := informers.SetTransform(leanImported); err != nil {
		return fmt.Errorf("strip imported objects: %w", err)
	}
	byImport := func(kind objKind) cache.Indexers {
		return cache.Indexers{byImportIndex: func(obj any) ([]string, error) {
			if o, ok := obj.(metav1.Object); ok {
				if key, ok := objectKey(kind, o); ok && (kind != kindService || o.GetName() != imports.DerivedServiceName(key)) {
					return []string{key.String()}, nil
				}
			}
			return nil, nil
		}}
	}
	for kind, inf := range map[objKind]cache.SharedIndexInformer{kindEndpointSlice: esInf, kindService: svcInf} {
		if err := inf.AddIndexers(byImport(kind)); err != nil {
			return fmt.Errorf("index imported objects: %w", err)
		}
	}
	for kind, inf := range map[objKind]cache.SharedIndexInformer{kindServiceImport: siInf, kindEndpointSlice: esInf, kindService: svcInf} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.observe(kind, obj, false) },
			UpdateFunc: func(_, obj any) { r.observe(kind, obj, false) },
			DeleteFunc: func(obj any) { r.observe(kind, obj, true) },
		}); err != nil {
			return fmt.Errorf("watch %s: %w", kind, err)
		}
	}
	r.serviceImports, r.endpointSlices, r.services = siInf.GetIndexer(), esInf.GetIndexer(), svcInf.GetIndexer()
	informerCtx, stopInformers := context.WithCancel(context.WithoutCancel(ctx))
	stopped := informers.Start(informerCtx)
	defer func() { stopInformers(); stopped() }()
	r.log.Info("waiting for the caches of imported objects to sync")
	if !informers.WaitForSync(ctx.Done()) {
		return nil // ctx ended
	}

	var workers sync.WaitGroup
	defer workers.Wait() // after the queue is shut down (deferred later, so run first)
	defer r.queue.ShutDown()
	for range r.w.cfg.Workers {
		workers.Go(func() { r.work(ctx) })
	}

	var (
		prev    *federation.ImportState
		retry   *time.Timer
		retryCh <-chan time.Time
	)
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		st := r.w.state.Load()
		if st != nil && st != prev {
			r.setCIDRs(st.CIDRs)
		}
		// ServiceCIDR nave-clusterset first, so that derived Services can take the clusterset IPs.
		if c := r.cidrs.Load(); c != nil && !c.settled && retryCh == nil {
			if wait := r.ensureServiceCIDR(ctx); wait > 0 {
				retry = time.NewTimer(wait)
				retryCh = retry.C
			}
		}
		if st != nil && st != prev {
			r.publish(prev, st)
			prev = st
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.w.changed:
		case <-retryCh:
			retryCh = nil
		}
	}
}

// observe is the informers' event handler: it queues the import an object
// belongs to (a change by anyone else is undone). The writer's own writes
// coming back queue nothing: the sync that wrote them wrote the import
// whole, and syncing it again (converting every object it owns to compare
// them) cost a cluster of large imports most of its memory churn.
func (r *importRun) observe(kind objKind, obj any, gone bool) {
	o, ok := kubeclient.Tombstone(obj).(metav1.Object)
	if !ok {
		return
	}
	if r.written.observe(kind, o, gone) {
		return
	}
	if key, ok := objectKey(kind, o); ok && r.state.Load() != nil {
		r.queue.Add(key)
	}
}

// publish makes st the state being written and queues the imports it changes.
func (r *importRun) publish(prev, st *federation.ImportState) {
	keys := map[registry.ServiceKey]bool{}
	switch {
	case prev == nil || st.Authoritative && !prev.Authoritative:
		// Everything: what the state holds, and what the cluster holds.
		for k := range st.Imports {
			keys[k] = true
		}
		for _, k := range r.endpointSlices.ListIndexFuncValues(byImportIndex) {
			if key, err := registry.ParseServiceKey(k); err == nil {
				keys[key] = true
			}
		}
		for kind, idx := range map[objKind]cache.Indexer{kindService: r.services, kindServiceImport: r.serviceImports} {
			for _, o := range idx.List() {
				if m, ok := o.(metav1.Object); ok {
					if key, ok := objectKey(kind, m); ok {
						keys[key] = true
					}
				}
			}
		}
	default:
		for k, imp := range st.Imports {
			if prev.Imports[k] != imp {
				keys[k] = true
			}
		}
		for k := range prev.Imports {
			if st.Imports[k] == nil {
				keys[k] = true
			}
		}
		for k := range st.Removed {
			if !prev.Removed[k] {
				keys[k] = true
			}
		}
	}
	r.progressMu.Lock()
	r.state.Store(st)
	r.target = st
	for k := range keys {
		r.seq++
		r.dirty[k] = r.seq
	}
	r.reportLocked()
	r.progressMu.Unlock()
	r.log.Debug("new import state", "epoch", st.Epoch, "version", st.Version, "imports", len(st.Imports),
		"authoritative", st.Authoritative, "queued", len(keys))
	for k := range keys {
		r.queue.Add(k)
	}
}

// reportLocked tells Written of the target state once nothing of it is left to write.
func (r *importRun) reportLocked() {
	if len(r.dirty) > 0 || r.target == nil || r.target == r.reported {
		return
	}
	r.reported = r.target
	r.log.Debug("import state written", "epoch", r.target.Epoch, "version", r.target.Version)
	if f := r.w.cfg.Written; f != nil {
		f(r.target.Epoch, r.target.Version)
	}
}

func (r *importRun) work(ctx context.Context) {
	for {
		key, shutdown := r.queue.Get()
		if shutdown {
			return
		}
		r.process(ctx, key)
	}
}

// process writes one import and records the outcome.
func (r *importRun) process(ctx context.Context, key registry.ServiceKey) {
	defer r.queue.Done(key)
	r.progressMu.Lock()
	seq, st := r.dirty[key], r.state.Load()
	r.progressMu.Unlock()
	if st == nil {
		return
	}
	var problem *federation.ImportProblem
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				r.log.Error("panic while writing an import; retrying", "service", key, "panic", p, "stack", string(debug.Stack()))
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		problem, err = r.sync(ctx, key, st)
		return err
	}()
	switch {
	case ctx.Err() != nil:
		return // leadership ended: the next leader starts over
	case err != nil:
		r.log.Warn("cannot write an import; retrying", "service", key, "err", err)
		r.queue.AddRateLimited(key)
		return
	}
	r.queue.Forget(key)
	r.progressMu.Lock()
	r.setProblemLocked(key, problem)
	if seq != 0 && r.dirty[key] == seq {
		delete(r.dirty, key)
		r.reportLocked()
	}
	r.progressMu.Unlock()
	if problem != nil {
		r.queue.AddAfter(key, r.w.cfg.BlockedRecheck) // the user's object may be gone by then
	}
}

// setProblemLocked records what blocks an import (nil: nothing), and tells
// Problems of the set when it changed.
func (r *importRun) setProblemLocked(key registry.ServiceKey, p *federation.ImportProblem) {
	old, had := r.problems[key]
	switch {
	case p == nil && !had, p != nil && had && old == *p:
		return
	case p == nil:
		delete(r.problems, key)
		r.log.Info("the import is no longer blocked", "service", key)
	default:
		r.problems[key] = *p
		r.log.Warn("an object that is not Nave's blocks the import; reported to the hub", "service", key,
			"reason", p.Reason, "objects", p.Message)
	}
	if f := r.w.cfg.Problems; f != nil {
		f(slices.SortedFunc(maps.Values(r.problems), func(a, b federation.ImportProblem) int { return a.Service.Compare(b.Service) }))
	}
}

// retryable tells a failed write worth retrying from one that cannot
// succeed until something else changes (which queues the import again).
func retryable(err error) bool {
	switch {
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		// A namespace being deleted may come back; the hub removes its imports if it does not.
		return true
	case err == nil, apierrors.IsInvalid(err), apierrors.IsForbidden(err), apierrors.IsBadRequest(err),
		apierrors.IsMethodNotSupported(err), apierrors.IsNotAcceptable(err), apierrors.IsUnsupportedMediaType(err),
		apierrors.IsRequestEntityTooLargeError(err):
		return false
	}
	return true
}

// syncResult is what one sync of an import found wrong.
type syncResult struct {
	clashes  []string             // objects it needs that are not Nave's
	blocked  string               // the reason of the first clash (federation.ReasonBlockedBy...)
	refusals []string             // objects the API server refused
	ipCond   *mcsstatus.Condition // the ClusterSetIP condition (ClusterSetIP imports)
	retry    error                // the first error worth retrying
}

// clash records an object the import needs that is not Nave's, of a kind
// and name; reason is the kind's (federation.ReasonBlockedBy...).
func (s *syncResult) clash(reason, kind, name string) {
	s.clashes = append(s.clashes, fmt.Sprintf("%s %s exists and is not managed by Nave (no label %s=%s)",
		kind, name, ManagedByLabel, ManagedByValue))
	if s.blocked == "" {
		s.blocked = reason
	}
}

// problem is what blocks the import; nil when nothing does.
func (s *syncResult) problem(key registry.ServiceKey) *federation.ImportProblem {
	if s.blocked == "" {
		return nil
	}
	return &federation.ImportProblem{Service: key, Reason: s.blocked, Message: strings.Join(s.clashes, "; ")}
}

// failed records a failed write: retried when it may succeed later,
// reported on the ServiceImport when not.
func (s *syncResult) failed(log *slog.Logger, key registry.ServiceKey, what string, err error) {
	if retryable(err) {
		if s.retry == nil {
			s.retry = fmt.Errorf("%s: %w", what, err)
		}
		return
	}
	log.Error("the API server refused a write; not retrying until the import changes", "service", key, "object", what, "err", err)
	s.refusals = append(s.refusals, fmt.Sprintf("%s: %v", what, err))
}

// sync makes the cluster hold what st says of key, and says what blocks
// it (objects that are not Nave's holding names it needs; nil: nothing).
func (r *importRun) sync(ctx context.Context, key registry.ServiceKey, st *federation.ImportState) (*federation.ImportProblem, error) {
	imp := st.Imports[key]
	si := r.serviceImport(key)
	esList := r.slicesOf(key)
	svcs := r.servicesOf(key)
	if imp == nil {
		if !st.Deletable(key) {
			return nil, nil // the hub may not know it all: keep it
		}
		return nil, r.remove(ctx, key, si, esList, svcs)
	}
	var res syncResult
	if si == nil {
		var proceed bool
		var err error
		si, proceed, err = r.createServiceImport(ctx, imp, svcs, &res)
		if err != nil || !proceed {
			return res.problem(key), err
		}
	}
	owner := metav1.OwnerReference{APIVersion: r.api.imports.GroupVersion().String(), Kind: mcsv1beta1.ServiceImportKindName,
		Name: si.GetName(), UID: si.GetUID(), Controller: refTo(true)}
	var ips []string
	derived := ""
	if imp.Headless {
		for _, svc := range svcs {
			r.deleteObject(ctx, kindService, key, svc, &res)
		}
	} else {
		ips, derived = r.ensureService(ctx, imp, owner, svcs, &res)
	}
	if res.retry != nil {
		return nil, res.retry
	}
	si = r.patchServiceImport(ctx, si, imp, ips, &res)
	if res.retry != nil {
		return nil, res.retry
	}
	r.ensureSlices(ctx, imp, st, owner, derived, esList, &res)
	if res.retry != nil {
		return nil, res.retry
	}
	r.ensureStatus(ctx, si, imp, derived, &res)
	return res.problem(key), res.retry
}

// The cached objects of an import, with the writer's own recent writes in place.

func (r *importRun) serviceImport(key registry.ServiceKey) *keptServiceImport {
	cached := map[string]metav1.Object{}
	if o, ok, _ := r.serviceImports.GetByKey(key.Namespace + "/" + key.Name); ok {
		if si, ok := o.(*keptServiceImport); ok {
			cached[key.Name] = si
		}
	}
	si, _ := r.written.resolve(kindServiceImport, key, cached)[key.Name].(*keptServiceImport)
	return si
}

// resolved are the cached objects of an import, items, with the writer's
// own recent writes in place, sorted by name.
func resolved[T metav1.Object](r *importRun, kind objKind, key registry.ServiceKey, items []any) []T {
	cached := map[string]metav1.Object{}
	for _, o := range items {
		if m, ok := o.(T); ok {
			cached[m.GetName()] = m
		}
	}
	var out []T
	for _, name := range slices.Sorted(maps.Keys(r.written.resolve(kind, key, cached))) {
		if m, ok := cached[name].(T); ok {
			out = append(out, m)
		}
	}
	return out
}

func (r *importRun) slicesOf(key registry.ServiceKey) []*keptSlice {
	items, _ := r.endpointSlices.ByIndex(byImportIndex, key.String())
	return resolved[*keptSlice](r, kindEndpointSlice, key, items)
}

// servicesOf are the import's derived Service, read by its name, and its strays.
func (r *importRun) servicesOf(key registry.ServiceKey) []*keptService {
	items, _ := r.services.ByIndex(byImportIndex, key.String())
	if o, ok, _ := r.services.GetByKey(key.Namespace + "/" + imports.DerivedServiceName(key)); ok {
		if m, ok := o.(metav1.Object); ok {
			if k, ok := objectKey(kindService, m); ok && k == key {
				items = append(items, o)
			}
		}
	}
	return resolved[*keptService](r, kindService, key, items)
}

// timeout bounds one request.
func timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, kubeclient.RequestTimeout)
}

func (r *importRun) serviceImportClient(namespace string) dynamic.ResourceInterface {
	return r.w.client.Dynamic().Resource(r.api.imports).Namespace(namespace)
}

// createServiceImport creates an import's ServiceImport. proceed is false
// when the import cannot be written now, and need not be retried: its
// namespace does not exist, or a ServiceImport of that name is not Nave's.
func (r *importRun) createServiceImport(ctx context.Context, imp *imports.Import, svcs []*keptService, res *syncResult) (si *keptServiceImport, proceed bool, err error) {
	key := imp.Service
	// The IPs the derived Service will have: those it has, or the hub's.
	ips := ipStrings(imp.IPs)
	for _, svc := range svcs {
		if requested, _ := svc.annotation(requestedIPsAnnotation); svc.Name == imports.DerivedServiceName(key) && requested == strings.Join(ips, ",") {
			ips = serviceIPs(svc)
		}
	}
	desired := desiredServiceImport(imp, ips)
	u := &unstructured.Unstructured{Object: toMap(desired)}
	u.SetAPIVersion(r.api.imports.GroupVersion().String())
	u.SetKind(mcsv1beta1.ServiceImportKindName)
	delete(u.Object, "status")
	ctx, cancel := timeout(ctx)
	defer cancel()
	created, err := r.serviceImportClient(key.Namespace).Create(ctx, u, metav1.CreateOptions{FieldManager: FieldManager})
	r.w.count(kindServiceImport, verbCreate, err)
	switch {
	case err == nil:
		r.log.Info("created ServiceImport", "service", key)
		si := leanServiceImport(created)
		r.written.put(kindServiceImport, key, si)
		return si, true, nil
	case apierrors.IsNotFound(err):
		r.log.Info("namespace does not exist; import not written", "service", key, "err", err)
		return nil, false, nil
	case apierrors.IsAlreadyExists(err):
		got, gerr := r.serviceImportClient(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
		switch {
		case gerr != nil:
			return nil, false, fmt.Errorf("get ServiceImport %s: %w", key, gerr)
		case !owned(got):
			r.log.Debug("a ServiceImport that is not Nave's has the import's name; import not written",
				"service", key, "label", ManagedByLabel+"="+ManagedByValue)
			res.clash(federation.ReasonBlockedByServiceImport, "ServiceImport", key.Name)
			return nil, false, nil
		}
		si := leanServiceImport(got)
		r.written.put(kindServiceImport, key, si)
		return si, true, nil
	case !retryable(err):
		r.log.Error("the API server refused the ServiceImport; not retrying until the import changes", "service", key, "err", err)
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("create ServiceImport %s: %w", key, err)
}

// patchServiceImport writes what differs of the ServiceImport's labels,
// annotations and spec, and returns the ServiceImport as the writer keeps
// it now. The cache keeps only a sum of them (see keptServiceImport).
func (r *importRun) patchServiceImport(ctx context.Context, si *keptServiceImport, imp *imports.Import, ips []string, res *syncResult) *keptServiceImport {
	want := serviceImportOwned(desiredServiceImport(imp, ips))
	if si.owned == ownedSum(want) {
		return si
	}
	get := func(ctx context.Context) (metav1.Object, map[string]any, error) {
		got, err := r.serviceImportClient(si.Namespace).Get(ctx, si.Name, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		return got, serviceImportOwned(typedServiceImport(got)), nil
	}
	if out, ok := r.readAndPatch(ctx, kindServiceImport, imp.Service, si, get, want, res).(*keptServiceImport); ok {
		return out
	}
	return si
}

// ensureStatus writes the ServiceImport's clusters and conditions when they differ.
func (r *importRun) ensureStatus(ctx context.Context, si *keptServiceImport, imp *imports.Import, derived string, res *syncResult) {
	key := imp.Service
	ready := mcsstatus.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonReady,
		Message: "the imported EndpointSlices are written"}
	if !imp.Headless {
		ready.Message = "the imported EndpointSlices and the derived Service " + derived + " are written"
	}
	switch {
	case len(res.clashes) > 0:
		ready = mcsstatus.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonNameInUse,
			Message: conditionMessage(append(res.clashes, res.refusals...))}
	case len(res.refusals) > 0:
		ready = mcsstatus.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonRefused,
			Message: conditionMessage(res.refusals)}
	}
	want := []mcsstatus.Condition{ready}
	if res.ipCond != nil {
		want = append(want, *res.ipCond)
	}
	clusters := make([]any, 0, len(imp.Sources))
	for _, src := range imp.Sources { // sorted by cluster ID
		clusters = append(clusters, map[string]any{"cluster": string(src.Cluster)})
	}
	// Without a status subresource, writing the status makes a new
	// generation of the ServiceImport: an observed generation could never be
	// current, so the conditions carry none.
	generation := si.GetGeneration()
	if !r.api.importStatus {
		generation = 0
	}
	if si.status == wantedSum(want, clusters, generation) {
		return
	}

	// Not as wanted: merge into the status it holds, read unless it holds
	// none (a ServiceImport just made), guarded by the version merged into.
	current, rv := map[string]any{}, si.GetResourceVersion()
	if !si.bare {
		var ok bool
		if current, rv, ok = r.readStatus(ctx, si, key, res); !ok {
			return
		}
	}
	status := statusUpdate(current, want, clusters, generation, time.Now())
	if status == nil {
		return // already as wanted: the cache is behind
	}
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": rv},
		"status":   status,
	})
	if err != nil {
		res.failed(r.log, key, statusWhat, err)
		return
	}
	var sub []string
	if r.api.importStatus {
		sub = []string{"status"}
	}
	pctx, cancel := timeout(ctx)
	defer cancel()
	out, err := r.serviceImportClient(key.Namespace).Patch(pctx, key.Name, types.MergePatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager}, sub...)
	r.w.count(kindServiceImport, verbPatch, err)
	if err != nil {
		if apierrors.IsNotFound(err) {
			r.written.forget(kindServiceImport, key, key.Name)
		}
		res.failed(r.log, key, statusWhat, err)
		return
	}
	r.written.put(kindServiceImport, key, leanServiceImport(out))
}

// readStatus reads a ServiceImport's status (as toMap gives it) and version,
// if it is still the one the writer keeps (si) and of the generation the
// sync checked; otherwise it fails the sync (ok false).
func (r *importRun) readStatus(ctx context.Context, si *keptServiceImport, key registry.ServiceKey, res *syncResult) (status map[string]any, rv string, ok bool) {
	ctx, cancel := timeout(ctx)
	defer cancel()
	got, err := r.serviceImportClient(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if !r.stillOwn(kindServiceImport, key, si, got, err, statusWhat, res) {
		return nil, "", false
	}
	if got.GetGeneration() != si.GetGeneration() {
		// A spec this sync did not check (or, without a status subresource,
		// anyone's status write): the cache will bring it, and the import be
		// synced again.
		res.failed(r.log, key, statusWhat, errors.New("it changed (a new generation) under the writer"))
		return nil, "", false
	}
	return toMap(&typedServiceImport(got).Status), got.GetResourceVersion(), true
}

// statusWhat names a ServiceImport's status in the writer's logs.
const statusWhat = "ServiceImport status"

// ensureService keeps a ClusterSetIP import's derived Service, and returns
// its IPs and name ("" when there is none of Nave's).
func (r *importRun) ensureService(ctx context.Context, imp *imports.Import, owner metav1.OwnerReference, svcs []*keptService, res *syncResult) (ips []string, derived string) {
	key := imp.Service
	name := imports.DerivedServiceName(key)
	desired := desiredService(imp, owner)
	hub := ipStrings(imp.IPs)
	requested := strings.Join(hub, ",")
	var cur *keptService
	for _, svc := range svcs {
		if svc.Name == name {
			cur = svc
		} else {
			r.deleteObject(ctx, kindService, key, svc, res) // not the import's (any more)
		}
	}
	if cur != nil {
		if why := r.needsRecreate(cur, desired, requested); why != "" {
			r.log.Info("making the derived Service anew", "service", key, "derived", name, "why", why)
			if !r.deleteObject(ctx, kindService, key, cur, res) {
				return nil, ""
			}
			cur = nil
		}
	}
	if cur == nil {
		cur = r.createService(ctx, imp, desired, hub, res)
		if cur == nil {
			return nil, ""
		}
	} else if want := serviceOwned(desired); cur.owned != ownedSum(want) {
		if out := r.patchService(ctx, key, cur, want, res); out != nil {
			cur = out
		}
	}
	ips = serviceIPs(cur)
	switch refused, _ := cur.annotation(refusedAnnotation); {
	case len(hub) > 0 && slices.Equal(ips, hub):
		res.ipCond = &mcsstatus.Condition{Type: ConditionClusterSetIP, Status: metav1.ConditionTrue, Reason: ReasonAllocated,
			Message: fmt.Sprintf("the derived Service %s has the clusterset IPs %s", name, requested)}
	case len(hub) == 0:
		res.ipCond = &mcsstatus.Condition{Type: ConditionClusterSetIP, Status: metav1.ConditionFalse, Reason: ReasonClusterLocalIP,
			Message: fmt.Sprintf("the hub allocated no clusterset IP; the derived Service %s has the cluster's IPs %s", name, strings.Join(ips, ","))}
	default:
		res.ipCond = &mcsstatus.Condition{Type: ConditionClusterSetIP, Status: metav1.ConditionFalse, Reason: ReasonClusterLocalIP,
			Message: mcsstatus.Truncate(fmt.Sprintf("the cluster refused the clusterset IPs %s (%s); the derived Service %s has the cluster's IPs %s",
				requested, cmp.Or(refused, "reason unknown"), name, strings.Join(ips, ",")))}
	}
	return ips, name
}

// patchService writes what differs of a derived Service's owned part from
// want, and returns the Service as the writer keeps it now; nil when that
// is not known. The cache keeps only a sum of it (see keptService).
func (r *importRun) patchService(ctx context.Context, key registry.ServiceKey, cur *keptService, want map[string]any, res *syncResult) *keptService {
	get := func(ctx context.Context) (metav1.Object, map[string]any, error) {
		got, err := r.w.client.Services(key.Namespace).Get(ctx, cur.Name, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		return got, serviceOwned(got), nil
	}
	out, _ := r.readAndPatch(ctx, kindService, key, cur, get, want, res).(*keptService)
	return out
}

// readAndPatch reads an owned object the writer keeps only a sum of (get
// returns it and its owned part), and patches what differs of its owned
// part from want, guarded by the version read. It returns the object as
// the writer keeps it now; nil when that is not known. When the object
// read is already as wanted (the cache is behind), it is returned without
// being remembered as a write: its version coming back then syncs the
// import once more, from the cache caught up.
func (r *importRun) readAndPatch(ctx context.Context, kind objKind, key registry.ServiceKey, cur metav1.Object,
	get func(context.Context) (metav1.Object, map[string]any, error), want map[string]any, res *syncResult) metav1.Object {
	gctx, cancel := timeout(ctx)
	got, part, err := get(gctx)
	cancel()
	if !r.stillOwn(kind, key, cur, got, err, kind.String()+" "+cur.GetName(), res) {
		return nil
	}
	patch := mergePatch(part, want)
	if patch == nil {
		kept, _ := leanImported(got)
		return kept.(metav1.Object)
	}
	return r.patchObject(ctx, kind, key, got, patch, res)
}

// stillOwn reports whether got, read (with err) in place of cur, is still
// the object the writer keeps: not gone, not replaced (another UID), still
// Nave's. Otherwise it fails the sync: the cache will say what happened,
// and the import be synced again.
func (r *importRun) stillOwn(kind objKind, key registry.ServiceKey, cur, got metav1.Object, err error, what string, res *syncResult) bool {
	switch {
	case apierrors.IsNotFound(err):
		r.written.forget(kind, key, cur.GetName())
		res.failed(r.log, key, what, err)
		return false
	case err != nil:
		res.failed(r.log, key, what, err)
		return false
	case got.GetUID() != cur.GetUID() || !owned(got):
		res.failed(r.log, key, what, errors.New("it changed under the writer"))
		return false
	}
	return true
}

// needsRecreate says why a derived Service must be made anew ("" when it
// need not): its cluster IPs and IP families cannot be changed.
func (r *importRun) needsRecreate(cur *keptService, desired *corev1.Service, requested string) string {
	had, hasRequested := cur.annotation(requestedIPsAnnotation)
	_, refused := cur.annotation(refusedAnnotation)
	switch {
	case cur.typ != corev1.ServiceTypeClusterIP || cur.clusterIP == corev1.ClusterIPNone:
		return "its type is not ClusterIP"
	case !hasRequested || had != requested:
		return fmt.Sprintf("the clusterset IPs changed from %q to %q", had, requested)
	case !familiesCompatible(cur, desired.Spec.IPFamilies):
		return fmt.Sprintf("its IP families %v are not %v", cur.families, desired.Spec.IPFamilies)
	}
	if refused && requested != "" {
		// Refused before ServiceCIDR nave-clusterset held the IPs: try them once more now that it does.
		c := r.cidrs.Load()
		if cidrs, _ := cur.annotation(refusedCIDRsAnnotation); c != nil && c.settled && len(c.inPlace) > 0 &&
			cidrs != prefixesString(c.inPlace) && allInside(strings.Split(requested, ","), c.inPlace) {
			return "ServiceCIDR " + ServiceCIDRName + " now holds the clusterset IPs"
		}
	}
	return ""
}

// createService creates the derived Service with the hub's IPs, or, when
// the cluster refuses them, with IPs of its own, and returns it as the
// writer keeps it; nil when it could not.
func (r *importRun) createService(ctx context.Context, imp *imports.Import, desired *corev1.Service, hub []string, res *syncResult) *keptService {
	key := imp.Service
	create := func(svc *corev1.Service) (*corev1.Service, error) {
		ctx, cancel := timeout(ctx)
		defer cancel()
		out, err := r.w.client.Services(key.Namespace).Create(ctx, svc, metav1.CreateOptions{FieldManager: FieldManager})
		r.w.count(kindService, verbCreate, err)
		return out, err
	}
	// Look first: a create under a name that is taken still allocates (and
	// leaks, until the API server's repair loop) a cluster IP.
	gctx, cancel := timeout(ctx)
	got, err := r.w.client.Services(key.Namespace).Get(gctx, desired.Name, metav1.GetOptions{})
	cancel()
	switch {
	case err == nil && !owned(got):
		r.log.Debug("a Service that is not Nave's has the derived Service's name; left alone", "service", key, "derived", desired.Name)
		res.clash(federation.ReasonBlockedByService, "Service", desired.Name)
		return nil
	case err == nil:
		r.written.put(kindService, key, got)
		res.failed(r.log, key, "derived Service "+desired.Name, errors.New("the cache is behind the API server"))
		return nil
	case !apierrors.IsNotFound(err):
		res.failed(r.log, key, "derived Service "+desired.Name, err)
		return nil
	}
	svc := desired.DeepCopy()
	svc.Annotations = map[string]string{requestedIPsAnnotation: strings.Join(hub, ",")}
	svc.Spec.ClusterIPs = hub
	if len(hub) > 0 {
		svc.Spec.ClusterIP = hub[0]
	}
	out, err := create(svc)
	if err != nil && len(hub) > 0 && apierrors.IsInvalid(err) {
		if r.cidrPending(hub) {
			res.failed(r.log, key, "derived Service "+svc.Name, fmt.Errorf("ServiceCIDR %s is not in place yet: %w", ServiceCIDRName, err))
			return nil
		}
		r.log.Warn("the cluster refused the clusterset IPs; the derived Service gets IPs of the cluster's own",
			"service", key, "ips", hub, "err", err)
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "", nil
		svc.Annotations[refusedAnnotation] = truncateTo(apiMessage(err), 1024)
		if c := r.cidrs.Load(); c != nil {
			svc.Annotations[refusedCIDRsAnnotation] = prefixesString(c.inPlace)
		}
		out, err = create(svc)
	}
	switch {
	case err == nil:
		r.log.Info("created derived Service", "service", key, "derived", out.Name, "clusterIPs", out.Spec.ClusterIPs)
		return r.written.put(kindService, key, out).(*keptService)
	case apierrors.IsAlreadyExists(err):
		ctx, cancel := timeout(ctx)
		defer cancel()
		got, gerr := r.w.client.Services(key.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
		switch {
		case gerr != nil:
			res.failed(r.log, key, "derived Service "+svc.Name, gerr)
		case !owned(got):
			r.log.Debug("a Service that is not Nave's has the derived Service's name; left alone", "service", key, "derived", svc.Name)
			res.clash(federation.ReasonBlockedByService, "Service", svc.Name)
		default:
			r.written.put(kindService, key, got)
			res.failed(r.log, key, "derived Service "+svc.Name, err) // the cache is behind: retry
		}
		return nil
	}
	res.failed(r.log, key, "derived Service "+svc.Name, err)
	return nil
}

// apiMessage is an API error's message without the object's name.
func apiMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Message
	}
	return err.Error()
}

// truncateTo cuts s to at most n bytes, on a rune boundary.
func truncateTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ensureSlices writes an import's EndpointSlices: imports.SlicesFrom what
// the writer keeps of those the cluster holds. A slice of a source cluster the import no longer lists
// is deleted only under an authoritative state.
func (r *importRun) ensureSlices(ctx context.Context, imp *imports.Import, st *federation.ImportState, owner metav1.OwnerReference, derived string, cached []*keptSlice, res *syncResult) {
	key := imp.Service
	sources := map[registry.ClusterID]bool{}
	for _, src := range imp.Sources {
		sources[src.Cluster] = true
	}
	var prev []imports.Prev
	byName := map[string]*keptSlice{}
	for _, es := range cached {
		byName[es.Name] = es
		if es.readable {
			prev = append(prev, es.prev)
		}
	}
	want := imports.SlicesFrom(imp, prev)
	wanted := map[string]bool{}
	for i := range want {
		s := &want[i]
		wanted[s.Name] = true
		desired := desiredSlice(key, s, owner, derived)
		cur := byName[s.Name]
		if cur == nil {
			r.createSlice(ctx, key, desired, res)
			continue
		}
		if owned := sliceOwned(desired); ownedSum(owned) != cur.owned {
			r.patchObject(ctx, kindEndpointSlice, key, cur, slicePatch(cur, owned), res)
		}
	}
	for _, es := range cached {
		if wanted[es.Name] {
			continue
		}
		if cluster := registry.ClusterID(es.label(mcsv1beta1.LabelSourceCluster)); sources[cluster] || st.Authoritative {
			r.deleteObject(ctx, kindEndpointSlice, key, es, res)
		}
	}
}

func (r *importRun) createSlice(ctx context.Context, key registry.ServiceKey, es *discoveryv1.EndpointSlice, res *syncResult) {
	ctx, cancel := timeout(ctx)
	defer cancel()
	client := r.w.client.EndpointSlices(key.Namespace)
	out, err := client.Create(ctx, es, metav1.CreateOptions{FieldManager: FieldManager})
	r.w.count(kindEndpointSlice, verbCreate, err)
	switch {
	case err == nil:
		r.log.Debug("created EndpointSlice", "service", key, "slice", es.Name)
		r.written.put(kindEndpointSlice, key, out)
	case apierrors.IsAlreadyExists(err):
		got, gerr := client.Get(ctx, es.Name, metav1.GetOptions{})
		switch {
		case gerr != nil:
			res.failed(r.log, key, "EndpointSlice "+es.Name, gerr)
		case !owned(got):
			r.log.Debug("an EndpointSlice that is not Nave's has an imported slice's name; left alone", "service", key, "slice", es.Name)
			res.clash(federation.ReasonBlockedByEndpointSlice, "EndpointSlice", es.Name)
		default:
			r.written.put(kindEndpointSlice, key, got)
			res.failed(r.log, key, "EndpointSlice "+es.Name, err) // the cache is behind: retry
		}
	default:
		res.failed(r.log, key, "EndpointSlice "+es.Name, err)
	}
}

// patchObject applies a merge patch to an owned object (not its status),
// guarded by the resourceVersion it was computed from, and returns the
// object as the writer keeps it (see writtenObjects.put); nil when it failed.
func (r *importRun) patchObject(ctx context.Context, kind objKind, key registry.ServiceKey, cur metav1.Object, patch map[string]any, res *syncResult) metav1.Object {
	what := kind.String() + " " + cur.GetName()
	body, err := json.Marshal(withResourceVersion(patch, cur.GetResourceVersion()))
	if err != nil {
		res.failed(r.log, key, what, err)
		return nil
	}
	ctx, cancel := timeout(ctx)
	defer cancel()
	opts := metav1.PatchOptions{FieldManager: FieldManager}
	var out metav1.Object
	switch kind {
	case kindEndpointSlice:
		out, err = r.w.client.EndpointSlices(key.Namespace).Patch(ctx, cur.GetName(), types.MergePatchType, body, opts)
	case kindService:
		out, err = r.w.client.Services(key.Namespace).Patch(ctx, cur.GetName(), types.MergePatchType, body, opts)
	case kindServiceImport:
		out, err = r.serviceImportClient(key.Namespace).Patch(ctx, cur.GetName(), types.MergePatchType, body, opts)
	default:
		panic("patchObject: " + kind.String())
	}
	r.w.count(kind, verbPatch, err)
	if err != nil {
		if apierrors.IsNotFound(err) {
			r.written.forget(kind, key, cur.GetName())
		}
		res.failed(r.log, key, what, err)
		return nil
	}
	r.log.Debug("patched "+kind.String(), "service", key, "name", cur.GetName())
	return r.written.put(kind, key, out)
}

// deleteObject deletes an owned object, exactly the version the writer
// saw (so never one a user made since under that name); false when it is
// still there.
func (r *importRun) deleteObject(ctx context.Context, kind objKind, key registry.ServiceKey, o metav1.Object, res *syncResult) bool {
	uid, rv := o.GetUID(), o.GetResourceVersion()
	opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}
	ctx, cancel := timeout(ctx)
	defer cancel()
	var err error
	switch kind {
	case kindServiceImport:
		err = r.serviceImportClient(key.Namespace).Delete(ctx, o.GetName(), opts)
	case kindEndpointSlice:
		err = r.w.client.EndpointSlices(key.Namespace).Delete(ctx, o.GetName(), opts)
	case kindService:
		err = r.w.client.Services(key.Namespace).Delete(ctx, o.GetName(), opts)
	default:
		panic("deleteObject: " + kind.String())
	}
	if apierrors.IsNotFound(err) {
		r.written.forget(kind, key, o.GetName())
		return true
	}
	r.w.count(kind, verbDelete, err)
	if err != nil {
		res.failed(r.log, key, kind.String()+" "+o.GetName(), err)
		return false
	}
	r.log.Info("deleted "+kind.String(), "service", key, "name", o.GetName())
	r.written.deleted(kind, key, o)
	return true
}

// remove deletes everything of an import the state may delete: slices and
// derived Service first, the ServiceImport last (until then a failure
// leaves the import visible, and retried).
func (r *importRun) remove(ctx context.Context, key registry.ServiceKey, si *keptServiceImport, esList []*keptSlice, svcs []*keptService) error {
	var res syncResult
	for _, es := range esList {
		r.deleteObject(ctx, kindEndpointSlice, key, es, &res)
	}
	for _, svc := range svcs {
		r.deleteObject(ctx, kindService, key, svc, &res)
	}
	if res.retry == nil && si != nil {
		r.deleteObject(ctx, kindServiceImport, key, si, &res)
	}
	return res.retry
}

// ServiceCIDR nave-clusterset.

func prefixesString(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func allInside(ips []string, cidrs []netip.Prefix) bool {
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil || !slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			return false
		}
	}
	return len(ips) > 0
}

func parsePrefixes(cidrs []string) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// setCIDRs takes the state's CIDRs: ServiceCIDR nave-clusterset is made
// (or checked) again when they change.
func (r *importRun) setCIDRs(cidrs []string) {
	c := r.cidrs.Load()
	if c != nil && slices.Equal(c.want, cidrs) {
		return
	}
	next := &cidrState{want: slices.Clone(cidrs)}
	if c != nil {
		next.inPlace = c.inPlace
	}
	next.settled = !r.api.serviceCIDRs || len(cidrs) == 0
	r.cidrs.Store(next)
}

// cidrPending reports whether a refusal of hub's IPs may be the API server
// not having caught up with ServiceCIDR nave-clusterset yet.
func (r *importRun) cidrPending(hub []string) bool {
	c := r.cidrs.Load()
	if c == nil || !allInside(hub, parsePrefixes(c.want)) {
		return false
	}
	return !c.settled || time.Now().Before(c.until)
}

// ensureServiceCIDR makes ServiceCIDR nave-clusterset hold the state's
// CIDRs, once; it returns when to try again (0: done).
func (r *importRun) ensureServiceCIDR(ctx context.Context) time.Duration {
	c := *r.cidrs.Load()
	client := r.w.client.ServiceCIDRs()
	settle := func(inPlace []string, changed bool) time.Duration {
		c.inPlace, c.settled, c.attempts = parsePrefixes(inPlace), true, 0
		if changed {
			c.until = time.Now().Add(r.w.cfg.ServiceCIDRSettle)
		}
		r.cidrs.Store(&c)
		return 0
	}
	failed := func(err error) time.Duration {
		if !retryable(err) {
			r.log.Error("cannot write ServiceCIDR "+ServiceCIDRName+"; clusterset IPs outside the cluster's ranges get cluster IPs instead",
				"cidrs", c.want, "err", err)
			return settle(nil, false)
		}
		c.attempts++
		wait := min(time.Second<<min(c.attempts, 5), 30*time.Second)
		r.log.Warn("cannot write ServiceCIDR "+ServiceCIDRName+"; retrying", "cidrs", c.want, "err", err, "retry", wait)
		r.cidrs.Store(&c)
		return wait
	}
	rctx, cancel := timeout(ctx)
	defer cancel()
	cur, err := client.Get(rctx, ServiceCIDRName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		obj := &networkingv1.ServiceCIDR{
			ObjectMeta: metav1.ObjectMeta{Name: ServiceCIDRName, Labels: map[string]string{ManagedByLabel: ManagedByValue}},
			Spec:       networkingv1.ServiceCIDRSpec{CIDRs: c.want},
		}
		_, err := client.Create(rctx, obj, metav1.CreateOptions{FieldManager: FieldManager})
		r.w.count(kindServiceCIDR, verbCreate, err)
		if err != nil {
			return failed(err)
		}
		r.log.Info("created ServiceCIDR "+ServiceCIDRName, "cidrs", c.want)
		return settle(c.want, true)
	case err != nil:
		return failed(err)
	case !owned(cur):
		r.log.Warn("a ServiceCIDR that is not Nave's is named "+ServiceCIDRName+"; left alone", "cidrs", cur.Spec.CIDRs)
		return settle(nil, false)
	case cur.DeletionTimestamp != nil:
		return failed(fmt.Errorf("ServiceCIDR %s is being deleted", ServiceCIDRName))
	case slices.Equal(cur.Spec.CIDRs, c.want):
		return settle(c.want, false)
	}
	// The API server keeps a ServiceCIDR's cidrs immutable but for adding a
	// second family; anything else is refused, and the old ranges stay.
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": cur.ResourceVersion},
		"spec": map[string]any{"cidrs": c.want}})
	_, err = client.Patch(rctx, ServiceCIDRName, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
	r.w.count(kindServiceCIDR, verbPatch, err)
	switch {
	case err == nil:
		r.log.Info("changed ServiceCIDR "+ServiceCIDRName, "from", cur.Spec.CIDRs, "to", c.want)
		return settle(c.want, true)
	case !retryable(err):
		r.log.Warn("cannot change ServiceCIDR "+ServiceCIDRName+"; it keeps its ranges", "cidrs", cur.Spec.CIDRs, "want", c.want, "err", err)
		return settle(cur.Spec.CIDRs, false)
	}
	return failed(err)
}
