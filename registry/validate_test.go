package registry

import (
	"errors"
	"net/netip"
	"regexp"
	"strings"
	"testing"
)

// validShard is a shard that passes validation; each case below breaks one rule.
func validShard() *Shard {
	return &Shard{
		Cluster:    "east",
		Service:    keyWeb,
		ExportedAt: t0,
		Ports:      []ServicePort{{Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "http"}, tcp("grpc", 9090)},
		Endpoints: []Endpoint{
			{
				Addresses:  ips("10.0.0.1"),
				Ports:      []EndpointPort{eport("http", 8080), eport("grpc", 9090)},
				Locality:   Locality{Region: "us-east-1", Zone: "us-east-1a", Subzone: "rack_1.b"},
				NodeName:   "ip-10-0-0-1.ec2.internal",
				Hostname:   "web-0",
				Conditions: ready(),
			},
			{
				Addresses:  ips("10.0.0.2", "fd00::2"),
				Ports:      []EndpointPort{eport("http", 8080), eport("grpc", 9090)},
				Locality:   Locality{Region: "us-east-1", Zone: "us-east-1b"},
				Conditions: draining(),
			},
		},
	}
}

func TestShardValidate(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	small := Limits{MaxPorts: 2, MaxEndpoints: 2, MaxAddressesPerEndpoint: 2}
	tests := []struct {
		name   string
		limits Limits // zero: DefaultLimits
		change func(s *Shard)
		// want is a substring of the reason; empty means the shard is valid.
		want string
	}{
		{name: "valid", change: func(s *Shard) {}},
		{name: "valid single unnamed port", change: func(s *Shard) {
			s.Ports = []ServicePort{tcp("", 80)}
		}},
		{name: "valid port range bounds", change: func(s *Shard) {
			s.Ports = []ServicePort{tcp("low", 1), tcp("high", 65535)}
			s.Endpoints[0].Ports = []EndpointPort{eport("low", 1), eport("high", 65535)}
		}},
		{name: "valid same number on TCP and UDP", change: func(s *Shard) {
			s.Ports = []ServicePort{tcp("dns-tcp", 53), udp("dns-udp", 53)}
		}},
		{name: "valid SCTP", change: func(s *Shard) {
			s.Ports = []ServicePort{{Name: "sig", Port: 3868, Protocol: ProtocolSCTP}}
		}},
		{name: "valid no endpoints", change: func(s *Shard) { s.Endpoints = nil }},
		{name: "valid 63-character names", change: func(s *Shard) {
			s.Cluster = ClusterID(long(63))
			s.Service = ServiceKey{Namespace: long(63), Name: long(63)}
			s.Endpoints[0].Hostname = long(63)
			s.Endpoints[0].Locality.Zone = long(63)
		}},
		{name: "valid at the limits", limits: small, change: func(s *Shard) {}},
		{name: "valid appProtocol of 253 characters", change: func(s *Shard) { s.Ports[0].AppProtocol = long(253) }},

		{name: "cluster ID empty", change: func(s *Shard) { s.Cluster = "" }, want: "cluster ID"},
		{name: "cluster ID upper case", change: func(s *Shard) { s.Cluster = "East" }, want: "cluster ID"},
		{name: "cluster ID leading dash", change: func(s *Shard) { s.Cluster = "-east" }, want: "cluster ID"},
		{name: "cluster ID trailing dash", change: func(s *Shard) { s.Cluster = "east-" }, want: "cluster ID"},
		{name: "cluster ID with dot", change: func(s *Shard) { s.Cluster = "us.east" }, want: "cluster ID"},
		{name: "cluster ID too long", change: func(s *Shard) { s.Cluster = ClusterID(long(64)) }, want: "cluster ID"},

		{name: "namespace empty", change: func(s *Shard) { s.Service.Namespace = "" }, want: "namespace"},
		{name: "namespace upper case", change: func(s *Shard) { s.Service.Namespace = "Shop" }, want: "namespace"},
		{name: "namespace with dot", change: func(s *Shard) { s.Service.Namespace = "shop.eu" }, want: "namespace"},
		{name: "namespace too long", change: func(s *Shard) { s.Service.Namespace = long(64) }, want: "namespace"},
		{name: "name empty", change: func(s *Shard) { s.Service.Name = "" }, want: "name"},
		{name: "name starts with digit", change: func(s *Shard) { s.Service.Name = "1web" }, want: "DNS-1035"},
		{name: "name upper case", change: func(s *Shard) { s.Service.Name = "Web" }, want: "DNS-1035"},
		{name: "name too long", change: func(s *Shard) { s.Service.Name = long(64) }, want: "DNS-1035"},

		{name: "no ports", change: func(s *Shard) { s.Ports = nil }, want: "no ports"},
		{name: "port zero", change: func(s *Shard) { s.Ports[0].Port = 0 }, want: "out of range"},
		{name: "port negative", change: func(s *Shard) { s.Ports[0].Port = -80 }, want: "out of range"},
		{name: "port above 65535", change: func(s *Shard) { s.Ports[1].Port = 65536 }, want: "out of range"},
		{name: "protocol empty", change: func(s *Shard) { s.Ports[0].Protocol = "" }, want: "unknown protocol"},
		{name: "protocol lower case", change: func(s *Shard) { s.Ports[0].Protocol = "tcp" }, want: "unknown protocol"},
		{name: "protocol HTTP", change: func(s *Shard) { s.Ports[0].Protocol = "HTTP" }, want: "unknown protocol"},
		{name: "port name upper case", change: func(s *Shard) { s.Ports[0].Name = "HTTP" }, want: "port name"},
		{name: "port name underscore", change: func(s *Shard) { s.Ports[0].Name = "http_alt" }, want: "port name"},
		{name: "port name too long", change: func(s *Shard) { s.Ports[0].Name = long(64) }, want: "port name"},
		{name: "unnamed port among several", change: func(s *Shard) { s.Ports[1].Name = "" }, want: "no name"},
		{name: "appProtocol too long", change: func(s *Shard) { s.Ports[0].AppProtocol = long(254) }, want: "appProtocol"},
		{name: "duplicate port name", change: func(s *Shard) { s.Ports[1].Name = "http" }, want: "duplicate port name"},
		{name: "duplicate port number and protocol", change: func(s *Shard) { s.Ports[1].Port = 80 }, want: "duplicate port 80/TCP"},

		{name: "endpoint without address", change: func(s *Shard) { s.Endpoints[1].Addresses = nil }, want: "no address"},
		{name: "too many addresses", limits: small, change: func(s *Shard) {
			s.Endpoints[1].Addresses = ips("10.0.0.2", "10.0.0.3", "10.0.0.4")
		}, want: "addresses, more than the limit of 2"},
		{name: "invalid address", change: func(s *Shard) { s.Endpoints[0].Addresses = []netip.Addr{{}} }, want: "unicast"},
		{name: "unspecified IPv4", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("0.0.0.0") }, want: "unicast"},
		{name: "unspecified IPv6", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("::") }, want: "unicast"},
		{name: "multicast IPv4", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("224.0.0.1") }, want: "unicast"},
		{name: "multicast IPv6", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("ff02::1") }, want: "unicast"},
		{name: "IPv6 with zone", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("fe80::1%eth0") }, want: "unicast"},
		{name: "IPv4 limited broadcast", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("255.255.255.255") }, want: "unicast"},
		{name: "IPv4-mapped broadcast", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("::ffff:255.255.255.255") }, want: "unicast"},
		{name: "IPv4-mapped unspecified", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("::ffff:0.0.0.0") }, want: "unicast"},
		{name: "IPv4-mapped multicast", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("::ffff:239.1.2.3") }, want: "unicast"},
		{name: "valid subnet broadcast-looking address", change: func(s *Shard) { s.Endpoints[0].Addresses = ips("10.0.0.255") }},
		{name: "duplicate address across endpoints", change: func(s *Shard) {
			s.Endpoints[1].Addresses = ips("fd00::2", "10.0.0.1")
		}, want: "duplicate endpoint address 10.0.0.1"},
		{name: "duplicate address within endpoint", change: func(s *Shard) {
			s.Endpoints[1].Addresses = ips("fd00::2", "fd00::2")
		}, want: "duplicate endpoint address fd00::2"},
		{name: "endpoint port zero", change: func(s *Shard) { s.Endpoints[0].Ports[0].Port = 0 }, want: "out of range"},
		{name: "endpoint port above 65535", change: func(s *Shard) { s.Endpoints[1].Ports[1].Port = 70000 }, want: "out of range"},
		{name: "region with space", change: func(s *Shard) { s.Endpoints[0].Locality.Region = "us east" }, want: "locality"},
		{name: "zone leading dash", change: func(s *Shard) { s.Endpoints[0].Locality.Zone = "-a" }, want: "locality"},
		{name: "zone trailing dot", change: func(s *Shard) { s.Endpoints[0].Locality.Zone = "a." }, want: "locality"},
		{name: "subzone with slash", change: func(s *Shard) { s.Endpoints[0].Locality.Subzone = "rack/1" }, want: "locality"},
		{name: "subzone too long", change: func(s *Shard) { s.Endpoints[0].Locality.Subzone = long(64) }, want: "locality"},
		{name: "node name upper case", change: func(s *Shard) { s.Endpoints[0].NodeName = "Node-1" }, want: "node name"},
		{name: "node name underscore", change: func(s *Shard) { s.Endpoints[0].NodeName = "node_1" }, want: "node name"},
		{name: "node name too long", change: func(s *Shard) {
			s.Endpoints[0].NodeName = strings.Repeat(long(50)+".", 5) + "abcd" // 259 characters
		}, want: "node name"},
		{name: "hostname with dot", change: func(s *Shard) { s.Endpoints[0].Hostname = "web.0" }, want: "hostname"},
		{name: "hostname upper case", change: func(s *Shard) { s.Endpoints[0].Hostname = "Web-0" }, want: "hostname"},
		{name: "hostname too long", change: func(s *Shard) { s.Endpoints[0].Hostname = long(64) }, want: "hostname"},
		{name: "too many ports", limits: small, change: func(s *Shard) {
			s.Ports = append(s.Ports, tcp("admin", 9901))
		}, want: "3 ports, more than the limit of 2"},
		{name: "too many endpoints", limits: small, change: func(s *Shard) {
			s.Endpoints = append(s.Endpoints, endpoint("10.0.0.3"))
		}, want: "3 endpoints, more than the limit of 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validShard()
			tt.change(s)
			lim := tt.limits
			if lim == (Limits{}) {
				lim = DefaultLimits()
			}
			err := s.Validate(lim)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error containing %q", tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %T is not a *ValidationError", err)
			}
			if ve.Service != s.Service {
				t.Errorf("ValidationError.Service = %v, want %v", ve.Service, s.Service)
			}
			if msg := err.Error(); !strings.Contains(msg, "service "+s.Service.String()+":") {
				t.Errorf("error %q does not name service %s", msg, s.Service)
			}
			if !strings.Contains(ve.Reason, tt.want) {
				t.Errorf("reason %q does not contain %q", ve.Reason, tt.want)
			}
		})
	}
}

