package hub

import (
	"time"

	"google.golang.org/grpc"

	"github.com/navemesh/nave/limits"
)

// ConnectionLimits bound what one peer may take of the federation, admin and
// xDS ports, so that a misbehaving one never starves the others. Zero
// bounds nothing.
type ConnectionLimits struct {
	// MaxConnections per port, and MaxConnectionsPerPeer from one IP
	// address per port: a connection beyond them is closed on accept.
	MaxConnections, MaxConnectionsPerPeer int
	// MaxStreamsPerConnection is HTTP/2's concurrent stream limit.
	MaxStreamsPerConnection int
	// FederationStreamsPerPeer and XDSStreamsPerPeer bound the open
	// streams of one peer address (a pod; not an identity, which
	// thousands of pods of one service account share).
	FederationStreamsPerPeer, XDSStreamsPerPeer int
	// HandshakeTimeout bounds a new connection's TLS and HTTP/2
	// handshakes; a connection that says nothing is closed after it.
	HandshakeTimeout time.Duration
	// FirstRequestTimeout bounds the wait for a new xDS stream's first
	// request (a federation stream's hello has its own, HelloTimeout).
	FirstRequestTimeout time.Duration
	// IdleTimeout closes a connection without streams.
	IdleTimeout time.Duration
	// MaxHeaderListBytes bounds the headers (gRPC metadata) of one request
	// on the gRPC ports; larger ones are refused before they are held.
	MaxHeaderListBytes int
	// AdminMaxConnections and AdminMaxConnectionsPerPeer bound the admin
	// port's connections, as MaxConnections and MaxConnectionsPerPeer do the
	// gRPC ports'; AdminIdleTimeout closes a kept-alive connection that sends
	// no request (one that never sends its first request's headers is closed
	// after HandshakeTimeout).
	AdminMaxConnections, AdminMaxConnectionsPerPeer int
	AdminIdleTimeout                                time.Duration
}

// DefaultConnectionLimits fit a large fleet of clients behind NAT-free
// pod addresses; lower MaxConnectionsPerPeer and XDSStreamsPerPeer where
// clients each have their own address, raise them where many share one
// (a node's host-network pods, a benchmark on one machine).
func DefaultConnectionLimits() ConnectionLimits {
	return ConnectionLimits{
		MaxConnections: 50_000, MaxConnectionsPerPeer: 2_048, MaxStreamsPerConnection: 128,
		FederationStreamsPerPeer: 64, XDSStreamsPerPeer: 2_048,
		HandshakeTimeout: 10 * time.Second, FirstRequestTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute,
		MaxHeaderListBytes:  64 << 10,
		AdminMaxConnections: 256, AdminMaxConnectionsPerPeer: 32, AdminIdleTimeout: time.Minute,
	}
}

// maxHeaderList is the gRPC servers' bound on a request's headers (none: grpc's own, 16 MiB).
func maxHeaderList(c ConnectionLimits) grpc.ServerOption {
	if c.MaxHeaderListBytes <= 0 {
		return grpc.EmptyServerOption{}
	}
	return grpc.MaxHeaderListSize(uint32(c.MaxHeaderListBytes))
}

// refused counts and logs a connection or stream refused on port.
func (p *parts) refused(port string) limits.Refused {
	return func(reason string) {
		if p.metrics != nil {
			p.metrics.limitsRefused.WithLabelValues(port, reason).Inc()
		}
		p.log.Debug("refused a connection or stream", "port", port, "reason", reason)
	}
}
