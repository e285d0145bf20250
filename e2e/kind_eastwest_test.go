package e2e

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
)

// TestKindEastWest runs against the kind lab (make kind-up; make kind-e2e)
// and nowhere else: it needs Docker and real Envoy, which this project's
// build machine has neither of. Each kind cluster is a network of its own
// (their pods cannot reach each other), entered through its east-west
// gateway: real Envoy run by `nave gateway`, configured by the hub. A
// grpc-go xDS client on the test's host, on a network of its own, reaches
// the echo service of every cluster through the gateways (their HTTP/2
// listeners, routing by :authority); when one cluster's echo scales to
// zero, the others answer, and no RPC fails.
func TestKindEastWest(t *testing.T) {
	if os.Getenv("NAVE_E2E_KUBECONFIGS") == "" {
		t.Skip("needs the kind lab with real Envoy gateways: make kind-up, then make kind-e2e")
	}
	clusters := []string{"east", "north", "west"}
	env := kindEnv(t, clusters)
	await(t, "every network with a usable gateway and the echo service", func() bool {
		var nets []adminapi.NetworkStatus
		getJSON(t, env.admin+"/debug/networks", &nets)
		reachable := 0
		for _, n := range nets {
			if n.Reachable && n.Endpoints > 0 {
				reachable++
			}
		}
		return reachable == len(clusters)
	})

	const target = "echo.default.svc.clusterset.local:8080"
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	// Outside every cluster's network: each cluster is reached through its gateway.
	p := xdstest.StartPoller(ctx, t, "client outside", xdstest.NewClientOn(t, env.xds, "kind-outside",
		locality("us-east", "us-east-1a"), registry.Network("outside"), target))
	p.Await(ctx, t, "answers from every cluster, through its gateway", func(_ []string, seen map[string]bool) bool {
		return seen["east"] && seen["north"] && seen["west"]
	})

	// East's echo scales to zero: its gateway locality goes; the others answer.
	scale := func(cluster string, n int32) {
		t.Helper()
		deployments := env.clusters[cluster].client.AppsV1().Deployments("default")
		s, err := deployments.GetScale(ctx, "echo", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.Replicas = n
		if _, err := deployments.UpdateScale(ctx, "echo", s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	scale("east", 0)
	defer scale("east", 2)
	start := time.Now()
	p.AwaitOnly(ctx, t, "north", "west")
	t.Logf("east scaled to zero -> traffic only to north and west in %v", time.Since(start).Round(time.Millisecond))
	scale("east", 2)
	p.Await(ctx, t, "east back", func(recent []string, _ map[string]bool) bool { return slices.Contains(recent, "east") })
	stop()
	if calls, failed := p.Failures(); len(failed) > 0 {
		t.Errorf("%d of %d RPCs failed, first: %v", len(failed), calls, failed[0])
	}
}
