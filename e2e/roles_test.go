package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/internal/xdstest"
)

// The watched resources as the API server's metrics name them (resource.group).
const (
	watchServices       = "services"
	watchEndpointSlices = "endpointslices.discovery.k8s.io"
	watchNodes          = "nodes"
	watchNamespaces     = "namespaces"
	watchExports        = "serviceexports.multicluster.x-k8s.io"
	watchImports        = "serviceimports.multicluster.x-k8s.io"
	watchPolicies       = "trafficpolicies.nave.io" // deploy/crds has its CRD; not the Gateway API's, whose routes are not watched here
)

// candidateWatches is what n spoke candidates watch on the API server: each
// one's KubeSource informers (Services, EndpointSlices, Nodes, Namespaces,
// ServiceExports, TrafficPolicies), plus, when one of them leads, its import writer's
// informers (importwriter/importwriter.go importRun.run), which watch only the
// objects labelled nave.io/managed-by=nave-spoke: Services, EndpointSlices
// and ServiceImports. That writer is the one offset over n: it runs while a
// spoke leads (--imports, on by default and in deploy/spoke/deployment.yaml).
func candidateWatches(n int, leading bool) map[string]int {
	w := map[string]int{watchServices: n, watchEndpointSlices: n, watchNodes: n, watchNamespaces: n, watchExports: n, watchPolicies: n}
	if leading {
		w[watchServices]++
		w[watchEndpointSlices]++
		w[watchImports]++
	}
	return w
}

