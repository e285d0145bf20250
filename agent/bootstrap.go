package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	metrics "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/navemesh/nave/gateways"
	"github.com/navemesh/nave/xds"
)

// The bootstrap's static clusters.
const (
	// XDSCluster reaches the hub's xDS server; Envoy's ADS stream runs over it.
	XDSCluster = "nave-xds"
	// SDSCluster reaches the agent's SDS server on a unix socket (the name
	// the gateways package's ingress listeners fetch their certificates from).
	SDSCluster = gateways.SDSCluster
)

// Extension names of what the bootstrap puts in Any fields (each type is
// linked in by its import above, so ValidateDeep can unpack it).
const (
	httpProtocolOptionsName = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	tlsTransportSocketName  = "envoy.transport_sockets.tls"
)

// ErrInvalidConfig is returned (wrapped) for an agent configuration that
// cannot make a gateway; the message says which setting is wrong.
var ErrInvalidConfig = errors.New("agent: invalid configuration")

// Node is who the gateway is: its Envoy's bootstrap node, whose metadata
// tells the hub what to serve it (gateways.ParseNode reads it).
type Node struct {
	// ID names this Envoy (the agent defaults it to the host name: a pod's name).
	ID string
	// Cluster is Envoy's node cluster (default "nave-ROLE-gateway").
	Cluster string
	// Role is gateways.RoleEastWest or gateways.RoleIngress.
	Role string
	// Network is the gateway's network (required for east-west); ClusterID
	// its Kubernetes cluster as the spokes name it.
	Network, ClusterID string
	// Region, Zone and SubZone are the gateway's locality: the hub hands
	// it the nearest endpoints first, as it does any client.
	Region, Zone, SubZone string
	// ExposeNamespaces, ExposeSelector and Listeners (ingress only) become
	// the metadata gateways.MetadataExposeNamespaces, MetadataExposeSelector
	// and MetadataListeners; empty ones are left out, and the hub's defaults apply.
	ExposeNamespaces, ExposeSelector, Listeners string
}

// Hub is how Envoy reaches the hub's xDS server.
type Hub struct {
	// Addr is the xDS server's host:port. An IP address makes a STATIC
	// cluster, a name a STRICT_DNS one (every address it resolves to).
	Addr string
	// CAFile (PEM) makes Envoy connect over TLS and verify the hub's
	// certificate against it; empty connects in plaintext.
	CAFile string
	// CertFile and KeyFile (PEM) are Envoy's client certificate (mutual TLS).
	CertFile, KeyFile string
	// ServerName is the SNI sent and the name the hub's certificate must
	// carry (default: the host of Addr).
	ServerName string
}

