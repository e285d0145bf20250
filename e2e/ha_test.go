package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/kubetest"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
)

// haFixture is a replica group with two clusters' spokes (processes that
// reach the hub through the balancer) and backends on loopback.
type haFixture struct {
	*haGroup
	root                 string
	e1a, e1b, w1a        xdstest.Backend
	spokes               map[registry.ClusterID]*proc
	tokenFiles, dirs     map[registry.ClusterID]string
	regions              map[registry.ClusterID]string
	inEast, inWest, anyC *xdstest.Poller
	stopPolling          context.CancelFunc
}

func startHAFixture(t testing.TB, extra ...string) *haFixture {
	return startHAFixtureAt(t, onLoopback, extra...)
}

func startHAFixtureAt(t testing.TB, at placement, extra ...string) *haFixture {
	f := &haFixture{haGroup: startHAGroupAt(t, 3, at, extra...), root: t.TempDir(),
		spokes: map[registry.ClusterID]*proc{}, tokenFiles: map[registry.ClusterID]string{}, dirs: map[registry.ClusterID]string{},
		regions: map[registry.ClusterID]string{"east": "us-east", "west": "us-west"}}
	f.e1a = xdstest.StartBackend(t, "east-1a", "127.0.0.1")
	f.e1b = xdstest.StartBackend(t, "east-1b", "127.0.0.2")
	f.w1a = xdstest.StartBackend(t, "west-1a", "127.0.0.3")
	for _, c := range []registry.ClusterID{"east", "west"} {
		f.dirs[c] = filepath.Join(f.root, string(c))
		f.tokenFiles[c] = filepath.Join(f.root, string(c)+".token")
		writeFile(t, f.tokenFiles[c], tokens[c])
	}
	writeService(t, f.dirs["east"], "echo", endpoint{f.e1a, "us-east-1a", true}, endpoint{f.e1b, "us-east-1b", true})
	writeService(t, f.dirs["west"], "echo", endpoint{f.w1a, "us-west-1a", true})
	f.startSpoke("east")
	f.startSpoke("west")
	f.awaitHealthy(3)

	ctx, stop := context.WithCancel(context.Background())
	f.stopPolling = stop
	// Through the balancer, the clients land on different replicas.
	f.inEast = xdstest.StartPoller(ctx, t, "client us-east-1a", xdstest.NewClient(t, f.xdsLB.Addr, "c-east", locality("us-east", "us-east-1a"), echoTarget))
	f.inWest = xdstest.StartPoller(ctx, t, "client us-west-1a", xdstest.NewClient(t, f.xdsLB.Addr, "c-west", locality("us-west", "us-west-1a"), echoTarget))
	f.anyC = xdstest.StartPoller(ctx, t, "client anywhere", xdstest.NewClient(t, f.xdsLB.Addr, "c-any", registry.Locality{}, echoTarget))
	t.Cleanup(stop) // registered after the pollers' own cleanups, so it runs before them: they wait for it
	f.inEast.AwaitOnly(ctx, t, "east-1a")
	f.inWest.AwaitOnly(ctx, t, "west-1a")
	return f
}

func (f *haFixture) startSpoke(c registry.ClusterID) {
	f.spokes[c] = startProc(f.t, "spoke-"+string(c), f.bin, "spoke", "--cluster-id="+string(c), "--hub="+f.fedLB.Addr,
		"--token-file="+f.tokenFiles[c], "--source=dir:"+f.dirs[c], "--region="+f.regions[c], "--poll=20ms")
}

// awaitHealthy waits until every live replica serves default/echo with n healthy endpoints.
func (f *haFixture) awaitHealthy(n int) {
	f.t.Helper()
	awaitFor(f.t, "every replica serving echo with "+strconv.Itoa(n)+" healthy endpoints", 30*time.Second, func() bool {
		for _, r := range f.alive() {
			svcs, err := r.services(f.t.Context())
			if err != nil || svcs["default/echo"].Healthy != n {
				return false
			}
		}
		return true
	})
}

