package federation

import (
	"context"

	"google.golang.org/grpc/peer"
)

// Receive runs recv in a goroutine of its own, so a session loop can select on
// messages next to its other inputs. The goroutine ends at the first error
// (sent on errc) or when ctx ends. Both ends of the federation stream use it,
// and so does replication between hub replicas.
func Receive[T any](ctx context.Context, recv func() (T, error)) (msgs <-chan T, errc <-chan error) {
	out := make(chan T)
	errs := make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				errs <- err
				return
			}
			select {
			case out <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, errs
}

// PeerAddr is the address of the client of a stream's context, or "".
func PeerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
