package traffic

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid marks every validation failure.
var ErrInvalid = errors.New("traffic: invalid")

// Bounds on what one cluster may say about one service. The per-route ones
// are the Gateway API's own (a CRD would refuse more); the rest keep a
// service's routes and policy to a few tens of kilobytes.
const (
	MaxRoutes          = 16  // routes attached to one service
	MaxRules           = 16  // rules per route
	MaxMatches         = 64  // matches per rule
	MaxMatchesPerRoute = 128 // matches across a route's rules
	MaxBackends        = 16  // backends per rule
	MaxHeaders         = 16  // header matches per match, headers set per rule
	MaxNameBytes       = 253 // object names (a DNS subdomain)
	MaxHeaderNameBytes = 256
	MaxValueBytes      = 4096 // header values
	MaxPatternBytes    = 1024 // paths, methods and regular expressions
	MaxWeight          = 1_000_000
	MaxRetryAttempts   = 10
	MaxDuration        = 24 * time.Hour
	MaxLocalityRules   = 16 // failover and distribute entries
	MaxLocalityBytes   = 200
	// MaxSetBytes bounds what one service's routes and policy hold once
	// decoded (HeldBytes), checked before anything else is.
	MaxSetBytes = 64 << 10
	// MaxRegexes bounds the regular expressions one service's routes
	// compile, each at most MaxPatternBytes: validating them must stay cheap.
	MaxRegexes = 64
	// MaxRegexProgram bounds each regular expression's compiled size (its
	// instructions, repetitions expanded).
	MaxRegexProgram = 1000
	// MaxRouteBytes bounds what a service's routes become in xDS (see
	// routeBytes): a client receives every route configuration it watches
	// in one response, which grpc-go limits to 4 MiB.
	MaxRouteBytes = 128 << 10
	// MaxBackendRefs bounds the distinct service ports a shard's routes
	// send requests to, a route of every port counted once per port: the
	// hub publishes a Cluster for each.
	MaxBackendRefs       = 128
	maxChoiceCount       = 10 // gRPC caps least request's choice count at 10
	minChoiceCount       = 2
	maxFailoverPriority  = 4
	maxEjectionPercent   = 100
	maxFailureThreshold  = 100
	distributionWeightOf = 100
)

// The gRPC status codes a retry may name: those gRFC A44 lets a client retry on.
var retryableGRPCCodes = []string{"cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable"}

// Validate checks everything a cluster says about a service: a Set that
// passes is one the hub can hold and translate. The error names the route
// or policy and the field.
func (s *Set) Validate() error {
	if len(s.Routes) > MaxRoutes {
		return invalid("%d routes attach to the service (at most %d)", len(s.Routes), MaxRoutes)
	}
	if n := s.HeldBytes(); n > MaxSetBytes {
		return invalid("the routes and policy hold %d bytes (at most %d)", n, MaxSetBytes)
	}
	if n := s.regexes(); n > MaxRegexes {
		return invalid("the routes hold %d regular expressions (at most %d)", n, MaxRegexes)
	}
	if n := s.routeBytes(); n > MaxRouteBytes {
		return invalid("the routes make about %d bytes of xDS routes (at most %d): fewer matches, or fewer headers set on rules with many", n, MaxRouteBytes)
	}
	seen := make(map[string]bool, len(s.Routes))
	for i := range s.Routes {
		r := &s.Routes[i]
		id := string(r.Kind) + "/" + r.Name
		if seen[id] {
			return invalid("%s %s appears twice", r.Kind, quoted(r.Name))
		}
		seen[id] = true
		if err := r.Validate(); err != nil {
			return err
		}
	}
	if s.Policy != nil {
		return s.Policy.Validate()
	}
	return nil
}

// Validate checks one route.
func (r *Route) Validate() error {
	if problem := r.problem(); problem != "" {
		return invalid("%s %s: %s", r.Kind, quoted(r.Name), problem)
	}
	return nil
}

func (r *Route) problem() string {
	switch r.Kind {
	case GRPCRoute, HTTPRoute:
	default:
		return "unknown route kind"
	}
	if !dnsSubdomain(r.Name) {
		return "name is not a DNS subdomain"
	}
	if r.Port < 0 || r.Port > 65535 {
		return fmt.Sprintf("port %d is out of range", r.Port)
	}
	if y := r.CreatedAt.UTC().Year(); y < 1 || y > 9999 {
		// A shard's digest is its JSON, which holds years 0 to 9999 only.
		return fmt.Sprintf("creation time %d (Unix seconds) is outside the years 1 to 9999", r.CreatedAt.Unix())
	}
	if len(r.Rules) == 0 {
		return "no rules"
	}
	if len(r.Rules) > MaxRules {
		return fmt.Sprintf("%d rules (at most %d)", len(r.Rules), MaxRules)
	}
	matches := 0
	for i := range r.Rules {
		matches += len(r.Rules[i].Matches)
		if p := r.Rules[i].problem(r.Kind); p != "" {
			return fmt.Sprintf("rule %d: %s", i+1, p)
		}
	}
	if matches > MaxMatchesPerRoute {
		return fmt.Sprintf("%d matches across the rules (at most %d)", matches, MaxMatchesPerRoute)
	}
	return ""
}