// checkNoFailedRPCs stops the clients and fails the test if any RPC failed.
func (f *haFixture) checkNoFailedRPCs() {
	f.t.Helper()
	f.stopPolling()
	for _, p := range []*xdstest.Poller{f.inEast, f.inWest, f.anyC} {
		if calls, failed := p.Failures(); len(failed) > 0 {
			f.t.Errorf("%s: %d of %d RPCs failed, first: %v", p.Name(), len(failed), calls, failed[0])
		}
	}
}

// xdsClients sums nave_xds_connected_clients over the live replicas.
func (g *haGroup) xdsClients() int {
	total := 0
	for _, r := range g.alive() {
		resp, err := http.Get(r.url("/metrics"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "nave_xds_connected_clients "); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += int(n)
			}
		}
		resp.Body.Close()
	}
	return total
}

// Kill the replica that is home to east's spoke: the spoke re-homes, the
// clients of the dead replica move, and no replica's view of the service
// loses an endpoint at any moment; no RPC fails.
func TestHAKillHome(t *testing.T) {
	f := startHAFixture(t)
	awaitFor(t, "the 3 clients connected", 20*time.Second, func() bool { return f.xdsClients() == 3 })
	watch := f.watchService("default/echo")
	home := f.home("east")
	killed := time.Now()
	f.kill(home)
	next := f.home("east")
	t.Logf("dead replica %s -> east's spoke re-homed at %s in %v", home.id, next.id, time.Since(killed).Round(time.Millisecond))
	awaitFor(t, "every client reconnected to a live replica", 30*time.Second, func() bool { return f.xdsClients() == 3 })
	t.Logf("dead replica -> clients re-synced in %v", time.Since(killed).Round(time.Millisecond))
	lowest, samples := watch.result()
	for id, n := range lowest {
		if n != 3 {
			t.Errorf("replica %s showed %d healthy endpoints at some moment (of %d samples), want 3 throughout", id, n, samples)
		}
	}
	// The re-homed spoke's changes reach every client, wherever it now is.
	writeService(t, f.dirs["east"], "echo", endpoint{f.e1a, "us-east-1a", false}, endpoint{f.e1b, "us-east-1b", true})
	f.inEast.AwaitOnly(t.Context(), t, "east-1b")
	f.awaitHealthy(2)
	f.checkNoFailedRPCs()
}

// Kill the leader: another replica leads within seconds, and persisting the
// registry goes on under it.
func TestHAKillLeader(t *testing.T) {
	f := startHAFixture(t)
	leader := f.leader()
	killed := time.Now()
	f.kill(leader)
	next := f.leader()
	t.Logf("leader %s killed -> %s leads in %v", leader.id, next.id, time.Since(killed).Round(time.Millisecond))
	before := next.coordination(t).Snapshot.Revision
	writeService(t, f.dirs["west"], "echo", endpoint{f.w1a, "us-west-1a", true}, endpoint{f.e1b, "us-west-1b", true})
	awaitFor(t, "a newer snapshot from the new leader", 20*time.Second, func() bool {
		s := next.coordination(t).Snapshot
		return s.Revision > before && !s.Restored
	})
	f.checkNoFailedRPCs()
}

// Stop etcd for a while: serving and replicating go on, the replicas say
// they are degraded but stay ready, and persistence resumes after.
func TestHAEtcdDown(t *testing.T) {
	f := startHAFixture(t)
	leader := f.leader()
	f.etcd.stop()
	awaitFor(t, "every replica degraded", 20*time.Second, func() bool {
		for _, r := range f.alive() {
			if r.coordination(t).Degraded == "" {
				return false
			}
		}
		return true
	})
	for _, r := range f.alive() {
		if code := httpStatus(r.url("/readyz")); code != http.StatusOK {
			t.Errorf("%s /readyz = %d while etcd is down, want 200", r.id, code)
		}
	}
	// Open sessions go on, and replication with them.
	writeService(t, f.dirs["east"], "echo", endpoint{f.e1a, "us-east-1a", false}, endpoint{f.e1b, "us-east-1b", true})
	f.awaitHealthy(2)
	f.inEast.AwaitOnly(t.Context(), t, "east-1b")

	f.etcd.start()
	awaitFor(t, "etcd reachable again everywhere", 30*time.Second, func() bool {
		for _, r := range f.alive() {
			if r.coordination(t).Degraded != "" {
				return false
			}
		}
		return true
	})
	before := f.leader().coordination(t).Snapshot.Revision
	writeService(t, f.dirs["east"], "echo", endpoint{f.e1a, "us-east-1a", true}, endpoint{f.e1b, "us-east-1b", true})
	f.awaitHealthy(3)
	awaitFor(t, "persistence resumed", 30*time.Second, func() bool {
		return f.leader().coordination(t).Snapshot.Revision > before
	})
	_ = leader
	f.checkNoFailedRPCs()
}

