package federation

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/traffic"
)

// CapabilityTraffic is the hub capability (in its welcome) of taking and
// digesting Shard.traffic. A spoke sends an older hub its shards without
// their routes and policy: that hub would hold, and digest, them without.
const CapabilityTraffic = "traffic"

// maxTrafficWireBytes bounds a shard's traffic on the wire, checked before
// it is decoded; decoded, traffic.Set.Validate bounds what it holds.
const maxTrafficWireBytes = traffic.MaxSetBytes

// maxTrafficItems bounds the items (routes, rules, matches, headers,
// backends, codes, locality entries) of a shard's traffic, counted before
// any is decoded. Every valid set holds fewer: each item holds at least 24
// bytes decoded, and a set at most traffic.MaxSetBytes.
const maxTrafficItems = traffic.MaxSetBytes / 16

// trafficItems counts in's items, without allocating; it stops counting
// past maxTrafficItems.
func trafficItems(in *fedv1.Traffic) int {
	n := len(in.GetRoutes())
	for _, r := range in.GetRoutes() {
		n += len(r.GetRules())
		for _, rule := range r.GetRules() {
			n += len(rule.GetMatches()) + len(rule.GetBackends()) + len(rule.GetSetHeaders()) +
				len(rule.GetRetry().GetHttpCodes()) + len(rule.GetRetry().GetGrpcCodes())
			for _, m := range rule.GetMatches() {
				n += len(m.GetHeaders())
			}
			if n > maxTrafficItems {
				return n
			}
		}
	}
	p := in.GetPolicy()
	n += len(p.GetRetry().GetGrpcCodes()) + len(p.GetRetry().GetHttpCodes()) + len(p.GetLocality().GetFailoverPriority()) +
		len(p.GetLocality().GetFailover()) + len(p.GetLocality().GetDistribute())
	for _, d := range p.GetLocality().GetDistribute() {
		n += len(d.GetTo())
	}
	return n
}

// trafficToProto encodes a set; the zero set encodes as nothing.
func trafficToProto(s *traffic.Set) *fedv1.Traffic {
	if s.IsZero() {
		return nil
	}
	out := &fedv1.Traffic{Routes: make([]*fedv1.TrafficRoute, len(s.Routes)), Policy: policyToProto(s.Policy)}
	for i := range s.Routes {
		r := &s.Routes[i]
		pr := &fedv1.TrafficRoute{Kind: string(r.Kind), Name: r.Name, Port: r.Port, Rules: make([]*fedv1.TrafficRule, len(r.Rules))}
		if !r.CreatedAt.IsZero() {
			pr.CreatedAtUnix = r.CreatedAt.Unix()
		}
		for j := range r.Rules {
			pr.Rules[j] = ruleToProto(&r.Rules[j])
		}
		out.Routes[i] = pr
	}
	return out
}

func ruleToProto(r *traffic.Rule) *fedv1.TrafficRule {
	out := &fedv1.TrafficRule{
		Matches:      make([]*fedv1.TrafficMatch, len(r.Matches)),
		Backends:     make([]*fedv1.TrafficBackend, len(r.Backends)),
		TimeoutNanos: int64(r.Timeout),
		Retry:        retryToProto(r.Retry),
		SetHeaders:   make([]*fedv1.TrafficHeader, len(r.SetHeaders)),
	}
	for i := range r.Matches {
		m := &r.Matches[i]
		pm := &fedv1.TrafficMatch{Headers: make([]*fedv1.TrafficHeaderMatch, len(m.Headers))}
		if m.Method != nil {
			pm.Method = &fedv1.TrafficMethodMatch{Type: string(m.Method.Type), Service: m.Method.Service, Method: m.Method.Method}
		}
		if m.Path != nil {
			pm.Path = &fedv1.TrafficStringMatch{Type: string(m.Path.Type), Value: m.Path.Value}
		}
		for j, h := range m.Headers {
			pm.Headers[j] = &fedv1.TrafficHeaderMatch{Type: string(h.Type), Name: h.Name, Value: h.Value}
		}
		out.Matches[i] = pm
	}
	for i, b := range r.Backends {
		out.Backends[i] = &fedv1.TrafficBackend{Kind: string(b.Kind), Name: b.Name, Port: b.Port, Weight: b.Weight}
	}
	for i, h := range r.SetHeaders {
		out.SetHeaders[i] = &fedv1.TrafficHeader{Name: h.Name, Value: h.Value}
	}
	return out
}

