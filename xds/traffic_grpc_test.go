package xds

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// The traffic policy of a service as real grpc-go xDS clients apply it:
// every test serves Nave's xDS on a real gRPC server to real clients that
// call real backends. Tolerances hold on a busy two-core machine: shares
// are counted over many calls, and nothing waits on a wall-clock window
// but the timeout the policy itself sets.

// trafficRig is an xDS server, the registry it serves, and a client of echo.
type trafficRig struct {
	t      *testing.T
	ctx    context.Context
	srv    *Server
	reg    *registry.Registry
	addr   string
	client healthpb.HealthClient
}

func newTrafficRig(t *testing.T) *trafficRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv, _, addr := startXDS(t)
	return &trafficRig{t: t, ctx: ctx, srv: srv, reg: registry.New(), addr: addr}
}

// apply applies shards and serves the result.
func (g *trafficRig) apply(shards ...*registry.Shard) {
	g.t.Helper()
	var d registry.Diff
	g.reg, d = apply(g.t, g.reg, shards...)
	g.srv.Update(g.reg, d)
}

// dial makes the client of echo's port 8080 (after the first apply).
func (g *trafficRig) dial() healthpb.HealthClient {
	g.t.Helper()
	if g.client == nil {
		g.client = xdstest.NewClient(g.t, g.addr, "client", loc("r1", "z1"), ListenerName(echo, 8080))
	}
	return g.client
}

// call makes one Check and says which backend answered.
func (g *trafficRig) call(ctx context.Context) (string, error) {
	var md metadata.MD
	_, err := g.dial().Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
	if v := md.Get(xdstest.BackendHeader); len(v) > 0 {
		return v[0], err
	}
	return "", err
}

// shares calls n times and counts the answers per backend; failures count under "error".
func (g *trafficRig) shares(ctx context.Context, n int) map[string]int {
	out := map[string]int{}
	for range n {
		who, err := g.call(ctx)
		if err != nil {
			who = "error"
		}
		out[who]++
	}
	return out
}

