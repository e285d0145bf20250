// Package gateways builds the Envoy configuration Nave serves to gateways:
// an east-west gateway's TLS-passthrough and HTTP/2 listeners into its
// network, and an ingress gateway's listeners for the services it exposes.
// A gateway is an Envoy node whose metadata names its role, network and
// what it exposes (see Node); its endpoints follow its locality like any
// client's.
package gateways

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/navemesh/nave/internal/xdstype"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// The node metadata a gateway sets (the agent, `nave gateway`, writes them
// into Envoy's bootstrap).
const (
	// MetadataRole is the gateway's role: RoleEastWest or RoleIngress.
	MetadataRole = xdstype.MetadataGateway
	// MetadataNetwork and MetadataCluster are the gateway's network and
	// cluster (as any client names them: xds.MetadataNetwork, xds.MetadataCluster).
	MetadataNetwork = xds.MetadataNetwork
	MetadataCluster = xds.MetadataCluster
	// MetadataExposeNamespaces (ingress) is a comma-separated list of the
	// namespaces whose services the gateway exposes ("*": every namespace).
	MetadataExposeNamespaces = "NAVE_EXPOSE_NAMESPACES"
	// MetadataExposeSelector (ingress) is a label selector ("k=v,k2=v2")
	// the exposed services' exported labels must match.
	MetadataExposeSelector = "NAVE_EXPOSE_SELECTOR"
	// MetadataListeners (ingress) lists the gateway's listeners, comma
	// separated, each PORT/MODE where MODE is http (plaintext HTTP/1.1 and
	// HTTP/2), https:SECRET (TLS terminated with the certificate that the
	// SDS secret SECRET holds) or passthrough (TLS routed by SNI to the
	// service it names, untouched). Default: 8080/http.
	MetadataListeners = "NAVE_INGRESS_LISTENERS"
)

// Roles a gateway can have.
const (
	RoleEastWest = "east-west"
	RoleIngress  = "ingress"
)

// Default ports of an east-west gateway's listeners.
const (
	// EastWestTLSPort takes TLS from other networks and routes it by SNI
	// (outbound_.PORT_._.HOSTNAME, Istio's convention) without terminating it.
	EastWestTLSPort = 15443
	// EastWestHTTP2Port takes plaintext HTTP/2 (gRPC) from other networks and
	// routes it by :authority (HOSTNAME:PORT).
	EastWestHTTP2Port = 15444
)

// Node is a gateway as its metadata describes it.
type Node struct {
	Role     string
	Network  registry.Network
	Cluster  registry.ClusterID
	Locality registry.Locality
	// Expose selects the services an ingress gateway exposes.
	Expose Exposure
	// Listeners are an ingress gateway's listeners.
	Listeners []Listener
}

// Exposure selects services: those of the namespaces named ("*": any)
// whose exported labels carry every label of Selector. The zero Exposure
// selects nothing.
type Exposure struct {
	Namespaces []string          `json:"namespaces,omitempty"`
	Selector   map[string]string `json:"selector,omitempty"`
}

