package kubetest_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	"github.com/navemesh/nave/internal/kubetest"
)

// awaitTimeout bounds each wait for CoreDNS to reflect an API write.
const awaitTimeout = 30 * time.Second

// TestCoreDNSMulticluster runs the real CoreDNS against a real API server and
// checks, with DNS queries, how its kubernetes plugin answers clusterset.local
// from ServiceImports and MCS EndpointSlices: what Nave writes into clusters.
func TestCoreDNSMulticluster(t *testing.T) {
	kubetest.CoreDNSBinary(t) // skip before starting an API server for nothing
	c := kubetest.StartClusters(t, "dns")[0]
	crds, err := filepath.Glob("../../deploy/crds/*.yaml")
	if err != nil || len(crds) == 0 {
		t.Fatalf("deploy/crds: %v %v", crds, err)
	}
	c.Apply(t, crds...)
	d := kubetest.StartCoreDNS(t, c)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mcs := mcsclient.NewForConfigOrDie(c.Config)
	env := &dnsTest{c: c, d: d, mcs: mcs, ns: ns.Name}

	t.Run("clusterset IP", env.testClusterSetIP)
	t.Run("headless", env.testHeadless)
}

type dnsTest struct {
	c   *kubetest.Cluster
	d   *kubetest.CoreDNS
	mcs mcsclient.Interface
	ns  string
}

// testClusterSetIP: A answers spec.ips, SRV the ports, and the name goes when the import does.
func (e *dnsTest) testClusterSetIP(t *testing.T) {
	name := "cart." + e.ns + ".svc.clusterset.local"
	// Written as v1beta1 (the CRDs' storage version); CoreDNS reads it through v1alpha1.
	si := &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Name: "cart", Namespace: e.ns},
		Spec: mcsv1beta1.ServiceImportSpec{
			Type:  mcsv1beta1.ClusterSetIP,
			IPs:   []string{"10.99.0.10"},
			Ports: []mcsv1beta1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	// Slices as Nave writes them; a ClusterSetIP name answers without them.
	if err := e.createSlice(t.Context(), "cart", "cart-east", "east", "http", 80, endpoint("10.1.0.1", "", ptr(true))); err != nil {
		t.Fatal(err)
	}

	want := []netip.Addr{netip.MustParseAddr("10.99.0.10")}
	a := e.afterWrite(t, "ServiceImport created", func(ctx context.Context) error {
		_, err := e.mcs.MulticlusterV1beta1().ServiceImports(e.ns).Create(ctx, si, metav1.CreateOptions{})
		return err
	}, name, dns.TypeA, func(a kubetest.DNSAnswer) bool { return slices.Equal(a.Addrs, want) })
	if ttl := a.Msg.Answer[0].Header().Ttl; ttl != kubetest.CoreDNSTTL {
		t.Errorf("A %s: TTL %d, want %d", name, ttl, kubetest.CoreDNSTTL)
	}

	// The same over TCP.
	if a, err := e.d.Query(t.Context(), "tcp", name, dns.TypeA); err != nil || !slices.Equal(a.Addrs, want) {
		t.Errorf("A %s over TCP: %v %v, want %v", name, a, err, want)
	}
	// An IPv4-only import has no AAAA: NOERROR with no answer (NODATA), not NXDOMAIN.
	if a := e.query(t, name, dns.TypeAAAA); a.Rcode != dns.RcodeSuccess || len(a.Addrs) != 0 {
		t.Errorf("AAAA %s: %v, want NOERROR and no records", name, a)
	}
	// SRV, by port name and protocol and for all ports.
	for _, q := range []string{"_http._tcp." + name, name} {
		a := e.query(t, q, dns.TypeSRV)
		if a.Rcode != dns.RcodeSuccess || len(a.SRV) != 1 || a.SRV[0].Port != 80 || a.SRV[0].Target != name+"." {
			t.Errorf("SRV %s: %v, want %s.:80", q, a, name)
		}
	}
	if a := e.query(t, "_grpc._tcp."+name, dns.TypeSRV); a.Rcode != dns.RcodeNameError {
		t.Errorf("SRV of a port the import does not have: %v, want NXDOMAIN", a)
	}

	e.afterWrite(t, "ServiceImport deleted, its EndpointSlices kept", func(ctx context.Context) error {
		return e.mcs.MulticlusterV1beta1().ServiceImports(e.ns).Delete(ctx, "cart", metav1.DeleteOptions{})
	}, name, dns.TypeA, nxdomain)
}