func TestValidateClusterID(t *testing.T) {
	tests := []struct {
		id ClusterID
		ok bool
	}{
		{"east", true}, {"e", true}, {"0", true}, {"us-east-1", true}, {ClusterID(strings.Repeat("a", 63)), true},
		{"", false}, {"East", false}, {"-east", false}, {"east-", false}, {"e_st", false}, {"e.st", false},
		{ClusterID(strings.Repeat("a", 64)), false},
	}
	for _, tt := range tests {
		err := ValidateClusterID(tt.id)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateClusterID(%q) = %v, want ok=%t", tt.id, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateClusterID(%q) = %v, not ErrInvalid", tt.id, err)
		}
	}
}

func TestValidateServiceKey(t *testing.T) {
	tests := []struct {
		key ServiceKey
		ok  bool
	}{
		{ServiceKey{"shop", "web"}, true},
		{ServiceKey{"0shop", "w-1"}, true}, // namespaces are DNS labels and may start with a digit
		{ServiceKey{"", "web"}, false},
		{ServiceKey{"shop", ""}, false},
		{ServiceKey{"shop", "0web"}, false}, // names are DNS-1035 labels
		{ServiceKey{"Shop", "web"}, false},
		{ServiceKey{"shop", "web-"}, false},
		{ServiceKey{"shop", "we.b"}, false},
	}
	for _, tt := range tests {
		err := ValidateServiceKey(tt.key)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateServiceKey(%v) = %v, want ok=%t", tt.key, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateServiceKey(%v) = %v, not ErrInvalid", tt.key, err)
		}
	}
}

