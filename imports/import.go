// Package imports is the MCS import side as a pure computation: from the
// merged registry it computes what every member cluster must hold for the
// Kubernetes Multi-Cluster Services API (KEP-1645): the ServiceImport, the
// imported EndpointSlices, the derived Service's name, and the rules for
// allocating clusterset IPs.
//
// Everything here is data in, value out: no Kubernetes types, no I/O, no
// goroutines. The hub sends an Import to the spokes; a spoke's Kubernetes
// writer turns it into objects. Values returned by this package share
// memory with the registry values they came from and must not be changed.
package imports

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/navemesh/nave/registry"
)

// Import is one service as every member cluster must hold it. KEP-1645
// gives every cluster the same import, so one Import serves them all.
type Import struct {
	Service registry.ServiceKey
	// Headless is the ServiceImport type: Headless, or ClusterSetIP when false.
	Headless bool
	// Ports are the merged ports (the union of the exports, conflicts
	// resolved), sorted by number and protocol.
	Ports []registry.ServicePort
	// IPs are the clusterset IPs, one per IP family in the order of
	// Properties.IPFamilies; always empty for a Headless import.
	IPs []netip.Addr
	// Properties are the merged properties the import mirrors.
	Properties registry.Properties
	// Sources are the exporting clusters that serve at least one of Ports
	// (or declare none, for a Headless import), sorted by cluster ID.
	Sources []Source
}

// Source is what one exporting cluster contributes to an import: the
// endpoints of its imported EndpointSlices.
type Source struct {
	Cluster registry.ClusterID
	// Stale is set while the cluster's spoke is gone; its endpoints are kept
	// (fail-static) until the hub drops the cluster's shards.
	Stale bool
	// Ports are the import's ports this cluster serves (those of
	// Import.Ports whose number and protocol the cluster's own Service
	// declares), named and typed as the import names them; sorted like
	// Import.Ports. They give the slices' port names, protocols and
	// appProtocols.
	//
	// The import's names, not the cluster's own: kube-proxy matches an
	// EndpointSlice port to the derived Service's port by name, and the
	// derived Service has the import's ports. A cluster that lost a port
	// conflict (same number, another name) still serves the port, so its
	// endpoints are listed under the winning name; a port of the cluster
	// that is not in the import at all is not served.
	Ports []registry.ServicePort
	// Endpoints are sorted by their first address (IPv4 before IPv6).
	Endpoints []Endpoint
}

// Endpoint is what an imported EndpointSlice endpoint carries.
//
// The node name and pod reference are deliberately left out: they name
// objects of the exporting cluster, which do not exist (or, worse, are
// other objects of the same name) in the importing cluster, and consumers
// such as kube-proxy and topology-aware routing would act on them.
type Endpoint struct {
	// Addresses are of one IP family (an EndpointSlice has one address
	// type), sorted; the first identifies the endpoint within its source.
	Addresses []netip.Addr
	// Ports are the endpoint's target ports, keyed by the name of the
	// import's port they serve (see Source.Ports), sorted by name.
	Ports []registry.EndpointPort
	// Hostname is the endpoint's hostname (headless DNS names a pod by it).
	Hostname string
	// Zone is the endpoint's zone (the registry locality's zone).
	Zone string
	// Conditions are the endpoint's ready, serving and terminating conditions.
	Conditions registry.Conditions
}

// Family is the endpoint's IP family ("" for an endpoint with no address).
func (e *Endpoint) Family() registry.IPFamily {
	if len(e.Addresses) == 0 {
		return ""
	}
	return familyOf(e.Addresses[0])
}

// Equal reports whether two endpoints say the same thing.
func (e *Endpoint) Equal(o *Endpoint) bool {
	return slices.Equal(e.Addresses, o.Addresses) && slices.Equal(e.Ports, o.Ports) &&
		e.Hostname == o.Hostname && e.Zone == o.Zone && e.Conditions == o.Conditions
}

