package replicas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/navemesh/nave/internal/backoff"
	"github.com/navemesh/nave/registry"
)

// ErrMetaTooLarge marks member metadata that does not fit in a memberlist node's metadata.
var ErrMetaTooLarge = errors.New("replicas: member metadata over memberlist's limit")

// membershipLabel is sent with every gossip packet and stream; memberlist
// drops traffic with another label. Other systems gossip with memberlist on
// the same default port (7946: MetalLB, Loki, Docker Swarm), and a reconnect
// to an address that once was a replica must never merge a hub with them.
const membershipLabel = "nave-hub"

// reconnectFor is how long a replica that failed or left is still redialled
// (as Serf's reconnect_timeout): memberlist itself forgets a dead node after
// GossipToTheDeadTime and never tries it again, so without this a network
// partition would never heal.
const reconnectFor = 24 * time.Hour

// MemberMeta is what a replica tells its peers about itself: the host:port
// addresses of its servers. It travels as memberlist node metadata, which is
// limited to memberlist.MetaMaxSize (512) bytes in its compact encoding.
type MemberMeta struct {
	Federation  string // spoke-facing federation gRPC
	XDS         string // xDS server
	Admin       string // admin HTTP
	Replication string // hub-to-hub replication gRPC
}

// metaWire is the compact encoding of MemberMeta.
type metaWire struct {
	Federation  string `json:"f,omitempty"`
	XDS         string `json:"x,omitempty"`
	Admin       string `json:"a,omitempty"`
	Replication string `json:"r,omitempty"`
}

// ClusterSummary is a replica's compact view of one cluster. Replicas
// exchange them by push/pull state sync (node metadata is too small for
// them), so any replica can tell whether the replicas have converged.
type ClusterSummary struct {
	Stamp  Stamp  `json:"stamp"`
	Digest string `json:"digest"` // short hex prefix of the cluster's registry.Hash
	Home   bool   `json:"home"`   // the cluster's spoke is connected to this replica
}

// summariesWire is the compact encoding of a replica's summaries. It names
// the replica because a push/pull does not tell the receiver who sent it, and
// orders its encodings: a push/pull encoded before a change may arrive after
// the push of the change, and must not undo it.
type summariesWire struct {
	Node     string                                `json:"n"`
	Boot     uint64                                `json:"b"` // random per process: a restarted replica starts over
	Seq      uint64                                `json:"s"` // increases with every encoding within a boot
	Clusters map[registry.ClusterID]summaryWireRow `json:"c,omitempty"`
}

type summaryWireRow struct {
	Epoch   uint64 `json:"e,omitempty"`
	Version uint64 `json:"v,omitempty"`
	Digest  string `json:"d,omitempty"`
	Home    bool   `json:"h,omitempty"`
}

// msgSummaries tags a user message carrying summariesWire, sent when the
// local summaries change (UpdateSummaries) instead of waiting for a push/pull.
const msgSummaries byte = 's'

// MembershipConfig configures a replica's membership.
type MembershipConfig struct {
	// Name is the unique replica ID (the memberlist node name).
	Name string
	// BindAddr is the host:port gossip listens on, TCP and UDP on the same
	// port, e.g. ":7946". Port 0 picks a free port for both.
	BindAddr string
	// AdvertiseAddr is the host:port peers should use; empty means the bound
	// address (or, bound to every interface, a private IP of this host).
	// A host name is resolved once, at start. A missing or zero port means
	// the bound port.
	AdvertiseAddr string
	// Join lists seeds: IP:port or a DNS name:port (a headless Service
	// resolves to every replica); without a port, the bound port. Seeds are
	// tried until one answers, and then again whenever one of their
	// addresses is not a member, so replicas that started apart meet.
	Join []string
	// Meta is what this replica tells its peers about itself.
	Meta MemberMeta
	// Summaries returns this replica's view of its clusters. It is called from
	// gossip goroutines, possibly concurrently, and must not block. Nil means none.
	Summaries func() map[registry.ClusterID]ClusterSummary
	// SecretKey, if set, encrypts gossip (AES, 16, 24 or 32 bytes). Every replica needs the same key.
	SecretKey []byte
	// Fast shortens every interval to tens or hundreds of milliseconds, so
	// that in tests failure detection and state sync take well under 2s.
	Fast bool
}

// Member is one live replica.
type Member struct {
	Name string
	Addr string // gossip host:port
	Meta MemberMeta
	// Summaries are the replica's cluster summaries: for a peer, from the
	// last state sync with it (nil if none yet); for this replica, current.
	Summaries map[registry.ClusterID]ClusterSummary
	Self      bool
}