// Selects reports whether the exposure selects svc.
func (e Exposure) Selects(svc *registry.Service) bool {
	if !slices.Contains(e.Namespaces, "*") && !slices.Contains(e.Namespaces, svc.Key.Namespace) {
		return false
	}
	for k, v := range e.Selector {
		if got, ok := svc.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// IsZero reports whether the exposure selects nothing.
func (e Exposure) IsZero() bool { return len(e.Namespaces) == 0 }

// Listener modes of an ingress gateway.
const (
	ModeHTTP        = "http"
	ModeHTTPS       = "https"
	ModePassthrough = "passthrough"
)

// Listener is one of an ingress gateway's listeners.
type Listener struct {
	Port uint32
	Mode string
	// Secret names the SDS secret holding the certificate (ModeHTTPS).
	Secret string
}

// DefaultIngressListeners is what an ingress gateway listens on when its metadata names nothing.
var DefaultIngressListeners = []Listener{{Port: 8080, Mode: ModeHTTP}}

// ParseNode reads a node's metadata: ok is false for a node that is no
// gateway (no MetadataRole); err says what is wrong with a gateway's.
// An ingress gateway that names no exposure takes def.
func ParseNode(node *core.Node, def Exposure) (n Node, ok bool, err error) {
	fields := node.GetMetadata().GetFields()
	str := func(k string) string { return strings.TrimSpace(fields[k].GetStringValue()) }
	role, isGateway := fields[MetadataRole]
	if !isGateway {
		return Node{}, false, nil
	}
	l := node.GetLocality()
	n = Node{Role: role.GetStringValue(), Network: registry.Network(str(MetadataNetwork)), Cluster: registry.ClusterID(str(MetadataCluster)),
		Locality: registry.Locality{Region: l.GetRegion(), Zone: l.GetZone()}}
	switch n.Role {
	case RoleEastWest:
		if n.Network == "" {
			return n, true, fmt.Errorf("an east-west gateway must name its network (%s)", MetadataNetwork)
		}
		return n, true, nil
	case RoleIngress:
	default:
		return n, true, fmt.Errorf("%s is %q: want %q or %q", MetadataRole, n.Role, RoleEastWest, RoleIngress)
	}
	n.Expose = def
	if ns := str(MetadataExposeNamespaces); ns != "" {
		n.Expose = Exposure{Namespaces: splitList(ns)}
		if n.Expose.Selector, err = ParseSelector(str(MetadataExposeSelector)); err != nil {
			return n, true, err
		}
	} else if str(MetadataExposeSelector) != "" {
		return n, true, fmt.Errorf("%s needs %s: a selector alone would widen the hub's default exposure", MetadataExposeSelector, MetadataExposeNamespaces)
	}
	n.Listeners = DefaultIngressListeners
	if ls := str(MetadataListeners); ls != "" {
		if n.Listeners, err = ParseListeners(ls); err != nil {
			return n, true, err
		}
	}
	return n, true, nil
}

// ParseSelector parses "k=v,k2=v2" ("": selects everything).
func ParseSelector(s string) (map[string]string, error) {
	var out map[string]string
	for _, item := range splitList(s) {
		k, v, ok := strings.Cut(item, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("selector %q: %q is not key=value", s, item)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// ParseListeners parses "PORT/MODE[:SECRET],..." (see MetadataListeners).
func ParseListeners(s string) ([]Listener, error) {
	var out []Listener
	seen := map[uint32]bool{}
	for _, item := range splitList(s) {
		port, mode, ok := strings.Cut(item, "/")
		n, err := strconv.ParseUint(port, 10, 16)
		if !ok || err != nil || n == 0 {
			return nil, fmt.Errorf("listener %q: want PORT/MODE with a port from 1 to 65535", item)
		}
		l := Listener{Port: uint32(n)}
		l.Mode, l.Secret, _ = strings.Cut(mode, ":")
		switch {
		case l.Mode == ModeHTTPS && l.Secret == "":
			return nil, fmt.Errorf("listener %q: https needs the SDS secret of its certificate: %d/https:SECRET", item, n)
		case l.Mode == ModeHTTPS:
		case (l.Mode == ModeHTTP || l.Mode == ModePassthrough) && l.Secret == "":
		default:
			return nil, fmt.Errorf("listener %q: mode %q: want http, https:SECRET or passthrough", item, mode)
		}
		if seen[l.Port] {
			return nil, fmt.Errorf("listener %q: port %d is listed twice", item, n)
		}
		seen[l.Port] = true
		out = append(out, l)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("listeners %q: none", s)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Key names the group of gateways that are served the same resources: the
// same role, network, locality group, exposure and listeners.
func (n Node) Key() string {
	b, _ := json.Marshal(struct {
		Network   registry.Network
		Region    string
		Zone      string
		Expose    Exposure
		Listeners []Listener
	}{n.Network, n.Locality.Region, n.Locality.Zone, n.Expose, n.Listeners})
	sum := sha256.Sum256(b)
	return fmt.Sprintf("%s/%s/%x", n.Role, n.Network, sum[:6])
}

// Client is whom the gateway's endpoints are computed for: an east-west
// gateway is handed its own network's endpoints only, an ingress gateway
// every network's as any client on its network is.
func (n Node) Client() xds.Client {
	return xds.Client{Network: n.Network, Locality: registry.Locality{Region: n.Locality.Region, Zone: n.Locality.Zone},
		NetworkOnly: n.Role == RoleEastWest, Cluster: n.Cluster}
}
