package importwriter

import (
	"cmp"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/internal/mcsstatus"
	"github.com/navemesh/nave/registry"
)

// This file holds what the Writer writes, as pure functions: the
// desired ServiceImport, derived Service and EndpointSlices of an import,
// the part of each object Nave owns (what is compared, and patched), and
// the reading back of imported EndpointSlices into imports.Slice values.

// Labels and names of the objects the Writer owns.
const (
	// ManagedByLabel marks every object the import writer creates, with the
	// value ManagedByValue. The writer never changes or deletes an object
	// without it, so a user's object of the same name is left alone.
	ManagedByLabel = "nave.io/managed-by"
	ManagedByValue = "nave-spoke"
	// ImportedSliceManager is the endpointslice.kubernetes.io/managed-by of
	// imported EndpointSlices: not the EndpointSlice controller's value
	// (endpointslice-controller.k8s.io), which would have that controller
	// delete them. A label value cannot hold a '/', hence not "nave.io/spoke".
	ImportedSliceManager = "spoke.nave.io"
	// DerivedServiceAnnotation names a ClusterSetIP ServiceImport's derived
	// Service (the reference implementation's annotation).
	DerivedServiceAnnotation = "multicluster.kubernetes.io/derived-service"
	// StaleClustersAnnotation names, on a ServiceImport, the source clusters
	// that have no live spoke: their endpoints are kept until the hub's
	// keep/drop policy says otherwise.
	StaleClustersAnnotation = "nave.io/stale-clusters"
	// ServiceCIDRName is the ServiceCIDR through which a cluster routes the
	// hub's clusterset IPs.
	ServiceCIDRName = "nave-clusterset"
	// FieldManager is the field manager of every write.
	FieldManager = "nave-spoke"
)

// Annotations of a derived Service, set when it is created: what it was
// created for. ClusterIPs are immutable, so they tell whether the Service
// must be made anew (the hub's IPs changed) or may stay as it is (the
// cluster refused those IPs: a decision that stands for the import's life,
// as KEP-1645 wants an import's IP to).
const (
	// requestedIPsAnnotation: the hub's clusterset IPs asked for, comma-separated ("" for none).
	requestedIPsAnnotation = "nave.io/clusterset-ips"
	// refusedAnnotation: why the cluster refused them (absent when it took them).
	refusedAnnotation = "nave.io/clusterset-ip-refused"
	// refusedCIDRsAnnotation: the cidrs of ServiceCIDR nave-clusterset when
	// they were refused. When that ServiceCIDR later comes to hold the
	// hub's IPs, the Service is made anew once, with them.
	refusedCIDRsAnnotation = "nave.io/service-cidrs"
)

// The ServiceImport conditions the writer sets, and the reasons.
const (
	// ConditionReady says whether the import is written (True, Ready), or
	// what keeps it from being (False, NameInUse or Refused).
	ConditionReady = mcsstatus.ConditionReady
	// ConditionClusterSetIP says whether a ClusterSetIP import's derived
	// Service has the hub's clusterset IPs (True, Allocated) or IPs of the
	// cluster's own (False, ClusterLocalIP: KEP-1645 allows per-cluster IPs).
	ConditionClusterSetIP = "ClusterSetIP"
	ReasonAllocated       = "Allocated"
	ReasonClusterLocalIP  = "ClusterLocalIP"
	// ReasonReady is Ready's reason once everything is written.
	ReasonReady = "Ready"
	// ReasonNameInUse: an object the import needs exists and is not Nave's.
	ReasonNameInUse = "NameInUse"
	// ReasonRefused: the API server refused an object of the import.
	ReasonRefused = "Refused"
)

// sliceLabelKeys are the labels of an imported EndpointSlice Nave owns.
var sliceLabelKeys = [...]string{ManagedByLabel, mcsv1beta1.LabelServiceName, mcsv1beta1.LabelSourceCluster,
	discoveryv1.LabelManagedBy, discoveryv1.LabelServiceName}

// serviceLabelKeys are the labels of a derived Service Nave owns.
var serviceLabelKeys = []string{ManagedByLabel, mcsv1beta1.LabelServiceName}

