package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// routesHub serves /debug/routes of r as the hub builds it.
func routesHub(t *testing.T, r *registry.Registry) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/debug/routes" {
			http.NotFound(w, req)
			return
		}
		var v any = hub.Routes(r)
		if service := req.URL.Query().Get("service"); service != "" {
			info, err := hub.ServiceRoutes(r, service)
			if err != nil {
				w.WriteHeader(http.StatusNotFound)
				v = adminapi.ErrorInfo{Error: err.Error()}
			} else {
				v = info
			}
		}
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func webShard(cluster registry.ClusterID, name string, exportedAt time.Time, set traffic.Set) *registry.Shard {
	s := &registry.Shard{
		Cluster: cluster, Service: registry.ServiceKey{Namespace: "shop", Name: name}, ExportedAt: exportedAt,
		Ports: []registry.ServicePort{{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}},
		Endpoints: []registry.Endpoint{{
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ports: []registry.EndpointPort{{Name: "grpc", Port: 8080}},
			Conditions: registry.Conditions{Ready: true, Serving: true},
		}},
		Traffic: set,
	}
	s.Normalize()
	return s
}

// navectl routes lists the services with routes or a policy; with one, its
// routes rule by rule, the backend no cluster exports, the policy, the
// conflicts and each cluster's export, as the hub merged them.
func TestNavectlRoutes(t *testing.T) {
	older, younger := time.Unix(1_700_000_000, 0).UTC(), time.Unix(1_800_000_000, 0).UTC()
	canary := traffic.Route{Kind: traffic.GRPCRoute, Name: "canary", CreatedAt: older, Rules: []traffic.Rule{
		{
			Matches: []traffic.Match{{Method: &traffic.MethodMatch{Type: traffic.Exact, Service: "shop.Web", Method: "Buy"},
				Headers: []traffic.HeaderMatch{{Type: traffic.Exact, Name: "x-canary", Value: "1"}}}},
			Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "web-v2", Weight: 1}},
		},
		{Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "web", Weight: 9}, {Kind: traffic.BackendServiceImport, Name: "web-v3", Weight: 1}}},
	}}
	changed := canary
	changed.Rules = canary.Rules[1:]
	legacy := traffic.Route{Kind: traffic.HTTPRoute, Name: "legacy", CreatedAt: younger, Rules: []traffic.Rule{{
		Matches:  []traffic.Match{{Path: &traffic.PathMatch{Type: traffic.PathPrefix, Value: "/api"}}},
		Backends: []traffic.Backend{{Kind: traffic.BackendService, Name: "web", Port: 8080, Weight: 1}},
		Timeout:  5 * time.Second, SetHeaders: []traffic.Header{{Name: "x-from", Value: "nave"}},
	}}}
	policy := &traffic.Policy{Name: "web", LoadBalancer: &traffic.LoadBalancer{Algorithm: traffic.RingHash, HashHeader: "x-user"},
		Timeout: 2 * time.Second, Retry: &traffic.Retry{Attempts: 2, GRPCCodes: []string{"unavailable"}}}
	r := registry.New()
	for _, c := range []registry.Change{
		{Cluster: "west", Upserts: []*registry.Shard{
			webShard("west", "web", older, traffic.Set{Routes: []traffic.Route{canary}, Policy: policy}),
			webShard("west", "web-v2", older, traffic.Set{}),
		}},
		{Cluster: "east", Upserts: []*registry.Shard{
			webShard("east", "web", younger, traffic.Set{Routes: []traffic.Route{changed, legacy}, Policy: &traffic.Policy{Name: "web-east"}}),
		}},
	} {
		r, _ = r.Apply(c)
	}
	url := routesHub(t, r)

	list := navectl(t, "--hub", url, "routes")
	t.Logf("navectl routes:\n%s", list)
	rows := strings.Split(strings.TrimSpace(list), "\n")
	if len(rows) != 4 || strings.Join(strings.Fields(rows[1]), " ") != "shop/web 2 web (west) 2 web-v3:8080" ||
		!strings.HasPrefix(rows[2], `conflict in shop/web: GRPCRoute "canary": differs between west and east (kept west's, ignored east's)`) {
		t.Errorf("navectl routes:\n%s", list)
	}

	one := navectl(t, "--hub", url, "routes", "shop/web")
	t.Logf("navectl routes shop/web:\n%s", one)
	for _, want := range []string{
		"shop/web: 2 routes; TrafficPolicy web from west",
		"port 8080/TCP (grpc)  xds:///web.shop.svc.clusterset.local:8080",
		"  GRPCRoute canary (every port) from west, created 2023-11-14T22:13:20Z",
		`    rule 1: method shop.Web/Buy and header x-canary = "1"`,
		"      -> ServiceImport web-v2:8080  weight 1  exported by west",
		"      timeout 2s (the policy's), retry 2 times on unavailable (the policy's)",
		"    rule 2: every request",
		"      -> ServiceImport web:8080  weight 9  exported by east,west",
		"      -> ServiceImport web-v3:8080  weight 1  NOT EXPORTED: a placeholder with no endpoints, its requests fail UNAVAILABLE",
		"  HTTPRoute legacy (every port) from east",
		"    rule 1: path PathPrefix /api",
		"      -> Service web:8080  weight 1  the client's own cluster's endpoints (exported by east,west)",
		`      timeout 5s, retry 2 times on unavailable (the policy's), set header x-from: "nave"`,
		"TrafficPolicy web from west:\n  load balancing: RingHash, hashing header x-user\n  timeout: 2s (where a route rule sets none)",
		`  TrafficPolicy: "web" in west but "web-east" in east (kept west's, ignored east's)`,
	} {
		if !strings.Contains(one, want) {
			t.Errorf("navectl routes shop/web lacks %q:\n%s", want, one)
		}
	}
	if exports := strings.Fields(one[strings.Index(one, "CLUSTER"):]); strings.Join(exports, " ") !=
		"CLUSTER EXPORTED ROUTES POLICY west 2023-11-14T22:13:20Z GRPCRoute/canary web east 2027-01-15T08:00:00Z GRPCRoute/canary,HTTPRoute/legacy web-east" {
		t.Errorf("the exports: %v", exports)
	}
	plain := navectl(t, "--hub", url, "routes", "shop/web-v2")
	if !strings.Contains(plain, "shop/web-v2: 0 routes; no TrafficPolicy") || !strings.Contains(plain, "no route: every request goes to the port's own endpoints\n") {
		t.Errorf("navectl routes shop/web-v2:\n%s", plain)
	}

	var info adminapi.RoutesInfo
	if err := json.Unmarshal([]byte(navectl(t, "--hub", url, "-o", "json", "routes", "shop/web")), &info); err != nil {
		t.Fatalf("-o json is not JSON: %v", err)
	}
	if info.RouteCount != 2 || info.PolicyCluster != "west" || len(info.Conflicts) != 2 || len(info.Exports) != 2 {
		t.Errorf("-o json: %+v", info)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--hub", url, "routes", "shop/missing"}, "hub answered 404 Not Found: service shop/missing is not federated"},
		{[]string{"--hub", url, "routes", "shop"}, "routes takes a service NAMESPACE/NAME"},
		{[]string{"--hub", url, "routes", "shop/web", "shop/web-v2"}, "routes takes at most one service"},
	} {
		var out strings.Builder
		if err := run(tc.args, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("navectl %v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}
