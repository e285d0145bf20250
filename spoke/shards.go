package spoke

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/navemesh/nave/importwriter"
	"github.com/navemesh/nave/registry"
)

// ExportLabel marks a Service for export when its value is "true".
const ExportLabel = "nave.io/export"

// Objects is what a source knows about a cluster.
type Objects struct {
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	Nodes          []*corev1.Node
}

// BuildOptions say how a cluster's objects become shards.
type BuildOptions struct {
	// Cluster is the ID every shard is stamped with.
	Cluster registry.ClusterID
	// DefaultRegion is the region of endpoints whose node carries no region label.
	DefaultRegion string
	// ExportAll exports every Service, not only those labelled ExportLabel=true.
	ExportAll bool
	// Limits bound each shard; the zero value means registry.DefaultLimits().
	Limits registry.Limits
}

// imported says whether an object is one the import writer made (a derived
// Service, an imported EndpointSlice): another cluster's service, never exported back.
func imported(o metav1.Object) bool {
	return o.GetLabels()[importwriter.ManagedByLabel] == importwriter.ManagedByValue
}

// sliceService is the key of the service an EndpointSlice belongs to.
func sliceService(es *discoveryv1.EndpointSlice) (registry.ServiceKey, bool) {
	name := es.Labels[discoveryv1.LabelServiceName]
	return registry.ServiceKey{Namespace: es.Namespace, Name: name}, name != "" && !imported(es)
}

// limits are the shard limits the options name, or the default ones.
func (opts BuildOptions) limits() registry.Limits {
	if opts.Limits == (registry.Limits{}) {
		return registry.DefaultLimits()
	}
	return opts.Limits
}

// BuildShards returns one normalized, validated shard per exported service.
// A service whose shard is invalid as a whole (its name, its ports, too many
// endpoints...) has no shard; invalid holds its error instead. errs reports
// what was left out of the services that were built: each endpoint that
// fails validation (the rest of its service is kept) and each second
// definition of a service. Every error is a *registry.ValidationError naming
// the service. The objects are not modified. Empty lists in the shards are
// empty slices, never nil, as federation decodes them on the hub.
func BuildShards(objs Objects, opts BuildOptions) (shards map[registry.ServiceKey]*registry.Shard, invalid map[registry.ServiceKey]error, errs []error) {
	lim := opts.limits()
	nodes := make(map[string]*corev1.Node, len(objs.Nodes))
	for _, n := range objs.Nodes {
		if n != nil {
			nodes[n.Name] = n
		}
	}
	slicesOf := map[registry.ServiceKey][]*discoveryv1.EndpointSlice{}
	for _, es := range objs.EndpointSlices {
		if es == nil {
			continue
		}
		if k, ok := sliceService(es); ok {
			slicesOf[k] = append(slicesOf[k], es)
		}
	}
	// Visit services and slices in a fixed order so that which duplicate wins never depends on input order.
	services := slices.DeleteFunc(slices.Clone(objs.Services), func(s *corev1.Service) bool { return s == nil })
	slices.SortStableFunc(services, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})

	shards = map[registry.ServiceKey]*registry.Shard{}
	invalid = map[registry.ServiceKey]error{}
	seen := map[registry.ServiceKey]bool{}
	for _, svc := range services {
		if !opts.ExportAll && svc.Labels[ExportLabel] != "true" || imported(svc) {
			continue
		}
		if svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		k := registry.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
		if seen[k] {
			// Even when the first is invalid: a later definition must not stand in for it.
			errs = append(errs, &registry.ValidationError{Service: k, Reason: "defined twice; kept the first"})
			continue
		}
		seen[k] = true
		shard, epErrs, err := serviceShard(k, svc, slicesOf[k], nodes, opts, lim)
		if err != nil {
			invalid[k] = err
			continue
		}
		errs = append(errs, epErrs...)
		shards[k] = shard
	}
	return shards, invalid, errs
}

