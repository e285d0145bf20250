package federation

import (
	"context"
	"sync"

	"google.golang.org/grpc/peer"
)

// Receive runs recv in a goroutine of its own, so a session loop can select on
// messages next to its other inputs. It never stops reading while the
// session loop is busy: both ends of a stream may send a long full state at
// once (the spoke its shards, the hub its imports), and a side that stopped
// reading while it sent would leave both blocked in Send for good once the
// flow-control windows fill. What the loop has not taken yet waits in a
// queue; each message is bounded by the server's and client's receive
// limits. The first error is sent on errc once every message before it was
// taken; the goroutines end then, or when ctx ends. Both ends of the
// federation stream use it, and so does replication between hub replicas.
func Receive[T any](ctx context.Context, recv func() (T, error)) (msgs <-chan T, errc <-chan error) {
	out := make(chan T)
	errs := make(chan error, 1)
	var (
		mu    sync.Mutex
		queue []T
		rerr  error
	)
	arrived := make(chan struct{}, 1)
	signal := func() {
		select {
		case arrived <- struct{}{}:
		default:
		}
	}
	go func() {
		for {
			m, err := recv()
			mu.Lock()
			if err != nil {
				rerr = err
			} else {
				queue = append(queue, m)
			}
			mu.Unlock()
			signal()
			if err != nil {
				return
			}
		}
	}()
	go func() {
		for {
			mu.Lock()
			if len(queue) > 0 {
				m := queue[0]
				var zero T
				queue[0] = zero
				queue = queue[1:]
				mu.Unlock()
				select {
				case out <- m:
				case <-ctx.Done():
					return
				}
				continue
			}
			err := rerr
			mu.Unlock()
			if err != nil {
				errs <- err
				return
			}
			select {
			case <-arrived:
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
