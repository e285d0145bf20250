package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/registry"
)

// kubeEnv is what a Kubernetes end-to-end test runs against: clusters (real
// API servers), a hub and the clusters' spokes. Locally, the test starts
// them all (kube-apiservers over one etcd, `nave hub` and `nave spoke`
// processes). With NAVE_E2E_KUBECONFIGS set (make kind-e2e), they are the
// kind clusters deploy/kind/kind.sh set up, and the hub is reached through
// NAVE_E2E_HUB_ADMIN and NAVE_E2E_HUB_XDS.
type kubeEnv struct {
	clusters map[string]*kubeCluster
	admin    string // the hub's admin base URL
	xds      string // the hub's xDS address
	spokes   spokeControl
	// hub is the local hub process and what starts it (nil against kind).
	hub     *proc
	hubArgs []string
	bin     string
	t       testing.TB
}

// kubeCluster is one cluster as a test sees it.
type kubeCluster struct {
	name    string
	client  kubernetes.Interface
	dynamic dynamic.Interface
	// local is the harness's cluster (nil against kind): the test creates Nodes itself.
	local *kubetest.Cluster
}

// spokeControl stops and starts a cluster's spoke replicas.
type spokeControl interface {
	// killLeader kills (SIGKILL: no clean handover) the replica holding the cluster's Lease, and returns its name.
	killLeader(t testing.TB, cluster string) string
	// restart stops every replica of the cluster's spoke and starts them again.
	restart(t testing.TB, cluster string)
}

// Lease timing of the spokes the local harness starts: a standby takes
// over within about 4s of its leader's death.
var testLease = []string{"--lease-duration=4s", "--renew-deadline=3s", "--retry-period=500ms"}

// startKubeEnv returns the environment for clusters; locally, the first
// cluster's spoke runs as two replicas (leader and standby), the others as one.
func startKubeEnv(t testing.TB, clusters ...string) *kubeEnv {
	return startKubeEnvWith(t, nil, clusters...)
}

// startKubeEnvWith is startKubeEnv with extra `nave hub` flags.
func startKubeEnvWith(t testing.TB, hubFlags []string, clusters ...string) *kubeEnv {
	if os.Getenv("NAVE_E2E_KUBECONFIGS") != "" {
		return kindEnv(t, clusters)
	}
	bin := buildNave(t)
	local := kubetest.StartClusters(t, clusters...)
	env := &kubeEnv{clusters: map[string]*kubeCluster{}, bin: bin, t: t}
	crds, err := filepath.Glob("../deploy/crds/*.yaml")
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in deploy/crds: %v", err)
	}
	for _, c := range local {
		c.Apply(t, append(crds, "../deploy/base/namespace.yaml", "../deploy/spoke/rbac.yaml")...)
		env.clusters[c.Name] = &kubeCluster{name: c.Name, client: c.Client, dynamic: c.Dynamic, local: c}
	}

	dir := t.TempDir()
	tb, _ := yaml.Marshal(tokens)
	tokensFile := filepath.Join(dir, "tokens.yaml")
	writeFile(t, tokensFile, string(tb))
	fed, xdsAddr, admin := freeAddr(t), freeAddr(t), freeAddr(t)
	env.hubArgs = append([]string{"hub", "--id=hub-0", "--data-dir=" + filepath.Join(dir, "hub"), "--tokens=" + tokensFile,
		"--federation-addr=" + fed, "--xds-addr=" + xdsAddr, "--admin-addr=" + admin}, hubFlags...)
	env.admin, env.xds = "http://"+admin, xdsAddr
	env.startHub(t)

	spokes := &localSpokes{t: t, bin: bin, hub: fed, env: env, procs: map[string][]*proc{}, args: map[string][]string{}}
	for i, c := range local {
		tokenFile := filepath.Join(dir, c.Name+".token")
		writeFile(t, tokenFile, tokens[registry.ClusterID(c.Name)])
		spokes.args[c.Name] = append([]string{"spoke", "--source=kube", "--kubeconfig=" + c.SpokeKubeconfig,
			"--cluster-id=" + c.Name, "--hub=" + fed, "--token-file=" + tokenFile, "--lease-namespace=nave-system"}, testLease...)
		replicas := 1
		if i == 0 {
			replicas = 2
		}
		for r := range replicas {
			spokes.start(c.Name, fmt.Sprintf("%s-%c", c.Name, 'a'+r))
		}
	}
	env.spokes = spokes
	env.awaitSpokes(t)
	return env
}

