package registry

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
)

// Gateway is an address at which a network's endpoints can be reached from
// other networks: an east-west gateway a cluster announces for its network.
// Address is an IP address or a DNS name (a cloud load balancer's hostname).
type Gateway struct {
	Address string `json:"address"`
	Port    int32  `json:"port"`
}

// String renders the gateway as host:port.
func (g Gateway) String() string { return net.JoinHostPort(g.Address, strconv.Itoa(int(g.Port))) }

// IP returns the gateway's address when it is an IP address.
func (g Gateway) IP() (netip.Addr, bool) {
	a, err := netip.ParseAddr(g.Address)
	return a.Unmap(), err == nil && a.Zone() == ""
}

// Compare orders gateways by address, then port.
func (g Gateway) Compare(o Gateway) int {
	return cmp.Or(cmp.Compare(g.Address, o.Address), cmp.Compare(g.Port, o.Port))
}

// MaxGateways bounds how many gateways one cluster may announce.
const MaxGateways = 64

// ParseGateway parses "host:port", where host is an IP address or a DNS name.
func ParseGateway(s string) (Gateway, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return Gateway{}, fmt.Errorf("%w: gateway %s is not host:port: %v", ErrInvalid, quoted(s), err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return Gateway{}, fmt.Errorf("%w: gateway %s: port %s is not a number from 1 to 65535", ErrInvalid, quoted(s), quoted(port))
	}
	g := Gateway{Address: host, Port: int32(n)}
	if a, ok := g.IP(); ok {
		g.Address = a.String() // one spelling per address
	}
	return g, g.Validate()
}

// Validate checks the address (a unicast IP address without zone, as
// endpoints' are, or a DNS name) and the port (1 to 65535).
func (g Gateway) Validate() error {
	if len(g.Address) > 253 { // not quoted: a peer's megabytes would travel on in the error
		return fmt.Errorf("%w: gateway address of %d bytes is neither an IP address nor a DNS name", ErrInvalid, len(g.Address))
	}
	if g.Port < 1 || g.Port > 65535 {
		return fmt.Errorf("%w: gateway %s: port %d is not from 1 to 65535", ErrInvalid, g, g.Port)
	}
	if a, err := netip.ParseAddr(g.Address); err == nil {
		if !Unicast(a) {
			return fmt.Errorf("%w: gateway address %s cannot be dialled from another network", ErrInvalid, quoted(g.Address))
		}
		return nil
	}
	if len(g.Address) == 0 || !dnsSubdomain(g.Address) {
		return fmt.Errorf("%w: gateway address %s is neither an IP address nor a DNS name", ErrInvalid, quoted(g.Address))
	}
	return nil
}

// NormalizeGateways validates gateways and returns them sorted and without
// duplicates; nil when there are none.
func NormalizeGateways(gws []Gateway) ([]Gateway, error) {
	if len(gws) > MaxGateways {
		return nil, fmt.Errorf("%w: %d gateways; at most %d", ErrInvalid, len(gws), MaxGateways)
	}
	if len(gws) == 0 {
		return nil, nil
	}
	out := make([]Gateway, 0, len(gws))
	for _, g := range gws {
		if a, ok := g.IP(); ok {
			g.Address = a.String()
		}
		if err := g.Validate(); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	slices.SortFunc(out, Gateway.Compare)
	return slices.Compact(out), nil
}

// Networks is the network topology: the network of each cluster that names
// one, and the gateways announced for each network (sorted, without
// duplicates). Immutable once built.
type Networks struct {
	Clusters map[ClusterID]Network
	Gateways map[Network][]Gateway
}

// Equal reports whether two topologies say the same thing.
func (n Networks) Equal(o Networks) bool {
	return maps.Equal(n.Clusters, o.Clusters) && maps.EqualFunc(n.Gateways, o.Gateways, slices.Equal)
}
