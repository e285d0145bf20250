package hub_test

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/registry"
)

// awaitImports returns the first import state that satisfies cond.
func (sp *spoke) awaitImports(t *testing.T, what string, cond func(federation.ImportState) bool) federation.ImportState {
	t.Helper()
	timeout := time.After(15 * time.Second)
	var last federation.ImportState
	for {
		select {
		case s := <-sp.imports:
			if cond(s) {
				return s
			}
			last = s
		case <-timeout:
			t.Fatalf("never given imports with %s; last %d imports", what, len(last.Imports))
		}
	}
}

func headlessShard(cluster registry.ClusterID, name, addr string) *registry.Shard {
	s := apiShard(cluster, olderExport, "grpc", addr)
	s.Service.Name, s.Headless = name, true
	s.Normalize()
	return s
}

var dbKey = registry.ServiceKey{Namespace: "default", Name: "db"}

// Every cluster that has the namespace gets one import per service: the
// merged service with a clusterset IP from the range (ClusterSetIP only),
// each source cluster's endpoints and staleness. The IP stays across a hub
// restart, and the hub shows how far each spoke has written its imports.
func TestImportsReachEveryClusterWithStableIPs(t *testing.T) {
	dir := t.TempDir()
	cidr := netip.MustParsePrefix("243.7.0.0/24")
	tune := func(c *hub.Config) {
		c.ClustersetCIDRs = []netip.Prefix{cidr}
		c.Liveness.StaleAfter = 500 * time.Millisecond
	}
	h, stopHub := startHub(t, dir, tune)
	east := startSpoke(t, h, "east", "default")
	west := startSpoke(t, h, "west", "default", "other")
	east.publish(apiShard("east", olderExport, "grpc", "10.0.0.1"), headlessShard("east", "db", "10.0.0.2"))
	west.publish(apiShard("west", youngerExport, "grpc", "10.1.0.1"))

	both := func(s federation.ImportState) bool {
		api := s.Imports[apiKey]
		return api != nil && len(api.Sources) == 2 && s.Imports[dbKey] != nil
	}
	// A new hub (an empty catalog) is authoritative once the grace (StaleAfter) has passed.
	es := east.awaitImports(t, "api from both clusters and db, authoritatively", func(s federation.ImportState) bool { return both(s) && s.Authoritative })
	ws := west.awaitImports(t, "api from both clusters and db", both)
	api := es.Imports[apiKey]
	if len(api.IPs) != 1 || !cidr.Contains(api.IPs[0]) || api.Headless || !ws.Imports[apiKey].Equal(api) {
		t.Fatalf("api import %+v; west has %+v", api, ws.Imports[apiKey])
	}
	if db := es.Imports[dbKey]; !db.Headless || len(db.IPs) != 0 || len(db.Sources) != 1 {
		t.Errorf("db import %+v, want headless without IPs from east", db)
	}

	// The hub shows each session; a spoke that has written its imports is written.
	east.pub.ImportsWritten(es.Epoch, es.Version)
	awaitDebugImports(t, h, "east written", func(info adminapi.ImportsInfo) bool {
		for _, s := range info.Sessions {
			if s.Cluster == "east" && s.Written() && s.Imports == 2 {
				return true
			}
		}
		return false
	})
	// An import a user's own object blocks in east shows there, with its
	// reason; east is not written until the spoke reports it cleared.
	east.pub.ImportProblems([]federation.ImportProblem{{Service: apiKey, Reason: federation.ReasonBlockedByService,
		Message: "Service derived-x exists and is not managed by Nave"}})
	awaitDebugImports(t, h, "east's api blocked", func(info adminapi.ImportsInfo) bool {
		for _, s := range info.Sessions {
			if s.Cluster == "east" && !s.Written() && s.BlockedCount == 1 && len(s.Blocked) == 1 && s.Blocked[0].Service == apiKey &&
				s.Blocked[0].Reason == federation.ReasonBlockedByService && s.Blocked[0].Message != "" {
				return true
			}
		}
		return false
	})
	east.pub.ImportProblems(nil)
	awaitDebugImports(t, h, "east written again", func(info adminapi.ImportsInfo) bool {
		for _, s := range info.Sessions {
			if s.Cluster == "east" && s.Written() && s.BlockedCount == 0 {
				return true
			}
		}
		return false
	})

	// A cluster whose spoke is gone turns stale: its endpoints stay, marked so.
	west.stop()
	east.awaitImports(t, "west stale", func(s federation.ImportState) bool {
		api := s.Imports[apiKey]
		return api != nil && len(api.Sources) == 2 && api.Sources[1].Cluster == "west" && api.Sources[1].Stale
	})

	// A restarted hub (same etcd) gives the service the same clusterset IP.
	stopHub()
	h2, _ := startHub(t, dir, tune)
	again := startSpoke(t, h2, "east", "default")
	again.publish(apiShard("east", olderExport, "grpc", "10.0.0.1"))
	s := again.awaitImports(t, "api after the restart", func(s federation.ImportState) bool { return s.Imports[apiKey] != nil })
	if got := s.Imports[apiKey].IPs; len(got) != 1 || got[0] != api.IPs[0] {
		t.Errorf("after a restart api has %v, want %v", got, api.IPs)
	}
}

func awaitDebugImports(t *testing.T, h *hub.Hub, what string, cond func(adminapi.ImportsInfo) bool) adminapi.ImportsInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var info adminapi.ImportsInfo
	for time.Now().Before(deadline) {
		_, body := get(t, "http://"+h.AdminAddr.String()+"/debug/imports")
		info = adminapi.ImportsInfo{}
		if err := json.Unmarshal([]byte(body), &info); err != nil {
			t.Fatalf("/debug/imports: %v: %s", err, body)
		}
		if cond(info) {
			return info
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("/debug/imports never showed %s: %+v", what, info)
	return info
}
