package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

// kubeEndpoint is one backend as the test's EndpointSlice names it.
type kubeEndpoint struct {
	host  *kubetest.Host
	node  string
	ready bool
}

// backendPort is where every test backend listens, each on its own host.
const backendPort = 8080

// startKubeBackend serves a named backend on a new test host, and returns
// once it answers there.
func startKubeBackend(t testing.TB, name string) *kubetest.Host {
	h := kubetest.NewHost(t)
	lis, err := h.Listen("tcp", fmt.Sprint(backendPort))
	if err != nil {
		t.Fatal(err)
	}
	xdstest.ServeBackend(t, name, lis)
	awaitBackend(t, h, name)
	return h
}

// awaitBackend waits until the backend on a new test host answers, as
// itself, a client of the root namespace. Right after a host is made, a
// connection to its address may for a moment not reach it: on some
// machines something else answers there (whatever answers an address of no
// test host: seen as an HTTP/2 404) for about 100 ms, which a client handed
// the address at once would see as failed RPCs.
func awaitBackend(t testing.TB, h *kubetest.Host, name string) {
	t.Helper()
	await(t, "backend "+name+" answering at "+h.IP.String(), func() bool {
		// A new connection each time: one that went astray stays astray.
		conn, err := grpc.NewClient(fmt.Sprintf("%s:%d", h.IP, backendPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		var md metadata.MD
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		return err == nil && slices.Equal(md.Get(xdstest.BackendHeader), []string{name})
	})
}

// exportService creates a Service (port backendPort) and its ServiceExport.
func exportService(t testing.TB, c *kubeCluster, ns, name string, headless bool) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: backendPort, Protocol: corev1.ProtocolTCP}}}}
	if headless {
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	}
	if _, err := c.client.CoreV1().Services(ns).Create(t.Context(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createServiceExport(t, c, ns, name)
}

// createServiceExport exports the service ns/name.
func createServiceExport(t testing.TB, c *kubeCluster, ns, name string) {
	t.Helper()
	se := &unstructured.Unstructured{}
	se.SetAPIVersion(spoke.ServiceExportResource.GroupVersion().String())
	se.SetKind("ServiceExport")
	se.SetNamespace(ns)
	se.SetName(name)
	if _, err := c.dynamic.Resource(spoke.ServiceExportResource).Namespace(ns).Create(t.Context(), se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// setEndpoints writes the service's EndpointSlice as the EndpointSlice controller would.
func setEndpoints(t testing.TB, c *kubeCluster, ns, service string, eps ...kubeEndpoint) {
	t.Helper()
	setEndpointsWith(t, c, ns, service, func(es *discoveryv1.EndpointSlice) {
		for _, e := range eps {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{e.host.IP.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready)},
				NodeName:   ptr(e.node),
			})
		}
	})
}

// setEndpointsWith writes the service's EndpointSlice (port grpc) as change makes it.
func setEndpointsWith(t testing.TB, c *kubeCluster, ns, service string, change func(*discoveryv1.EndpointSlice)) {
	t.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: service + "-e2e", Labels: map[string]string{
			discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: "nave-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("grpc"), Port: ptr(int32(backendPort))}},
		Endpoints:   []discoveryv1.Endpoint{},
	}
	change(es)
	slices := c.client.DiscoveryV1().EndpointSlices(ns)
	old, err := slices.Get(t.Context(), es.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = slices.Create(t.Context(), es, metav1.CreateOptions{})
	case err == nil:
		es.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(t.Context(), es, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("write EndpointSlice %s/%s in %s: %v", ns, es.Name, c.name, err)
	}
}

func createNamespace(t testing.TB, c *kubeCluster, ns string) {
	t.Helper()
	if _, err := c.client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if c.local == nil {
		// kind clusters outlive the test: leave them as they were.
		t.Cleanup(func() {
			_ = c.client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		})
	}
}

// exportConditions returns a ServiceExport's conditions by type.
func exportConditions(t testing.TB, c *kubeCluster, ns, name string) map[string]map[string]any {
	u, err := c.dynamic.Resource(spoke.ServiceExportResource).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok {
			out[fmt.Sprint(m["type"])] = m
		}
	}
	return out
}

