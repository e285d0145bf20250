package importwriter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/registry"
)

// The import writer against a real kube-apiserver with the upstream MCS
// CRDs. Subtests share the server; each works in namespaces of its own and
// deletes what it made, since an authoritative state deletes every import
// it does not name, whatever the namespace.

var iwServiceImports = mcsv1beta1.SchemeGroupVersion.WithResource(mcsv1beta1.ServiceImportPluralName)

// iwAwait bounds every wait for the writer (no assertion on time: a
// failure to get there at all).
const iwAwait = 60 * time.Second

var iwExportedAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestImportWriter(t *testing.T) {
	c := kubetest.StartClusters(t, "east")[0]
	c.Apply(t, "../deploy/crds/serviceimports.yaml")
	f := &iwFixture{c: c}
	t.Run("ClusterSetIP", f.testClusterSetIP)
	t.Run("ManySlicesOneChange", f.testManySlices)
	t.Run("Headless", f.testHeadless)
	t.Run("RefusedIP", f.testRefusedIP)
	t.Run("Removal", f.testRemoval)
	t.Run("Authority", f.testAuthority)
	t.Run("UserObjects", f.testUserObjects)
	t.Run("BlockedReported", f.testBlockedReported)
	t.Run("Drift", f.testDrift)
}

type iwFixture struct{ c *kubetest.Cluster }

// iwWriter is a running writer and what it reported.
type iwWriter struct {
	w       *Writer
	epoch   uint64
	version uint64
	mu      sync.Mutex
	written [2]uint64
	// problems is the writer's last problem set (Config.Problems).
	problems []federation.ImportProblem
	wake     chan struct{}
	reads    atomic.Int64 // GETs the writer sent of one ServiceImport, Service or EndpointSlice (not lists or watches)
	stop     func()       // ends Run (leadership lost), and waits for it
}

// tlog routes the writer's logs to the test's (shown on failure or with -v).
type tlog struct{ t *testing.T }

