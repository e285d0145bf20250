package xds

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// throttle bounds how fast each stream's requests are taken: a client
// beyond its rate waits (its stream's requests are read later, and the
// rest of the hub is untouched), it is not refused.
type throttle struct {
	limit rate.Limit
	burst int

	mu      sync.Mutex // guards streams
	streams map[streamKey]*streamThrottle
}

type streamThrottle struct {
	lim       *rate.Limiter
	nackLogAt time.Time // when a NACK of the stream was last logged
}

func newThrottle(perSecond float64, burst int) *throttle {
	return &throttle{limit: rate.Limit(perSecond), burst: max(1, burst), streams: map[streamKey]*streamThrottle{}}
}

func (t *throttle) stream(key streamKey) *streamThrottle {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.streams[key]
	if st == nil {
		st = &streamThrottle{}
		if t.limit > 0 {
			st.lim = rate.NewLimiter(t.limit, t.burst)
		}
		t.streams[key] = st
	}
	return st
}

// wait blocks the stream's request until its rate allows it; it reports
// whether it had to wait.
func (t *throttle) wait(key streamKey) bool {
	st := t.stream(key)
	if st.lim == nil {
		return false
	}
	r := st.lim.Reserve()
	d := r.Delay()
	if d <= 0 {
		return false
	}
	time.Sleep(d)
	return true
}

// logNACK reports whether a NACK of the stream should be logged: the
// first, then at most one a minute (a client that NACKs forever must not
// flood the log; the metric counts every one).
func (t *throttle) logNACK(key streamKey, now time.Time) bool {
	st := t.stream(key)
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Sub(st.nackLogAt) < time.Minute {
		return false
	}
	st.nackLogAt = now
	return true
}

func (t *throttle) forget(key streamKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.streams, key)
}
