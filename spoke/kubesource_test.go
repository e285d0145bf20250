package spoke

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/importwriter"
	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/internal/mcsstatus"
	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/registry"
)

// kubeFixture is a real API server with Nave's CRD and the spoke's RBAC
// applied; the source under test runs as the spoke's service account.
type kubeFixture struct {
	t       *testing.T
	cluster *kubetest.Cluster
	kc      kubernetes.Interface
	// exports is the ServiceExport version the test reads and writes.
	exports schema.GroupVersionResource
}

func newKubeFixture(t *testing.T, withCRD bool) *kubeFixture {
	c := kubetest.StartClusters(t, "east")[0]
	if withCRD {
		c.Apply(t, "../deploy/crds/serviceexports.yaml")
	}
	c.Apply(t, "../deploy/base/namespace.yaml", "../deploy/spoke/rbac.yaml")
	return &kubeFixture{t: t, cluster: c, kc: c.Client, exports: ServiceExportResource}
}

// startSource runs a kube source as the spoke's service account until the
// test ends; it returns the source, its latest state and how many it published.
func (f *kubeFixture) startSource(tune func(*Config, *KubeSource)) (*KubeSource, *latestState, *atomic.Int32) {
	t := f.t
	cfg := DefaultConfig()
	cfg.Cluster, cfg.Source, cfg.Kubeconfig, cfg.Region = "east", "kube", f.cluster.SpokeKubeconfig, "default-region"
	src, _, err := newSource(cfg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	kube := src.(*KubeSource)
	if tune != nil {
		tune(&cfg, kube)
	}
	kube.filter = cfg.Namespaces
	latest := newLatestState()
	var publishes atomic.Int32
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- kube.Run(ctx, sinkFunc(func(st State) { publishes.Add(1); latest.set(st) }))
	}()
	writing := make(chan struct{})
	go func() { defer close(writing); kube.WriteStatus(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-writing
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return kube, latest, &publishes
}

// conditions returns a ServiceExport's conditions by type, and its resourceVersion.
func (f *kubeFixture) conditions(k registry.ServiceKey) (map[string]mcsstatus.Condition, string) {
	u, err := f.cluster.Dynamic.Resource(f.exports).Namespace(k.Namespace).Get(f.t.Context(), k.Name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]mcsstatus.Condition{}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m := c.(map[string]any)
		out[m["type"].(string)] = mcsstatus.Condition{Type: m["type"].(string), Status: metav1.ConditionStatus(m["status"].(string)),
			Reason: m["reason"].(string), Message: m["message"].(string)}
	}
	return out, u.GetResourceVersion()
}

// awaitCondition waits until a ServiceExport's condition has the status and reason.
func (f *kubeFixture) awaitCondition(k registry.ServiceKey, typ string, status metav1.ConditionStatus, reason string) mcsstatus.Condition {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conds, _ := f.conditions(k)
		c := conds[typ]
		if c.Status == status && c.Reason == reason {
			return c
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s condition %s = %+v, want %s/%s", k, typ, c, status, reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (f *kubeFixture) create(objs ...any) {
	f.t.Helper()
	ctx := f.t.Context()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Namespace:
			_, err = f.kc.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Node:
			_, err = f.kc.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Service:
			_, err = f.kc.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *discoveryv1.EndpointSlice:
			_, err = f.kc.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case registry.ServiceKey: // a ServiceExport
			se := serviceExport(o)
			se.SetAPIVersion(f.exports.GroupVersion().String())
			_, err = f.cluster.Dynamic.Resource(f.exports).Namespace(o.Namespace).Create(ctx, se, metav1.CreateOptions{})
		default:
			f.t.Fatalf("create %T", o)
		}
		if err != nil {
			f.t.Fatalf("create %T: %v", o, err)
		}
	}
}

func serviceExport(k registry.ServiceKey) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(ServiceExportResource.GroupVersion().String())
	u.SetKind("ServiceExport")
	u.SetNamespace(k.Namespace)
	u.SetName(k.Name)
	u.Object["spec"] = map[string]any{"exportedLabels": map[string]any{"example.com/exported": k.Name}}
	return u
}

func kubeService(ns, name string, labels map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.ServiceSpec{Ports: ports},
	}
}

func kubeSlice(ns, service, name string, family discoveryv1.AddressType, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: &port}},
		Endpoints:   eps,
	}
}

