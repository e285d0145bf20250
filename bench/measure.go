package main

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/navemesh/nave/convergence"
)

// Pure measuring helpers: Prometheus text, percentiles, latency summaries,
// and the process usage of the hub and of the bench itself.

// promText is a scraped Prometheus text exposition: value by series, the
// series written as name{labels} exactly as exposed (name alone without labels).
type promText map[string]float64

// parseProm reads the text exposition format; comments, timestamps and
// unparsable lines are skipped.
func parseProm(b []byte) promText {
	out := promText{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		// The series ends at the closing brace, or at the first space without labels.
		end := strings.IndexByte(line, ' ')
		if i := strings.IndexByte(line, '{'); i >= 0 && (end < 0 || i < end) {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			end = j + 1
		}
		if end <= 0 || end >= len(line) {
			continue
		}
		fields := strings.Fields(line[end:])
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out[line[:end]] = v
	}
	return out
}

// split returns a series' name and its labels (without braces).
func splitSeries(series string) (name, labels string) {
	i := strings.IndexByte(series, '{')
	if i < 0 {
		return series, ""
	}
	return series[:i], strings.TrimSuffix(series[i+1:], "}")
}

// sum adds every series of metric name whose labels contain each of the
// comma-separated label pairs in match (e.g. `type="eds"`; "" matches all).
func (p promText) sum(name, match string) float64 {
	total := 0.0
	for series, v := range p {
		n, labels := splitSeries(series)
		if n != name {
			continue
		}
		ok := true
		for _, m := range strings.Split(match, ",") {
			if m != "" && !slices.Contains(strings.Split(labels, ","), m) {
				ok = false
				break
			}
		}
		if ok {
			total += v
		}
	}
	return total
}

// has reports whether the metric has any series.
func (p promText) has(name string) bool {
	for series := range p {
		if n, _ := splitSeries(series); n == name {
			return true
		}
	}
	return false
}

// delta returns after's sum minus before's, for name and match.
func delta(before, after promText, name, match string) float64 {
	return after.sum(name, match) - before.sum(name, match)
}

// percentile returns the q-quantile (0..1) of sorted by nearest rank.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// latencySummary summarizes latencies, in milliseconds.
type latencySummary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50Ms"`
	P90  float64 `json:"p90Ms"`
	P99  float64 `json:"p99Ms"`
	Max  float64 `json:"maxMs"`
	Mean float64 `json:"meanMs"`
}

func summarize(d []time.Duration) latencySummary {
	if len(d) == 0 {
		return latencySummary{}
	}
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	var total time.Duration
	for _, x := range sorted {
		total += x
	}
	return latencySummary{N: len(sorted), P50: ms(percentile(sorted, 0.5)), P90: ms(percentile(sorted, 0.9)),
		P99: ms(percentile(sorted, 0.99)), Max: ms(sorted[len(sorted)-1]), Mean: ms(total / time.Duration(len(sorted)))}
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func (s latencySummary) String() string {
	if s.N == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s  (n=%d)", fmtMs(s.P50), fmtMs(s.P90), fmtMs(s.P99), fmtMs(s.Max), s.N)
}

func fmtMs(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1fs", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0fms", v)
	default:
		return fmt.Sprintf("%.1fms", v)
	}
}

// latencies selects the latencies of samples handed over in [from, to) that match keep.
func latencies(samples []sample, from, to time.Duration, keep func(sample) bool) []time.Duration {
	var out []time.Duration
	for _, s := range samples {
		if s.handed >= from && s.handed < to && (keep == nil || keep(s)) {
			out = append(out, s.latency)
		}
	}
	return out
}

// backlog compares the convergence latency of changes handed over in the
// first third of the churn with the last third.
type backlog struct {
	FirstThird latencySummary `json:"firstThird"`
	LastThird  latencySummary `json:"lastThird"`
	// Growing: the last third's p50 or p90 is more than 1.5 times the first
	// third's, and its p90 at least 50 ms more: the pipeline falls behind the churn.
	Growing bool `json:"growing"`
}

func backlogOf(samples []sample, start, end time.Duration) backlog {
	third := (end - start) / 3
	b := backlog{
		FirstThird: summarize(latencies(samples, start, start+third, nil)),
		LastThird:  summarize(latencies(samples, end-third, end, nil)),
	}
	first, last := b.FirstThird, b.LastThird
	b.Growing = first.N > 0 && last.N > 0 && (last.P50 > 1.5*first.P50 || last.P90 > 1.5*first.P90) && last.P90-first.P90 >= 50
	return b
}

// window is the convergence latency of the changes handed over in one slice of the churn.
type window struct {
	FromS float64 `json:"fromS"` // seconds since the churn started
	latencySummary
}

