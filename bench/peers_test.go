package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestLoopbackAddr(t *testing.T) {
	for _, tc := range []struct {
		block byte
		i     int
		want  string
	}{
		{spokeBlock, 0, "127.1.0.1"},
		{spokeBlock, 254, "127.1.0.255"},
		{spokeBlock, 255, "127.1.1.0"},
		{clientBlock, 9_999, "127.2.39.16"},
		{clientBlock, maxLoopbackPeers - 1, "127.2.255.254"},
	} {
		if got := loopbackAddr(tc.block, tc.i); got != netip.MustParseAddr(tc.want) {
			t.Errorf("loopbackAddr(%d, %d) = %s, want %s", tc.block, tc.i, got, tc.want)
		}
	}
	// Distinct addresses for every peer, and never the hub's 127.0.0.1.
	seen := map[netip.Addr]bool{}
	for _, b := range []byte{spokeBlock, clientBlock} {
		for i := range 20_000 {
			a := loopbackAddr(b, i)
			if seen[a] || !a.IsLoopback() || a == netip.MustParseAddr("127.0.0.1") {
				t.Fatalf("loopbackAddr(%d, %d) = %s: repeated, or not a peer's loopback address", b, i, a)
			}
			seen[a] = true
		}
	}
}

func TestConnsFor(t *testing.T) {
	for _, tc := range []struct{ n, perConn, least, want int }{
		{1010, 100, 4, 11}, // the large scale: 4 connections would carry 253 streams each, beyond the hub's 128
		{102, 100, 4, 4},
		{100, 100, 1, 1},
		{101, 100, 1, 2},
		{0, 100, 0, 1},
		{10_000, 1, 1, 10_000},
	} {
		if got := connsFor(tc.n, tc.perConn, tc.least); got != tc.want {
			t.Errorf("connsFor(%d, %d, %d) = %d, want %d", tc.n, tc.perConn, tc.least, got, tc.want)
		}
	}
}

func TestClientConns(t *testing.T) {
	cfg := config{scale: scales["large"], conns: 4, streamsPerConn: defaultStreamsPerConn}
	if got := clientConns(cfg); got != 11 {
		t.Errorf("large: %d connections, want 11", got)
	}
	cfg = config{scale: stormScale, conns: 4, streamsPerConn: defaultStreamsPerConn, storm: true}
	if got := clientConns(cfg); got != stormScale.GRPCClients {
		t.Errorf("storm: %d connections, want one per client (%d)", got, stormScale.GRPCClients)
	}
	cfg.connsSet = true
	if got := clientConns(cfg); got != 100 {
		t.Errorf("storm with -conns 4: %d connections, want 100 (streams per connection bound)", got)
	}
}

func TestClientIdentity(t *testing.T) {
	if got := clientIdentity(7, 1); got != "spiffe://cluster.local/ns/bench/sa/client" {
		t.Errorf("one identity: %s", got)
	}
	if got := clientIdentity(1234, 10); got != "spiffe://cluster.local/ns/bench/sa/client-004" {
		t.Errorf("ten identities, client 1234: %s", got)
	}
}

