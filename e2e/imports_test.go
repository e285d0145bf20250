package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/importwriter"
	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

var serviceImports = mcsv1beta1.SchemeGroupVersion.WithResource(mcsv1beta1.ServiceImportPluralName)

// importView is what a cluster holds of one import: the objects Nave wrote.
type importView struct {
	si      *unstructured.Unstructured // nil: none
	derived *corev1.Service            // nil: none
	slices  []discoveryv1.EndpointSlice
}

func (c *kubeCluster) importOf(t testing.TB, ns, name string) importView {
	t.Helper()
	var v importView
	si, err := c.dynamic.Resource(serviceImports).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	switch {
	case err == nil:
		v.si = si
	case !apierrors.IsNotFound(err):
		t.Fatal(err)
	}
	svc, err := c.client.CoreV1().Services(ns).Get(t.Context(), imports.DerivedServiceName(registry.ServiceKey{Namespace: ns, Name: name}), metav1.GetOptions{})
	switch {
	case err == nil:
		v.derived = svc
	case !apierrors.IsNotFound(err):
		t.Fatal(err)
	}
	list, err := c.client.DiscoveryV1().EndpointSlices(ns).List(t.Context(), metav1.ListOptions{
		LabelSelector: mcsv1beta1.LabelServiceName + "=" + name})
	if err != nil {
		t.Fatal(err)
	}
	v.slices = list.Items
	return v
}

// addresses are the ready addresses of the import's slices from cluster src ("" any), sorted.
func (v importView) addresses(src string) []string {
	var out []string
	for _, es := range v.slices {
		if src != "" && es.Labels[mcsv1beta1.LabelSourceCluster] != src {
			continue
		}
		for _, e := range es.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				out = append(out, e.Addresses...)
			}
		}
	}
	sort.Strings(out)
	return out
}

// versions are the resourceVersions of everything Nave wrote for the import.
func (v importView) versions() map[string]string {
	out := map[string]string{}
	if v.si != nil {
		out["serviceimport"] = v.si.GetResourceVersion()
	}
	if v.derived != nil {
		out["service"] = v.derived.ResourceVersion
	}
	for _, es := range v.slices {
		out["slice/"+es.Name] = es.ResourceVersion
	}
	return out
}

func (e *kubeEnv) awaitImport(t testing.TB, c *kubeCluster, ns, name, what string, cond func(importView) bool) importView {
	t.Helper()
	var v importView
	awaitFor(t, c.name+": "+what, 30*time.Second, func() bool {
		v = c.importOf(t, ns, name)
		return cond(v)
	})
	return v
}

// allVersions are the resourceVersions of every import object in ns of every cluster.
func (e *kubeEnv) allVersions(t testing.TB, ns string, names ...string) map[string]string {
	out := map[string]string{}
	for _, c := range e.clusters {
		for _, n := range names {
			for k, v := range c.importOf(t, ns, n).versions() {
				out[c.name+"/"+n+"/"+k] = v
			}
		}
	}
	return out
}

func siSpec(v importView, path ...string) any {
	val, _, _ := unstructured.NestedFieldNoCopy(v.si.Object, append([]string{"spec"}, path...)...)
	return val
}