// serviceSpecFields are the fields of a derived Service's spec Nave patches.
// Its clusterIPs and IP families are set when it is created (see
// needsRecreate).
var serviceSpecFields = []string{"type", "selector", "ports", "sessionAffinity", "sessionAffinityConfig",
	"internalTrafficPolicy", "trafficDistribution"}

func refTo[T any](v T) *T { return &v }

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// owned reports whether the writer owns an object.
func owned(o metav1.Object) bool { return o != nil && label(o, ManagedByLabel) == ManagedByValue }

// label returns one of an object's labels, without making a map of a kept
// slice's or Service's (their GetLabels does).
func label(o metav1.Object, key string) string {
	switch k := o.(type) {
	case *keptSlice:
		return k.label(key)
	case *keptService:
		return k.label(key)
	}
	return o.GetLabels()[key]
}

// ipStrings renders addresses as Kubernetes does.
func ipStrings(ips []netip.Addr) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

func sessionAffinity(p *registry.Properties) corev1.ServiceAffinity {
	if p.SessionAffinity == "" {
		return corev1.ServiceAffinityNone
	}
	return corev1.ServiceAffinity(p.SessionAffinity)
}

func internalTrafficPolicy(p *registry.Properties) *corev1.ServiceInternalTrafficPolicy {
	return refTo(corev1.ServiceInternalTrafficPolicy(cmp.Or(p.InternalTrafficPolicy, string(corev1.ServiceInternalTrafficPolicyCluster))))
}

func ipFamilies(p *registry.Properties) []corev1.IPFamily {
	var out []corev1.IPFamily
	for _, f := range p.IPFamilies {
		out = append(out, corev1.IPFamily(f))
	}
	return out
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func protocol(p registry.Protocol) corev1.Protocol {
	return corev1.Protocol(cmp.Or(p, registry.ProtocolTCP))
}

// desiredServiceImport is the ServiceImport of imp (without status): ips
// are the IPs of its derived Service (ClusterSetIP only).
func desiredServiceImport(imp *imports.Import, ips []string) *mcsv1beta1.ServiceImport {
	p := &imp.Properties
	labels := map[string]string{}
	for k, v := range p.Labels {
		labels[k] = v
	}
	labels[ManagedByLabel] = ManagedByValue
	var stale []string
	for _, src := range imp.Sources {
		if src.Stale {
			stale = append(stale, string(src.Cluster))
		}
	}
	var annotations map[string]string
	if len(p.Annotations) > 0 || !imp.Headless || len(stale) > 0 {
		annotations = map[string]string{}
		for k, v := range p.Annotations {
			annotations[k] = v
		}
	}
	if len(stale) > 0 {
		// Their endpoints are kept (fail-static) until the hub's policy drops them: say so.
		annotations[StaleClustersAnnotation] = strings.Join(stale, ",")
	}
	spec := mcsv1beta1.ServiceImportSpec{
		Ports:                 make([]mcsv1beta1.ServicePort, 0, len(imp.Ports)),
		Type:                  mcsv1beta1.Headless,
		SessionAffinity:       sessionAffinity(p),
		IPFamilies:            ipFamilies(p),
		InternalTrafficPolicy: internalTrafficPolicy(p),
		TrafficDistribution:   optional(p.TrafficDistribution),
	}
	if !imp.Headless {
		spec.Type = mcsv1beta1.ClusterSetIP
		spec.IPs = ips
		annotations[DerivedServiceAnnotation] = imports.DerivedServiceName(imp.Service)
	}
	if p.SessionAffinityTimeout != 0 {
		spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: refTo(p.SessionAffinityTimeout)}}
	}
	for _, sp := range imp.Ports {
		spec.Ports = append(spec.Ports, mcsv1beta1.ServicePort{Name: sp.Name, Protocol: protocol(sp.Protocol),
			AppProtocol: optional(sp.AppProtocol), Port: sp.Port})
	}
	return &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Namespace: imp.Service.Namespace, Name: imp.Service.Name, Labels: labels, Annotations: annotations},
		Spec:       spec,
	}
}

