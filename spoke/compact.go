package spoke

import (
	discoveryv1 "k8s.io/api/discovery/v1"
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