// membershipTiming holds the intervals of one mode (production or Fast).
type membershipTiming struct {
	reconnect   time.Duration // between attempts to redial seeds and lost members
	joinBackoff time.Duration // the first retry's ceiling while alone (full jitter); doubles up to reconnect
	pushGap     time.Duration // least time between two pushes of changed summaries
	leave       time.Duration // how long to wait for the leave to be gossiped
}

// Membership is this replica's place in the gossip group of hub replicas.
type Membership struct {
	name      string
	log       *slog.Logger
	list      *memberlist.Memberlist
	summaries func() map[registry.ClusterID]ClusterSummary
	meta      []byte   // encoded Meta, fixed at start
	boot      uint64   // random, identifies this process in summariesWire
	seeds     []string // host:port, port filled in
	timing    membershipTiming

	// encodeMu makes reading the local summaries and numbering them one step,
	// so a larger seq always carries summaries read later.
	encodeMu sync.Mutex
	seq      uint64

	changes chan struct{} // buffer 1, never closed
	pushes  chan struct{} // buffer 1: local summaries changed
	done    chan struct{} // closed when gossip has stopped

	// membersMu guards members and gone. The event delegate writes them while
	// memberlist holds its own node lock, so nothing may call into memberlist
	// with membersMu held.
	membersMu sync.Mutex
	members   map[string]memberState // live replicas by name, self included
	gone      map[string]goneMember  // replicas that failed or left, by name, to redial

	skipLeave atomic.Bool // tests: stop as if the process died, without leaving
}

// memberState is a live replica and the order of the summaries held for it.
type memberState struct {
	Member
	node      memberlist.Node // our copy of its name and address, to send to
	boot, seq uint64          // of the summaries held
}

// goneMember is a replica that failed or left: memberlist cannot tell which.
type goneMember struct {
	addr  string
	since time.Time
}

// StartMembership joins the gossip group of hub replicas. It returns once
// gossip listens, without waiting for a seed to answer: the first replica
// has no one to join. Membership runs until ctx ends, then leaves gracefully
// (waiting briefly for the leave to be gossiped) and shuts down; Done closes
// when every goroutine has ended.
func StartMembership(ctx context.Context, cfg MembershipConfig, log *slog.Logger) (*Membership, error) {
	log = log.With("component", "membership")
	if cfg.Name == "" {
		return nil, errors.New("membership: a replica name is required")
	}
	bindHost, bindPort, err := splitHostPort(cfg.BindAddr, "bind address")
	if err != nil {
		return nil, err
	}
	if bindHost == "" {
		bindHost = "0.0.0.0"
	} else if net.ParseIP(bindHost) == nil {
		return nil, fmt.Errorf("membership: bind address %q: the host must be an IP", cfg.BindAddr)
	}
	var advHost string
	var advPort int
	if cfg.AdvertiseAddr != "" {
		if advHost, advPort, err = splitHostPort(cfg.AdvertiseAddr, "advertise address"); err != nil {
			return nil, err
		}
		if advHost, err = advertiseIP(ctx, advHost); err != nil {
			return nil, fmt.Errorf("membership: advertise address %q: %w", cfg.AdvertiseAddr, err)
		}
	}
	for _, s := range cfg.Join {
		if _, err := seedAddr(s, 1); err != nil { // the bound port is not known yet
			return nil, err
		}
	}
	meta, err := json.Marshal(metaWire(cfg.Meta))
	if err != nil {
		return nil, fmt.Errorf("membership: encode metadata: %w", err)
	}
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes encoded, at most %d fit", ErrMetaTooLarge, len(meta), memberlist.MetaMaxSize)
	}

	m := &Membership{
		name:      cfg.Name,
		log:       log,
		summaries: cfg.Summaries,
		meta:      meta,
		changes:   make(chan struct{}, 1),
		pushes:    make(chan struct{}, 1),
		done:      make(chan struct{}),
		boot:      rand.Uint64(),
		members:   map[string]memberState{},
		gone:      map[string]goneMember{},
	}

	conf := memberlist.DefaultLANConfig()
	conf.PushPullInterval = 15 * time.Second // anti-entropy for summaries too; a few replicas make it cheap
	conf.DeadNodeReclaimTime = 10 * time.Second
	m.timing = membershipTiming{reconnect: 10 * time.Second, joinBackoff: 500 * time.Millisecond, pushGap: time.Second, leave: 2 * time.Second}
	if cfg.Fast {
		conf.ProbeInterval = 100 * time.Millisecond
		conf.ProbeTimeout = 50 * time.Millisecond
		conf.SuspicionMult = 3 // suspect for 300ms..600ms before declaring dead
		conf.SuspicionMaxTimeoutMult = 2
		conf.GossipInterval = 20 * time.Millisecond
		conf.PushPullInterval = 300 * time.Millisecond
		conf.GossipToTheDeadTime = time.Second
		conf.TCPTimeout = time.Second
		conf.DeadNodeReclaimTime = time.Second
		m.timing = membershipTiming{reconnect: 200 * time.Millisecond, joinBackoff: 50 * time.Millisecond, pushGap: 50 * time.Millisecond, leave: 500 * time.Millisecond}
	}
	conf.Name = cfg.Name
	conf.Label = membershipLabel
	conf.BindAddr, conf.BindPort = bindHost, bindPort
	conf.AdvertiseAddr, conf.AdvertisePort = advHost, advPort
	if advPort == 0 {
		conf.AdvertisePort = bindPort // memberlist replaces 0 with the port it bound
	}
	conf.SecretKey = cfg.SecretKey
	conf.Delegate = gossipDelegate{m}
	conf.Events = eventDelegate{m}
	conf.Logger = newMemberlistLogger(log)

	list, err := memberlist.Create(conf)
	if err != nil {
		return nil, fmt.Errorf("membership: start memberlist on %s: %w", cfg.BindAddr, err)
	}
	m.list = list
	for _, s := range cfg.Join {
		// conf.BindPort is the bound port now, even if 0 was asked for.
		seed, _ := seedAddr(s, conf.BindPort) // checked above
		m.seeds = append(m.seeds, seed)
	}
	self := list.LocalNode()
	log.Info("gossip started", "name", cfg.Name, "addr", self.Address(), "seeds", m.seeds, "encrypted", len(cfg.SecretKey) > 0)

	go m.run(ctx)
	return m, nil
}