func TestSyntaxesMatchTheirRegexps(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func(string) bool
		re   *regexp.Regexp
	}{
		{"dnsLabel", dnsLabel, regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)},
		{"dns1035Label", dns1035Label, regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)},
		{"dnsSubdomain", dnsSubdomain, regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)},
		{"labelValue", labelValue, regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)},
	} {
		// Every string of up to four characters over an alphabet with one
		// character of each class the syntaxes tell apart.
		alphabet := []byte{'a', 'z', 'A', '0', '9', '-', '.', '_', ' ', 0xc3}
		var check func(s []byte)
		check = func(s []byte) {
			if got, want := tc.fn(string(s)), tc.re.MatchString(string(s)); got != want {
				t.Fatalf("%s(%q) = %v, the regexp says %v", tc.name, s, got, want)
			}
			if len(s) == 4 {
				return
			}
			for _, c := range alphabet {
				check(append(s, c))
			}
		}
		check(nil)
	}
}

// An invalid value is quoted in an error at most maxQuoted bytes long, cut
// at a character's start, with invalid bytes escaped (a 1 MiB name once
// made a 2 MiB NACK).
func TestQuotedIsBounded(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"web", `"web"`},
		{strings.Repeat("a", 100), `"` + strings.Repeat("a", 64) + `"… (100 bytes)`},
		{"\xff" + strings.Repeat("a", 100), `"\xff` + strings.Repeat("a", 63) + `"… (101 bytes)`},
		{strings.Repeat("a", 63) + "€" + strings.Repeat("a", 10), `"` + strings.Repeat("a", 63) + `"… (76 bytes)`},
	} {
		if got := quoted(c.in); got != c.want {
			t.Errorf("quoted(%.20q…) = %s, want %s", c.in, got, c.want)
		}
	}
	s := validShard()
	s.Properties.TrafficDistribution = strings.Repeat("x", 1<<20)
	for what, err := range map[string]error{
		"a 1 MiB namespace":           ValidateServiceKey(ServiceKey{Namespace: strings.Repeat("x", 1<<20), Name: "web"}),
		"a 1 MiB trafficDistribution": s.Validate(DefaultLimits()),
	} {
		if err == nil {
			t.Errorf("%s: valid", what)
		} else if len(err.Error()) > 300 {
			t.Errorf("%s: an error of %d bytes, want at most 300", what, len(err.Error()))
		}
	}
}
