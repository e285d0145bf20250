package e2e

import (
	"bufio"
	"context"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/hub"
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

func startHAFixture(t *testing.T, extra ...string) *haFixture {
	f := &haFixture{haGroup: startHAGroup(t, 3, extra...), root: t.TempDir(),
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
	t.Cleanup(stop)
	// Through the balancer, the clients land on different replicas.
	f.inEast = xdstest.StartPoller(ctx, t, "client us-east-1a", xdstest.NewClient(t, f.xdsLB.addr, "c-east", locality("us-east", "us-east-1a"), echoTarget))
	f.inWest = xdstest.StartPoller(ctx, t, "client us-west-1a", xdstest.NewClient(t, f.xdsLB.addr, "c-west", locality("us-west", "us-west-1a"), echoTarget))
	f.anyC = xdstest.StartPoller(ctx, t, "client anywhere", xdstest.NewClient(t, f.xdsLB.addr, "c-any", registry.Locality{}, echoTarget))
	f.inEast.AwaitOnly(ctx, t, "east-1a")
	f.inWest.AwaitOnly(ctx, t, "west-1a")
	return f
}

func (f *haFixture) startSpoke(c registry.ClusterID) {
	f.spokes[c] = startProc(f.t, "spoke-"+string(c), f.bin, "spoke", "--cluster-id="+string(c), "--hub="+f.fedLB.addr,
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
	late := xdstest.StartPoller(t.Context(), t, "late client", xdstest.NewClient(t, f.xdsLB.addr, "c-late", locality("us-west", "us-west-1a"), echoTarget))
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
// replica cannot overwrite the newer data when it wakes up; it converges.
func TestHAStaleHomeCannotOverwrite(t *testing.T) {
	f := startHAFixture(t)
	home := f.home("east")
	f.pause(home)
	f.fedLB.setDown(home.fed, true) // its readiness check would fail: no new connections
	f.xdsLB.setDown(home.xds, true)
	f.spokes["east"].kill()
	writeService(t, f.dirs["east"], "echo", endpoint{f.e1a, "us-east-1a", false}, endpoint{f.e1b, "us-east-1b", true})
	f.startSpoke("east")
	others := []*hubReplica{}
	for _, r := range f.replicas {
		if r != home {
			others = append(others, r)
		}
	}
	awaitFor(t, "the new data at the other replicas", 30*time.Second, func() bool {
		for _, r := range others {
			svcs, err := r.services(t.Context())
			if err != nil || svcs["default/echo"].Healthy != 2 {
				return false
			}
		}
		return true
	})
	watch := f.watchService("default/echo")
	f.resume(home)
	awaitFor(t, "the stale home converged", 30*time.Second, func() bool {
		svcs, err := home.services(t.Context())
		return err == nil && svcs["default/echo"].Healthy == 2
	})
	time.Sleep(time.Second) // let anything the stale home still had in flight arrive
	_, highest, _ := watch.extremes()
	for _, r := range others {
		if highest[r.id] != 2 {
			t.Errorf("replica %s showed %d healthy endpoints after the stale home woke, want the newer 2", r.id, highest[r.id])
		}
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
	status := func(r *hubReplica, c registry.ClusterID) hub.ClusterStatus {
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