func (l tlog) Write(b []byte) (int, error) {
	l.t.Helper()
	l.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// start runs a writer until the subtest ends.
func (f *iwFixture) start(t *testing.T, epoch uint64) *iwWriter {
	h := &iwWriter{epoch: epoch, wake: make(chan struct{}, 1)}
	cfg := DefaultConfig("east")
	cfg.BlockedRecheck = 100 * time.Millisecond
	cfg.Problems = func(ps []federation.ImportProblem) {
		h.mu.Lock()
		h.problems = ps
		h.mu.Unlock()
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	cfg.Written = func(e, v uint64) {
		h.mu.Lock()
		h.written = [2]uint64{e, v}
		h.mu.Unlock()
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	log := slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rc := rest.CopyConfig(f.c.Config)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && !r.URL.Query().Has("watch") && isObjectPath(r.URL.Path) {
				h.reads.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	client, err := kubeclient.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	h.w = New(client, cfg, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.w.Run(ctx) }()
	h.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(h.stop)
	return h
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// isObjectPath says whether an API path names one object of the kinds the
// writer writes, as .../namespaces/<ns>/<resource>/<name>[/status] does.
func isObjectPath(path string) bool {
	parts := strings.Split(strings.TrimSuffix(path, "/status"), "/")
	return len(parts) >= 4 && parts[len(parts)-4] == "namespaces" &&
		slices.Contains([]string{"serviceimports", "services", "endpointslices"}, parts[len(parts)-2])
}

// set gives the writer the next version of a state and waits until it says it is written.
func (h *iwWriter) set(t *testing.T, authoritative bool, cidrs []string, removed []registry.ServiceKey, imps ...*imports.Import) {
	t.Helper()
	h.version++
	st := federation.ImportState{Epoch: h.epoch, Version: h.version, Authoritative: authoritative, CIDRs: cidrs,
		Imports: map[registry.ServiceKey]*imports.Import{}, Removed: map[registry.ServiceKey]bool{}}
	for _, imp := range imps {
		st.Imports[imp.Service] = imp
	}
	for _, k := range removed {
		st.Removed[k] = true
	}
	start := time.Now()
	h.w.Set(st)
	want := [2]uint64{h.epoch, h.version}
	deadline := time.After(iwAwait)
	for {
		h.mu.Lock()
		got := h.written
		h.mu.Unlock()
		if got == want {
			t.Logf("state %d/%d written in %v", h.epoch, h.version, time.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-h.wake:
		case <-deadline:
			t.Fatalf("state %v not reported written (last report %v); stats %+v", want, got, h.w.Stats())
		}
	}
}

// iwDelta is what the writer wrote since before.
func iwDelta(before, after WriteStats) WriteStats {
	sub := func(a, b WriteCounts) WriteCounts {
		return WriteCounts{Create: b.Create - a.Create, Patch: b.Patch - a.Patch, Delete: b.Delete - a.Delete}
	}
	return WriteStats{
		ServiceImports: sub(before.ServiceImports, after.ServiceImports),
		EndpointSlices: sub(before.EndpointSlices, after.EndpointSlices),
		Services:       sub(before.Services, after.Services),
		ServiceCIDRs:   sub(before.ServiceCIDRs, after.ServiceCIDRs),
		Failed:         after.Failed - before.Failed,
	}
}

// namespace creates a namespace for the subtest; what the writer made in it
// (and any ServiceCIDR it made) is deleted when the subtest ends, since
// there is no garbage collector in the test cluster.
func (f *iwFixture) namespace(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := f.c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		all := metav1.ListOptions{}
		del := metav1.DeleteOptions{}
		if err := f.c.Client.DiscoveryV1().EndpointSlices(name).DeleteCollection(ctx, del, all); err != nil {
			t.Error(err)
		}
		if err := f.c.Dynamic.Resource(iwServiceImports).Namespace(name).DeleteCollection(ctx, del, all); err != nil {
			t.Error(err)
		}
		svcs, err := f.c.Client.CoreV1().Services(name).List(ctx, all)
		if err != nil {
			t.Error(err)
			return
		}
		for _, s := range svcs.Items {
			if err := f.c.Client.CoreV1().Services(name).Delete(ctx, s.Name, del); err != nil {
				t.Error(err)
			}
		}
	})
	return name
}

// Building imports the way the hub does: shards merged by a registry, then imports.Build.

type iwShardSpec struct {
	cluster  registry.ClusterID
	headless bool
	ports    []registry.ServicePort
	eps      []registry.Endpoint
	props    registry.Properties
}

func iwImport(t *testing.T, key registry.ServiceKey, ips []string, shards ...iwShardSpec) *imports.Import {
	t.Helper()
	reg := registry.New()
	for _, s := range shards {
		sh := &registry.Shard{Cluster: s.cluster, Service: key, ExportedAt: iwExportedAt, Headless: s.headless,
			Ports: slices.Clone(s.ports), Endpoints: slices.Clone(s.eps), Properties: s.props}
		sh.Normalize()
		if err := sh.Validate(registry.DefaultLimits()); err != nil {
			t.Fatalf("shard %s: %v", s.cluster, err)
		}
		reg, _ = reg.Apply(registry.Change{Cluster: s.cluster, Upserts: []*registry.Shard{sh}})
	}
	var addrs []netip.Addr
	for _, ip := range ips {
		addrs = append(addrs, netip.MustParseAddr(ip))
	}
	imp, skipped := imports.Build(reg.Service(key), nil, addrs)
	if imp == nil || len(skipped) > 0 {
		t.Fatalf("import %s: %v, skipped %v", key, imp, skipped)
	}
	return imp
}

var iwHTTP = []registry.ServicePort{{Name: "http", Port: 80, Protocol: registry.ProtocolTCP, AppProtocol: "http"},
	{Name: "grpc", Port: 9000, Protocol: registry.ProtocolTCP}}

// iwEndpoints are n ready endpoints 10.<net>.x.y serving http on 8080 and grpc on 9000.
func iwEndpoints(net byte, n int) []registry.Endpoint {
	eps := make([]registry.Endpoint, n)
	for i := range eps {
		eps[i] = registry.Endpoint{
			Addresses:  []netip.Addr{netip.AddrFrom4([4]byte{10, net, byte(i / 250), byte(1 + i%250)})},
			Ports:      []registry.EndpointPort{{Name: "http", Port: 8080}, {Name: "grpc", Port: 9000}},
			Locality:   registry.Locality{Region: "eu", Zone: fmt.Sprintf("eu-%d", i%3)},
			NodeName:   fmt.Sprintf("node-%d", i%5),
			Conditions: registry.Conditions{Ready: true, Serving: true},
		}
	}
	return eps
}

// Reading the cluster back.

func (f *iwFixture) serviceImport(t *testing.T, key registry.ServiceKey) (*mcsv1beta1.ServiceImport, bool) {
	t.Helper()
	u, err := f.c.Dynamic.Resource(iwServiceImports).Namespace(key.Namespace).Get(context.Background(), key.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var si mcsv1beta1.ServiceImport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &si); err != nil {
		t.Fatal(err)
	}
	return &si, true
}

func (f *iwFixture) derivedService(t *testing.T, key registry.ServiceKey) (*corev1.Service, bool) {
	t.Helper()
	svc, err := f.c.Client.CoreV1().Services(key.Namespace).Get(context.Background(), imports.DerivedServiceName(key), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return svc, true
}

// importedSlices lists the slices that name the import (the writer's and anyone else's), by name.
func (f *iwFixture) importedSlices(t *testing.T, key registry.ServiceKey) map[string]discoveryv1.EndpointSlice {
	t.Helper()
	list, err := f.c.Client.DiscoveryV1().EndpointSlices(key.Namespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: mcsv1beta1.LabelServiceName + "=" + key.Name})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]discoveryv1.EndpointSlice{}
	for _, es := range list.Items {
		out[es.Name] = es
	}
	return out
}

// versions is the resourceVersion of every ServiceImport, EndpointSlice and Service in the namespaces.
func (f *iwFixture) versions(t *testing.T, namespaces ...string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, ns := range namespaces {
		sis, err := f.c.Dynamic.Resource(iwServiceImports).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range sis.Items {
			out[ns+"/ServiceImport/"+u.GetName()] = u.GetResourceVersion()
		}
		ess, err := f.c.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, es := range ess.Items {
			out[ns+"/EndpointSlice/"+es.Name] = es.ResourceVersion
		}
		svcs, err := f.c.Client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range svcs.Items {
			out[ns+"/Service/"+s.Name] = s.ResourceVersion
		}
	}
	return out
}

func condition(si *mcsv1beta1.ServiceImport, typ string) *metav1.Condition {
	for i := range si.Status.Conditions {
		if si.Status.Conditions[i].Type == typ {
			return &si.Status.Conditions[i]
		}
	}
	return nil
}

func ownedBy(t *testing.T, what string, refs []metav1.OwnerReference, si *mcsv1beta1.ServiceImport) {
	t.Helper()
	if len(refs) != 1 || refs[0].Kind != "ServiceImport" || refs[0].Name != si.Name || refs[0].UID != si.UID ||
		refs[0].APIVersion != iwServiceImports.GroupVersion().String() {
		t.Errorf("%s: owner references %+v, want the ServiceImport %s (%s)", what, refs, si.Name, si.UID)
	}
}

// checkSlices checks the writer's slices of an import against what imports.Slices packs.
func (f *iwFixture) checkSlices(t *testing.T, imp *imports.Import, si *mcsv1beta1.ServiceImport, derived string) map[string]discoveryv1.EndpointSlice {
	t.Helper()
	got := f.importedSlices(t, imp.Service)
	var prev []imports.Slice
	for _, es := range got {
		s, ok := importedSlice(&es)
		if !ok {
			t.Fatalf("slice %s cannot be read back", es.Name)
		}
		prev = append(prev, s)
	}
	want := imports.Slices(imp, prev)
	if len(want) != len(got) {
		t.Fatalf("%d slices, want %d", len(got), len(want))
	}
	for _, s := range want {
		es, ok := got[s.Name]
		if !ok {
			t.Fatalf("slice %s missing", s.Name)
		}
		back, _ := importedSlice(&es)
		if !back.Equal(&s) {
			t.Errorf("slice %s holds %+v, want %+v", s.Name, back, s)
		}
		wantLabels := map[string]string{
			ManagedByLabel: ManagedByValue, mcsv1beta1.LabelServiceName: imp.Service.Name,
			mcsv1beta1.LabelSourceCluster: string(s.Cluster), discoveryv1.LabelManagedBy: ImportedSliceManager,
		}
		if derived != "" {
			wantLabels[discoveryv1.LabelServiceName] = derived
		}
		if !reflect.DeepEqual(es.Labels, wantLabels) {
			t.Errorf("slice %s labels %v, want %v", s.Name, es.Labels, wantLabels)
		}
		ownedBy(t, "slice "+s.Name, es.OwnerReferences, si)
		for _, e := range es.Endpoints {
			if e.NodeName != nil || e.TargetRef != nil {
				t.Errorf("slice %s endpoint %v names a node or pod of another cluster", s.Name, e.Addresses)
			}
		}
	}
	return got
}

// awaitSlices does something, then waits, event by event, until the
// cluster holds all of the import's endpoints in slices that imports.Slices
// keeps as they are: then the writer has nothing left to write for them.
func (f *iwFixture) awaitSlices(t *testing.T, imp *imports.Import, do func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), iwAwait)
	defer cancel()
	client := f.c.Client.DiscoveryV1().EndpointSlices(imp.Service.Namespace)
	sel := mcsv1beta1.LabelServiceName + "=" + imp.Service.Name
	list, err := client.List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	watch, err := client.Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	want := 0
	for _, src := range imp.Sources {
		want += len(src.Endpoints)
	}
	settled := func() bool {
		var prev []imports.Slice
		n := 0
		for _, es := range f.importedSlices(t, imp.Service) {
			s, ok := importedSlice(&es)
			if !ok {
				return false
			}
			prev = append(prev, s)
			n += len(s.Endpoints)
		}
		next := imports.Slices(imp, prev)
		slices.SortFunc(prev, func(a, b imports.Slice) int { return strings.Compare(a.Name, b.Name) })
		slices.SortFunc(next, func(a, b imports.Slice) int { return strings.Compare(a.Name, b.Name) })
		return n == want && slices.EqualFunc(prev, next, func(a, b imports.Slice) bool { return a.Equal(&b) })
	}
	do()
	for !settled() {
		select {
		case _, ok := <-watch.ResultChan():
			if !ok {
				t.Fatal("watch ended")
			}
		case <-ctx.Done():
			t.Fatalf("the slices of %s did not settle", imp.Service)
		}
	}
}

func (f *iwFixture) testClusterSetIP(t *testing.T) {
	ns := f.namespace(t, "iw-csip")
	t.Cleanup(func() {
		_ = f.c.Client.NetworkingV1().ServiceCIDRs().Delete(context.Background(), ServiceCIDRName, metav1.DeleteOptions{})
	})
	key := registry.ServiceKey{Namespace: ns, Name: "web"}
	props := registry.Properties{
		SessionAffinity: registry.SessionAffinityClientIP, SessionAffinityTimeout: 300,
		InternalTrafficPolicy: registry.InternalTrafficPolicyLocal, TrafficDistribution: "PreferSameZone",
		IPFamilies: []registry.IPFamily{registry.IPv4},
		Labels:     map[string]string{"example.com/team": "shop"}, Annotations: map[string]string{"example.com/owner": "alice"},
	}
	// build makes the import anew each time, as a hub's full state does (equal, not the same pointer).
	build := func(ip string, props registry.Properties) *imports.Import {
		return iwImport(t, key, []string{ip},
			iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(1, 3), props: props},
			iwShardSpec{cluster: "west", ports: iwHTTP, eps: iwEndpoints(2, 2), props: props})
	}
	imp := build("10.200.0.10", props)
	cidrs := []string{"10.200.0.0/16"}
	h := f.start(t, 7)
	h.set(t, false, cidrs, nil, imp)

	cidr, err := f.c.Client.NetworkingV1().ServiceCIDRs().Get(context.Background(), ServiceCIDRName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cidr.Spec.CIDRs, cidrs) || cidr.Labels[ManagedByLabel] != ManagedByValue {
		t.Errorf("ServiceCIDR %s: cidrs %v labels %v", cidr.Name, cidr.Spec.CIDRs, cidr.Labels)
	}

	si, ok := f.serviceImport(t, key)
	if !ok {
		t.Fatal("no ServiceImport")
	}
	derived := imports.DerivedServiceName(key)
	wantSpec := mcsv1beta1.ServiceImportSpec{
		Ports: []mcsv1beta1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, AppProtocol: iwPtr("http"), Port: 80},
			{Name: "grpc", Protocol: corev1.ProtocolTCP, Port: 9000}},
		IPs: []string{"10.200.0.10"}, Type: mcsv1beta1.ClusterSetIP,
		SessionAffinity:       corev1.ServiceAffinityClientIP,
		SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: iwPtr[int32](300)}},
		IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol},
		InternalTrafficPolicy: iwPtr(corev1.ServiceInternalTrafficPolicyLocal),
		TrafficDistribution:   iwPtr("PreferSameZone"),
	}
	if !reflect.DeepEqual(si.Spec, wantSpec) {
		t.Errorf("ServiceImport spec\n%+v\nwant\n%+v", si.Spec, wantSpec)
	}
	if want := map[string]string{"example.com/team": "shop", ManagedByLabel: ManagedByValue}; !reflect.DeepEqual(si.Labels, want) {
		t.Errorf("ServiceImport labels %v, want %v", si.Labels, want)
	}
	if want := map[string]string{"example.com/owner": "alice", DerivedServiceAnnotation: derived}; !reflect.DeepEqual(si.Annotations, want) {
		t.Errorf("ServiceImport annotations %v, want %v", si.Annotations, want)
	}
	if want := []mcsv1beta1.ClusterStatus{{Cluster: "east"}, {Cluster: "west"}}; !reflect.DeepEqual(si.Status.Clusters, want) {
		t.Errorf("ServiceImport clusters %v, want %v", si.Status.Clusters, want)
	}
	if c := condition(si, ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonReady {
		t.Errorf("Ready condition %+v", c)
	}
	if c := condition(si, ConditionClusterSetIP); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonAllocated {
		t.Errorf("ClusterSetIP condition %+v", c)
	}

	svc, ok := f.derivedService(t, key)
	if !ok {
		t.Fatal("no derived Service")
	}
	wantPorts := []corev1.ServicePort{
		{Name: "http", Protocol: corev1.ProtocolTCP, AppProtocol: iwPtr("http"), Port: 80, TargetPort: intstr.FromInt32(80)},
		{Name: "grpc", Protocol: corev1.ProtocolTCP, Port: 9000, TargetPort: intstr.FromInt32(9000)},
	}
	switch {
	case svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Spec.ClusterIP != "10.200.0.10" || len(svc.Spec.Selector) > 0:
		t.Errorf("derived Service type %s clusterIP %s selector %v", svc.Spec.Type, svc.Spec.ClusterIP, svc.Spec.Selector)
	case !reflect.DeepEqual(svc.Spec.Ports, wantPorts):
		t.Errorf("derived Service ports %+v, want %+v", svc.Spec.Ports, wantPorts)
	case svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || *svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != 300 ||
		*svc.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal || deref(svc.Spec.TrafficDistribution) != "PreferSameZone" ||
		!slices.Equal(svc.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol}):
		t.Errorf("derived Service does not mirror the import: %+v", svc.Spec)
	case svc.Labels[ManagedByLabel] != ManagedByValue:
		t.Errorf("derived Service labels %v", svc.Labels)
	}
	ownedBy(t, "derived Service", svc.OwnerReferences, si)
	got := f.checkSlices(t, imp, si, derived)
	if len(got) != 2 {
		t.Errorf("%d slices, want one per source cluster", len(got))
	}
	for _, es := range got {
		for _, e := range es.Endpoints {
			if deref(e.Zone) == "" || !deref(e.Conditions.Ready) {
				t.Errorf("slice %s endpoint %v: zone %q ready %v", es.Name, e.Addresses, deref(e.Zone), deref(e.Conditions.Ready))
			}
		}
	}
	t.Logf("first state: %+v", h.w.Stats())

	// The same state again (a new version, e.g. after a reconnect): nothing to write.
	before, rvs := h.w.Stats(), f.versions(t, ns)
	h.set(t, false, cidrs, nil, build("10.200.0.10", props))
	if d := iwDelta(before, h.w.Stats()); d.Total() != 0 || d.Failed != 0 {
		t.Errorf("the same state again wrote %+v", d)
	}
	if after := f.versions(t, ns); !reflect.DeepEqual(after, rvs) {
		t.Errorf("resourceVersions changed:\n%v\n%v", rvs, after)
	}

	// A new writer (a restart, or a new leader) with the same state: nothing to write.
	h.stop()
	h2 := f.start(t, 8)
	h2.set(t, true, cidrs, nil, build("10.200.0.10", props))
	if s := h2.w.Stats(); s.Total() != 0 || s.Failed != 0 {
		t.Errorf("a new writer wrote %+v", s)
	}
	if after := f.versions(t, ns); !reflect.DeepEqual(after, rvs) {
		t.Errorf("resourceVersions changed:\n%v\n%v", rvs, after)
	}

	// The export's labels change and its annotations go: one ServiceImport patch, which removes them.
	props.Labels, props.Annotations = map[string]string{"example.com/tier": "front"}, nil
	before = h2.w.Stats()
	h2.set(t, true, cidrs, nil, build("10.200.0.10", props))
	if d := iwDelta(before, h2.w.Stats()); d != (WriteStats{ServiceImports: WriteCounts{Patch: 1}}) {
		t.Errorf("a label change wrote %+v, want one ServiceImport patch", d)
	}
	si, _ = f.serviceImport(t, key)
	if want := map[string]string{"example.com/tier": "front", ManagedByLabel: ManagedByValue}; !reflect.DeepEqual(si.Labels, want) {
		t.Errorf("ServiceImport labels %v, want %v", si.Labels, want)
	}
	if want := map[string]string{DerivedServiceAnnotation: derived}; !reflect.DeepEqual(si.Annotations, want) {
		t.Errorf("ServiceImport annotations %v, want %v", si.Annotations, want)
	}

	// The hub's IP changes (clusterIP is immutable): the derived Service is made anew with it.
	before = h2.w.Stats()
	h2.set(t, true, cidrs, nil, build("10.200.0.20", props))
	d := iwDelta(before, h2.w.Stats())
	if d.Services != (WriteCounts{Create: 1, Delete: 1}) || d.EndpointSlices.Total() != 0 || d.Failed != 0 {
		t.Errorf("an IP change wrote %+v, want the derived Service deleted and created", d)
	}
	if svc, _ := f.derivedService(t, key); svc == nil || svc.Spec.ClusterIP != "10.200.0.20" {
		t.Errorf("derived Service after the IP change: %+v", svc)
	}
	si, _ = f.serviceImport(t, key)
	if !slices.Equal(si.Spec.IPs, []string{"10.200.0.20"}) {
		t.Errorf("ServiceImport ips %v after the IP change", si.Spec.IPs)
	}
	if c := condition(si, ConditionClusterSetIP); c == nil || c.Reason != ReasonAllocated || !strings.Contains(c.Message, "10.200.0.20") {
		t.Errorf("ClusterSetIP condition %+v", c)
	}
}

