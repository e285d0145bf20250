package limits

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"
	"unicode/utf8"
)

// MaxLoggedBytes bounds each peer-supplied string a log line carries: a
// peer may send megabytes in one field, and a log line that repeats it
// costs the disk as much, once per refusal.
const MaxLoggedBytes = 256

// Truncate returns s when it is at most MaxLoggedBytes long; otherwise
// its first MaxLoggedBytes (cut at a character boundary), with a marker
// saying how long it was. Wrap every peer-supplied string a log line
// carries in it (RefusalLog does so itself).
func Truncate(s string) string {
	if len(s) <= MaxLoggedBytes {
		return s
	}
	cut := MaxLoggedBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	// A new string: the result does not keep the peer's megabytes alive.
	return fmt.Sprintf("%s...(truncated, %d bytes in all)", s[:cut], len(s))
}

// Defaults of NewRefusalLog.
const (
	DefaultRefusalInterval = time.Minute
	DefaultRefusalBurst    = 10
)

// RefusalLog logs refusals of what peers send: at most burst lines per
// reason per interval; the refusals beyond are counted, and summed up in
// one line once the interval is over. Every string, error and Stringer
// among a line's values is cut to MaxLoggedBytes (see Truncate). A flood
// of refusals costs the log a few lines a minute, whatever the peers
// send. It is safe for concurrent use.
type RefusalLog struct {
	log   *slog.Logger
	every time.Duration
	burst int
	// now and afterFunc are the clock (tests replace them).
	now       func() time.Time
	afterFunc func(time.Duration, func())

	mu       sync.Mutex // guards byReason
	byReason map[string]*refusals
}

// refusals is one reason's account in the current interval.
type refusals struct {
	since      time.Time // when the interval began
	logged     int       // lines logged in it
	unlogged   int       // refusals not logged since the last summary
	level      slog.Level
	msg        string // the message of the last refusal not logged
	summarised bool   // a summary is scheduled
	gen        uint64 // which interval's account this is (a summary scheduled for an older one does nothing)
}

// NewRefusalLog returns a RefusalLog writing to log, at most burst lines
// per reason every interval (0: DefaultRefusalBurst, DefaultRefusalInterval).
func NewRefusalLog(log *slog.Logger, every time.Duration, burst int) *RefusalLog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if every <= 0 {
		every = DefaultRefusalInterval
	}
	if burst <= 0 {
		burst = DefaultRefusalBurst
	}
	return &RefusalLog{log: log, every: every, burst: burst, now: time.Now,
		afterFunc: func(d time.Duration, f func()) { time.AfterFunc(d, f) }, byReason: map[string]*refusals{}}
}

// Warn logs a refusal for reason at level Warn (see Log).
func (r *RefusalLog) Warn(reason, msg string, args ...any) {
	r.Log(context.Background(), slog.LevelWarn, reason, msg, args...)
}

// Log logs a refusal for reason (a constant of the code, never a value
// a peer chose: each reason holds an account), unless reason already had
// its lines in this interval. args are slog's key/value pairs or Attrs.
func (r *RefusalLog) Log(ctx context.Context, level slog.Level, reason, msg string, args ...any) {
	if !r.log.Enabled(ctx, level) {
		return
	}
	if !r.admit(reason, level, msg) {
		return
	}
	r.log.Log(ctx, level, msg, truncateArgs(args)...)
}

// admit reports whether a refusal for reason is logged, and counts it
// when it is not.
func (r *RefusalLog) admit(reason string, level slog.Level, msg string) bool {
	now := r.now()
	r.mu.Lock()
	a := r.byReason[reason]
	if a == nil {
		a = &refusals{since: now}
		r.byReason[reason] = a
	}
	var summary *refusals
	if now.Sub(a.since) >= r.every {
		if a.unlogged > 0 { // the scheduled summary has not run yet: this one says it
			s := *a
			summary = &s
		}
		*a = refusals{since: now, gen: a.gen + 1}
	}
	ok := a.logged < r.burst
	if ok {
		a.logged++
	} else {
		a.unlogged++
		a.level, a.msg = level, msg
		if !a.summarised {
			a.summarised = true
			gen := a.gen
			r.afterFunc(a.since.Add(r.every).Sub(now), func() { r.summarise(reason, gen) })
		}
	}
	r.mu.Unlock()
	if summary != nil {
		r.logSummary(reason, summary)
	}
	return ok
}