// await calls until cond holds of the answers of a batch of n calls.
func (g *trafficRig) await(what string, n int, cond func(map[string]int) bool) map[string]int {
	g.t.Helper()
	var last map[string]int
	for g.ctx.Err() == nil {
		if last = g.shares(g.ctx, n); cond(last) {
			return last
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := g.call(ctx)
	g.t.Fatalf("timed out awaiting %s; last batch: %v (a call now: %v)", what, last, err)
	return nil
}

// backendShard is svc's shard in cluster c with backend b as its one endpoint.
func backendShard(c registry.ClusterID, svc registry.ServiceKey, b xdstest.Backend, set traffic.Set) *registry.Shard {
	s := shard(c, svc, []registry.ServicePort{tcp("grpc", 8080)}, ep(b.Addr.IP.String(), loc("r1", "z1"), ready, eport("grpc", int32(b.Addr.Port))))
	s.Traffic = set
	s.Normalize()
	return s
}

func grpcRoute(rules ...traffic.Rule) traffic.Set {
	return traffic.Set{Routes: []traffic.Route{{Kind: traffic.GRPCRoute, Name: "echo", Port: 8080, Rules: rules}}}
}

func TestTrafficWeightsSplitAcrossClusters(t *testing.T) {
	g := newTrafficRig(t)
	a := xdstest.StartBackend(t, "a", "127.0.0.1")
	b := xdstest.StartBackend(t, "b", "127.0.0.2")
	split := func(wa, wb int32) *registry.Shard {
		return backendShard("east", echo, a, grpcRoute(traffic.Rule{Backends: []traffic.Backend{importOf("echo", wa), importOf("echo-canary", wb)}}))
	}
	g.apply(split(80, 20), backendShard("west", canary, b, traffic.Set{}))
	g.await("both backends to answer", 50, func(m map[string]int) bool { return m["a"] > 0 && m["b"] > 0 })
	got := g.shares(g.ctx, 2000)
	if share := 100 * float64(got["b"]) / 2000; got["error"] > 0 || share < 16 || share > 24 {
		t.Fatalf("80/20 split over 2,000 calls: %v (b %.1f%%), want b within 20±4%%", got, share)
	}
	// Moving the weight is a route change: clients follow it.
	g.apply(split(20, 80))
	got = g.await("the 20/80 split", 500, func(m map[string]int) bool { return m["b"] > 350 })
	t.Logf("after moving the weight: %v", got)
}

func TestTrafficHeaderAndMethodMatches(t *testing.T) {
	g := newTrafficRig(t)
	a := xdstest.StartBackend(t, "a", "127.0.0.1")
	b := xdstest.StartBackend(t, "b", "127.0.0.2")
	route := grpcRoute(
		traffic.Rule{
			Matches:  []traffic.Match{{Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-canary", Value: "yes"}}}},
			Backends: []traffic.Backend{importOf("echo-canary", 1)},
		},
		traffic.Rule{
			Matches:  []traffic.Match{{Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "grpc.health.v1.Health", Method: "Watch"}}},
			Backends: []traffic.Backend{importOf("echo-canary", 1)},
		},
		traffic.Rule{Backends: []traffic.Backend{importOf("echo", 1)}},
	)
	g.apply(backendShard("east", echo, a, route), backendShard("west", canary, b, traffic.Set{}))
	g.await("unmarked calls to go to a", 20, func(m map[string]int) bool { return m["a"] == 20 })

	marked := metadata.AppendToOutgoingContext(g.ctx, "x-canary", "yes")
	if got := g.shares(marked, 200); got["b"] != 200 {
		t.Errorf("marked calls: %v, want all 200 on b", got)
	}
	if got := g.shares(g.ctx, 200); got["a"] != 200 {
		t.Errorf("unmarked calls: %v, want all 200 on a", got)
	}
	// Watch (a streaming method) goes to b; Check stays on a.
	for range 20 {
		stream, err := g.dial().Watch(g.ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		md, err := stream.Header()
		if err != nil {
			t.Fatal(err)
		}
		if who := md.Get(xdstest.BackendHeader); len(who) != 1 || who[0] != "b" {
			t.Fatalf("Watch answered by %v, want b", who)
		}
	}
}

func TestTrafficTimeoutEndsSlowCalls(t *testing.T) {
	g := newTrafficRig(t)
	slow := xdstest.StartBackendWith(t, "slow", "127.0.0.1", func(ctx context.Context, _ string) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return nil
		}
	})
	policy := traffic.Set{Policy: &traffic.Policy{Name: "echo", Timeout: 100 * time.Millisecond}}
	g.apply(backendShard("east", echo, slow, policy))
	g.await("the timeout to apply", 1, func(m map[string]int) bool { return m["error"] == 1 })
	for range 10 {
		start := time.Now()
		_, err := g.call(g.ctx)
		took := time.Since(start)
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("call to a slow backend: %v, want DeadlineExceeded", err)
		}
		// Near 100 ms: never before it, and well before the backend's 10 s.
		if took < 100*time.Millisecond || took > 2*time.Second {
			t.Fatalf("call ended after %v, want about 100ms", took)
		}
	}
}

func TestTrafficRetriesOnUnavailable(t *testing.T) {
	g := newTrafficRig(t)
	var calls atomic.Int64
	flaky := xdstest.StartBackendWith(t, "flaky", "127.0.0.1", func(context.Context, string) error {
		if calls.Add(1)%2 == 0 {
			return status.Error(codes.Unavailable, "every other call fails")
		}
		return nil
	})
	g.apply(backendShard("east", echo, flaky, traffic.Set{}))
	// Without a retry, about half the calls fail.
	if got := g.shares(g.ctx, 200); got["error"] < 50 {
		t.Fatalf("without retries: %v, want about half failing", got)
	}
	retry := traffic.Set{Policy: &traffic.Policy{Name: "echo", Retry: &traffic.Retry{Attempts: 2, Backoff: time.Millisecond, GRPCCodes: []string{"unavailable"}}}}
	g.apply(backendShard("east", echo, flaky, retry))
	g.await("retries to apply", 20, func(m map[string]int) bool { return m["error"] == 0 })
	got := g.shares(g.ctx, 1000)
	if ok := got["flaky"]; ok < 990 {
		t.Fatalf("with retries: %v, want at least 99%% of 1,000 calls to succeed", got)
	}
}

func TestTrafficOutlierDetectionEjectsAFailingEndpoint(t *testing.T) {
	g := newTrafficRig(t)
	var broken atomic.Bool
	broken.Store(true)
	good := xdstest.StartBackend(t, "good", "127.0.0.1")
	bad := xdstest.StartBackendWith(t, "bad", "127.0.0.2", func(context.Context, string) error {
		if broken.Load() {
			return status.Error(codes.Internal, "broken")
		}
		return nil
	})
	policy := traffic.Set{Policy: &traffic.Policy{Name: "echo", OutlierDetection: &traffic.OutlierDetection{
		Interval: 200 * time.Millisecond, BaseEjectionTime: time.Second, MaxEjectionPercent: 50,
		FailurePercentage: &traffic.FailurePercentage{Threshold: 50, MinimumHosts: 2, RequestVolume: 5},
	}}}
	s := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep(good.Addr.IP.String(), loc("r1", "z1"), ready, eport("grpc", int32(good.Addr.Port))),
		ep(bad.Addr.IP.String(), loc("r1", "z1"), ready, eport("grpc", int32(bad.Addr.Port))))
	s.Traffic = policy
	s.Normalize()
	g.apply(s)
	// Ejected: the failing endpoint gets under 5% of the calls.
	got := g.await("the failing endpoint's ejection", 200, func(m map[string]int) bool { return m["error"] < 10 })
	t.Logf("after ejection: %v", got)
	// Recovered: once its ejection ends it is called again.
	broken.Store(false)
	g.await("the recovered endpoint to be called again", 100, func(m map[string]int) bool { return m["bad"] > 0 })
}

