// Package adminhttp serves a process's admin endpoints (health, metrics,
// status) over HTTP until its context ends.
package adminhttp

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// shutdownWithin bounds the wait for requests in flight when ctx ends.
const shutdownWithin = 2 * time.Second

// Serve serves h on lis until ctx ends, then shuts down (requests in flight
// get shutdownWithin). It returns nil once stopped, or the error that
// stopped it.
func Serve(ctx context.Context, lis net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
		case <-stopped:
			return
		}
		shutdown, cancel := context.WithTimeout(context.Background(), shutdownWithin)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
