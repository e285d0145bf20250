package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/navemesh/nave/internal/logbuf"
)

// logLines is a slog handler's output, one record a line.
type logLines struct{ logbuf.Buffer }

func (l *logLines) lines() []string {
	return strings.Split(strings.TrimSuffix(l.String(), "\n"), "\n")
}

func (l *logLines) size() int { return len(l.String()) }

func (l *logLines) count(substr string) int {
	n := 0
	for _, line := range l.lines() {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

func newLogLines() (*logLines, *slog.Logger) {
	l := &logLines{}
	return l, slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// fakeClock drives a RefusalLog: its time moves when the test says, and
// the summaries it schedules run when the test runs them.
type fakeClock struct {
	now       time.Time
	scheduled []func()
	delays    []time.Duration
}

func (c *fakeClock) install(r *RefusalLog) {
	r.now = func() time.Time { return c.now }
	r.afterFunc = func(d time.Duration, f func()) { c.delays, c.scheduled = append(c.delays, d), append(c.scheduled, f) }
}

func (c *fakeClock) runScheduled() {
	fs := c.scheduled
	c.scheduled = nil
	for _, f := range fs {
		f()
	}
}

func TestTruncate(t *testing.T) {
	if got := Truncate("east"); got != "east" {
		t.Errorf("Truncate(east) = %q", got)
	}
	exact := strings.Repeat("x", MaxLoggedBytes)
	if got := Truncate(exact); got != exact {
		t.Errorf("a string of exactly %d bytes was changed", MaxLoggedBytes)
	}
	huge := strings.Repeat("x", 4<<20)
	got := Truncate(huge)
	if len(got) > MaxLoggedBytes+64 || !strings.HasPrefix(got, exact) || !strings.Contains(got, "4194304 bytes") {
		t.Errorf("Truncate of 4 MiB = %d bytes, %q...: want %d bytes and the length", len(got), got[:min(len(got), 40)], MaxLoggedBytes)
	}
	// A cut never splits a character.
	accents := strings.Repeat("é", MaxLoggedBytes)
	if got := Truncate(accents); !utf8.ValidString(got) || len(got) > MaxLoggedBytes+64 {
		t.Errorf("Truncate of %d bytes of é = %q (valid UTF-8: %v)", len(accents), got, utf8.ValidString(got))
	}
}

type clusterID string

type stringer struct{ s string }

func (s stringer) String() string { return s.s }

// Every string-like value a refusal carries is cut, whatever its type.
func TestRefusalLogTruncatesWhatPeersSent(t *testing.T) {
	out, log := newLogLines()
	r := NewRefusalLog(log, time.Hour, 100)
	huge := strings.Repeat("n", 1<<20)
	r.Warn("big", "refused", "node", huge, "err", errors.New("bad "+huge), "cluster", clusterID(huge),
		"what", stringer{huge}, "raw", []byte(huge), slog.String("attr", huge), slog.Group("g", slog.String("in", huge)),
		"count", 3, "took", time.Second)
	if out.size() > 4096 {
		t.Fatalf("a refusal carrying 1 MiB values logged %d bytes: %.500s", out.size(), out.lines()[0])
	}
	line := out.lines()[0]
	for _, want := range []string{"count=3", "took=1s", "1048576 bytes", "1048580 bytes"} {
		if !strings.Contains(line, want) {
			t.Errorf("the line lacks %q: %s", want, line)
		}
	}
}

// A reason logs its first lines of each interval; the rest are counted and
// summed up once; another reason keeps its own account.
func TestRefusalLogLimitsEachReason(t *testing.T) {
	out, log := newLogLines()
	r := NewRefusalLog(log, time.Minute, 5)
	clock := &fakeClock{now: time.Unix(1000, 0)}
	clock.install(r)
	for i := range 300 {
		r.Warn("too_many_names", "refused a request naming too many resources", "node", fmt.Sprint("n", i))
	}
	r.Warn("metadata_too_large", "refused a node whose metadata is too large", "node", "fat")
	if n := out.count("naming too many"); n != 5 {
		t.Fatalf("300 refusals logged %d lines, want 5", n)
	}
	if n := out.count("metadata is too large"); n != 1 {
		t.Fatalf("another reason's refusal logged %d lines, want 1", n)
	}
	if len(clock.scheduled) != 1 || clock.delays[0] != time.Minute {
		t.Fatalf("scheduled %d summaries after %v, want one at the interval's end", len(clock.scheduled), clock.delays)
	}
	clock.now = clock.now.Add(time.Minute)
	clock.runScheduled()
	if n := out.count(`reason=too_many_names count=295`); n != 1 {
		t.Fatalf("the summary: %d lines saying 295 refusals, want 1:\n%s", n, strings.Join(out.lines(), "\n"))
	}
	// The next interval logs again; a summary that has run is not repeated.
	r.Warn("too_many_names", "refused a request naming too many resources", "node", "again")
	if n := out.count("node=again"); n != 1 {
		t.Errorf("the next interval's first refusal logged %d lines, want 1", n)
	}
	if n := out.count("not logged one by one"); n != 1 {
		t.Errorf("%d summaries, want 1", n)
	}
}

// A refusal that comes after the interval, before its summary ran, says
// the summary itself; the summary that runs late then says nothing.
func TestRefusalLogSummaryBeforeTheTimer(t *testing.T) {
	out, log := newLogLines()
	r := NewRefusalLog(log, time.Minute, 1)
	clock := &fakeClock{now: time.Unix(1000, 0)}
	clock.install(r)
	for range 4 {
		r.Warn("x", "refused x")
	}
	clock.now = clock.now.Add(2 * time.Minute)
	r.Warn("x", "refused x")
	clock.runScheduled()
	if n := out.count("count=3"); n != 1 {
		t.Errorf("%d summaries of 3 refusals, want 1:\n%s", n, strings.Join(out.lines(), "\n"))
	}
	if n := out.count("not logged one by one"); n != 1 {
		t.Errorf("%d summaries, want 1", n)
	}
	if n := out.count(`msg="refused x"`); n != 2 {
		t.Errorf("%d refusals logged, want one per interval (2)", n)
	}
}

// With the real clock, the summary comes once the interval is over, with
// no further refusal to trigger it.
func TestRefusalLogSummaryArrives(t *testing.T) {
	out, log := newLogLines()
	const every = 50 * time.Millisecond
	r := NewRefusalLog(log, every, 2)
	start := time.Now()
	for range 50 {
		r.Warn("flood", "refused a flood")
	}
	intervals := int(time.Since(start)/every) + 1 // a loaded machine may take more than one
	deadline := time.Now().Add(10 * time.Second)
	for out.count("not logged one by one") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no summary:\n%s", strings.Join(out.lines(), "\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := out.count(`msg="refused a flood"`); n > 2*intervals {
		t.Errorf("%d of 50 refusals logged in %d intervals, want at most 2 each", n, intervals)
	}
}

// Finished gRPC calls: refusals are rate-limited by code, other calls are
// all logged; both have their strings cut.
func TestFinishedCall(t *testing.T) {
	out, log := newLogLines()
	r := NewRefusalLog(log, time.Hour, 3)
	huge := strings.Repeat("q", 1<<20)
	for range 100 {
		r.FinishedCall(context.Background(), slog.LevelInfo, "finished call", "grpc.code", "InvalidArgument", "grpc.error", "hello: "+huge)
	}
	for range 10 {
		r.FinishedCall(context.Background(), slog.LevelInfo, "finished call", "grpc.code", "OK", "peer", huge)
	}
	if n := out.count("InvalidArgument"); n != 3 {
		t.Errorf("100 refused calls logged %d lines, want 3", n)
	}
	if n := out.count("grpc.code=OK"); n != 10 {
		t.Errorf("10 calls that ended well logged %d lines, want 10", n)
	}
	if out.size() > 13*1024 {
		t.Errorf("the lines take %d bytes: peer strings were not cut", out.size())
	}
}

// A summary scheduled for an interval that was summed up already, inline as
// the next began, does nothing: each interval is summed up once, at its end.
func TestRefusalLogSumsUpEachIntervalOnce(t *testing.T) {
	out, log := newLogLines()
	r := NewRefusalLog(log, time.Minute, 1)
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	clock.install(r)
	refuse := func(after time.Duration) {
		clock.now = clock.now.Add(after)
		r.Warn("bad", "refused")
	}
	refuse(0)           // logged
	refuse(time.Second) // counted; its summary is scheduled for the minute's end
	stale := clock.scheduled
	clock.scheduled = nil
	refuse(time.Minute) // a new interval: the last one is summed up now, this one logged
	refuse(time.Second) // counted in the new interval
	if n := out.count("not logged one by one"); n != 1 {
		t.Fatalf("%d summaries once the second interval began, want 1", n)
	}
	for _, f := range stale {
		f() // the first interval's timer fires late
	}
	if n := out.count("not logged one by one"); n != 1 {
		t.Errorf("%d summaries after the first interval's timer fired, want still 1 (the second interval is not over)", n)
	}
	clock.runScheduled() // the second interval's end
	if n := out.count("not logged one by one"); n != 2 {
		t.Errorf("%d summaries after the second interval ended, want 2", n)
	}
}