func TestTrafficRingHashKeepsAKeyOnOneEndpoint(t *testing.T) {
	g := newTrafficRig(t)
	var eps []registry.Endpoint
	for i := range 3 {
		b := xdstest.StartBackend(t, fmt.Sprintf("b%d", i), fmt.Sprintf("127.0.0.%d", i+1))
		eps = append(eps, ep(b.Addr.IP.String(), loc("r1", "z1"), ready, eport("grpc", int32(b.Addr.Port))))
	}
	s := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, eps...)
	s.Traffic = traffic.Set{Policy: &traffic.Policy{Name: "echo", LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-user"}}}
	s.Normalize()
	g.apply(s)
	g.await("every backend to be up", 30, func(m map[string]int) bool { return m["error"] == 0 })
	used := map[string]bool{}
	for key := range 30 {
		ctx := metadata.AppendToOutgoingContext(g.ctx, "x-user", fmt.Sprintf("user-%d", key))
		got := g.shares(ctx, 20)
		for who, n := range got {
			if who == "error" || n != 20 {
				t.Fatalf("key user-%d: %v, want every call on one backend", key, got)
			}
			used[who] = true
		}
	}
	if len(used) < 2 {
		t.Errorf("30 keys all went to %v: the ring should spread them", used)
	}
}

func TestTrafficBackendNoClusterExportsFailsAtOnce(t *testing.T) {
	g := newTrafficRig(t)
	a := xdstest.StartBackend(t, "a", "127.0.0.1")
	g.apply(backendShard("east", echo, a, grpcRoute(traffic.Rule{Backends: []traffic.Backend{importOf("ghost", 1)}})))
	ctx, cancel := context.WithTimeout(g.ctx, 10*time.Second)
	defer cancel()
	_, err := g.call(ctx)
	if status.Code(err) != codes.Unavailable || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("a call routed to an unexported backend: %v, want UNAVAILABLE at once", err)
	}
	// Once a cluster exports it, calls reach it.
	ghostBackend := xdstest.StartBackend(t, "ghost", "127.0.0.2")
	g.apply(backendShard("west", ghost, ghostBackend, traffic.Set{}))
	g.await("ghost to answer", 10, func(m map[string]int) bool { return m["ghost"] == 10 })
}