// Members returns the live replicas, this one included, sorted by name.
func (m *Membership) Members() []Member {
	var local map[registry.ClusterID]ClusterSummary
	if m.summaries != nil {
		local = maps.Clone(m.summaries())
	}
	m.membersMu.Lock()
	out := make([]Member, 0, len(m.members))
	for _, st := range m.members {
		mem := st.Member
		if mem.Self {
			mem.Summaries = local
		} else {
			mem.Summaries = maps.Clone(mem.Summaries)
		}
		out = append(out, mem)
	}
	m.membersMu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Changes signals, coalesced, that Members may have changed: a replica
// joined, left, failed or changed its metadata, or a peer's summaries
// changed. The channel is never closed.
func (m *Membership) Changes() <-chan struct{} { return m.changes }

// UpdateSummaries hints that this replica's summaries changed. They are sent
// to every peer soon after (at most one push per short interval), and
// anyway with every periodic push/pull. It never blocks.
func (m *Membership) UpdateSummaries() {
	select {
	case m.pushes <- struct{}{}:
	default:
	}
}

// Done is closed when membership has left the group, shut down, and all
// its goroutines have ended.
func (m *Membership) Done() <-chan struct{} { return m.done }

func (m *Membership) signal() {
	select {
	case m.changes <- struct{}{}:
	default:
	}
}

// run owns the lifetime of gossip: it starts the loops, and when ctx ends
// leaves, waits for the loops and shuts memberlist down.
func (m *Membership) run(ctx context.Context) {
	defer close(m.done)
	var loops sync.WaitGroup
	loops.Go(func() { m.guard("reconnect", func() { m.reconnect(ctx) }) })
	loops.Go(func() { m.guard("push summaries", func() { m.pushSummaries(ctx) }) })
	<-ctx.Done()
	m.guard("leave", func() {
		if m.skipLeave.Load() {
			return
		}
		if err := m.list.Leave(m.timing.leave); err != nil {
			m.log.Warn("leave not confirmed by any peer; shutting down anyway", "err", err)
		}
	})
	// A join or push in flight ends within memberlist's TCP timeout.
	loops.Wait()
	m.guard("shutdown", func() {
		if err := m.list.Shutdown(); err != nil {
			m.log.Warn("shut down gossip", "err", err)
		}
	})
	m.log.Info("gossip stopped")
}

// guard runs fn, logging instead of crashing on a panic.
func (m *Membership) guard(what string, fn func()) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("panic", "in", what, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	fn()
}

// reconnect dials, until ctx ends, the seed addresses that are not members
// and the replicas that failed or left in the last reconnectFor. Memberlist
// alone never dials a dead node again: this is what heals a partition, and
// what brings together replicas that started before they could see each
// other. While this replica is alone it retries with a backoff, otherwise
// every timing.reconnect.
func (m *Membership) reconnect(ctx context.Context) {
	// While alone, retries back off from joinBackoff up to reconnect (full
	// jitter, so replicas do not dial in lockstep); with peers, every
	// reconnect (a fifth of it jittered).
	retry := backoff.New(backoff.Config{Min: m.timing.joinBackoff, Max: m.timing.reconnect})
	wait := time.Duration(0)
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		before := m.peerCount()
		tried, joined := m.rejoin(ctx)
		after := m.peerCount()
		alone := after == 0
		if after > before {
			m.log.Info("joined peers", "peers", after, "before", before)
		}
		switch {
		case alone && tried > 0 && joined == 0:
			if !warned {
				m.log.Warn("no seed or former member answered; retrying", "seeds", m.seeds)
				warned = true
			}
		case !alone:
			warned = false
		}
		if alone && len(m.seeds) > 0 {
			wait = retry.Next()
		} else {
			retry.Reset()
			wait = m.timing.reconnect + rand.N(m.timing.reconnect/5+1)
		}
	}
}