func withLabels(es *discoveryv1.EndpointSlice, labels map[string]string) *discoveryv1.EndpointSlice {
	for k, v := range labels {
		es.Labels[k] = v
	}
	return es
}

func kubeEndpoint(addr string, ready bool, zone, node string) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
	if zone != "" {
		e.Zone = &zone
	}
	if node != "" {
		e.NodeName = &node
	}
	return e
}

func kubeNode(name, region, zone string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		corev1.LabelTopologyRegion: region, corev1.LabelTopologyZone: zone, "unrelated": "label"}}}
}

var exportLabel = map[string]string{ExportLabel: "true"}

// await waits until the latest state satisfies ok.
func await(t *testing.T, latest *latestState, what string, ok func(State) bool) State {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		st, has, changed := latest.get()
		if has && ok(st) {
			return st
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; state: %v", what, describeState(st))
		}
	}
}

func describeState(st State) map[string]int {
	out := map[string]int{}
	for k, s := range st {
		if s != nil {
			out[k.String()] = len(s.Endpoints)
		} else {
			out[k.String()] = -1
		}
	}
	return out
}

func endpointByAddr(s *registry.Shard, addr string) *registry.Endpoint {
	a := netip.MustParseAddr(addr)
	for i, e := range s.Endpoints {
		for _, b := range e.Addresses {
			if a == b {
				return &s.Endpoints[i]
			}
		}
	}
	return nil
}

