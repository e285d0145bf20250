package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// CoreDNSEnv names the CoreDNS binary to run; `make` exports it.
const CoreDNSEnv = "NAVE_COREDNS"

const (
	// CoreDNSUser is who CoreDNS authenticates as: ServiceAccount kube-system/coredns,
	// the one kubeadm's CoreDNS runs as and deploy/coredns/rbac.yaml binds.
	CoreDNSUser = "system:serviceaccount:kube-system:coredns"
	// CoreDNSTTL is the TTL of the test Corefile's answers (deploy/coredns/README.md recommends it).
	CoreDNSTTL = 5
	// coreDNSReadyTimeout bounds the wait for /ready: the kubernetes plugin's informers synced.
	coreDNSReadyTimeout = 60 * time.Second
	// rbacTimeout bounds the wait for the authorizer to see newly applied RBAC.
	rbacTimeout = 10 * time.Second
)

// coreDNSBaseRBAC is the ServiceAccount, ClusterRole and binding kubeadm installs
// for CoreDNS (cmd/kubeadm/app/phases/addons/dns), cut to what the kubernetes
// plugin reads without `pods verified`: kubeadm's role also grants pods and
// Endpoints, which CoreDNS no longer watches. deploy/coredns/rbac.yaml adds
// ServiceImports on top, as it does in a real cluster.
const coreDNSBaseRBAC = `
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [services, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
`

// CoreDNS is a running CoreDNS process answering cluster.local and, through
// the kubernetes plugin's multicluster option, clusterset.local from one
// Cluster's Services, ServiceImports and EndpointSlices.
type CoreDNS struct {
	// Addr is where it serves DNS, over UDP and TCP (127.0.0.1:port).
	Addr string
	// Corefile and Log are the paths of its configuration and of its output.
	Corefile, Log string

	stop func()
}

// StartCoreDNS runs the CoreDNS binary ($NAVE_COREDNS, see CoreDNSBinary)
// against c, as ServiceAccount kube-system/coredns with exactly the RBAC a
// cluster gives it (kubeadm's role and deploy/coredns/rbac.yaml, both applied
// here), and returns once /ready answers (every watch has synced) and it
// answers DNS over UDP and TCP. The
// ServiceImport CRD (deploy/crds) must be applied to c first. It stops when
// the test ends; when the test fails, the tail of its log is printed.
func StartCoreDNS(t testing.TB, c *Cluster) *CoreDNS {
	t.Helper()
	bin := CoreDNSBinary(t)
	// CoreDNS reads ServiceImports through v1alpha1 only: without it /ready never answers.
	if _, err := c.mapping(schema.GroupKind{Group: "multicluster.x-k8s.io", Kind: "ServiceImport"}, "v1alpha1"); err != nil {
		t.Fatalf("CoreDNS needs ServiceImport v1alpha1 served: apply deploy/crds first: %v", err)
	}
	dir := t.TempDir()
	kubeconfig := c.coreDNSKubeconfig(t, dir)

	d := &CoreDNS{
		Addr:     freeAddr(t),
		Corefile: filepath.Join(dir, "Corefile"),
		Log:      filepath.Join(dir, "coredns.log"),
	}
	readyAddr, healthAddr := freeAddr(t), freeAddr(t)
	host, port, _ := net.SplitHostPort(d.Addr)
	// One server block for both zones; servers listen on UDP and TCP.
	corefile := fmt.Sprintf(`cluster.local:%[1]s clusterset.local:%[1]s {
    bind %[2]s
    errors
    log
    health %[3]s
    ready %[4]s
    kubernetes cluster.local clusterset.local {
        kubeconfig %[5]s
        multicluster clusterset.local
        ttl %[6]d
    }
}
`, port, host, healthAddr, readyAddr, kubeconfig, CoreDNSTTL)
	if err := os.WriteFile(d.Corefile, []byte(corefile), 0o600); err != nil {
		t.Fatal(err)
	}

	logFile, err := os.Create(d.Log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-conf", d.Corefile)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = dieWithParent()
	// CoreDNS shuts down on SIGTERM; WaitDelay later kills it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopTimeout
	started := time.Now()
	if err := cmd.Start(); err != nil {
		cancel()
		_ = logFile.Close()
		t.Fatalf("start CoreDNS: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error // set before exited closes
	go func() {
		waitErr = cmd.Wait()
		_ = logFile.Close()
		close(exited)
	}()
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			cancel()
			<-exited
		})
	}
	t.Cleanup(d.stop)
	// Registered last so it runs first: the log as the test saw it.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("CoreDNS: last lines of %s:\n%s", d.Log, tail(d.Log, 40))
		}
	})

	if err := awaitHTTP200(t.Context(), "http://"+readyAddr+"/ready", exited, coreDNSReadyTimeout); err != nil {
		if errors.Is(err, errExited) {
			err = fmt.Errorf("%w: %v", err, waitErr)
		}
		t.Fatalf("CoreDNS not ready: %v (log: %s)", err, d.Log)
	}
	// /ready can answer before the DNS server listens: CoreDNS runs its plugins'
	// startup hooks, the ready plugin's listener included, before it opens the
	// server's sockets, so the first queries would be refused.
	if err := d.awaitListening(t.Context(), exited, coreDNSReadyTimeout); err != nil {
		t.Fatalf("CoreDNS does not answer DNS: %v (log: %s)", err, d.Log)
	}
	t.Logf("CoreDNS ready at %s after %v", d.Addr, time.Since(started).Round(10*time.Millisecond))
	return d
}