func (rule *Rule) problem(kind RouteKind) string {
	if len(rule.Matches) > MaxMatches {
		return fmt.Sprintf("%d matches (at most %d)", len(rule.Matches), MaxMatches)
	}
	for i := range rule.Matches {
		if p := rule.Matches[i].problem(kind); p != "" {
			return fmt.Sprintf("match %d: %s", i+1, p)
		}
	}
	if len(rule.Backends) > MaxBackends {
		return fmt.Sprintf("%d backends (at most %d)", len(rule.Backends), MaxBackends)
	}
	for i, b := range rule.Backends {
		if p := b.problem(); p != "" {
			return fmt.Sprintf("backend %d: %s", i+1, p)
		}
	}
	if kind == GRPCRoute && (rule.Timeout != 0 || rule.Retry != nil) {
		return "a GRPCRoute has no timeout or retry (a TrafficPolicy sets them)"
	}
	if p := durationProblem("timeout", rule.Timeout); p != "" {
		return p
	}
	if rule.Retry != nil {
		if p := rule.Retry.problem(false); p != "" {
			return "retry: " + p
		}
	}
	if len(rule.SetHeaders) > MaxHeaders {
		return fmt.Sprintf("%d headers set (at most %d)", len(rule.SetHeaders), MaxHeaders)
	}
	for i, h := range rule.SetHeaders {
		if p := headerProblem(h.Name, h.Value); p != "" {
			return "set header: " + p
		}
		for _, o := range rule.SetHeaders[:i] {
			if lower(o.Name) == lower(h.Name) {
				return fmt.Sprintf("header %s is set twice", quoted(h.Name))
			}
		}
	}
	return ""
}

func (m *Match) problem(kind RouteKind) string {
	switch {
	case kind == GRPCRoute && m.Path != nil:
		return "a GRPCRoute matches methods, not paths"
	case kind == HTTPRoute && m.Method != nil:
		return "an HTTPRoute matches paths, not gRPC methods"
	}
	if m.Method != nil {
		if p := m.Method.problem(); p != "" {
			return "method: " + p
		}
	}
	if m.Path != nil {
		if p := m.Path.problem(); p != "" {
			return "path: " + p
		}
	}
	if len(m.Headers) > MaxHeaders {
		return fmt.Sprintf("%d header matches (at most %d)", len(m.Headers), MaxHeaders)
	}
	for i, h := range m.Headers {
		if p := h.problem(); p != "" {
			return fmt.Sprintf("header %d: %s", i+1, p)
		}
		for _, o := range m.Headers[:i] {
			if o.Name == h.Name {
				return fmt.Sprintf("header %s is matched twice", quoted(h.Name))
			}
		}
	}
	return ""
}

// gRPC names as the Gateway API admits them in an Exact method match.
var (
	grpcServiceName = regexp.MustCompile(`^[A-Za-z_][A-Za-z_0-9]*(\.[A-Za-z_][A-Za-z_0-9]*)*$`)
	grpcMethodName  = regexp.MustCompile(`^[A-Za-z_][A-Za-z_0-9]*$`)
)

func (m *MethodMatch) problem() string {
	if len(m.Service) > MaxPatternBytes || len(m.Method) > MaxPatternBytes {
		return fmt.Sprintf("longer than %d bytes", MaxPatternBytes)
	}
	switch m.Type {
	case Exact:
		if m.Service == "" && m.Method == "" {
			return "names neither a service nor a method"
		}
		if m.Service != "" && !grpcServiceName.MatchString(m.Service) {
			return fmt.Sprintf("service %s is not a gRPC service name", quoted(m.Service))
		}
		if m.Method != "" && !grpcMethodName.MatchString(m.Method) {
			return fmt.Sprintf("method %s is not a gRPC method name", quoted(m.Method))
		}
	case RegularExpression:
		if m.Service == "" && m.Method == "" {
			return "names neither a service nor a method"
		}
		for _, re := range []string{m.Service, m.Method} {
			if re == "" {
				continue // any service, or any method
			}
			if p := regexProblem(re); p != "" {
				return p
			}
		}
	default:
		return fmt.Sprintf("unknown match type %s", quoted(string(m.Type)))
	}
	return ""
}