func (f *iwFixture) testManySlices(t *testing.T) {
	ns := f.namespace(t, "iw-many")
	key := registry.ServiceKey{Namespace: ns, Name: "big"}
	eps := iwEndpoints(3, 250)
	imp := iwImport(t, key, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: eps})
	h := f.start(t, 1)
	h.set(t, false, nil, nil, imp)
	// Two reads: the derived Service's name before it is created (a create
	// under a taken name would still allocate an IP), and the ServiceImport
	// to write the derived Service's IPs into it. Not its status: the writer
	// made it without one.
	if n := h.reads.Load(); n != 2 {
		t.Errorf("writing a new import read %d objects, want 2", n)
	}
	si, _ := f.serviceImport(t, key)
	got := f.checkSlices(t, imp, si, imports.DerivedServiceName(key))
	total := 0
	for _, es := range got {
		if len(es.Endpoints) > imports.MaxEndpointsPerSlice {
			t.Errorf("slice %s has %d endpoints", es.Name, len(es.Endpoints))
		}
		total += len(es.Endpoints)
	}
	if len(got) != 3 || total != 250 {
		t.Errorf("%d slices with %d endpoints, want 3 with 250", len(got), total)
	}
	if c := condition(si, ConditionClusterSetIP); c == nil || c.Reason != ReasonClusterLocalIP {
		t.Errorf("ClusterSetIP condition %+v, want %s (the hub allocated none)", c, ReasonClusterLocalIP)
	}

	// One endpoint stops being ready: one slice patch, nothing else.
	eps = slices.Clone(eps)
	eps[137].Conditions = registry.Conditions{Serving: true, Terminating: true}
	imp2 := iwImport(t, key, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: eps})
	before, rvs, reads := h.w.Stats(), f.versions(t, ns), h.reads.Load()
	h.set(t, false, nil, nil, imp2)
	d := iwDelta(before, h.w.Stats())
	if d.Total() != 1 || d.EndpointSlices.Patch != 1 || d.Failed != 0 {
		t.Errorf("one endpoint change wrote %+v, want one EndpointSlice patch", d)
	}
	if n := h.reads.Load() - reads; n != 0 {
		t.Errorf("one endpoint change read %d objects, want none (the kept sums say the rest is as wanted)", n)
	}
	after := f.versions(t, ns)
	changed := 0
	for k, v := range after {
		if rvs[k] != v {
			changed++
		}
	}
	if changed != 1 || len(after) != len(rvs) {
		t.Errorf("%d objects changed, want 1", changed)
	}
	f.checkSlices(t, imp2, si, imports.DerivedServiceName(key))

	// Someone deletes one of the writer's slices: the writer puts the
	// endpoints back (imports.Slices repacks them: they fill the slice with
	// room first), and deletes nothing.
	var names []string
	for name := range got {
		names = append(names, name)
	}
	slices.Sort(names)
	victim := names[0]
	before = h.w.Stats()
	start := time.Now()
	f.awaitSlices(t, imp2, func() {
		if err := f.c.Client.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), victim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	d = iwDelta(before, h.w.Stats())
	t.Logf("slice %s deleted by hand: endpoints back after %v, with %+v", victim, time.Since(start).Round(time.Millisecond), d.EndpointSlices)
	if d.EndpointSlices.Delete != 0 || d.EndpointSlices.Total() == 0 || d.Total() != d.EndpointSlices.Total() {
		t.Errorf("restoring a slice wrote %+v", d)
	}
	f.checkSlices(t, imp2, si, imports.DerivedServiceName(key))
}

