package registry

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/navemesh/nave/traffic"
)

// ErrInvalid marks every validation failure.
var ErrInvalid = errors.New("registry: invalid")

// Limits bound what one shard, and one cluster, may hold, so no peer can make
// the hub hold an unbounded amount.
type Limits struct {
	MaxPorts                int // service ports per shard
	MaxEndpoints            int // endpoints per shard
	MaxAddressesPerEndpoint int
	MaxServicesPerCluster   int
	MaxEndpointsPerCluster  int
}

// DefaultLimits are generous for real services and small enough to bound memory.
func DefaultLimits() Limits {
	return Limits{
		MaxPorts: 100, MaxEndpoints: 10_000, MaxAddressesPerEndpoint: 100,
		MaxServicesPerCluster: 20_000, MaxEndpointsPerCluster: 500_000,
	}
}

// ValidationError says which service a shard was rejected for, and why.
type ValidationError struct {
	Service ServiceKey
	Reason  string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("service %s: %s", e.Service, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// The syntaxes below are Kubernetes' (lengths are checked by the callers),
// written out by hand: every endpoint of every shard is checked, on every
// update and snapshot, and regular expressions made that a third of the
// cost of decoding a snapshot. TestSyntaxesMatchTheirRegexps holds them to
// the regular expressions they replace.

// dnsLabel: ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$
func dnsLabel(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isLowerAlnum(c) && c != '-' {
			return false
		}
	}
	return true
}

// dns1035Label: ^[a-z]([-a-z0-9]*[a-z0-9])?$
func dns1035Label(s string) bool {
	return dnsLabel(s) && s[0] >= 'a' && s[0] <= 'z'
}

// dnsSubdomain: dot-separated dnsLabels.
func dnsSubdomain(s string) bool {
	for {
		i := strings.IndexByte(s, '.')
		if i < 0 {
			return dnsLabel(s)
		}
		if !dnsLabel(s[:i]) {
			return false
		}
		s = s[i+1:]
	}
}

// labelValue, a topology label value: ^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$
func labelValue(s string) bool {
	if s == "" {
		return true
	}
	if !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isAlnum(c byte) bool { return isLowerAlnum(c) || c >= 'A' && c <= 'Z' }

// ValidateClusterID checks that id is a DNS label.
func ValidateClusterID(id ClusterID) error {
	if len(id) > 63 { // not quoted: a peer's megabytes would travel on in the error
		return fmt.Errorf("%w: cluster ID of %d bytes is not a DNS label (at most 63)", ErrInvalid, len(id))
	}
	if len(id) == 0 || !dnsLabel(string(id)) {
		return fmt.Errorf("%w: cluster ID %s is not a DNS label", ErrInvalid, quoted(string(id)))
	}
	return nil
}

// ValidateNetwork checks that n is empty (no network) or a Kubernetes
// label value of at most 63 characters: spokes select their network's
// gateways by a label of that value.
func ValidateNetwork(n Network) error {
	if len(n) > 63 {
		return fmt.Errorf("%w: network of %d bytes is not a label value (at most 63)", ErrInvalid, len(n))
	}
	if !labelValue(string(n)) {
		return fmt.Errorf("%w: network %s is not a label value", ErrInvalid, quoted(string(n)))
	}
	return nil
}

// ValidateServiceKey checks the namespace (DNS label) and name (DNS-1035 label).
func ValidateServiceKey(k ServiceKey) error {
	if problem := serviceKeyProblem(k); problem != "" {
		return fmt.Errorf("%w: %s", ErrInvalid, problem)
	}
	return nil
}

func serviceKeyProblem(k ServiceKey) string {
	if len(k.Namespace) == 0 || len(k.Namespace) > 63 || !dnsLabel(k.Namespace) {
		return fmt.Sprintf("namespace %s is not a DNS label", quoted(k.Namespace))
	}
	if len(k.Name) == 0 || len(k.Name) > 63 || !dns1035Label(k.Name) {
		return fmt.Sprintf("name %s is not a DNS-1035 label", quoted(k.Name))
	}
	return ""
}

// Validate checks a shard against the rules every shard must follow and the
// given limits. The error is a *ValidationError naming the service.
func (s *Shard) Validate(lim Limits) error {
	bad := func(format string, args ...any) error {
		return &ValidationError{Service: s.Service, Reason: fmt.Sprintf(format, args...)}
	}
	if problem := serviceKeyProblem(s.Service); problem != "" {
		return bad("%s", problem)
	}
	if err := ValidateClusterID(s.Cluster); err != nil {
		return bad("cluster ID %s is not a DNS label", quoted(string(s.Cluster)))
	}
	if y := s.ExportedAt.UTC().Year(); y < 1 || y > 9999 {
		return bad("export time %d (Unix seconds) is outside the years 1 to 9999", s.ExportedAt.Unix())
	}
	if len(s.Ports) == 0 && !s.Headless {
		return bad("no ports") // only a headless service may have none (it names pods, not ports)
	}
	if len(s.Ports) > lim.MaxPorts {
		return bad("%d ports, more than the limit of %d", len(s.Ports), lim.MaxPorts)
	}
	if len(s.Endpoints) > lim.MaxEndpoints {
		return bad("%d endpoints, more than the limit of %d", len(s.Endpoints), lim.MaxEndpoints)
	}
	if problem := s.Properties.validate(); problem != "" {
		return bad("%s", problem)
	}
	if err := s.Traffic.Validate(); err != nil {
		return bad("%s", strings.TrimPrefix(err.Error(), traffic.ErrInvalid.Error()+": "))
	}
	if len(s.Traffic.Routes) > 0 {
		var tcp []int32
		for _, p := range s.Ports {
			if p.Protocol == ProtocolTCP {
				tcp = append(tcp, p.Port)
			}
		}
		if n := s.Traffic.BackendRefs(tcp); n > traffic.MaxBackendRefs {
			return bad("the routes send requests to more than %d service ports (a route of every port counts once per port)", traffic.MaxBackendRefs)
		}
	}
	names := map[string]bool{}
	numbers := map[string]bool{}
	for _, p := range s.Ports {
		if p.Port < 1 || p.Port > 65535 {
			return bad("port %d is out of range 1-65535", p.Port)
		}
		switch p.Protocol {
		case ProtocolTCP, ProtocolUDP, ProtocolSCTP:
		default:
			return bad("port %d: unknown protocol %s", p.Port, quoted(string(p.Protocol)))
		}
		if p.Name != "" && (len(p.Name) > 63 || !dnsLabel(p.Name)) {
			return bad("port name %s is not a DNS label", quoted(p.Name))
		}
		if p.Name == "" && len(s.Ports) > 1 {
			return bad("port %d has no name, but the service has several ports", p.Port)
		}
		if len(p.AppProtocol) > 253 {
			return bad("port %d: appProtocol longer than 253 characters", p.Port)
		}
		if names[p.Name] {
			return bad("duplicate port name %s", quoted(p.Name))
		}
		names[p.Name] = true
		key := strconv.Itoa(int(p.Port)) + "/" + string(p.Protocol)
		if numbers[key] {
			return bad("duplicate port %s", key)
		}
		numbers[key] = true
	}
	seen := make(map[string]bool, len(s.Endpoints))
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if err := e.Validate(lim); err != nil {
			return bad("endpoint %d: %v", i, err)
		}
		for _, a := range e.Addresses {
			key := a.Unmap().String() // ::ffff:10.0.0.1 is 10.0.0.1
			if seen[key] {
				return bad("duplicate endpoint address %s", a)
			}
			seen[key] = true
		}
	}
	return nil
}

// broadcast is IPv4's limited broadcast address.
var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// Unicast reports whether a is an address one host can be dialled at:
// valid, without zone, neither unspecified, multicast nor the limited
// broadcast (an IPv4-mapped IPv6 address counts as its IPv4 address).
func Unicast(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" {
		return false
	}
	a = a.Unmap()
	return !a.IsUnspecified() && !a.IsMulticast() && a != broadcast
}