// summarise logs the refusals for reason not logged in interval gen (an
// interval that ended before, summed up as the next began, is not again).
func (r *RefusalLog) summarise(reason string, gen uint64) {
	r.mu.Lock()
	a := r.byReason[reason]
	if a == nil || a.gen != gen || a.unlogged == 0 {
		r.mu.Unlock()
		return
	}
	s := *a
	a.unlogged, a.summarised = 0, false
	r.mu.Unlock()
	r.logSummary(reason, &s)
}

func (r *RefusalLog) logSummary(reason string, a *refusals) {
	r.log.Log(context.Background(), a.level, "more refusals, not logged one by one", "reason", reason,
		"count", a.unlogged, "interval", r.every.String(), "last", a.msg)
}

// truncateArgs returns args with every string-like value cut to
// MaxLoggedBytes; keys are the code's and stay as they are.
func truncateArgs(args []any) []any {
	out := make([]any, 0, len(args))
	for i := 0; i < len(args); i++ {
		switch a := args[i].(type) {
		case slog.Attr:
			out = append(out, slog.Attr{Key: a.Key, Value: truncateValue(a.Value)})
		case string:
			out = append(out, a)
			if i+1 < len(args) {
				i++
				out = append(out, truncateAny(args[i]))
			}
		default: // a value without a key: slog logs it as !BADKEY
			out = append(out, truncateAny(a))
		}
	}
	return out
}

func truncateValue(v slog.Value) slog.Value {
	switch v.Kind() {
	case slog.KindString:
		return slog.StringValue(Truncate(v.String()))
	case slog.KindAny:
		return slog.AnyValue(truncateAny(v.Any()))
	case slog.KindGroup:
		attrs := v.Group()
		out := make([]slog.Attr, len(attrs))
		for i, a := range attrs {
			out[i] = slog.Attr{Key: a.Key, Value: truncateValue(a.Value)}
		}
		return slog.GroupValue(out...)
	default: // numbers, times, durations, LogValuers (resolved by the handler)
		return v
	}
}

// truncateAny cuts a string, an error, a Stringer or bytes; other values
// (numbers, times, slog.Values) are bounded already, or are the caller's.
func truncateAny(v any) any {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return Truncate(x)
	case slog.Value:
		return truncateValue(x)
	case error:
		return Truncate(x.Error())
	case fmt.Stringer:
		return Truncate(x.String())
	case []byte:
		return Truncate(string(x))
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.String { // ClusterID, Network, ...
		return Truncate(rv.String())
	}
	return v
}

// refusalCodes are the gRPC codes (as go-grpc-middleware's logging
// interceptor names them in its "grpc.code" field) with which a server
// refuses what a peer sent or how much it takes.
var refusalCodes = map[string]bool{
	"InvalidArgument": true, "ResourceExhausted": true, "PermissionDenied": true, "Unauthenticated": true,
	"DeadlineExceeded": true, "FailedPrecondition": true, "OutOfRange": true,
}

// FinishedCall logs a finished gRPC call as go-grpc-middleware's logging
// interceptor reports it (fields are its key/value pairs): a call that
// ended with a refusal's code is a refusal of reason "grpc_" + code,
// rate-limited like any other; every call's string fields (the status
// message among them, which may quote the peer) are cut to
// MaxLoggedBytes.
func (r *RefusalLog) FinishedCall(ctx context.Context, level slog.Level, msg string, fields ...any) {
	for i := 0; i+1 < len(fields); i += 2 {
		if k, _ := fields[i].(string); k == "grpc.code" {
			if code, _ := fields[i+1].(string); refusalCodes[code] {
				r.Log(ctx, level, "grpc_"+code, msg, fields...)
				return
			}
			break
		}
	}
	if r.log.Enabled(ctx, level) {
		r.log.Log(ctx, level, msg, truncateArgs(fields)...)
	}
}
