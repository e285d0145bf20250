package main

import (
	"fmt"
	"math/bits"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// The ledger is the bookkeeping that lets a client tell which change it sees.
//
// Every (cluster, service) pair has a linear history of states: generation 0
// is the initial state, and every change the churn makes is the next
// generation. A state is identified by its fingerprint: a hash of the set of
// healthy endpoint addresses the cluster publishes for the service, which is
// exactly what a client can compute from a ClusterLoadAssignment (addresses
// encode their cluster, see addrLayout). The churn never repeats a
// fingerprint within a history, so a fingerprint names one generation.
//
// A client that sees generation g of (c, s) while it held generation h < g
// has converged on every change h+1..g at once (the hub and the spoke may
// coalesce changes; a later state includes the earlier changes).

// addrLayout places every endpoint address in 10.0.0.0/8: the high bits of
// the 24 free ones name the cluster, the rest count addresses within it.
type addrLayout struct {
	perCluster uint // address bits per cluster
}

func newAddrLayout(clusters int) addrLayout {
	return addrLayout{perCluster: 24 - uint(bits.Len(uint(max(clusters, 1)-1)))}
}

// capacity is how many addresses each cluster can hand out.
func (l addrLayout) capacity() uint32 { return 1<<l.perCluster - 1 }

// addr is the n-th address (n >= 1) of cluster c.
func (l addrLayout) addr(c int, n uint32) netip.Addr {
	v := 10<<24 | uint32(c)<<l.perCluster | n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// cluster returns the cluster index an IPv4 address (as a uint32) belongs to.
func (l addrLayout) cluster(ip uint32) (int, bool) {
	if ip>>24 != 10 {
		return 0, false
	}
	return int(ip & 0xFFFFFF >> l.perCluster), true
}

func ipv4(a netip.Addr) (uint32, bool) {
	if !a.Is4() && !a.Is4In6() {
		return 0, false
	}
	b := a.Unmap().As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]), true
}

// endpointHash mixes one healthy address:port into a fingerprint. A set's
// fingerprint is the sum of its members' hashes: order does not matter, and
// an empty set is 0.
func endpointHash(ip uint32, port uint32) uint64 {
	x := uint64(ip)<<16 ^ uint64(port)
	// splitmix64 finalizer.
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// changeKind says what a change did.
type changeKind uint8

const (
	kindInitial   changeKind = iota
	kindFlip                 // an endpoint's readiness flipped
	kindScaleUp              // an endpoint was added
	kindScaleDown            // an endpoint was removed
	kindReplace              // an endpoint's address changed (when no other change made a new state)
	kindRestart              // a rolling restart replaced one endpoint's address
	kindRoute                // a route's weights moved (the route ledger's only kind of change; see routes.go)
)

var kindNames = [...]string{"initial", "flip", "scale-up", "scale-down", "replace", "restart", "route"}

func (k changeKind) String() string { return kindNames[k] }

// history is one (cluster, service) pair's states, by generation.
type history struct {
	mu     sync.Mutex
	byFP   map[uint64]int32
	fps    []uint64
	handed []time.Duration // since the ledger's start
	kinds  []changeKind
}

// ledger holds every (cluster, service) history. The churn goroutine
// records; client goroutines look up.
type ledger struct {
	start              time.Time
	clusters, services int
	hist               []history // index c*services + s
	// subscribers counts, per service, the clients subscribed to it: every
	// change of the service is that many (client, change) pairs.
	subscribers []int32
	// pending counts (client, change) pairs recorded and not yet seen.
	pending atomic.Int64
	// changes counts changes recorded after generation 0.
	changes atomic.Int64
}

func newLedger(start time.Time, clusters, services int) *ledger {
	l := &ledger{start: start, clusters: clusters, services: services,
		hist: make([]history, clusters*services), subscribers: make([]int32, services)}
	for i := range l.hist {
		l.hist[i].byFP = map[uint64]int32{}
	}
	return l
}

func (l *ledger) at(c, s int) *history { return &l.hist[c*l.services+s] }

// since is how long after the ledger's start t is.
func (l *ledger) since(t time.Time) time.Duration { return t.Sub(l.start) }

// seen reports whether fp is already in the history of (c, s).
func (l *ledger) seen(c, s int, fp uint64) bool {
	h := l.at(c, s)
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.byFP[fp]
	return ok
}

// record appends the next state of (c, s), handed over at t, and returns its
// generation. A fingerprint already in the history is an error: the churn
// must never produce it.
func (l *ledger) record(c, s int, fp uint64, kind changeKind, t time.Time) (int32, error) {
	h := l.at(c, s)
	h.mu.Lock()
	defer h.mu.Unlock()
	if g, ok := h.byFP[fp]; ok {
		return 0, fmt.Errorf("cluster %d service %d: state %x repeats generation %d", c, s, fp, g)
	}
	g := int32(len(h.fps))
	h.byFP[fp] = g
	h.fps = append(h.fps, fp)
	h.handed = append(h.handed, l.since(t))
	h.kinds = append(h.kinds, kind)
	if g > 0 {
		l.changes.Add(1)
		l.pending.Add(int64(l.subscribers[s]))
	}
	return g, nil
}

// latest returns the fingerprint of the newest state of (c, s).
func (l *ledger) latest(c, s int) uint64 {
	h := l.at(c, s)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.fps) == 0 {
		return 0
	}
	return h.fps[len(h.fps)-1]
}

// observation is what a client learns from seeing fingerprint fp of (c, s).
type observation uint8

const (
	obsSame    observation = iota // the generation it already held
	obsNewer                      // a newer generation: converged on one or more changes
	obsOlder                      // an older generation than it held: served stale data
	obsUnknown                    // no generation has this state (a partial or foreign view)
)

// converged is one (client, change) pair: when the change was handed over,
// and how long after that the client first held it (or a later state).
type converged struct {
	handed  time.Duration // since the ledger's start
	latency time.Duration
	kind    changeKind
}

// observe advances a client holding generation *held of (c, s) that sees
// fingerprint fp at now, appending a converged pair for every change it
// thereby caught up with.
func (l *ledger) observe(c, s int, fp uint64, held *int32, now time.Time, out []converged) ([]converged, observation) {
	h := l.at(c, s)
	h.mu.Lock()
	g, ok := h.byFP[fp]
	if !ok {
		h.mu.Unlock()
		return out, obsUnknown
	}
	if g <= *held {
		h.mu.Unlock()
		if g < *held {
			return out, obsOlder
		}
		return out, obsSame
	}
	at := l.since(now)
	for k := *held + 1; k <= g; k++ {
		out = append(out, converged{handed: h.handed[k], latency: at - h.handed[k], kind: h.kinds[k]})
	}
	h.mu.Unlock()
	l.pending.Add(-int64(g - *held))
	*held = g
	return out, obsNewer
}