// testHeadless: A answers the ready endpoints of every cluster's slices, and
// HOST.CLUSTER.NAME.NS.svc.clusterset.local one endpoint.
func (e *dnsTest) testHeadless(t *testing.T) {
	name := "db." + e.ns + ".svc.clusterset.local"
	si := &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: e.ns},
		Spec: mcsv1beta1.ServiceImportSpec{
			Type:  mcsv1beta1.Headless,
			Ports: []mcsv1beta1.ServicePort{{Name: "pg", Protocol: corev1.ProtocolTCP, Port: 5432}},
		},
	}
	if _, err := e.mcs.MulticlusterV1beta1().ServiceImports(e.ns).Create(t.Context(), si, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.createSlice(t.Context(), "db", "db-east", "east", "pg", 5432,
		endpoint("10.1.0.1", "db-0", ptr(true)),
		endpoint("10.1.0.2", "db-1", ptr(false)), // not ready: not answered
	); err != nil {
		t.Fatal(err)
	}
	want := addrs("10.1.0.1", "10.2.0.1", "10.2.0.3")
	e.afterWrite(t, "second cluster's EndpointSlice created", func(ctx context.Context) error {
		return e.createSlice(ctx, "db", "db-west", "west", "pg", 5432,
			endpoint("10.2.0.1", "db-0", ptr(true)),
			endpoint("10.2.0.3", "", nil), // readiness unknown: answered, as the EndpointSlice API says to
		)
	}, name, dns.TypeA, func(a kubetest.DNSAnswer) bool { return sameAddrs(a.Addrs, want) })

	// One SRV per ready endpoint, named HOST.CLUSTER.NAME... (the dashed address without a hostname).
	a := e.query(t, "_pg._tcp."+name, dns.TypeSRV)
	var targets []string
	for _, srv := range a.SRV {
		if srv.Port != 5432 {
			t.Errorf("SRV %s: port %d, want 5432", srv.Target, srv.Port)
		}
		targets = append(targets, srv.Target)
	}
	slices.Sort(targets)
	wantTargets := []string{"10-2-0-3.west." + name + ".", "db-0.east." + name + ".", "db-0.west." + name + "."}
	if !slices.Equal(targets, wantTargets) {
		t.Errorf("SRV _pg._tcp.%s: %v, want %v", name, targets, wantTargets)
	}

	// HOST.CLUSTER.NAME answers that cluster's endpoint only; a not-ready one is NXDOMAIN.
	for host, want := range map[string]string{"db-0.east.": "10.1.0.1", "db-0.west.": "10.2.0.1", "10-2-0-3.west.": "10.2.0.3"} {
		if a := e.query(t, host+name, dns.TypeA); !slices.Equal(a.Addrs, addrs(want)) {
			t.Errorf("A %s%s: %v, want %s", host, name, a, want)
		}
	}
	for _, q := range []string{"db-1.east." + name, "db-0.north." + name} {
		if a := e.query(t, q, dns.TypeA); a.Rcode != dns.RcodeNameError {
			t.Errorf("A %s: %v, want NXDOMAIN", q, a)
		}
	}

	// An endpoint turning ready appears.
	slice, err := e.c.Client.DiscoveryV1().EndpointSlices(e.ns).Get(t.Context(), "db-east", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice.Endpoints[1].Conditions.Ready = ptr(true)
	e.afterWrite(t, "endpoint marked ready", func(ctx context.Context) error {
		_, err := e.c.Client.DiscoveryV1().EndpointSlices(e.ns).Update(ctx, slice, metav1.UpdateOptions{})
		return err
	}, "db-1.east."+name, dns.TypeA, func(a kubetest.DNSAnswer) bool { return slices.Equal(a.Addrs, addrs("10.1.0.2")) })

	// A cluster's slice going takes its endpoints out.
	want = addrs("10.1.0.1", "10.1.0.2")
	e.afterWrite(t, "EndpointSlice deleted", func(ctx context.Context) error {
		return e.c.Client.DiscoveryV1().EndpointSlices(e.ns).Delete(ctx, "db-west", metav1.DeleteOptions{})
	}, name, dns.TypeA, func(a kubetest.DNSAnswer) bool { return sameAddrs(a.Addrs, want) })

	e.afterWrite(t, "ServiceImport deleted, its EndpointSlices kept", func(ctx context.Context) error {
		return e.mcs.MulticlusterV1beta1().ServiceImports(e.ns).Delete(ctx, "db", metav1.DeleteOptions{})
	}, name, dns.TypeA, nxdomain)
	if a := e.query(t, "db-0.east."+name, dns.TypeA); a.Rcode != dns.RcodeNameError {
		t.Errorf("A db-0.east.%s after the import went: %v, want NXDOMAIN", name, a)
	}
}

// createSlice writes an IPv4 EndpointSlice of an imported service as an MCS
// implementation does: labelled with the service and source cluster, and
// managed by something other than the EndpointSlice controller.
func (e *dnsTest) createSlice(ctx context.Context, service, name, cluster, portName string, port int32, endpoints ...discoveryv1.Endpoint) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: e.ns,
			Labels: map[string]string{
				mcsv1beta1.LabelServiceName:   service,
				mcsv1beta1.LabelSourceCluster: cluster,
				discoveryv1.LabelManagedBy:    "nave.navemesh.io",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: ptr(corev1.ProtocolTCP), Port: &port}},
		Endpoints:   endpoints,
	}
	_, err := e.c.Client.DiscoveryV1().EndpointSlices(e.ns).Create(ctx, slice, metav1.CreateOptions{})
	return err
}