func (f *iwFixture) testHeadless(t *testing.T) {
	ns := f.namespace(t, "iw-headless")
	key := registry.ServiceKey{Namespace: ns, Name: "db"}
	eps := iwEndpoints(4, 3)
	for i := range eps {
		eps[i].Hostname = fmt.Sprintf("db-%d", i)
		eps[i].Ports = []registry.EndpointPort{{Name: "pg", Port: 5432}}
	}
	ports := []registry.ServicePort{{Name: "pg", Port: 5432, Protocol: registry.ProtocolTCP}}
	imp := iwImport(t, key, []string{"10.200.0.12"}, iwShardSpec{cluster: "east", headless: true, ports: ports, eps: eps})
	// An import into a namespace this cluster does not have is skipped, and does not hold the state back.
	ghost := iwImport(t, registry.ServiceKey{Namespace: "iw-absent", Name: "db"}, nil,
		iwShardSpec{cluster: "east", headless: true, ports: ports, eps: eps})
	h := f.start(t, 1)
	h.set(t, false, nil, nil, imp, ghost)
	if _, ok := f.serviceImport(t, ghost.Service); ok {
		t.Error("an import was written into a namespace that does not exist")
	}
	si, ok := f.serviceImport(t, key)
	if !ok {
		t.Fatal("no ServiceImport")
	}
	if si.Spec.Type != mcsv1beta1.Headless || len(si.Spec.IPs) > 0 || si.Annotations[DerivedServiceAnnotation] != "" {
		t.Errorf("headless ServiceImport: type %s ips %v annotations %v", si.Spec.Type, si.Spec.IPs, si.Annotations)
	}
	if condition(si, ConditionClusterSetIP) != nil {
		t.Error("a headless import has a ClusterSetIP condition")
	}
	if c := condition(si, ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready condition %+v", c)
	}
	if _, ok := f.derivedService(t, key); ok {
		t.Error("a headless import has a derived Service")
	}
	var hostnames []string
	for _, es := range f.checkSlices(t, imp, si, "") {
		for _, e := range es.Endpoints {
			hostnames = append(hostnames, deref(e.Hostname))
		}
	}
	slices.Sort(hostnames)
	if want := []string{"db-0", "db-1", "db-2"}; !slices.Equal(hostnames, want) {
		t.Errorf("hostnames %v, want %v", hostnames, want)
	}
}

