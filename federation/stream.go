package federation

import (
	"context"
	"sync"

	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// Receive runs recv in a goroutine of its own, so a session loop can select on
// messages next to its other inputs. It goes on reading while the session
// loop is busy: both ends of a stream may send a long full state at once (the
// spoke its shards, the hub its imports), and a side that stopped reading
// while it sent would leave both blocked in Send for good once the
// flow-control windows fill. What the loop has not taken yet waits in a
// queue of at most maxQueuedBytes; beyond that, reading pauses
// (back-pressure) until the loop catches up. The first error is sent on errc
// once every message before it was taken; the goroutines end then, or when
// ctx ends. Both ends of the federation stream use it, and so does
// replication between hub replicas.
func Receive[T any](ctx context.Context, recv func() (T, error)) (msgs <-chan T, errc <-chan error) {
	out := make(chan T)
	errs := make(chan error, 1)
	var (
		mu     sync.Mutex
		queue  []T
		queued int // bytes
		rerr   error
	)
	arrived, taken := make(chan struct{}, 1), make(chan struct{}, 1)
	signal := func(c chan struct{}) {
		select {
		case c <- struct{}{}:
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
				queue, queued = append(queue, m), queued+messageSize(m)
			}
			full := queued > maxQueuedBytes
			mu.Unlock()
			signal(arrived)
			if err != nil {
				return
			}
			for full {
				select {
				case <-taken:
				case <-ctx.Done():
					return
				}
				mu.Lock()
				full = queued > maxQueuedBytes
				mu.Unlock()
			}
		}
	}()
	go func() {
		for {
			mu.Lock()
			if len(queue) > 0 {
				m := queue[0]
				var zero T
				queue[0], queue, queued = zero, queue[1:], queued-messageSize(m)
				mu.Unlock()
				signal(taken)
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

// maxQueuedBytes bounds what Receive holds that its loop has not taken yet:
// far above what both ends of a session send at once in practice (a full
// state of 100,000 endpoints is about 5 MB).
const maxQueuedBytes = 64 << 20

// queuedMessageBytes is what a queued message counts beyond its wire size:
// its structs, held however little it says (an empty digest is 2 bytes on
// the wire and about 160 in memory). Without it, a peer sending empty
// messages to a session that stops taking them (throttled) would queue
// 80 times the budget.
const queuedMessageBytes = 256

// messageSize is what a queued message counts: its wire size plus
// queuedMessageBytes.
func messageSize(m any) int {
	if pm, ok := m.(proto.Message); ok {
		return proto.Size(pm) + queuedMessageBytes
	}
	return queuedMessageBytes
}

// PeerAddr is the address of the client of a stream's context, or "".
func PeerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
