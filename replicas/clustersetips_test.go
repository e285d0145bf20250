package replicas

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/navemesh/nave/registry"
)

func newIPs(t *testing.T, endpoint string, cidrs ...string) *ClusterSetIPs {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	var prefixes []netip.Prefix
	for _, c := range cidrs {
		prefixes = append(prefixes, netip.MustParsePrefix(c))
	}
	s, err := NewClusterSetIPs(cli, "/nave/", prefixes)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func svcKey(name string) registry.ServiceKey { return registry.ServiceKey{Namespace: "ns", Name: name} }

func TestClusterSetIPsAreStickyAndShared(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	ctx := t.Context()
	a := newIPs(t, endpoint, "243.0.0.0/24", "fd00:243::/112")
	b := newIPs(t, endpoint, "243.0.0.0/24", "fd00:243::/112") // another replica

	ips, err := a.Claim(ctx, svcKey("web"), []registry.IPFamily{registry.IPv6, registry.IPv4})
	if err != nil {
		t.Fatal(err)
	}
	if len(ips) != 2 || !ips[0].Is6() || !ips[1].Is4() || !netip.MustParsePrefix("243.0.0.0/24").Contains(ips[1]) {
		t.Fatalf("claimed %v, want one IPv6 then one IPv4 address from the ranges", ips)
	}
	// Another replica, and the same one again, get the same IPs.
	for _, s := range []*ClusterSetIPs{a, b} {
		again, err := s.Claim(ctx, svcKey("web"), []registry.IPFamily{registry.IPv6, registry.IPv4})
		if err != nil || fmt.Sprint(again) != fmt.Sprint(ips) {
			t.Fatalf("claimed again: %v, %v; want %v", again, err, ips)
		}
	}
	// Released, the IP stays the service's through the hold-down ...
	if err := b.Release(ctx, svcKey("web"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Collect(ctx, time.Now(), time.Hour); err != nil || n != 0 {
		t.Fatalf("Collect within the hold-down deleted %d (%v)", n, err)
	}
	back, err := a.Claim(ctx, svcKey("web"), []registry.IPFamily{registry.IPv6, registry.IPv4})
	if err != nil || fmt.Sprint(back) != fmt.Sprint(ips) {
		t.Fatalf("a service back within the hold-down got %v (%v), want %v", back, err, ips)
	}
	// ... and is freed after it.
	if err := a.Release(ctx, svcKey("web"), time.Now().Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Collect(ctx, time.Now(), time.Hour); err != nil || n != 2 {
		t.Fatalf("Collect after the hold-down deleted %d (%v), want both families' claims", n, err)
	}
	// A restarted replica knows every claim from etcd.
	c := newIPs(t, endpoint, "243.0.0.0/24")
	x, err := a.Claim(ctx, svcKey("x"), []registry.IPFamily{registry.IPv4})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Claim(ctx, svcKey("x"), []registry.IPFamily{registry.IPv4}); err != nil || got[0] != x[0] {
		t.Fatalf("after Load: %v (%v), want %v", got, err, x)
	}
}

// Replicas claiming at once never give one IP to two services, nor two IPs to one.
func TestClusterSetIPsRaceWithoutDuplicates(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	ctx := t.Context()
	replicas := []*ClusterSetIPs{newIPs(t, endpoint, "243.0.0.0/27"), newIPs(t, endpoint, "243.0.0.0/27"), newIPs(t, endpoint, "243.0.0.0/27")}
	const services = 25 // of 30 usable addresses: collisions of preferred slots are certain
	got := make([][]netip.Addr, len(replicas))
	var wg sync.WaitGroup
	for i, r := range replicas {
		wg.Go(func() {
			for n := range services {
				ips, err := r.Claim(ctx, svcKey(fmt.Sprintf("s%d", n)), []registry.IPFamily{registry.IPv4})
				if err != nil {
					t.Errorf("replica %d, service %d: %v", i, n, err)
					return
				}
				got[i] = append(got[i], ips[0])
			}
		})
	}
	wg.Wait()
	owner := map[netip.Addr]int{}
	for n := range services {
		for i := range replicas {
			if got[i][n] != got[0][n] {
				t.Fatalf("service %d: replica %d got %s, replica 0 %s", n, i, got[i][n], got[0][n])
			}
		}
		if o, dup := owner[got[0][n]]; dup {
			t.Fatalf("services %d and %d share %s", o, n, got[0][n])
		}
		owner[got[0][n]] = n
	}
	// The range is full past its usable addresses.
	for n := services; n < 30; n++ {
		if _, err := replicas[0].Claim(ctx, svcKey(fmt.Sprintf("s%d", n)), []registry.IPFamily{registry.IPv4}); err != nil {
			t.Fatalf("service %d of 30: %v", n, err)
		}
	}
	if _, err := replicas[1].Claim(ctx, svcKey("one-too-many"), []registry.IPFamily{registry.IPv4}); err == nil {
		t.Fatal("a claim in a full range succeeded")
	}
}

func TestClusterSetIPsConfig(t *testing.T) {
	if _, err := NewClusterSetIPs(nil, "/nave/", []netip.Prefix{netip.MustParsePrefix("243.0.0.0/16"), netip.MustParsePrefix("10.0.0.0/8")}); err == nil {
		t.Error("two IPv4 ranges were accepted")
	}
	if _, err := NewClusterSetIPs(nil, "/nave/", []netip.Prefix{netip.MustParsePrefix("243.0.0.1/16")}); err == nil {
		t.Error("a range with host bits was accepted")
	}
	s, err := NewClusterSetIPs(nil, "/nave/", []netip.Prefix{netip.MustParsePrefix("243.0.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	// A family without a range gets no IP (and needs no etcd).
	if ips, err := s.Claim(context.Background(), svcKey("v6"), []registry.IPFamily{registry.IPv6}); err != nil || len(ips) != 0 {
		t.Errorf("claim without an IPv6 range: %v, %v", ips, err)
	}
}

// A service that leaves an IP family releases that family's IP only.
func TestClusterSetIPsReleaseKeepsTheFamiliesStillHeld(t *testing.T) {
	_, endpoint := embeddedEtcd(t)
	ctx := t.Context()
	s := newIPs(t, endpoint, "243.0.0.0/24", "fd00:243::/112")
	both, err := s.Claim(ctx, svcKey("web"), []registry.IPFamily{registry.IPv4, registry.IPv6})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, svcKey("web"), time.Now().Add(-2*time.Hour), registry.IPv4); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Collect(ctx, time.Now(), time.Hour); err != nil || n != 1 {
		t.Fatalf("Collect freed %d claims (%v), want the IPv6 one only", n, err)
	}
	if got, err := s.Claim(ctx, svcKey("web"), []registry.IPFamily{registry.IPv4}); err != nil || got[0] != both[0] {
		t.Errorf("the IPv4 IP after releasing IPv6: %v (%v), want %v", got, err, both[0])
	}
}