func (f *iwFixture) testRefusedIP(t *testing.T) {
	ns := f.namespace(t, "iw-refused")
	key := registry.ServiceKey{Namespace: ns, Name: "web"}
	// 10.201.0.7 is in no range of the cluster (and no ServiceCIDR is made: the state has no CIDRs).
	build := func() *imports.Import {
		return iwImport(t, key, []string{"10.201.0.7"}, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(5, 2)})
	}
	imp := build()
	h := f.start(t, 1)
	h.set(t, false, nil, nil, imp)
	svc, ok := f.derivedService(t, key)
	if !ok {
		t.Fatal("no derived Service")
	}
	local := netip.MustParseAddr(svc.Spec.ClusterIP)
	if !netip.MustParsePrefix(kubetest.ServiceClusterIPRange).Contains(local) {
		t.Errorf("derived Service has %s, want an IP of the cluster's range %s", local, kubetest.ServiceClusterIPRange)
	}
	si, _ := f.serviceImport(t, key)
	if !slices.Equal(si.Spec.IPs, []string{local.String()}) {
		t.Errorf("ServiceImport ips %v, want the cluster's %s", si.Spec.IPs, local)
	}
	c := condition(si, ConditionClusterSetIP)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonClusterLocalIP || !strings.Contains(c.Message, "10.201.0.7") {
		t.Errorf("ClusterSetIP condition %+v", c)
	} else {
		t.Logf("ClusterSetIP condition: %s", c.Message)
	}
	if c := condition(si, ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready condition %+v", c)
	}
	f.checkSlices(t, imp, si, imports.DerivedServiceName(key))

	// The refusal stands: the same state again writes nothing.
	before, rvs := h.w.Stats(), f.versions(t, ns)
	h.set(t, false, nil, nil, build())
	if d := iwDelta(before, h.w.Stats()); d.Total() != 0 || d.Failed != 0 {
		t.Errorf("the same state again wrote %+v", d)
	}
	if after := f.versions(t, ns); !reflect.DeepEqual(after, rvs) {
		t.Errorf("resourceVersions changed:\n%v\n%v", rvs, after)
	}
}

func (f *iwFixture) testRemoval(t *testing.T) {
	ns := f.namespace(t, "iw-remove")
	a := iwImport(t, registry.ServiceKey{Namespace: ns, Name: "a"}, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(6, 2)})
	b := iwImport(t, registry.ServiceKey{Namespace: ns, Name: "b"}, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(7, 2)})
	h := f.start(t, 1)
	h.set(t, false, nil, nil, a, b)
	rvs := f.versions(t, ns)

	before := h.w.Stats()
	h.set(t, false, nil, []registry.ServiceKey{a.Service}, b)
	d := iwDelta(before, h.w.Stats())
	if want := (WriteStats{ServiceImports: WriteCounts{Delete: 1}, EndpointSlices: WriteCounts{Delete: 1},
		Services: WriteCounts{Delete: 1}}); d != want {
		t.Errorf("removing a wrote %+v, want %+v", d, want)
	}
	if _, ok := f.serviceImport(t, a.Service); ok {
		t.Error("a's ServiceImport is still there")
	}
	if _, ok := f.derivedService(t, a.Service); ok {
		t.Error("a's derived Service is still there")
	}
	if n := len(f.importedSlices(t, a.Service)); n != 0 {
		t.Errorf("a still has %d slices", n)
	}
	for k, v := range f.versions(t, ns) {
		if rvs[k] != v {
			t.Errorf("%s changed", k)
		}
	}
}