func retryToProto(r *traffic.Retry) *fedv1.TrafficRetry {
	if r == nil {
		return nil
	}
	return &fedv1.TrafficRetry{Attempts: r.Attempts, BackoffNanos: int64(r.Backoff), HttpCodes: r.HTTPCodes, GrpcCodes: r.GRPCCodes}
}

func policyToProto(p *traffic.Policy) *fedv1.TrafficPolicy {
	if p == nil {
		return nil
	}
	out := &fedv1.TrafficPolicy{Name: p.Name, MaxRequests: p.MaxRequests, TimeoutNanos: int64(p.Timeout), Retry: retryToProto(p.Retry)}
	if lb := p.LoadBalancer; lb != nil {
		out.LoadBalancer = &fedv1.TrafficLoadBalancer{Algorithm: string(lb.Algorithm), ChoiceCount: lb.ChoiceCount, HashHeader: lb.HashHeader}
	}
	if l := p.Locality; l != nil {
		pl := &fedv1.TrafficLocality{Off: l.Off, FailoverPriority: l.FailoverPriority}
		for _, f := range l.Failover {
			pl.Failover = append(pl.Failover, &fedv1.TrafficRegionFailover{From: f.From, To: f.To})
		}
		for _, d := range l.Distribute {
			pd := &fedv1.TrafficDistribution{From: d.From}
			for _, t := range d.To {
				pd.To = append(pd.To, &fedv1.TrafficLocalityWeight{Locality: t.Locality, Weight: t.Weight})
			}
			pl.Distribute = append(pl.Distribute, pd)
		}
		out.Locality = pl
	}
	if o := p.OutlierDetection; o != nil {
		po := &fedv1.TrafficOutlierDetection{
			IntervalNanos: int64(o.Interval), BaseEjectionTimeNanos: int64(o.BaseEjectionTime),
			MaxEjectionTimeNanos: int64(o.MaxEjectionTime), MaxEjectionPercent: o.MaxEjectionPercent,
			ConsecutiveErrors: o.ConsecutiveErrors,
		}
		if f := o.FailurePercentage; f != nil {
			po.FailurePercentage = &fedv1.TrafficFailurePercentage{Threshold: f.Threshold, MinimumHosts: f.MinimumHosts, RequestVolume: f.RequestVolume}
		}
		if s := o.SuccessRate; s != nil {
			po.SuccessRate = &fedv1.TrafficSuccessRate{StdevFactor: s.StdevFactor, MinimumHosts: s.MinimumHosts, RequestVolume: s.RequestVolume}
		}
		out.OutlierDetection = po
	}
	return out
}

// trafficFromProto decodes a shard's traffic, refusing one larger than
// maxTrafficWireBytes before decoding it. The set is not normalized or
// validated here (the shard's Normalize and Validate do both).
func trafficFromProto(in *fedv1.Traffic) (traffic.Set, string) {
	if in == nil {
		return traffic.Set{}, ""
	}
	if n := proto.Size(in); n > maxTrafficWireBytes {
		return traffic.Set{}, fmt.Sprintf("its routes and policy take %d bytes, more than the limit of %d", n, maxTrafficWireBytes)
	}
	if n := trafficItems(in); n > maxTrafficItems {
		return traffic.Set{}, fmt.Sprintf("its routes and policy hold more than %d items", maxTrafficItems)
	}
	var s traffic.Set
	for _, pr := range in.GetRoutes() {
		r := traffic.Route{Kind: traffic.RouteKind(pr.GetKind()), Name: pr.GetName(), Port: pr.GetPort()}
		if t := pr.GetCreatedAtUnix(); t != 0 {
			r.CreatedAt = time.Unix(t, 0).UTC()
		}
		for _, rule := range pr.GetRules() {
			r.Rules = append(r.Rules, ruleFromProto(rule))
		}
		s.Routes = append(s.Routes, r)
	}
	s.Policy = policyFromProto(in.GetPolicy())
	return s, ""
}

