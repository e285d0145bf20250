package spoke

import (
	"cmp"
	"log/slog"
	"slices"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/internal/kubeclient"
	"github.com/navemesh/nave/registry"
)

// A cluster announces the east-west gateways of its network: those given by
// --network-gateway, and every Service of its source (a cluster's, or a
// directory's manifests) labelled NetworkGatewayLabel with the cluster's
// network as its value (its load balancer's IPs or hostnames, or its
// external IPs, at the gateway port).
const (
	NetworkGatewayLabel = "topology.nave.io/network-gateway"
	// NetworkGatewayPortAnnotation names the gateway Service's port (a name
	// or a number) that clients on other networks are handed. Without it,
	// the port numbered DefaultGatewayPort, else the Service's first TCP port.
	NetworkGatewayPortAnnotation = "topology.nave.io/network-gateway-port"
	// DefaultGatewayPort is the gateway's HTTP/2 port, which plaintext gRPC
	// clients on other networks reach (routed by :authority).
	DefaultGatewayPort = 15444
)

// serviceGateways returns the gateways a gateway Service offers, or why it offers none.
func serviceGateways(svc *corev1.Service) ([]registry.Gateway, string) {
	port, problem := gatewayPort(svc)
	if problem != "" {
		return nil, problem
	}
	var hosts []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			hosts = append(hosts, in.IP)
		} else if in.Hostname != "" {
			hosts = append(hosts, in.Hostname)
		}
	}
	hosts = append(hosts, svc.Spec.ExternalIPs...)
	if len(hosts) == 0 {
		return nil, "no load-balancer ingress or external IP yet"
	}
	var out []registry.Gateway
	for _, h := range hosts {
		g := registry.Gateway{Address: h, Port: port}
		if err := g.Validate(); err != nil {
			return nil, err.Error()
		}
		out = append(out, g)
	}
	return out, ""
}

// gatewayPort is the port of a gateway Service that clients are handed.
func gatewayPort(svc *corev1.Service) (int32, string) {
	tcp := func(p corev1.ServicePort) bool { return p.Protocol == "" || p.Protocol == corev1.ProtocolTCP }
	if want, ok := svc.Annotations[NetworkGatewayPortAnnotation]; ok {
		n, err := strconv.ParseInt(want, 10, 32)
		for _, p := range svc.Spec.Ports {
			if tcp(p) && (p.Name == want || err == nil && p.Port == int32(n)) {
				return p.Port, ""
			}
		}
		return 0, "annotation " + NetworkGatewayPortAnnotation + "=" + want + " names no TCP port of the Service"
	}
	for _, p := range svc.Spec.Ports {
		if tcp(p) && p.Port == DefaultGatewayPort {
			return p.Port, ""
		}
	}
	for _, p := range svc.Spec.Ports {
		if tcp(p) {
			return p.Port, ""
		}
	}
	return 0, "the Service has no TCP port"
}

// isGatewayService reports whether obj is a Service labelled as a network gateway.
func isGatewayService(obj any) bool {
	svc, ok := kubeclient.Tombstone(obj).(*corev1.Service)
	return ok && svc.Labels[NetworkGatewayLabel] != ""
}

// gatewayServices turns a source's Services labelled as gateways into the
// gateways its network announces, and tells them, when they change, to the
// function a source's OnGateways set. A kube source and a directory source
// each hold one; it is safe for concurrent use.
type gatewayServices struct {
	log     *slog.Logger
	mu      sync.Mutex
	network registry.Network
	tell    func([]registry.Gateway) // nil: nobody
	last    []registry.Gateway
	told    bool
}

// set replaces who is told (nil: nobody) and for which network; the next
// offer is told whatever it holds.
func (g *gatewayServices) set(network registry.Network, f func([]registry.Gateway)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.network, g.tell, g.last, g.told = network, f, nil, false
}

// offer tells the gateways that the Services labelled for the network
// among svcs offer, unless they were told already. list returns the
// Services labelled for a network.
func (g *gatewayServices) offer(list func(registry.Network) []*corev1.Service) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tell == nil {
		return
	}
	svcs := list(g.network)
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	var gws []registry.Gateway
	for _, svc := range svcs {
		offered, problem := serviceGateways(svc)
		if problem != "" {
			g.log.Info("gateway Service offers no gateway", "service", svc.Namespace+"/"+svc.Name, "network", g.network, "reason", problem)
			continue
		}
		gws = append(gws, offered...)
	}
	gws, err := registry.NormalizeGateways(gws)
	if err != nil {
		g.log.Warn("gateway Services offer too many gateways; announcing none of them", "err", err)
		gws = nil
	}
	if g.told && slices.Equal(gws, g.last) {
		return
	}
	g.last, g.told = gws, true
	g.log.Info("network gateways", "network", g.network, "gateways", gws)
	g.tell(gws)
}

// OnGateways makes the source tell f the gateways that the Services
// labelled for network offer, now (once its caches have synced) and
// whenever they change, until the next call replaces f (nil: nobody). f
// must not block.
func (k *KubeSource) OnGateways(network registry.Network, f func([]registry.Gateway)) {
	k.gateways.set(network, f)
	k.gatewaysChanged()
}

// gatewaysChanged tells the OnGateways callback the gateways, when they changed.
func (k *KubeSource) gatewaysChanged() {
	select {
	case <-k.synced:
	default:
		return // told once the caches have synced
	}
	k.gateways.offer(func(network registry.Network) []*corev1.Service {
		list, _ := k.services.List(labels.SelectorFromSet(labels.Set{NetworkGatewayLabel: string(network)}))
		return list
	})
}

// gatewaySource is a source whose Services may announce gateways.
type gatewaySource interface {
	OnGateways(network registry.Network, f func([]registry.Gateway))
}

// announceGateways makes pub announce the network's gateways: the configured
// ones, and those the source's gateway Services offer (a kube source's once
// its caches have synced, a directory source's once it has read its
// manifests; until then the hub keeps what it holds). It returns what stops
// the announcements.
func announceGateways(cfg Config, src Source, pub *federation.Publisher, log *slog.Logger) (stop func()) {
	set := func(found []registry.Gateway) {
		if err := pub.SetGateways(append(slices.Clone(cfg.NetworkGateways), found...)); err != nil {
			log.Warn("cannot announce the network's gateways", "err", err)
		}
	}
	gs, ok := src.(gatewaySource)
	if !ok || cfg.Network == "" {
		set(nil)
		return func() {}
	}
	gs.OnGateways(cfg.Network, set)
	return func() { gs.OnGateways("", nil) }
}
