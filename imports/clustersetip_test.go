package imports

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/navemesh/nave/registry"
)

func key(i int) registry.ServiceKey {
	return registry.ServiceKey{Namespace: fmt.Sprintf("ns%d", i%7), Name: fmt.Sprintf("svc-%d", i)}
}

// usable lists a small range's usable addresses by enumeration (test only).
func usable(p netip.Prefix) map[netip.Addr]bool {
	p = p.Masked()
	out := map[netip.Addr]bool{}
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		out[a] = true
	}
	delete(out, p.Addr())
	if p.Addr().Is4() {
		last := p.Addr()
		for n := p.Addr(); p.Contains(n); n = n.Next() {
			last = n
		}
		delete(out, last)
	}
	return out
}

func TestPreferredIPVisitsEveryUsableAddress(t *testing.T) {
	for _, cidr := range []string{"10.96.0.0/28", "10.96.0.0/30", "10.96.0.7/29", "fd00::/124", "fd00::/127", "fd00::/126"} {
		t.Run(cidr, func(t *testing.T) {
			p := netip.MustParsePrefix(cidr)
			want := usable(p)
			for i := range 5 {
				seen := map[netip.Addr]bool{}
				for attempt := range len(want) {
					a := PreferredIP(p, key(i), attempt)
					if !want[a] || seen[a] {
						t.Fatalf("attempt %d: %v is not usable or seen twice (usable %d)", attempt, a, len(want))
					}
					seen[a] = true
				}
				if PreferredIP(p, key(i), len(want)) != PreferredIP(p, key(i), 0) {
					t.Error("attempts do not wrap around")
				}
			}
		})
	}
}

func TestPreferredIPIsDeterministicAndInRange(t *testing.T) {
	for _, cidr := range []string{"10.96.0.0/12", "10.0.0.0/8", "fd00:10:96::/108", "fd00::/64", "::/0", "0.0.0.0/0"} {
		p := netip.MustParsePrefix(cidr)
		for i := range 200 {
			a := PreferredIP(p, key(i), i)
			if a != PreferredIP(p, key(i), i) || !p.Contains(a) || a == p.Masked().Addr() {
				t.Fatalf("%s: %v for %v", cidr, a, key(i))
			}
		}
	}
	// Pinned (checked in Python: 1 + int(sha256("shop/web")[:16]) mod (2^20-2)):
	// preferences must not change between releases.
	if got := PreferredIP(netip.MustParsePrefix("10.96.0.0/12"), web, 0); got != addr("10.105.140.176") {
		t.Errorf("PreferredIP(shop/web) = %v", got)
	}
}

func TestPreferredIPNeverNetworkOrBroadcast(t *testing.T) {
	for _, cidr := range []string{"10.0.0.0/30", "10.0.0.4/30", "192.168.1.0/29"} {
		p := netip.MustParsePrefix(cidr)
		want := usable(p)
		for i := range 300 {
			if a := PreferredIP(p, key(i), i%3); !want[a] {
				t.Fatalf("%s: %v", cidr, a)
			}
		}
	}
}

