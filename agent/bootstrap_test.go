package agent

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/navemesh/nave/gateways"
	goldenfile "github.com/navemesh/nave/internal/golden"
	"github.com/navemesh/nave/xds"
)

// eastWest is the east-west gateway of the golden file: TLS to the hub with
// a client certificate.
func eastWest() BootstrapConfig {
	return BootstrapConfig{
		Node: Node{ID: "eastwest-7d9f-abcde", Role: gateways.RoleEastWest, Network: "net-a", ClusterID: "east",
			Region: "us-east", Zone: "us-east-1a", SubZone: "rack-1"},
		Hub: Hub{Addr: "nave-hub.nave-system.svc:15011", CAFile: "/etc/nave/hub/ca.crt",
			CertFile: "/etc/nave/hub/tls.crt", KeyFile: "/etc/nave/hub/tls.key"},
		AdminPort: 15000,
		SDSSocket: "/var/run/nave-gateway/sds.sock",
	}
}

func ingress() BootstrapConfig {
	return BootstrapConfig{
		Node: Node{ID: "ingress-1", Role: gateways.RoleIngress, Network: "net-b", ClusterID: "west", Region: "us-west", Zone: "us-west-1a",
			ExposeNamespaces: "shop,*", ExposeSelector: "tier=public", Listeners: "8080/http,8443/https:shop-cert,9443/passthrough"},
		Hub:       Hub{Addr: "10.0.0.7:15011"},
		AdminPort: 15123,
		SDSSocket: "/tmp/sds.sock",
	}
}