// Skipped is an address left out of an import, for the hub or the spoke to
// report. The Kubernetes API server refuses such addresses in EndpointSlices
// (and they would mean the importing cluster's own host anyway).
type Skipped struct {
	Cluster registry.ClusterID
	Address netip.Addr
	Reason  SkipReason
}

// SkipReason says why an address was left out; the values are short and
// fixed, fit for a metric label.
type SkipReason string

// The reasons an address is left out of an import.
const (
	SkipInvalid     SkipReason = "invalid"     // not an IP address
	SkipScoped      SkipReason = "scoped"      // carries an IPv6 zone
	SkipUnspecified SkipReason = "unspecified" // 0.0.0.0 or ::
	SkipLoopback    SkipReason = "loopback"    // 127.0.0.0/8 or ::1
	SkipLinkLocal   SkipReason = "link-local"  // 169.254.0.0/16 or fe80::/10
	SkipMulticast   SkipReason = "multicast"   // 224.0.0.0/4 or ff00::/8 (the API server refuses link-local ones; none is an endpoint)
	SkipDuplicate   SkipReason = "duplicate"   // another endpoint of the cluster has it first
)

// skipReason returns why a (unmapped) address cannot be imported, or "".
func skipReason(a netip.Addr) SkipReason {
	switch {
	case !a.IsValid():
		return SkipInvalid
	case a.Zone() != "":
		return SkipScoped
	case a.IsUnspecified():
		return SkipUnspecified
	case a.IsLoopback():
		return SkipLoopback
	case a.IsLinkLocalUnicast():
		return SkipLinkLocal
	case a.IsMulticast():
		return SkipMulticast
	}
	return ""
}

// Wanted reports whether a cluster must hold the import of key. The
// KEP-1645 rule: every cluster that has the service's namespace imports it,
// the exporting clusters included (they have the namespace by definition).
// hasNamespace answers for the one cluster being asked about.
func Wanted(key registry.ServiceKey, hasNamespace func(namespace string) bool) bool {
	return hasNamespace(key.Namespace)
}

// Build computes the import of a merged service: ips are the service's
// allocated clusterset IPs, stale tells which clusters are stale (nil: none).
// It returns nil when the service has no exporting cluster left (KEP-1645:
// the import goes with the last export).
//
// For a ClusterSetIP import Build keeps, for each of the service's IP
// families in order, the first of ips of that family (when the service
// states no families, the first of each family in the order given); a
// Headless import has none. IPv4-mapped IPv6 addresses count as IPv4.
//
// Each exporting cluster becomes a Source, except one that serves none of
// the import's ports (all of its ports lost a conflict; a cluster declaring
// no ports is kept only in a Headless import): it has nothing to serve, and
// the winners' endpoints flow on without it. A source's endpoints are split
// by IP family; addresses the API server would refuse are left out and
// returned as Skipped, and an endpoint left with no address is dropped.
// Endpoints that serve none of the cluster's ports are dropped from a ClusterSetIP
// import (nothing could reach them) but kept for a Headless one (headless
// DNS names pods, whatever their ports). Equal services give equal imports,
// whatever the order of their shards, ports, endpoints and addresses.
func Build(svc *registry.Service, stale func(registry.ClusterID) bool, ips []netip.Addr) (*Import, []Skipped) {
	if svc == nil || len(svc.Shards) == 0 {
		return nil, nil
	}
	imp := &Import{
		Service:    svc.Key,
		Headless:   svc.Headless,
		Ports:      sortedPorts(svc.Ports),
		Properties: svc.Properties,
	}
	if !imp.Headless {
		imp.IPs = pickIPs(ips, svc.IPFamilies)
	}
	shards := svc.Shards
	if !slices.IsSortedFunc(shards, compareShards) {
		shards = slices.Clone(shards)
		slices.SortFunc(shards, compareShards)
	}
	imp.Sources = make([]Source, 0, len(shards))
	var skipped []Skipped
	for _, sh := range shards {
		if !servesAny(imp, sh) && (len(sh.Ports) > 0 || !imp.Headless) {
			// Every port of the cluster lost a conflict (another
			// protocol or number under a name the import gives another
			// port), or a port-less headless export lost the type to a
			// ClusterSetIP one: the cluster contributes nothing, and a
			// ClusterSetIP source with no ports is one spokes refuse.
			continue
		}
		src := buildSource(imp, sh, &skipped)
		if stale != nil {
			src.Stale = stale(sh.Cluster)
		}
		imp.Sources = append(imp.Sources, src)
	}
	slices.SortFunc(skipped, func(a, b Skipped) int {
		return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), a.Address.Compare(b.Address), cmp.Compare(a.Reason, b.Reason))
	})
	return imp, skipped
}

