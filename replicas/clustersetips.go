package replicas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// ClusterSetIPs keeps the clusterset IPs of ClusterSetIP imports in etcd: one
// IP per service and IP family for the whole clusterset, the same at every
// replica, sticky for the import's life and for a hold-down after it.
//
// Keys (under prefix, default "/nave/"):
//
//	clustersetips/services/<family>/<ns>/<name>  JSON ipClaim
//	clustersetips/ips/<ip>                       "<family>/<ns>/<name>" of its holder
//
// A claim is written with both keys in one transaction that requires both to
// be new, so two replicas claiming at once never hand one IP to two services
// nor two IPs to one service: the loser reads the winner's claim. A released
// claim keeps its IP until Collect deletes it after the hold-down; a service
// that comes back before then gets the same IP.
type ClusterSetIPs struct {
	etcd   *clientv3.Client
	prefix string
	cidrs  map[registry.IPFamily]netip.Prefix

	// mu guards cache, a copy of every claim this replica has read or made,
	// and taken, their IPs: where to look for a free IP first.
	mu    sync.Mutex
	cache map[claimKey]ipClaim
	taken map[netip.Addr]bool
}

type claimKey struct {
	family  registry.IPFamily
	service registry.ServiceKey
}

func (k claimKey) String() string { return string(k.family) + "/" + k.service.String() }

// ipClaim is one stored claim.
type ipClaim struct {
	IP netip.Addr `json:"ip"`
	// Released is when the last export of the service went; zero while it is imported.
	Released time.Time `json:"released,omitzero"`
}

// ErrNoCIDR says the clusterset has no range for an IP family.
var ErrNoCIDR = errors.New("replicas: no clusterset CIDR for the IP family")

// NewClusterSetIPs returns the store for the given ranges (at most one per IP family).
func NewClusterSetIPs(etcd *clientv3.Client, prefix string, cidrs []netip.Prefix) (*ClusterSetIPs, error) {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	s := &ClusterSetIPs{etcd: etcd, prefix: prefix + "clustersetips/", cidrs: map[registry.IPFamily]netip.Prefix{},
		cache: map[claimKey]ipClaim{}, taken: map[netip.Addr]bool{}}
	for _, c := range cidrs {
		f := familyOf(c.Addr())
		if _, dup := s.cidrs[f]; dup {
			return nil, fmt.Errorf("two clusterset CIDRs of family %s: %s and %s", f, s.cidrs[f], c)
		}
		if c.Bits() < 0 || c.Masked() != c {
			return nil, fmt.Errorf("clusterset CIDR %s is not a network prefix", c)
		}
		s.cidrs[f] = c
	}
	return s, nil
}

func familyOf(a netip.Addr) registry.IPFamily {
	if a.Is4() {
		return registry.IPv4
	}
	return registry.IPv6
}

func (s *ClusterSetIPs) serviceKey(k claimKey) string { return s.prefix + "services/" + k.String() }
func (s *ClusterSetIPs) ipKey(ip netip.Addr) string   { return s.prefix + "ips/" + ip.String() }

// Load reads every claim into the cache; a replica calls it at start so
// that the IPs of known services need no etcd round trip.
func (s *ClusterSetIPs) Load(ctx context.Context) error {
	resp, err := s.etcd.Get(ctx, s.prefix+"services/", clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("load clusterset IPs: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, kv := range resp.Kvs {
		k, c, err := s.decode(kv)
		if err != nil {
			return err
		}
		s.remember(k, c)
	}
	return nil
}

func (s *ClusterSetIPs) decode(kv *mvccpb.KeyValue) (claimKey, ipClaim, error) {
	var k claimKey
	var c ipClaim
	rest := strings.TrimPrefix(string(kv.Key), s.prefix+"services/")
	family, svc, ok := strings.Cut(rest, "/")
	key, err := registry.ParseServiceKey(svc)
	if !ok || err != nil {
		return k, c, fmt.Errorf("clusterset IP claim %q is corrupt", kv.Key)
	}
	k = claimKey{family: registry.IPFamily(family), service: key}
	if err := json.Unmarshal(kv.Value, &c); err != nil || !c.IP.IsValid() {
		return k, c, fmt.Errorf("clusterset IP claim %q is corrupt: %v", kv.Key, err)
	}
	return k, c, nil
}

// remember caches a claim; s.mu is held.
func (s *ClusterSetIPs) remember(k claimKey, c ipClaim) {
	if old, ok := s.cache[k]; ok && old.IP != c.IP {
		delete(s.taken, old.IP)
	}
	s.cache[k] = c
	s.taken[c.IP] = true
}

// forget drops a claim from the cache; s.mu is held.
func (s *ClusterSetIPs) forget(k claimKey) {
	if c, ok := s.cache[k]; ok {
		delete(s.taken, c.IP)
		delete(s.cache, k)
	}
}

// Ranged returns the families of fams that have a range, in order.
func (s *ClusterSetIPs) Ranged(fams []registry.IPFamily) []registry.IPFamily {
	var out []registry.IPFamily
	for _, f := range fams {
		if _, ok := s.cidrs[f]; ok {
			out = append(out, f)
		}
	}
	return out
}

// Claim returns the service's clusterset IP of each family, in the order
// given, claiming those it has none of. A family without a range is left
// out. A released claim is taken back (its IP stays the service's).
func (s *ClusterSetIPs) Claim(ctx context.Context, key registry.ServiceKey, families []registry.IPFamily) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range s.Ranged(families) {
		ip, err := s.claim(ctx, claimKey{family: f, service: key})
		if err != nil {
			return nil, err
		}
		out = append(out, ip)
	}
	return out, nil
}