// Validate checks one endpoint on its own (Shard.Validate also checks that
// no address appears twice in a shard). A source can use it to leave out one
// bad endpoint rather than lose the whole service.
func (e *Endpoint) Validate(lim Limits) error {
	if len(e.Addresses) == 0 {
		return errors.New("no address")
	}
	if len(e.Addresses) > lim.MaxAddressesPerEndpoint {
		return fmt.Errorf("%d addresses, more than the limit of %d", len(e.Addresses), lim.MaxAddressesPerEndpoint)
	}
	for _, a := range e.Addresses {
		if !Unicast(a) {
			return fmt.Errorf("address %s is not a unicast IP", quoted(a.String()))
		}
	}
	for _, p := range e.Ports {
		if p.Port < 1 || p.Port > 65535 {
			return fmt.Errorf("%s: port %d is out of range 1-65535", e.Addresses[0], p.Port)
		}
	}
	for _, v := range []string{e.Locality.Region, e.Locality.Zone, e.Locality.Subzone} {
		if len(v) > 63 || !labelValue(v) {
			return fmt.Errorf("%s: locality value %s is not a label value", e.Addresses[0], quoted(v))
		}
	}
	if e.NodeName != "" && (len(e.NodeName) > 253 || !dnsSubdomain(e.NodeName)) {
		return fmt.Errorf("%s: node name %s is not a DNS subdomain", e.Addresses[0], quoted(e.NodeName))
	}
	if e.Hostname != "" && (len(e.Hostname) > 63 || !dnsLabel(e.Hostname)) {
		return fmt.Errorf("%s: hostname %s is not a DNS label", e.Addresses[0], quoted(e.Hostname))
	}
	return nil
}

// maxQuoted bounds how much of an invalid value an error quotes: errors go
// back to the peer that sent the value (NACKs) and into logs.
const maxQuoted = 64

// quoted quotes v (invalid UTF-8 escaped), cut to maxQuoted bytes, at a
// character's start, with its length when longer.
func quoted(v string) string {
	if len(v) <= maxQuoted {
		return strconv.Quote(v)
	}
	cut := maxQuoted
	for i := 0; i < utf8.UTFMax-1 && cut > 0 && !utf8.RuneStart(v[cut]); i++ {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(v[:cut]), len(v))
}
