package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/nettest"
	"github.com/navemesh/nave/registry"
)

// testEtcd is an etcd the hub replicas share, that a test can stop and start again.
type testEtcd struct {
	t          testing.TB
	dir        string
	client     *url.URL
	peer       *url.URL
	mu         sync.Mutex
	e          *embed.Etcd
	clientAddr string
}

func startTestEtcd(t testing.TB, ip string) *testEtcd {
	e := &testEtcd{t: t, dir: t.TempDir()}
	e.clientAddr = onIP(ip, freeAddr(t))
	e.client = &url.URL{Scheme: "http", Host: e.clientAddr}
	e.peer = &url.URL{Scheme: "http", Host: onIP(ip, freeAddr(t))}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *testEtcd) endpoint() string { return e.client.String() }

func (e *testEtcd) start() {
	e.mu.Lock()
	defer e.mu.Unlock()
	cfg := embed.NewConfig()
	cfg.Dir = e.dir
	cfg.Name = "e2e"
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*e.client}, []url.URL{*e.client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*e.peer}, []url.URL{*e.peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(e.dir, "etcd.log")}
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		e.t.Fatalf("start etcd: %v", err)
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.t.Fatal("etcd did not start")
	}
	e.e = srv
}

func (e *testEtcd) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.e != nil {
		e.e.Close()
		e.e = nil
	}
}

// hubReplica is one `nave hub` process of a replica group.
type hubReplica struct {
	id                   string
	fed, xds, admin, gsp string
	args                 []string
	wrap                 []string // the command it runs under (ip netns exec ...)
	proc                 *proc
}

// haGroup is a replica group: hub processes over one etcd, with balancers
// in front of their federation and xDS ports.
type haGroup struct {
	t        testing.TB
	bin      string
	etcd     *testEtcd
	replicas []*hubReplica
	fedLB    *nettest.Proxy // in front of the replicas' federation ports, as a Service would be
	xdsLB    *nettest.Proxy
}

// placement says where replicas run: the IP a replica listens on and the
// command its `nave hub` runs under (ip netns exec ..., or nothing), and
// the IP of etcd and the balancers' side.
type placement struct {
	etcdIP string
	ip     func(i int) string
	wrap   func(i int) []string
}

// onLoopback runs everything on 127.0.0.1.
var onLoopback = placement{etcdIP: "127.0.0.1", ip: func(int) string { return "127.0.0.1" }, wrap: func(int) []string { return nil }}

// onIP moves a loopback address's port to ip (a port free on loopback is free on a fresh test host too).
func onIP(ip, addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return net.JoinHostPort(ip, port)
}

// startHAGroupAt starts n hub replicas where at says; extra flags go to every replica.
func startHAGroupAt(t testing.TB, n int, at placement, extra ...string) *haGroup {
	g := &haGroup{t: t, bin: buildNave(t), etcd: startTestEtcd(t, at.etcdIP)}
	dir := t.TempDir()
	tb, _ := yaml.Marshal(tokens)
	tokensFile := filepath.Join(dir, "tokens.yaml")
	writeFile(t, tokensFile, string(tb))
	peerToken := filepath.Join(dir, "peer.token")
	writeFile(t, peerToken, "peer-token-0123456789abcdef")
	var gossip []string
	for i := range n {
		ip := at.ip(i)
		r := &hubReplica{id: fmt.Sprintf("hub-%d", i), fed: onIP(ip, freeAddr(t)), xds: onIP(ip, freeAddr(t)),
			admin: onIP(ip, freeAddr(t)), gsp: onIP(ip, freeAddr(t)), wrap: at.wrap(i)}
		gossip = append(gossip, r.gsp)
		g.replicas = append(g.replicas, r)
	}
	var feds, xdss []string
	for _, r := range g.replicas {
		r.args = append([]string{"hub", "--id=" + r.id, "--data-dir=" + filepath.Join(dir, r.id), "--etcd-endpoints=" + g.etcd.endpoint(),
			"--federation-addr=" + r.fed, "--xds-addr=" + r.xds, "--admin-addr=" + r.admin,
			"--gossip-addr=" + r.gsp, "--join=" + joinList(gossip, r.gsp), "--gossip-fast",
			"--tokens=" + tokensFile, "--peer-token-file=" + peerToken, "--snapshot-interval=200ms"}, extra...)
		feds, xdss = append(feds, r.fed), append(xdss, r.xds)
	}
	g.fedLB, g.xdsLB = nettest.NewProxy(t, feds...), nettest.NewProxy(t, xdss...)
	for _, r := range g.replicas {
		g.start(r)
	}
	g.awaitMembers(len(g.replicas))
	return g
}

func joinList(all []string, self string) string {
	var out []string
	for _, a := range all {
		if a != self {
			out = append(out, a)
		}
	}
	return strings.Join(out, ",")
}

func (g *haGroup) start(r *hubReplica) {
	started := time.Now()
	defer func() {
		g.t.Logf("%s: process start -> ready (serving) in %v", r.id, time.Since(started).Round(time.Millisecond))
	}()
	if len(r.wrap) > 0 {
		r.proc = startProc(g.t, r.id, r.wrap[0], append(append(slices.Clone(r.wrap[1:]), g.bin), r.args...)...)
	} else {
		r.proc = startProc(g.t, r.id, g.bin, r.args...)
	}
	awaitFor(g.t, r.id+" ready", 30*time.Second, func() bool { return httpStatus("http://"+r.admin+"/readyz") == http.StatusOK })
}