func (f *iwFixture) testAuthority(t *testing.T) {
	ns := f.namespace(t, "iw-authority")
	aKey := registry.ServiceKey{Namespace: ns, Name: "a"}
	both := iwImport(t, aKey, nil,
		iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(8, 2)},
		iwShardSpec{cluster: "west", ports: iwHTTP, eps: iwEndpoints(9, 2)})
	eastOnly := iwImport(t, aKey, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(8, 2)})
	b := iwImport(t, registry.ServiceKey{Namespace: ns, Name: "b"}, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(10, 2)})
	h := f.start(t, 1)
	h.set(t, true, nil, nil, both, b)
	westSlices := func() int {
		n := 0
		for _, es := range f.importedSlices(t, aKey) {
			if es.Labels[mcsv1beta1.LabelSourceCluster] == "west" {
				n++
			}
		}
		return n
	}
	if westSlices() != 1 {
		t.Fatalf("%d slices of west, want 1", westSlices())
	}

	// A hub that has not heard from every cluster: b and west are missing, not removed.
	before := h.w.Stats()
	h.set(t, false, nil, nil, eastOnly)
	d := iwDelta(before, h.w.Stats())
	if d.ServiceImports.Delete+d.EndpointSlices.Delete+d.Services.Delete != 0 {
		t.Errorf("a non-authoritative state deleted: %+v", d)
	}
	if _, ok := f.serviceImport(t, b.Service); !ok {
		t.Error("b's ServiceImport was deleted")
	}
	if n := len(f.importedSlices(t, b.Service)); n != 1 {
		t.Errorf("b has %d slices, want 1", n)
	}
	if _, ok := f.derivedService(t, b.Service); !ok {
		t.Error("b's derived Service was deleted")
	}
	if westSlices() != 1 {
		t.Errorf("%d slices of west, want 1 kept", westSlices())
	}
	si, _ := f.serviceImport(t, aKey)
	if want := []mcsv1beta1.ClusterStatus{{Cluster: "east"}}; !reflect.DeepEqual(si.Status.Clusters, want) {
		t.Errorf("a's clusters %v, want %v", si.Status.Clusters, want)
	}

	// An authoritative state: the leftovers go.
	before = h.w.Stats()
	h.set(t, true, nil, nil, eastOnly)
	d = iwDelta(before, h.w.Stats())
	if want := (WriteStats{ServiceImports: WriteCounts{Delete: 1}, EndpointSlices: WriteCounts{Delete: 2},
		Services: WriteCounts{Delete: 1}}); d != want {
		t.Errorf("the authoritative state wrote %+v, want %+v", d, want)
	}
	if _, ok := f.serviceImport(t, b.Service); ok {
		t.Error("b's ServiceImport is still there")
	}
	if westSlices() != 0 {
		t.Errorf("%d slices of west left", westSlices())
	}
	f.checkSlices(t, eastOnly, si, imports.DerivedServiceName(aKey))
}

func (f *iwFixture) testUserObjects(t *testing.T) {
	ns := f.namespace(t, "iw-user")
	ctx := context.Background()
	web := iwImport(t, registry.ServiceKey{Namespace: ns, Name: "web"}, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(11, 2)})
	api := iwImport(t, registry.ServiceKey{Namespace: ns, Name: "api"}, nil,
		iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(12, 2)},
		iwShardSpec{cluster: "west", ports: iwHTTP, eps: iwEndpoints(13, 2)})
	apiDerived := imports.DerivedServiceName(api.Service)
	var eastSlice string
	for _, s := range imports.Slices(api, nil) {
		if s.Cluster == "east" {
			eastSlice = s.Name
		}
	}

	// A user's ServiceImport named like an import; an EndpointSlice with the
	// name of one the writer would make; one that names the import; and a
	// Service with the derived Service's name. None has the writer's label.
	userSI := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": iwServiceImports.GroupVersion().String(), "kind": "ServiceImport",
		"metadata": map[string]any{"name": "web", "namespace": ns, "labels": map[string]any{"team": "mine"}},
		"spec":     map[string]any{"type": "ClusterSetIP", "ports": []any{map[string]any{"port": int64(80), "protocol": "TCP"}}},
	}}
	if _, err := f.c.Dynamic.Resource(iwServiceImports).Namespace(ns).Create(ctx, userSI, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	userSlice := func(name string, labels map[string]string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.99.0.1"}}}}
	}
	for _, es := range []*discoveryv1.EndpointSlice{
		userSlice(eastSlice, nil),
		userSlice("api-mine", map[string]string{mcsv1beta1.LabelServiceName: "api", mcsv1beta1.LabelSourceCluster: "east"}),
		userSlice("web-mine", map[string]string{mcsv1beta1.LabelServiceName: "web"}),
	} {
		if _, err := f.c.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	userSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: apiDerived, Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "mine"}, Ports: []corev1.ServicePort{{Port: 8080}}}}
	if _, err := f.c.Client.CoreV1().Services(ns).Create(ctx, userSvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	users := f.versions(t, ns)

	h := f.start(t, 1)
	h.set(t, true, nil, nil, web, api)
	unchanged := func() {
		t.Helper()
		now := f.versions(t, ns)
		for k, v := range users {
			if now[k] != v {
				t.Errorf("the user's %s was changed or deleted", k)
			}
		}
	}
	unchanged()
	// web: the user's ServiceImport stands; nothing of the writer's for it.
	if _, ok := f.derivedService(t, web.Service); ok {
		t.Error("web got a derived Service under the user's ServiceImport")
	}
	for name, es := range f.importedSlices(t, web.Service) {
		if owned(&es) {
			t.Errorf("web got slice %s under the user's ServiceImport", name)
		}
	}
	// api: the writer's ServiceImport says what is in the way; west's slice
	// is written, without kubernetes.io/service-name (the user's Service
	// must not get the import's endpoints).
	si, ok := f.serviceImport(t, api.Service)
	if !ok || si.Labels[ManagedByLabel] != ManagedByValue {
		t.Fatalf("api's ServiceImport: %v", si)
	}
	c := condition(si, ConditionReady)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonNameInUse ||
		!strings.Contains(c.Message, eastSlice) || !strings.Contains(c.Message, apiDerived) {
		t.Errorf("api's Ready condition %+v", c)
	} else {
		t.Logf("Ready condition: %s", c.Message)
	}
	if len(si.Spec.IPs) > 0 || condition(si, ConditionClusterSetIP) != nil {
		t.Errorf("api advertises IPs %v (the derived Service is the user's)", si.Spec.IPs)
	}
	var ours []string
	for name, es := range f.importedSlices(t, api.Service) {
		if !owned(&es) {
			continue
		}
		ours = append(ours, name)
		if es.Labels[mcsv1beta1.LabelSourceCluster] != "west" || es.Labels[discoveryv1.LabelServiceName] != "" {
			t.Errorf("slice %s labels %v", name, es.Labels)
		}
	}
	if len(ours) != 1 {
		t.Errorf("the writer's slices of api: %v, want west's", ours)
	}

	// Nothing to import any more: only the writer's objects go.
	h.set(t, true, nil, nil)
	unchanged()
	if _, ok := f.serviceImport(t, api.Service); ok {
		t.Error("api's ServiceImport is still there")
	}
	for name, es := range f.importedSlices(t, api.Service) {
		if owned(&es) {
			t.Errorf("slice %s is still there", name)
		}
	}
}