// desiredService is the derived Service of a ClusterSetIP import, without
// its clusterIPs and the annotations set at creation.
func desiredService(imp *imports.Import, owner metav1.OwnerReference) *corev1.Service {
	p := &imp.Properties
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: imp.Service.Namespace, Name: imports.DerivedServiceName(imp.Service),
			Labels:          map[string]string{ManagedByLabel: ManagedByValue, mcsv1beta1.LabelServiceName: imp.Service.Name},
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeClusterIP,
			SessionAffinity:       sessionAffinity(p),
			InternalTrafficPolicy: internalTrafficPolicy(p),
			TrafficDistribution:   optional(p.TrafficDistribution),
			IPFamilies:            ipFamilies(p),
		},
	}
	switch len(svc.Spec.IPFamilies) {
	case 1:
		svc.Spec.IPFamilyPolicy = refTo(corev1.IPFamilyPolicySingleStack)
	case 2:
		// A cluster that is not dual-stack gives the first family only.
		svc.Spec.IPFamilyPolicy = refTo(corev1.IPFamilyPolicyPreferDualStack)
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		// The API server's default, written out so that comparing is exact.
		timeout := cmp.Or(p.SessionAffinityTimeout, corev1.DefaultClientIPServiceAffinitySeconds)
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	}
	for _, sp := range imp.Ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: sp.Name, Protocol: protocol(sp.Protocol),
			AppProtocol: optional(sp.AppProtocol), Port: sp.Port, TargetPort: intstr.FromInt32(sp.Port)})
	}
	return svc
}

// serviceIPs are a derived Service's cluster IPs.
func serviceIPs(svc *keptService) []string {
	if len(svc.clusterIPs) > 0 {
		return svc.clusterIPs
	}
	if ip := svc.clusterIP; ip != "" && ip != corev1.ClusterIPNone {
		return []string{ip}
	}
	return nil
}

// familiesCompatible reports whether a derived Service's IP families are
// what the import wants: the same, or, under PreferDualStack, the first of
// them on a cluster that is not dual-stack. No families wanted: any will do.
func familiesCompatible(svc *keptService, want []corev1.IPFamily) bool {
	have := svc.families
	switch {
	case len(want) == 0 || slices.Equal(have, want):
		return true
	case len(want) == 2 && len(have) == 1 && have[0] == want[0]:
		return svc.familyPolicy == corev1.IPFamilyPolicyPreferDualStack
	}
	return false
}

// desiredSlice is the EndpointSlice of s; derived is the derived Service
// that kube-proxy should program with it ("" for none).
func desiredSlice(key registry.ServiceKey, s *imports.Slice, owner metav1.OwnerReference, derived string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: key.Namespace, Name: s.Name,
			Labels: map[string]string{
				ManagedByLabel: ManagedByValue, mcsv1beta1.LabelServiceName: key.Name,
				mcsv1beta1.LabelSourceCluster: string(s.Cluster), discoveryv1.LabelManagedBy: ImportedSliceManager,
			},
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   make([]discoveryv1.Endpoint, 0, len(s.Endpoints)),
	}
	if derived != "" {
		es.Labels[discoveryv1.LabelServiceName] = derived
	}
	if s.Family == registry.IPv6 {
		es.AddressType = discoveryv1.AddressTypeIPv6
	}
	for _, p := range s.Ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: refTo(p.Name), Protocol: refTo(protocol(p.Protocol)),
			Port: refTo(p.Port), AppProtocol: optional(p.AppProtocol)})
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: ipStrings(e.Addresses),
			Conditions: discoveryv1.EndpointConditions{Ready: refTo(e.Conditions.Ready), Serving: refTo(e.Conditions.Serving),
				Terminating: refTo(e.Conditions.Terminating)},
			Hostname: optional(e.Hostname),
			Zone:     optional(e.Zone),
		})
	}
	return es
}