// windowsOf splits [start, end) into n equal windows.
func windowsOf(samples []sample, start, end time.Duration, n int) []window {
	var out []window
	width := (end - start) / time.Duration(max(n, 1))
	for i := range n {
		from, to := start+time.Duration(i)*width, start+time.Duration(i+1)*width
		if i == n-1 {
			to = end
		}
		out = append(out, window{FromS: (from - start).Seconds(), latencySummary: summarize(latencies(samples, from, to, nil))})
	}
	return out
}

// usageSample is the hub's resource use at one point.
type usageSample struct {
	Phase          string    `json:"phase"`
	At             time.Time `json:"at"`
	RSSBytes       float64   `json:"rssBytes"`
	HeapInuseBytes float64   `json:"heapInuseBytes"`
	// LiveHeapBytes estimates the heap live at the last GC (next GC goal / (1 + GOGC/100)).
	LiveHeapBytes  float64 `json:"liveHeapBytes"`
	GCs            int     `json:"gcs"` // garbage collections so far: the live heap changes only with one
	CPUSeconds     float64 `json:"cpuSeconds"`
	Goroutines     int     `json:"goroutines"`
	XDSClients     int     `json:"xdsClients"`
	LocalityGroups int     `json:"localityGroups"`
	// PeakRSSBytes is the most the process held resident so far (VmHWM).
	PeakRSSBytes float64 `json:"peakRssBytes"`
	// SettledRSSBytes is RSS once the Go runtime returned the free pages it
	// kept after a peak (set by the samples that wait for it; 0: not).
	SettledRSSBytes float64 `json:"settledRssBytes,omitempty"`
	// SettledAnonBytes is the anonymous part of SettledRSSBytes (the rest
	// is files mapped: the binary, etcd's database).
	SettledAnonBytes float64 `json:"settledAnonBytes,omitempty"`
	// HeapFreeKeptBytes is the heap's free pages not returned to the OS yet
	// (idle - released); StackInuseBytes the goroutine stacks.
	HeapFreeKeptBytes float64 `json:"heapFreeKeptBytes,omitempty"`
	StackInuseBytes   float64 `json:"stackInuseBytes,omitempty"`
}

// procUsage reads a process's resident memory and CPU time from /proc.
func procUsage(pid int) (rss, cpu float64, err error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	rss = statusBytes(status, "VmRSS")
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return rss, 0, err
	}
	// Fields after the command (which may hold spaces) start after the last ')'.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) > 12 {
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		cpu = (ut + st) / 100 // USER_HZ is 100 on Linux
	}
	return rss, cpu, nil
}

// procPeakRSS reads a process's peak resident memory (VmHWM) from /proc.
func procPeakRSS(pid int) (float64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return statusBytes(status, "VmHWM"), nil
}

// statusBytes is a "Field:  123 kB" line of /proc/PID/status in bytes (0: none).
func statusBytes(status []byte, field string) float64 {
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}

// selfCPU is the CPU time the bench process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// convergenceStages are the stages of nave_convergence_seconds, in order.
var convergenceStages = []string{convergence.StageSource, convergence.StageSpoke, convergence.StageSpokeToHub,
	convergence.StageApplyToPush, convergence.StagePushToAck, convergence.StageHubToAck, convergence.StageEndToEnd}

// convergenceOf summarizes what the hub's convergence histogram observed
// between before and after, per stage over every cluster.
func convergenceOf(before, after promText) map[string]stageSummary {
	out := map[string]stageSummary{}
	for _, stage := range convergenceStages {
		match := `stage="` + stage + `"`
		n := delta(before, after, convergence.MetricConvergence+"_count", match)
		if n <= 0 {
			continue
		}
		buckets := map[float64]float64{} // upper bound -> cumulative count
		for series := range after {
			name, labels := splitSeries(series)
			if name != convergence.MetricConvergence+"_bucket" || !slices.Contains(strings.Split(labels, ","), match) {
				continue
			}
			for _, l := range strings.Split(labels, ",") {
				if v, ok := strings.CutPrefix(l, `le="`); ok {
					le, err := strconv.ParseFloat(strings.TrimSuffix(v, `"`), 64)
					if err == nil {
						buckets[le] += after[series] - before[series]
					}
				}
			}
		}
		out[stage] = stageSummary{Count: n, MeanMs: 1000 * delta(before, after, convergence.MetricConvergence+"_sum", match) / n,
			P50Ms: 1000 * bucketQuantile(buckets, 0.5), P99Ms: 1000 * bucketQuantile(buckets, 0.99)}
	}
	return out
}

// bucketQuantile is the q-quantile of a cumulative histogram, interpolated
// linearly within its bucket as Prometheus's histogram_quantile does.
func bucketQuantile(buckets map[float64]float64, q float64) float64 {
	bounds := slices.Sorted(maps.Keys(buckets))
	if len(bounds) == 0 {
		return math.NaN()
	}
	total := buckets[bounds[len(bounds)-1]]
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, ub := range bounds {
		c := buckets[ub]
		if c >= rank {
			if math.IsInf(ub, 1) {
				return lower
			}
			if c == below {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/(c-below)
		}
		lower, below = ub, c
	}
	return lower
}