func TestBootstrapValidatesForBothRoles(t *testing.T) {
	for name, cfg := range map[string]BootstrapConfig{"east-west": eastWest(), "ingress": ingress()} {
		t.Run(name, func(t *testing.T) {
			b, err := Bootstrap(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// Validated again here, and through the JSON Envoy reads: what is written is what was validated.
			raw, err := MarshalBootstrap(b)
			if err != nil {
				t.Fatal(err)
			}
			var back bootstrap.Bootstrap
			if err := protojson.Unmarshal(raw, &back); err != nil {
				t.Fatalf("the JSON does not read back: %v", err)
			}
			if err := xds.ValidateDeep(&back); err != nil {
				t.Fatalf("ValidateDeep: %v", err)
			}

			admin := back.GetAdmin().GetAddress().GetSocketAddress()
			if admin.GetAddress() != "127.0.0.1" || admin.GetPortValue() != uint32(cfg.AdminPort) {
				t.Errorf("admin on %s:%d, want 127.0.0.1:%d", admin.GetAddress(), admin.GetPortValue(), cfg.AdminPort)
			}

			// The hub must read the node as the gateway it is.
			n, ok, err := gateways.ParseNode(back.GetNode(), gateways.Exposure{})
			if !ok || err != nil {
				t.Fatalf("gateways.ParseNode: ok=%v err=%v", ok, err)
			}
			if n.Role != cfg.Node.Role || string(n.Network) != cfg.Node.Network || string(n.Cluster) != cfg.Node.ClusterID ||
				n.Locality.Region != cfg.Node.Region || n.Locality.Zone != cfg.Node.Zone {
				t.Errorf("the hub reads %+v from the node, want role %s network %s cluster %s locality %s/%s",
					n, cfg.Node.Role, cfg.Node.Network, cfg.Node.ClusterID, cfg.Node.Region, cfg.Node.Zone)
			}
			if got := back.GetNode().GetLocality().GetSubZone(); got != cfg.Node.SubZone {
				t.Errorf("sub-zone %q, want %q", got, cfg.Node.SubZone)
			}
			if back.GetNode().GetId() != cfg.Node.ID || back.GetNode().GetCluster() != "nave-"+cfg.Node.Role+"-gateway" {
				t.Errorf("node id/cluster %q/%q", back.GetNode().GetId(), back.GetNode().GetCluster())
			}
			if cfg.Node.Role == gateways.RoleIngress {
				if len(n.Listeners) != 3 || n.Listeners[1].Secret != "shop-cert" || n.Expose.Selector["tier"] != "public" {
					t.Errorf("the hub reads listeners %+v, exposure %+v", n.Listeners, n.Expose)
				}
			}

			clusters := map[string]*cluster.Cluster{}
			for _, c := range back.GetStaticResources().GetClusters() {
				clusters[c.GetName()] = c
			}
			if clusters[XDSCluster] == nil || clusters[SDSCluster] == nil || len(clusters) != 2 {
				t.Fatalf("static clusters %v, want %s and %s", clusters, XDSCluster, SDSCluster)
			}
			pipe := clusters[SDSCluster].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe()
			if pipe.GetPath() != cfg.SDSSocket {
				t.Errorf("SDS cluster reaches %q, want the socket %q", pipe.GetPath(), cfg.SDSSocket)
			}
			ads := back.GetDynamicResources().GetAdsConfig()
			if ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != XDSCluster || back.GetDynamicResources().GetLdsConfig().GetAds() == nil ||
				back.GetDynamicResources().GetCdsConfig().GetAds() == nil {
				t.Errorf("dynamic resources %v: want LDS and CDS over ADS through %s", back.GetDynamicResources(), XDSCluster)
			}
		})
	}
}

func TestBootstrapHubConnection(t *testing.T) {
	b, err := Bootstrap(eastWest())
	if err != nil {
		t.Fatal(err)
	}
	xc := b.GetStaticResources().GetClusters()[0]
	if xc.GetType() != cluster.Cluster_STRICT_DNS {
		t.Errorf("a hub named by DNS: cluster type %v, want STRICT_DNS", xc.GetType())
	}
	var tc tlsv3.UpstreamTlsContext
	if err := xc.GetTransportSocket().GetTypedConfig().UnmarshalTo(&tc); err != nil {
		t.Fatal(err)
	}
	if tc.GetSni() != "nave-hub.nave-system.svc" {
		t.Errorf("SNI %q, want the hub's host", tc.GetSni())
	}
	vc := tc.GetCommonTlsContext().GetValidationContext()
	if vc.GetTrustedCa().GetFilename() != "/etc/nave/hub/ca.crt" || vc.GetMatchTypedSubjectAltNames()[0].GetMatcher().GetExact() != "nave-hub.nave-system.svc" {
		t.Errorf("validation context %v: want the CA file and the hub's name checked", vc)
	}
	if c := tc.GetCommonTlsContext().GetTlsCertificates(); len(c) != 1 || c[0].GetPrivateKey().GetFilename() != "/etc/nave/hub/tls.key" {
		t.Errorf("client certificate %v", c)
	}

	plain, err := Bootstrap(ingress())
	if err != nil {
		t.Fatal(err)
	}
	pc := plain.GetStaticResources().GetClusters()[0]
	if pc.GetType() != cluster.Cluster_STATIC || pc.GetTransportSocket() != nil {
		t.Errorf("a hub at an IP without a CA: type %v transport socket %v, want STATIC in plaintext", pc.GetType(), pc.GetTransportSocket())
	}
}

func TestBootstrapRefusesInvalidConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*BootstrapConfig)
		want string
	}{
		{"no hub address", func(c *BootstrapConfig) { c.Hub.Addr = "" }, "--hub"},
		{"hub without port", func(c *BootstrapConfig) { c.Hub.Addr = "nave-hub" }, "host:port"},
		{"hub port zero", func(c *BootstrapConfig) { c.Hub.Addr = "nave-hub:0" }, "host:port"},
		{"no role", func(c *BootstrapConfig) { c.Node.Role = "" }, "--role"},
		{"unknown role", func(c *BootstrapConfig) { c.Node.Role = "sidecar" }, `role "sidecar"`},
		{"east-west without network", func(c *BootstrapConfig) { c.Node.Network = "" }, "--network"},
		{"east-west with listeners", func(c *BootstrapConfig) { c.Node.Listeners = "8080/http" }, "ingress"},
		{"no node id", func(c *BootstrapConfig) { c.Node.ID = "" }, "--node-id"},
		{"cert without key", func(c *BootstrapConfig) { c.Hub.KeyFile = "" }, "--hub-key"},
		{"cert without CA", func(c *BootstrapConfig) { c.Hub.CAFile = "" }, "--hub-ca"},
		{"admin port", func(c *BootstrapConfig) { c.AdminPort = 0 }, "admin port"},
		{"long socket", func(c *BootstrapConfig) { c.SDSSocket = "/" + strings.Repeat("d", 120) + "/sds.sock" }, "--work-dir"},
		{"bad listeners", func(c *BootstrapConfig) {
			*c = ingress()
			c.Node.Listeners = "8443/https"
		}, "--listeners"},
		{"selector without namespaces", func(c *BootstrapConfig) {
			*c = ingress()
			c.Node.ExposeNamespaces = ""
		}, "--expose-namespaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := eastWest()
			tc.edit(&cfg)
			_, err := Bootstrap(cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Bootstrap = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

// TestBootstrapGolden compares the east-west bootstrap with
// testdata/eastwest-bootstrap.golden.json (rewritten with -update).
func TestBootstrapGolden(t *testing.T) {
	b, err := Bootstrap(eastWest())
	if err != nil {
		t.Fatal(err)
	}
	got, err := MarshalBootstrap(b)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := MarshalBootstrap(b)
	if !bytes.Equal(got, again) {
		t.Fatal("MarshalBootstrap is not stable")
	}
	goldenfile.Check(t, "eastwest-bootstrap.golden.json", got)
}