// awaitProblems waits until the writer's problem set is as cond wants.
func (h *iwWriter) awaitProblems(t *testing.T, what string, cond func(map[registry.ServiceKey]federation.ImportProblem) bool) map[registry.ServiceKey]federation.ImportProblem {
	t.Helper()
	deadline := time.After(iwAwait)
	for {
		h.mu.Lock()
		got := map[registry.ServiceKey]federation.ImportProblem{}
		for _, p := range h.problems {
			got[p.Service] = p
		}
		h.mu.Unlock()
		if cond(got) {
			return got
		}
		select {
		case <-h.wake:
		case <-deadline:
			t.Fatalf("problems never %s: %+v", what, got)
		}
	}
}

// testBlockedReported: an import blocked by a user's own ServiceImport or
// Service is reported (Problems) with the reason and the object; once the
// user's object goes, the writer writes the import (it checks again, not
// watching objects it does not own) and the problem clears.
func (f *iwFixture) testBlockedReported(t *testing.T) {
	ns := f.namespace(t, "iw-blocked")
	ctx := context.Background()
	web := iwImport(t, registry.ServiceKey{Namespace: ns, Name: "web"}, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(15, 2)})
	api := iwImport(t, registry.ServiceKey{Namespace: ns, Name: "api"}, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(16, 2)})
	apiDerived := imports.DerivedServiceName(api.Service)
	userSI := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": iwServiceImports.GroupVersion().String(), "kind": "ServiceImport",
		"metadata": map[string]any{"name": "web", "namespace": ns},
		"spec":     map[string]any{"type": "ClusterSetIP", "ports": []any{map[string]any{"port": int64(80), "protocol": "TCP"}}},
	}}
	if _, err := f.c.Dynamic.Resource(iwServiceImports).Namespace(ns).Create(ctx, userSI, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	userSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: apiDerived, Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "mine"}, Ports: []corev1.ServicePort{{Port: 8080}}}}
	if _, err := f.c.Client.CoreV1().Services(ns).Create(ctx, userSvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	h := f.start(t, 1)
	h.set(t, true, nil, nil, web, api)
	got := h.awaitProblems(t, "both blocked", func(m map[registry.ServiceKey]federation.ImportProblem) bool { return len(m) == 2 })
	if p := got[web.Service]; p.Reason != federation.ReasonBlockedByServiceImport || !strings.Contains(p.Message, "ServiceImport web") {
		t.Errorf("web's problem %+v", p)
	}
	if p := got[api.Service]; p.Reason != federation.ReasonBlockedByService || !strings.Contains(p.Message, "Service "+apiDerived) {
		t.Errorf("api's problem %+v", p)
	}

	// The user's ServiceImport goes: web is written, its problem clears.
	if err := f.c.Dynamic.Resource(iwServiceImports).Namespace(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.awaitProblems(t, "without web", func(m map[registry.ServiceKey]federation.ImportProblem) bool {
		_, blocked := m[web.Service]
		return !blocked && len(m) == 1
	})
	if si, ok := f.serviceImport(t, web.Service); !ok || !owned(si) {
		t.Errorf("web's ServiceImport after the user's went: %v", si)
	}
	// The user's Service goes: api gets its derived Service, nothing is blocked.
	if err := f.c.Client.CoreV1().Services(ns).Delete(ctx, apiDerived, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.awaitProblems(t, "empty", func(m map[registry.ServiceKey]federation.ImportProblem) bool { return len(m) == 0 })
	if svc, ok := f.derivedService(t, api.Service); !ok || !owned(svc) {
		t.Errorf("api's derived Service after the user's went: %v", svc)
	}
}

// testDrift: what someone else changes of the writer's objects is put back
// (the writer's caches keep all it compares), and what it does not own is
// left alone, without writes.
func (f *iwFixture) testDrift(t *testing.T) {
	ns := f.namespace(t, "iw-drift")
	ctx := context.Background()
	key := registry.ServiceKey{Namespace: ns, Name: "web"}
	props := registry.Properties{Labels: map[string]string{"example.com/team": "shop"}}
	imp := iwImport(t, key, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(14, 3), props: props})
	derived := imports.DerivedServiceName(key)
	h := f.start(t, 1)
	h.set(t, true, nil, nil, imp)
	si, _ := f.serviceImport(t, key)
	wantSpec := si.Spec
	svc, _ := f.derivedService(t, key)
	wantPorts := svc.Spec.Ports
	var slice string
	for name := range f.checkSlices(t, imp, si, derived) {
		slice = name
	}

	patch := func(what string, do func() error) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	merge := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	sis := f.c.Dynamic.Resource(iwServiceImports).Namespace(ns)
	patch("ServiceImport", func() error {
		_, err := sis.Patch(ctx, key.Name, types.MergePatchType, merge(map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"example.com/team": nil}},
			"spec":     map[string]any{"ports": []any{map[string]any{"port": 81, "protocol": "TCP"}}},
		}), metav1.PatchOptions{})
		return err
	})
	patch("ServiceImport status", func() error {
		_, err := sis.Patch(ctx, key.Name, types.MergePatchType, merge(map[string]any{"status": map[string]any{"conditions": nil}}),
			metav1.PatchOptions{}, "status")
		return err
	})
	patch("derived Service", func() error {
		_, err := f.c.Client.CoreV1().Services(ns).Patch(ctx, derived, types.MergePatchType, merge(map[string]any{
			"spec": map[string]any{"ports": []any{map[string]any{"name": "http", "port": 8081, "protocol": "TCP"}}},
		}), metav1.PatchOptions{})
		return err
	})
	patch("EndpointSlice", func() error {
		_, err := f.c.Client.DiscoveryV1().EndpointSlices(ns).Patch(ctx, slice, types.JSONPatchType, []byte(
			`[{"op": "replace", "path": "/endpoints/0/conditions/ready", "value": false},
			  {"op": "replace", "path": "/metadata/labels/endpointslice.kubernetes.io~1managed-by", "value": "someone"}]`),
			metav1.PatchOptions{})
		return err
	})
	deadline := time.Now().Add(iwAwait)
	for {
		si, _ = f.serviceImport(t, key)
		svc, _ = f.derivedService(t, key)
		es, err := f.c.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, slice, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		restored := reflect.DeepEqual(si.Spec, wantSpec) && si.Labels["example.com/team"] == "shop" &&
			condition(si, ConditionReady) != nil && reflect.DeepEqual(svc.Spec.Ports, wantPorts) &&
			deref(es.Endpoints[0].Conditions.Ready) && es.Labels[discoveryv1.LabelManagedBy] == ImportedSliceManager
		if restored {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not put back: ServiceImport %+v %v %+v; Service ports %+v; slice %v %+v",
				si.Spec, si.Labels, si.Status.Conditions, svc.Spec.Ports, es.Labels, es.Endpoints[0].Conditions)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.checkSlices(t, imp, si, derived)

	// What the writer does not own: left as it is, and no write.
	before := h.w.Stats()
	patch("EndpointSlice label", func() error {
		_, err := f.c.Client.DiscoveryV1().EndpointSlices(ns).Patch(ctx, slice, types.MergePatchType, merge(map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"example.com/mine": "x"}, "annotations": map[string]any{"example.com/mine": "x"}},
		}), metav1.PatchOptions{})
		return err
	})
	patch("derived Service annotation", func() error {
		_, err := f.c.Client.CoreV1().Services(ns).Patch(ctx, derived, types.MergePatchType, merge(map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"example.com/mine": "x"}, "annotations": map[string]any{"example.com/mine": "x"}},
		}), metav1.PatchOptions{})
		return err
	})
	rvs := f.versions(t, ns)
	time.Sleep(time.Second) // the writer has seen both changes
	h.set(t, true, nil, nil, iwImport(t, key, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: iwEndpoints(14, 3), props: props}))
	if d := iwDelta(before, h.w.Stats()); d.Total() != 0 || d.Failed != 0 {
		t.Errorf("others' labels and annotations made the writer write %+v", d)
	}
	if after := f.versions(t, ns); !reflect.DeepEqual(after, rvs) {
		t.Errorf("resourceVersions changed:\n%v\n%v", rvs, after)
	}

	// A Service of Nave's for this import under another name (a stray) is
	// deleted; the derived Service stays as it is.
	stray := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-stray", Namespace: ns, Labels: map[string]string{
		ManagedByLabel: ManagedByValue, mcsv1beta1.LabelServiceName: key.Name}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	created, err := f.c.Client.CoreV1().Services(ns).Create(ctx, stray, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, iwAwait)
	defer cancel()
	w, err := f.c.Client.CoreV1().Services(ns).Watch(wctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + stray.Name, ResourceVersion: created.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	deleted := false
	for ev := range w.ResultChan() { // closed when wctx ends
		if ev.Type == watch.Deleted {
			deleted = true
			break
		}
	}
	if !deleted {
		t.Fatal("the stray Service is still there")
	}
	if now, _ := f.derivedService(t, key); now == nil || now.ResourceVersion != rvs[ns+"/Service/"+derived] {
		t.Errorf("the derived Service changed with its stray: %+v", now)
	}
}

