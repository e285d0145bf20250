package spoke

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// This file holds what the ImportWriter writes, as pure functions: the
// desired ServiceImport, derived Service and EndpointSlices of an import,
// the part of each object Nave owns (what is compared, and patched), and
// the reading back of imported EndpointSlices into imports.Slice values.

// Labels and names of the objects the ImportWriter owns.
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
	// ImportFieldManager is the field manager of every write.
	ImportFieldManager = "nave-spoke"
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

// The ServiceImport conditions the writer sets besides Ready, and the reasons.
const (
	// ConditionClusterSetIP says whether a ClusterSetIP import's derived
	// Service has the hub's clusterset IPs (True, Allocated) or IPs of the
	// cluster's own (False, ClusterLocalIP: KEP-1645 allows per-cluster IPs).
	ConditionClusterSetIP = "ClusterSetIP"
	ReasonAllocated       = "Allocated"
	ReasonClusterLocalIP  = "ClusterLocalIP"
	// ReasonImportReady is Ready's reason once everything is written.
	ReasonImportReady = "Ready"
	// ReasonNameInUse: an object the import needs exists and is not Nave's.
	ReasonNameInUse = "NameInUse"
	// ReasonRefused: the API server refused an object of the import.
	ReasonRefused = "Refused"
)

// sliceLabelKeys are the labels of an imported EndpointSlice Nave owns.
var sliceLabelKeys = []string{ManagedByLabel, mcsv1beta1.LabelServiceName, mcsv1beta1.LabelSourceCluster,
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
func owned(o metav1.Object) bool { return o != nil && o.GetLabels()[ManagedByLabel] == ManagedByValue }

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

// leanImported is the transform of the writer's informers: it keeps of each
// object what the writer reads or compares, so that a cluster's imports
// (a cluster imports its own exports too) cost it little memory: of what
// the writer owns of each, a sum (ownedSum), which tells whether it is as
// desired. An EndpointSlice is kept as a keptSlice, a ServiceImport as a
// keptServiceImport, a Service as a keptService. It is idempotent.
func leanImported(obj any) (any, error) {
	switch o := obj.(type) {
	case *discoveryv1.EndpointSlice:
		return keepSlice(o), nil
	case *corev1.Service:
		return keepService(o), nil
	case *unstructured.Unstructured:
		return leanServiceImport(o), nil
	}
	return obj, nil
}

// keptSlice is what the writer keeps of an imported EndpointSlice: its
// metadata with the labels Nave owns, what packing needs to know of it
// (imports.Prev: each endpoint's first address and sum), and the sum of
// its owned part. It keeps no endpoint: the import's endpoints are in the
// state the hub sent, and a slice that differs from the desired one is
// patched with the owned part whole (slicePatch).
type keptSlice struct {
	metav1.ObjectMeta
	prev     imports.Prev
	readable bool   // it reads as an imported slice (importedSlice)
	owned    string // ownedSum(sliceOwned(the slice))
}

func keepSlice(es *discoveryv1.EndpointSlice) *keptSlice {
	k := &keptSlice{owned: ownedSum(sliceOwned(es)), ObjectMeta: metav1.ObjectMeta{
		Namespace: es.Namespace, Name: es.Name, UID: es.UID, ResourceVersion: es.ResourceVersion,
		Labels: keepLabels(es.Labels, sliceLabelKeys...)}}
	if s, ok := importedSlice(es); ok {
		k.prev, k.readable = s.Prev(), true
	}
	return k
}

// slicePatch is the merge patch that makes an imported slice, known by
// what the writer keeps of it, have the owned part want (sliceOwned): its
// owned labels that differ, and the rest of what Nave owns whole (a merge
// patch replaces a list whole, so nothing of the old endpoints is needed).
func slicePatch(cur *keptSlice, want map[string]any) map[string]any {
	wantMeta, _ := want["metadata"].(map[string]any)
	have := map[string]any{}
	for k, v := range cur.Labels {
		have[k] = v
	}
	meta := mergePatch(map[string]any{"labels": have}, map[string]any{"labels": wantMeta["labels"]})
	if meta == nil {
		meta = map[string]any{}
	}
	meta["ownerReferences"] = nullIfEmpty(wantMeta["ownerReferences"])
	patch := map[string]any{"metadata": meta}
	for _, k := range []string{"addressType", "endpoints", "ports"} {
		patch[k] = nullIfEmpty(want[k])
	}
	return patch
}

func nullIfEmpty(v any) any {
	if isEmpty(v) {
		return nil
	}
	return v
}

// keptService is what the writer keeps of a derived Service: its metadata
// without labels, annotations and owner references; the import it belongs
// to (its label multicluster.kubernetes.io/service-name); the annotations
// the writer set when it created it (createdAnnotations); what decides
// whether it must be made anew (needsRecreate) and its IPs; and, for the
// rest of what the writer owns (serviceOwned), the sum of it. A derived
// Service changes only with the exported service's ports and properties,
// so the writer reads it from the API server when its sum is not the
// desired one.
type keptService struct {
	metav1.ObjectMeta
	service      string
	created      [len(createdAnnotations)]string
	hasCreated   [len(createdAnnotations)]bool
	typ          corev1.ServiceType
	clusterIP    string
	clusterIPs   []string
	families     []corev1.IPFamily
	familyPolicy corev1.IPFamilyPolicy
	owned        string
}

func keepService(svc *corev1.Service) *keptService {
	k := &keptService{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID, ResourceVersion: svc.ResourceVersion},
		service:    svc.Labels[mcsv1beta1.LabelServiceName], owned: ownedSum(serviceOwned(svc)),
		typ: svc.Spec.Type, clusterIP: svc.Spec.ClusterIP, clusterIPs: svc.Spec.ClusterIPs, families: svc.Spec.IPFamilies,
		familyPolicy: deref(svc.Spec.IPFamilyPolicy),
	}
	for i, key := range createdAnnotations {
		k.created[i], k.hasCreated[i] = svc.Annotations[key]
	}
	return k
}