// rejoin dials every candidate address once, concurrently, and returns how
// many it tried and how many answered.
func (m *Membership) rejoin(ctx context.Context) (tried, joined int) {
	candidates := m.candidates(ctx)
	var ok atomic.Int32
	var wg sync.WaitGroup
	for _, addr := range candidates {
		if ctx.Err() != nil {
			break
		}
		tried++
		wg.Go(func() {
			if _, err := m.list.Join([]string{addr}); err != nil {
				m.log.Debug("join failed", "addr", addr, "err", err)
				return
			}
			ok.Add(1)
			m.log.Debug("joined", "addr", addr)
		})
	}
	wg.Wait()
	return tried, int(ok.Load())
}

// candidates returns the addresses to dial: those the seeds resolve to and
// those of replicas that went away, minus live members' addresses. A seed
// that is no member's address (a load-balanced Service) is dialled every
// time, a cheap push/pull that also heals partitions.
func (m *Membership) candidates(ctx context.Context) []string {
	var addrs []string
	for _, seed := range m.seeds {
		host, port, _ := net.SplitHostPort(seed) // seeds all have a port
		if ip := net.ParseIP(host); ip != nil {
			addrs = append(addrs, net.JoinHostPort(ip.String(), port))
			continue
		}
		lookup, cancel := context.WithTimeout(ctx, 5*time.Second)
		ips, err := net.DefaultResolver.LookupHost(lookup, host)
		cancel()
		if err != nil {
			m.log.Debug("resolve seed", "seed", seed, "err", err)
			continue
		}
		for _, ip := range ips {
			addrs = append(addrs, net.JoinHostPort(ip, port))
		}
	}

	now := time.Now()
	live := map[string]bool{}
	m.membersMu.Lock()
	for _, mem := range m.members {
		live[mem.Addr] = true
	}
	for name, g := range m.gone {
		if now.Sub(g.since) > reconnectFor {
			delete(m.gone, name)
			continue
		}
		addrs = append(addrs, g.addr)
	}
	m.membersMu.Unlock()

	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	return slices.DeleteFunc(addrs, func(a string) bool { return live[a] })
}

func (m *Membership) peerCount() int {
	m.membersMu.Lock()
	defer m.membersMu.Unlock()
	n := 0
	for _, mem := range m.members {
		if !mem.Self {
			n++
		}
	}
	return n
}

// pushSummaries sends the local summaries to every peer when they change,
// coalescing hints so that it pushes at most once per timing.pushGap.
func (m *Membership) pushSummaries(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.pushes:
		}
		msg := append([]byte{msgSummaries}, m.encodeSummaries()...)
		for _, node := range m.peerNodes() {
			if ctx.Err() != nil {
				break
			}
			if err := m.list.SendReliable(&node, msg); err != nil {
				m.log.Debug("push summaries", "to", node.Name, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(m.timing.pushGap):
		}
	}
}

