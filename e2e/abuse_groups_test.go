package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/xdstest"
)

// Streams that each name a locality of their own come and go, five times
// more than the hub holds locality groups for: the groups they leave are
// replaced, and a client of a new zone afterwards still gets its own zone
// first (before, the hub's groups were full for good, and every new zone
// was served the default group: every endpoint at priority 0).
func TestAbuseLocalityGroupFlood(t *testing.T) {
	const groups = 20
	a := startAbuseHub(t, func(c *hub.Config) { c.XDS.MaxLocalityGroups = groups })
	// Two endpoints at two addresses (a shard holds an address once), in two zones.
	writeService(t, a.dir, "web", endpoint{xdstest.StartBackend(t, "w1", "127.0.0.6"), "z1", true},
		endpoint{xdstest.StartBackend(t, "w2", "127.0.0.7"), "z2", true})
	web := "outbound|8080||web.default.svc.clusterset.local"
	ads := discovery.NewAggregatedDiscoveryServiceClient(dialFrom(t, "127.0.0.3", a.XDSAddr.String()))
	ask := func(l *core.Locality) (*discovery.DiscoveryResponse, error) {
		ctx, cancel := context.WithTimeout(a.ctx, 30*time.Second)
		defer cancel()
		st, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return nil, err
		}
		if err := st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "flood", Locality: l}, TypeUrl: resource.EndpointType, ResourceNames: []string{web}}); err != nil {
			return nil, err
		}
		return st.Recv()
	}
	// Web is served once the spoke published it (the first answer may come before).
	awaitFor(t, "web's assignment", 30*time.Second, func() bool {
		resp, err := ask(&core.Locality{Region: "r1", Zone: "z1"})
		return err == nil && len(resp.GetResources()) == 1 && len(cla(t, resp).GetEndpoints()) == 2
	})
	refused := 0
	for i := range 5 * groups {
		if _, err := ask(&core.Locality{Region: fmt.Sprintf("flood-%03d", i), Zone: "z"}); err != nil {
			refused++ // every group held for a moment: the stream before has not closed yet at the hub
		}
	}
	t.Logf("%d of %d flood streams refused while the groups before were still held", refused, 5*groups)
	a.converges("a flood of localities")
	var resp *discovery.DiscoveryResponse
	awaitFor(t, "a client of zone z2 served", 30*time.Second, func() bool {
		var err error
		resp, err = ask(&core.Locality{Region: "r1", Zone: "z2"})
		return err == nil && len(resp.GetResources()) == 1
	})
	prio := map[string]uint32{}
	for _, le := range cla(t, resp).GetEndpoints() {
		prio[le.GetLocality().GetZone()] = le.GetPriority()
	}
	if prio["z2"] != 0 || prio["z1"] != 1 {
		t.Errorf("a client of z2 after the flood: priorities %v, want its own zone at 0 and z1 at 1", prio)
	}
}

func cla(t *testing.T, resp *discovery.DiscoveryResponse) *endpointv3.ClusterLoadAssignment {
	t.Helper()
	var c endpointv3.ClusterLoadAssignment
	if err := resp.GetResources()[0].UnmarshalTo(&c); err != nil {
		t.Fatal(err)
	}
	return &c
}
