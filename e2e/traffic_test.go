package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/kubetraffic"
	tpv1 "github.com/navemesh/nave/kubetraffic/v1alpha1"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
	"github.com/navemesh/nave/xds"
)

// Traffic policy end to end: real kube-apiservers (east and west) with the
// Gateway API's standard CRDs and Nave's TrafficPolicy CRD, the clusters'
// spokes and a hub as processes, real gRPC backends on test hosts, and real
// grpc-go xDS clients. GRPCRoutes and TrafficPolicies are written with the
// Gateway API's and kubetraffic/v1alpha1's Go types; what the clients do is
// counted over many calls, and every wait is for a condition.
//
// One environment serves every case (starting two API servers is most of
// the cost); each case has a namespace of its own.

var (
	trGRPCRoutes      = gatewayGroupVersion.WithResource("grpcroutes")
	trTrafficPolicies = tpv1.SchemeGroupVersion.WithResource("trafficpolicies")
)

// trEnv is the shared environment: two clusters, the backends a (east) and
// b (west), and a Node in each cluster's zone.
type trEnv struct {
	*kubeEnv
	east, west         *kubeCluster
	hostA, hostB       *kubetest.Host
	eastNode, westNode string
}

// startTrafficEnv starts east and west, applies the Gateway API's standard
// CRDs (the harness applies deploy/crds/*.yaml, trafficpolicies.yaml among
// them, but not the Gateway API's subfolders) and restarts the spokes, which
// look for the route CRDs when they start (and otherwise only every 30s).
func startTrafficEnv(t *testing.T) *trEnv {
	env := startKubeEnv(t, "east", "west")
	e := &trEnv{kubeEnv: env, east: env.clusters["east"], west: env.clusters["west"]}
	if e.east.local == nil {
		t.Skip("the traffic tests apply CRDs to the local harness's API servers")
	}
	standard, err := filepath.Glob(filepath.Join(gatewayCRDsDir, "standard", "*.yaml"))
	if err != nil || len(standard) == 0 {
		t.Fatalf("no Gateway API CRDs in %s/standard: %v", gatewayCRDsDir, err)
	}
	for _, c := range []*kubeCluster{e.east, e.west} {
		c.local.Apply(t, append(standard, trafficPolicyCRD)...)
		epoch := env.cluster(t, c.name).Epoch
		env.spokes.restart(t, c.name)
		env.awaitResynced(t, c.name, epoch)
	}
	e.eastNode, e.westNode = e.east.node(t, "us-east", "us-east-1a"), e.west.node(t, "us-west", "us-west-1a")
	e.hostA, e.hostB = startKubeBackend(t, "a"), startKubeBackend(t, "b")
	return e
}

// namespace creates ns in both clusters.
func (e *trEnv) namespace(t *testing.T, ns string) {
	t.Helper()
	createNamespace(t, e.east, ns)
	createNamespace(t, e.west, ns)
}

// client is a grpc-go xDS client in us-east-1a of service name's port 8080.
func (e *trEnv) client(t *testing.T, ns, name string) *trClient {
	t.Helper()
	target := fmt.Sprintf("%s.%s.svc.clusterset.local:%d", name, ns, backendPort)
	return &trClient{t: t, c: xdstest.NewClient(t, e.xds, "c-"+ns, locality("us-east", "us-east-1a"), target)}
}

// trClient calls a service and says which backend answered.
type trClient struct {
	t *testing.T
	c healthpb.HealthClient
}

// call makes one Check (bounded to 5s) and says who answered.
func (c *trClient) call(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var md metadata.MD
	_, err := c.c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
	if err != nil {
		return "", err
	}
	if v := md.Get(xdstest.BackendHeader); len(v) == 1 {
		return v[0], nil
	}
	return "", fmt.Errorf("answer without a %s header", xdstest.BackendHeader)
}

// shares calls n times and counts the answers per backend; failures count under "error".
func (c *trClient) shares(ctx context.Context, n int) map[string]int {
	out := map[string]int{}
	for range n {
		who, err := c.call(ctx)
		if err != nil {
			who = "error"
		}
		out[who]++
	}
	return out
}

// await makes batches of n calls until cond holds of one, for at most a minute.
func (c *trClient) await(ctx context.Context, what string, n int, cond func(map[string]int) bool) map[string]int {
	c.t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last map[string]int
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if last = c.shares(ctx, n); cond(last) {
			return last
		}
	}
	_, err := c.call(context.Background())
	c.t.Fatalf("timed out awaiting %s; last batch of %d: %v (a call now: %v)", what, n, last, err)
	return nil
}