// peerNodes returns copies of the live peers' addresses, taken from the
// event delegate's calls. The nodes memberlist's Members returns are its
// own: it rewrites their address fields under its node lock (aliveNode), so
// they must not be read outside it.
func (m *Membership) peerNodes() []memberlist.Node {
	m.membersMu.Lock()
	defer m.membersMu.Unlock()
	out := make([]memberlist.Node, 0, len(m.members))
	for _, st := range m.members {
		if !st.Self {
			out = append(out, st.node)
		}
	}
	return out
}

func (m *Membership) encodeSummaries() []byte {
	var sums map[registry.ClusterID]ClusterSummary
	m.encodeMu.Lock()
	if m.summaries != nil {
		sums = m.summaries()
	}
	m.seq++
	w := summariesWire{Node: m.name, Boot: m.boot, Seq: m.seq}
	m.encodeMu.Unlock()
	w.Clusters = make(map[registry.ClusterID]summaryWireRow, len(sums))
	for id, s := range sums {
		w.Clusters[id] = summaryWireRow{Epoch: s.Stamp.Epoch, Version: s.Stamp.Version, Digest: s.Digest, Home: s.Home}
	}
	b, err := json.Marshal(w)
	if err != nil {
		panic(fmt.Sprintf("membership: encode summaries: %v", err)) // plain data
	}
	return b
}

// mergeSummaries stores a peer's encoded summaries, if the peer is a live
// member and they are newer than those held.
func (m *Membership) mergeSummaries(buf []byte) {
	var w summariesWire
	if err := json.Unmarshal(buf, &w); err != nil {
		m.log.Warn("undecodable summaries from a peer", "err", err)
		return
	}
	if w.Node == "" || w.Node == m.name {
		return
	}
	sums := make(map[registry.ClusterID]ClusterSummary, len(w.Clusters))
	for id, r := range w.Clusters {
		sums[id] = ClusterSummary{Stamp: Stamp{Epoch: r.Epoch, Version: r.Version}, Digest: r.Digest, Home: r.Home}
	}
	m.membersMu.Lock()
	st, ok := m.members[w.Node]
	newer := ok && (st.Summaries == nil || w.Boot != st.boot || w.Seq > st.seq)
	changed := newer && (st.Summaries == nil || !maps.Equal(st.Summaries, sums))
	if newer {
		st.Summaries, st.boot, st.seq = sums, w.Boot, w.Seq
		m.members[w.Node] = st
	}
	m.membersMu.Unlock()
	if changed {
		m.signal()
	}
}

// gossipDelegate is memberlist's Delegate. Memberlist calls it from its
// network goroutines, concurrently: no method blocks, and none calls back
// into memberlist.
type gossipDelegate struct{ m *Membership }

// NodeMeta returns the metadata encoded at start (checked against the limit then).
func (d gossipDelegate) NodeMeta(limit int) []byte { return d.m.meta }

// NotifyMsg receives summaries pushed by a peer. buf is only valid during the call.
func (d gossipDelegate) NotifyMsg(buf []byte) {
	if len(buf) > 0 && buf[0] == msgSummaries {
		d.m.mergeSummaries(buf[1:])
	}
}