// Stop stops CoreDNS and waits for it to exit. The test's end does it too.
func (d *CoreDNS) Stop() { d.stop() }

// CoreDNSBinary returns the path of the CoreDNS binary: $NAVE_COREDNS, else
// where `make coredns` caches it. A missing binary skips the test, or fails
// it under NAVE_E2E_REQUIRE=1.
func CoreDNSBinary(t testing.TB) string { return coreDNSTool.binary(t) }

// coreDNSKubeconfig gives ServiceAccount kube-system/coredns CoreDNS's RBAC,
// waits until the authorizer applies it, and writes a kubeconfig with a token
// of that ServiceAccount into dir.
func (c *Cluster) coreDNSKubeconfig(t testing.TB, dir string) string {
	t.Helper()
	base := filepath.Join(dir, "coredns-base-rbac.yaml")
	if err := os.WriteFile(base, []byte(coreDNSBaseRBAC), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c.Apply(t, base, filepath.Join(root, "deploy", "coredns", "rbac.yaml"))

	// A bound token, signed by the API server's service-account key, as a pod would mount.
	expiry := int64(time.Hour / time.Second)
	tr, err := c.Client.CoreV1().ServiceAccounts("kube-system").CreateToken(t.Context(), "coredns",
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for CoreDNS: %v", err)
	}
	token := tr.Status.Token
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	serviceImports := schema.GroupVersionResource{Group: "multicluster.x-k8s.io", Version: "v1alpha1", Resource: "serviceimports"}
	// What CoreDNS's informers list; the authorizer learns of new RBAC through its own informers.
	lists := map[string]func(context.Context) error{
		"services": func(ctx context.Context) error {
			_, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1})
			return err
		},
		"namespaces": func(ctx context.Context) error {
			_, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{Limit: 1})
			return err
		},
		"endpointslices": func(ctx context.Context) error {
			_, err := client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{Limit: 1})
			return err
		},
		"serviceimports": func(ctx context.Context) error {
			_, err := dyn.Resource(serviceImports).List(ctx, metav1.ListOptions{Limit: 1})
			return err
		},
	}
	for what, list := range lists {
		if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, rbacTimeout, true, func(ctx context.Context) (bool, error) {
			return list(ctx) == nil, nil
		}); err != nil {
			t.Fatalf("%s may not list %s after RBAC: %v", CoreDNSUser, what, list(t.Context()))
		}
	}

	path := filepath.Join(dir, "coredns.kubeconfig")
	writeKubeconfig(t, path, c.Name, c.Config.Host, c.Config.CAData, CoreDNSUser, token)
	return path
}

