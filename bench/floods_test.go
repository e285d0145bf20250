package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// RFC 7541, C.1: integers with a prefix.
func TestHpackInt(t *testing.T) {
	for _, c := range []struct {
		n    uint
		v    uint64
		want []byte
	}{{5, 10, []byte{0x0a}}, {5, 1337, []byte{0x1f, 0x9a, 0x0a}}, {8, 42, []byte{0x2a}}, {7, 127, []byte{0x7f, 0x00}}} {
		if got := hpackInt(nil, 0, c.n, c.v); !bytes.Equal(got, c.want) {
			t.Errorf("%d with a %d-bit prefix: % x, want % x", c.v, c.n, got, c.want)
		}
	}
}

func TestKnownArgs(t *testing.T) {
	known := map[string]bool{"snapshot-interval": true, "pprof": true}
	kept, dropped := knownArgs([]string{"--snapshot-interval", "1s", "--export-policy", "p.yaml", "--pprof", "--admin-max-connections=9"}, known)
	if want := []string{"--snapshot-interval", "1s", "--pprof"}; !slices.Equal(kept, want) {
		t.Errorf("kept %q, want %q", kept, want)
	}
	if want := []string{"--export-policy", "p.yaml", "--admin-max-connections=9"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped %q, want %q", dropped, want)
	}
}

// echoADS answers each stream's first request with one response, then
// holds the stream.
type echoADS struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
}

func (echoADS) StreamAggregatedResources(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	req, err := s.Recv()
	if err != nil {
		return err
	}
	if err := s.Send(&discovery.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), VersionInfo: "1", Nonce: "1"}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// The raw HTTP/2 client speaks valid gRPC (a server serves its stream), and
// its oversized headers reach a server as they are: one with grpc's own
// bound (16 MiB) serves them, one bounded at 64 KiB does not.
func TestRawH2Stream(t *testing.T) {
	serve := func(opts ...grpc.ServerOption) string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer(opts...)
		discovery.RegisterAggregatedDiscoveryServiceServer(s, echoADS{})
		go func() { _ = s.Serve(lis) }()
		t.Cleanup(s.Stop)
		return lis.Addr().String()
	}
	req, _ := proto.Marshal(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"x"}})
	var big [][2]string
	for i := range 128 {
		big = append(big, [2]string{fmt.Sprintf("x-flood-%03d", i), strings.Repeat("v", 16<<10)})
	}
	small := [][2]string{{"x-small", "v"}}
	for _, c := range []struct {
		name    string
		opts    []grpc.ServerOption
		headers [][2]string
		served  bool
	}{
		{"small headers, bounded server", []grpc.ServerOption{grpc.MaxHeaderListSize(64 << 10)}, small, true},
		{"2 MiB of headers, default server", nil, big, true},
		{"2 MiB of headers, bounded server", []grpc.ServerOption{grpc.MaxHeaderListSize(64 << 10)}, big, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := serve(c.opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h, err := dialH2(ctx, netip.MustParseAddr("127.0.0.1"), addr)
			if err != nil {
				t.Fatal(err)
			}
			defer h.close()
			sendErr := h.stream(adsPath, addr, c.headers, req)
			got := h.outcome(20 * time.Second)
			if (got == h2Served) != c.served {
				t.Fatalf("outcome %q (send: %v); served: want %v", got, sendErr, c.served)
			}
		})
	}
}