// GetBroadcasts has nothing to send: summaries go by push/pull and by TCP messages.
func (d gossipDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState returns this replica's summaries, named, for a push/pull or a join.
func (d gossipDelegate) LocalState(join bool) []byte { return d.m.encodeSummaries() }

// MergeRemoteState takes a peer's summaries from a push/pull or a join.
// Memberlist has merged the peer's node states just before, so a peer that
// is alive is already a member.
func (d gossipDelegate) MergeRemoteState(buf []byte, join bool) { d.m.mergeSummaries(buf) }

// eventDelegate is memberlist's EventDelegate. Memberlist calls it with its
// node lock held, never concurrently: it only updates the member table and
// signals Changes.
type eventDelegate struct{ m *Membership }

func (d eventDelegate) NotifyJoin(n *memberlist.Node) {
	mem := d.m.member(n)
	d.m.membersMu.Lock()
	d.m.members[n.Name] = memberState{Member: mem, node: nodeAddress(n)}
	delete(d.m.gone, n.Name)
	d.m.membersMu.Unlock()
	d.m.log.Info("member joined", "member", n.Name, "addr", mem.Addr)
	d.m.signal()
}

func (d eventDelegate) NotifyLeave(n *memberlist.Node) {
	addr := n.Address()
	d.m.membersMu.Lock()
	delete(d.m.members, n.Name)
	if n.Name != d.m.name {
		d.m.gone[n.Name] = goneMember{addr: addr, since: time.Now()}
	}
	d.m.membersMu.Unlock()
	d.m.log.Info("member left or failed", "member", n.Name, "addr", addr)
	d.m.signal()
}

func (d eventDelegate) NotifyUpdate(n *memberlist.Node) {
	mem := d.m.member(n)
	d.m.membersMu.Lock()
	st := d.m.members[n.Name]
	mem.Summaries = st.Summaries // metadata changed, the summaries held did not
	st.Member, st.node = mem, nodeAddress(n)
	d.m.members[n.Name] = st
	d.m.membersMu.Unlock()
	d.m.log.Info("member updated", "member", n.Name, "addr", mem.Addr)
	d.m.signal()
}

// nodeAddress copies what SendReliable reads of a node (its name and
// address). Called from the event delegate, under memberlist's node lock.
func nodeAddress(n *memberlist.Node) memberlist.Node {
	return memberlist.Node{Name: n.Name, Addr: slices.Clone(n.Addr), Port: n.Port}
}

// member decodes a memberlist node, without its summaries.
func (m *Membership) member(n *memberlist.Node) Member {
	var w metaWire
	if len(n.Meta) > 0 {
		if err := json.Unmarshal(n.Meta, &w); err != nil {
			m.log.Warn("undecodable metadata", "member", n.Name, "err", err)
		}
	}
	return Member{Name: n.Name, Addr: n.Address(), Meta: MemberMeta(w), Self: n.Name == m.name}
}

// splitHostPort parses host:port, allowing an empty host and a missing port (0).
func splitHostPort(addr, what string) (string, int, error) {
	if !strings.Contains(addr, ":") || net.ParseIP(addr) != nil {
		return addr, 0, nil
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("membership: %s %q: %w", what, addr, err)
	}
	port := 0
	if p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 0 || port > 65535 {
			return "", 0, fmt.Errorf("membership: %s %q: bad port", what, addr)
		}
	}
	return host, port, nil
}

// advertiseIP resolves the advertised host to one IP (memberlist gossips
// IPs), preferring IPv4.
func advertiseIP(ctx context.Context, host string) (string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip.String(), nil
	}
	if host == "" {
		return "", errors.New("no host")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return "", err
	}
	if len(ips) == 0 { // a resolver that answers nothing without an error
		return "", fmt.Errorf("%s resolves to no address", host)
	}
	slices.SortStableFunc(ips, func(a, b net.IP) int {
		if (a.To4() != nil) == (b.To4() != nil) {
			return 0
		}
		if a.To4() != nil {
			return -1
		}
		return 1
	})
	return ips[0].String(), nil
}

// seedAddr checks a seed and gives it port if it has none.
func seedAddr(seed string, port int) (string, error) {
	if ip := net.ParseIP(strings.Trim(seed, "[]")); ip != nil && !strings.Contains(seed, "]:") {
		return net.JoinHostPort(ip.String(), strconv.Itoa(port)), nil
	}
	if !strings.Contains(seed, ":") {
		return net.JoinHostPort(seed, strconv.Itoa(port)), nil
	}
	host, p, err := net.SplitHostPort(seed)
	if err != nil || host == "" {
		return "", fmt.Errorf("membership: seed %q is not host:port", seed)
	}
	if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
		return "", fmt.Errorf("membership: seed %q has a bad port", seed)
	}
	return seed, nil
}

// memberlistLog adapts memberlist's *log.Logger to slog: memberlist writes
// one line per call, as "[LEVEL] memberlist: message".
type memberlistLog struct{ log *slog.Logger }

func newMemberlistLogger(l *slog.Logger) *log.Logger { return log.New(memberlistLog{l}, "", 0) }

func (w memberlistLog) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\r\n")
	level := slog.LevelInfo
	if rest, ok := strings.CutPrefix(line, "["); ok {
		if tag, msg, ok := strings.Cut(rest, "] "); ok {
			level, line = memberlistLevel(tag), msg
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	if level > slog.LevelDebug && strings.Contains(line, "use of closed network connection") {
		level = slog.LevelDebug // a send racing our own shutdown
	}
	w.log.Log(context.Background(), level, line)
	return len(p), nil
}

func memberlistLevel(tag string) slog.Level {
	switch strings.ToUpper(tag) {
	case "TRACE", "DEBUG":
		return slog.LevelDebug
	case "WARN", "WARNING":
		return slog.LevelWarn
	case "ERR", "ERROR":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}