// GetLabels returns the labels of the derived Service the writer reads (a
// new map). ManagedByLabel is always there: the writer keeps only
// Services that have it (its informer selects them, and it remembers a
// write only after checking the Service is Nave's).
func (k *keptService) GetLabels() map[string]string {
	labels := map[string]string{ManagedByLabel: ManagedByValue}
	if k.service != "" {
		labels[mcsv1beta1.LabelServiceName] = k.service
	}
	return labels
}

// annotation returns one of createdAnnotations, and whether the Service has it.
func (k *keptService) annotation(key string) (string, bool) {
	i := slices.Index(createdAnnotations[:], key)
	if i < 0 {
		panic("keptService.annotation: " + key + " is not kept")
	}
	return k.created[i], k.hasCreated[i]
}

// keptServiceImport is what the writer keeps of a ServiceImport: its
// metadata without labels and annotations, its status (which the writer
// merges conditions into), and, for its labels, annotations and spec,
// which the writer owns whole, their sum (ownedSum of serviceImportOwned).
// A ServiceImport changes with the exported service's ports and
// properties, its clusterset IPs, and when a source cluster goes stale or
// comes back (StaleClustersAnnotation), not with endpoints; so the writer
// reads it from the API server when its sum is not the desired one,
// rather than keep every import's spec, labels and annotations.
type keptServiceImport struct {
	metav1.ObjectMeta
	Status mcsv1beta1.ServiceImportStatus
	owned  string
}

// leanServiceImport is what the writer keeps of a ServiceImport of either version.
func leanServiceImport(u *unstructured.Unstructured) *keptServiceImport {
	si := typedServiceImport(u)
	k := &keptServiceImport{Status: si.Status, owned: ownedSum(serviceImportOwned(si)), ObjectMeta: si.ObjectMeta}
	k.Labels, k.Annotations = nil, nil
	return k
}