// serviceShard is the normalized shard of service k, built from its Service
// and EndpointSlices (which it sorts by name) as BuildShards builds each,
// or why the service cannot be sent (err); epErrs are the endpoints left out.
func serviceShard(k registry.ServiceKey, svc *corev1.Service, eslices []*discoveryv1.EndpointSlice, nodes map[string]*corev1.Node,
	opts BuildOptions, lim registry.Limits) (shard *registry.Shard, epErrs []error, err error) {
	slices.SortFunc(eslices, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	shard, epErrs = buildShard(k, svc, eslices, nodes, opts, lim)
	shard.Normalize()
	if err := shard.Validate(lim); err != nil {
		return nil, nil, err
	}
	return shard, epErrs, nil
}

// buildShard builds a service's shard, leaving out (and reporting) each
// endpoint that is not valid on its own, so that one bad endpoint never costs
// the service its other endpoints.
func buildShard(k registry.ServiceKey, svc *corev1.Service, eslices []*discoveryv1.EndpointSlice, nodes map[string]*corev1.Node, opts BuildOptions, lim registry.Limits) (*registry.Shard, []error) {
	s := &registry.Shard{
		Cluster:    opts.Cluster,
		Service:    k,
		ExportedAt: svc.CreationTimestamp.Time,
		Headless:   svc.Spec.ClusterIP == corev1.ClusterIPNone,
		Ports:      make([]registry.ServicePort, 0, len(svc.Spec.Ports)),
		Endpoints:  []registry.Endpoint{},
		Properties: properties(&svc.Spec),
	}
	for _, p := range svc.Spec.Ports {
		sp := registry.ServicePort{Name: p.Name, Port: p.Port, Protocol: registry.Protocol(p.Protocol)}
		if sp.Protocol == "" {
			sp.Protocol = registry.ProtocolTCP
		}
		if p.AppProtocol != nil {
			sp.AppProtocol = *p.AppProtocol
		}
		s.Ports = append(s.Ports, sp)
	}

	var errs []error
	var eps endpointSet
	for _, es := range eslices {
		var family func(netip.Addr) bool
		switch es.AddressType {
		case discoveryv1.AddressTypeIPv4:
			family = netip.Addr.Is4
		case discoveryv1.AddressTypeIPv6:
			// Kubernetes does not take IPv4-mapped addresses as IPv6 either; they would alias IPv4 ones.
			family = func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }
		default:
			continue // FQDN (deprecated) and anything newer name no IP we can hand out
		}
		ports := make([]registry.EndpointPort, 0, len(es.Ports))
		for _, p := range es.Ports {
			if p.Port == nil {
				continue // "all ports": nothing a proxy can dial
			}
			ep := registry.EndpointPort{Port: *p.Port}
			if p.Name != nil {
				ep.Name = *p.Name
			}
			ports = append(ports, ep)
		}
		ports = slices.Clip(ports) // the slice's endpoints share it; nothing appends to it
		for i, e := range es.Endpoints {
			leftOut := func(format string, args ...any) {
				errs = append(errs, &registry.ValidationError{Service: k, Reason: fmt.Sprintf(
					"endpointslice %s, endpoint %d left out: %s", es.Name, i, fmt.Sprintf(format, args...))})
			}
			re := registry.Endpoint{
				Addresses:  make([]netip.Addr, 0, len(e.Addresses)),
				Ports:      ports,
				Conditions: conditions(e.Conditions),
			}
			bad := false
			for _, a := range e.Addresses {
				addr, err := netip.ParseAddr(a)
				if err != nil || !family(addr) {
					leftOut("address %q is not an %s address", a, es.AddressType)
					bad = true
					break
				}
				if !slices.Contains(re.Addresses, addr) {
					re.Addresses = append(re.Addresses, addr)
				}
			}
			if bad || len(re.Addresses) == 0 {
				continue
			}
			var node *corev1.Node
			if e.NodeName != nil {
				re.NodeName = *e.NodeName
				node = nodes[re.NodeName]
			}
			if e.Hostname != nil {
				re.Hostname = *e.Hostname
			}
			re.Locality = locality(e.Zone, node, opts.DefaultRegion)
			// Checked before merging, so that a bad copy never replaces a good one.
			if err := re.Validate(lim); err != nil {
				leftOut("%v", err)
				continue
			}
			eps.add(re)
		}
	}
	s.Endpoints = eps.list()
	return s, errs
}