// kill ends a replica at once (SIGKILL), as a crash would.
func (g *haGroup) kill(r *hubReplica) {
	r.proc.kill()
	g.fedLB.SetDown(r.fed, true)
	g.xdsLB.SetDown(r.xds, true)
}

// restart starts a killed replica again.
func (g *haGroup) restart(r *hubReplica) {
	g.start(r)
	g.fedLB.SetDown(r.fed, false)
	g.xdsLB.SetDown(r.xds, false)
}

func (g *haGroup) pause(r *hubReplica) { _ = r.proc.cmd.Process.Signal(syscall.SIGSTOP) }
func (g *haGroup) resume(r *hubReplica) {
	_ = r.proc.cmd.Process.Signal(syscall.SIGCONT)
}

func (g *haGroup) alive() []*hubReplica {
	var out []*hubReplica
	for _, r := range g.replicas {
		select {
		case <-r.proc.done:
		default:
			out = append(out, r)
		}
	}
	return out
}

func (r *hubReplica) url(path string) string { return "http://" + r.admin + path }

// coordination is a replica's /debug/hub.
func (r *hubReplica) coordination(t testing.TB) adminapi.Coordination {
	var c adminapi.Coordination
	getJSON(t, r.url("/debug/hub"), &c)
	return c
}

func (r *hubReplica) clusters(ctx context.Context) (map[registry.ClusterID]adminapi.ClusterStatus, error) {
	var all []adminapi.ClusterStatus
	if err := fetchJSON(ctx, r.url("/debug/clusters"), &all); err != nil {
		return nil, err
	}
	out := map[registry.ClusterID]adminapi.ClusterStatus{}
	for _, c := range all {
		out[c.Cluster] = c
	}
	return out, nil
}

func (r *hubReplica) services(ctx context.Context) (map[string]adminapi.ServiceInfo, error) {
	var all []adminapi.ServiceInfo
	if err := fetchJSON(ctx, r.url("/debug/services"), &all); err != nil {
		return nil, err
	}
	out := map[string]adminapi.ServiceInfo{}
	for _, s := range all {
		out[s.Service.String()] = s
	}
	return out, nil
}

// awaitMembers waits until every live replica sees n members.
func (g *haGroup) awaitMembers(n int) {
	g.t.Helper()
	awaitFor(g.t, fmt.Sprintf("%d replicas in the gossip group", n), 30*time.Second, func() bool {
		for _, r := range g.alive() {
			var c adminapi.Coordination
			if fetchJSON(g.t.Context(), r.url("/debug/hub"), &c) != nil || len(c.Members) != n {
				return false
			}
		}
		return true
	})
}

// home returns the replica whose spoke session serves the cluster.
func (g *haGroup) home(cluster registry.ClusterID) *hubReplica {
	g.t.Helper()
	var home *hubReplica
	awaitFor(g.t, "a home for "+string(cluster), 30*time.Second, func() bool {
		for _, r := range g.alive() {
			cs, err := r.clusters(g.t.Context())
			if err == nil && cs[cluster].Connected && cs[cluster].Home == r.id {
				home = r
				return true
			}
		}
		return false
	})
	return home
}

// leader returns the replica that leads.
func (g *haGroup) leader() *hubReplica {
	g.t.Helper()
	var leader *hubReplica
	awaitFor(g.t, "a leader", 30*time.Second, func() bool {
		for _, r := range g.alive() {
			var c adminapi.Coordination
			if fetchJSON(g.t.Context(), r.url("/debug/hub"), &c) == nil && c.IsLeader {
				leader = r
				return true
			}
		}
		return false
	})
	return leader
}

// watch samples every live replica's view of a service until stopped and
// records the fewest healthy endpoints any of them showed.
type serviceWatch struct {
	stop    context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	lowest  map[string]int // replica -> fewest healthy endpoints seen
	highest map[string]int // replica -> most healthy endpoints seen
	samples int
}

func (g *haGroup) watchService(service string) *serviceWatch {
	ctx, stop := context.WithCancel(context.Background())
	w := &serviceWatch{stop: stop, done: make(chan struct{}), lowest: map[string]int{}, highest: map[string]int{}}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			for _, r := range g.alive() {
				svcs, err := r.services(ctx)
				if err != nil {
					continue // dying, or paused: its clients' view is what the pollers check
				}
				w.mu.Lock()
				h := svcs[service].Healthy
				if old, ok := w.lowest[r.id]; !ok || h < old {
					w.lowest[r.id] = h
				}
				w.highest[r.id] = max(w.highest[r.id], h)
				w.samples++
				w.mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return w
}

// result stops the watch and returns the fewest healthy endpoints per replica.
func (w *serviceWatch) result() (map[string]int, int) {
	lowest, _, samples := w.extremes()
	return lowest, samples
}

// extremes stops the watch and returns the fewest and most healthy endpoints per replica.
func (w *serviceWatch) extremes() (lowest, highest map[string]int, samples int) {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lowest, w.highest, w.samples
}