// DNSAnswer is a DNS response, reduced to what tests check.
type DNSAnswer struct {
	// Rcode is dns.RcodeSuccess, dns.RcodeNameError (NXDOMAIN), dns.RcodeServerFailure, ...
	Rcode int
	// Addrs are the A and AAAA records of the answer section, in order.
	Addrs []netip.Addr
	// SRV are the SRV records of the answer section, in order.
	SRV []*dns.SRV
	// Msg is the whole response.
	Msg *dns.Msg
}

// Query asks CoreDNS one question over network ("udp" or "tcp") about name
// (absolute or not: a final dot is added) of type qtype (dns.TypeA, dns.TypeAAAA,
// dns.TypeSRV, ...). An error means no response; NXDOMAIN is an answer.
func (d *CoreDNS) Query(ctx context.Context, network, name string, qtype uint16) (DNSAnswer, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	client := &dns.Client{Net: network, Timeout: 2 * time.Second}
	resp, _, err := client.ExchangeContext(ctx, m, d.Addr)
	if err != nil {
		return DNSAnswer{}, fmt.Errorf("%s %s over %s: %w", dns.TypeToString[qtype], name, network, err)
	}
	a := DNSAnswer{Rcode: resp.Rcode, Msg: resp}
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			ip, _ := netip.AddrFromSlice(rr.A.To4())
			a.Addrs = append(a.Addrs, ip)
		case *dns.AAAA:
			ip, _ := netip.AddrFromSlice(rr.AAAA.To16())
			a.Addrs = append(a.Addrs, ip)
		case *dns.SRV:
			a.SRV = append(a.SRV, rr)
		}
	}
	return a, nil
}

// AwaitAnswer asks over UDP about name, every 10 ms, until want accepts the
// answer or ctx ends, and returns the last answer. It is how a test waits for
// CoreDNS to see a change written to the API server.
func (d *CoreDNS) AwaitAnswer(ctx context.Context, name string, qtype uint16, want func(DNSAnswer) bool) (DNSAnswer, error) {
	var last DNSAnswer
	var lastErr error
	err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		last, lastErr = d.Query(ctx, "udp", name, qtype)
		return lastErr == nil && want(last), nil
	})
	if err != nil {
		if lastErr != nil {
			err = lastErr
		}
		return last, fmt.Errorf("%s %s: last answer %s: %w", dns.TypeToString[qtype], name, last, err)
	}
	return last, nil
}

// awaitListening asks for the SOA of clusterset.local over UDP and TCP until
// both are answered, exited closes, or timeout passes.
func (d *CoreDNS) awaitListening(ctx context.Context, exited <-chan struct{}, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for _, network := range []string{"udp", "tcp"} {
		err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			select {
			case <-exited:
				return false, errExited
			default:
			}
			_, lastErr = d.Query(ctx, network, "clusterset.local", dns.TypeSOA)
			return lastErr == nil, nil
		})
		if err != nil {
			return fmt.Errorf("%w (last: %v)", err, lastErr)
		}
	}
	return nil
}

// String is the answer in short: rcode and records.
func (a DNSAnswer) String() string {
	s := dns.RcodeToString[a.Rcode]
	for _, ip := range a.Addrs {
		s += " " + ip.String()
	}
	for _, srv := range a.SRV {
		s += fmt.Sprintf(" %s:%d", srv.Target, srv.Port)
	}
	return s
}

// errExited says a process exited while a test waited for it.
var errExited = errors.New("process exited")

// awaitHTTP200 polls url until it answers 200, exited closes, or timeout passes.
func awaitHTTP200(ctx context.Context, url string, exited <-chan struct{}, timeout time.Duration) error {
	return poll(ctx, timeout, 50*time.Millisecond, exited, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	})
}

// poll calls probe every interval until it succeeds, exited closes
// (errExited), or timeout passes (then the last probe's error says why).
func poll(ctx context.Context, timeout, interval time.Duration, exited <-chan struct{}, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	lastErr := errors.New("no attempt yet")
	for {
		select {
		case <-exited:
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v: %w", timeout, lastErr)
		case <-tick.C:
		}
		if lastErr = probe(ctx); lastErr == nil {
			return nil
		}
	}
}

// freeAddr is a free 127.0.0.1 address for TCP and UDP (see nettest.FreeAddr).
func freeAddr(t testing.TB) string {
	t.Helper()
	return freeLoopbackURL(t).Host
}
