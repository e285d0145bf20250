package federation

import (
	"runtime"
	"testing"

	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/traffic"
)

// A message of empty sub-messages (2 bytes each on the wire) holds tens of
// thousands of rules or matches within the 64 KiB wire bound, far more
// than validation allows: trafficFromProto counts them before converting
// any, as the rest of ShardFromProtoUnvalidated checks counts "before
// allocating anything in proportion to them".
func TestTrafficFromProtoChecksCountsBeforeConverting(t *testing.T) {
	p := &fedv1.Traffic{Routes: []*fedv1.TrafficRoute{{Kind: string(traffic.HTTPRoute), Name: "r"}}}
	rules := make([]*fedv1.TrafficRule, maxTrafficWireBytes/4) // 4 bytes each: a rule holding one empty match
	for i := range rules {
		rules[i] = &fedv1.TrafficRule{Matches: []*fedv1.TrafficMatch{{}}}
	}
	for p.Routes[0].Rules = rules; proto.Size(p) > maxTrafficWireBytes; p.Routes[0].Rules = rules {
		rules = rules[:len(rules)-8]
	}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	s, problem := trafficFromProto(p)
	runtime.ReadMemStats(&m1)
	alloc := m1.TotalAlloc - m0.TotalAlloc
	t.Logf("%d rules in %d wire bytes: problem %q, %d KiB allocated", len(rules), proto.Size(p), problem, alloc>>10)
	if problem == "" || alloc > 64<<10 {
		t.Errorf("trafficFromProto of %d rules: problem %q, %d KiB allocated; want it refused before converting", len(rules), problem, alloc>>10)
	}
	if problem == "" && len(s.Routes) > 0 && len(s.Routes[0].Rules) > traffic.MaxRules {
		t.Errorf("trafficFromProto converted %d rules of one route (validation allows %d), allocating %d KiB for %d wire bytes",
			len(s.Routes[0].Rules), traffic.MaxRules, alloc>>10, proto.Size(p))
	}
}