// Restart every replica at once: each serves the persisted registry as soon
// as it is ready, so clients never see an empty set.
func TestHARestartAll(t *testing.T) {
	f := startHAFixture(t)
	awaitFor(t, "a snapshot with both clusters", 20*time.Second, func() bool { return f.leader().coordination(t).Snapshot.Clusters == 2 })
	for _, r := range f.replicas {
		f.kill(r)
	}
	for _, r := range f.replicas {
		f.restart(r)
		svcs, err := r.services(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		cs, _ := r.clusters(t.Context())
		t.Logf("%s ready: echo has %d healthy endpoints; east restored=%v", r.id, svcs["default/echo"].Healthy, cs["east"].Restored)
		if svcs["default/echo"].Healthy != 3 {
			t.Errorf("%s served %d healthy endpoints when it became ready, want the 3 last known", r.id, svcs["default/echo"].Healthy)
		}
	}
	f.awaitMembers(3)
	// A client that connects now gets the endpoints at once.
	late := xdstest.StartPoller(t.Context(), t, "late client", xdstest.NewClient(t, f.xdsLB.Addr, "c-late", locality("us-west", "us-west-1a"), echoTarget))
	late.AwaitOnly(t.Context(), t, "west-1a")
	awaitFor(t, "live spokes confirm the restored data", 30*time.Second, func() bool {
		for _, r := range f.alive() {
			cs, err := r.clusters(t.Context())
			if err != nil || cs["east"].Restored || cs["west"].Restored {
				return false
			}
		}
		return true
	})
	f.checkNoFailedRPCs()
}

// A home replica paused (SIGSTOP) while its spoke moves on to another
// replica cannot overwrite the newer data when it wakes up (it was sent an
// update before it was paused, which may still be in its socket), and it
// converges on the newer data and knows it is no longer the home. The
// fencing rules themselves are tested in hub/replica_test.go.
func TestHAStaleHomeCannotOverwrite(t *testing.T) {
	f := startHAFixture(t)
	home := f.home("east")
	before, _ := home.clusters(t.Context())
	f.pause(home)
	// The spoke sends change A to the paused home: it waits in the home's socket.
	writeService(t, f.dirs["east"], "echo", endpoint{f.e1a, "us-east-1a", false}, endpoint{f.e1b, "us-east-1b", true})
	time.Sleep(300 * time.Millisecond) // the dir source notices, the spoke sends
	// The balancer gives up on the paused home: the spoke's connection ends
	// and it resumes at another replica, where A lands under a newer epoch.
	f.fedLB.SetDown(home.fed, true)
	f.xdsLB.SetDown(home.xds, true)
	f.fedLB.Cut(home.fed)
	f.xdsLB.Cut(home.xds)
	others := []*hubReplica{}
	for _, r := range f.replicas {
		if r != home {
			others = append(others, r)
		}
	}
	awaitOthers := func(what string, healthy int) {
		awaitFor(t, what, 30*time.Second, func() bool {
			for _, r := range others {
				svcs, err := r.services(t.Context())
				cs, err2 := r.clusters(t.Context())
				if err != nil || err2 != nil || svcs["default/echo"].Healthy != healthy || cs["east"].Epoch <= before["east"].Epoch {
					return false
				}
			}
			return true
		})
	}
	awaitOthers("change A at the other replicas, under a newer epoch", 2)
	// Change B undoes A: from now on the others must hold 3 healthy endpoints.
	writeService(t, f.dirs["east"], "echo", endpoint{f.e1a, "us-east-1a", true}, endpoint{f.e1b, "us-east-1b", true})
	awaitOthers("change B at the other replicas", 3)
	watch := f.watchService("default/echo")
	f.resume(home)
	awaitFor(t, "the stale home converged on B", 30*time.Second, func() bool {
		svcs, err := home.services(t.Context())
		cs, err2 := home.clusters(t.Context())
		return err == nil && err2 == nil && svcs["default/echo"].Healthy == 3 && cs["east"].Epoch > before["east"].Epoch
	})
	time.Sleep(time.Second) // let anything the stale home still had in flight arrive
	lowest, _, _ := watch.extremes()
	for _, r := range others {
		if lowest[r.id] != 3 {
			t.Errorf("replica %s fell back to %d healthy endpoints after the stale home woke, want B's 3 throughout", r.id, lowest[r.id])
		}
	}
	// Exactly one replica is the home of east: the stale one knows it is not.
	homes := 0
	for _, r := range f.replicas {
		if cs, err := r.clusters(t.Context()); err == nil && cs["east"].Connected {
			homes++
		}
	}
	if homes != 1 {
		t.Errorf("%d replicas say east's spoke is connected to them, want 1", homes)
	}
	f.checkNoFailedRPCs()
}

// A cluster whose spoke vanished turns stale and keeps its endpoints; once
// its drop policy applies they go, at every replica; its return revives it.
func TestHAClusterLiveness(t *testing.T) {
	f := startHAFixture(t, "--stale-after=1s", "--drop-after=3s", "--cluster-policies=west=drop")
	f.stopPolling() // the clients would fail over to dropped endpoints on purpose
	f.spokes["east"].kill()
	f.spokes["west"].kill()
	status := func(r *hubReplica, c registry.ClusterID) adminapi.ClusterStatus {
		cs, err := r.clusters(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return cs[c]
	}
	awaitFor(t, "both clusters stale everywhere", 20*time.Second, func() bool {
		for _, r := range f.alive() {
			if !status(r, "east").Stale || !status(r, "west").Stale {
				return false
			}
		}
		return true
	})
	awaitFor(t, "west dropped everywhere, east kept", 20*time.Second, func() bool {
		for _, r := range f.alive() {
			e, w := status(r, "east"), status(r, "west")
			if !w.Dropped || w.Services != 0 || e.Services != 1 || e.Dropped {
				return false
			}
		}
		return true
	})
	for _, r := range f.alive() {
		if age := status(r, "east").DataAge(time.Now()); age < time.Second {
			t.Errorf("%s: east's data age %v, want the time since its spoke left", r.id, age)
		}
	}
	f.startSpoke("west")
	awaitFor(t, "west live again everywhere", 20*time.Second, func() bool {
		for _, r := range f.alive() {
			w := status(r, "west")
			if w.Stale || w.Dropped || w.Services != 1 {
				return false
			}
		}
		return true
	})
}

// A replica cut off from the others (and from etcd) by a network partition
// keeps serving what it had; when the partition heals it rejoins and
// converges on what changed meanwhile. The cut replica runs in a network
// namespace of its own; the partition takes its link down.
func TestHAPartitionHeals(t *testing.T) {
	h := kubetest.NewHost(t)
	at := placement{
		etcdIP: h.RootIP.String(),
		ip: func(i int) string {
			if i == 2 {
				return h.IP.String()
			}
			return h.RootIP.String()
		},
		wrap: func(i int) []string {
			if i == 2 {
				return []string{"ip", "netns", "exec", h.Netns}
			}
			return nil
		},
	}
	f := startHAFixtureAt(t, at)
	majority, cut := f.replicas[:2], f.replicas[2]
	link := netnsLink(t, h.Netns)
	setLink := func(state string) {
		if out, err := exec.Command("ip", "-n", h.Netns, "link", "set", "dev", link, state).CombinedOutput(); err != nil {
			t.Fatalf("ip link set %s %s: %v: %s", link, state, err, out)
		}
	}
	seen := func(r *hubReplica) int {
		var c adminapi.Coordination
		if fetchJSON(t.Context(), r.url("/debug/hub"), &c) != nil {
			return -1
		}
		return len(c.Members)
	}
	setLink("down")
	parted := time.Now()
	awaitFor(t, "the majority to see the cut replica gone", 20*time.Second, func() bool {
		return seen(majority[0]) == 2 && seen(majority[1]) == 2
	})
	writeService(t, f.dirs["east"], "echo", endpoint{f.e1a, "us-east-1a", false}, endpoint{f.e1b, "us-east-1b", true})
	awaitFor(t, "the change at the majority", 20*time.Second, func() bool {
		for _, r := range majority {
			svcs, err := r.services(t.Context())
			if err != nil || svcs["default/echo"].Healthy != 2 {
				return false
			}
		}
		return true
	})
	setLink("up")
	healed := time.Now()
	awaitFor(t, "the cut replica back in the group and converged", 30*time.Second, func() bool {
		svcs, err := cut.services(t.Context())
		return err == nil && svcs["default/echo"].Healthy == 2 && seen(cut) == 3 && seen(majority[0]) == 3
	})
	t.Logf("partitioned for %v; healed and converged in %v", healed.Sub(parted).Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	awaitFor(t, "every replica at the same stamps", 30*time.Second, func() bool {
		var want map[registry.ClusterID]adminapi.ClusterStatus
		for _, r := range f.replicas {
			cs, err := r.clusters(t.Context())
			if err != nil {
				return false
			}
			if want == nil {
				want = cs
				continue
			}
			for id, c := range cs {
				if w := want[id]; w.Epoch != c.Epoch || w.Version != c.Version || w.Digest != c.Digest {
					return false
				}
			}
		}
		return true
	})
	f.checkNoFailedRPCs()
}

// netnsLink returns the name of the one non-loopback link in a network namespace.
func netnsLink(t testing.TB, netns string) string {
	out, err := exec.Command("ip", "-n", netns, "-o", "link", "show").Output()
	if err != nil {
		t.Fatalf("ip -n %s link show: %v", netns, err)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(fields[1], ":"), "@")
		if name != "lo" {
			return name
		}
	}
	t.Fatalf("no link in network namespace %s", netns)
	return ""
}

// A spoke's gateways reach every replica, and outlive its home replica.
func TestHAGatewaysReachEveryReplica(t *testing.T) {
	f := startHAFixture(t)
	f.spokes["east"].stop()
	f.spokes["east"] = startProc(t, "spoke-east-gw", f.bin, "spoke", "--cluster-id=east", "--hub="+f.fedLB.Addr,
		"--token-file="+f.tokenFiles["east"], "--source=dir:"+f.dirs["east"], "--region=us-east", "--poll=20ms",
		"--network=net-east", "--network-gateway=192.0.2.9:15444")
	gatewayEverywhere := func() bool {
		for _, r := range f.alive() {
			var nets []adminapi.NetworkStatus
			resp, err := http.Get(r.url("/debug/networks"))
			if err != nil {
				return false
			}
			err = json.NewDecoder(resp.Body).Decode(&nets)
			resp.Body.Close()
			if err != nil || len(nets) != 1 || nets[0].Network != "net-east" || len(nets[0].Gateways) != 1 ||
				nets[0].Gateways[0].String() != "192.0.2.9:15444" {
				return false
			}
		}
		return true
	}
	defer func() {
		if !t.Failed() {
			return
		}
		for _, r := range f.alive() {
			resp, err := http.Get(r.url("/debug/networks"))
			if err == nil {
				var v any
				_ = json.NewDecoder(resp.Body).Decode(&v)
				resp.Body.Close()
				t.Logf("%s networks: %v", r.id, v)
			}
		}
	}()
	awaitFor(t, "east's gateway at every replica", 30*time.Second, gatewayEverywhere)
	f.kill(f.home("east"))
	awaitFor(t, "east's gateway at the live replicas after its home died", 30*time.Second, gatewayEverywhere)
	f.checkNoFailedRPCs()
}