// typedServiceImport is a ServiceImport of either version (they have the
// same fields) typed, without managedFields. One that does not read as a
// ServiceImport keeps only its metadata, so that the writer writes the
// rest anew.
func typedServiceImport(u *unstructured.Unstructured) *mcsv1beta1.ServiceImport {
	si := &mcsv1beta1.ServiceImport{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, si); err != nil {
		si = &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: u.GetName(),
			UID: u.GetUID(), ResourceVersion: u.GetResourceVersion(), Generation: u.GetGeneration(),
			Labels: u.GetLabels(), Annotations: u.GetAnnotations()}}
	}
	si.ManagedFields = nil
	return si
}

// ownedSum is a digest of an owned part: owned parts that mergePatch finds
// alike (a missing key, null, an empty list and an empty object are alike)
// have the same sum, and different sums mean different parts.
func ownedSum(m map[string]any) string {
	b, err := json.Marshal(withoutEmpty(m)) // encoding/json sorts map keys
	if err != nil {
		panic(err) // maps of JSON values always encode
	}
	sum := sha256.Sum256(b)
	return base64.RawStdEncoding.EncodeToString(sum[:16])
}

// withoutEmpty is m without the empty values (isEmpty) of it and of the
// objects in it, as mergePatch compares them (lists are compared whole).
func withoutEmpty(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		switch {
		case isEmpty(v):
		case isMap(v):
			out[k] = withoutEmpty(v.(map[string]any))
		default:
			out[k] = v
		}
	}
	return out
}

func isMap(v any) bool {
	_, ok := v.(map[string]any)
	return ok
}

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
		"metadata":    map[string]any{"labels": pick(meta["labels"], sliceLabelKeys...), "ownerReferences": meta["ownerReferences"]},
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
		name := o.GetLabels()[mcsv1beta1.LabelServiceName]
		return registry.ServiceKey{Namespace: o.GetNamespace(), Name: name}, name != ""
	}
	return registry.ServiceKey{}, false
}

// writtenObjects remembers what the writer wrote until its informers have
// seen it, so that a sync never works from an object older than its own
// last write: that would make a patch that fails on its resourceVersion,
// or, for an object just created, a second create. Entries leave once the
// cache holds the written version (or a newer one) or the object is gone.
type writtenObjects struct {
	mu sync.Mutex
	m  map[writtenGroup]map[string]writtenObj
}

// writtenGroup is the objects of one kind that belong to one import.
type writtenGroup struct {
	kind objKind
	key  registry.ServiceKey
}

// writtenObj is an object as the API server returned it from a write (or a
// read after one), kept as the cache keeps it (see put), or,
// when obj is nil, the UID of an object the writer deleted. earlier holds
// the versions of the same object the writer wrote before obj (a sync that
// creates a ServiceImport and then writes its status writes it twice; a
// later sync may write it again before the first write comes back), until
// the cache catches up.
type writtenObj struct {
	obj     metav1.Object
	uid     types.UID
	earlier []string
}

// maxEarlier bounds writtenObj.earlier: a sync writes an object at most a
// few times.
const maxEarlier = 4

func newWrittenObjects() *writtenObjects {
	return &writtenObjects{m: map[writtenGroup]map[string]writtenObj{}}
}

func (w *writtenObjects) set(kind objKind, key registry.ServiceKey, name string, e writtenObj) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := writtenGroup{kind, key}
	if w.m[g] == nil {
		w.m[g] = map[string]writtenObj{}
	}
	if prev, ok := w.m[g][name]; ok && prev.obj != nil && e.obj != nil && prev.obj.GetUID() == e.obj.GetUID() {
		e.earlier = append(prev.earlier, prev.obj.GetResourceVersion())
		if len(e.earlier) > maxEarlier {
			e.earlier = e.earlier[len(e.earlier)-maxEarlier:]
		}
	}
	w.m[g][name] = e
}