func (m *PathMatch) problem() string {
	if len(m.Value) > MaxPatternBytes {
		return fmt.Sprintf("longer than %d bytes", MaxPatternBytes)
	}
	switch m.Type {
	case Exact, PathPrefix:
		if !strings.HasPrefix(m.Value, "/") {
			return fmt.Sprintf("%s does not start with /", quoted(m.Value))
		}
		if strings.Contains(m.Value, "//") || strings.ContainsAny(m.Value, "?#") || !printable(m.Value) {
			return fmt.Sprintf("%s is not a plain path", quoted(m.Value))
		}
	case RegularExpression:
		return regexProblem(m.Value)
	default:
		return fmt.Sprintf("unknown match type %s", quoted(string(m.Type)))
	}
	return ""
}

func (h *HeaderMatch) problem() string {
	switch h.Type {
	case Exact:
		return headerProblem(h.Name, h.Value)
	case RegularExpression:
		if p := headerProblem(h.Name, ""); p != "" {
			return p
		}
		if len(h.Value) > MaxPatternBytes {
			return fmt.Sprintf("longer than %d bytes", MaxPatternBytes)
		}
		return regexProblem(h.Value)
	default:
		return fmt.Sprintf("unknown match type %s", quoted(string(h.Type)))
	}
}

func (b *Backend) problem() string {
	switch b.Kind {
	case BackendService, BackendServiceImport:
	default:
		return fmt.Sprintf("kind %s is neither a Service nor a ServiceImport", quoted(string(b.Kind)))
	}
	if !dnsLabel(b.Name) {
		return fmt.Sprintf("name %s is not a service name", quoted(b.Name))
	}
	if b.Port < 0 || b.Port > 65535 {
		return fmt.Sprintf("port %d is out of range", b.Port)
	}
	if b.Port == 0 && b.Kind == BackendService {
		return "a Service backend needs a port"
	}
	if b.Weight < 0 || b.Weight > MaxWeight {
		return fmt.Sprintf("weight %d is out of range 0-%d", b.Weight, MaxWeight)
	}
	return ""
}

func (r *Retry) problem(grpc bool) string {
	if r.Attempts < 1 || r.Attempts > MaxRetryAttempts {
		return fmt.Sprintf("attempts %d is out of range 1-%d", r.Attempts, MaxRetryAttempts)
	}
	if p := durationProblem("backoff", r.Backoff); p != "" {
		return p
	}
	if grpc {
		if len(r.HTTPCodes) > 0 {
			return "retries by gRPC status, not HTTP status"
		}
		if len(r.GRPCCodes) == 0 {
			return "names no gRPC status to retry on"
		}
		for i, c := range r.GRPCCodes {
			if !slices.Contains(retryableGRPCCodes, c) {
				return fmt.Sprintf("gRPC status %s cannot be retried on (one of %s)", quoted(c), strings.Join(retryableGRPCCodes, ", "))
			}
			if slices.Contains(r.GRPCCodes[:i], c) {
				return fmt.Sprintf("gRPC status %s is named twice", quoted(c))
			}
		}
		return ""
	}
	if len(r.GRPCCodes) > 0 {
		return "an HTTPRoute retries by HTTP status"
	}
	if len(r.HTTPCodes) > 100 {
		return "more than 100 status codes"
	}
	for _, c := range r.HTTPCodes {
		if c < 400 || c > 599 {
			return fmt.Sprintf("HTTP status %d is out of range 400-599", c)
		}
	}
	return ""
}

// Validate checks one policy.
func (p *Policy) Validate() error {
	if problem := p.problem(); problem != "" {
		return invalid("TrafficPolicy %s: %s", quoted(p.Name), problem)
	}
	return nil
}

func (p *Policy) problem() string {
	if !dnsSubdomain(p.Name) {
		return "name is not a DNS subdomain"
	}
	if lb := p.LoadBalancer; lb != nil {
		if q := lb.problem(); q != "" {
			return "loadBalancer: " + q
		}
	}
	if l := p.Locality; l != nil {
		if q := l.problem(); q != "" {
			return "locality: " + q
		}
	}
	if o := p.OutlierDetection; o != nil {
		if q := o.problem(); q != "" {
			return "outlierDetection: " + q
		}
	}
	if q := durationProblem("timeout", p.Timeout); q != "" {
		return q
	}
	if p.Retry != nil {
		if q := p.Retry.problem(true); q != "" {
			return "retry: " + q
		}
	}
	return ""
}

