package relay

import (
	"context"
	"errors"
	"io"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// sotwStream is a local state-of-the-world stream, of any of the services served.
type sotwStream = grpc.BidiStreamingServer[discovery.DiscoveryRequest, discovery.DiscoveryResponse]

// deltaStream is a local delta stream, of any of the services served.
type deltaStream = grpc.BidiStreamingServer[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]

// route serves a local stream from its node's view: it reads the stream's
// first request (whose node names the view), then hands the stream, that
// request first, to the view's server. A stream still to send its first
// request when Run returns is ended.
func (r *Relay) route(s sotwStream, serve func(serverv3.Server, sotwStream) error) error {
	type received struct {
		req *discovery.DiscoveryRequest
		err error
	}
	// The receiver ends with the stream (this handler's return cancels it).
	got := make(chan received, 1)
	go func() {
		req, err := s.Recv()
		got <- received{req, err}
	}()
	var first *discovery.DiscoveryRequest
	select {
	case <-r.stopped:
		return errStopping
	case g := <-got:
		if errors.Is(g.err, io.EOF) {
			return nil
		}
		if g.err != nil {
			return g.err
		}
		first = g.req
	}
	v, release, err := r.viewFor(s.Context(), first)
	if err != nil {
		return err
	}
	defer release()
	return serve(v.xds, &replayStream{sotwStream: s, first: first})
}

// replayStream is a local stream whose first request was read already: Recv
// returns it first. (The view's server receives on one goroutine, which it
// starts after route read the first request.)
type replayStream struct {
	sotwStream
	first *discovery.DiscoveryRequest
}

func (s *replayStream) Recv() (*discovery.DiscoveryRequest, error) {
	if req := s.first; req != nil {
		s.first = nil
		return req, nil
	}
	return s.sotwStream.Recv()
}

// errStopping ends a local stream the relay no longer serves.
var errStopping = status.Error(codes.Unavailable, "relay: stopping")

// errDelta refuses delta streams.
var errDelta = status.Error(codes.Unimplemented, "relay: delta xDS is not served yet; use state of the world")

// errFetch refuses fetches (unary requests).
var errFetch = status.Error(codes.Unimplemented, "relay: fetch is not served, use a stream")

// localServer serves the aggregated service and the separate LDS, RDS, CDS
// and EDS services to the node's clients, routing each stream to its view.
type localServer struct{ r *Relay }

func (l localServer) StreamAggregatedResources(s sotwStream) error {
	return l.r.route(s, serverv3.Server.StreamAggregatedResources)
}
func (l localServer) StreamListeners(s sotwStream) error {
	return l.r.route(s, serverv3.Server.StreamListeners)
}
func (l localServer) StreamRoutes(s sotwStream) error {
	return l.r.route(s, serverv3.Server.StreamRoutes)
}
func (l localServer) StreamClusters(s sotwStream) error {
	return l.r.route(s, serverv3.Server.StreamClusters)
}
func (l localServer) StreamEndpoints(s sotwStream) error {
	return l.r.route(s, serverv3.Server.StreamEndpoints)
}

func (localServer) DeltaAggregatedResources(deltaStream) error { return errDelta }
func (localServer) DeltaListeners(deltaStream) error           { return errDelta }
func (localServer) DeltaRoutes(deltaStream) error              { return errDelta }
func (localServer) DeltaClusters(deltaStream) error            { return errDelta }
func (localServer) DeltaEndpoints(deltaStream) error           { return errDelta }

func (localServer) FetchListeners(context.Context, *discovery.DiscoveryRequest) (*discovery.DiscoveryResponse, error) {
	return nil, errFetch
}
func (localServer) FetchRoutes(context.Context, *discovery.DiscoveryRequest) (*discovery.DiscoveryResponse, error) {
	return nil, errFetch
}
func (localServer) FetchClusters(context.Context, *discovery.DiscoveryRequest) (*discovery.DiscoveryResponse, error) {
	return nil, errFetch
}
func (localServer) FetchEndpoints(context.Context, *discovery.DiscoveryRequest) (*discovery.DiscoveryResponse, error) {
	return nil, errFetch
}
