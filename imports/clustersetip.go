package imports

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"net/netip"

	"github.com/navemesh/nave/registry"
)

// Errors of clusterset IP allocation.
var (
	// ErrInvalidRange: the CIDR is not a valid IPv4 or IPv6 prefix, or has no usable address.
	ErrInvalidRange = errors.New("imports: invalid clusterset IP range")
	// ErrRangeFull: no usable address of the range is free.
	ErrRangeFull = errors.New("imports: clusterset IP range is full")
)

// maxProbes bounds Allocate's search. A range with at most this many usable
// addresses (an IPv4 /12, Kubernetes' default service range, has 2^20-2) is
// searched entirely; a larger one (an IPv6 /64) is never enumerated, and
// 2^20 taken addresses in a row there means something else is wrong.
const maxProbes = 1 << 20

// ipRange is the usable addresses of a CIDR: count addresses from first.
type ipRange struct {
	network netip.Addr // the prefix's first address
	first   *big.Int   // offset of the first usable address from network
	count   *big.Int   // number of usable addresses, > 0
	last    netip.Addr // the last usable address
}

// newRange returns the usable addresses of cidr: every address but the
// network address (the all-zeros host, which is also IPv6's subnet-router
// anycast) and, for IPv4, the broadcast address (all-ones host). So an IPv4
// /31 or /32 and an IPv6 /128 have none. IPv4-mapped IPv6 prefixes are
// refused: a range is one family.
func newRange(cidr netip.Prefix) (ipRange, error) {
	if !cidr.IsValid() || cidr.Addr().Is4In6() || cidr.Addr().Zone() != "" {
		return ipRange{}, fmt.Errorf("%w: %v", ErrInvalidRange, cidr)
	}
	p := cidr.Masked()
	hostBits := p.Addr().BitLen() - p.Bits()
	size := new(big.Int).Lsh(big.NewInt(1), uint(hostBits))
	reserved := int64(1) // the network address
	if p.Addr().Is4() {
		reserved = 2 // and the broadcast address
	}
	count := size.Sub(size, big.NewInt(reserved))
	if count.Sign() <= 0 {
		return ipRange{}, fmt.Errorf("%w: %v has no usable address", ErrInvalidRange, cidr)
	}
	r := ipRange{network: p.Addr(), first: big.NewInt(1), count: count}
	r.last = r.at(new(big.Int).Sub(count, big.NewInt(1)))
	return r, nil
}

// at returns the i-th usable address, 0 <= i < count.
func (r ipRange) at(i *big.Int) netip.Addr {
	n := new(big.Int).SetBytes(r.network.AsSlice())
	n.Add(n, r.first).Add(n, i)
	b := make([]byte, r.network.BitLen()/8)
	n.FillBytes(b)
	a, _ := netip.AddrFromSlice(b)
	return a
}

// next is the usable address after a, wrapping from the last to the first.
func (r ipRange) next(a netip.Addr) netip.Addr {
	if a == r.last {
		return r.network.Next()
	}
	return a.Next()
}

// slot is the preferred slot of key: the first 128 bits of
// sha256("namespace/name") as a big-endian number.
func slot(key registry.ServiceKey) *big.Int {
	sum := sha256.Sum256([]byte(key.String()))
	return new(big.Int).SetBytes(sum[:16])
}

// PreferredIP is the clusterset IP of cidr that key prefers at the given
// attempt (0 first). Attempt a is usable address number (h + a) mod n,
// where h is the first 128 bits of sha256("namespace/name") and n the
// number of usable addresses (see Allocate): linear probing, so attempts
// 0 to n-1 visit every usable address once, and a range that is not full
// always yields a free one. Every hub replica and every restart derives the
// same preference, so an import usually gets the same IP again even if its
// allocation was lost; the caller must still persist what it allocated
// (KEP-1645: the IP stays for the import's life). It returns the zero Addr
// when cidr has no usable address.
func PreferredIP(cidr netip.Prefix, key registry.ServiceKey, attempt int) netip.Addr {
	r, err := newRange(cidr)
	if err != nil {
		return netip.Addr{}
	}
	i := slot(key)
	i.Add(i, big.NewInt(int64(attempt)))
	return r.at(i.Mod(i, r.count))
}

// Allocate returns the first address PreferredIP proposes for key, attempt
// after attempt, that taken says is free. The usable addresses of cidr are
// all but the network address and, for IPv4, the broadcast address. It
// returns ErrRangeFull when every usable address is taken (for a range of
// more than 2^20 usable addresses, when 2^20 in a row are), and
// ErrInvalidRange when cidr has none. Allocate supports IPv4 and IPv6 and
// never enumerates a range: it only walks from the preferred slot.
func Allocate(cidr netip.Prefix, key registry.ServiceKey, taken func(netip.Addr) bool) (netip.Addr, error) {
	r, err := newRange(cidr)
	if err != nil {
		return netip.Addr{}, err
	}
	probes := int64(maxProbes)
	if r.count.IsInt64() && r.count.Int64() < probes {
		probes = r.count.Int64()
	}
	i := slot(key)
	a := r.at(i.Mod(i, r.count))
	for range probes {
		if !taken(a) {
			return a, nil
		}
		a = r.next(a)
	}
	return netip.Addr{}, fmt.Errorf("%w: %v has no free address for %s in %d candidates", ErrRangeFull, cidr, key, probes)
}
