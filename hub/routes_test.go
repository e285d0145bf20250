package hub_test

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

var (
	webKey   = registry.ServiceKey{Namespace: "shop", Name: "web"}
	webV2Key = registry.ServiceKey{Namespace: "shop", Name: "web-v2"}
	created  = time.Unix(1_750_000_000, 0).UTC()
)

// trafficShard is cluster's shard of service k (ports 8080 and 9090) with its routes and policy.
func trafficShard(cluster registry.ClusterID, k registry.ServiceKey, exportedAt time.Time, set traffic.Set) *registry.Shard {
	s := &registry.Shard{
		Cluster: cluster, Service: k, ExportedAt: exportedAt,
		Ports: []registry.ServicePort{{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}, {Name: "http", Port: 9090, Protocol: registry.ProtocolTCP}},
		Endpoints: []registry.Endpoint{{
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ports: []registry.EndpointPort{{Name: "grpc", Port: 8080}, {Name: "http", Port: 9090}},
			Conditions: registry.Conditions{Ready: true, Serving: true},
		}},
		Traffic: set,
	}
	s.Normalize()
	return s
}

// /debug/routes: west exports shop/web first, with a GRPCRoute and a
// TrafficPolicy; east later, with the same route written otherwise, an
// HTTPRoute of port 9090, one of a port the service lacks, and another
// policy. Clients get west's route and policy and east's HTTPRoute, and
// the JSON says where each came from, what lost, and which backend no
// cluster exports.
func TestDebugRoutes(t *testing.T) {
	h, _ := startHub(t, t.TempDir())
	admin := "http://" + h.AdminAddr.String()
	east, west := startSpoke(t, h, "east"), startSpoke(t, h, "west")

	canary := traffic.Route{Kind: traffic.GRPCRoute, Name: "canary", CreatedAt: created, Rules: []traffic.Rule{
		{
			Matches: []traffic.Match{{Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "shop.Web", Method: "Buy"},
				Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-canary", Value: "1"}}}},
			Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "web-v2", Weight: 1}},
		},
		{Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "web", Weight: 9}, {Kind: traffic.BackendServiceImport, Name: "web-v3", Weight: 1}}},
	}}
	eastCanary := canary
	eastCanary.Rules = canary.Rules[1:]
	legacy := traffic.Route{Kind: traffic.HTTPRoute, Name: "legacy", CreatedAt: created, Port: 9090, Rules: []traffic.Rule{{
		Matches:  []traffic.Match{{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/api"}}},
		Backends: []traffic.Backend{{Kind: traffic.BackendService, Name: "web", Port: 9090, Weight: 1}},
		Timeout:  5 * time.Second, Retry: &traffic.Retry{Attempts: 3, HTTPCodes: []int32{503}},
		SetHeaders: []traffic.Header{{Name: "x-from", Value: "nave"}},
	}}}
	orphan := traffic.Route{Kind: traffic.HTTPRoute, Name: "orphan", CreatedAt: created, Port: 7070, Rules: []traffic.Rule{{}}}
	westPolicy := &traffic.Policy{Name: "web", LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-user"},
		Timeout: 2 * time.Second, Retry: &traffic.Retry{Attempts: 2, GRPCCodes: []string{"unavailable"}}}
	eastPolicy := &traffic.Policy{Name: "web-east", LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RoundRobin}}

	west.publish(
		trafficShard("west", webKey, olderExport, traffic.Set{Routes: []traffic.Route{canary}, Policy: westPolicy}),
		trafficShard("west", webV2Key, olderExport, traffic.Set{Policy: &traffic.Policy{Name: "web-v2", MaxRequests: 100}}),
		trafficShard("west", registry.ServiceKey{Namespace: "shop", Name: "plain"}, olderExport, traffic.Set{}),
	)
	east.publish(trafficShard("east", webKey, youngerExport, traffic.Set{Routes: []traffic.Route{eastCanary, legacy, orphan}, Policy: eastPolicy}))
	deadline := time.Now().Add(10 * time.Second)
	for {
		svc := h.View().Registry.Service(webKey)
		if svc != nil && len(svc.Shards) == 2 && h.View().Registry.Service(webV2Key) != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hub never held both clusters' shop/web")
		}
		time.Sleep(10 * time.Millisecond)
	}

	code, body := get(t, admin+"/debug/routes?service=shop/web")
	var got adminapi.RoutesInfo
	if code != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil {
		t.Fatalf("/debug/routes?service=shop/web = %d %s", code, body)
	}
	grpcPort := registry.ServicePort{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}
	httpPort := registry.ServicePort{Name: "http", Port: 9090, Protocol: registry.ProtocolTCP}
	// The canary as each port takes it: its ServiceImport backends are of the port the request came to.
	canaryAt := func(port int32) adminapi.RouteInfo {
		backend := func(name string, weight int32, clusters ...registry.ClusterID) adminapi.BackendInfo {
			k := registry.ServiceKey{Namespace: "shop", Name: name}
			return adminapi.BackendInfo{Kind: traffic.BackendServiceImport, Name: name, Port: port, Weight: weight,
				XDSCluster: "outbound|" + strconv.Itoa(int(port)) + "||" + k.Hostname(), Exported: len(clusters) > 0, Clusters: clusters}
		}
		return adminapi.RouteInfo{Kind: traffic.GRPCRoute, Name: "canary", Cluster: "west", CreatedAt: created, Rules: []adminapi.RuleInfo{
			{Matches: canary.Rules[0].Matches, Backends: []adminapi.BackendInfo{backend("web-v2", 1, "west")}},
			{Backends: []adminapi.BackendInfo{backend("web", 9, "east", "west"), backend("web-v3", 1)}},
		}}
	}
	want := adminapi.RoutesInfo{
		Service: webKey, RouteCount: 3,
		Ports: []adminapi.PortRoutes{
			{Port: grpcPort, Target: "xds:///web.shop.svc.clusterset.local:8080", Routes: []adminapi.RouteInfo{canaryAt(8080)}},
			{Port: httpPort, Target: "xds:///web.shop.svc.clusterset.local:9090", Routes: []adminapi.RouteInfo{canaryAt(9090), {
				Kind: traffic.HTTPRoute, Name: "legacy", Cluster: "east", CreatedAt: created, Port: 9090, Rules: []adminapi.RuleInfo{{
					Matches: legacy.Rules[0].Matches,
					Backends: []adminapi.BackendInfo{{Kind: traffic.BackendService, Name: "web", Port: 9090, Weight: 1,
						XDSCluster: "outbound|9090|local|web.shop.svc.clusterset.local", Exported: true, Clusters: []registry.ClusterID{"east", "west"}}},
					Timeout: 5 * time.Second, Retry: legacy.Rules[0].Retry, SetHeaders: legacy.Rules[0].SetHeaders,
				}},
			}}},
		},
		Unattached: []adminapi.RouteInfo{{Kind: traffic.HTTPRoute, Name: "orphan", Cluster: "east", CreatedAt: created, Port: 7070,
			Rules: []adminapi.RuleInfo{{}}}},
		Policy: westPolicy, PolicyCluster: "west",
		Conflicts: []registry.Conflict{
			{Kind: registry.RouteConflict, Property: `GRPCRoute "canary"`, Winner: "west", Loser: "east",
				Reason: `differs between west and east`},
			{Kind: registry.PolicyConflict, Property: "TrafficPolicy", Winner: "west", Loser: "east",
				Reason: `"web" in west but "web-east" in east`},
		},
		Exports: []adminapi.TrafficExport{
			{Cluster: "west", ExportedAt: olderExport, Routes: []adminapi.RouteName{{Kind: traffic.GRPCRoute, Name: "canary"}}, Policy: "web"},
			{Cluster: "east", ExportedAt: youngerExport, Routes: []adminapi.RouteName{{Kind: traffic.GRPCRoute, Name: "canary"},
				{Kind: traffic.HTTPRoute, Name: "legacy"}, {Kind: traffic.HTTPRoute, Name: "orphan"}}, Policy: "web-east"},
		},
	}
	if !reflect.DeepEqual(got, want) {
		wantJSON, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("/debug/routes?service=shop/web:\n%s\nwant:\n%s", body, wantJSON)
	}
	// The wire names operators and the dashboard read.
	for _, s := range []string{`"policyCluster": "west"`, `"xdsCluster": "outbound|8080||web-v3.shop.svc.clusterset.local"`,
		`"exported": false`, `"routeCount": 3`, `"kind": "RouteConflict"`, `"unattached": [`} {
		if !strings.Contains(body, s) {
			t.Errorf("/debug/routes?service=shop/web lacks %s", s)
		}
	}

	// Every service with routes or a policy, sorted: not shop/plain.
	code, body = get(t, admin+"/debug/routes")
	var all []adminapi.RoutesInfo
	if code != http.StatusOK || json.Unmarshal([]byte(body), &all) != nil || len(all) != 2 ||
		!reflect.DeepEqual(all[0], want) || all[1].Service != webV2Key || all[1].RouteCount != 0 ||
		all[1].Policy.Name != "web-v2" || all[1].PolicyCluster != "west" || len(all[1].Ports[0].Routes) != 0 {
		t.Errorf("/debug/routes = %d %s", code, body)
	}
	// A service without routes is described all the same; an unknown one is a JSON 404.
	if plain, err := hub.ServiceRoutes(h.View().Registry, "shop/plain"); err != nil || plain.RouteCount != 0 || plain.Policy != nil ||
		len(plain.Ports) != 2 || len(plain.Exports) != 1 {
		t.Errorf("shop/plain: %+v, %v", plain, err)
	}
	for _, tc := range []struct {
		query string
		code  int
		error string
	}{
		{"?service=shop/missing", http.StatusNotFound, "service shop/missing is not federated"},
		{"?service=nope", http.StatusBadRequest, "not namespace/name"},
	} {
		code, body := get(t, admin+"/debug/routes"+tc.query)
		var e adminapi.ErrorInfo
		if code != tc.code || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, tc.error) {
			t.Errorf("/debug/routes%s = %d %s, want %d with a JSON error saying %q", tc.query, code, body, tc.code, tc.error)
		}
	}
}
