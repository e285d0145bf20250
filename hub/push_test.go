package hub

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
)

// blockingPublisher records pushes; each push waits until released.
type blockingPublisher struct {
	mu      sync.Mutex
	pushes  []registry.Diff
	release chan struct{}
	entered chan struct{}
}

func (b *blockingPublisher) Update(_ *registry.Registry, d registry.Diff) {
	b.entered <- struct{}{}
	<-b.release
	b.mu.Lock()
	b.pushes = append(b.pushes, d)
	b.mu.Unlock()
}

// startPusher runs a pusher onto a blockingPublisher until the test ends.
func startPusher(t *testing.T) (*pusher, *blockingPublisher, context.Context) {
	b := &blockingPublisher{release: make(chan struct{}), entered: make(chan struct{}, 10)}
	p := newPusher(b, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p, b, ctx
}

// Changes that arrive while a push runs become one push, with what each
// service needs redone merged; the caller never waits for a push.
func TestPusherCoalescesWhileBusy(t *testing.T) {
	p, b, _ := startPusher(t)

	key := func(n string) registry.ServiceKey { return registry.ServiceKey{Namespace: "ns", Name: n} }
	reg := registry.New()
	p.Update(reg, registry.Diff{Services: []registry.ServiceDiff{{Key: key("a"), EndpointsChanged: true}}})
	<-b.entered // the first push is running and blocked
	updated := make(chan struct{})
	go func() {
		defer close(updated)
		p.Update(reg, registry.Diff{Services: []registry.ServiceDiff{{Key: key("b"), EndpointsChanged: true}}})
		p.Update(reg, registry.Diff{Services: []registry.ServiceDiff{{Key: key("a"), ShapeChanged: true}}})
		p.Update(reg, registry.Diff{Services: []registry.ServiceDiff{{Key: key("b"), ShapeChanged: false, EndpointsChanged: false}}})
	}()
	select {
	case <-updated: // while the first push is still blocked: Update never waits for it
	case <-time.After(time.Minute):
		t.Fatal("Update waits for the running push")
	}
	b.release <- struct{}{}
	<-b.entered
	b.release <- struct{}{}
	deadline := time.After(5 * time.Second)
	for {
		b.mu.Lock()
		n := len(b.pushes)
		b.mu.Unlock()
		if n == 2 {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("%d pushes, want 2", n)
		case <-time.After(10 * time.Millisecond):
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	want := []registry.ServiceDiff{{Key: key("a"), ShapeChanged: true}, {Key: key("b"), EndpointsChanged: true}}
	if got := b.pushes[1].Services; !slices.Equal(got, want) {
		t.Errorf("second push = %+v, want the three later changes merged: %+v", got, want)
	}
	select {
	case <-b.entered:
		t.Error("a third push, with nothing left to push")
	default:
	}
}

// caughtUp returns only once everything handed over has been pushed: the
// hub waits on it before it serves xDS after a restore.
func TestPusherCaughtUp(t *testing.T) {
	p, b, ctx := startPusher(t)

	if err := p.caughtUp(ctx); err != nil {
		t.Fatalf("an idle pusher: %v", err)
	}
	p.Update(registry.New(), registry.Diff{Services: []registry.ServiceDiff{{Key: registry.ServiceKey{Namespace: "ns", Name: "a"}, EndpointsChanged: true}}})
	caught := make(chan error, 1)
	go func() { caught <- p.caughtUp(ctx) }()
	<-b.entered // the push runs, blocked
	select {
	case err := <-caught:
		t.Fatalf("caughtUp returned (%v) while the push ran", err)
	case <-time.After(50 * time.Millisecond): // the window in which it must not return
	}
	b.release <- struct{}{}
	select {
	case err := <-caught:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("caughtUp did not return after the push")
	}
}