// put remembers an object the API server returned from a write (or a
// read), as the cache would hold it (leanImported), and returns that: a
// loaded writer may remember a write of every import at once.
func (w *writtenObjects) put(kind objKind, key registry.ServiceKey, o metav1.Object) metav1.Object {
	if lean, _ := leanImported(o); lean != nil {
		o = lean.(metav1.Object)
	}
	w.set(kind, key, o.GetName(), writtenObj{obj: o})
	return o
}

// deleted remembers that the writer deleted an object.
func (w *writtenObjects) deleted(kind objKind, key registry.ServiceKey, o metav1.Object) {
	w.set(kind, key, o.GetName(), writtenObj{uid: o.GetUID()})
}

// forget drops what is remembered of an object (the API server said it is gone).
func (w *writtenObjects) forget(kind objKind, key registry.ServiceKey, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := writtenGroup{kind, key}
	delete(w.m[g], name)
	if len(w.m[g]) == 0 {
		delete(w.m, g)
	}
}

// caughtUp reports whether the cache's version of an object makes the
// remembered write moot.
func (e writtenObj) caughtUp(cached metav1.Object, gone bool) bool {
	if e.obj == nil { // deleted
		return cached == nil || cached.GetUID() != e.uid || gone
	}
	if cached == nil {
		return false // created, not seen yet
	}
	if gone {
		return cached.GetUID() == e.obj.GetUID()
	}
	c, err := resourceversion.CompareResourceVersion(cached.GetResourceVersion(), e.obj.GetResourceVersion())
	return err != nil || c >= 0
}

// resolve returns the objects of a group as the writer must see them: the
// cached ones (by name), with its own writes the cache has not seen yet in
// their place. It changes and returns cached.
func (w *writtenObjects) resolve(kind objKind, key registry.ServiceKey, cached map[string]metav1.Object) map[string]metav1.Object {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := writtenGroup{kind, key}
	for name, e := range w.m[g] {
		c := cached[name]
		switch {
		case e.caughtUp(c, false):
			delete(w.m[g], name)
		case e.obj == nil:
			delete(cached, name)
		default:
			cached[name] = e.obj
		}
	}
	if len(w.m[g]) == 0 {
		delete(w.m, g)
	}
	return cached
}

// observe is told of every informer event, and drops the writes the cache
// has caught up with. It reports whether the event is the version the
// writer last knew of the object coming back: the version it wrote (or
// read back after a create that found the object there), or the deletion
// of the object it deleted; such an event holds nothing the writer does
// not know.
func (w *writtenObjects) observe(kind objKind, o metav1.Object, gone bool) (own bool) {
	key, ok := objectKey(kind, o)
	if !ok {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	g := writtenGroup{kind, key}
	e, ok := w.m[g][o.GetName()]
	if !ok {
		return false
	}
	if !e.caughtUp(o, gone) {
		// An earlier write of the writer's, which its later write was made
		// over (a patch guarded by the version before it, or a read after a
		// create found the object there, which retries): nothing new.
		return e.obj != nil && !gone && o.GetUID() == e.obj.GetUID() && slices.Contains(e.earlier, o.GetResourceVersion())
	}
	delete(w.m[g], o.GetName())
	if len(w.m[g]) == 0 {
		delete(w.m, g)
	}
	if e.obj == nil { // deleted by the writer
		return gone && o.GetUID() == e.uid
	}
	return !gone && o.GetUID() == e.obj.GetUID() && o.GetResourceVersion() == e.obj.GetResourceVersion()
}

// conditionMessage joins problems into a condition message.
func conditionMessage(problems []string) string {
	problems = slices.Clone(problems)
	slices.Sort(problems)
	return truncate(strings.Join(slices.Compact(problems), "; "))
}