// startHub starts the local hub process (again) and waits until it is ready;
// extra flags are added to the ones it started with.
func (e *kubeEnv) startHub(t testing.TB, extra ...string) {
	e.hub = startProc(e.t, "hub", e.bin, append(slices.Clone(e.hubArgs), extra...)...)
	await(t, "hub ready", func() bool { return httpStatus(e.admin+"/readyz") == http.StatusOK })
}

// stopHub stops the local hub process (SIGTERM).
func (e *kubeEnv) stopHub() { e.hub.stop() }

// awaitSpokes waits until every cluster's spoke has a synced session with the hub.
func (e *kubeEnv) awaitSpokes(t testing.TB) {
	for name := range e.clusters {
		e.awaitResynced(t, name, 0)
	}
}

// kindEnv is the environment make kind-e2e describes.
func kindEnv(t testing.TB, clusters []string) *kubeEnv {
	env := &kubeEnv{clusters: map[string]*kubeCluster{}, admin: os.Getenv("NAVE_E2E_HUB_ADMIN"), xds: os.Getenv("NAVE_E2E_HUB_XDS")}
	if env.admin == "" || env.xds == "" {
		t.Fatal("NAVE_E2E_KUBECONFIGS needs NAVE_E2E_HUB_ADMIN and NAVE_E2E_HUB_XDS")
	}
	paths := map[string]string{}
	for item := range strings.SplitSeq(os.Getenv("NAVE_E2E_KUBECONFIGS"), ",") {
		name, path, ok := strings.Cut(item, "=")
		if !ok {
			t.Fatalf("NAVE_E2E_KUBECONFIGS item %q: want cluster=path", item)
		}
		paths[name] = path
	}
	for _, name := range clusters {
		rc, err := clientcmd.BuildConfigFromFlags("", paths[name])
		if err != nil {
			t.Fatalf("cluster %s: %v", name, err)
		}
		env.clusters[name] = &kubeCluster{name: name, client: kubernetes.NewForConfigOrDie(rc), dynamic: dynamic.NewForConfigOrDie(rc)}
	}
	env.spokes = kindSpokes{env: env}
	env.awaitSpokes(t)
	return env
}

// cluster returns the hub's status of a cluster.
func (e *kubeEnv) cluster(t testing.TB, id string) adminapi.ClusterStatus {
	var all []adminapi.ClusterStatus
	getJSON(t, e.admin+"/debug/clusters", &all)
	for _, c := range all {
		if string(c.Cluster) == id {
			return c
		}
	}
	return adminapi.ClusterStatus{}
}

