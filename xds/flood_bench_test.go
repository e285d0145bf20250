package xds

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/navemesh/nave/registry"
)

// BenchmarkLocalityFlood opens streams that each name a locality of their
// own and ask for endpoints, one after another, closing each; then an
// honest client of a new zone asks. It reports what the server still holds
// of the flood (live heap, after collections) and whether the honest client
// got its own zone first (1) or another group's priorities (0). Written
// against the server's API of before issue 24, so it runs there too.
func BenchmarkLocalityFlood(b *testing.B) {
	for _, tc := range []struct {
		name          string
		streams, size int // streams, and the bytes of each one's region
	}{{"1100-short", 1100, 8}, {"20-of-2MiB", 20, 2 << 20}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				held, refused, own := localityFlood(b, tc.streams, tc.size)
				b.ReportMetric(held, "MiB-held-after")
				b.ReportMetric(float64(refused), "refused")
				b.ReportMetric(own, "honest-own-zone")
			}
		})
	}
}

func localityFlood(b *testing.B, streams, size int) (heldMiB float64, refused int, ownZone float64) {
	s := NewServer(DefaultConfig(), Wiring{}, nil, prometheus.NewRegistry())
	g := grpc.NewServer(grpc.MaxRecvMsgSize(8 << 20))
	s.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	r, _ := registry.New().Apply(registry.Change{Cluster: "east", Upserts: []*registry.Shard{shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090)), ep("10.0.0.2", loc("r1", "z2"), ready, eport("grpc", 9090)))}})
	s.Update(r, registry.Diff{})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	ask := func(l *core.Locality) (*discovery.DiscoveryResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return nil, err
		}
		if err := st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "flood", Locality: l}, TypeUrl: resource.EndpointType,
			ResourceNames: []string{ClusterName(echo, 8080)}}); err != nil {
			return nil, err
		}
		return st.Recv()
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range streams {
		region := fmt.Sprintf("%05d", i) + strings.Repeat("r", max(0, size-5))
		if _, err := ask(&core.Locality{Region: region, Zone: "z"}); err != nil {
			refused++
		}
	}
	for deadline := time.Now().Add(time.Minute); testutil.ToFloat64(s.metrics.connected) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // the server sees the streams close
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	heldMiB = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / (1 << 20)
	resp, err := ask(&core.Locality{Region: "r1", Zone: "z2"})
	if err != nil {
		b.Fatalf("the honest client: %v", err)
	}
	for _, a := range resp.GetResources() {
		var cla endpoint.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			b.Fatal(err)
		}
		for _, le := range cla.GetEndpoints() {
			if le.GetLocality().GetZone() == "z2" && le.GetPriority() == 0 && len(cla.GetEndpoints()) > 1 && cla.GetEndpoints()[0].GetPriority() != cla.GetEndpoints()[1].GetPriority() {
				ownZone = 1
			}
		}
	}
	return heldMiB, refused, ownZone
}
