package traffic

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// costlyRegex is a regular expression of at most MaxPatternBytes that Go's
// regexp takes (a repeat of 1000, the most it allows) but that compiles to
// about a million instructions.
func costlyRegex() string {
	lit := strings.Repeat("abcdefghij", 110)[:MaxPatternBytes-len("(?:){1000}")]
	return "(?:" + lit + "){1000}"
}

func costlySet(n int) Set {
	var matches []Match
	for i := range n {
		matches = append(matches, Match{Headers: []HeaderMatch{{Type: RegularExpression, Name: "x-r" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Value: costlyRegex()}}})
	}
	var rules []Rule
	for len(matches) > 0 {
		k := min(len(matches), MaxMatches)
		rules = append(rules, Rule{Matches: matches[:k], Backends: []Backend{{Kind: BackendServiceImport, Name: "b", Weight: 1}}})
		matches = matches[k:]
	}
	return Set{Routes: []Route{{Kind: HTTPRoute, Name: "r", CreatedAt: time.Unix(1000, 0).UTC(), Rules: rules}}}
}

// Validating one service's routes stays cheap: a 1 KiB regular expression
// can compile to a million instructions (200 MB and a fifth of a second),
// and every shard of every update is validated, and every grpc-go client
// compiles each regex twice, so the program's size is refused before it is
// compiled (MaxRegexProgram).
func TestRegexCompileCostIsBounded(t *testing.T) {
	s := costlySet(1)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	start := time.Now()
	err := s.Validate()
	took := time.Since(start)
	runtime.ReadMemStats(&m1)
	if err != nil {
		return // refused: fixed
	}
	alloc := (m1.TotalAlloc - m0.TotalAlloc) >> 20
	if n := s.HeldBytes(); n > MaxSetBytes {
		t.Fatalf("test set holds %d bytes", n)
	}
	perSet := MaxRegexes
	for big := costlySet(perSet); big.HeldBytes() > MaxSetBytes; big = costlySet(perSet) {
		perSet--
	}
	t.Logf("one regex: %v, %d MiB allocated; a set may hold %d of them", took, alloc, perSet)
	if alloc > 16 {
		t.Errorf("validating one regular expression of %d bytes allocated %d MiB (took %v); a set may hold %d (~%d MiB per shard validated)",
			len(costlyRegex()), alloc, took, perSet, int(alloc)*perSet)
	}
}
