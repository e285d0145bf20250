package hub

import (
	"context"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"

	"github.com/navemesh/nave/registry"
)

// pusher takes registry changes from the state goroutine without making it
// wait for xDS translation, and hands them to the xDS server on a goroutine
// of its own. Changes that arrive while a push runs are merged into the
// next one: the coalescing window adapts to the load, with no delay when
// the hub is idle and one push per busy period otherwise.
type pusher struct {
	target Publisher
	log    *slog.Logger
	wake   chan struct{} // buffered 1: a push is due

	mu      sync.Mutex // guards the fields below
	reg     *registry.Registry
	pending map[registry.ServiceKey]registry.ServiceDiff
	// nets is a network topology not yet pushed (nil: none).
	nets    *registry.Networks
	pushing bool
	// pushed is closed, and replaced, after every push.
	pushed chan struct{}
}

func newPusher(target Publisher, log *slog.Logger) *pusher {
	return &pusher{target: target, log: log.With("component", "push"), wake: make(chan struct{}, 1),
		pending: map[registry.ServiceKey]registry.ServiceDiff{}, pushed: make(chan struct{})}
}

// caughtUp returns once everything handed to Update so far has been pushed
// (or ctx ends).
func (p *pusher) caughtUp(ctx context.Context) error {
	for {
		p.mu.Lock()
		idle, pushed := len(p.pending) == 0 && p.nets == nil && !p.pushing, p.pushed
		p.mu.Unlock()
		if idle {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-pushed:
		}
	}
}

// Update implements Publisher: it never blocks.
func (p *pusher) Update(r *registry.Registry, d registry.Diff) {
	p.mu.Lock()
	p.reg = r
	mergeDiff(p.pending, d)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// SetNetworks implements NetworksPublisher: it never blocks. The topology
// is pushed before the changes that arrived with or after it.
func (p *pusher) SetNetworks(n registry.Networks) {
	p.mu.Lock()
	p.nets = &n
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// mergeDiff adds d to pending, a change per service: what to translate
// again, read from the latest registry, is all that matters.
func mergeDiff(pending map[registry.ServiceKey]registry.ServiceDiff, d registry.Diff) {
	for _, sd := range d.Services {
		if old, ok := pending[sd.Key]; ok {
			sd.ShapeChanged = sd.ShapeChanged || old.ShapeChanged
			sd.EndpointsChanged = sd.EndpointsChanged || old.EndpointsChanged
		}
		pending[sd.Key] = sd
	}
}

// take returns what is due, merged into one diff, and clears it; the push
// of it is under way until done is called.
func (p *pusher) take() (*registry.Registry, registry.Diff, *registry.Networks) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, nets := p.reg, p.nets
	p.nets = nil
	if nets != nil {
		p.pushing = true
	}
	if r == nil || len(p.pending) == 0 {
		return r, registry.Diff{}, nets
	}
	p.pushing = true
	d := registry.Diff{Version: r.Version(), Services: make([]registry.ServiceDiff, 0, len(p.pending))}
	for _, k := range slices.SortedFunc(maps.Keys(p.pending), registry.ServiceKey.Compare) {
		d.Services = append(d.Services, p.pending[k])
	}
	clear(p.pending)
	return r, d, nets
}

// run pushes until ctx ends.
func (p *pusher) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		r, d, nets := p.take()
		if nets == nil && (r == nil || d.Empty()) {
			continue
		}
		p.push(r, d, nets)
		p.done()
	}
}

// done ends the push under way.
func (p *pusher) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pushing = false
	close(p.pushed)
	p.pushed = make(chan struct{})
}

func (p *pusher) push(r *registry.Registry, d registry.Diff, nets *registry.Networks) {
	defer func() {
		if rec := recover(); rec != nil {
			p.log.Error("panic while pushing to xDS; the next change pushes again", "panic", rec, "stack", string(debug.Stack()))
		}
	}()
	if np, ok := p.target.(NetworksPublisher); ok && nets != nil {
		np.SetNetworks(*nets)
	}
	if r != nil && !d.Empty() {
		p.target.Update(r, d)
	}
}