func TestTrafficLoadBalancersAreAccepted(t *testing.T) {
	for _, alg := range []traffic.Algorithm{traffic.RoundRobin, traffic.LeastRequest, traffic.WeightedRoundRobin} {
		t.Run(string(alg), func(t *testing.T) {
			g := newTrafficRig(t)
			a := xdstest.StartBackend(t, "a", "127.0.0.1")
			b := xdstest.StartBackend(t, "b", "127.0.0.2")
			s := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
				ep(a.Addr.IP.String(), loc("r1", "z1"), ready, eport("grpc", int32(a.Addr.Port))),
				ep(b.Addr.IP.String(), loc("r1", "z1"), ready, eport("grpc", int32(b.Addr.Port))))
			s.Traffic = traffic.Set{Policy: &traffic.Policy{Name: "echo", LoadBalancer: &traffic.LoadBalancer{Algorithm: alg}, MaxRequests: 100}}
			s.Normalize()
			g.apply(s)
			g.await("both endpoints to answer", 100, func(m map[string]int) bool { return m["a"] > 0 && m["b"] > 0 && m["error"] == 0 })
		})
	}
}

func TestTrafficServiceBackendIsTheClientsOwnCluster(t *testing.T) {
	g := newTrafficRig(t)
	a := xdstest.StartBackend(t, "a", "127.0.0.1")
	e := xdstest.StartBackend(t, "v1-east", "127.0.0.2")
	w := xdstest.StartBackend(t, "v1-west", "127.0.0.3")
	v1 := registry.ServiceKey{Namespace: echo.Namespace, Name: "echo-v1"}
	// echo's route sends everything to the Service echo-v1: in each
	// client's own cluster, though both clusters export echo-v1.
	route := grpcRoute(traffic.Rule{Backends: []traffic.Backend{{Kind: traffic.BackendService, Name: "echo-v1", Port: 8080, Weight: 1}}})
	g.apply(backendShard("east", echo, a, route), backendShard("east", v1, e, traffic.Set{}), backendShard("west", v1, w, traffic.Set{}))
	target := ListenerName(echo, 8080)
	in := func(cluster string) *trafficRig {
		c := *g
		c.client = xdstest.NewClientWith(t, g.addr, "client-"+cluster, loc("r1", "z1"), map[string]string{MetadataCluster: cluster}, target)
		return &c
	}
	east, west := in("east"), in("west")
	east.await("east's client to reach east's echo-v1 only", 50, func(m map[string]int) bool { return m["v1-east"] == 50 })
	west.await("west's client to reach west's echo-v1 only", 50, func(m map[string]int) bool { return m["v1-west"] == 50 })
	// A client that names no cluster has no cluster's endpoints: UNAVAILABLE.
	nowhere := *g
	nowhere.client = xdstest.NewClient(t, g.addr, "client-nowhere", loc("r1", "z1"), target)
	ctx, cancel := context.WithTimeout(g.ctx, 10*time.Second)
	defer cancel()
	if _, err := nowhere.call(ctx); status.Code(err) != codes.Unavailable || ctx.Err() != nil {
		t.Fatalf("a client of no cluster: %v, want UNAVAILABLE at once", err)
	}
	// West's echo-v1 goes: west's clients have none left, east's are untouched.
	r, d := g.reg.Apply(registry.Change{Cluster: "west", Removes: []registry.ServiceKey{v1}})
	g.reg = r
	g.srv.Update(r, d)
	west.await("west's client to fail", 5, func(m map[string]int) bool { return m["error"] == 5 })
	if got := east.shares(g.ctx, 50); got["v1-east"] != 50 {
		t.Fatalf("east's client after west's echo-v1 left: %v, want all on v1-east", got)
	}
}