// TestKube runs Nave on real Kubernetes API servers: two clusters in two
// regions, a hub, and the clusters' spokes (two replicas in east) as
// processes; real grpc-go xDS clients call backends on test hosts that the
// clusters' EndpointSlices name.
func TestKube(t *testing.T) {
	env := startKubeEnv(t, "east", "west")
	east, west := env.clusters["east"], env.clusters["west"]
	const ns = "shop"
	for _, c := range []*kubeCluster{east, west} {
		createNamespace(t, c, ns)
	}
	e1a, e1b := east.node(t, "us-east", "us-east-1a"), east.node(t, "us-east", "us-east-1b")
	w1a := west.node(t, "us-west", "us-west-1a")
	hostA, hostA2 := startKubeBackend(t, "east-1a"), startKubeBackend(t, "east-1a-2")
	hostB, hostW := startKubeBackend(t, "east-1b"), startKubeBackend(t, "west-1a")

	start := time.Now()
	for _, c := range []*kubeCluster{east, west} {
		exportService(t, c, ns, "echo", false)
	}
	setEndpoints(t, east, ns, "echo", kubeEndpoint{hostA, e1a, true}, kubeEndpoint{hostB, e1b, true})
	setEndpoints(t, west, ns, "echo", kubeEndpoint{hostW, w1a, true})

	t.Run("a service exported in two clusters merges", func(t *testing.T) {
		await(t, "shop/echo from both clusters with 3 healthy endpoints", func() bool {
			s := env.service(t, "shop/echo")
			return slices.Equal(s.Clusters, []registry.ClusterID{"east", "west"}) && s.Healthy == 3
		})
		t.Logf("exported -> merged at the hub in %v", time.Since(start).Round(time.Millisecond))
	})

	const target = "echo.shop.svc.clusterset.local:8080"
	ctx, stopPolling := context.WithCancel(t.Context())
	defer stopPolling()
	inEast := xdstest.StartPoller(ctx, t, "client us-east-1a", xdstest.NewClient(t, env.xds, "c-east", locality("us-east", "us-east-1a"), target))
	inWest := xdstest.StartPoller(ctx, t, "client us-west-1a", xdstest.NewClient(t, env.xds, "c-west", locality("us-west", "us-west-1a"), target))
	inEast.AwaitOnly(ctx, t, "east-1a")
	inWest.AwaitOnly(ctx, t, "west-1a")

	t.Run("endpoints scaling up and down reach clients in each locality", func(t *testing.T) {
		setEndpoints(t, east, ns, "echo", kubeEndpoint{hostA, e1a, true}, kubeEndpoint{hostA2, e1a, true}, kubeEndpoint{hostB, e1b, true})
		inEast.Await(ctx, t, "both us-east-1a backends", func(recent []string, _ map[string]bool) bool {
			return slices.Contains(recent, "east-1a") && slices.Contains(recent, "east-1a-2") && !slices.Contains(recent, "east-1b")
		})
		// Zone us-east-1a scales to zero: its clients move to the rest of the region.
		written := time.Now()
		setEndpoints(t, east, ns, "echo", kubeEndpoint{hostB, e1b, true})
		inEast.AwaitOnly(ctx, t, "east-1b")
		t.Logf("convergence: EndpointSlice written -> client traffic moved in %v (incl. a %d-answer streak)",
			time.Since(written).Round(time.Millisecond), xdstest.Streak)
		// West scales to zero: its clients move to the other region.
		written = time.Now()
		setEndpoints(t, west, ns, "echo")
		inWest.AwaitOnly(ctx, t, "east-1b")
		t.Logf("convergence: region failover in %v", time.Since(written).Round(time.Millisecond))
		// And back.
		setEndpoints(t, east, ns, "echo", kubeEndpoint{hostA, e1a, true}, kubeEndpoint{hostB, e1b, true})
		setEndpoints(t, west, ns, "echo", kubeEndpoint{hostW, w1a, true})
		inEast.AwaitOnly(ctx, t, "east-1a")
		inWest.AwaitOnly(ctx, t, "west-1a")
	})

	t.Run("a spoke killed and restarted causes no removal churn", func(t *testing.T) {
		before := env.service(t, "shop/echo")
		epoch := env.cluster(t, "west").Epoch
		env.spokes.restart(t, "west")
		env.awaitResynced(t, "west", epoch)
		if after := env.service(t, "shop/echo"); after.Revision != before.Revision || after.Healthy != before.Healthy {
			t.Errorf("after west's spoke restarted: revision %d -> %d, healthy %d -> %d; want no change",
				before.Revision, after.Revision, before.Healthy, after.Healthy)
		}
	})

	t.Run("two spoke replicas hand over leadership with no endpoint lost", func(t *testing.T) {
		before := env.service(t, "shop/echo")
		epoch := env.cluster(t, "east").Epoch
		// Watch the hub all along: not one sample may miss an endpoint.
		watchCtx, stopWatching := context.WithCancel(t.Context())
		var lowest, samples int
		var revisions []uint64
		var watchErr error
		var watching sync.WaitGroup
		watching.Go(func() {
			lowest = before.Healthy
			for watchCtx.Err() == nil {
				s, err := env.tryService(watchCtx, "shop/echo")
				if err != nil {
					if watchCtx.Err() == nil {
						watchErr = err
					}
					return
				}
				lowest, samples = min(lowest, s.Healthy), samples+1
				if !slices.Contains(revisions, s.Revision) {
					revisions = append(revisions, s.Revision)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
		killed := time.Now()
		old := env.spokes.killLeader(t, "east")
		c := env.awaitResynced(t, "east", epoch)
		t.Logf("leader %s killed -> %s streaming and synced in %v", old, c.SpokeID, time.Since(killed).Round(time.Millisecond))
		stopWatching()
		watching.Wait()
		if watchErr != nil {
			t.Fatalf("watching the hub: %v", watchErr)
		}
		if c.SpokeID == old {
			t.Errorf("the killed leader %s still streams", old)
		}
		if lowest != before.Healthy || !slices.Equal(revisions, []uint64{before.Revision}) {
			t.Errorf("during the handover (%d samples) healthy endpoints fell to %d of %d, revisions %v; want no change",
				samples, lowest, before.Healthy, revisions)
		}
	})

	t.Run("a conflicting export is reported on the ServiceExport", func(t *testing.T) {
		exportService(t, east, ns, "clash", false)
		exportService(t, west, ns, "clash", true) // headless in west only: the type conflicts
		for _, c := range []*kubeCluster{east, west} {
			var cond map[string]any
			await(t, "a Conflict condition on "+c.name+"'s ServiceExport", func() bool {
				cond = exportConditions(t, c, ns, "clash")[spoke.ConditionConflict]
				return cond["status"] == "True"
			})
			msg := fmt.Sprint(cond["message"])
			if cond["reason"] != string(registry.TypeConflict) || !strings.Contains(msg, "east") || !strings.Contains(msg, "west") {
				t.Errorf("%s's Conflict condition = %v, want reason TypeConflict and a message naming both clusters", c.name, cond)
			}
			if v := exportConditions(t, c, ns, "clash")[spoke.ConditionValid]; v["status"] != "True" {
				t.Errorf("%s's Valid condition = %v", c.name, v)
			}
		}
	})

	t.Run("a deleted ServiceExport removes the service", func(t *testing.T) {
		exportService(t, east, ns, "solo", false)
		setEndpoints(t, east, ns, "solo", kubeEndpoint{hostA, e1a, true})
		await(t, "shop/solo at the hub", func() bool { return env.service(t, "shop/solo").Healthy == 1 })
		if err := east.dynamic.Resource(spoke.ServiceExportResource).Namespace(ns).Delete(t.Context(), "solo", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		await(t, "shop/solo gone from the hub", func() bool { return env.service(t, "shop/solo").Service.Name == "" })
	})

	t.Run("a deleted namespace removes its services", func(t *testing.T) {
		createNamespace(t, west, "team")
		exportService(t, west, "team", "api", false)
		setEndpoints(t, west, "team", "api", kubeEndpoint{hostW, w1a, true})
		await(t, "team/api at the hub", func() bool { return env.service(t, "team/api").Healthy == 1 })
		if err := west.client.CoreV1().Namespaces().Delete(t.Context(), "team", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if west.local != nil {
			// The local harness runs no kube-controller-manager: do what its
			// namespace controller does with a terminating namespace's objects.
			if err := west.client.CoreV1().Services("team").Delete(t.Context(), "api", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := west.client.DiscoveryV1().EndpointSlices("team").DeleteCollection(t.Context(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		await(t, "team/api gone from the hub", func() bool { return env.service(t, "team/api").Service.Name == "" })
	})

	stopPolling()
	for _, p := range []*xdstest.Poller{inEast, inWest} {
		if calls, failed := p.Failures(); len(failed) > 0 {
			t.Errorf("%s: %d of %d RPCs failed, first: %v", p.Name(), len(failed), calls, failed[0])
		}
	}
}
