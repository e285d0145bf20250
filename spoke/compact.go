package spoke

// This file holds what makes the source's caches small beyond leaving
// fields out (strip): a slice's endpoints compacted, a slice kept with its
// service rather than its labels, and label sets shared between objects.

import (
	"maps"
	"slices"
	"strings"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/navemesh/nave/registry"
)

// compactEndpoints re-lays the endpoints of a cached EndpointSlice so that
// they cost less: the decoder grows the endpoint array by doubling (a slice
// of 100 endpoints holds room for 128) and allocates every address list,
// condition, zone and node name apart. After it, the endpoints sit in an
// array of their exact length, their addresses in one shared array, the
// conditions point at shared constants, and equal zones, node names and
// hostnames within the slice share one string. Its meaning is unchanged
// (reflect.DeepEqual holds). Cached objects are read-only, so sharing is
// safe; it is idempotent.
func compactEndpoints(es *discoveryv1.EndpointSlice) {
	if len(es.Endpoints) == 0 {
		return
	}
	eps := make([]discoveryv1.Endpoint, len(es.Endpoints))
	copy(eps, es.Endpoints)
	n := 0
	for i := range eps {
		n += len(eps[i].Addresses)
	}
	addrs := make([]string, 0, n)
	strs := map[string]*string{}
	intern := func(p *string) *string {
		if p == nil {
			return nil
		}
		if q, ok := strs[*p]; ok {
			return q
		}
		strs[*p] = p
		return p
	}
	for i := range eps {
		e := &eps[i]
		if len(e.Addresses) > 0 {
			start := len(addrs)
			addrs = append(addrs, e.Addresses...)
			e.Addresses = addrs[start:len(addrs):len(addrs)]
		}
		c := &e.Conditions
		c.Ready, c.Serving, c.Terminating = shared(c.Ready), shared(c.Serving), shared(c.Terminating)
		e.Zone, e.NodeName, e.Hostname = intern(e.Zone), intern(e.NodeName), intern(e.Hostname)
	}
	es.Endpoints = eps
}

// The conditions of every compacted endpoint point at these.
var (
	sharedTrue  = true
	sharedFalse = false
)

func shared(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &sharedTrue
	default:
		return &sharedFalse
	}
}

// cachedSlice is an EndpointSlice as the source's cache keeps it (see
// strip): without labels, since a map costs more than the rest of a small
// slice's metadata, but with the service they name.
type cachedSlice struct {
	discoveryv1.EndpointSlice
	service registry.ServiceKey // zero when it belongs to none the source builds (sliceService)
}

func cacheSlice(es *discoveryv1.EndpointSlice) *cachedSlice {
	c := &cachedSlice{EndpointSlice: *es}
	if key, ok := sliceService(es); ok {
		c.service = key
	}
	c.Labels = nil
	return c
}

// DeepCopyObject copies the cached slice whole: the embedded EndpointSlice's
// would make an EndpointSlice of it, without its service (client-go's cache
// mutation detector compares such copies).
func (c *cachedSlice) DeepCopyObject() runtime.Object {
	out := &cachedSlice{service: c.service}
	c.EndpointSlice.DeepCopyInto(&out.EndpointSlice)
	return out
}

// belongs is the service the slice belongs to, if any.
func (c *cachedSlice) belongs() (registry.ServiceKey, bool) { return c.service, c.service.Name != "" }

// labelSets shares equal label sets between cached objects, which nobody
// writes (as in every informer cache): one map for all costs less than one
// map per object (about 300 bytes even for one label). It holds at most
// maxLabelSets sets; others are not shared.
type labelSets struct {
	mu   sync.Mutex
	sets map[string]map[string]string // by canonical form
}

const maxLabelSets = 1024

// keptLabels are the label sets strip keeps of Services (the export label,
// the import writer's, a network gateway's) and of Nodes (region and zone):
// few keys, and few values between them.
var keptLabels labelSets

// share returns the shared set equal to labels (labels itself the first time).
func (s *labelSets) share(labels map[string]string) map[string]string {
	if len(labels) == 0 {
		return labels
	}
	var key strings.Builder
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		key.WriteString(k)
		key.WriteByte(0)
		key.WriteString(labels[k])
		key.WriteByte(0)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if shared, ok := s.sets[key.String()]; ok {
		return shared
	}
	if len(s.sets) < maxLabelSets {
		if s.sets == nil {
			s.sets = map[string]map[string]string{}
		}
		s.sets[key.String()] = labels
	}
	return labels
}
