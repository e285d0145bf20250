package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// How the simulated peers reach the hub, and what refused them.
//
// The hub's per-peer limits count connections and streams by IP address
// (or by certificate identity). In production every spoke and most xDS
// clients have an address of their own; here everything runs on one
// machine, so each spoke and each client connection dials from an address
// of its own in 127.0.0.0/8 (Linux routes all of it to lo), and the hub's
// default limits apply as they would in production.

// Loopback blocks the peers' source addresses are drawn from.
const (
	spokeBlock  = 1 // 127.1.0.0/16: spokes
	clientBlock = 2 // 127.2.0.0/16: xDS client connections
)

// loopbackAddr is the i-th (from 0) address of block: 127.block.0.1 onwards.
func loopbackAddr(block byte, i int) netip.Addr {
	v := uint32(i + 1)
	return netip.AddrFrom4([4]byte{127, block, byte(v >> 8), byte(v)})
}

// maxLoopbackPeers is how many addresses a block holds.
const maxLoopbackPeers = 1<<16 - 2

// peerDialing is how one kind of simulated peer (spokes, clients) dials
// the hub, and how often it did.
type peerDialing struct {
	// connectTimeout bounds one connection attempt: TCP, TLS and HTTP/2
	// handshakes (gRPC's MinConnectTimeout; grpc-go's default is 20 s).
	connectTimeout time.Duration
	backoff        backoff.Config
	// attempts counts the connections dialled (TCP connects started).
	attempts atomic.Int64
}

// options are the dial options of one connection from the local address
// from, over TLS with tlsCfg (nil: plaintext).
func (d *peerDialing) options(from netip.Addr, tlsCfg *tls.Config) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: d.backoff, MinConnectTimeout: d.connectTimeout}),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d.attempts.Add(1)
			dialer := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
			return dialer.DialContext(ctx, "tcp", addr)
		}),
	}
}

// connsFor is how many connections n streams need so that none carries
// more than perConn (the hub allows 128 concurrent streams per connection;
// grpc-go queues streams beyond the server's limit, so those clients
// would never be served), and at least least.
func connsFor(n, perConn, least int) int {
	need := n
	if perConn > 0 {
		need = (n + perConn - 1) / perConn
	}
	return max(need, least, 1)
}

// errorTally counts errors by a key, keeping the first message of each.
// Safe for concurrent use.
type errorTally struct {
	mu     sync.Mutex
	counts map[string]int64
	first  map[string]string
	total  atomic.Int64
}

func (t *errorTally) add(key, msg string) {
	t.total.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts, t.first = map[string]int64{}, map[string]string{}
	}
	if t.counts[key] == 0 {
		t.first[key] = msg
	}
	t.counts[key]++
}

// summary lists "count x key: first message", most frequent first.
func (t *errorTally) summary() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.counts))
	for k := range t.counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if t.counts[a] != t.counts[b] {
			return int(t.counts[b] - t.counts[a])
		}
		return strings.Compare(a, b)
	})
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%d x %s: %s", t.counts[k], k, t.first[k]))
	}
	return out
}

// streamErrorKey is how a client's stream error is tallied: its gRPC code.
func streamErrorKey(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Code().String()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return codes.DeadlineExceeded.String()
	}
	return "other"
}

// warnCounter is a slog handler that tallies records at Warn and above
// by message (in the tally that tally returns then), and passes every
// record on.
type warnCounter struct {
	slog.Handler
	tally func() *errorTally
}

func (w warnCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		var detail string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" || a.Key == "reason" {
				detail = a.Value.String()
				return false
			}
			return true
		})
		w.tally().add(r.Message, detail)
	}
	return w.Handler.Handle(ctx, r)
}

func (w warnCounter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnCounter{Handler: w.Handler.WithAttrs(attrs), tally: w.tally}
}

func (w warnCounter) WithGroup(name string) slog.Handler {
	return warnCounter{Handler: w.Handler.WithGroup(name), tally: w.tally}
}

// hubRefusals are the hub's counts of refused peers: nave_refused_total
// (limits) and nave_tls_refused_handshakes_total (certificates), by series.
func hubRefusals(m promText) (total float64, series map[string]float64) {
	series = map[string]float64{}
	for s, v := range m {
		name, _ := splitSeries(s)
		if (name == "nave_refused_total" || name == "nave_tls_refused_handshakes_total") && v > 0 {
			series[s] = v
			total += v
		}
	}
	return total, series
}

// logProblems tallies the lines of the hub's log at WARN or ERROR by their
// message: the hub's own (slog text) and its embedded etcd's (zap JSON,
// prefixed with the logger's name).
func logProblems(log []byte) map[string]int {
	out := map[string]int{}
	for line := range bytes.SplitSeq(log, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("{")) {
			var rec struct{ Level, Logger, Msg string }
			if json.Unmarshal(line, &rec) == nil && (rec.Level == "warn" || rec.Level == "error") {
				out[strings.TrimPrefix(rec.Logger+": ", ": ")+rec.Msg]++
			}
			continue
		}
		if !bytes.Contains(line, []byte("level=WARN")) && !bytes.Contains(line, []byte("level=ERROR")) {
			continue
		}
		out[logMessage(string(line))]++
	}
	return out
}

// logMessage is the msg of a slog text line (the whole line without one).
func logMessage(line string) string {
	_, rest, ok := strings.Cut(line, " msg=")
	if !ok {
		return line
	}
	if strings.HasPrefix(rest, `"`) {
		if msg, err := strconv.QuotedPrefix(rest); err == nil {
			if s, err := strconv.Unquote(msg); err == nil {
				return s
			}
		}
	}
	msg, _, _ := strings.Cut(rest, " ")
	return msg
}