// service returns the hub's view of a service (the zero value when it has none).
func (e *kubeEnv) service(t testing.TB, key string) adminapi.ServiceInfo {
	t.Helper()
	s, err := e.tryService(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryService is service for goroutines other than the test's.
func (e *kubeEnv) tryService(ctx context.Context, key string) (adminapi.ServiceInfo, error) {
	var all []adminapi.ServiceInfo
	if err := fetchJSON(ctx, e.admin+"/debug/services", &all); err != nil {
		return adminapi.ServiceInfo{}, err
	}
	for _, s := range all {
		if s.Service.String() == key {
			return s, nil
		}
	}
	return adminapi.ServiceInfo{}, nil
}

// awaitResynced waits until the hub has applied the state of a new session
// of cluster (epoch after since).
func (e *kubeEnv) awaitResynced(t testing.TB, cluster string, since uint64) adminapi.ClusterStatus {
	t.Helper()
	var c adminapi.ClusterStatus
	// Against kind, a crashed leader's Lease runs out after the default 15s.
	awaitFor(t, cluster+"'s new session synced", time.Minute, func() bool {
		c = e.cluster(t, cluster)
		return c.Connected && c.Epoch > since && !c.LastUpdate.Before(c.SessionStart)
	})
	return c
}

// node returns a Node in the zone: an existing one (kind), or one the test creates (local API servers have none).
func (c *kubeCluster) node(t testing.TB, region, zone string) string {
	t.Helper()
	nodes, err := c.client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{LabelSelector: corev1.LabelTopologyZone + "=" + zone})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) > 0 {
		return nodes.Items[0].Name
	}
	if c.local == nil {
		t.Fatalf("cluster %s has no node in zone %s", c.name, zone)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.name + "-" + zone,
		Labels: map[string]string{corev1.LabelTopologyRegion: region, corev1.LabelTopologyZone: zone}}}
	if _, err := c.client.CoreV1().Nodes().Create(t.Context(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return n.Name
}

// localSpokes runs spoke replicas as processes.
type localSpokes struct {
	t        testing.TB // the test the processes last as long as (not a subtest)
	bin, hub string
	env      *kubeEnv
	mu       sync.Mutex
	procs    map[string][]*proc  // by cluster
	args     map[string][]string // by cluster
}

func (s *localSpokes) start(cluster, id string) {
	p := startProc(s.t, id, s.bin, append(slices.Clone(s.args[cluster]), "--spoke-id="+id)...)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.procs[cluster] = append(s.procs[cluster], p)
}

func (s *localSpokes) killLeader(t testing.TB, cluster string) string {
	leader := leaseHolder(t, s.env.clusters[cluster])
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.procs[cluster] {
		if p.name == leader {
			p.kill()
			s.procs[cluster] = slices.Delete(s.procs[cluster], i, i+1)
			return leader
		}
	}
	t.Fatalf("no spoke process %q (the Lease holder) in cluster %s", leader, cluster)
	return ""
}

func (s *localSpokes) restart(_ testing.TB, cluster string) {
	s.mu.Lock()
	old := s.procs[cluster]
	s.procs[cluster] = nil
	s.mu.Unlock()
	for _, p := range old {
		p.kill()
	}
	for _, p := range old {
		s.start(cluster, p.name)
	}
}

// kindSpokes controls the spoke candidates' pods of the kind clusters.
type kindSpokes struct{ env *kubeEnv }

func (k kindSpokes) killLeader(t testing.TB, cluster string) string {
	c := k.env.clusters[cluster]
	leader := leaseHolder(t, c)
	zero := int64(0)
	if err := c.client.CoreV1().Pods("nave-system").Delete(t.Context(), leader, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("kill spoke pod %s: %v", leader, err)
	}
	return leader
}

func (k kindSpokes) restart(t testing.TB, cluster string) {
	c := k.env.clusters[cluster]
	zero := int64(0)
	if err := c.client.CoreV1().Pods("nave-system").DeleteCollection(t.Context(), metav1.DeleteOptions{GracePeriodSeconds: &zero},
		metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nave-spoke"}); err != nil {
		t.Fatalf("restart spokes of %s: %v", cluster, err)
	}
}

// leaseHolder returns who holds the cluster's spoke Lease.
func leaseHolder(t testing.TB, c *kubeCluster) string {
	t.Helper()
	var holder string
	await(t, "a spoke leader in "+c.name, func() bool {
		l, err := c.client.CoordinationV1().Leases("nave-system").Get(t.Context(), "nave-spoke", metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		return holder != ""
	})
	return holder
}

// proc is a process a test started: a `nave` command, as a user runs it.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startProc starts a process that is killed when the test ends; its output
// goes to a file whose tail is printed when the test fails.
func startProc(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); out.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- %s: warnings, errors and last lines of its log:\n%s", name, logSummary(logPath))
		}
	})
	return p
}

// kill ends the process at once, as a crash or an OOM kill would.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop asks the process to end (SIGTERM), killing it after 10s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

// getJSON decodes an HTTP answer.
func getJSON(t testing.TB, url string, v any) {
	t.Helper()
	if err := fetchJSON(t.Context(), url, v); err != nil {
		t.Fatal(err)
	}
}

func fetchJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// logSummary returns a process log's warnings and errors (the first 30) and its last 15 lines.
func logSummary(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var problems []string
	for _, l := range lines {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			problems = append(problems, l)
		}
	}
	return strings.Join(append(problems[:min(len(problems), 30)], append([]string{"..."}, lines[max(0, len(lines)-15):]...)...), "\n")
}