// TestKubeRoles runs a cluster's two kinds of Nave pods as processes against
// a real API server (issue 13): three spoke candidates (`nave spoke`, leader
// election) and two node agents (`nave node`, each reading its own Node with
// a real token of ServiceAccount nave-system/nave-node, as deploy/node/rbac.yaml
// allows). It checks that only the candidates watch the cluster (counting
// the WATCH requests the API server serves), that the leader streams and a killed
// leader is replaced without an endpoint lost at the hub, and that each node
// agent serves its node's locality to a real grpc-go xDS client.
//
// Against kind (NAVE_E2E_KUBECONFIGS) it is skipped: it reads the API
// server's metrics as a baseline with no Nave process running, and runs
// the candidates and agents as processes it can count and kill.
func TestKubeRoles(t *testing.T) {
	if os.Getenv("NAVE_E2E_KUBECONFIGS") != "" {
		t.Skip("needs the local harness: it stops every spoke to count the API server's own watches, and runs node agents as processes")
	}
	started := time.Now()
	env := startKubeEnv(t, "east")
	east := env.clusters["east"]
	spokes := env.spokes.(*localSpokes)
	t.Logf("harness up in %v", time.Since(started).Round(time.Millisecond))

	// The API server's own watches (its loopback informers) are the baseline:
	// stop the harness's spokes (SIGTERM: the leader releases the Lease) and
	// read the counts once they hold still. The test's own clients (admin,
	// the node agents' token) only ever make plain requests.
	spokes.stopAll("east")
	base := settledWatches(t, east)
	t.Logf("the API server's own watches: %v", base)

	// Three candidates, as deploy/spoke/deployment.yaml runs them.
	spokes.args["east"] = append(slices.Clone(spokes.args["east"]), "--leader-elect=true")
	epoch := env.cluster(t, "east").Epoch
	for i := range 3 {
		spokes.start("east", fmt.Sprintf("candidate-%d", i+1))
	}
	status := env.awaitResynced(t, "east", epoch)
	leader := leaseHolder(t, east)
	if status.SpokeID != leader {
		t.Fatalf("the hub's session of east is from %q, but %q holds the Lease", status.SpokeID, leader)
	}
	awaitWatches(t, east, base, candidateWatches(3, true), "3 candidates, one leading")
	t.Logf("3 candidates watching, %s leading and streaming: %v", leader, watchesOver(t, east, base))

	// An exported service with one backend per zone, each on a node of its zone.
	const ns = "shop"
	createNamespace(t, east, ns)
	nodeA, nodeB := east.node(t, "us-east", "us-east-1a"), east.node(t, "us-east", "us-east-1b")
	// Every backend from the start (startKubeBackend waits until each answers).
	hostA, hostA2, hostB := startKubeBackend(t, "east-1a"), startKubeBackend(t, "east-1a-2"), startKubeBackend(t, "east-1b")
	exportService(t, east, ns, "echo", false)
	setZonedEndpoints(t, east, ns, "echo", zonedEndpoint{hostA, nodeA, "us-east-1a"}, zonedEndpoint{hostB, nodeB, "us-east-1b"})
	want := []string{
		endpointString(hostA, "us-east", "us-east-1a", "HEALTHY"),
		endpointString(hostB, "us-east", "us-east-1b", "HEALTHY"),
	}
	slices.Sort(want) // as hubEndpoints sorts
	await(t, "shop/echo at the hub with both endpoints in their zones", func() bool {
		got, err := hubEndpoints(t.Context(), env, "shop/echo")
		return err == nil && slices.Equal(got, want)
	})
	if c := env.cluster(t, "east"); c.SpokeID != leader || c.Services != 1 || c.Endpoints != 2 {
		t.Errorf("the hub's east: spoke %q, %d services, %d endpoints; want %s streaming 1 service with 2 endpoints",
			c.SpokeID, c.Services, c.Endpoints, leader)
	}

	// The node agents' identity: ServiceAccount nave-node, a token a pod would mount.
	east.local.Apply(t, "../deploy/node/rbac.yaml")
	token := serviceAccountToken(t, east, "nave-system", "nave-node")
	dir := t.TempDir()
	tokenFile, caFile := filepath.Join(dir, "token"), filepath.Join(dir, "kube-ca.crt")
	writeFile(t, tokenFile, token)
	writeFile(t, caFile, string(east.local.Config.CAData))
	agentClient := tokenClient(t, east, token)
	await(t, "RBAC to let nave-node get Nodes", func() bool {
		_, err := agentClient.CoreV1().Nodes().Get(t.Context(), nodeA, metav1.GetOptions{})
		return err == nil
	})
	t.Run("the node agents' ServiceAccount may only get Nodes", func(t *testing.T) {
		ctx := t.Context()
		for what, call := range map[string]func() error{
			"list nodes": func() error {
				_, err := agentClient.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
				return err
			},
			"watch nodes": func() error {
				w, err := agentClient.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
				if err == nil {
					w.Stop()
				}
				return err
			},
			"patch a node": func() error {
				_, err := agentClient.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"nave-e2e":"x"}}}`), metav1.PatchOptions{})
				return err
			},
			"get a service": func() error {
				_, err := agentClient.CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
				return err
			},
			"list endpointslices": func() error {
				_, err := agentClient.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
				return err
			},
		} {
			if err := call(); !apierrors.IsForbidden(err) {
				t.Errorf("nave-node may %s: err %v, want Forbidden", what, err)
			}
		}
	})

	// Two node agents: A reads its Node from the API server directly, as in
	// a pod; B through a recording proxy, to see every request it makes.
	before := watchesOver(t, east, base)
	kubeLog := logKubeRequests(t, east)
	agentA := startNodeAgent(t, env, "node-agent-a", nodeA, east.local.Config.Host, caFile, tokenFile)
	agentB := startNodeAgent(t, env, "node-agent-b", nodeB, kubeLog.url, kubeLog.caFile, tokenFile)

	// Each client's bootstrap names the other zone: an agent serves its
	// clients its own node's locality, so only that Node's labels can send
	// each to its own zone's backend.
	const target = "echo.shop.svc.clusterset.local:8080"
	ctx, stopPolling := context.WithCancel(t.Context())
	defer stopPolling()
	viaA := xdstest.StartPoller(ctx, t, "client via node agent A", xdstest.NewClient(t, agentA, "client-a", locality("us-east", "us-east-1b"), target))
	viaB := xdstest.StartPoller(ctx, t, "client via node agent B", xdstest.NewClient(t, agentB, "client-b", locality("us-east", "us-east-1a"), target))
	viaA.AwaitOnly(ctx, t, "east-1a")
	viaB.AwaitOnly(ctx, t, "east-1b")

	t.Run("only the candidates watch the cluster", func(t *testing.T) {
		// Awaited, not read once: an informer's watch that times out is
		// re-opened, and a count read at that moment is one off. Node agents'
		// watches would stay and never let it settle.
		awaitWatches(t, east, base, candidateWatches(3, true), "3 candidates and 2 serving node agents")
		t.Logf("watches over the API server's own: before the node agents %v, with them serving %v", before, watchesOver(t, east, base))
	})

	t.Run("a killed leader is replaced with no endpoint lost", func(t *testing.T) {
		epoch := env.cluster(t, "east").Epoch
		watch := watchHubEndpoints(env, "shop/echo", want)
		killed := time.Now()
		old := spokes.killLeader(t, "east")
		c := env.awaitResynced(t, "east", epoch)
		t.Logf("leader %s killed -> %s streaming and synced in %v", old, c.SpokeID, time.Since(killed).Round(time.Millisecond))
		samples, missing, err := watch.result()
		if err != nil {
			t.Fatalf("watching the hub: %v", err)
		}
		if c.SpokeID == old || c.SpokeID != leaseHolder(t, east) {
			t.Errorf("after %s was killed the hub's session is from %q, the Lease holder %q", old, c.SpokeID, leaseHolder(t, east))
		}
		if len(missing) > 0 {
			t.Errorf("during the failover (%d samples of the hub) endpoints went missing: %v", samples, missing)
		}
		// The killed leader's watches are gone; the new leader's import writer watches.
		awaitWatches(t, east, base, candidateWatches(2, true), "2 candidates after the failover, one leading")
		t.Logf("after the failover (%d hub samples, none missing an endpoint): %v", samples, watchesOver(t, east, base))
	})

	t.Run("a change after the failover reaches the hub and the node agents' clients", func(t *testing.T) {
		setZonedEndpoints(t, east, ns, "echo", zonedEndpoint{hostA, nodeA, "us-east-1a"},
			zonedEndpoint{hostA2, nodeA, "us-east-1a"}, zonedEndpoint{hostB, nodeB, "us-east-1b"})
		await(t, "3 healthy endpoints of shop/echo at the hub", func() bool { return env.service(t, "shop/echo").Healthy == 3 })
		viaA.Await(ctx, t, "both us-east-1a backends", func(recent []string, _ map[string]bool) bool {
			return slices.Contains(recent, "east-1a") && slices.Contains(recent, "east-1a-2") && !slices.Contains(recent, "east-1b")
		})
		viaB.AwaitOnly(ctx, t, "east-1b")
	})

	stopPolling()
	for _, p := range []*xdstest.Poller{viaA, viaB} {
		if calls, failed := p.Failures(); len(failed) > 0 {
			t.Errorf("%s: %d of %d RPCs failed, first: %v", p.Name(), len(failed), calls, failed[0])
		}
	}
	// All along, node agent B asked the API server for its own Node, once, and for nothing else.
	if got, want := kubeLog.all(), []string{"GET /api/v1/nodes/" + nodeB}; !slices.Equal(got, want) {
		t.Errorf("node agent B's requests to the API server: %q, want %q", got, want)
	}
	t.Logf("TestKubeRoles took %v", time.Since(started).Round(time.Millisecond))
}

// stopAll stops every spoke process of the cluster (SIGTERM, so a leader releases its Lease).
func (s *localSpokes) stopAll(cluster string) {
	s.mu.Lock()
	old := s.procs[cluster]
	s.procs[cluster] = nil
	s.mu.Unlock()
	for _, p := range old {
		p.stop()
	}
}

// startNodeAgent runs `nave node` for the node, reading it from the API
// server at kubeServer, and returns its xDS address once it serves (its
// admin server starts after it has read its locality).
func startNodeAgent(t testing.TB, env *kubeEnv, name, node, kubeServer, caFile, tokenFile string) string {
	t.Helper()
	xdsAddr, admin := freeAddr(t), freeAddr(t)
	startProc(t, name, env.bin, "node", "--hub="+env.xds, "--cluster-id=east", "--node-name="+node,
		"--xds-addr="+xdsAddr, "--admin-addr="+admin,
		"--kube-server="+kubeServer, "--kube-token-file="+tokenFile, "--kube-ca="+caFile)
	await(t, name+" serving", func() bool { return httpStatus("http://"+admin+"/readyz") == http.StatusOK })
	return xdsAddr
}

// serviceAccountToken returns a bound token of the ServiceAccount (TokenRequest), as a pod would mount.
func serviceAccountToken(t testing.TB, c *kubeCluster, ns, name string) string {
	t.Helper()
	expiry := int64(time.Hour / time.Second)
	tr, err := c.client.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// tokenClient is a client of the cluster that authenticates with token only.
func tokenClient(t testing.TB, c *kubeCluster, token string) kubernetes.Interface {
	t.Helper()
	cfg := rest.AnonymousClientConfig(c.local.Config)
	cfg.BearerToken = token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// zonedEndpoint is one backend as the EndpointSlice controller writes it: on a node, in that node's zone.
type zonedEndpoint struct {
	host       *kubetest.Host
	node, zone string
}

// setZonedEndpoints writes the service's EndpointSlice with ready endpoints.
func setZonedEndpoints(t testing.TB, c *kubeCluster, ns, service string, eps ...zonedEndpoint) {
	t.Helper()
	setEndpointsWith(t, c, ns, service, func(es *discoveryv1.EndpointSlice) {
		for _, e := range eps {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{e.host.IP.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
				NodeName:   ptr(e.node),
				Zone:       ptr(e.zone),
			})
		}
	})
}

// endpointString is how hubEndpoints names an endpoint.
func endpointString(h *kubetest.Host, region, zone, health string) string {
	return fmt.Sprintf("%s:%d %s/%s %s", h.IP, backendPort, region, zone, health)
}

// hubEndpoints returns the endpoints the hub hands a client without locality
// (all of them), sorted, with their locality and health.
func hubEndpoints(ctx context.Context, env *kubeEnv, service string) ([]string, error) {
	var info adminapi.EndpointsInfo
	if err := fetchJSON(ctx, env.admin+"/debug/endpoints?service="+url.QueryEscape(service), &info); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range info.Ports {
		for _, pr := range p.Assignment.Priorities {
			for _, l := range pr.Localities {
				for _, e := range l.Endpoints {
					out = append(out, fmt.Sprintf("%s:%d %s/%s %s", e.Address, e.Port, l.Locality.Region, l.Locality.Zone, e.Health))
				}
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// endpointWatch samples the hub's endpoints of a service until stopped,
// recording every sample that lacks one of the wanted endpoints.
type endpointWatch struct {
	stop    context.CancelFunc
	done    chan struct{}
	samples int
	missing []string // "sample N: lacks ..."
	err     error
}

func watchHubEndpoints(env *kubeEnv, service string, want []string) *endpointWatch {
	ctx, stop := context.WithCancel(context.Background())
	w := &endpointWatch{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			got, err := hubEndpoints(ctx, env, service)
			if err != nil {
				if ctx.Err() == nil {
					w.err = err
				}
				return
			}
			w.samples++
			for _, e := range want {
				if !slices.Contains(got, e) {
					w.missing = append(w.missing, fmt.Sprintf("sample %d at %s: lacks %s (has %v)", w.samples, time.Now().Format(time.StampMilli), e, got))
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w
}

// result stops the watch and returns how many samples it took, what they lacked, and why it stopped early.
func (w *endpointWatch) result() (int, []string, error) {
	w.stop()
	<-w.done
	return w.samples, w.missing, w.err
}

// apiWatches reads the API server's metrics: how many WATCH requests it
// serves right now (apiserver_longrunning_requests), by resource.group.
func apiWatches(ctx context.Context, c *kubeCluster) (map[string]int, error) {
	raw, err := c.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's metrics: %w", err)
	}
	out, found := map[string]int{}, false
	for line := range strings.Lines(string(raw)) {
		rest, ok := strings.CutPrefix(line, "apiserver_longrunning_requests{")
		if !ok {
			continue
		}
		found = true
		labelText, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		labels, err := parseLabels(labelText)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		if labels["verb"] != "WATCH" || n == 0 {
			continue
		}
		key := labels["resource"]
		if labels["group"] != "" {
			key += "." + labels["group"]
		}
		if labels["subresource"] != "" {
			key += "/" + labels["subresource"]
		}
		out[key] += int(n)
	}
	if !found {
		return nil, fmt.Errorf("the API server exports no apiserver_longrunning_requests")
	}
	return out, nil
}

// parseLabels parses a Prometheus text label set: name="value",...
func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for s != "" {
		name, rest, ok := strings.Cut(s, "=")
		if !ok {
			return nil, fmt.Errorf("label without value in %q", s)
		}
		quoted, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return nil, fmt.Errorf("label %s: %w", name, err)
		}
		if labels[name], err = strconv.Unquote(quoted); err != nil {
			return nil, err
		}
		s = strings.TrimPrefix(rest[len(quoted):], ",")
	}
	return labels, nil
}

// watchesOver returns the watches the API server serves beyond base, by resource (no zero entries).
func watchesOver(t testing.TB, c *kubeCluster, base map[string]int) map[string]int {
	t.Helper()
	now, err := apiWatches(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	return subtractWatches(now, base)
}

func subtractWatches(now, base map[string]int) map[string]int {
	out := map[string]int{}
	for _, k := range slices.Concat(slices.Collect(maps.Keys(now)), slices.Collect(maps.Keys(base))) {
		if d := now[k] - base[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// settledWatches waits until the API server's watch counts hold still (five
// readings 100 ms apart alike) and returns them.
func settledWatches(t testing.TB, c *kubeCluster) map[string]int {
	t.Helper()
	var last map[string]int
	alike := 0
	awaitFor(t, "the API server's watch counts to settle", 20*time.Second, func() bool {
		now, err := apiWatches(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		if maps.Equal(now, last) {
			alike++
		} else {
			last, alike = now, 1
		}
		if alike < 5 {
			time.Sleep(100 * time.Millisecond)
			return false
		}
		return true
	})
	return last
}

// awaitWatches waits until the watches over base are exactly want.
func awaitWatches(t testing.TB, c *kubeCluster, base, want map[string]int, what string) {
	t.Helper()
	var got map[string]int
	deadline := time.Now().Add(20 * time.Second)
	for {
		now, err := apiWatches(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		if got = subtractWatches(now, base); maps.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("watches of %s over the API server's own: %v, want %v", what, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kubeRequestLog is a TLS reverse proxy in front of a cluster's API server
// that records every request through it (method and URI). Authentication
// and authorization stay the API server's: the client's token passes through.
type kubeRequestLog struct {
	url, caFile string
	mu          sync.Mutex
	requests    []string
}

func logKubeRequests(t testing.TB, c *kubeCluster) *kubeRequestLog {
	t.Helper()
	target, err := url.Parse(c.local.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.local.Config.CAData) {
		t.Fatal("no CA certificate in the admin kubeconfig")
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}},
		FlushInterval: -1, // a watch's events as they come
	}
	l := &kubeRequestLog{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.requests = append(l.requests, r.Method+" "+r.URL.RequestURI())
		l.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	l.url = srv.URL
	l.caFile = filepath.Join(t.TempDir(), "proxy-ca.crt")
	writeFile(t, l.caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	return l
}

func (l *kubeRequestLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.requests)
}