// afterWrite does one API write, then waits until CoreDNS's answer about
// name satisfies want, and logs how long that took after the write returned:
// the time CoreDNS's watches take to reflect a write (the API server may delay
// the write itself, see below), with at most 10 ms of polling on top.
func (e *dnsTest) afterWrite(t *testing.T, what string, write func(context.Context) error, name string, qtype uint16, want func(kubetest.DNSAnswer) bool) kubetest.DNSAnswer {
	t.Helper()
	start := time.Now()
	if err := write(t.Context()); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	written := time.Now()
	a := e.await(t, name, qtype, want)
	// kube-apiserver holds a custom resource's create for 2 s when its CRD
	// became Established less than 2 s before; say so rather than hide it.
	t.Logf("%s (the write took %v) -> %s %s answered %s after %v", what, written.Sub(start).Round(time.Millisecond),
		dns.TypeToString[qtype], name, a, time.Since(written).Round(100*time.Microsecond))
	return a
}

// await waits until CoreDNS's answer satisfies want.
func (e *dnsTest) await(t *testing.T, name string, qtype uint16, want func(kubetest.DNSAnswer) bool) kubetest.DNSAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), awaitTimeout)
	defer cancel()
	a, err := e.d.AwaitAnswer(ctx, name, qtype, want)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// query asks once over UDP.
func (e *dnsTest) query(t *testing.T, name string, qtype uint16) kubetest.DNSAnswer {
	t.Helper()
	a, err := e.d.Query(t.Context(), "udp", name, qtype)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func nxdomain(a kubetest.DNSAnswer) bool { return a.Rcode == dns.RcodeNameError }

func endpoint(addr, hostname string, ready *bool) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	if hostname != "" {
		ep.Hostname = &hostname
	}
	return ep
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// sameAddrs compares ignoring order: CoreDNS answers a headless name's addresses in any order.
func sameAddrs(got, want []netip.Addr) bool {
	got, want = slices.Clone(got), slices.Clone(want)
	slices.SortFunc(got, netip.Addr.Compare)
	slices.SortFunc(want, netip.Addr.Compare)
	return slices.Equal(got, want)
}

func ptr[T any](v T) *T { return &v }