// trImport is a backendRef to the ServiceImport name (every exporting
// cluster's endpoints; no port: the port the request came to).
func trImport(name string, weight int32) gatewayv1.GRPCBackendRef {
	return gatewayv1.GRPCBackendRef{BackendRef: gatewayv1.BackendRef{
		BackendObjectReference: gatewayv1.BackendObjectReference{
			Group: ptr(gatewayv1.Group("multicluster.x-k8s.io")),
			Kind:  ptr(gatewayv1.Kind("ServiceImport")),
			Name:  gatewayv1.ObjectName(name),
		},
		Weight: ptr(weight),
	}}
}

// trRoute is a GRPCRoute whose parent is the Service parent's port 8080 (GAMMA).
func trRoute(ns, name, parent string, rules ...gatewayv1.GRPCRouteRule) *gatewayv1.GRPCRoute {
	return &gatewayv1.GRPCRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: gatewayGroupVersion.String(), Kind: "GRPCRoute"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{serviceParent(parent)}},
			Rules:           rules,
		},
	}
}

// trPolicy is a TrafficPolicy targeting the Service target.
func trPolicy(ns, name, target string, spec func(*tpv1.TrafficPolicySpec)) *tpv1.TrafficPolicy {
	p := &tpv1.TrafficPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: tpv1.SchemeGroupVersion.String(), Kind: "TrafficPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: tpv1.TrafficPolicySpec{TargetRefs: []gatewayv1.LocalPolicyTargetReference{
			{Group: "", Kind: "Service", Name: gatewayv1.ObjectName(target)}}},
	}
	if spec != nil {
		spec(&p.Spec)
	}
	return p
}

// trCreate creates a typed object through the dynamic client, with strict
// field validation, and returns it as the API server holds it.
func trCreate(t *testing.T, c *kubeCluster, gvr schema.GroupVersionResource, obj metav1.Object) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u, err := c.dynamic.Resource(gvr).Namespace(obj.GetNamespace()).Create(t.Context(), &unstructured.Unstructured{Object: m},
		metav1.CreateOptions{FieldManager: kubetest.FieldManager, FieldValidation: metav1.FieldValidationStrict})
	if err != nil {
		t.Fatalf("create %s %s/%s in %s: %v", gvr.Resource, obj.GetNamespace(), obj.GetName(), c.name, err)
	}
	return u
}

// trUpdateRoute changes a GRPCRoute's spec (retrying while the spoke's
// status writes move its resourceVersion).
func trUpdateRoute(t *testing.T, c *kubeCluster, ns, name string, change func(*gatewayv1.GRPCRouteSpec)) {
	t.Helper()
	routes := c.dynamic.Resource(trGRPCRoutes).Namespace(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := routes.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var r gatewayv1.GRPCRoute
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
			return err
		}
		change(&r.Spec)
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&r)
		if err != nil {
			return err
		}
		_, err = routes.Update(t.Context(), &unstructured.Unstructured{Object: m},
			metav1.UpdateOptions{FieldManager: kubetest.FieldManager, FieldValidation: metav1.FieldValidationStrict})
		return err
	})
	if err != nil {
		t.Fatalf("update GRPCRoute %s/%s in %s: %v", ns, name, c.name, err)
	}
}

// trRouteConditions are the conditions of Nave's status.parents entry for
// the route's parent Service parent (nil: no such entry yet).
func trRouteConditions(t *testing.T, c *kubeCluster, ns, name, parent string) []metav1.Condition {
	t.Helper()
	u, err := c.dynamic.Resource(trGRPCRoutes).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var r gatewayv1.GRPCRoute
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Status.Parents {
		if p.ControllerName == kubetraffic.ControllerName && string(p.ParentRef.Name) == parent {
			return p.Conditions
		}
	}
	return nil
}

// trPolicyConditions are the conditions of Nave's status.ancestors entry
// for the policy's target Service target (nil: no such entry yet).
func trPolicyConditions(t *testing.T, c *kubeCluster, ns, name, target string) []metav1.Condition {
	t.Helper()
	u, err := c.dynamic.Resource(trTrafficPolicies).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var p tpv1.TrafficPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		t.Fatal(err)
	}
	for _, a := range p.Status.Ancestors {
		if a.ControllerName == kubetraffic.ControllerName && string(a.AncestorRef.Name) == target {
			return a.Conditions
		}
	}
	return nil
}