func TestKubeSource(t *testing.T) {
	f := newKubeFixture(t, true)
	web := registry.ServiceKey{Namespace: "apps", Name: "web"}
	db := registry.ServiceKey{Namespace: "apps", Name: "db"}
	big := registry.ServiceKey{Namespace: "apps", Name: "big"}
	hidden := registry.ServiceKey{Namespace: "apps", Name: "hidden"}
	ghost := registry.ServiceKey{Namespace: "apps", Name: "ghost"}
	excluded := registry.ServiceKey{Namespace: "other", Name: "web"}

	f.create(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}},
		kubeNode("n1", "us-east", "us-east-1a"), kubeNode("n2", "us-east", "us-east-1b"),
		// Multi-port, dual-stack, split over three slices; endpoints with and without zone and node.
		kubeService("apps", "web", exportLabel,
			corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
			corev1.ServicePort{Name: "grpc", Port: 9090, Protocol: corev1.ProtocolTCP}),
		kubeSlice("apps", "web", "web-v4a", discoveryv1.AddressTypeIPv4, 8080,
			kubeEndpoint("10.1.0.1", true, "", "n1"), kubeEndpoint("10.1.0.2", true, "us-east-1c", "")),
		kubeSlice("apps", "web", "web-v4b", discoveryv1.AddressTypeIPv4, 8080, kubeEndpoint("10.1.0.3", false, "", "n2")),
		kubeSlice("apps", "web", "web-v6", discoveryv1.AddressTypeIPv6, 8080, kubeEndpoint("fd00::1", true, "", "n1")),
		// Headless, exported by a ServiceExport rather than a label.
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "db"},
			Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "http", Port: 5432}}}},
		kubeSlice("apps", "db", "db-1", discoveryv1.AddressTypeIPv4, 5432,
			kubeEndpoint("10.3.0.1", true, "", "n2"), kubeEndpoint("10.3.0.2", true, "", "n2")),
		db, ghost,
		// Not exported: no label, no ServiceExport; or in an excluded namespace.
		kubeService("apps", "hidden", nil, corev1.ServicePort{Name: "http", Port: 80}),
		kubeSlice("apps", "hidden", "hidden-1", discoveryv1.AddressTypeIPv4, 80, kubeEndpoint("10.4.0.1", true, "", "")),
		kubeService("other", "web", exportLabel, corev1.ServicePort{Name: "http", Port: 80}),
		kubeSlice("other", "web", "web-1", discoveryv1.AddressTypeIPv4, 80, kubeEndpoint("10.5.0.1", true, "", "")),
		kubeService("apps", "big", exportLabel, corev1.ServicePort{Name: "http", Port: 80}),
		// What the import writer makes: a derived Service (labelled for
		// export, as a user might), and another cluster's endpoints of web.
		kubeService("apps", "derived-web", map[string]string{ExportLabel: "true", importwriter.ManagedByLabel: importwriter.ManagedByValue},
			corev1.ServicePort{Name: "http", Port: 80}),
		withLabels(kubeSlice("apps", "web", "web-west-ipv4", discoveryv1.AddressTypeIPv4, 8080, kubeEndpoint("10.9.0.1", true, "", "n1")),
			map[string]string{importwriter.ManagedByLabel: importwriter.ManagedByValue}),
	)
	// Hundreds of endpoints, a hundred per slice as the EndpointSlice controller does.
	for s := range 3 {
		var eps []discoveryv1.Endpoint
		for i := range 100 {
			eps = append(eps, kubeEndpoint(fmt.Sprintf("10.2.%d.%d", s, i+1), true, "us-east-1a", ""))
		}
		f.create(kubeSlice("apps", "big", fmt.Sprintf("big-%d", s), discoveryv1.AddressTypeIPv4, 8080, eps...))
	}

	kube, latest, publishes := f.startSource(func(cfg *Config, _ *KubeSource) {
		cfg.Namespaces.Exclude = append(cfg.Namespaces.Exclude, "other")
	})

	// The first state is complete: everything created before the source started.
	first := await(t, latest, "the first state", func(State) bool { return true })
	if n := publishes.Load(); n != 1 {
		t.Fatalf("published %d states before the first was seen", n)
	}
	if got := describeState(first); len(got) != 3 || got[web.String()] != 4 || got[db.String()] != 2 || got[big.String()] != 300 {
		t.Fatalf("first state = %v, want web:4 db:2 big:300 and nothing else", got)
	}
	w := first[web]
	if len(w.Ports) != 2 || w.Headless {
		t.Errorf("web ports = %+v, headless %v", w.Ports, w.Headless)
	}
	for _, tc := range []struct {
		addr  string
		loc   registry.Locality
		ready bool
	}{
		{"10.1.0.1", registry.Locality{Region: "us-east", Zone: "us-east-1a"}, true},        // zone and region from the node
		{"10.1.0.2", registry.Locality{Region: "default-region", Zone: "us-east-1c"}, true}, // no node: the default region
		{"10.1.0.3", registry.Locality{Region: "us-east", Zone: "us-east-1b"}, false},
		{"fd00::1", registry.Locality{Region: "us-east", Zone: "us-east-1a"}, true}, // IPv6 slice
	} {
		e := endpointByAddr(w, tc.addr)
		if e == nil || e.Locality != tc.loc || e.Conditions.Ready != tc.ready {
			t.Errorf("web endpoint %s = %+v, want locality %+v ready %v", tc.addr, e, tc.loc, tc.ready)
		}
	}
	if !first[db].Headless {
		t.Error("db is not headless")
	}
	if first[db].ExportedAt.IsZero() {
		t.Error("db's ExportedAt is not its ServiceExport's creation time")
	}
	if got := first[db].Labels; len(got) != 1 || got["example.com/exported"] != "db" {
		t.Errorf("db's exported labels = %v, want its ServiceExport's exportedLabels", got)
	}

	// Until the hub has reported, only what the spoke knows itself is written.
	f.awaitCondition(ghost, ConditionValid, metav1.ConditionFalse, ReasonNoService)
	f.awaitCondition(ghost, ConditionReady, metav1.ConditionFalse, ReasonFailed)
	if conds, _ := f.conditions(db); len(conds) != 0 {
		t.Errorf("db's conditions before the hub reported: %+v, want none yet", conds)
	}
	kube.SetReports(federation.Reports{})
	f.awaitCondition(db, ConditionValid, metav1.ConditionTrue, ReasonValid)
	f.awaitCondition(db, ConditionReady, metav1.ConditionTrue, ReasonExported)
	f.awaitCondition(db, ConditionConflict, metav1.ConditionFalse, ReasonNoConflicts)
	// Once right, the status is left alone: no write loop.
	_, rv := f.conditions(db)
	time.Sleep(time.Second)
	if _, now := f.conditions(db); now != rv {
		t.Errorf("db's ServiceExport keeps being written (resourceVersion %s -> %s)", rv, now)
	}

	t.Run("hub reports reach the ServiceExport", func(t *testing.T) {
		kube.SetReports(federation.Reports{db: {Conflicts: []federation.Explanation{
			{Kind: registry.TypeConflict, Text: "type: west wins"},
			{Kind: registry.PortConflict, Text: "port 5432/TCP: west wins"},
			{Kind: registry.PortConflict, Text: `port name "pg": west wins`},
		}}})
		c := f.awaitCondition(db, ConditionConflict, metav1.ConditionTrue, "PortConflict,TypeConflict")
		if want := `type: west wins; port 5432/TCP: west wins; port name "pg": west wins`; c.Message != want {
			t.Errorf("conflict message = %q, want %q", c.Message, want)
		}
		kube.SetReports(federation.Reports{db: {Refused: "too many endpoints"}})
		if c := f.awaitCondition(db, ConditionValid, metav1.ConditionFalse, ReasonRefusedByHub); c.Message != "too many endpoints" {
			t.Errorf("refusal message = %q", c.Message)
		}
		f.awaitCondition(db, ConditionReady, metav1.ConditionFalse, ReasonFailed)
		f.awaitCondition(db, ConditionConflict, metav1.ConditionFalse, ReasonNoConflicts)
		notPermitted := "ExportNotPermitted: the hub's export policy does not let cluster east export into namespace db"
		kube.SetReports(federation.Reports{db: {Refused: notPermitted}})
		if c := f.awaitCondition(db, ConditionValid, metav1.ConditionFalse, ReasonExportNotPermitted); c.Message != notPermitted {
			t.Errorf("refusal message = %q", c.Message)
		}
		f.awaitCondition(db, ConditionReady, metav1.ConditionFalse, ReasonFailed)
		kube.SetReports(nil)
		f.awaitCondition(db, ConditionValid, metav1.ConditionTrue, ReasonValid)
		f.awaitCondition(db, ConditionReady, metav1.ConditionTrue, ReasonExported)
	})

	kc, apps := f.kc, "apps"
	t.Run("endpoints scale down and flip ready", func(t *testing.T) {
		if err := kc.DiscoveryV1().EndpointSlices(apps).Delete(t.Context(), "big-2", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		es, err := kc.DiscoveryV1().EndpointSlices(apps).Get(t.Context(), "web-v4b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		es.Endpoints[0].Conditions.Ready = new(true)
		if _, err := kc.DiscoveryV1().EndpointSlices(apps).Update(t.Context(), es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		await(t, latest, "big at 200 endpoints and web's 10.1.0.3 ready", func(st State) bool {
			e := endpointByAddr(st[web], "10.1.0.3")
			return len(st[big].Endpoints) == 200 && e != nil && e.Conditions.Ready
		})
	})
	t.Run("a node's zone label moves its endpoints", func(t *testing.T) {
		n, err := kc.CoreV1().Nodes().Get(t.Context(), "n2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels[corev1.LabelTopologyZone] = "us-east-1d"
		if _, err := kc.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		await(t, latest, "db's endpoints in us-east-1d", func(st State) bool {
			e := endpointByAddr(st[db], "10.3.0.1")
			return e != nil && e.Locality.Zone == "us-east-1d"
		})
	})
	t.Run("labelling a service exports it", func(t *testing.T) {
		svc, err := kc.CoreV1().Services(apps).Get(t.Context(), "hidden", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Labels = exportLabel
		if _, err := kc.CoreV1().Services(apps).Update(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		await(t, latest, "hidden exported", func(st State) bool { return st[hidden] != nil && len(st[hidden].Endpoints) == 1 })
	})
	t.Run("the import writer's objects never reach the caches", func(t *testing.T) {
		// The API server leaves them out (imported is only a defence): a
		// cluster that imports its own exports does not cache them twice.
		//
		// cached returns the names in the source's caches of Services and
		// EndpointSlices, and whether any of the Services is the writer's.
		cached := func() (svcs, slices map[string]bool, anyImported bool) {
			svcs, slices = map[string]bool{}, map[string]bool{}
			list, _ := kube.services.List(labelsEverything)
			for _, s := range list {
				svcs[s.Name] = true
				anyImported = anyImported || imported(s)
			}
			for _, o := range kube.slicesIdx.List() {
				es := o.(*cachedSlice) // its labels are not kept: the writer's slice is looked for by name
				slices[es.Name] = true
			}
			return svcs, slices, anyImported
		}
		svcs, slices, anyImported := cached()
		if anyImported || svcs["derived-web"] || slices["web-west-ipv4"] || !svcs["web"] || !slices["web-v4a"] {
			t.Errorf("cached Services %v, EndpointSlices %v (any of the writer's: %v)", svcs, slices, anyImported)
		}
		// A label that comes or goes moves an object in or out.
		relabel := func(kind, name, patch string) {
			t.Helper()
			var err error
			if kind == "Service" {
				_, err = kc.CoreV1().Services(apps).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			} else {
				_, err = kc.DiscoveryV1().EndpointSlices(apps).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		derived := registry.ServiceKey{Namespace: apps, Name: "derived-web"}
		relabel("Service", "derived-web", `{"metadata":{"labels":{"`+importwriter.ManagedByLabel+`":null}}}`)
		relabel("EndpointSlice", "big-0", `{"metadata":{"labels":{"`+importwriter.ManagedByLabel+`":"`+importwriter.ManagedByValue+`"}}}`)
		await(t, latest, "derived-web exported once it is not the writer's, and big without big-0", func(st State) bool {
			return st[derived] != nil && st[big] != nil && len(st[big].Endpoints) == 100
		})
		svcs, slices, anyImported = cached()
		if anyImported || !svcs["derived-web"] || slices["big-0"] || !slices["big-1"] {
			t.Errorf("after relabelling, cached Services %v, EndpointSlices %v (any of the writer's: %v)", svcs, slices, anyImported)
		}
	})
	t.Run("deleting the ServiceExport unexports the service", func(t *testing.T) {
		if err := f.cluster.Dynamic.Resource(ServiceExportResource).Namespace(apps).Delete(t.Context(), "db", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		await(t, latest, "db gone", func(st State) bool { _, ok := st[db]; return !ok })
	})
	t.Run("deleting the service removes it", func(t *testing.T) {
		if err := kc.CoreV1().Services(apps).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		st := await(t, latest, "web gone", func(st State) bool { _, ok := st[web]; return !ok })
		if _, ok := st[excluded]; ok {
			t.Error("a service of an excluded namespace was exported")
		}
	})
}

// A spoke started before the ServiceExport CRD was installed notices it
// without a restart, and then exports by ServiceExport too.
func TestKubeSourceFindsTheServiceExportCRDLater(t *testing.T) {
	f := newKubeFixture(t, false)
	db := registry.ServiceKey{Namespace: "apps", Name: "db"}
	web := registry.ServiceKey{Namespace: "apps", Name: "web"}
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}},
		kubeService("apps", "web", exportLabel, corev1.ServicePort{Name: "http", Port: 80}),
		kubeService("apps", "db", nil, corev1.ServicePort{Name: "http", Port: 5432}),
		kubeSlice("apps", "db", "db-1", discoveryv1.AddressTypeIPv4, 5432, kubeEndpoint("10.3.0.1", true, "", "")))
	_, latest, _ := f.startSource(func(_ *Config, k *KubeSource) { k.ExportsRecheck = 100 * time.Millisecond })
	first := await(t, latest, "the first state", func(State) bool { return true })
	if _, ok := first[web]; !ok || len(first) != 1 {
		t.Fatalf("first state %v, want only the labelled web", describeState(first))
	}
	f.cluster.Apply(t, "../deploy/crds/serviceexports.yaml")
	f.create(db)
	await(t, latest, "db exported by its ServiceExport", func(st State) bool { return st[db] != nil && len(st[db].Endpoints) == 1 })
}

// candidate runs leadOrGiveUp for id over a client of config rc until ctx ends;
// each term reports its start and end on the returned channel.
type termEvent struct {
	id    string
	start bool
	at    time.Time
}

func candidate(t *testing.T, ctx context.Context, rc *rest.Config, cfg LeaderElection, id string, events chan<- termEvent) <-chan error {
	client := newKubeClient(t, rc)
	done := make(chan error, 1)
	go func() {
		done <- leadOrGiveUp(ctx, client, cfg, id, slog.Default(), func(tctx context.Context) error {
			events <- termEvent{id, true, time.Now()}
			<-tctx.Done()
			events <- termEvent{id, false, time.Now()}
			return nil
		})
	}()
	return done
}

func nextEvent(t *testing.T, events <-chan termEvent, within time.Duration) termEvent {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(within):
		t.Fatalf("no leadership change within %v", within)
		return termEvent{}
	}
}

var testElection = LeaderElection{Enabled: true, Namespace: "nave-system", Name: "nave-spoke",
	LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond}

// Two candidates on one Lease: one leads; when it stops cleanly, its term
// ends, then it releases the Lease, and the other takes over at once.
func TestLeaderElectionHandsOver(t *testing.T) {
	f := newKubeFixture(t, false)
	rc, err := clientcmd.BuildConfigFromFlags("", f.cluster.SpokeKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan termEvent, 10)
	ctxA, stopA := context.WithCancel(t.Context())
	doneA := candidate(t, ctxA, rc, testElection, "a", events)
	if e := nextEvent(t, events, 10*time.Second); e != (termEvent{"a", true, e.at}) {
		t.Fatalf("first event %+v, want a leading", e)
	}
	doneB := candidate(t, t.Context(), rc, testElection, "b", events)
	t.Cleanup(func() { <-doneB }) // before the API server stops
	select {
	case e := <-events:
		t.Fatalf("%+v while a leads", e)
	case <-time.After(testElection.LeaseDuration):
	}
	stopA()
	if e := nextEvent(t, events, time.Second); e.id != "a" || e.start {
		t.Fatalf("after a stopped: %+v, want a's term to end", e)
	}
	ended := time.Now()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	// Released: b does not wait for the Lease to run out.
	e := nextEvent(t, events, 5*testElection.RetryPeriod+500*time.Millisecond)
	if e.id != "b" || !e.start {
		t.Fatalf("then %+v, want b leading", e)
	}
	t.Logf("clean handover took %v", e.at.Sub(ended).Round(time.Millisecond))
}

// A leader that can no longer reach the API server (its connection
// black-holed, so even releasing the Lease hangs) stops before the standby
// takes over: the two never stream at once.
func TestLeaderElectionFencesAnUnreachableLeader(t *testing.T) {
	f := newKubeFixture(t, false)
	rc, err := clientcmd.BuildConfigFromFlags("", f.cluster.SpokeKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	proxy := nettest.NewProxy(t, strings.TrimPrefix(rc.Host, "https://"))
	viaProxy := rest.CopyConfig(rc)
	viaProxy.Host = "https://" + proxy.Addr
	events := make(chan termEvent, 10)
	doneA := candidate(t, t.Context(), viaProxy, testElection, "a", events)
	if e := nextEvent(t, events, 10*time.Second); e.id != "a" || !e.start {
		t.Fatalf("first event %+v, want a leading", e)
	}
	doneB := candidate(t, t.Context(), rc, testElection, "b", events)
	t.Cleanup(func() { <-doneA; <-doneB })
	time.Sleep(testElection.RetryPeriod)
	proxy.Blackhole()
	cut := time.Now()
	first := nextEvent(t, events, 2*testElection.LeaseDuration)
	second := nextEvent(t, events, 2*testElection.LeaseDuration)
	if first.id != "a" || first.start || second.id != "b" || !second.start {
		t.Fatalf("after a's connection was cut: %+v then %+v, want a's term to end before b's starts", first, second)
	}
	t.Logf("a stopped %v after its connection was cut, %v before b took over",
		first.at.Sub(cut).Round(time.Millisecond), second.at.Sub(first.at).Round(time.Millisecond))
}

// On a cluster whose ServiceExport CRD serves only v1alpha1 (an older
// mcs-api release), the source reads exports and writes their conditions
// through v1alpha1.
func TestKubeSourceOnAV1alpha1OnlyCluster(t *testing.T) {
	f := newKubeFixture(t, false)
	crd := kubetest.ReadManifests(t, "../deploy/crds/serviceexports.yaml")[0]
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		m := v.(map[string]any)
		alpha := m["name"] == "v1alpha1"
		m["served"], m["storage"] = alpha, alpha
	}
	if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	f.cluster.ApplyObjects(t, crd)
	f.exports = serviceExportVersions[1]
	db := registry.ServiceKey{Namespace: "apps", Name: "db"}
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}},
		kubeService("apps", "db", nil, corev1.ServicePort{Name: "http", Port: 5432}), db)
	kube, latest, _ := f.startSource(nil)
	st := await(t, latest, "db exported through v1alpha1", func(st State) bool { return st[db] != nil })
	if st[db].Labels["example.com/exported"] != "db" {
		t.Errorf("db's exported labels = %v, want its v1alpha1 ServiceExport's", st[db].Labels)
	}
	kube.SetReports(federation.Reports{})
	f.awaitCondition(db, ConditionValid, metav1.ConditionTrue, ReasonValid)
}

// newKubeClient returns the spoke's client of the API server rc reaches.
func newKubeClient(t testing.TB, rc *rest.Config) *kubeclient.Client {
	t.Helper()
	c, err := kubeclient.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