func (lb *LoadBalancer) problem() string {
	switch lb.Algorithm {
	case RoundRobin, LeastRequest, RingHash, WeightedRoundRobin:
	default:
		return fmt.Sprintf("unknown algorithm %s", quoted(string(lb.Algorithm)))
	}
	if lb.ChoiceCount != 0 {
		if lb.Algorithm != LeastRequest {
			return "choiceCount is for LeastRequest"
		}
		if lb.ChoiceCount < minChoiceCount || lb.ChoiceCount > maxChoiceCount {
			return fmt.Sprintf("choiceCount %d is out of range %d-%d", lb.ChoiceCount, minChoiceCount, maxChoiceCount)
		}
	}
	if lb.HashHeader != "" {
		if lb.Algorithm != RingHash {
			return "hashHeader is for RingHash"
		}
		if q := headerProblem(lb.HashHeader, ""); q != "" {
			return "hashHeader: " + q
		}
	}
	return ""
}

func (l *LocalityPolicy) problem() string {
	set := 0
	for _, on := range []bool{l.Off, len(l.FailoverPriority) > 0, len(l.Failover) > 0, len(l.Distribute) > 0} {
		if on {
			set++
		}
	}
	if set > 1 {
		return "at most one of off, failoverPriority, failover and distribute"
	}
	if len(l.FailoverPriority) > maxFailoverPriority {
		return fmt.Sprintf("%d failoverPriority labels (at most %d)", len(l.FailoverPriority), maxFailoverPriority)
	}
	known := []string{LabelCluster, LabelNetwork, LabelRegion, LabelZone}
	for i, label := range l.FailoverPriority {
		if !slices.Contains(known, label) {
			return fmt.Sprintf("failoverPriority label %s is not one Nave knows of every endpoint (%s)", quoted(label), strings.Join(known, ", "))
		}
		if slices.Contains(l.FailoverPriority[:i], label) {
			return fmt.Sprintf("failoverPriority names %s twice", quoted(label))
		}
	}
	if len(l.Failover) > MaxLocalityRules || len(l.Distribute) > MaxLocalityRules {
		return fmt.Sprintf("more than %d failover or distribute entries", MaxLocalityRules)
	}
	for i, f := range l.Failover {
		if !localityName(f.From) || !localityName(f.To) {
			return fmt.Sprintf("failover %d: regions must be non-empty names of at most %d bytes", i+1, MaxLocalityBytes)
		}
		if f.From == f.To {
			return fmt.Sprintf("failover %d: from and to are both %s", i+1, quoted(f.From))
		}
		for _, o := range l.Failover[:i] {
			if o.From == f.From {
				return fmt.Sprintf("failover from %s is given twice", quoted(f.From))
			}
		}
	}
	for i, d := range l.Distribute {
		if q := d.problem(); q != "" {
			return fmt.Sprintf("distribute %d: %s", i+1, q)
		}
		for _, o := range l.Distribute[:i] {
			if o.From == d.From {
				return fmt.Sprintf("distribute from %s is given twice", quoted(d.From))
			}
		}
	}
	return ""
}

func (d *Distribution) problem() string {
	if !localityPattern(d.From) {
		return fmt.Sprintf("from %s is not region[/zone[/subzone]] (each a name or *)", quoted(d.From))
	}
	if parts := strings.Split(d.From, "/"); len(parts) == 3 && parts[2] != "*" {
		// Clients are grouped by region and zone: a subzone names none.
		return fmt.Sprintf("from %s names a subzone: clients are told apart by region and zone only (use *)", quoted(d.From))
	}
	if len(d.To) == 0 || len(d.To) > MaxLocalityRules {
		return fmt.Sprintf("to lists %d localities (1-%d)", len(d.To), MaxLocalityRules)
	}
	sum := uint64(0)
	for i, t := range d.To {
		if !localityPattern(t.Locality) {
			return fmt.Sprintf("to %s is not region[/zone[/subzone]] (each a name or *)", quoted(t.Locality))
		}
		for _, o := range d.To[:i] {
			if o.Locality == t.Locality {
				return fmt.Sprintf("to names %s twice", quoted(t.Locality))
			}
		}
		sum += uint64(t.Weight)
	}
	if sum != distributionWeightOf {
		return fmt.Sprintf("weights sum to %d, not %d", sum, distributionWeightOf)
	}
	return ""
}

