package main

import (
	"fmt"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/traffic"
)

// routes lists the services with routes or a policy; with a service, its
// routes port by port, its policy, and where each came from.
func (c client) routes(service string) error {
	if service != "" {
		if _, err := registry.ParseServiceKey(service); err != nil {
			return fmt.Errorf("routes takes a service NAMESPACE/NAME: %w", err)
		}
		var info adminapi.RoutesInfo
		if err := c.get("/debug/routes?service="+url.QueryEscape(service), &info); err != nil || c.json {
			return err
		}
		return c.serviceRoutes(info)
	}
	var services []adminapi.RoutesInfo
	if err := c.get("/debug/routes", &services); err != nil || c.json {
		return err
	}
	if len(services) == 0 {
		fmt.Fprintln(c.out, "(no service has routes or a TrafficPolicy: every request goes to the service's own endpoints)")
		return nil
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SERVICE\tROUTES\tPOLICY\tCONFLICTS\tBACKENDS NOT EXPORTED")
	for _, s := range services {
		policy := "-"
		if s.Policy != nil {
			policy = fmt.Sprintf("%s (%s)", s.Policy.Name, s.PolicyCluster)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\n", s.Service, s.RouteCount, policy, len(s.Conflicts), dash(strings.Join(unexported(s), ",")))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, s := range services {
		for _, cf := range s.Conflicts {
			fmt.Fprintf(c.out, "conflict in %s: %s\n", s.Service, cf)
		}
	}
	return nil
}

// unexported names the backends of s's routes that no cluster exports
// (placeholders: their requests fail UNAVAILABLE), each once.
func unexported(s adminapi.RoutesInfo) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range s.Ports {
		for _, r := range p.Routes {
			for _, rule := range r.Rules {
				for _, b := range rule.Backends {
					if name := fmt.Sprintf("%s:%d", b.Name, b.Port); !b.Exported && !seen[name] {
						seen[name] = true
						out = append(out, name)
					}
				}
			}
		}
	}
	return out
}

// serviceRoutes prints one service's traffic in full.
func (c client) serviceRoutes(info adminapi.RoutesInfo) error {
	policy := "no TrafficPolicy"
	if info.Policy != nil {
		policy = fmt.Sprintf("TrafficPolicy %s from %s", info.Policy.Name, info.PolicyCluster)
	}
	fmt.Fprintf(c.out, "%s: %d routes; %s\n", info.Service, info.RouteCount, policy)
	for _, p := range info.Ports {
		fmt.Fprintf(c.out, "\nport %d/%s", p.Port.Port, p.Port.Protocol)
		if p.Port.Name != "" {
			fmt.Fprintf(c.out, " (%s)", p.Port.Name)
		}
		fmt.Fprintf(c.out, "  %s\n", p.Target)
		if p.Invalid != "" {
			fmt.Fprintf(c.out, "  NOT SERVED as routed, clients get the port as if no route attached: %s\n", p.Invalid)
		}
		if len(p.Routes) == 0 {
			fmt.Fprintf(c.out, "  no route: every request goes to the port's own endpoints%s\n", policyDefaults(info.Policy))
		}
		for _, r := range p.Routes {
			c.route(r, info.Policy)
		}
	}
	if len(info.Unattached) > 0 {
		fmt.Fprintln(c.out, "\nattached to a port the service does not have (no client gets them):")
		for _, r := range info.Unattached {
			fmt.Fprintf(c.out, "  %s %s (port %d) from %s\n", r.Kind, r.Name, r.Port, r.Cluster)
		}
	}
	if p := info.Policy; p != nil {
		fmt.Fprintf(c.out, "\nTrafficPolicy %s from %s:\n", p.Name, info.PolicyCluster)
		for _, line := range describePolicy(p) {
			fmt.Fprintf(c.out, "  %s\n", line)
		}
	}
	if len(info.Conflicts) > 0 {
		fmt.Fprintln(c.out, "\nconflicts:")
		for _, cf := range info.Conflicts {
			fmt.Fprintf(c.out, "  %s\n", cf)
		}
	}
	fmt.Fprintln(c.out, "\nexported by (oldest first: the oldest export that has a route or a policy is the one clients get):")
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  CLUSTER\tEXPORTED\tROUTES\tPOLICY")
	for _, e := range info.Exports {
		var routes []string
		for _, r := range e.Routes {
			routes = append(routes, string(r.Kind)+"/"+r.Name)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", e.Cluster, e.ExportedAt.Format(time.RFC3339), dash(strings.Join(routes, ",")), dash(e.Policy))
	}
	return w.Flush()
}

// route prints one route attached to a port: its rules, what each matches
// and where it sends requests.
func (c client) route(r adminapi.RouteInfo, policy *traffic.Policy) {
	port := "every port"
	if r.Port != 0 {
		port = fmt.Sprintf("port %d", r.Port)
	}
	created := ""
	if !r.CreatedAt.IsZero() {
		created = ", created " + r.CreatedAt.Format(time.RFC3339)
	}
	fmt.Fprintf(c.out, "  %s %s (%s) from %s%s\n", r.Kind, r.Name, port, r.Cluster, created)
	for i, rule := range r.Rules {
		fmt.Fprintf(c.out, "    rule %d: %s\n", i+1, describeMatches(rule.Matches))
		routed := false
		for _, b := range rule.Backends {
			state := "exported by " + joinClusters(b.Clusters)
			switch {
			case !b.Exported:
				state = "NOT EXPORTED: a placeholder with no endpoints, its requests fail UNAVAILABLE"
			case b.Kind == traffic.BackendService:
				state = "the client's own cluster's endpoints (exported by " + joinClusters(b.Clusters) + ")"
			}
			if b.Weight == 0 {
				state = "weight 0: gets no requests"
			}
			routed = routed || b.Weight > 0
			fmt.Fprintf(c.out, "      -> %s %s:%d  weight %d  %s\n", b.Kind, b.Name, b.Port, b.Weight, state)
		}
		if !routed {
			fmt.Fprintln(c.out, "      no backend: its requests fail (gRPC: UNAVAILABLE)")
			continue
		}
		var how []string
		timeout, retry, from := rule.Timeout, rule.Retry, ""
		if policy != nil && timeout == 0 && policy.Timeout > 0 {
			timeout, from = policy.Timeout, " (the policy's)"
		}
		if timeout > 0 {
			how = append(how, fmt.Sprintf("timeout %s%s", timeout, from))
		}
		from = ""
		if policy != nil && retry == nil && policy.Retry != nil {
			retry, from = policy.Retry, " (the policy's)"
		}
		if retry != nil {
			how = append(how, describeRetry(retry)+from)
		}
		for _, h := range rule.SetHeaders {
			how = append(how, fmt.Sprintf("set header %s: %q", h.Name, h.Value))
		}
		if len(how) > 0 {
			fmt.Fprintf(c.out, "      %s\n", strings.Join(how, ", "))
		}
	}
}

// policyDefaults is what a port without routes takes of the policy.
func policyDefaults(p *traffic.Policy) string {
	var how []string
	if p != nil && p.Timeout > 0 {
		how = append(how, fmt.Sprintf("timeout %s", p.Timeout))
	}
	if p != nil && p.Retry != nil {
		how = append(how, describeRetry(p.Retry))
	}
	if len(how) == 0 {
		return ""
	}
	return " (" + strings.Join(how, ", ") + ", the policy's)"
}

// describeMatches words a rule's matches (ORed), each match's parts ANDed.
func describeMatches(matches []traffic.Match) string {
	if len(matches) == 0 {
		return "every request"
	}
	var ors []string
	for _, m := range matches {
		var ands []string
		if mm := m.Method; mm != nil {
			svc, method := or(mm.Service, "*"), or(mm.Method, "*")
			if mm.Type == traffic.RegularExpression {
				ands = append(ands, fmt.Sprintf("method ~ %s/%s", svc, method))
			} else {
				ands = append(ands, fmt.Sprintf("method %s/%s", svc, method))
			}
		}
		if p := m.Path; p != nil {
			ands = append(ands, fmt.Sprintf("path %s %s", p.Type, p.Value))
		}
		for _, h := range m.Headers {
			op := "="
			if h.Type == traffic.RegularExpression {
				op = "~"
			}
			ands = append(ands, fmt.Sprintf("header %s %s %q", h.Name, op, h.Value))
		}
		if len(ands) == 0 {
			ands = append(ands, "every request")
		}
		ors = append(ors, strings.Join(ands, " and "))
	}
	return strings.Join(ors, "; or ")
}

func describeRetry(r *traffic.Retry) string {
	on := strings.Join(r.GRPCCodes, ",")
	if len(r.HTTPCodes) > 0 {
		var codes []string
		for _, c := range r.HTTPCodes {
			codes = append(codes, fmt.Sprint(c))
		}
		on = "HTTP " + strings.Join(codes, ",")
	}
	s := fmt.Sprintf("retry %d times on %s", r.Attempts, or(on, "the client's default"))
	if r.Backoff > 0 {
		s += fmt.Sprintf(" (backoff %s)", r.Backoff)
	}
	return s
}

// describePolicy words each part a policy sets, one a line.
func describePolicy(p *traffic.Policy) []string {
	var out []string
	if lb := p.LoadBalancer; lb != nil {
		s := "load balancing: " + string(lb.Algorithm)
		switch {
		case lb.ChoiceCount > 0:
			s += fmt.Sprintf(", choosing among %d", lb.ChoiceCount)
		case lb.Algorithm == traffic.RingHash && lb.HashHeader != "":
			s += ", hashing header " + lb.HashHeader
		case lb.Algorithm == traffic.RingHash:
			s += ", hashing the client's channel"
		}
		out = append(out, s)
	}
	if l := p.Locality; l != nil {
		s := "locality: Nave's default (zone, region, the rest)"
		switch {
		case l.Off:
			s = "locality: off (every endpoint at one priority)"
		case len(l.FailoverPriority) > 0:
			s = "locality: failover priority " + strings.Join(l.FailoverPriority, ",")
		case len(l.Failover) > 0:
			var f []string
			for _, rf := range l.Failover {
				f = append(f, rf.From+"->"+rf.To)
			}
			s = "locality: failover " + strings.Join(f, ", ")
		case len(l.Distribute) > 0:
			var d []string
			for _, dist := range l.Distribute {
				var to []string
				for _, lw := range dist.To {
					to = append(to, fmt.Sprintf("%s %d%%", lw.Locality, lw.Weight))
				}
				d = append(d, dist.From+": "+strings.Join(to, " "))
			}
			s = "locality: distribute " + strings.Join(d, "; ")
		}
		out = append(out, s)
	}
	if o := p.OutlierDetection; o != nil {
		var parts []string
		for _, d := range []struct {
			name string
			v    time.Duration
		}{{"interval", o.Interval}, {"base ejection", o.BaseEjectionTime}, {"max ejection", o.MaxEjectionTime}} {
			if d.v > 0 {
				parts = append(parts, fmt.Sprintf("%s %s", d.name, d.v))
			}
		}
		if o.MaxEjectionPercent > 0 {
			parts = append(parts, fmt.Sprintf("at most %d%% ejected", o.MaxEjectionPercent))
		}
		if o.ConsecutiveErrors > 0 {
			parts = append(parts, fmt.Sprintf("after %d errors in a row (Envoy only)", o.ConsecutiveErrors))
		}
		if f := o.FailurePercentage; f != nil {
			parts = append(parts, fmt.Sprintf("failure percentage %d%%", f.Threshold))
		}
		if sr := o.SuccessRate; sr != nil {
			parts = append(parts, "success rate")
		}
		out = append(out, "outlier detection: "+or(strings.Join(parts, ", "), "the clients' defaults"))
	}
	if p.MaxRequests > 0 {
		out = append(out, fmt.Sprintf("max concurrent requests per client: %d", p.MaxRequests))
	}
	if p.Timeout > 0 {
		out = append(out, fmt.Sprintf("timeout: %s (where a route rule sets none)", p.Timeout))
	}
	if p.Retry != nil {
		out = append(out, "retry: "+strings.TrimPrefix(describeRetry(p.Retry), "retry ")+" (where a route rule sets none)")
	}
	if len(out) == 0 {
		out = append(out, "(sets nothing: the clients' defaults)")
	}
	return out
}

func joinClusters(clusters []registry.ClusterID) string {
	var s []string
	for _, c := range clusters {
		s = append(s, string(c))
	}
	return strings.Join(s, ",")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
