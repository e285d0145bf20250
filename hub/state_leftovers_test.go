package hub

import (
	"context"
	"sync"
	"testing"
	"time"
)

// An operation the state goroutine has taken runs to its end before do
// returns, even when the caller's context ends meanwhile: the caller reads
// what the operation writes (a snapshot, a digest) without a race.
func TestDoWaitsForAnOperationItHandedOver(t *testing.T) {
	s := startState(t)
	ctx, cancel := context.WithCancel(context.Background())
	started, release := make(chan struct{}), make(chan struct{})
	letGo := sync.OnceFunc(func() { close(release) })
	t.Cleanup(letGo) // before the state stops: it waits for the operation
	wrote := 0
	result := make(chan error, 1)
	go func() {
		result <- s.do(ctx, func() {
			close(started)
			<-release
			wrote = 1
		})
	}()
	<-started
	cancel()
	select {
	case err := <-result:
		t.Fatalf("do returned %v while its operation ran", err)
	case <-time.After(50 * time.Millisecond):
	}
	letGo()
	if err := <-result; err != nil || wrote != 1 {
		t.Fatalf("do = %v, wrote %d; want nil after the operation's end", err, wrote)
	}
}