func (o *OutlierDetection) problem() string {
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"interval", o.Interval}, {"baseEjectionTime", o.BaseEjectionTime}, {"maxEjectionTime", o.MaxEjectionTime}} {
		if q := durationProblem(d.name, d.d); q != "" {
			return q
		}
	}
	if o.MaxEjectionPercent > maxEjectionPercent {
		return fmt.Sprintf("maxEjectionPercent %d is above 100", o.MaxEjectionPercent)
	}
	if o.ConsecutiveErrors == 0 && o.FailurePercentage == nil && o.SuccessRate == nil {
		return "names no detector (consecutiveErrors, failurePercentage or successRate)"
	}
	if f := o.FailurePercentage; f != nil && f.Threshold > maxFailureThreshold {
		return fmt.Sprintf("failurePercentage threshold %d is above 100", f.Threshold)
	}
	return ""
}

func durationProblem(name string, d time.Duration) string {
	switch {
	case d < 0:
		return name + " is negative"
	case d > MaxDuration:
		return fmt.Sprintf("%s %s is longer than %s", name, d, MaxDuration)
	case d != 0 && d < time.Millisecond:
		return fmt.Sprintf("%s %s is shorter than 1ms", name, d)
	}
	return ""
}

func headerProblem(name, value string) string {
	if name == "" || len(name) > MaxHeaderNameBytes {
		return fmt.Sprintf("header name must be 1-%d bytes", MaxHeaderNameBytes)
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return fmt.Sprintf("header name %s is not an HTTP token", quoted(name))
		}
	}
	if strings.HasPrefix(lower(name), "grpc-") {
		return fmt.Sprintf("header %s is reserved", quoted(name))
	}
	if len(value) > MaxValueBytes {
		return fmt.Sprintf("header value longer than %d bytes", MaxValueBytes)
	}
	if !printable(value) {
		return "header value has control characters"
	}
	return ""
}

func regexProblem(re string) string {
	if re == "" {
		return "regular expression is empty"
	}
	if len(re) > MaxPatternBytes {
		return fmt.Sprintf("regular expression longer than %d bytes", MaxPatternBytes)
	}
	// Size the program before compiling it: a short expression can repeat
	// its way to a million instructions, which the hub and every client
	// would compile.
	parsed, err := syntax.Parse(re, syntax.Perl)
	if err == nil {
		if n := programSize(parsed.Simplify()); n > MaxRegexProgram {
			return fmt.Sprintf("regular expression %s is too complex (about %d instructions or more, at most %d)", quoted(re), n, MaxRegexProgram)
		}
	}
	if _, err := regexp.Compile(re); err != nil {
		// The error repeats the expression: say only what is wrong.
		var syntax *syntax.Error
		reason := err.Error()
		if errors.As(err, &syntax) {
			reason = string(syntax.Code)
		}
		return fmt.Sprintf("regular expression %s: %s", quoted(re), reason)
	}
	return ""
}

// isTokenChar: RFC 9110 token characters.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

func localityName(s string) bool {
	return s != "" && len(s) <= MaxLocalityBytes && printable(s) && !strings.ContainsAny(s, "/* ")
}

func localityPattern(s string) bool {
	if len(s) > MaxLocalityBytes {
		return false
	}
	parts := strings.Split(s, "/")
	if len(parts) > 3 {
		return false
	}
	for _, p := range parts {
		if p != "*" && !localityName(p) {
			return false
		}
	}
	return true
}

// dnsLabel: ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$, at most 63 bytes.
func dnsLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// dnsSubdomain: dot-separated DNS labels, at most 253 bytes.
func dnsSubdomain(s string) bool {
	if len(s) > MaxNameBytes {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if !dnsLabel(label) {
			return false
		}
	}
	return true
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// quoted quotes s for an error message, cut to 64 bytes.
func quoted(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strconv.Quote(s)
}

// programSize estimates the instructions re compiles to, repetitions
// expanded, stopping once past MaxRegexProgram.
func programSize(re *syntax.Regexp) int {
	const past = MaxRegexProgram + 1
	sum := func(subs []*syntax.Regexp, n int) int {
		for _, sub := range subs {
			if n += programSize(sub); n > past {
				return past
			}
		}
		return n
	}
	switch re.Op {
	case syntax.OpLiteral:
		return max(len(re.Rune), 1)
	case syntax.OpConcat, syntax.OpAlternate:
		return sum(re.Sub, 1)
	case syntax.OpCapture, syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		return sum(re.Sub, 2)
	case syntax.OpRepeat:
		times := re.Max
		if times < 0 {
			times = re.Min + 1
		}
		one := sum(re.Sub, 1)
		if times > 0 && one > past/times {
			return past
		}
		return one * max(times, 1)
	}
	return 1
}