// trAwaitCondition waits (20s) until read's condition of type typ has the
// given status and reason, and returns it.
func trAwaitCondition(t *testing.T, what string, read func() []metav1.Condition, typ string, want metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var conds []metav1.Condition
	for {
		conds = read()
		if c := trCondition(conds, typ); c != nil && c.Status == want && c.Reason == reason {
			return *c
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out awaiting %s: condition %s %s reason %s; Nave's conditions are %+v", what, typ, want, reason, conds)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func trCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// trBackend serves a backend that behaves as b says on a new test host
// (answering normally until the test's behaviour is switched on).
func trBackend(t *testing.T, name string, b xdstest.Behaviour) *kubetest.Host {
	h := kubetest.NewHost(t)
	lis, err := h.Listen("tcp", fmt.Sprint(backendPort))
	if err != nil {
		t.Fatal(err)
	}
	xdstest.ServeBackendWith(t, name, lis, b)
	awaitBackend(t, h, name)
	return h
}

// TestTrafficEndToEnd: GRPCRoutes and TrafficPolicies on real API servers,
// carried by real spokes to a real hub, applied by real grpc-go clients.
func TestTrafficEndToEnd(t *testing.T) {
	e := startTrafficEnv(t)

	// 1. A GRPCRoute in east splits echo's requests 80/20 between the
	// ServiceImports echo (east: a) and echo-canary (west: b); moving the
	// weights moves the clients.
	t.Run("weights across clusters", func(t *testing.T) {
		const ns = "weights"
		e.namespace(t, ns)
		exportService(t, e.east, ns, "echo", false)
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{e.hostA, e.eastNode, true})
		exportService(t, e.west, ns, "echo-canary", false)
		setEndpoints(t, e.west, ns, "echo-canary", kubeEndpoint{e.hostB, e.westNode, true})
		split := func(echo, canary int32) []gatewayv1.GRPCRouteRule {
			return []gatewayv1.GRPCRouteRule{{BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo", echo), trImport("echo-canary", canary)}}}
		}
		trCreate(t, e.east, trGRPCRoutes, trRoute(ns, "echo", "echo", split(80, 20)...))

		c := e.client(t, ns, "echo")
		ctx := t.Context()
		c.await(ctx, "both backends to answer", 50, func(m map[string]int) bool { return m["a"] > 0 && m["b"] > 0 && m["error"] == 0 })
		got := c.shares(ctx, 2000)
		if share := 100 * float64(got["b"]) / 2000; got["error"] > 0 || share < 16 || share > 24 {
			t.Fatalf("80/20 split over 2,000 calls: %v (b %.1f%%), want b within 20±4%% and no error", got, share)
		}
		t.Logf("80/20: %v", got)

		edited := time.Now()
		trUpdateRoute(t, e.east, ns, "echo", func(s *gatewayv1.GRPCRouteSpec) { s.Rules = split(20, 80) })
		c.await(ctx, "the 20/80 split", 500, func(m map[string]int) bool { return m["b"] >= 350 && m["b"] <= 450 && m["error"] == 0 })
		t.Logf("route edited -> clients on the 20/80 split in %v", time.Since(edited).Round(time.Millisecond))
		got = c.shares(ctx, 2000)
		if share := 100 * float64(got["b"]) / 2000; got["error"] > 0 || share < 76 || share > 84 {
			t.Fatalf("20/80 split over 2,000 calls: %v (b %.1f%%), want b within 80±4%% and no error", got, share)
		}
		t.Logf("20/80: %v", got)
	})

	// 2. One GRPCRoute with a header match and a method match (as
	// xds.TestTrafficHeaderAndMethodMatches): x-canary: yes and Health/Watch
	// go to echo-canary (b), the rest to echo (a).
	t.Run("header and method matches", func(t *testing.T) {
		const ns = "matches"
		e.namespace(t, ns)
		exportService(t, e.east, ns, "echo", false)
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{e.hostA, e.eastNode, true})
		exportService(t, e.west, ns, "echo-canary", false)
		setEndpoints(t, e.west, ns, "echo-canary", kubeEndpoint{e.hostB, e.westNode, true})
		trCreate(t, e.east, trGRPCRoutes, trRoute(ns, "echo", "echo",
			gatewayv1.GRPCRouteRule{
				Matches: []gatewayv1.GRPCRouteMatch{{Headers: []gatewayv1.GRPCHeaderMatch{{
					Type: ptr(gatewayv1.GRPCHeaderMatchExact), Name: "X-Canary", Value: "yes"}}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo-canary", 1)},
			},
			gatewayv1.GRPCRouteRule{
				Matches: []gatewayv1.GRPCRouteMatch{{Method: &gatewayv1.GRPCMethodMatch{
					Type: ptr(gatewayv1.GRPCMethodMatchExact), Service: ptr("grpc.health.v1.Health"), Method: ptr("Watch")}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo-canary", 1)},
			},
			gatewayv1.GRPCRouteRule{BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo", 1)}},
		))

		c := e.client(t, ns, "echo")
		ctx := t.Context()
		marked := metadata.AppendToOutgoingContext(ctx, "x-canary", "yes")
		c.await(marked, "marked calls to go to b", 20, func(m map[string]int) bool { return m["b"] == 20 })
		if got := c.shares(marked, 200); got["b"] != 200 {
			t.Errorf("marked calls: %v, want all 200 on b", got)
		}
		if got := c.shares(metadata.AppendToOutgoingContext(ctx, "x-canary", "no"), 200); got["a"] != 200 {
			t.Errorf("calls with x-canary: no: %v, want all 200 on a", got)
		}
		if got := c.shares(ctx, 200); got["a"] != 200 {
			t.Errorf("unmarked calls: %v, want all 200 on a", got)
		}
		// Watch (a streaming method) goes to b; Check stays on a.
		for range 20 {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			stream, err := c.c.Watch(sctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			md, err := stream.Header()
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if who := md.Get(xdstest.BackendHeader); len(who) != 1 || who[0] != "b" {
				t.Fatalf("Watch answered by %v, want b", who)
			}
		}
	})

	// 3. A TrafficPolicy's timeout ends calls to a slow backend, and its
	// retry hides a backend that fails every other call.
	t.Run("policy timeout", func(t *testing.T) {
		const ns = "timeout"
		e.namespace(t, ns)
		var slow atomic.Bool
		host := trBackend(t, "slow", func(ctx context.Context, _ string) error {
			if !slow.Load() {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Second):
				return nil
			}
		})
		exportService(t, e.east, ns, "echo", false)
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{host, e.eastNode, true})
		c := e.client(t, ns, "echo")
		ctx := t.Context()
		c.await(ctx, "the backend to answer", 1, func(m map[string]int) bool { return m["slow"] == 1 })
		slow.Store(true)
		trCreate(t, e.east, trTrafficPolicies, trPolicy(ns, "echo", "echo", func(s *tpv1.TrafficPolicySpec) {
			s.Timeout = ptr(gatewayv1.Duration("100ms"))
		}))
		// Until the policy applies, a call lasts as long as the caller's 3s deadline.
		timed := func() (time.Duration, error) {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			start := time.Now()
			_, err := c.c.Check(cctx, &healthpb.HealthCheckRequest{})
			return time.Since(start), err
		}
		created := time.Now()
		awaitFor(t, "the policy's 100ms timeout to apply", time.Minute, func() bool {
			took, err := timed()
			return status.Code(err) == codes.DeadlineExceeded && took < 2*time.Second
		})
		t.Logf("policy created -> calls time out in %v", time.Since(created).Round(time.Millisecond))
		var longest time.Duration
		for range 20 {
			took, err := timed()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("call to a slow backend: %v after %v, want DeadlineExceeded", err, took)
			}
			// Near 100 ms: never before it, and well before the backend's 10s (or the caller's 3s).
			if took < 100*time.Millisecond || took > 2*time.Second {
				t.Fatalf("call ended after %v, want about 100ms", took)
			}
			longest = max(longest, took)
		}
		t.Logf("20 calls ended DeadlineExceeded, the longest after %v", longest)
	})

	t.Run("policy retry", func(t *testing.T) {
		const ns = "retry"
		e.namespace(t, ns)
		var calls atomic.Int64
		host := trBackend(t, "flaky", func(context.Context, string) error {
			if calls.Add(1)%2 == 0 {
				return status.Error(codes.Unavailable, "every other call fails")
			}
			return nil
		})
		exportService(t, e.east, ns, "echo", false)
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{host, e.eastNode, true})
		c := e.client(t, ns, "echo")
		ctx := t.Context()
		c.await(ctx, "the backend to answer", 2, func(m map[string]int) bool { return m["flaky"] > 0 })
		// Without a retry, about half the calls fail. (With it, each call
		// fails once and waits the client's default backoff, up to 25ms:
		// the 1,000 calls take about 25s.)
		if got := c.shares(ctx, 200); got["error"] < 50 {
			t.Fatalf("without retries: %v, want about half failing", got)
		}
		trCreate(t, e.east, trTrafficPolicies, trPolicy(ns, "echo", "echo", func(s *tpv1.TrafficPolicySpec) {
			backoff := gatewayv1.Duration("1ms")
			s.Retry = &tpv1.Retry{Attempts: 2, Backoff: &backoff, Codes: []tpv1.RetryCode{tpv1.RetryUnavailable}}
		}))
		c.await(ctx, "retries to apply", 20, func(m map[string]int) bool { return m["error"] == 0 })
		got := c.shares(ctx, 1000)
		if got["flaky"] < 990 {
			t.Fatalf("with retries: %v, want at least 99%% of 1,000 calls to succeed", got)
		}
		t.Logf("with retries: %v (the backend saw %d calls in all)", got, calls.Load())
	})

	// 4. The statuses the leading spoke writes: route parents and policy ancestors.
	t.Run("status", func(t *testing.T) {
		const ns = "status"
		e.namespace(t, ns)
		east := e.east
		exportService(t, east, ns, "echo", false)
		// hidden is a Service without a ServiceExport.
		if _, err := east.client.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hidden"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: backendPort, Protocol: corev1.ProtocolTCP}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		trCreate(t, east, trGRPCRoutes, trRoute(ns, "good", "echo",
			gatewayv1.GRPCRouteRule{BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo", 1)}}))
		deployment := trImport("echo", 1)
		deployment.Group, deployment.Kind = ptr(gatewayv1.Group("apps")), ptr(gatewayv1.Kind("Deployment"))
		trCreate(t, east, trGRPCRoutes, trRoute(ns, "to-deployment", "echo",
			gatewayv1.GRPCRouteRule{BackendRefs: []gatewayv1.GRPCBackendRef{deployment}}))
		trCreate(t, east, trGRPCRoutes, trRoute(ns, "on-hidden", "hidden",
			gatewayv1.GRPCRouteRule{BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo", 1)}}))

		route := func(name, parent string) func() []metav1.Condition {
			return func() []metav1.Condition { return trRouteConditions(t, east, ns, name, parent) }
		}
		accepted, resolved := string(gatewayv1.RouteConditionAccepted), string(gatewayv1.RouteConditionResolvedRefs)
		trAwaitCondition(t, "route good Accepted", route("good", "echo"), accepted, metav1.ConditionTrue, string(gatewayv1.RouteReasonAccepted))
		trAwaitCondition(t, "route good ResolvedRefs", route("good", "echo"), resolved, metav1.ConditionTrue, string(gatewayv1.RouteReasonResolvedRefs))
		c := trAwaitCondition(t, "route to-deployment ResolvedRefs False", route("to-deployment", "echo"), resolved,
			metav1.ConditionFalse, string(gatewayv1.RouteReasonInvalidKind))
		t.Logf("to-deployment: ResolvedRefs False InvalidKind: %s", c.Message)
		c = trAwaitCondition(t, "route on-hidden Accepted False", route("on-hidden", "hidden"), accepted,
			metav1.ConditionFalse, string(gatewayv1.RouteReasonNoMatchingParent))
		t.Logf("on-hidden: Accepted False NoMatchingParent: %s", c.Message)

		// Two policies target echo: the older applies, the newer is Conflicted.
		// The newer's name sorts first, so that only age can order them.
		older := trCreate(t, east, trTrafficPolicies, trPolicy(ns, "older", "echo", func(s *tpv1.TrafficPolicySpec) {
			s.Timeout = ptr(gatewayv1.Duration("5s"))
		}))
		await(t, "a creation time a second after the older policy's", func() bool {
			return time.Now().Add(-time.Second).After(older.GetCreationTimestamp().Time)
		})
		newer := trCreate(t, east, trTrafficPolicies, trPolicy(ns, "a-newer", "echo", func(s *tpv1.TrafficPolicySpec) {
			s.Timeout = ptr(gatewayv1.Duration("7s"))
		}))
		if !newer.GetCreationTimestamp().After(older.GetCreationTimestamp().Time) {
			t.Fatalf("policy a-newer created at %v, not after older's %v", newer.GetCreationTimestamp(), older.GetCreationTimestamp())
		}
		policy := func(name, target string) func() []metav1.Condition {
			return func() []metav1.Condition { return trPolicyConditions(t, east, ns, name, target) }
		}
		policyAccepted := string(gatewayv1.PolicyConditionAccepted)
		trAwaitCondition(t, "policy older Accepted", policy("older", "echo"), policyAccepted, metav1.ConditionTrue, string(gatewayv1.PolicyReasonAccepted))
		c = trAwaitCondition(t, "policy a-newer Conflicted", policy("a-newer", "echo"), policyAccepted,
			metav1.ConditionFalse, string(gatewayv1.PolicyReasonConflicted))
		t.Logf("a-newer: Accepted False Conflicted: %s", c.Message)
		trCreate(t, east, trTrafficPolicies, trPolicy(ns, "ghost", "ghost", func(s *tpv1.TrafficPolicySpec) {
			s.Timeout = ptr(gatewayv1.Duration("1s"))
		}))
		c = trAwaitCondition(t, "policy ghost TargetNotFound", policy("ghost", "ghost"), policyAccepted,
			metav1.ConditionFalse, string(gatewayv1.PolicyReasonTargetNotFound))
		t.Logf("ghost: Accepted False TargetNotFound: %s", c.Message)

		// Statuses follow changes of what they depend on.
		t.Run("exporting the parent accepts its route", func(t *testing.T) {
			createServiceExport(t, east, ns, "hidden")
			trAwaitCondition(t, "route on-hidden Accepted once hidden is exported", route("on-hidden", "hidden"), accepted,
				metav1.ConditionTrue, string(gatewayv1.RouteReasonAccepted))
		})
		t.Run("deleting the older policy accepts the newer", func(t *testing.T) {
			if err := east.dynamic.Resource(trTrafficPolicies).Namespace(ns).Delete(t.Context(), "older", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(time.Minute)
			for {
				cond := trCondition(trPolicyConditions(t, east, ns, "a-newer", "echo"), policyAccepted)
				if cond != nil && cond.Status == metav1.ConditionTrue {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("a minute after TrafficPolicy older was deleted, a-newer, now the only policy targeting echo "+
						"and the one its shard carries, still says %+v: a policy's event must requeue the status of every "+
						"policy naming the same Service", cond)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	})

	// 5. One GRPCRoute name attached to echo in both clusters with different
	// content: the hub keeps the oldest export's and reports a RouteConflict,
	// which the ServiceExports show.
	t.Run("route conflict across clusters", func(t *testing.T) {
		const ns = "conflict"
		e.namespace(t, ns)
		exportService(t, e.east, ns, "echo", false)
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{e.hostA, e.eastNode, true})
		exportService(t, e.west, ns, "echo", false)
		setEndpoints(t, e.west, ns, "echo", kubeEndpoint{e.hostB, e.westNode, true})
		await(t, "conflict/echo from both clusters", func() bool { return len(e.service(t, ns+"/echo").Clusters) == 2 })

		// First a route alike in both clusters (one manifest applied to each,
		// a second or more apart), then the conflicting one.
		same := func() *gatewayv1.GRPCRoute {
			return trRoute(ns, "same", "echo", gatewayv1.GRPCRouteRule{BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo", 1)}})
		}
		first := trCreate(t, e.east, trGRPCRoutes, same())
		await(t, "a creation time a second after east's route", func() bool {
			return time.Now().Add(-time.Second).After(first.GetCreationTimestamp().Time)
		})
		trCreate(t, e.west, trGRPCRoutes, same())
		trCreate(t, e.east, trGRPCRoutes, trRoute(ns, "echo", "echo",
			gatewayv1.GRPCRouteRule{BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo", 1)}}))
		trCreate(t, e.west, trGRPCRoutes, trRoute(ns, "echo", "echo",
			gatewayv1.GRPCRouteRule{
				Matches: []gatewayv1.GRPCRouteMatch{{Headers: []gatewayv1.GRPCHeaderMatch{{
					Type: ptr(gatewayv1.GRPCHeaderMatchExact), Name: "x-west", Value: "yes"}}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo", 1)},
			},
			gatewayv1.GRPCRouteRule{BackendRefs: []gatewayv1.GRPCBackendRef{trImport("echo", 1)}},
		))

		var conflict registry.Conflict
		var conflicts []registry.Conflict
		awaitFor(t, `a RouteConflict on GRPCRoute "echo" at the hub`, 30*time.Second, func() bool {
			conflicts = e.service(t, ns+"/echo").Conflicts
			for _, c := range conflicts {
				if c.Kind == registry.RouteConflict && c.Property == `GRPCRoute "echo"` {
					conflict = c
					return true
				}
			}
			return false
		})
		t.Logf("the hub's conflict: %s", conflict)
		if conflict.Winner == conflict.Loser || (conflict.Loser != "east" && conflict.Loser != "west") {
			t.Fatalf("conflict %+v: want a winner and a loser among east and west", conflict)
		}
		loser, winner := e.clusters[string(conflict.Loser)], e.clusters[string(conflict.Winner)]
		var cond map[string]any
		await(t, "a Conflict condition on "+loser.name+"'s ServiceExport naming RouteConflict", func() bool {
			cond = exportConditions(t, loser, ns, "echo")[spoke.ConditionConflict]
			return cond["status"] == "True" && strings.Contains(fmt.Sprint(cond["reason"]), string(registry.RouteConflict))
		})
		if msg := fmt.Sprint(cond["message"]); !strings.Contains(msg, `GRPCRoute "echo"`) {
			t.Errorf("%s's Conflict condition: %v, want a message naming GRPCRoute \"echo\"", loser.name, cond)
		}
		t.Logf("%s (lost): Conflict %v %v: %v", loser.name, cond["status"], cond["reason"], cond["message"])
		t.Logf("%s (won): Conflict %v", winner.name, exportConditions(t, winner, ns, "echo")[spoke.ConditionConflict])

		t.Run("a route alike in both clusters is no conflict", func(t *testing.T) {
			// Both shards carry route same: each carries echo, created after it.
			for _, c := range conflicts {
				if c.Property == `GRPCRoute "same"` {
					t.Fatalf("GRPCRoute \"same\", created alike in east and west a second apart, is a %s: %q; one manifest "+
						"applied to two clusters must be one route", c.Kind, c.Reason)
				}
			}
		})
	})

	// 6. Outlier detection (as xds.TestTrafficOutlierDetectionEjectsAFailingEndpoint):
	// of echo's two endpoints one fails every call; the TrafficPolicy's
	// failurePercentage ejects it, and once it recovers it is called again.
	t.Run("policy outlier detection", func(t *testing.T) {
		const ns = "outlier"
		e.namespace(t, ns)
		var broken atomic.Bool
		good := trBackend(t, "good", nil)
		bad := trBackend(t, "bad", func(context.Context, string) error {
			if broken.Load() {
				return status.Error(codes.Internal, "broken")
			}
			return nil
		})
		exportService(t, e.east, ns, "echo", false)
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{good, e.eastNode, true}, kubeEndpoint{bad, e.eastNode, true})
		c := e.client(t, ns, "echo")
		ctx := t.Context()
		c.await(ctx, "both endpoints to answer", 50, func(m map[string]int) bool { return m["good"] > 0 && m["bad"] > 0 && m["error"] == 0 })
		broken.Store(true)
		// Without the policy, round robin sends half the calls to the failing endpoint.
		if got := c.shares(ctx, 200); got["error"] < 50 {
			t.Fatalf("without outlier detection: %v, want about half failing", got)
		}
		created := time.Now()
		trCreate(t, e.east, trTrafficPolicies, trPolicy(ns, "echo", "echo", func(s *tpv1.TrafficPolicySpec) {
			s.OutlierDetection = &tpv1.OutlierDetection{
				Interval:           ptr(gatewayv1.Duration("200ms")),
				BaseEjectionTime:   ptr(gatewayv1.Duration("1s")),
				MaxEjectionPercent: ptr(int32(50)),
				FailurePercentage:  &tpv1.FailurePercentage{Threshold: 50, MinimumHosts: ptr(int32(2)), RequestVolume: ptr(int32(5))},
			}
		}))
		// Ejected: the failing endpoint gets under 5% of the calls.
		got := c.await(ctx, "the failing endpoint's ejection", 200, func(m map[string]int) bool { return m["error"] < 10 })
		t.Logf("policy created -> failing endpoint ejected in %v; a batch of 200: %v", time.Since(created).Round(time.Millisecond), got)
		// Recovered: once its ejection ends it is called again.
		broken.Store(false)
		recovered := time.Now()
		got = c.await(ctx, "the recovered endpoint to be called again", 100, func(m map[string]int) bool { return m["bad"] > 0 })
		t.Logf("endpoint recovered -> called again in %v; a batch of 100: %v", time.Since(recovered).Round(time.Millisecond), got)
	})

	// 7. Ring hash by header (as xds.TestTrafficRingHashKeepsAKeyOnOneEndpoint):
	// each x-user stays on one of echo's three endpoints, and the keys spread.
	t.Run("policy ring hash", func(t *testing.T) {
		const ns = "ringhash"
		e.namespace(t, ns)
		var eps []kubeEndpoint
		for i := range 3 {
			eps = append(eps, kubeEndpoint{startKubeBackend(t, fmt.Sprintf("r%d", i)), e.eastNode, true})
		}
		exportService(t, e.east, ns, "echo", false)
		setEndpoints(t, e.east, ns, "echo", eps...)
		c := e.client(t, ns, "echo")
		ctx := t.Context()
		every := func(m map[string]int) bool { return m["r0"] > 0 && m["r1"] > 0 && m["r2"] > 0 && m["error"] == 0 }
		c.await(ctx, "every endpoint to answer", 30, every)
		created := time.Now()
		trCreate(t, e.east, trTrafficPolicies, trPolicy(ns, "echo", "echo", func(s *tpv1.TrafficPolicySpec) {
			s.LoadBalancer = &tpv1.LoadBalancer{Algorithm: tpv1.RingHash, HashHeader: "x-user"}
		}))
		// Round robin never puts 20 calls in a row on one of three endpoints:
		// a key that stays on one is the ring hash applying.
		probe := metadata.AppendToOutgoingContext(ctx, "x-user", "probe")
		c.await(probe, "the ring hash to apply", 20, func(m map[string]int) bool { return len(m) == 1 && m["error"] == 0 })
		t.Logf("policy created -> ring hash applies in %v", time.Since(created).Round(time.Millisecond))
		// Calls without the header hash at random: every endpoint connected.
		c.await(ctx, "every endpoint to answer calls without x-user", 30, every)

		used := map[string]int{} // keys per backend
		onOne := 0               // calls on their key's backend
		for key := range 30 {
			got := c.shares(metadata.AppendToOutgoingContext(ctx, "x-user", fmt.Sprintf("user-%d", key)), 20)
			most := ""
			for who, n := range got {
				if most == "" || n > got[most] {
					most = who
				}
			}
			if most == "error" || got[most] != 20 {
				t.Errorf("key user-%d: %v, want all 20 calls on one backend", key, got)
			}
			if most != "error" {
				onOne += got[most]
				used[most]++
			}
		}
		t.Logf("30 keys x 20 calls: %d of 600 (%.1f%%) on each key's backend; keys per backend %v", onOne, 100*float64(onOne)/600, used)
		if 100*onOne < 99*600 {
			t.Errorf("%d of 600 calls on their key's backend, want at least 99%%", onOne)
		}
		if len(used) < 2 {
			t.Errorf("30 keys all went to %v: the ring should spread them", used)
		}
	})

	// 8. failoverPriority [nave.io/cluster, topology.kubernetes.io/zone] (as
	// xds.TestTrafficFailoverPriorityKeepsClientsInTheirCluster): a client of
	// east in zone us-east-1a stays on east's endpoint in us-east-1b though
	// west has one in us-east-1a, and fails over to it when east has none.
	t.Run("policy failover priority", func(t *testing.T) {
		const ns = "failover"
		e.namespace(t, ns)
		// One region, two zones: east's endpoint in us-east-1b, west's in us-east-1a
		// (the Nodes' labels say both).
		eastB, westA := e.east.node(t, "us-east", "us-east-1b"), e.west.node(t, "us-east", "us-east-1a")
		hostEast, hostWest := startKubeBackend(t, "east-1b"), startKubeBackend(t, "west-1a")
		exportService(t, e.east, ns, "echo", false)
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{hostEast, eastB, true})
		exportService(t, e.west, ns, "echo", false)
		setEndpoints(t, e.west, ns, "echo", kubeEndpoint{hostWest, westA, true})
		await(t, ns+"/echo from both clusters", func() bool { return len(e.service(t, ns+"/echo").Clusters) == 2 })

		target := fmt.Sprintf("echo.%s.svc.clusterset.local:%d", ns, backendPort)
		c := &trClient{t: t, c: xdstest.NewClientWith(t, e.xds, "c-"+ns, locality("us-east", "us-east-1a"),
			map[string]string{xds.MetadataCluster: "east"}, target)}
		ctx := t.Context()
		// By default the client's zone comes first: west's endpoint.
		c.await(ctx, "the default: the client's zone first", 20, func(m map[string]int) bool { return m["west-1a"] == 20 })
		if got := c.shares(ctx, 100); got["west-1a"] != 100 {
			t.Fatalf("without a policy: %v, want every call in the client's zone (west-1a)", got)
		}

		created := time.Now()
		trCreate(t, e.east, trTrafficPolicies, trPolicy(ns, "echo", "echo", func(s *tpv1.TrafficPolicySpec) {
			s.Locality = &tpv1.Locality{FailoverPriority: []tpv1.LocalityLabel{tpv1.LabelCluster, tpv1.LabelZone}}
		}))
		c.await(ctx, "its own cluster first", 20, func(m map[string]int) bool { return m["east-1b"] == 20 })
		t.Logf("policy created -> client in its own cluster in %v", time.Since(created).Round(time.Millisecond))
		if got := c.shares(ctx, 200); got["east-1b"] != 200 {
			t.Fatalf("with failoverPriority [cluster, zone]: %v, want every call in the client's cluster (east-1b)", got)
		}

		// East has no ready endpoint left: the client fails over to west's.
		written := time.Now()
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{hostEast, eastB, false})
		c.await(ctx, "failover to the other cluster", 20, func(m map[string]int) bool { return m["west-1a"] == 20 })
		t.Logf("east's endpoint not ready -> failed over to west in %v", time.Since(written).Round(time.Millisecond))
		written = time.Now()
		setEndpoints(t, e.east, ns, "echo", kubeEndpoint{hostEast, eastB, true})
		c.await(ctx, "back to its own cluster", 20, func(m map[string]int) bool { return m["east-1b"] == 20 })
		t.Logf("east's endpoint ready -> back in east in %v", time.Since(written).Round(time.Millisecond))
	})
}