// TestImportsEndToEnd runs a hub and three clusters' spokes over real API
// servers with the upstream MCS CRDs, and real CoreDNS in each cluster.
func TestImportsEndToEnd(t *testing.T) {
	env := startKubeEnvWith(t, []string{"--clusterset-cidr=243.0.0.0/16"}, "east", "west", "north")
	if env.hub == nil {
		t.Skip("the imports end-to-end test needs the local harness (it restarts the hub)")
	}
	east, west, north := env.clusters["east"], env.clusters["west"], env.clusters["north"]
	all := []*kubeCluster{east, west, north}
	dnsOf := map[string]*kubetest.CoreDNS{}
	for _, c := range all {
		dnsOf[c.name] = kubetest.StartCoreDNS(t, c.local)
	}
	const ns = "shop"
	for _, c := range all {
		createNamespace(t, c, ns)
	}
	zoneA := east.node(t, "r1", "a")
	hosts := map[string]*kubetest.Host{}
	for _, n := range []string{"e1", "e2", "w1", "n1"} {
		hosts[n] = kubetest.NewHost(t)
	}
	ip := func(n string) string { return hosts[n].IP.String() }

	// 1. An export in east: every cluster holds the import with exactly the mirrored fields.
	created := time.Now()
	exportServiceWith(t, east, ns, "echo", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(600))}}
		s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		s.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferSameZone)
	})
	setEndpoints(t, east, ns, "echo", kubeEndpoint{hosts["e1"], zoneA, true}, kubeEndpoint{hosts["e2"], zoneA, false})
	var echoIP string
	for _, c := range all {
		v := env.awaitImport(t, c, ns, "echo", "the echo import", func(v importView) bool {
			return v.si != nil && v.derived != nil && len(v.slices) > 0
		})
		if siSpec(v, "type") != "ClusterSetIP" || siSpec(v, "sessionAffinity") != "ClientIP" ||
			fmt.Sprint(siSpec(v, "sessionAffinityConfig", "clientIP", "timeoutSeconds")) != "600" ||
			siSpec(v, "internalTrafficPolicy") != "Local" || siSpec(v, "trafficDistribution") != "PreferSameZone" ||
			fmt.Sprint(siSpec(v, "ipFamilies")) != "[IPv4]" {
			t.Errorf("%s: ServiceImport spec %v does not mirror the exported Service", c.name, v.si.Object["spec"])
		}
		ips := fmt.Sprint(siSpec(v, "ips"))
		if echoIP == "" {
			echoIP = strings.Trim(ips, "[]")
		}
		if ips != "["+echoIP+"]" || !netip.MustParsePrefix("243.0.0.0/16").Contains(netip.MustParseAddr(echoIP)) ||
			v.derived.Spec.ClusterIP != echoIP {
			t.Errorf("%s: clusterset IP %s, derived Service %s; want one IP of the range everywhere (%s)", c.name, ips, v.derived.Spec.ClusterIP, echoIP)
		}
		if v.si.GetAnnotations()[mcsv1beta1.LabelServiceName] != "" ||
			v.si.GetAnnotations()["multicluster.kubernetes.io/derived-service"] != v.derived.Name {
			t.Errorf("%s: ServiceImport annotations %v", c.name, v.si.GetAnnotations())
		}
		for _, es := range v.slices {
			l := es.Labels
			if l[mcsv1beta1.LabelSourceCluster] != "east" || l[discoveryv1.LabelManagedBy] == "endpointslice-controller.k8s.io" ||
				l[discoveryv1.LabelManagedBy] == "" || l[discoveryv1.LabelServiceName] != v.derived.Name {
				t.Errorf("%s: slice %s labels %v", c.name, es.Name, l)
			}
			for _, ep := range es.Endpoints {
				if ep.NodeName != nil || ep.TargetRef != nil {
					t.Errorf("%s: slice %s names another cluster's node or pod: %+v", c.name, es.Name, ep)
				}
			}
		}
		if got := v.addresses("east"); !slices.Equal(got, []string{ip("e1")}) {
			t.Errorf("%s: ready addresses %v, want %s", c.name, got, ip("e1"))
		}
	}

	// 2. DNS: A and SRV for the clusterset IP in every cluster; NXDOMAIN for an unknown name.
	name := "echo." + ns + ".svc.clusterset.local."
	for _, c := range all {
		a, err := dnsOf[c.name].AwaitAnswer(t.Context(), name, dns.TypeA, func(a kubetest.DNSAnswer) bool { return len(a.Addrs) == 1 })
		if err != nil || a.Addrs[0].String() != echoIP {
			t.Fatalf("%s: A %s = %v (%v), want %s", c.name, name, a, err, echoIP)
		}
		srv, err := dnsOf[c.name].Query(t.Context(), "udp", "_grpc._tcp."+name, dns.TypeSRV)
		if err != nil || len(srv.SRV) != 1 || srv.SRV[0].Port != backendPort {
			t.Errorf("%s: SRV = %v (%v), want port %d", c.name, srv, err, backendPort)
		}
	}
	t.Logf("ServiceExport created in east -> A answer in north: %v (first measurement, includes the ServiceImport CRD's first-create delay)",
		time.Since(created).Round(time.Millisecond))

	// 3. A readiness change in east reaches the slices everywhere; not-ready endpoints are never answered.
	start := time.Now()
	setEndpoints(t, east, ns, "echo", kubeEndpoint{hosts["e1"], zoneA, true}, kubeEndpoint{hosts["e2"], zoneA, true})
	env.awaitImport(t, north, ns, "echo", "e2 ready", func(v importView) bool { return len(v.addresses("east")) == 2 })
	t.Logf("endpoint readiness change in east -> slice updated in north: %v", time.Since(start).Round(time.Millisecond))

	// 4. A headless service: per-endpoint answers by hostname and cluster.
	exportService(t, west, ns, "db", true)
	setEndpointsWith(t, west, ns, "db", func(es *discoveryv1.EndpointSlice) {
		es.Endpoints = []discoveryv1.Endpoint{
			{Addresses: []string{ip("w1")}, Hostname: ptr("db-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}},
			{Addresses: []string{ip("n1")}, Hostname: ptr("db-1"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}},
		}
	})
	for _, c := range all {
		v := env.awaitImport(t, c, ns, "db", "the db import", func(v importView) bool { return v.si != nil && len(v.slices) > 0 })
		if siSpec(v, "type") != "Headless" || siSpec(v, "ips") != nil || v.derived != nil {
			t.Errorf("%s: headless import %v, derived Service %v", c.name, v.si.Object["spec"], v.derived)
		}
		d := dnsOf[c.name]
		a, err := d.AwaitAnswer(t.Context(), "db."+ns+".svc.clusterset.local.", dns.TypeA, func(a kubetest.DNSAnswer) bool { return len(a.Addrs) > 0 })
		if err != nil || len(a.Addrs) != 1 || a.Addrs[0].String() != ip("w1") {
			t.Errorf("%s: headless A = %v (%v), want only the ready %s", c.name, a, err, ip("w1"))
		}
		one, err := d.Query(t.Context(), "udp", "db-0.west.db."+ns+".svc.clusterset.local.", dns.TypeA)
		if err != nil || len(one.Addrs) != 1 || one.Addrs[0].String() != ip("w1") {
			t.Errorf("%s: db-0.west = %v (%v)", c.name, one, err)
		}
	}

	// 5. The same service from a second cluster: one import, slices per source
	// cluster, and the conflict on both exports with the upstream reason.
	exportServiceWith(t, west, ns, "echo", func(s *corev1.Service) { // no session affinity: a conflict
		s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		s.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferSameZone)
	})
	setEndpoints(t, west, ns, "echo", kubeEndpoint{hosts["w1"], west.node(t, "r2", "b"), true})
	for _, c := range all {
		v := env.awaitImport(t, c, ns, "echo", "echo from east and west", func(v importView) bool {
			return len(v.addresses("east")) == 2 && len(v.addresses("west")) == 1
		})
		if clusters, _, _ := unstructured.NestedSlice(v.si.Object, "status", "clusters"); len(clusters) != 2 {
			t.Errorf("%s: status.clusters %v, want east and west", c.name, clusters)
		}
		if ips := fmt.Sprint(siSpec(v, "ips")); ips != "["+echoIP+"]" || siSpec(v, "sessionAffinity") != "ClientIP" {
			t.Errorf("%s: the older export's properties and IP do not stand: %v", c.name, v.si.Object["spec"])
		}
	}
	for _, c := range []*kubeCluster{east, west} {
		var cond map[string]any
		await(t, c.name+"'s Conflict condition", func() bool {
			cond = exportConditions(t, c, ns, "echo")[spoke.ConditionConflict]
			return cond["status"] == "True"
		})
		if !strings.Contains(fmt.Sprint(cond["reason"]), string(registry.SessionAffinityConflict)) {
			t.Errorf("%s: Conflict condition %v, want reason %s", c.name, cond, registry.SessionAffinityConflict)
		}
	}
	a, err := dnsOf["north"].AwaitAnswer(t.Context(), "_grpc._tcp."+name, dns.TypeSRV, func(a kubetest.DNSAnswer) bool { return len(a.SRV) == 1 })
	if err != nil {
		t.Errorf("north: SRV after the second export: %v (%v)", a, err)
	}

	// 6. Two services never share a clusterset IP.
	exportService(t, north, ns, "cart", false)
	setEndpoints(t, north, ns, "cart", kubeEndpoint{hosts["n1"], north.node(t, "r3", "c"), true})
	cart := env.awaitImport(t, east, ns, "cart", "the cart import", func(v importView) bool { return v.derived != nil })
	if cart.derived.Spec.ClusterIP == echoIP {
		t.Errorf("cart and echo share %s", echoIP)
	}

	// 7. The hub and the DNS agree on the endpoints: what a proxyless client
	// in north gets for echo is exactly what north's DNS and slices hold.
	var info adminapi.EndpointsInfo
	getJSON(t, env.admin+"/debug/endpoints?service="+ns+"/echo", &info)
	var fromHub []string
	for _, p := range info.Ports {
		for _, pr := range p.Assignment.Priorities {
			for _, l := range pr.Localities {
				for _, e := range l.Endpoints {
					fromHub = append(fromHub, e.Address.String())
				}
			}
		}
	}
	sort.Strings(fromHub)
	if got := north.importOf(t, ns, "echo").addresses(""); !slices.Equal(got, fromHub) {
		t.Errorf("north's slices hold %v, the hub hands xDS clients %v", got, fromHub)
	}

	// 8. No churn: a spoke restart, a leader handover and a hub restart write nothing.
	names := []string{"echo", "db", "cart"}
	before := env.allVersions(t, ns, names...)
	env.spokes.restart(t, "west")
	env.awaitResynced(t, "west", 0)
	env.spokes.killLeader(t, "east")
	env.awaitResynced(t, "east", env.cluster(t, "east").Epoch)
	env.stopHub()
	// While the hub is unreachable, everything stays.
	time.Sleep(2 * time.Second) // an observation window: nothing may change, so nothing can be awaited
	if after := env.allVersions(t, ns, names...); !maps.Equal(before, after) {
		t.Errorf("with the hub down, imports changed:\n before %v\n after  %v", before, after)
	}
	restarted := time.Now()
	env.startHub(t)
	for name := range env.clusters {
		// A spoke whose state the restored hub holds resumes: no update, so wait for its session.
		awaitFor(t, name+" back at the restarted hub", 30*time.Second, func() bool {
			c := env.cluster(t, name)
			return c.Connected && c.SessionStart.After(restarted)
		})
	}
	awaitImportsWritten(t, env, "east", "west", "north")
	if after := env.allVersions(t, ns, names...); !maps.Equal(before, after) {
		t.Errorf("restarts rewrote imports:\n before %v\n after  %v", before, after)
	}
	if ip := east.importOf(t, ns, "echo").derived.Spec.ClusterIP; ip != echoIP {
		t.Errorf("after the hub restart echo's clusterset IP is %s, was %s", ip, echoIP)
	}

	// 9. A user's own objects with Nave-like names are never touched.
	userSlice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "echo-user",
		Labels: map[string]string{mcsv1beta1.LabelServiceName: "echo", mcsv1beta1.LabelSourceCluster: "east"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.200.0.1"}}}}
	if _, err := north.client.DiscoveryV1().EndpointSlices(ns).Create(t.Context(), userSlice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// 10. Unexported: NXDOMAIN everywhere, every Nave object gone, the user's slice kept.
	if err := east.dynamic.Resource(spoke.ServiceExportResource).Namespace(ns).Delete(t.Context(), "echo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := west.dynamic.Resource(spoke.ServiceExportResource).Namespace(ns).Delete(t.Context(), "echo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		env.awaitImport(t, c, ns, "echo", "echo gone", func(v importView) bool {
			owned := 0
			for _, es := range v.slices {
				if es.Labels[importwriter.ManagedByLabel] == importwriter.ManagedByValue {
					owned++
				}
			}
			return v.si == nil && v.derived == nil && owned == 0
		})
		if _, err := dnsOf[c.name].AwaitAnswer(t.Context(), name, dns.TypeA, func(a kubetest.DNSAnswer) bool { return a.Rcode == dns.RcodeNameError }); err != nil {
			t.Errorf("%s: no NXDOMAIN once unexported: %v", c.name, err)
		}
	}
	if _, err := north.client.DiscoveryV1().EndpointSlices(ns).Get(t.Context(), "echo-user", metav1.GetOptions{}); err != nil {
		t.Errorf("the user's own slice: %v", err)
	}

	// 11. A dropped cluster's slices go: north's spoke dies; under the drop policy its endpoints leave every cluster.
	env.stopNorth(t)
	env.stopHub()
	env.startHub(t, "--cluster-policies=north=drop", "--stale-after=1s", "--drop-after=2s")
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if v := east.importOf(t, ns, "cart"); v.si == nil && len(v.slices) == 0 {
			break
		}
		if time.Now().After(end) {
			// What the hub believes, for the record.
			t.Fatalf("east: north's cart never dropped; the hub's imports: %s\nits clusters: %s",
				httpBody(env.admin+"/debug/imports"), httpBody(env.admin+"/debug/clusters"))
		}
	}
}

// stopNorth kills every spoke replica of north.
func (e *kubeEnv) stopNorth(t testing.TB) {
	s := e.spokes.(*localSpokes)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs["north"] {
		p.kill()
	}
	s.procs["north"] = nil
}

// awaitImportsWritten waits until the hub shows every cluster's imports written.
func awaitImportsWritten(t testing.TB, env *kubeEnv, clusters ...string) {
	t.Helper()
	awaitFor(t, "imports written in "+strings.Join(clusters, ", "), 30*time.Second, func() bool {
		var info adminapi.ImportsInfo
		if err := fetchJSON(context.Background(), env.admin+"/debug/imports", &info); err != nil {
			return false
		}
		written := 0
		for _, s := range info.Sessions {
			if slices.Contains(clusters, string(s.Cluster)) && s.Written() {
				written++
			}
		}
		return written == len(clusters)
	})
}

// exportServiceWith is exportService with the Service changed first.
func exportServiceWith(t testing.TB, c *kubeCluster, ns, name string, change func(*corev1.Service)) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: backendPort, Protocol: corev1.ProtocolTCP}}}}
	change(svc)
	if _, err := c.client.CoreV1().Services(ns).Create(t.Context(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createServiceExport(t, c, ns, name)
}