// claim reads the claim from etcd every time (another replica may have
// released it since); callers keep the IPs of the services they import.
func (s *ClusterSetIPs) claim(ctx context.Context, k claimKey) (netip.Addr, error) {
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return netip.Addr{}, ctx.Err()
		}
		// What etcd holds wins over the cache: another replica may have claimed it.
		resp, err := s.etcd.Get(ctx, s.serviceKey(k))
		if err != nil {
			return netip.Addr{}, fmt.Errorf("read clusterset IP of %s: %w", k, err)
		}
		if len(resp.Kvs) == 1 {
			_, held, err := s.decode(resp.Kvs[0])
			if err != nil {
				return netip.Addr{}, err
			}
			if !held.Released.IsZero() {
				held.Released = time.Time{}
				if err := s.put(ctx, k, held, resp.Kvs[0].ModRevision); err != nil {
					continue // changed meanwhile: look again
				}
			}
			s.mu.Lock()
			s.remember(k, held)
			s.mu.Unlock()
			return held.IP, nil
		}
		s.mu.Lock()
		ip, err := imports.Allocate(s.cidrs[k.family], k.service, func(a netip.Addr) bool { return s.taken[a] })
		s.mu.Unlock()
		if err != nil {
			return netip.Addr{}, fmt.Errorf("clusterset IP of %s: %w", k, err)
		}
		won, err := s.create(ctx, k, ip)
		if err != nil {
			return netip.Addr{}, err
		}
		if won {
			return ip, nil
		}
		// Lost a race for the IP or the service: learn who holds the IP, then look again.
		if err := s.learnIP(ctx, ip); err != nil {
			return netip.Addr{}, err
		}
		if attempt > 1000 {
			return netip.Addr{}, fmt.Errorf("clusterset IP of %s: no free IP after %d attempts", k, attempt)
		}
	}
}

// create claims ip for k if neither is claimed yet.
func (s *ClusterSetIPs) create(ctx context.Context, k claimKey, ip netip.Addr) (bool, error) {
	b, err := json.Marshal(ipClaim{IP: ip})
	if err != nil {
		return false, err
	}
	txn, err := s.etcd.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(s.serviceKey(k)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(s.ipKey(ip)), "=", 0),
	).Then(
		clientv3.OpPut(s.serviceKey(k), string(b)),
		clientv3.OpPut(s.ipKey(ip), k.String()),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("claim clusterset IP %s for %s: %w", ip, k, err)
	}
	if txn.Succeeded {
		s.mu.Lock()
		s.remember(k, ipClaim{IP: ip})
		s.mu.Unlock()
	}
	return txn.Succeeded, nil
}

// learnIP marks ip taken when etcd says it is.
func (s *ClusterSetIPs) learnIP(ctx context.Context, ip netip.Addr) error {
	resp, err := s.etcd.Get(ctx, s.ipKey(ip))
	if err != nil {
		return fmt.Errorf("read clusterset IP %s: %w", ip, err)
	}
	if len(resp.Kvs) == 1 {
		s.mu.Lock()
		s.taken[ip] = true
		s.mu.Unlock()
	}
	return nil
}

// put rewrites a claim if it has not changed since modRevision.
func (s *ClusterSetIPs) put(ctx context.Context, k claimKey, c ipClaim, modRevision int64) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	txn, err := s.etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.serviceKey(k)), "=", modRevision)).
		Then(clientv3.OpPut(s.serviceKey(k), string(b))).Commit()
	if err != nil {
		return fmt.Errorf("write clusterset IP claim of %s: %w", k, err)
	}
	if !txn.Succeeded {
		return fmt.Errorf("clusterset IP claim of %s changed meanwhile", k)
	}
	return nil
}

// Release marks the service's claims released at now, but those of the
// families in keep (a service that still holds an IP of one family and no
// longer of another) (its last export is
// gone); the IPs stay reserved for it until Collect runs after the hold-down.
func (s *ClusterSetIPs) Release(ctx context.Context, key registry.ServiceKey, now time.Time, keep ...registry.IPFamily) error {
	for f := range s.cidrs {
		if slices.Contains(keep, f) {
			continue
		}
		k := claimKey{family: f, service: key}
		resp, err := s.etcd.Get(ctx, s.serviceKey(k))
		if err != nil {
			return fmt.Errorf("read clusterset IP of %s: %w", k, err)
		}
		if len(resp.Kvs) != 1 {
			continue
		}
		_, c, err := s.decode(resp.Kvs[0])
		if err != nil {
			return err
		}
		if !c.Released.IsZero() {
			continue
		}
		c.Released = now.UTC()
		if err := s.put(ctx, k, c, resp.Kvs[0].ModRevision); err != nil {
			return err
		}
		s.mu.Lock()
		s.remember(k, c)
		s.mu.Unlock()
	}
	return nil
}

// Collect deletes the claims released longer than holdDown before now, and
// returns how many it deleted. Only the leader calls it.
func (s *ClusterSetIPs) Collect(ctx context.Context, now time.Time, holdDown time.Duration) (int, error) {
	resp, err := s.etcd.Get(ctx, s.prefix+"services/", clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("list clusterset IPs: %w", err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		k, c, err := s.decode(kv)
		if err != nil {
			return n, err
		}
		if c.Released.IsZero() || now.Sub(c.Released) < holdDown {
			continue
		}
		txn, err := s.etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(string(kv.Key)), clientv3.OpDelete(s.ipKey(c.IP))).Commit()
		if err != nil {
			return n, fmt.Errorf("delete clusterset IP claim of %s: %w", k, err)
		}
		if txn.Succeeded {
			n++
			s.mu.Lock()
			s.forget(k)
			s.mu.Unlock()
		}
	}
	return n, nil
}
