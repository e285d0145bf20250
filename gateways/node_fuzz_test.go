package gateways

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// FuzzParseNode: a gateway's node as it reaches the hub. A node without a
// role is no gateway; a gateway whose metadata parses has a known role, an
// east-west one a network, an ingress one valid listeners; its group key
// and client do not depend on what the node's identity says; the audience
// puts it in that group (a gateway whose metadata does not parse, in the
// group served nothing); and the resources its group is built are valid
// and consistent, for any exposure and listeners it names.
func FuzzParseNode(f *testing.F) {
	for _, n := range []*core.Node{
		gatewayNode(RoleEastWest, "net-a", nil),
		gatewayNode(RoleIngress, "net-a", map[string]string{
			MetadataExposeNamespaces: "default,shop", MetadataExposeSelector: "public=true",
			MetadataListeners: "8080/http,8443/https:ingress-cert,9443/passthrough",
		}),
		gatewayNode(RoleIngress, "", map[string]string{MetadataExposeNamespaces: "*", MetadataCluster: "west"}),
		gatewayNode(RoleIngress, "net-b", map[string]string{MetadataExposeSelector: "public=true"}), // a selector alone
		gatewayNode(RoleIngress, "net-b", map[string]string{MetadataListeners: "80/http,80/passthrough"}),
		gatewayNode(RoleEastWest, "", nil),
		gatewayNode("egress", "net-a", nil),
		{Id: "sidecar", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{MetadataNetwork: structpb.NewStringValue("net-a")}}},
	} {
		b, err := proto.Marshal(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	r := goldenRegistry(f)
	def := Exposure{Namespaces: []string{"default"}}

	f.Fuzz(func(t *testing.T, b []byte) {
		var node core.Node
		if err := proto.Unmarshal(b, &node); err != nil {
			return
		}
		n, ok, err := ParseNode(&node, def)
		_, hasRole := node.GetMetadata().GetFields()[MetadataRole]
		if ok != hasRole || !ok && err != nil {
			t.Fatalf("node with role %v: gateway %v, %v", hasRole, ok, err)
		}
		key, client, isGateway := NewAudience(def, nil).Classify(&node)
		if isGateway != ok {
			t.Fatalf("the audience says gateway %v, ParseNode %v", isGateway, ok)
		}
		if !ok {
			return
		}
		if err != nil {
			if key != invalidKey {
				t.Fatalf("a gateway whose metadata is invalid (%v) is in group %q", err, key)
			}
			return
		}
		if key != n.Key() || key == invalidKey || client != n.Client() {
			t.Fatalf("audience group %q, client %+v; node's %q, %+v", key, client, n.Key(), n.Client())
		}
		checkNode(t, n)

		// Identity, subzone and other metadata do not change the group.
		twin := proto.Clone(&node).(*core.Node)
		twin.Id, twin.Cluster = "twin", "other"
		if twin.Locality != nil {
			twin.Locality.SubZone += "-twin"
		}
		twin.Metadata.Fields["ISTIO_VERSION"] = structpb.NewStringValue("1.24.0")
		if tn, _, err := ParseNode(twin, def); err != nil || tn.Key() != n.Key() || tn.Client() != n.Client() {
			t.Fatalf("twin node: %+v, %v; want group %q", tn, err, n.Key())
		}

		var res xds.Resources
		if n.Role == RoleEastWest {
			res = EastWest(r)
		} else {
			res = Ingress(r, n)
		}
		check(t, r, res)
		if n.Role == RoleIngress {
			for _, l := range n.Listeners {
				if l.Mode != ModePassthrough && !slices.ContainsFunc(res.Listeners, func(li *listener.Listener) bool { return li.GetName() == ListenerName(l.Port) }) {
					t.Fatalf("no listener on port %d", l.Port)
				}
			}
		}
	})
}

// checkNode fails unless n is a gateway as its metadata may describe one.
func checkNode(t *testing.T, n Node) {
	t.Helper()
	switch n.Role {
	case RoleEastWest:
		if n.Network == "" {
			t.Fatal("an east-west gateway without a network")
		}
		if !n.Client().NetworkOnly {
			t.Fatal("an east-west gateway is handed other networks' endpoints")
		}
	case RoleIngress:
		if len(n.Listeners) == 0 {
			t.Fatal("an ingress gateway without listeners")
		}
		checkListeners(t, n.Listeners)
		checkSelector(t, n.Expose.Selector)
		if n.Client().NetworkOnly {
			t.Fatal("an ingress gateway is handed its own network's endpoints only")
		}
	default:
		t.Fatalf("role %q", n.Role)
	}
	if n.Locality.Subzone != "" {
		t.Fatalf("a gateway grouped by subzone %q", n.Locality.Subzone)
	}
}

// checkListeners fails unless every listener has a port, a mode, a secret
// exactly when it terminates TLS, and a port of its own.
func checkListeners(t *testing.T, ls []Listener) {
	t.Helper()
	ports := map[uint32]bool{}
	for _, l := range ls {
		if l.Port < 1 || l.Port > 65535 || ports[l.Port] {
			t.Fatalf("listener port %d: out of range or twice", l.Port)
		}
		ports[l.Port] = true
		switch {
		case l.Mode == ModeHTTPS && l.Secret != "":
		case (l.Mode == ModeHTTP || l.Mode == ModePassthrough) && l.Secret == "":
		default:
			t.Fatalf("listener %+v", l)
		}
	}
}

// checkSelector fails unless every key is non-empty and no key or value has spaces around it.
func checkSelector(t *testing.T, sel map[string]string) {
	t.Helper()
	for k, v := range sel {
		if k == "" || k != strings.TrimSpace(k) || v != strings.TrimSpace(v) || strings.Contains(k, ",") || strings.Contains(v, ",") {
			t.Fatalf("selector %q=%q", k, v)
		}
	}
}

// FuzzParseListeners: NAVE_INGRESS_LISTENERS. What parses is valid, and
// written back in its own syntax parses to the same listeners.
func FuzzParseListeners(f *testing.F) {
	for _, s := range []string{"8080/http", "8080/http,8443/https:ingress-cert,9443/passthrough", " 80/http , ,443/https:a:b ",
		"8443/https", "0/http", "80/http,80/passthrough", "65536/http", "80/tcp", "", ","} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ls, err := ParseListeners(s)
		if err != nil {
			return
		}
		if len(ls) == 0 {
			t.Fatal("no listeners and no error")
		}
		checkListeners(t, ls)
		items := make([]string, len(ls))
		for i, l := range ls {
			items[i] = fmt.Sprintf("%d/%s", l.Port, l.Mode)
			if l.Secret != "" {
				items[i] += ":" + l.Secret
			}
		}
		back, err := ParseListeners(strings.Join(items, ","))
		if err != nil || !slices.Equal(back, ls) {
			t.Fatalf("written back as %q: %+v, %v; want %+v", strings.Join(items, ","), back, err, ls)
		}
	})
}

// FuzzParseSelector: NAVE_EXPOSE_SELECTOR. What parses has trimmed,
// non-empty keys, and written back as k=v,... parses to the same selector.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"public=true", "public=true, tier = web ,", "a=b=c", "=x", "novalue", "", "k=", " , "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		checkSelector(t, sel)
		var items []string
		for _, k := range slices.Sorted(maps.Keys(sel)) {
			items = append(items, k+"="+sel[k])
		}
		back, err := ParseSelector(strings.Join(items, ","))
		if err != nil || !maps.Equal(back, sel) {
			t.Fatalf("written back as %q: %v, %v; want %v", strings.Join(items, ","), back, err, sel)
		}
		// The selector selects a service exactly when its labels carry it.
		svc := &registry.Service{Key: registry.ServiceKey{Namespace: "shop", Name: "web"}}
		svc.Labels = maps.Clone(sel)
		if !(Exposure{Namespaces: []string{"*"}, Selector: sel}).Selects(svc) {
			t.Fatalf("selector %v does not select a service labelled with it", sel)
		}
	})
}
