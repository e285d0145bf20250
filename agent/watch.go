package agent

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"time"
)

// Watch is how the agent watches files (certificates): their content is
// hashed every Interval, and a change is acted on once the content has
// stayed the same for Settle, so that a rotation that writes a certificate
// and its key one after the other is taken whole. (Polling rather than
// inotify: it needs no dependency, and it sees Kubernetes' symlink swaps
// of Secret volumes like any other write.)
type Watch struct {
	Interval, Settle time.Duration
}

// DefaultWatch polls every second and acts two seconds after the last change.
func DefaultWatch() Watch { return Watch{Interval: time.Second, Settle: 2 * time.Second} }

// fileSum is what a set of files holds: their names and content, or for a
// file that cannot be read, the error.
type fileSum [sha256.Size]byte

func sumFiles(files []string) fileSum {
	h := sha256.New()
	for _, name := range files {
		_, _ = io.WriteString(h, name+"\x00")
		if b, err := os.ReadFile(name); err != nil {
			_, _ = io.WriteString(h, "error\x00"+err.Error())
		} else {
			_, _ = io.WriteString(h, "ok\x00")
			_, _ = h.Write(b)
		}
		_, _ = h.Write([]byte{0})
	}
	var s fileSum
	h.Sum(s[:0])
	return s
}

// watchFiles calls changed each time the files' content has changed and
// settled, until ctx ends. The baseline is what the files held when the
// caller read them (baseline, taken before that read: a change in between
// is then seen, not lost), or, when nil, what they hold now. changed runs
// on watchFiles' goroutine; a panic in it is logged and the watch goes on.
func watchFiles(ctx context.Context, w Watch, files []string, baseline *fileSum, log *slog.Logger, changed func()) {
	if len(files) == 0 {
		return
	}
	applied := sumFiles(files)
	if baseline != nil {
		applied = *baseline
	}
	var pending fileSum
	var pendingSince time.Time
	havePending := false
	tick := time.NewTicker(w.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := sumFiles(files)
		switch {
		case now == applied:
			havePending = false
		case !havePending || now != pending:
			pending, pendingSince, havePending = now, time.Now(), true
			log.Debug("watched files changed; waiting for them to settle", "files", files, "settle", w.Settle)
		case time.Since(pendingSince) >= w.Settle:
			applied, havePending = now, false
			callChanged(log, changed)
		}
	}
}

func callChanged(log *slog.Logger, changed func()) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("panic while acting on changed files; watching on", "panic", r, "stack", string(debug.Stack()))
		}
	}()
	changed()
}
