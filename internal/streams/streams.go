// Package streams gives a gRPC server stream a context of its own that
// really ends it: go-control-plane's handlers watch only their requests,
// not the stream's context, so a stream is ended by making its reads fail.
package streams

import (
	"context"

	"google.golang.org/grpc"
)

// WithContext returns ss with ctx as its context; once ctx ends, a read
// that is waiting, or any later read, fails with ctx's cause, and so the
// handler ends. A message that arrives after that is dropped.
func WithContext(ss grpc.ServerStream, ctx context.Context) grpc.ServerStream {
	return &stream{ServerStream: ss, ctx: ctx}
}

type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

func (s *stream) RecvMsg(m any) error {
	if err := s.ctx.Err(); err != nil {
		return context.Cause(s.ctx)
	}
	got := make(chan error, 1)
	go func() { got <- s.ServerStream.RecvMsg(m) }()
	select {
	case err := <-got:
		return err
	case <-s.ctx.Done():
		// The read goes on until the stream ends (the handler returns
		// soon); m is the caller's no more.
		return context.Cause(s.ctx)
	}
}
