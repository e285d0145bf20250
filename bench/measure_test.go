package main

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0, 1 * time.Millisecond}, {0.5, 50 * time.Millisecond}, {0.9, 90 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}} {
		if got := percentile(d, tc.q); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.q*100, got, tc.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of nothing = %v", got)
	}
	if got := percentile([]time.Duration{7}, 0.99); got != 7 {
		t.Errorf("percentile of one = %v", got)
	}
	s := summarize([]time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond})
	if s.N != 3 || s.P50 != 2 || s.Max != 3 || s.Mean != 2 {
		t.Errorf("summarize: %+v", s)
	}
}

func TestBacklog(t *testing.T) {
	var steady, growing []sample
	for i := range 90 {
		handed := time.Duration(i) * 100 * time.Millisecond
		steady = append(steady, sample{converged: converged{handed: handed, latency: 5 * time.Millisecond}})
		growing = append(growing, sample{converged: converged{handed: handed, latency: time.Duration(i) * 10 * time.Millisecond}})
	}
	end := 9 * time.Second
	if b := backlogOf(steady, 0, end); b.Growing || b.FirstThird.N != 30 || b.LastThird.N != 30 {
		t.Errorf("steady latency: %+v", b)
	}
	if b := backlogOf(growing, 0, end); !b.Growing {
		t.Errorf("growing latency not flagged: %+v", b)
	}
	w := windowsOf(steady, 0, end, 3)
	if len(w) != 3 || w[0].N != 30 || w[2].N != 30 || w[1].FromS != 3 {
		t.Errorf("windows: %+v", w)
	}
}

func TestParseProm(t *testing.T) {
	p := parseProm([]byte(`# HELP nave_xds_responses_total Responses.
# TYPE nave_xds_responses_total counter
nave_xds_responses_total{type="eds"} 12
nave_xds_responses_total{type="lds"} 3
nave_federation_updates_total{cluster="c00",kind="delta",result="ack"} 5
nave_federation_updates_total{cluster="c01",kind="delta",result="ack"} 6
nave_federation_updates_total{cluster="c01",kind="full",result="ack"} 1
process_resident_memory_bytes 6.5e+07
weird{label="a b"} 2 1700000000000
nave_xds_push_latency_seconds_bucket{type="eds",le="+Inf"} 4
garbage line
`))
	for _, tc := range []struct {
		name, match string
		want        float64
	}{
		{"nave_xds_responses_total", "", 15},
		{"nave_xds_responses_total", `type="eds"`, 12},
		{"nave_federation_updates_total", `kind="delta"`, 11},
		{"nave_federation_updates_total", `kind="delta",cluster="c01"`, 6},
		{"process_resident_memory_bytes", "", 65e6},
		{"weird", `label="a b"`, 2},
		{"nave_xds_push_latency_seconds_bucket", `le="+Inf"`, 4},
		{"missing", "", 0},
	} {
		if got := p.sum(tc.name, tc.match); got != tc.want {
			t.Errorf("sum(%s, %s) = %v, want %v", tc.name, tc.match, got, tc.want)
		}
	}
	if !p.has("process_resident_memory_bytes") || p.has("missing") {
		t.Error("has")
	}
}

func TestParseFlags(t *testing.T) {
	t.Setenv("SCALE", "large")
	cfg, err := parseFlags([]string{"-rate", "5", "-gateways", "0", "-no-rolling-restart"})
	if err != nil {
		t.Fatal(err)
	}
	sc := cfg.scale
	if sc.Name != "large" || sc.Clusters != 10 || sc.Rate != 5 || sc.Gateways != 0 || sc.GRPCClients != 1000 || sc.RestartOver != 0 {
		t.Errorf("large with overrides: %+v", sc)
	}
	if cfg, err := parseFlags([]string{"-scale", "small"}); err != nil || cfg.scale.Clusters != 3 || cfg.scale.Duration != 20*time.Second {
		t.Errorf("small: %+v, %v", cfg.scale, err)
	}
	for _, bad := range [][]string{{"-scale", "huge"}, {"-endpoints", "6000"}, {"-grpc-clients", "0", "-gateways", "0"}, {"-rate", "0"}, {"extra"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestBucketQuantile(t *testing.T) {
	b := map[float64]float64{0.001: 0, 0.01: 50, 0.1: 100, math.Inf(1): 100}
	if got := bucketQuantile(b, 0.5); math.Abs(got-0.01) > 1e-9 {
		t.Errorf("p50 %v, want 0.01 (the 50th of 100 is the last of the second bucket)", got)
	}
	if got := bucketQuantile(b, 0.75); math.Abs(got-0.055) > 1e-9 {
		t.Errorf("p75 %v, want 0.055 (halfway through the third bucket)", got)
	}
	if got := bucketQuantile(map[float64]float64{}, 0.5); !math.IsNaN(got) {
		t.Errorf("no buckets: %v, want NaN", got)
	}
}
