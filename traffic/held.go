package traffic

import "unsafe"

// Sizes of what a set holds, for HeldBytes.
const (
	routeSize       = int(unsafe.Sizeof(Route{}))
	ruleSize        = int(unsafe.Sizeof(Rule{}))
	matchSize       = int(unsafe.Sizeof(Match{}))
	methodSize      = int(unsafe.Sizeof(MethodMatch{}))
	pathSize        = int(unsafe.Sizeof(PathMatch{}))
	headerMatchSize = int(unsafe.Sizeof(HeaderMatch{}))
	headerSize      = int(unsafe.Sizeof(Header{}))
	backendSize     = int(unsafe.Sizeof(Backend{}))
	retrySize       = int(unsafe.Sizeof(Retry{}))
	policySize      = int(unsafe.Sizeof(Policy{})) + int(unsafe.Sizeof(LoadBalancer{})) +
		int(unsafe.Sizeof(LocalityPolicy{})) + int(unsafe.Sizeof(OutlierDetection{})) +
		int(unsafe.Sizeof(FailurePercentage{})) + int(unsafe.Sizeof(SuccessRate{}))
	distributionSize = int(unsafe.Sizeof(Distribution{}))
	weightSize       = int(unsafe.Sizeof(LocalityWeight{}))
	failoverSize     = int(unsafe.Sizeof(RegionFailover{}))
	stringSize       = int(unsafe.Sizeof(""))
)

// HeldBytes estimates the memory s holds once decoded: its structs, slices
// and strings, each counted as its own allocation, as a decoder makes them.
// It walks the set without allocating, so it can bound what a peer sends
// before anything else looks at it.
func (s *Set) HeldBytes() int {
	n := 0
	for i := range s.Routes {
		r := &s.Routes[i]
		n += routeSize + len(r.Kind) + len(r.Name)
		for j := range r.Rules {
			n += r.Rules[j].heldBytes()
		}
	}
	if p := s.Policy; p != nil {
		n += policySize + len(p.Name)
		if lb := p.LoadBalancer; lb != nil {
			n += len(lb.Algorithm) + len(lb.HashHeader)
		}
		if l := p.Locality; l != nil {
			n += stringSize * len(l.FailoverPriority)
			for _, x := range l.FailoverPriority {
				n += len(x)
			}
			for _, f := range l.Failover {
				n += failoverSize + len(f.From) + len(f.To)
			}
			for _, d := range l.Distribute {
				n += distributionSize + len(d.From)
				for _, t := range d.To {
					n += weightSize + len(t.Locality)
				}
			}
		}
		n += p.Retry.heldBytes()
	}
	return n
}

func (rule *Rule) heldBytes() int {
	n := ruleSize + rule.Retry.heldBytes()
	for i := range rule.Matches {
		m := &rule.Matches[i]
		n += matchSize
		if m.Method != nil {
			n += methodSize + len(m.Method.Type) + len(m.Method.Service) + len(m.Method.Method)
		}
		if m.Path != nil {
			n += pathSize + len(m.Path.Type) + len(m.Path.Value)
		}
		for _, h := range m.Headers {
			n += headerMatchSize + len(h.Type) + len(h.Name) + len(h.Value)
		}
	}
	for _, b := range rule.Backends {
		n += backendSize + len(b.Kind) + len(b.Name)
	}
	for _, h := range rule.SetHeaders {
		n += headerSize + len(h.Name) + len(h.Value)
	}
	return n
}

func (r *Retry) heldBytes() int {
	if r == nil {
		return 0
	}
	n := retrySize + 4*len(r.HTTPCodes) + stringSize*len(r.GRPCCodes)
	for _, c := range r.GRPCCodes {
		n += len(c)
	}
	return n
}

// regexes counts the regular expressions the set's matches compile.
func (s *Set) regexes() int {
	n := 0
	for i := range s.Routes {
		for j := range s.Routes[i].Rules {
			for _, m := range s.Routes[i].Rules[j].Matches {
				if m.Method != nil && m.Method.Type == RegularExpression {
					n += 2
				}
				if m.Path != nil && m.Path.Type == RegularExpression {
					n++
				}
				for _, h := range m.Headers {
					if h.Type == RegularExpression {
						n++
					}
				}
			}
		}
	}
	return n
}

// routeBytes estimates the size of the xDS routes the set's routes become
// on one port (each match is a route of its own, a path prefix two, and
// each carries its rule's backends and headers).
func (s *Set) routeBytes() int {
	const perRoute, perBackend, perHeader = 160, 120, 24
	n := 0
	for i := range s.Routes {
		r := &s.Routes[i]
		for j := range r.Rules {
			rule := &r.Rules[j]
			action := perRoute + len(r.Name)
			for _, b := range rule.Backends {
				action += perBackend + 2*len(b.Name)
			}
			for _, h := range rule.SetHeaders {
				action += perHeader + len(h.Name) + len(h.Value)
			}
			if len(rule.Matches) == 0 {
				n += action
			}
			for _, m := range rule.Matches {
				match, routes := 0, 1
				if m.Method != nil {
					match += len(m.Method.Service) + len(m.Method.Method) + 16
				}
				if m.Path != nil {
					match += len(m.Path.Value)
					if m.Path.Type == PathPrefix && m.Path.Value != "/" {
						routes, match = 2, 2*match
					}
				}
				for _, h := range m.Headers {
					match += perHeader + len(h.Name) + len(h.Value)
				}
				n += routes*action + match
			}
		}
	}
	return n
}

// BackendRefs counts the distinct service ports the set's routes send
// requests to on a service with the given ports: a route of every port
// (Port 0) counts once per port, and so does a backend of the request's
// port (Port 0). It stops counting past MaxBackendRefs.
func (s *Set) BackendRefs(ports []int32) int {
	type ref struct {
		kind BackendKind
		name string
		port int32
	}
	seen := map[ref]bool{}
	for i := range s.Routes {
		r := &s.Routes[i]
		on := []int32{r.Port}
		if r.Port == 0 {
			on = ports
		}
		for _, port := range on {
			for j := range r.Rules {
				for _, b := range r.Rules[j].Backends {
					p := b.Port
					if p == 0 {
						p = port
					}
					seen[ref{b.Kind, b.Name, p}] = true
					if len(seen) > MaxBackendRefs {
						return len(seen) // enough to refuse it
					}
				}
			}
		}
	}
	return len(seen)
}
