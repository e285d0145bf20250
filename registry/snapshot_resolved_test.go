package registry

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// A snapshot keeps what a cluster's gateway names resolved to, and refuses
// resolutions it could not hand out or that name no gateway of the cluster.
func TestSnapshotResolvedGatewayNames(t *testing.T) {
	gws := []Gateway{{Address: "gw.example.com", Port: 15443}, {Address: "192.0.2.1", Port: 15443}}
	addr := netip.MustParseAddr("198.51.100.4")
	snap := func(rs ...ResolvedName) Snapshot {
		return Snapshot{Revision: 1, Clusters: []SnapshotCluster{{Cluster: "east", Network: "n1", Gateways: gws, Epoch: 1, Version: 1, Resolved: rs}}}
	}
	b, err := EncodeSnapshot(snap(ResolvedName{Name: "gw.example.com", Addresses: []netip.Addr{addr}}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(b)
	if err != nil || len(got.Clusters[0].Resolved) != 1 || got.Clusters[0].Resolved[0].Addresses[0] != addr {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	many := make([]netip.Addr, MaxResolvedAddresses+1)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})
	}
	for name, tc := range map[string]struct {
		rs   []ResolvedName
		want string
	}{
		"not a gateway": {[]ResolvedName{{Name: "other.example.com", Addresses: []netip.Addr{addr}}}, "no gateway name"},
		"an IP gateway": {[]ResolvedName{{Name: "192.0.2.1", Addresses: []netip.Addr{addr}}}, "no gateway name"},
		"broadcast":     {[]ResolvedName{{Name: "gw.example.com", Addresses: []netip.Addr{netip.MustParseAddr("255.255.255.255")}}}, "no address to hand out"},
		"unspecified":   {[]ResolvedName{{Name: "gw.example.com", Addresses: []netip.Addr{netip.IPv4Unspecified()}}}, "no address to hand out"},
		"none":          {[]ResolvedName{{Name: "gw.example.com"}}, "0 addresses"},
		"too many":      {[]ResolvedName{{Name: "gw.example.com", Addresses: many}}, "65 addresses"},
		"named twice":   {[]ResolvedName{{Name: "gw.example.com", Addresses: []netip.Addr{addr}}, {Name: "gw.example.com", Addresses: []netip.Addr{addr}}}, "repeated"},
	} {
		s := snap(tc.rs...)
		if err := CheckSnapshot(&s, DefaultLimits()); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused saying %q", name, err, tc.want)
		}
	}
}