func TestTrafficFailoverPriorityKeepsClientsInTheirCluster(t *testing.T) {
	g := newTrafficRig(t)
	e2 := xdstest.StartBackend(t, "east-z2", "127.0.0.1")
	w1 := xdstest.StartBackend(t, "west-z1", "127.0.0.2")
	at := func(b xdstest.Backend, zone string, c registry.Conditions) registry.Endpoint {
		return ep(b.Addr.IP.String(), loc("r1", zone), c, eport("grpc", int32(b.Addr.Port)))
	}
	policy := traffic.Set{Policy: &traffic.Policy{Name: "echo", Locality: &traffic.LocalityPolicy{
		FailoverPriority: []string{traffic.LabelCluster, traffic.LabelZone}}}}
	east := func(set traffic.Set, c registry.Conditions) *registry.Shard {
		s := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)}, at(e2, "z2", c))
		s.Traffic = set
		s.Normalize()
		return s
	}
	west := shard("west", echo, []registry.ServicePort{tcp("grpc", 8080)}, at(w1, "z1", ready))
	g.apply(east(traffic.Set{}, ready), west)
	g.client = xdstest.NewClientWith(t, g.addr, "client-east", loc("r1", "z1"), map[string]string{MetadataCluster: "east"}, ListenerName(echo, 8080))
	// By default the client's zone comes first: west's endpoint.
	g.await("the default: the client's zone first", 20, func(m map[string]int) bool { return m["west-z1"] == 20 })
	// failoverPriority [cluster, zone]: its own cluster first, even in
	// another zone, though another cluster has an endpoint in its zone.
	g.apply(east(policy, ready))
	g.await("its own cluster first", 20, func(m map[string]int) bool { return m["east-z2"] == 20 })
	if got := g.shares(g.ctx, 200); got["east-z2"] != 200 {
		t.Fatalf("with failoverPriority [cluster, zone]: %v, want every call in the client's cluster", got)
	}
	// Its cluster has no healthy endpoint left: it fails over to the other.
	g.apply(east(policy, notReady))
	g.await("failover to the other cluster", 20, func(m map[string]int) bool { return m["west-z1"] == 20 })
	g.apply(east(policy, ready))
	g.await("back to its own cluster", 20, func(m map[string]int) bool { return m["east-z2"] == 20 })
}

func TestTrafficLocalityOffAndDistribute(t *testing.T) {
	g := newTrafficRig(t)
	z1 := xdstest.StartBackend(t, "z1", "127.0.0.1")
	z2 := xdstest.StartBackend(t, "z2", "127.0.0.2")
	with := func(lp *traffic.LocalityPolicy) *registry.Shard {
		s := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
			ep(z1.Addr.IP.String(), loc("r1", "z1"), ready, eport("grpc", int32(z1.Addr.Port))),
			ep(z2.Addr.IP.String(), loc("r1", "z2"), ready, eport("grpc", int32(z2.Addr.Port))))
		if lp != nil {
			s.Traffic = traffic.Set{Policy: &traffic.Policy{Name: "echo", Locality: lp}}
		}
		s.Normalize()
		return s
	}
	g.apply(with(nil))
	g.await("the client's zone only", 20, func(m map[string]int) bool { return m["z1"] == 20 })
	g.apply(with(&traffic.LocalityPolicy{Off: true}))
	g.await("both zones", 100, func(m map[string]int) bool { return m["z1"] > 20 && m["z2"] > 20 })
	g.apply(with(&traffic.LocalityPolicy{Distribute: []traffic.Distribution{{From: "r1/z1/*",
		To: []traffic.LocalityWeight{{Locality: "r1/z1/*", Weight: 20}, {Locality: "r1/z2/*", Weight: 80}}}}}))
	got := g.await("the 20/80 distribution", 1000, func(m map[string]int) bool { return m["z2"] > 700 && m["z2"] < 880 })
	t.Logf("distribute 20/80: %v", got)
	g.apply(with(&traffic.LocalityPolicy{Distribute: []traffic.Distribution{{From: "r1/*",
		To: []traffic.LocalityWeight{{Locality: "r1/z2", Weight: 100}}}}}))
	g.await("everything to z2", 50, func(m map[string]int) bool { return m["z2"] == 50 })
}

func TestTrafficRegionFailover(t *testing.T) {
	g := newTrafficRig(t)
	r2 := xdstest.StartBackend(t, "r2", "127.0.0.1")
	r3 := xdstest.StartBackend(t, "r3", "127.0.0.2")
	s := shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep(r2.Addr.IP.String(), loc("r2", "a"), ready, eport("grpc", int32(r2.Addr.Port))),
		ep(r3.Addr.IP.String(), loc("r3", "a"), ready, eport("grpc", int32(r3.Addr.Port))))
	s.Traffic = traffic.Set{Policy: &traffic.Policy{Name: "echo", Locality: &traffic.LocalityPolicy{
		Failover: []traffic.RegionFailover{{From: "r1", To: "r3"}}}}}
	s.Normalize()
	g.apply(s)
	// A client in r1, which has no endpoint: r3, its failover region, before r2.
	g.await("the failover region", 30, func(m map[string]int) bool { return m["r3"] == 30 })
}
