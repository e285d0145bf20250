package registry

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// The upstream MCS conformance spec "should expose the union of the
// constituent service ports and raise a conflict": two clusters export
// different, non-clashing port sets; the ports are the union and the
// conflict concerns both clusters, naming the ports that differ.
func TestPortSetConflict(t *testing.T) {
	sctp := ServicePort{Name: "stcp", Port: 142, Protocol: ProtocolSCTP}
	svc := mergeByApply(t, []*Shard{
		exported("c1", 0, false, tcp("tcp", 42)),
		exported("c2", time.Second, false, tcp("tcp", 42), sctp),
	})
	if want := []ServicePort{tcp("tcp", 42), sctp}; !slices.Equal(svc.Ports, want) {
		t.Errorf("Ports = %v, want the union %v", svc.Ports, want)
	}
	if len(svc.Conflicts) != 1 {
		t.Fatalf("Conflicts = %+v, want one port-set conflict", svc.Conflicts)
	}
	c := svc.Conflicts[0]
	if c.Kind != PortConflict || !c.IsPortSet() || c.Winner != "c1" || c.Loser != "c2" {
		t.Errorf("conflict = %+v, want a PortConflict over the ports, c1 against c2", c)
	}
	for _, want := range []string{`142/SCTP "stcp" only in c2`, "union"} {
		if !strings.Contains(c.String(), want) {
			t.Errorf("conflict says %q, want it to contain %q", c.String(), want)
		}
	}
	if strings.Contains(c.String(), "ignored") {
		t.Errorf("conflict says %q: nothing is ignored, the ports are the union", c.String())
	}

	// Both directions are named; the merge does not depend on arrival order.
	svc = mergeByApply(t, []*Shard{
		exported("c2", time.Second, false, tcp("tcp", 42), sctp),
		exported("c1", 0, false, tcp("tcp", 42), udp("metrics", 9153)),
	})
	if len(svc.Conflicts) != 1 {
		t.Fatalf("Conflicts = %+v, want one", svc.Conflicts)
	}
	if got, want := svc.Conflicts[0].Reason, `the clusters export different ports: 9153/UDP "metrics" only in c1; 142/SCTP "stcp" only in c2`; got != want {
		t.Errorf("Reason = %q, want %q", got, want)
	}
}

func TestPortSetConflictNotRaised(t *testing.T) {
	tests := []struct {
		name   string
		shards []*Shard
		want   []string // the conflicts' properties
	}{
		{
			name: "the same ports",
			shards: []*Shard{
				exported("c1", 0, false, tcp("http", 80), udp("dns", 53)),
				exported("c2", time.Second, false, udp("dns", 53), tcp("http", 80)),
			},
		},
		{
			// Issue 24: the port name conflict says it all; no second conflict.
			name: "one port, other protocol",
			shards: []*Shard{
				exported("c1", 0, false, udp("dns", 53)),
				exported("c3", time.Second, false, tcp("dns", 53)),
			},
			want: []string{`port name "dns"`},
		},
		{
			name: "one port, other number (upstream: with conflicting ports)",
			shards: []*Shard{
				exported("c1", 0, false, tcp("tcp", 42)),
				exported("c2", time.Second, false, tcp("tcp", 43)),
			},
			want: []string{`port name "tcp"`},
		},
		{
			name: "one port, other name",
			shards: []*Shard{
				exported("c1", 0, false, tcp("http", 80)),
				exported("c2", time.Second, false, tcp("web", 80)),
			},
			want: []string{"port 80/TCP"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range mergeByApply(t, tt.shards).Conflicts {
				got = append(got, c.Property)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("conflicts over %q, want %q", got, tt.want)
			}
		})
	}
}