func TestParseFlagsStormAndMTLS(t *testing.T) {
	cfg, err := parseFlags([]string{"-storm", "-mtls"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.scale.Name != "storm" || !cfg.storm || !cfg.mtls || cfg.clientIdentities != 10 || clientConns(cfg) != 10_000 || cfg.connectTimeout != 20*time.Second {
		t.Errorf("-storm -mtls: %+v", cfg)
	}
	cfg, err = parseFlags([]string{"-storm", "-grpc-clients", "500", "-client-identities", "1"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.scale.GRPCClients != 500 || cfg.clientIdentities != 1 || clientConns(cfg) != 500 {
		t.Errorf("-storm -grpc-clients 500: %+v", cfg)
	}
	cfg, err = parseFlags([]string{"-scale", "large", "-mtls"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.scale.Name != "large" || cfg.clientIdentities != 1 || cfg.storm || cfg.connectTimeout != 5*time.Second {
		t.Errorf("-scale large -mtls: %+v", cfg)
	}
}

func TestErrorTally(t *testing.T) {
	var tally errorTally
	if got := tally.summary(); len(got) != 0 {
		t.Errorf("empty tally: %q", got)
	}
	tally.add("Unavailable", "first")
	tally.add("ResourceExhausted", "too many streams")
	tally.add("Unavailable", "second")
	want := []string{"2 x Unavailable: first", "1 x ResourceExhausted: too many streams"}
	if got := tally.summary(); strings.Join(got, "|") != strings.Join(want, "|") || tally.total.Load() != 3 {
		t.Errorf("summary = %q (total %d), want %q", got, tally.total.Load(), want)
	}
}

func TestStreamErrorKey(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.ResourceExhausted, "at most 2048 per peer"), "ResourceExhausted"},
		{fmt.Errorf("session: %w", status.Error(codes.Unavailable, "reset")), "Unavailable"},
		{context.DeadlineExceeded, "DeadlineExceeded"},
		{errors.New("boom"), "other"},
	} {
		if got := streamErrorKey(tc.err); got != tc.want {
			t.Errorf("streamErrorKey(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

func TestWarnCounter(t *testing.T) {
	var phase int
	var tallies [2]errorTally
	var out strings.Builder
	log := slog.New(warnCounter{Handler: slog.NewTextHandler(&out, nil), tally: func() *errorTally { return &tallies[phase] }})
	log = log.With("cluster", "c01")
	log.Info("hub session started")
	log.Warn("hub session ended; reconnecting", "err", "connection refused")
	phase = 1
	log.WithGroup("g").Error("hub rejected a service", "reason", "too big")
	if got := tallies[0].summary(); len(got) != 1 || got[0] != "1 x hub session ended; reconnecting: connection refused" {
		t.Errorf("phase 0: %q", got)
	}
	if got := tallies[1].summary(); len(got) != 1 || got[0] != "1 x hub rejected a service: too big" {
		t.Errorf("phase 1: %q", got)
	}
	if n := strings.Count(out.String(), "\n"); n != 3 {
		t.Errorf("%d records passed on, want 3:\n%s", n, out.String())
	}
}

func TestHubRefusals(t *testing.T) {
	m := parseProm([]byte(`# TYPE nave_refused_total counter
nave_refused_total{port="xds",reason="max_streams_per_peer"} 12
nave_refused_total{port="federation",reason="max_connections"} 0
nave_tls_refused_handshakes_total{port="xds",reason="untrusted"} 3
nave_xds_nacks_total 5
`))
	total, series := hubRefusals(m)
	if total != 15 || len(series) != 2 || series[`nave_refused_total{port="xds",reason="max_streams_per_peer"}`] != 12 {
		t.Errorf("hubRefusals = %v, %v", total, series)
	}
}

func TestLogProblems(t *testing.T) {
	log := `==> 2026-11-24T16:24:38Z nave hub on /tmp/data-1
time=2026-11-24T16:24:38.999Z level=WARN msg="degraded: etcd unreachable; serving and replicating go on" hub=bench-hub err="context deadline exceeded"
time=2026-11-24T16:24:39.000Z level=INFO msg=started
time=2026-11-24T16:24:40.000Z level=ERROR msg=boom hub=bench-hub
{"level":"warn","ts":"2026-11-24T16:24:45.802961Z","logger":"etcd-client","msg":"retrying of unary invoker failed","attempt":0}
{"level":"info","ts":"2026-11-24T16:24:45.9Z","msg":"fine"}
{"level":"error","msg":"no logger"}
time=2026-11-24T16:24:46.050Z level=WARN msg="degraded: etcd unreachable; serving and replicating go on" hub=bench-hub
`
	got := logProblems([]byte(log))
	want := map[string]int{
		"degraded: etcd unreachable; serving and replicating go on": 2,
		"boom": 1,
		"etcd-client: retrying of unary invoker failed": 1,
		"no logger": 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("logProblems = %v, want %v", got, want)
	}
}

func TestStatusBytes(t *testing.T) {
	status := []byte("Name:\tnave\nVmPeak:\t 3000000 kB\nVmHWM:\t 2900000 kB\nVmRSS:\t  123456 kB\n")
	if got := statusBytes(status, "VmHWM"); got != 2900000*1024 {
		t.Errorf("VmHWM = %v", got)
	}
	if got := statusBytes(status, "VmRSS"); got != 123456*1024 {
		t.Errorf("VmRSS = %v", got)
	}
	if got := statusBytes(status, "VmSwap"); got != 0 {
		t.Errorf("VmSwap = %v", got)
	}
}

// A peer's connection comes from its own loopback address, and is counted.
func TestPeerDialingFromLoopback(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	from := make(chan net.Addr, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		from <- c.RemoteAddr()
		c.Close()
	}()
	d := &peerDialing{connectTimeout: time.Second, backoff: clientBackoff}
	conn, err := grpc.NewClient(lis.Addr().String(), d.options(loopbackAddr(clientBlock, 41), nil)...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Connect()
	select {
	case a := <-from:
		if got := a.(*net.TCPAddr).AddrPort().Addr(); got != netip.MustParseAddr("127.2.0.42") {
			t.Errorf("connected from %s, want 127.2.0.42", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no connection")
	}
	if n := d.attempts.Load(); n < 1 {
		t.Errorf("%d attempts counted", n)
	}
}

// A stream refused by a limit is counted once: by the hub, not again by
// the client that saw it refused; other codes only the client saw count.
func TestRefusals(t *testing.T) {
	log := filepath.Join(t.TempDir(), "hub.log")
	if err := os.WriteFile(log, []byte("time=1 level=WARN msg=\"old\"\ntime=2 level=WARN msg=\"finished call\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &bench{fleet: &fleet{}, hub: &hubProcess{logPath: log}}
	b.fleet.streamErrors[phaseConnect].add("ResourceExhausted", "at most 2048 per peer")
	b.fleet.streamErrors[phaseConnect].add("Unavailable", "connection reset")
	b.fleet.streamErrors[phaseConnect].add("PermissionDenied", "no")
	b.fleet.streamErrors[phaseChurn].add("Internal", "not asked for")
	b.spokeWarnings[phaseConnect].add("hub session ended; reconnecting", "refused")
	m := parseProm([]byte(`nave_refused_total{port="xds",reason="max_streams_per_peer"} 1` + "\n"))
	r := b.refusals(m, int64(len("time=1 level=WARN msg=\"old\"\n")), phaseConnect)
	if r.Refused != 2 || r.ClientStreamErrors != 3 || r.SpokeWarnings != 1 || len(r.ClientErrors) != 3 {
		t.Errorf("refusals = %+v, want 2 refused (1 by the hub, PermissionDenied), 3 client errors, 1 spoke warning", r)
	}
	if len(r.HubLog) != 1 || r.HubLog["finished call"] != 1 {
		t.Errorf("hub log from the offset: %v", r.HubLog)
	}
}