func compareShards(a, b *registry.Shard) int { return cmp.Compare(a.Cluster, b.Cluster) }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// comparePorts is the registry's merged order: number, protocol, then the
// rest so that the order is total.
func comparePorts(a, b registry.ServicePort) int {
	return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol),
		cmp.Compare(a.Name, b.Name), cmp.Compare(a.AppProtocol, b.AppProtocol))
}

func sortedPorts(ps []registry.ServicePort) []registry.ServicePort {
	if slices.IsSortedFunc(ps, comparePorts) {
		return ps
	}
	ps = slices.Clone(ps)
	slices.SortFunc(ps, comparePorts)
	return ps
}

// pickIPs keeps one IP per family, in the order of families (or of ips).
func pickIPs(ips []netip.Addr, families []registry.IPFamily) []netip.Addr {
	first := func(f registry.IPFamily) (netip.Addr, bool) {
		for _, ip := range ips {
			if ip = ip.Unmap(); ip.IsValid() && familyOf(ip) == f {
				return ip, true
			}
		}
		return netip.Addr{}, false
	}
	if len(families) == 0 {
		for _, ip := range ips {
			if ip = ip.Unmap(); ip.IsValid() && !slices.Contains(families, familyOf(ip)) {
				families = append(families, familyOf(ip))
			}
		}
	}
	var out []netip.Addr
	for _, f := range families {
		if ip, ok := first(f); ok {
			out = append(out, ip)
		}
	}
	return out
}

func familyOf(a netip.Addr) registry.IPFamily {
	if a.Is4() {
		return registry.IPv4
	}
	return registry.IPv6
}

// servesAny reports whether the cluster's shard declares any of the import's
// ports (by number and protocol).
func servesAny(imp *Import, sh *registry.Shard) bool {
	for _, p := range imp.Ports {
		if _, ok := sh.Port(p.Port, p.Protocol); ok {
			return true
		}
	}
	return false
}

// servedPort is one of the import's ports and the name the source cluster gives it.
type servedPort struct {
	port registry.ServicePort
	own  string
}

func buildSource(imp *Import, sh *registry.Shard, skipped *[]Skipped) Source {
	src := Source{Cluster: sh.Cluster}
	var served []servedPort
	for _, p := range imp.Ports {
		if own, ok := sh.Port(p.Port, p.Protocol); ok {
			served = append(served, servedPort{port: p, own: own.Name})
			src.Ports = append(src.Ports, p)
		}
	}
	src.Endpoints = make([]Endpoint, 0, len(sh.Endpoints))
	var scratch, lastPorts []registry.EndpointPort
	for i := range sh.Endpoints {
		e := &sh.Endpoints[i]
		ports := endpointPorts(e, served, &scratch, lastPorts)
		if len(ports) == 0 && !imp.Headless {
			continue
		}
		lastPorts = ports
		v4, v6 := splitAddresses(sh.Cluster, e.Addresses, skipped)
		for _, addrs := range [][]netip.Addr{v4, v6} {
			if len(addrs) > 0 {
				src.Endpoints = append(src.Endpoints, Endpoint{
					Addresses: addrs, Ports: ports, Hostname: e.Hostname, Zone: e.Locality.Zone, Conditions: e.Conditions,
				})
			}
		}
	}
	slices.SortFunc(src.Endpoints, compareEndpoints)
	// The registry allows an address once per shard; should two endpoints
	// still share a first address, the one sorting first keeps it and the
	// other is dropped, so that an endpoint's first address identifies it
	// within its source (Slices relies on that).
	kept := src.Endpoints[:0]
	for _, e := range src.Endpoints {
		if len(kept) > 0 && e.Addresses[0] == kept[len(kept)-1].Addresses[0] {
			for _, a := range e.Addresses {
				*skipped = append(*skipped, Skipped{Cluster: sh.Cluster, Address: a, Reason: SkipDuplicate})
			}
			continue
		}
		kept = append(kept, e)
	}
	src.Endpoints = kept
	return src
}