// Files are the TLS files the bootstrap names: Envoy reads them when it
// starts, so a change needs a (hot) restart.
func (h Hub) Files() []string {
	var out []string
	for _, f := range []string{h.CAFile, h.CertFile, h.KeyFile} {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// BootstrapConfig is what Envoy's bootstrap is made of.
type BootstrapConfig struct {
	Node Node
	Hub  Hub
	// AdminPort is Envoy's admin port, always on 127.0.0.1: the admin API
	// can stop Envoy and must never be reachable from outside the pod.
	AdminPort int
	// SDSSocket is the path of the unix socket of the agent's SDS server.
	SDSSocket string
}

// maxUnixSocketPath is the longest path a unix socket can have on Linux
// (sun_path is 108 bytes with the terminating NUL).
const maxUnixSocketPath = 107

// Bootstrap builds Envoy's bootstrap for the gateway cfg describes: its node
// (id, cluster, locality, metadata), ADS to the hub through XDSCluster for
// listeners and clusters, SDSCluster to the agent's SDS socket, and the admin
// API on 127.0.0.1. The result is validated deep (every Any unpacked) and
// its node is checked to be a gateway the hub accepts.
func Bootstrap(cfg BootstrapConfig) (*bootstrap.Bootstrap, error) {
	hub, err := cfg.check()
	if err != nil {
		return nil, err
	}
	n, err := node(cfg.Node)
	if err != nil {
		return nil, err
	}
	b := &bootstrap.Bootstrap{
		Node: n,
		StaticResources: &bootstrap.Bootstrap_StaticResources{
			Clusters: []*cluster.Cluster{xdsCluster(cfg.Hub, hub), sdsCluster(cfg.SDSSocket)},
		},
		DynamicResources: &bootstrap.Bootstrap_DynamicResources{
			AdsConfig: &core.ApiConfigSource{
				ApiType:             core.ApiConfigSource_GRPC,
				TransportApiVersion: core.ApiVersion_V3,
				GrpcServices:        []*core.GrpcService{envoyGrpc(XDSCluster)},
				// The hub reads the node from the first request of a stream.
				SetNodeOnFirstMessageOnly: true,
			},
			// Wait for listeners and clusters however long it takes (0: no
			// timeout): an Envoy that cannot reach the hub never turns LIVE
			// empty, so a hot-restarted one never takes over from a serving
			// parent without configuration (the supervisor gives up on it).
			LdsConfig: waitingForever(adsSource()),
			CdsConfig: waitingForever(adsSource()),
		},
		Admin: &bootstrap.Admin{Address: socketAddress("127.0.0.1", uint32(cfg.AdminPort))},
		// Envoy's default tags (cluster_name, listener_address, ...) turn
		// stat names into labelled Prometheus metrics at /stats/prometheus.
		StatsConfig: &metrics.StatsConfig{UseAllDefaultTags: wrapperspb.Bool(true)},
	}
	if err := xds.ValidateDeep(b); err != nil {
		return nil, fmt.Errorf("%w: the bootstrap does not validate: %v", ErrInvalidConfig, err)
	}
	if _, ok, err := gateways.ParseNode(b.GetNode(), gateways.Exposure{}); !ok || err != nil {
		return nil, fmt.Errorf("%w: the hub would refuse this gateway's node metadata: %v", ErrInvalidConfig, err)
	}
	return b, nil
}

// hubAddr is the hub's address, split.
type hubAddr struct {
	host string
	port uint32
	ip   bool
}

// check says what is wrong with cfg, in terms of the flags of `nave gateway`.
func (cfg BootstrapConfig) check() (hubAddr, error) {
	bad := func(format string, args ...any) (hubAddr, error) {
		return hubAddr{}, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	n := cfg.Node
	switch n.Role {
	case gateways.RoleEastWest:
		if n.Network == "" {
			return bad("an east-west gateway needs its network (--network): it is the way into that network")
		}
		if n.ExposeNamespaces != "" || n.ExposeSelector != "" || n.Listeners != "" {
			return bad("--expose-namespaces, --expose-selector and --listeners are for ingress gateways; an east-west gateway's listeners are fixed (%d and %d)",
				gateways.EastWestTLSPort, gateways.EastWestHTTP2Port)
		}
	case gateways.RoleIngress:
		if _, err := gateways.ParseSelector(n.ExposeSelector); err != nil {
			return bad("--expose-selector: %v", err)
		}
		if n.ExposeSelector != "" && n.ExposeNamespaces == "" {
			return bad("--expose-selector needs --expose-namespaces (\"*\" for every namespace)")
		}
		if n.Listeners != "" {
			if _, err := gateways.ParseListeners(n.Listeners); err != nil {
				return bad("--listeners: %v", err)
			}
		}
	case "":
		return bad("the gateway's role is required (--role %s or %s)", gateways.RoleEastWest, gateways.RoleIngress)
	default:
		return bad("role %q: want %s or %s", n.Role, gateways.RoleEastWest, gateways.RoleIngress)
	}
	if n.ID == "" {
		return bad("the node ID is empty (--node-id; it defaults to the host name)")
	}
	if cfg.Hub.Addr == "" {
		return bad("the hub's xDS address is empty (--hub host:port)")
	}
	host, port, err := net.SplitHostPort(cfg.Hub.Addr)
	p, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || host == "" || perr != nil || p == 0 {
		return bad("hub address %q: want host:port with a port from 1 to 65535 (--hub)", cfg.Hub.Addr)
	}
	h := cfg.Hub
	if (h.CertFile == "") != (h.KeyFile == "") {
		return bad("--hub-cert and --hub-key go together: a client certificate needs its key")
	}
	if h.CertFile != "" && h.CAFile == "" {
		return bad("--hub-cert needs --hub-ca: Envoy must verify the hub it presents its certificate to")
	}
	if cfg.AdminPort < 1 || cfg.AdminPort > 65535 {
		return bad("Envoy's admin port %d: want 1 to 65535 (--envoy-admin-port)", cfg.AdminPort)
	}
	switch {
	case cfg.SDSSocket == "":
		return bad("the SDS socket path is empty")
	case len(cfg.SDSSocket) > maxUnixSocketPath:
		return bad("SDS socket path %q is longer than a unix socket path can be (%d bytes): use a shorter --work-dir", cfg.SDSSocket, maxUnixSocketPath)
	}
	_, ipErr := netip.ParseAddr(host)
	return hubAddr{host: host, port: uint32(p), ip: ipErr == nil}, nil
}

// node is the bootstrap's node: the metadata gateways.ParseNode reads.
func node(n Node) (*core.Node, error) {
	md := map[string]any{gateways.MetadataRole: n.Role}
	for k, v := range map[string]string{
		gateways.MetadataNetwork:          n.Network,
		gateways.MetadataCluster:          n.ClusterID,
		gateways.MetadataExposeNamespaces: n.ExposeNamespaces,
		gateways.MetadataExposeSelector:   n.ExposeSelector,
		gateways.MetadataListeners:        n.Listeners,
	} {
		if v != "" {
			md[k] = v
		}
	}
	meta, err := structpb.NewStruct(md)
	if err != nil {
		return nil, fmt.Errorf("%w: node metadata: %v", ErrInvalidConfig, err)
	}
	out := &core.Node{Id: n.ID, Cluster: n.Cluster, Metadata: meta}
	if out.Cluster == "" {
		out.Cluster = "nave-" + n.Role + "-gateway"
	}
	if n.Region != "" || n.Zone != "" || n.SubZone != "" {
		out.Locality = &core.Locality{Region: n.Region, Zone: n.Zone, SubZone: n.SubZone}
	}
	return out, nil
}

// xdsCluster reaches the hub over HTTP/2, with TLS when the hub has a CA.
func xdsCluster(h Hub, addr hubAddr) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:           XDSCluster,
		ConnectTimeout: durationpb.New(5 * time.Second),
		LoadAssignment: &endpoint.ClusterLoadAssignment{
			ClusterName: XDSCluster,
			Endpoints:   []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{lbEndpoint(socketAddress(addr.host, addr.port))}}},
		},
		// Keepalive pings find a dead connection (a hub replica gone without
		// a FIN) long before TCP would; Envoy then reconnects, to another replica.
		TypedExtensionProtocolOptions: map[string]*anypb.Any{httpProtocolOptionsName: mustAny(http2Options(&core.KeepaliveSettings{
			Interval: durationpb.New(30 * time.Second),
			Timeout:  durationpb.New(10 * time.Second),
		}))},
	}
	if addr.ip {
		c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_STATIC}
	} else {
		c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_STRICT_DNS}
		c.DnsLookupFamily = cluster.Cluster_V4_PREFERRED
	}
	if h.CAFile != "" {
		c.TransportSocket = &core.TransportSocket{
			Name:       tlsTransportSocketName,
			ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(upstreamTLS(h, addr))},
		}
	}
	return c
}