// properties are what an import mirrors of a Service's spec, Kubernetes'
// defaults as the registry's empty values.
func properties(spec *corev1.ServiceSpec) registry.Properties {
	var p registry.Properties
	if spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		p.SessionAffinity = registry.SessionAffinityClientIP
		if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			p.SessionAffinityTimeout = *c.ClientIP.TimeoutSeconds
		}
	} else if spec.SessionAffinity != "" && spec.SessionAffinity != corev1.ServiceAffinityNone {
		p.SessionAffinity = string(spec.SessionAffinity) // refused by validation, by name
	}
	if spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyCluster {
		p.InternalTrafficPolicy = string(*spec.InternalTrafficPolicy)
	}
	if spec.TrafficDistribution != nil {
		p.TrafficDistribution = *spec.TrafficDistribution
	}
	// A headless Service has no cluster IP, and the API server gives a
	// selectorless one both families whatever its pods have: only a
	// ClusterSetIP export's families say something.
	if spec.ClusterIP != corev1.ClusterIPNone {
		for _, f := range spec.IPFamilies {
			p.IPFamilies = append(p.IPFamilies, registry.IPFamily(f))
		}
	}
	return p
}

// conditions applies the EndpointSlice API's rules for unset conditions:
// unknown readiness counts as ready, unknown serving as whatever ready is,
// unknown terminating as not terminating.
func conditions(c discoveryv1.EndpointConditions) registry.Conditions {
	out := registry.Conditions{Ready: true}
	if c.Ready != nil {
		out.Ready = *c.Ready
	}
	out.Serving = out.Ready
	if c.Serving != nil {
		out.Serving = *c.Serving
	}
	if c.Terminating != nil {
		out.Terminating = *c.Terminating
	}
	return out
}

// locality takes the zone from the endpoint, else from its node, and the region from the node, else the default.
func locality(zone *string, node *corev1.Node, defaultRegion string) registry.Locality {
	l := registry.Locality{Region: defaultRegion}
	if zone != nil {
		l.Zone = *zone
	}
	if node != nil {
		if r := node.Labels[corev1.LabelTopologyRegion]; r != "" {
			l.Region = r
		}
		if l.Zone == "" {
			l.Zone = node.Labels[corev1.LabelTopologyZone]
		}
	}
	return l
}

// endpointSet collects a service's endpoints, merging those that share an
// address: while an endpoint moves between slices it is briefly listed in
// both, and the registry allows each address once per shard.
type endpointSet struct {
	eps    []registry.Endpoint
	byAddr map[netip.Addr]int // index into eps
}

func (s *endpointSet) add(e registry.Endpoint) {
	if s.byAddr == nil {
		s.byAddr = map[netip.Addr]int{}
	}
	for _, a := range e.Addresses {
		i, ok := s.byAddr[a]
		if !ok {
			continue
		}
		// The healthier copy wins; on a tie the one seen first stays, so the result
		// only depends on slice names.
		if e.Health() < s.eps[i].Health() {
			s.eps[i] = e
			for _, b := range e.Addresses {
				if _, taken := s.byAddr[b]; !taken {
					s.byAddr[b] = i
				}
			}
		}
		return
	}
	for _, a := range e.Addresses {
		s.byAddr[a] = len(s.eps)
	}
	s.eps = append(s.eps, e)
}

// list returns the endpoints with every address kept only by its first
// holder (a replacement may have brought an address another endpoint owns).
func (s *endpointSet) list() []registry.Endpoint {
	out := make([]registry.Endpoint, 0, len(s.eps))
	for i, e := range s.eps {
		e.Addresses = slices.DeleteFunc(e.Addresses, func(a netip.Addr) bool { return s.byAddr[a] != i })
		if len(e.Addresses) > 0 {
			out = append(out, e)
		}
	}
	return out
}
