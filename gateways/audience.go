package gateways

import (
	"log/slog"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// Audience serves gateways (xds.Audience): it tells a gateway node by its
// metadata and builds its group's resources.
type Audience struct {
	// def is what an ingress gateway that names no exposure exposes.
	def Exposure
	log *slog.Logger

	mu sync.Mutex
	// nodes holds the node of each group key it has classified.
	nodes map[string]Node
	// warned holds the IDs of gateways whose invalid metadata was logged
	// (bounded: beyond it, no more are logged).
	warned map[string]bool
}

// NewAudience returns the gateway audience; def is what ingress gateways
// that name no exposure in their metadata expose (the zero Exposure:
// nothing).
func NewAudience(def Exposure, log *slog.Logger) *Audience {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Audience{def: def, log: log.With("component", "gateways"), nodes: map[string]Node{}, warned: map[string]bool{}}
}

var _ xds.Audience = (*Audience)(nil)

// invalidKey is the group of gateways whose metadata cannot be read: they
// are served nothing.
const invalidKey = "invalid"

// Classify implements xds.Audience.
func (a *Audience) Classify(node *core.Node) (string, xds.Client, bool) {
	n, ok, err := ParseNode(node, a.def)
	if !ok {
		return "", xds.Client{}, false
	}
	if err != nil {
		a.mu.Lock()
		if !a.warned[node.GetId()] && len(a.warned) < xds.MaxAudienceGroups {
			a.warned[node.GetId()] = true
			a.log.Warn("gateway metadata is invalid; serving it nothing", "node", node.GetId(), "err", err)
		}
		a.mu.Unlock()
		return invalidKey, n.Client(), true
	}
	key := n.Key()
	a.mu.Lock()
	if _, known := a.nodes[key]; !known && len(a.nodes) < 4*xds.MaxAudienceGroups {
		a.nodes[key] = n
	}
	a.mu.Unlock()
	return key, n.Client(), true
}

// Build implements xds.Audience.
func (a *Audience) Build(key string, r *registry.Registry, _ registry.Networks) xds.Resources {
	a.mu.Lock()
	n, ok := a.nodes[key]
	a.mu.Unlock()
	if !ok || key == invalidKey {
		return xds.Resources{}
	}
	switch n.Role {
	case RoleEastWest:
		return EastWest(r)
	case RoleIngress:
		return Ingress(r, n)
	}
	return xds.Resources{}
}