// upstreamTLS verifies the hub's certificate: signed by the CA and naming
// the server name (SNI alone would check nothing).
func upstreamTLS(h Hub, addr hubAddr) *tlsv3.UpstreamTlsContext {
	name := h.ServerName
	if name == "" {
		name = addr.host
	}
	san := &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_DNS, Matcher: exact(name)}
	_, ipErr := netip.ParseAddr(name)
	if ipErr == nil {
		san.SanType = tlsv3.SubjectAltNameMatcher_IP_ADDRESS
	}
	ctx := &tlsv3.UpstreamTlsContext{
		CommonTlsContext: &tlsv3.CommonTlsContext{
			// gRPC servers refuse TLS clients that do not offer h2.
			AlpnProtocols: []string{"h2"},
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa:                 fileSource(h.CAFile),
				MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{san},
			}},
		},
	}
	if ipErr != nil {
		ctx.Sni = name // SNI carries host names only
	}
	if h.CertFile != "" {
		ctx.CommonTlsContext.TlsCertificates = []*tlsv3.TlsCertificate{{
			CertificateChain: fileSource(h.CertFile),
			PrivateKey:       fileSource(h.KeyFile),
		}}
	}
	return ctx
}

// sdsCluster reaches the agent's SDS server on its unix socket, over HTTP/2.
func sdsCluster(socket string) *cluster.Cluster {
	pipe := &core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: socket}}}
	return &cluster.Cluster{
		Name:                 SDSCluster,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(time.Second),
		LoadAssignment: &endpoint.ClusterLoadAssignment{
			ClusterName: SDSCluster,
			Endpoints:   []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{lbEndpoint(pipe)}}},
		},
		TypedExtensionProtocolOptions: map[string]*anypb.Any{httpProtocolOptionsName: mustAny(http2Options(nil))},
	}
}

func http2Options(keepalive *core.KeepaliveSettings) *httpv3.HttpProtocolOptions {
	return &httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
				Http2ProtocolOptions: &core.Http2ProtocolOptions{ConnectionKeepalive: keepalive},
			},
		},
	}}
}

func envoyGrpc(clusterName string) *core.GrpcService {
	return &core.GrpcService{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
		EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: clusterName},
	}}
}

func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
		ResourceApiVersion:    core.ApiVersion_V3,
	}
}

func socketAddress(host string, port uint32) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Protocol:      core.SocketAddress_TCP,
		Address:       host,
		PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
	}}}
}

func lbEndpoint(a *core.Address) *endpoint.LbEndpoint {
	return &endpoint.LbEndpoint{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: a}}}
}

func fileSource(name string) *core.DataSource {
	return &core.DataSource{Specifier: &core.DataSource_Filename{Filename: name}}
}

func exact(s string) *matcher.StringMatcher {
	return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: s}}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("agent: pack %T: %v", m, err)) // only for messages of linked-in types: cannot fail
	}
	return a
}

// MarshalBootstrap renders a bootstrap as Envoy reads it: proto3 JSON,
// indented, keys sorted (protojson's spacing varies between runs; this
// does not, so equal bootstraps have equal bytes).
func MarshalBootstrap(b *bootstrap.Bootstrap) ([]byte, error) {
	raw, err := protojson.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("marshal bootstrap: %w", err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("marshal bootstrap: %w", err)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal bootstrap: %w", err)
	}
	return append(out, '\n'), nil
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory and a rename, so a reader (Envoy starting) never sees half of it.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// waitingForever makes a config source wait for its first answer without a
// timeout (Envoy's default is 15s, after which it initializes without it).
func waitingForever(cs *core.ConfigSource) *core.ConfigSource {
	cs.InitialFetchTimeout = durationpb.New(0)
	return cs
}
