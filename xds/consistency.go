package xds

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/proto"
)

// Resources are the listeners, routes and clusters a node is served.
type Resources struct {
	Listeners []*listener.Listener
	Routes    []*route.RouteConfiguration
	Clusters  []*cluster.Cluster
}

// CheckConsistent is Nave's own check of a resource set, beyond what each
// resource's validation sees, for what Envoy rejects or silently drops:
//   - names are unique within each type; no two listeners bind one address;
//   - every route configuration a listener's HTTP connection manager names
//     (RDS) exists, and every cluster a route or a TCP proxy names exists;
//   - every EDS cluster's assignment exists (assignments names them);
//   - within a listener, no two filter chains have the same match (Envoy
//     refuses the listener), and within a route configuration no two
//     virtual hosts claim one domain (Envoy refuses the configuration).
func CheckConsistent(res Resources, assignments func(name string) bool) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidResource}, args...)...))
	}
	clusters := map[string]bool{}
	for _, c := range res.Clusters {
		if clusters[c.GetName()] {
			bad("cluster %q appears twice", c.GetName())
		}
		clusters[c.GetName()] = true
		if c.GetType() == cluster.Cluster_EDS {
			name := c.GetEdsClusterConfig().GetServiceName()
			if name == "" {
				name = c.GetName()
			}
			if assignments != nil && !assignments(name) {
				bad("cluster %q: no endpoint assignment %q", c.GetName(), name)
			}
		}
	}
	needCluster := func(where, name string) {
		if !clusters[name] {
			bad("%s names cluster %q, which does not exist", where, name)
		}
	}
	routes := map[string]bool{}
	for _, rc := range res.Routes {
		if routes[rc.GetName()] {
			bad("route configuration %q appears twice", rc.GetName())
		}
		routes[rc.GetName()] = true
		domains := map[string]string{}
		for _, vh := range rc.GetVirtualHosts() {
			for _, d := range vh.GetDomains() {
				if other, ok := domains[d]; ok {
					bad("route configuration %q: domain %q is claimed by virtual hosts %q and %q", rc.GetName(), d, other, vh.GetName())
				}
				domains[d] = vh.GetName()
			}
			for _, r := range vh.GetRoutes() {
				if c := r.GetRoute().GetCluster(); c != "" {
					needCluster(fmt.Sprintf("route configuration %q, virtual host %q", rc.GetName(), vh.GetName()), c)
				}
			}
		}
	}
	listeners, addresses := map[string]bool{}, map[string]string{}
	for _, l := range res.Listeners {
		if listeners[l.GetName()] {
			bad("listener %q appears twice", l.GetName())
		}
		listeners[l.GetName()] = true
		if sa := l.GetAddress().GetSocketAddress(); sa != nil {
			at := addressKey(sa.GetAddress(), sa.GetPortValue())
			if other, ok := addresses[at]; ok {
				bad("listeners %q and %q both bind %s", other, l.GetName(), at)
			}
			addresses[at] = l.GetName()
		}
		matches := map[string]int{}
		for i, fc := range l.GetFilterChains() {
			key, err := proto.MarshalOptions{Deterministic: true}.Marshal(fc.GetFilterChainMatch())
			if err != nil {
				bad("listener %q: filter chain %d: %v", l.GetName(), i, err)
				continue
			}
			if j, ok := matches[string(key)]; ok {
				bad("listener %q: filter chains %d and %d have the same match %v", l.GetName(), j, i, fc.GetFilterChainMatch())
			}
			matches[string(key)] = i
			for _, f := range fc.GetFilters() {
				where := fmt.Sprintf("listener %q, filter chain %d", l.GetName(), i)
				switch cfg := unpackFilter(f).(type) {
				case *hcm.HttpConnectionManager:
					if rds := cfg.GetRds(); rds != nil && !routes[rds.GetRouteConfigName()] {
						bad("%s names route configuration %q, which does not exist", where, rds.GetRouteConfigName())
					}
				case *tcpproxy.TcpProxy:
					needCluster(where, cfg.GetCluster())
				}
			}
		}
	}
	return errors.Join(errs...)
}

// unpackFilter returns a network filter's typed config, or nil.
func unpackFilter(f *listener.Filter) proto.Message {
	a := f.GetTypedConfig()
	if a == nil {
		return nil
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return nil // ValidateDeep reports it
	}
	return m
}

func addressKey(addr string, port uint32) string {
	if a, err := netip.ParseAddr(addr); err == nil {
		return netip.AddrPortFrom(a, uint16(port)).String()
	}
	return addr + ":" + strconv.Itoa(int(port))
}
