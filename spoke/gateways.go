package spoke

import (
	"cmp"
	"log/slog"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// A cluster announces the east-west gateways of its network: those given by
// --network-gateway, and, from a kube source, every Service labelled
// NetworkGatewayLabel with the cluster's network as its value (its load
// balancer's IPs or hostnames, or its external IPs, at the gateway port).
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
	svc, ok := tombstone(obj).(*corev1.Service)
	return ok && svc.Labels[NetworkGatewayLabel] != ""
}

// OnGateways makes the source tell f the gateways that the Services
// labelled for network offer, now (once its caches have synced) and
// whenever they change, until the next call replaces f (nil: nobody). f
// must not block.
func (k *KubeSource) OnGateways(network registry.Network, f func([]registry.Gateway)) {
	k.gwMu.Lock()
	k.gwNetwork, k.onGateways, k.gwLast, k.gwTold = network, f, nil, false
	k.gwMu.Unlock()
	k.gatewaysChanged()
}

// gatewaysChanged tells the OnGateways callback the gateways, when they changed.
func (k *KubeSource) gatewaysChanged() {
	select {
	case <-k.synced:
	default:
		return // told once the caches have synced
	}
	k.gwMu.Lock()
	defer k.gwMu.Unlock()
	if k.onGateways == nil {
		return
	}
	sel := labels.SelectorFromSet(labels.Set{NetworkGatewayLabel: string(k.gwNetwork)})
	list, _ := k.services.List(sel)
	slices.SortFunc(list, func(a, b *corev1.Service) int {
		return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	var gws []registry.Gateway
	for _, svc := range list {
		offered, problem := serviceGateways(svc)
		if problem != "" {
			k.log.Info("gateway Service offers no gateway", "service", svc.Namespace+"/"+svc.Name, "network", k.gwNetwork, "reason", problem)
			continue
		}
		gws = append(gws, offered...)
	}
	gws, err := registry.NormalizeGateways(gws)
	if err != nil {
		k.log.Warn("gateway Services offer too many gateways; announcing none of them", "err", err)
		gws = nil
	}
	if k.gwTold && slices.Equal(gws, k.gwLast) {
		return
	}
	k.gwLast, k.gwTold = gws, true
	k.log.Info("network gateways", "network", k.gwNetwork, "gateways", gws)
	k.onGateways(gws)
}

// announceGateways makes pub announce the network's gateways: the configured
// ones, and with a kube source those its gateway Services offer (known once
// its caches have synced; until then the hub keeps what it holds).
func announceGateways(cfg Config, kube *KubeSource, pub *federation.Publisher, log *slog.Logger) {
	set := func(found []registry.Gateway) {
		if err := pub.SetGateways(append(slices.Clone(cfg.NetworkGateways), found...)); err != nil {
			log.Warn("cannot announce the network's gateways", "err", err)
		}
	}
	if kube == nil || cfg.Network == "" {
		set(nil)
		return
	}
	kube.OnGateways(cfg.Network, set)
}
