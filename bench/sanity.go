package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// The sanity check: real grpc-go xDS clients resolve the echo service
// through the hub and call its one real backend.

// echoBackend is a gRPC health server on loopback: the echo service's endpoint.
type echoBackend struct {
	addr netip.AddrPort
	srv  *grpc.Server
}

func startEchoBackend() (*echoBackend, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("echo backend: %w", err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	return &echoBackend{addr: lis.Addr().(*net.TCPAddr).AddrPort(), srv: srv}, nil
}

func (b *echoBackend) stop() { b.srv.Stop() }

// sanityClient is a real grpc-go channel to xds:///echo... with its own xDS client.
type sanityClient struct {
	name string
	conn *grpc.ClientConn
}

// With files set, the client reaches the xDS server over mTLS (the
// bootstrap's "tls" channel credentials, gRFC A65).
func newSanityClient(xdsAddr, name string, l registry.Locality, files *xdstest.TLSFiles) (*sanityClient, error) {
	// What xdstest.NewClient and NewClientTLS do, without a testing.TB.
	bootstrap := xdstest.Bootstrap(xdsAddr, name, l)
	if files != nil {
		bootstrap = strings.Replace(bootstrap, `"channel_creds":[{"type":"insecure"}]`,
			fmt.Sprintf(`"channel_creds":[{"type":"tls","config":{"ca_certificate_file":%q,"certificate_file":%q,"private_key_file":%q}}]`,
				files.CA, files.Cert, files.Key), 1)
	}
	resolver, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		return nil, fmt.Errorf("xDS resolver for %s: %w", name, err)
	}
	target := "xds:///" + xds.ListenerName(echoKey, servicePort)
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	return &sanityClient{name: name, conn: conn}, nil
}

// sanityResult is one check of one real grpc-go client.
type sanityResult struct {
	Client string  `json:"client"`
	Phase  string  `json:"phase"`
	OK     bool    `json:"ok"`
	Ms     float64 `json:"ms"` // until the call succeeded (it waits for the channel to resolve and connect)
	Error  string  `json:"error,omitempty"`
}

// check calls the backend through the channel, waiting for it to resolve.
func (c *sanityClient) check(ctx context.Context, phase string, timeout time.Duration) sanityResult {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	_, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	r := sanityResult{Client: c.name, Phase: phase, OK: err == nil, Ms: ms(time.Since(start))}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

func (c *sanityClient) close() { _ = c.conn.Close() }
