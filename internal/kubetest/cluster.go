package kubetest

import (
	"context"
	"errors"
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

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	// ReadyTimeout bounds how long StartClusters waits for an API server's /readyz
	// (about 20 s each on an idle machine, longer while they start together).
	ReadyTimeout = 90 * time.Second
	// ServiceClusterIPRange is the range the API servers allocate Service cluster IPs from.
	ServiceClusterIPRange = "10.96.0.0/16"
	// stopTimeout is how long a stopping API server gets between SIGTERM and SIGKILL.
	stopTimeout = 10 * time.Second
)

// Cluster is one running kube-apiserver: a Kubernetes cluster with no
// controllers, nodes or kubelets, so tests write what controllers would
// (EndpointSlices, statuses) themselves.
type Cluster struct {
	Name string
	// Kubeconfig is the path of a kubeconfig authenticating as AdminUser (system:masters).
	Kubeconfig string
	// SpokeKubeconfig is the path of a kubeconfig authenticating as SpokeUser,
	// which may do only what RBAC applied to the cluster grants it.
	SpokeKubeconfig string
	// Config, Client and Dynamic act as AdminUser.
	Config  *rest.Config
	Client  kubernetes.Interface
	Dynamic dynamic.Interface

	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// StartClusters runs one kube-apiserver per name, all at once, over one
// in-process etcd (each under --etcd-prefix=/<name>), and returns them when
// every one is ready. They stop when the test ends; when the test fails, the
// tail of each server's log is printed. Start all of a test's clusters in one
// call: they share an etcd and start in parallel.
func StartClusters(t testing.TB, names ...string) []*Cluster {
	t.Helper()
	for i, name := range names {
		if name == "" || strings.Contains(name, "/") || slices.Contains(names[:i], name) {
			t.Fatalf("cluster names must be distinct, non-empty and without '/': %q", names)
		}
	}
	bin := APIServerBinary(t)
	etcd := startEtcd(t)
	servers := make([]*apiServer, len(names))
	for i, name := range names {
		servers[i] = startAPIServer(t, bin, etcd, name)
	}
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() { errs[i] = s.awaitReady(t.Context(), ReadyTimeout) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	clusters := make([]*Cluster, len(servers))
	for i, s := range servers {
		clusters[i] = s.cluster(t)
	}
	return clusters
}

// apiServer is a kube-apiserver process and the files it was started with.
type apiServer struct {
	name    string
	dir     string
	url     string
	certDir string
	tokens  tokens
	started time.Time
	startup time.Duration // from start to ready

	exited chan struct{} // closed once the process has been waited for
	err    error         // why the process exited; set before exited closes
}

// startAPIServer starts the process; its output goes to <dir>/kube-apiserver.log.
func startAPIServer(t testing.TB, bin, etcd, name string) *apiServer {
	t.Helper()
	dir := t.TempDir()
	port := freePort(t)
	s := &apiServer{
		name:    name,
		dir:     dir,
		url:     "https://127.0.0.1:" + port,
		certDir: filepath.Join(dir, "certs"),
		tokens:  newTokens(),
		exited:  make(chan struct{}),
	}
	saKey := writeServiceAccountKey(t, dir)
	tokenFile := s.tokens.writeFile(t, dir)
	args := []string{
		"--etcd-servers=" + etcd,
		"--etcd-prefix=/" + name,
		"--bind-address=127.0.0.1",
		"--secure-port=" + port,
		"--cert-dir=" + s.certDir,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
	}
	logPath := filepath.Join(dir, "kube-apiserver.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = dieWithParent()
	// Ending ctx asks for a graceful stop; WaitDelay later kills the process.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopTimeout
	s.started = time.Now()
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start kube-apiserver %s: %v", name, err)
	}
	go func() {
		s.err = cmd.Wait()
		_ = logFile.Close()
		close(s.exited)
	}()
	t.Cleanup(func() {
		cancel()
		<-s.exited
	})
	// Registered last so it runs first: the log as the test saw it, before shutdown noise.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver %s: last lines of %s:\n%s", name, logPath, tail(logPath, 40))
		}
	})
	return s
}

// awaitReady polls /readyz as the admin until it answers 200, the process
// exits, or timeout passes.
func (s *apiServer) awaitReady(ctx context.Context, timeout time.Duration) error {
	err := poll(ctx, timeout, 100*time.Millisecond, s.exited, s.probe)
	switch {
	case errors.Is(err, errExited):
		return fmt.Errorf("kube-apiserver %s exited before it was ready: %v (log: %s)", s.name, s.err, filepath.Join(s.dir, "kube-apiserver.log"))
	case err != nil:
		return fmt.Errorf("kube-apiserver %s not ready: %w", s.name, err)
	}
	s.startup = time.Since(s.started)
	return nil
}

// probe asks /readyz once. The serving certificate is only there once the
// server generated it, so the client is built anew each time.
func (s *apiServer) probe(ctx context.Context) error {
	ca, err := s.caData()
	if err != nil {
		return err
	}
	client, err := rest.HTTPClientFor(restConfig(s.url, ca, s.tokens.admin))
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// cluster writes the kubeconfigs of a ready server and builds its clients.
func (s *apiServer) cluster(t testing.TB) *Cluster {
	t.Helper()
	ca, err := s.caData()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{
		Name:            s.name,
		Kubeconfig:      filepath.Join(s.dir, "admin.kubeconfig"),
		SpokeKubeconfig: filepath.Join(s.dir, "spoke.kubeconfig"),
	}
	writeKubeconfig(t, c.Kubeconfig, s.name, s.url, ca, AdminUser, s.tokens.admin)
	writeKubeconfig(t, c.SpokeKubeconfig, s.name, s.url, ca, SpokeUser, s.tokens.spoke)
	// Load the admin's config back from its file, so the file is what tests rely on.
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		t.Fatal(err)
	}
	c.Config.QPS, c.Config.Burst = 200, 400              // no client-side throttling of tests
	c.Config.WarningHandlerWithContext = warningRouter{} // DryRun reports warnings
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		t.Fatal(err)
	}
	if c.Dynamic, err = dynamic.NewForConfig(c.Config); err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	t.Logf("kube-apiserver %s ready at %s after %v", s.name, s.url, s.startup.Round(100*time.Millisecond))
	return c
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
