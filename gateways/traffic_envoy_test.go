package gateways

import (
	"context"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ringhash "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	wrrlocality "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
	"github.com/navemesh/nave/xds"
)

// envoyLBError is what Envoy's ClusterInfoImpl::configureLbPolicies (and
// the wrr_locality factory's loadConfig) say of a cluster's load
// balancing, "" when Envoy takes it. Envoy takes the first policy whose
// extension it has registered and fails the cluster if that one's config
// does not load; it does not fall through to the next. Its wrr_locality
// (Envoy >= 1.37; 1.36, the image deploy/gateway runs, has none) takes
// only client_side_weighted_round_robin as its endpoint picking policy:
// "Currently WrrLocalityLoadBalancer only supports
// ClientSideWeightedRoundRobinLoadBalancer as its endpoint picking policy."
func envoyLBError(c *cluster.Cluster) string {
	lbp := c.GetLoadBalancingPolicy()
	if lbp == nil {
		return ""
	}
	if cl := c.GetCommonLbConfig(); cl.GetLocalityWeightedLbConfig() != nil || cl.GetZoneAwareLbConfig() != nil || cl.GetConsistentHashingLbConfig() != nil {
		return "load_balancing_policy cannot be combined with partial fields of common_lb_config"
	}
	known := map[string]bool{
		"envoy.load_balancing_policies.round_robin": true, "envoy.load_balancing_policies.least_request": true,
		"envoy.load_balancing_policies.random": true, "envoy.load_balancing_policies.ring_hash": true,
		"envoy.load_balancing_policies.maglev": true, "envoy.load_balancing_policies.client_side_weighted_round_robin": true,
		"envoy.load_balancing_policies.cluster_provided": true, "envoy.load_balancing_policies.subset": true,
		"envoy.load_balancing_policies.wrr_locality": true, // >= 1.37 only
	}
	for _, p := range lbp.GetPolicies() {
		name := p.GetTypedExtensionConfig().GetName()
		if !known[name] {
			continue
		}
		if name != "envoy.load_balancing_policies.wrr_locality" {
			return ""
		}
		var w wrrlocality.WrrLocality
		if err := p.GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&w); err != nil {
			return err.Error()
		}
		for _, child := range w.GetEndpointPickingPolicy().GetPolicies() {
			cn := child.GetTypedExtensionConfig().GetName()
			if !known[cn] {
				continue
			}
			if cn != "envoy.load_balancing_policies.client_side_weighted_round_robin" {
				return "Currently WrrLocalityLoadBalancer only supports ClientSideWeightedRoundRobinLoadBalancer as its endpoint picking policy (first known child: " + cn + ")"
			}
			return ""
		}
		return "No supported endpoint picking policy."
	}
	return "didn't find a registered load balancer factory implementation"
}

// Every gateway cluster must be one Envoy takes: a service whose policy
// asks for least request must not get wrr_locality{least_request,
// round_robin}, which Envoy refuses (1.36: no wrr_locality at all; >= 1.37:
// only CSWRR under it), making it unreachable through every gateway.
func TestGatewayClustersEnvoyTakes(t *testing.T) {
	r := trafficRegistry(t)
	n, ok, err := ParseNode(gatewayNode(RoleIngress, "net-a", map[string]string{
		MetadataExposeNamespaces: "default", MetadataExposeSelector: "public=true", MetadataListeners: "8080/http",
	}), Exposure{})
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	for kind, res := range map[string]xds.Resources{"ingress": Ingress(r, n), "east-west": EastWest(r)} {
		for _, c := range res.Clusters {
			if msg := envoyLBError(c); msg != "" {
				t.Errorf("%s gateway cluster %s: Envoy refuses it: %s", kind, c.GetName(), msg)
			}
		}
	}
}

// A ring-hash service's gateway cluster keeps the locality weighting the
// hub's assignments carry (Envoy's ring hash honours it: RingHash's
// locality_weighted_lb_config, or common_lb_config's under the legacy
// lb_policy; gRPC's ring hash multiplies locality and endpoint weights), so
// that "distribute" holds at the gateway too.
func TestGatewayRingHashKeepsLocalityWeights(t *testing.T) {
	r := trafficRegistry(t)
	for _, c := range EastWest(r).Clusters {
		if c.GetLbPolicy() != cluster.Cluster_RING_HASH {
			continue
		}
		weighted := c.GetCommonLbConfig().GetLocalityWeightedLbConfig() != nil && c.GetLoadBalancingPolicy() == nil
		for _, p := range c.GetLoadBalancingPolicy().GetPolicies() {
			var rh ringhash.RingHash
			if p.GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&rh) == nil && rh.GetLocalityWeightedLbConfig() != nil {
				weighted = true
			}
		}
		if !weighted {
			t.Errorf("gateway cluster %s (ring hash) lost locality weighting", c.GetName())
		}
	}
}

// One exposed service whose routes make a resource the server refuses is
// served as if it had none to proxyless clients (stageShape); an ingress
// gateway must not lose every other service with it (its whole view is
// refused: ValidateDeep / CheckConsistent fail on that one service).
func TestOneRefusedRouteDoesNotEmptyTheGateway(t *testing.T) {
	grpc := []registry.ServicePort{{Name: "grpc", Port: 8080, Protocol: registry.ProtocolTCP}}
	public := registry.Properties{Labels: map[string]string{"public": "true"}}
	other := registry.ServiceKey{Namespace: "default", Name: "other"}
	bad := shard("east", echo, public, grpc, "10.0.0.1")
	// An empty regular expression: Envoy's RegexMatcher needs min_len 1
	// (traffic.Validate refuses it now; anything it misses does the same).
	bad.Traffic = traffic.Set{Routes: []traffic.Route{{Kind: traffic.HTTPRoute, Name: "echo-http", Port: 8080, CreatedAt: time.Unix(1000, 0),
		Rules: []traffic.Rule{{Matches: []traffic.Match{{Path: &traffic.PathMatch{Type: traffic.RegularExpression, Value: ""}}},
			Backends: []traffic.Backend{{Kind: traffic.BackendServiceImport, Name: "ghost", Weight: 1}}}}}}}
	bad.Normalize()
	r := registry.New()
	for _, s := range []*registry.Shard{bad, shard("east", other, public, grpc, "10.0.0.2")} {
		r, _ = r.Apply(registry.Change{Cluster: s.Cluster, Upserts: []*registry.Shard{s}})
	}
	_, ads := serve(t, r, registry.Networks{Clusters: map[registry.ClusterID]registry.Network{"east": "net-a"}})
	node := gatewayNode(RoleIngress, "net-a", map[string]string{
		MetadataExposeNamespaces: "default", MetadataExposeSelector: "public=true", MetadataListeners: "8080/http",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.RouteType, ResourceNames: []string{ListenerName(8080)}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("the ingress gateway got no route configuration at all: %v", err)
	}
	var hosts []string
	for _, a := range resp.GetResources() {
		var rc route.RouteConfiguration
		if err := a.UnmarshalTo(&rc); err != nil {
			t.Fatal(err)
		}
		for _, vh := range rc.GetVirtualHosts() {
			hosts = append(hosts, vh.GetName())
		}
	}
	found := false
	for _, h := range hosts {
		found = found || h == other.String()
	}
	if !found {
		t.Errorf("ingress gateway virtual hosts %v: %s lost with echo's refused routes", hosts, other)
	}
}