func TestAllocate(t *testing.T) {
	t.Run("takes the preferred IP when free", func(t *testing.T) {
		p := netip.MustParsePrefix("10.96.0.0/16")
		a, err := Allocate(p, web, func(netip.Addr) bool { return false })
		if err != nil || a != PreferredIP(p, web, 0) {
			t.Errorf("Allocate = %v, %v", a, err)
		}
	})
	t.Run("probes like PreferredIP", func(t *testing.T) {
		p := netip.MustParsePrefix("10.96.0.0/24")
		taken := map[netip.Addr]bool{}
		for attempt := range 5 {
			taken[PreferredIP(p, web, attempt)] = true
		}
		a, err := Allocate(p, web, func(a netip.Addr) bool { return taken[a] })
		if err != nil || a != PreferredIP(p, web, 5) {
			t.Errorf("Allocate = %v, %v, want attempt 5's %v", a, err, PreferredIP(p, web, 5))
		}
	})
	t.Run("finds the one free IP of a nearly full range", func(t *testing.T) {
		for _, cidr := range []string{"10.96.0.0/28", "fd00::/125"} {
			p := netip.MustParsePrefix(cidr)
			for free := range usable(p) {
				a, err := Allocate(p, web, func(a netip.Addr) bool { return a != free })
				if err != nil || a != free {
					t.Fatalf("%s: Allocate = %v, %v, want %v", cidr, a, err, free)
				}
			}
		}
	})
	t.Run("full range", func(t *testing.T) {
		for _, cidr := range []string{"10.96.0.0/28", "10.96.0.0/30", "fd00::/127"} {
			calls := 0
			_, err := Allocate(netip.MustParsePrefix(cidr), web, func(netip.Addr) bool { calls++; return true })
			if !errors.Is(err, ErrRangeFull) || calls != len(usable(netip.MustParsePrefix(cidr))) {
				t.Errorf("%s: err %v after %d probes", cidr, err, calls)
			}
		}
	})
	t.Run("no usable address", func(t *testing.T) {
		for _, cidr := range []string{"10.96.0.0/31", "10.96.0.1/32", "fd00::1/128", "::ffff:10.0.0.0/120"} {
			p := netip.MustParsePrefix(cidr)
			if _, err := Allocate(p, web, func(netip.Addr) bool { return false }); !errors.Is(err, ErrInvalidRange) {
				t.Errorf("%s: err %v", cidr, err)
			}
			if a := PreferredIP(p, web, 0); a.IsValid() {
				t.Errorf("%s: PreferredIP = %v", cidr, a)
			}
		}
		if _, err := Allocate(netip.Prefix{}, web, nil); !errors.Is(err, ErrInvalidRange) {
			t.Errorf("zero prefix: %v", err)
		}
	})
	t.Run("IPv6 /64", func(t *testing.T) {
		p := netip.MustParsePrefix("fd00:10:96::/64")
		a, err := Allocate(p, web, func(a netip.Addr) bool { return a == PreferredIP(p, web, 0) })
		if err != nil || !p.Contains(a) || a != PreferredIP(p, web, 1) {
			t.Errorf("Allocate = %v, %v", a, err)
		}
		if testing.Short() {
			return
		}
		probes := 0
		if _, err := Allocate(p, web, func(netip.Addr) bool { probes++; return true }); !errors.Is(err, ErrRangeFull) || probes != maxProbes {
			t.Errorf("a huge range gives up after %d probes: %v", probes, err)
		}
	})
	t.Run("wraps from the last usable address", func(t *testing.T) {
		p := netip.MustParsePrefix("10.96.0.0/29")
		var k registry.ServiceKey
		for i := 0; ; i++ { // a key preferring the last usable address, .6
			if k = key(i); PreferredIP(p, k, 0) == addr("10.96.0.6") {
				break
			}
		}
		a, err := Allocate(p, k, func(a netip.Addr) bool { return a == addr("10.96.0.6") })
		if err != nil || a != addr("10.96.0.1") {
			t.Errorf("Allocate = %v, %v, want 10.96.0.1", a, err)
		}
	})
}

func TestPreferredIPDistribution(t *testing.T) {
	p := netip.MustParsePrefix("10.96.0.0/16")
	seen := map[netip.Addr]bool{}
	collisions := 0
	for i := range 1000 {
		a := PreferredIP(p, key(i), 0)
		if seen[a] {
			collisions++
		}
		seen[a] = true
	}
	// Birthday bound: 1000 keys in 65534 slots collide about 7.6 times.
	if collisions > 25 {
		t.Errorf("%d collisions among 1,000 keys in a /16", collisions)
	}
	t.Logf("%d collisions among 1,000 keys in a /16", collisions)
	// And every allocation succeeds with few probes.
	taken := map[netip.Addr]bool{}
	maxRun := 0
	for i := range 1000 {
		probes := 0
		a, err := Allocate(p, key(i), func(a netip.Addr) bool { probes++; return taken[a] })
		if err != nil {
			t.Fatal(err)
		}
		taken[a] = true
		maxRun = max(maxRun, probes)
	}
	if maxRun > 5 {
		t.Errorf("an allocation took %d probes", maxRun)
	}
}

func TestDerivedServiceName(t *testing.T) {
	// Golden values computed independently (Python: hashlib.sha256,
	// base64.b32hexencode, lower, [:10]).
	for k, want := range map[registry.ServiceKey]string{
		{Namespace: "default", Name: "web"}:          "derived-gapqrqeg1j",
		{Namespace: "prod", Name: "checkout"}:        "derived-aud6580pha",
		{Namespace: "kube-system", Name: "kube-dns"}: "derived-bnmpvejc1s",
		{Namespace: "a", Name: "b"}:                  "derived-o56drg1jup",
	} {
		if got := DerivedServiceName(k); got != want {
			t.Errorf("DerivedServiceName(%v) = %s, want %s", k, got, want)
		}
	}
}