// endpointPorts lists the target ports of e for the served ports, under the
// import's names, sorted by name. It builds the list in *scratch and returns
// last when equal to it, so that endpoints with the same ports share one list.
func endpointPorts(e *registry.Endpoint, served []servedPort, scratch *[]registry.EndpointPort, last []registry.EndpointPort) []registry.EndpointPort {
	buf := (*scratch)[:0]
	for _, sp := range served {
		if target, ok := e.PortNumber(sp.own); ok {
			buf = append(buf, registry.EndpointPort{Name: sp.port.Name, Port: target})
		}
	}
	slices.SortFunc(buf, compareEndpointPorts)
	*scratch = buf
	switch {
	case len(buf) == 0:
		return nil
	case slices.Equal(buf, last):
		return last
	}
	return slices.Clone(buf)
}

func compareEndpointPorts(a, b registry.EndpointPort) int {
	return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port))
}

// splitAddresses returns an endpoint's importable addresses by family,
// unmapped and sorted, reporting the others. The registry's own list is
// returned as is when it already is all that.
func splitAddresses(cluster registry.ClusterID, addrs []netip.Addr, skipped *[]Skipped) (v4, v6 []netip.Addr) {
	clean := slices.IsSortedFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		if a.Is4In6() || skipReason(a) != "" {
			clean = false
			break
		}
	}
	if clean && len(addrs) > 0 && familyOf(addrs[0]) == familyOf(addrs[len(addrs)-1]) {
		// Sorted, so the first and last share a family only if all do.
		if addrs[0].Is4() {
			return addrs, nil
		}
		return nil, addrs
	}
	for _, a := range addrs {
		a = a.Unmap()
		if r := skipReason(a); r != "" {
			*skipped = append(*skipped, Skipped{Cluster: cluster, Address: a, Reason: r})
			continue
		}
		if a.Is4() {
			if !slices.Contains(v4, a) {
				v4 = append(v4, a)
			}
		} else if !slices.Contains(v6, a) {
			v6 = append(v6, a)
		}
	}
	slices.SortFunc(v4, netip.Addr.Compare)
	slices.SortFunc(v6, netip.Addr.Compare)
	return v4, v6
}

// compareEndpoints orders endpoints by address, then everything else, so
// that the order is total and sorting is deterministic.
func compareEndpoints(a, b Endpoint) int {
	if c := slices.CompareFunc(a.Addresses, b.Addresses, netip.Addr.Compare); c != 0 {
		return c
	}
	if c := slices.CompareFunc(a.Ports, b.Ports, compareEndpointPorts); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(a.Hostname, b.Hostname), cmp.Compare(a.Zone, b.Zone),
		cmp.Compare(boolInt(a.Conditions.Ready), boolInt(b.Conditions.Ready)),
		cmp.Compare(boolInt(a.Conditions.Serving), boolInt(b.Conditions.Serving)),
		cmp.Compare(boolInt(a.Conditions.Terminating), boolInt(b.Conditions.Terminating)))
}