func iwPtr[T any](v T) *T { return &v }

// TestImportWriterWithoutStatusSubresource: with a ServiceImport CRD that
// has no status subresource (an older one), the writer writes the status
// with the rest of the object; a status write then counts as a change of
// the object (its generation grows), and yet an endpoint change, and the one
// after it, write only their slice.
func TestImportWriterWithoutStatusSubresource(t *testing.T) {
	crd, err := os.ReadFile("../deploy/crds/serviceimports.yaml")
	if err != nil {
		t.Fatal(err)
	}
	noStatus := regexp.MustCompile(`(?m)^ *subresources:\n *status: \{\}\n`).ReplaceAll(crd, nil)
	if bytes.Equal(noStatus, crd) || bytes.Contains(noStatus, []byte("subresources")) {
		t.Fatal("deploy/crds/serviceimports.yaml: no status subresource to leave out")
	}
	path := filepath.Join(t.TempDir(), "serviceimports.yaml")
	if err := os.WriteFile(path, noStatus, 0o644); err != nil {
		t.Fatal(err)
	}
	c := kubetest.StartClusters(t, "nostatus")[0]
	c.Apply(t, path)
	f := &iwFixture{c: c}
	ns := f.namespace(t, "iw-nostatus")
	key := registry.ServiceKey{Namespace: ns, Name: "web"}
	eps := iwEndpoints(21, 3)
	h := f.start(t, 1)
	h.set(t, false, nil, nil, iwImport(t, key, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: eps}))
	si, _ := f.serviceImport(t, key)
	// Without the subresource indeed: the status write made a new generation.
	if c := condition(si, ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != 0 || si.Generation < 2 {
		t.Fatalf("Ready condition %+v at generation %d, want one with no observed generation, the generation past 1", c, si.Generation)
	}
	for i := range 2 {
		eps = slices.Clone(eps)
		eps[i].Conditions = registry.Conditions{Serving: true, Terminating: true}
		before := h.w.Stats()
		h.set(t, false, nil, nil, iwImport(t, key, nil, iwShardSpec{cluster: "east", ports: iwHTTP, eps: eps}))
		if d := iwDelta(before, h.w.Stats()); d.Total() != 1 || d.EndpointSlices.Patch != 1 || d.Failed != 0 {
			t.Errorf("endpoint change %d wrote %+v, want one EndpointSlice patch", i+1, d)
		}
	}
}