// importedSlice reads an imported EndpointSlice back as imports.Slice; ok
// is false for one that cannot be one (no source cluster, FQDN, bad address).
func importedSlice(es *discoveryv1.EndpointSlice) (s imports.Slice, ok bool) {
	s = imports.Slice{Name: es.Name, Cluster: registry.ClusterID(es.Labels[mcsv1beta1.LabelSourceCluster])}
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		s.Family = registry.IPv4
	case discoveryv1.AddressTypeIPv6:
		s.Family = registry.IPv6
	default:
		return s, false
	}
	if s.Cluster == "" {
		return s, false
	}
	var eps []registry.EndpointPort
	for _, p := range es.Ports {
		sp := imports.SlicePort{Name: deref(p.Name), Port: deref(p.Port), Protocol: registry.Protocol(cmp.Or(deref(p.Protocol), corev1.ProtocolTCP)),
			AppProtocol: deref(p.AppProtocol)}
		s.Ports = append(s.Ports, sp)
		eps = append(eps, registry.EndpointPort{Name: sp.Name, Port: sp.Port})
	}
	// Every endpoint of a slice serves its ports: imports.Endpoint lists them by name.
	slices.SortFunc(eps, func(a, b registry.EndpointPort) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port))
	})
	s.Endpoints = make([]imports.Endpoint, 0, len(es.Endpoints))
	for _, e := range es.Endpoints {
		ie := imports.Endpoint{Ports: eps, Hostname: deref(e.Hostname), Zone: deref(e.Zone), Conditions: registry.Conditions{
			Ready: deref(e.Conditions.Ready), Serving: deref(e.Conditions.Serving), Terminating: deref(e.Conditions.Terminating)}}
		for _, a := range e.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return s, false
			}
			ie.Addresses = append(ie.Addresses, ip)
		}
		if len(ie.Addresses) == 0 {
			return s, false
		}
		slices.SortFunc(ie.Addresses, netip.Addr.Compare)
		s.Endpoints = append(s.Endpoints, ie)
	}
	return s, true
}

// createdAnnotations are the annotations of a derived Service the writer
// reads (set when it is created).
var createdAnnotations = [...]string{requestedIPsAnnotation, refusedAnnotation, refusedCIDRsAnnotation}

// The owned parts of objects: what the writer compares and patches. Each is
// a JSON object made by the same conversion from a typed object, whether it
// comes from the cache or is desired, so that equal means equal.

func toMap(obj any) map[string]any {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		panic(err) // typed API objects always convert
	}
	return m
}

func pick(m any, keys ...string) map[string]any {
	in, _ := m.(map[string]any)
	out := map[string]any{}
	for _, k := range keys {
		if v, ok := in[k]; ok {
			out[k] = v
		}
	}
	return out
}

// serviceImportOwned is all of a ServiceImport but its status: the writer
// owns its labels and annotations entirely (the exported ones can be
// removed), and its spec.
func serviceImportOwned(si *mcsv1beta1.ServiceImport) map[string]any {
	m := toMap(si)
	return map[string]any{"metadata": pick(m["metadata"], "labels", "annotations"), "spec": m["spec"]}
}

func sliceOwned(es *discoveryv1.EndpointSlice) map[string]any {
	m := toMap(es)
	meta, _ := m["metadata"].(map[string]any)
	return map[string]any{
		"metadata":    map[string]any{"labels": pick(meta["labels"], sliceLabelKeys[:]...), "ownerReferences": meta["ownerReferences"]},
		"addressType": m["addressType"], "endpoints": m["endpoints"], "ports": m["ports"],
	}
}

func serviceOwned(svc *corev1.Service) map[string]any {
	m := toMap(svc)
	meta, _ := m["metadata"].(map[string]any)
	return map[string]any{
		"metadata": map[string]any{"labels": pick(meta["labels"], serviceLabelKeys...), "ownerReferences": meta["ownerReferences"]},
		"spec":     pick(m["spec"], serviceSpecFields...),
	}
}