func ruleFromProto(in *fedv1.TrafficRule) traffic.Rule {
	r := traffic.Rule{Timeout: time.Duration(in.GetTimeoutNanos()), Retry: retryFromProto(in.GetRetry())}
	for _, pm := range in.GetMatches() {
		var m traffic.Match
		if pm.GetMethod() != nil {
			mm := pm.GetMethod()
			m.Method = &traffic.MethodMatch{Type: traffic.MatchType(mm.GetType()), Service: mm.GetService(), Method: mm.GetMethod()}
		}
		if pm.GetPath() != nil {
			m.Path = &traffic.PathMatch{Type: traffic.MatchType(pm.GetPath().GetType()), Value: pm.GetPath().GetValue()}
		}
		for _, h := range pm.GetHeaders() {
			m.Headers = append(m.Headers, traffic.HeaderMatch{Type: traffic.MatchType(h.GetType()), Name: h.GetName(), Value: h.GetValue()})
		}
		r.Matches = append(r.Matches, m)
	}
	for _, b := range in.GetBackends() {
		r.Backends = append(r.Backends, traffic.Backend{Kind: traffic.BackendKind(b.GetKind()), Name: b.GetName(), Port: b.GetPort(), Weight: b.GetWeight()})
	}
	for _, h := range in.GetSetHeaders() {
		r.SetHeaders = append(r.SetHeaders, traffic.Header{Name: h.GetName(), Value: h.GetValue()})
	}
	return r
}

func retryFromProto(in *fedv1.TrafficRetry) *traffic.Retry {
	if in == nil {
		return nil
	}
	return &traffic.Retry{Attempts: in.GetAttempts(), Backoff: time.Duration(in.GetBackoffNanos()),
		HTTPCodes: in.GetHttpCodes(), GRPCCodes: in.GetGrpcCodes()}
}

func policyFromProto(in *fedv1.TrafficPolicy) *traffic.Policy {
	if in == nil {
		return nil
	}
	p := &traffic.Policy{Name: in.GetName(), MaxRequests: in.GetMaxRequests(), Timeout: time.Duration(in.GetTimeoutNanos()),
		Retry: retryFromProto(in.GetRetry())}
	if lb := in.GetLoadBalancer(); lb != nil {
		p.LoadBalancer = &traffic.LoadBalancer{Algorithm: traffic.Algorithm(lb.GetAlgorithm()), ChoiceCount: lb.GetChoiceCount(), HashHeader: lb.GetHashHeader()}
	}
	if l := in.GetLocality(); l != nil {
		pl := &traffic.LocalityPolicy{Off: l.GetOff(), FailoverPriority: l.GetFailoverPriority()}
		for _, f := range l.GetFailover() {
			pl.Failover = append(pl.Failover, traffic.RegionFailover{From: f.GetFrom(), To: f.GetTo()})
		}
		for _, d := range l.GetDistribute() {
			dd := traffic.Distribution{From: d.GetFrom()}
			for _, t := range d.GetTo() {
				dd.To = append(dd.To, traffic.LocalityWeight{Locality: t.GetLocality(), Weight: t.GetWeight()})
			}
			pl.Distribute = append(pl.Distribute, dd)
		}
		p.Locality = pl
	}
	if o := in.GetOutlierDetection(); o != nil {
		od := &traffic.OutlierDetection{
			Interval: time.Duration(o.GetIntervalNanos()), BaseEjectionTime: time.Duration(o.GetBaseEjectionTimeNanos()),
			MaxEjectionTime: time.Duration(o.GetMaxEjectionTimeNanos()), MaxEjectionPercent: o.GetMaxEjectionPercent(),
			ConsecutiveErrors: o.GetConsecutiveErrors(),
		}
		if f := o.GetFailurePercentage(); f != nil {
			od.FailurePercentage = &traffic.FailurePercentage{Threshold: f.GetThreshold(), MinimumHosts: f.GetMinimumHosts(), RequestVolume: f.GetRequestVolume()}
		}
		if s := o.GetSuccessRate(); s != nil {
			od.SuccessRate = &traffic.SuccessRate{StdevFactor: s.GetStdevFactor(), MinimumHosts: s.GetMinimumHosts(), RequestVolume: s.GetRequestVolume()}
		}
		p.OutlierDetection = od
	}
	return p
}
