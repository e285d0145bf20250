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