// mergePatch returns the JSON merge patch (RFC 7386) that turns from into
// to, or nil when there is nothing to change. A missing key, null, an empty
// list and an empty object (or one of nothing but such values) are alike.
func mergePatch(from, to map[string]any) map[string]any {
	var patch map[string]any
	set := func(k string, v any) {
		if patch == nil {
			patch = map[string]any{}
		}
		patch[k] = v
	}
	for k, tv := range to {
		fv := from[k]
		tm, tIsMap := tv.(map[string]any)
		fm, fIsMap := fv.(map[string]any)
		switch {
		case isEmpty(tv) && isEmpty(fv):
		case tIsMap && fIsMap:
			if sub := mergePatch(fm, tm); sub != nil {
				set(k, sub)
			}
		case isEmpty(tv):
			set(k, nil)
		case !reflect.DeepEqual(fv, tv):
			set(k, tv)
		}
	}
	for k, fv := range from {
		if _, ok := to[k]; !ok && !isEmpty(fv) {
			set(k, nil)
		}
	}
	return patch
}

// isEmpty reports whether v says nothing: null, an empty list, or an
// object of nothing but such values.
func isEmpty(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case map[string]any:
		for _, e := range v {
			if !isEmpty(e) {
				return false
			}
		}
		return true
	case []any:
		return len(v) == 0
	}
	return false
}

// withResourceVersion adds metadata.resourceVersion to a patch, so that it
// applies only to the object it was computed from.
func withResourceVersion(patch map[string]any, rv string) map[string]any {
	meta, _ := patch["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		patch["metadata"] = meta
	}
	meta["resourceVersion"] = rv
	return patch
}

// objKind is a kind of object the writer writes.
type objKind int

const (
	kindServiceImport objKind = iota
	kindEndpointSlice
	kindService
	kindServiceCIDR
	numKinds
)

func (k objKind) String() string {
	return [...]string{"ServiceImport", "EndpointSlice", "Service", "ServiceCIDR"}[k]
}

// objectKey is the import an owned object belongs to.
func objectKey(kind objKind, o metav1.Object) (registry.ServiceKey, bool) {
	switch kind {
	case kindServiceImport:
		return registry.ServiceKey{Namespace: o.GetNamespace(), Name: o.GetName()}, true
	case kindEndpointSlice, kindService:
		name := label(o, mcsv1beta1.LabelServiceName)
		return registry.ServiceKey{Namespace: o.GetNamespace(), Name: name}, name != ""
	}
	return registry.ServiceKey{}, false
}

// conditionMessage joins problems into a condition message.
func conditionMessage(problems []string) string {
	problems = slices.Clone(problems)
	slices.Sort(problems)
	return mcsstatus.Truncate(strings.Join(slices.Compact(problems), "; "))
}

// wantedSum is the statusSum of a ServiceImport whose status is as the
// writer writes it, with the conditions want and these clusters.
func wantedSum(want []mcsstatus.Condition, clusters []any, generation int64) string {
	return statusSum(statusUpdate(map[string]any{}, want, clusters, generation, time.Time{}))
}

// statusUpdate is the status the writer writes into a ServiceImport whose
// status (as toMap gives it) is status: the conditions want merged into its
// conditions (a ClusterSetIP condition not in want is dropped), and the
// clusters. It is nil when status has them already.
func statusUpdate(status map[string]any, want []mcsstatus.Condition, clusters []any, generation int64, now time.Time) map[string]any {
	ip := slices.ContainsFunc(want, func(c mcsstatus.Condition) bool { return c.Type == ConditionClusterSetIP })
	current, _, _ := unstructured.NestedSlice(status, "conditions")
	kept := slices.DeleteFunc(slices.Clone(current), func(c any) bool {
		m, _ := c.(map[string]any)
		return !ip && m != nil && m["type"] == ConditionClusterSetIP
	})
	conds, changed := mcsstatus.MergeConditions(kept, want, generation, now)
	changed = changed || len(kept) != len(current)
	curClusters, _, _ := unstructured.NestedSlice(status, "clusters")
	if !changed && (reflect.DeepEqual(curClusters, clusters) || len(curClusters) == 0 && len(clusters) == 0) {
		return nil
	}
	return map[string]any{"clusters": clusters, "conditions": conds}
}
