package xds

import (
	"sync/atomic"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/registry"
)

// routesAudience serves nodes whose metadata says ROLE=router a route
// configuration per service port, and a broken one while broken is set.
type routesAudience struct{ broken atomic.Bool }

func (a *routesAudience) Classify(node *core.Node) (string, Client, bool) {
	if node.GetMetadata().GetFields()["ROLE"].GetStringValue() != "router" {
		return "", Client{}, false
	}
	return "routers", Client{}, true
}

func (a *routesAudience) Build(_ string, r *registry.Registry, _ registry.Networks) Resources {
	var res Resources
	for _, svc := range r.Services() {
		for _, p := range ServicePorts(svc) {
			res.Routes = append(res.Routes, RouteConfiguration(svc, p, nil))
			res.Clusters = append(res.Clusters, Cluster(svc.Key, p, nil))
		}
	}
	if a.broken.Load() {
		res.Clusters = append(res.Clusters, &cluster.Cluster{Name: ""}) // invalid: no name
	}
	return res
}

// An audience's group is served its own resources; a set that does not
// validate is not published at all, and the group keeps its last good one.
func TestAudienceGroupsKeepTheirLastGoodSet(t *testing.T) {
	aud := &routesAudience{}
	srv := NewServer(DefaultConfig(), Wiring{Audience: aud}, nil, nil)
	r, _ := apply(t, registry.New(), shard("east", echo, []registry.ServicePort{tcp("grpc", 8080)},
		ep("10.0.0.1", loc("r1", "z1"), ready, eport("grpc", 9090))))
	srv.Update(r, registry.Diff{})
	node := &core.Node{Id: "router", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"ROLE": structpb.NewStringValue("router")}}}
	v, member := srv.viewFor(node)
	if !member || v == nil {
		t.Fatal("the router is not served its group")
	}
	if v2, _ := srv.viewFor(nodeAt(loc("r1", "z1"), "")); v2 != nil {
		t.Fatal("a plain client was put in the routers' group")
	}
	names := func() []string {
		srv.stateMu.Lock()
		defer srv.stateMu.Unlock()
		var out []string
		for name := range v.cds.published {
			out = append(out, name)
		}
		return out
	}
	if got := names(); len(got) != 1 || got[0] != ClusterName(echo, 8080) {
		t.Fatalf("the group's clusters: %v", got)
	}
	// A new service while the audience builds a broken set: nothing of it is published.
	aud.broken.Store(true)
	other := registry.ServiceKey{Namespace: "default", Name: "other"}
	r2, d := apply(t, r, shard("east", other, []registry.ServicePort{tcp("grpc", 8080)}, ep("10.0.0.2", loc("r1", "z1"), ready, eport("grpc", 9090))))
	srv.Update(r2, d)
	if got := names(); len(got) != 1 {
		t.Errorf("after an invalid set the group publishes %v, want its last good set", got)
	}
	// Fixed: the new service arrives.
	aud.broken.Store(false)
	srv.SetNetworks(registry.Networks{Clusters: map[registry.ClusterID]registry.Network{"east": "n1"}}) // rebuilds groups
	if got := names(); len(got) != 2 {
		t.Errorf("once valid again the group publishes %v, want both services' clusters", got)
	}
}
