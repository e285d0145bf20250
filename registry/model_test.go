package registry

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseServiceKey(t *testing.T) {
	tests := []struct {
		in      string
		want    ServiceKey
		wantErr bool
	}{
		{in: "shop/web", want: ServiceKey{"shop", "web"}},
		{in: "a/b", want: ServiceKey{"a", "b"}},
		{in: "", wantErr: true},
		{in: "shop", wantErr: true},
		{in: "/web", wantErr: true},
		{in: "shop/", wantErr: true},
		{in: "/", wantErr: true},
		{in: "shop/web/extra", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseServiceKey(tt.in)
		if tt.wantErr {
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Errorf("ParseServiceKey(%q) = %v, %v; want an ErrInvalid error", tt.in, got, err)
			}
			if err != nil && !strings.Contains(err.Error(), tt.in) {
				t.Errorf("ParseServiceKey(%q) error %q does not quote the input", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseServiceKey(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if got.String() != tt.in {
			t.Errorf("ParseServiceKey(%q).String() = %q, want the input back", tt.in, got.String())
		}
	}
}

func TestServiceKeyHostname(t *testing.T) {
	tests := []struct {
		key  ServiceKey
		want string
	}{
		{ServiceKey{"shop", "web"}, "web.shop.svc.clusterset.local"},
		{ServiceKey{"kube-system", "kube-dns"}, "kube-dns.kube-system.svc.clusterset.local"},
	}
	for _, tt := range tests {
		if got := tt.key.Hostname(); got != tt.want {
			t.Errorf("%v.Hostname() = %q, want %q", tt.key, got, tt.want)
		}
	}
}

func TestServiceKeyCompare(t *testing.T) {
	keys := []ServiceKey{{"b", "a"}, {"a", "b"}, {"a", "a"}}
	slices.SortFunc(keys, ServiceKey.Compare)
	want := []ServiceKey{{"a", "a"}, {"a", "b"}, {"b", "a"}}
	if !slices.Equal(keys, want) {
		t.Errorf("sorted keys = %v, want %v", keys, want)
	}
}

func TestLocalityString(t *testing.T) {
	tests := []struct {
		l    Locality
		want string
	}{
		{Locality{Region: "us-east-1", Zone: "us-east-1a"}, "us-east-1/us-east-1a"},
		{Locality{Region: "us-east-1", Zone: "us-east-1a", Subzone: "rack1"}, "us-east-1/us-east-1a/rack1"},
		{Locality{Region: "eu"}, "eu/"},
		{Locality{}, "/"},
	}
	for _, tt := range tests {
		if got := tt.l.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.l, got, tt.want)
		}
	}
	if !(Locality{}).IsZero() || (Locality{Subzone: "x"}).IsZero() {
		t.Error("IsZero is wrong")
	}
}

func TestEndpointHealth(t *testing.T) {
	tests := []struct {
		c    Conditions
		want Health
	}{
		{Conditions{Ready: true, Serving: true}, Healthy},
		{Conditions{Ready: true}, Healthy},
		{Conditions{Serving: true, Terminating: true}, Draining},
		{Conditions{Serving: true}, Excluded},
		{Conditions{Terminating: true}, Excluded},
		{Conditions{}, Excluded},
	}
	for _, tt := range tests {
		e := Endpoint{Conditions: tt.c}
		if got := e.Health(); got != tt.want {
			t.Errorf("Health(%+v) = %v, want %v", tt.c, got, tt.want)
		}
	}
}

// richShard has several ports, endpoints, addresses and endpoint ports, each already in normalized order.
func richShard() *Shard {
	return &Shard{
		Cluster:    "east",
		Service:    keyWeb,
		ExportedAt: t0,
		Ports: []ServicePort{
			udp("dns-udp", 53), tcp("dns-tcp", 53),
			{Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "http"}, tcp("grpc", 9090),
		},
		Endpoints: []Endpoint{
			{
				Addresses: ips("10.0.0.1", "fd00::1"),
				Ports:     []EndpointPort{eport("dns-tcp", 53), eport("dns-udp", 53), eport("grpc", 9090), eport("http", 8080)},
				Locality:  Locality{Region: "r1", Zone: "z1", Subzone: "s1"}, NodeName: "n1", Hostname: "h1",
				Conditions: ready(),
			},
			{
				Addresses:  ips("10.0.0.2"),
				Ports:      []EndpointPort{eport("http", 8080)},
				Locality:   Locality{Region: "r1", Zone: "z2"},
				Conditions: draining(),
			},
			{
				Addresses:  ips("10.0.1.9", "fd00::9"),
				Ports:      []EndpointPort{eport("grpc", 9091), eport("http", 8081)},
				Conditions: notReady(),
			},
		},
	}
}

func TestNormalizeOrderIndependent(t *testing.T) {
	a := richShard()
	a.Normalize()

	b := richShard()
	// Same content in another order, and the same export time in another zone with sub-second noise.
	slices.Reverse(b.Ports)
	slices.Reverse(b.Endpoints)
	for i := range b.Endpoints {
		slices.Reverse(b.Endpoints[i].Addresses)
		slices.Reverse(b.Endpoints[i].Ports)
	}
	b.ExportedAt = t0.In(time.FixedZone("CET", 3600)).Add(700 * time.Millisecond)
	b.Normalize()

	if !a.Equal(b) || !b.Equal(a) {
		t.Fatalf("shuffled shard not Equal after Normalize:\n%+v\n%+v", a, b)
	}
	if a.Hash() != b.Hash() {
		t.Errorf("shuffled shard hashes differ: %v vs %v", a.Hash(), b.Hash())
	}
	if a.ExportedAt.Location() != time.UTC || a.ExportedAt.Nanosecond() != 0 {
		t.Errorf("ExportedAt = %v, want UTC whole seconds", a.ExportedAt)
	}

	// A normalized shard is stable under Normalize.
	c := cloneShard(a)
	c.Normalize()
	if !a.Equal(c) || a.Hash() != c.Hash() {
		t.Error("Normalize is not idempotent")
	}

	// Many random permutations all normalize to the same shard.
	for seed := range 20 {
		p := richShard()
		shuffle(p.Ports, seed)
		shuffle(p.Endpoints, seed+1)
		for i := range p.Endpoints {
			shuffle(p.Endpoints[i].Addresses, seed+2+i)
			shuffle(p.Endpoints[i].Ports, seed+3+i)
		}
		p.Normalize()
		if !a.Equal(p) || a.Hash() != p.Hash() {
			t.Fatalf("permutation %d normalized differently: %+v", seed, p)
		}
	}
}

// shuffle permutes s deterministically (a simple LCG keeps the test reproducible without a global rand).
func shuffle[T any](s []T, seed int) {
	x := uint64(seed)*6364136223846793005 + 1442695040888963407
	for i := len(s) - 1; i > 0; i-- {
		x = x*6364136223846793005 + 1442695040888963407
		j := int((x >> 33) % uint64(i+1))
		s[i], s[j] = s[j], s[i]
	}
}

func TestHashChangesWithEveryField(t *testing.T) {
	tests := []struct {
		name   string
		change func(s *Shard)
	}{
		{"cluster", func(s *Shard) { s.Cluster = "west" }},
		{"namespace", func(s *Shard) { s.Service.Namespace = "shop2" }},
		{"name", func(s *Shard) { s.Service.Name = "web2" }},
		{"exported at", func(s *Shard) { s.ExportedAt = s.ExportedAt.Add(time.Second) }},
		{"headless", func(s *Shard) { s.Headless = true }},
		{"port name", func(s *Shard) { s.Ports[2].Name = "web" }},
		{"port number", func(s *Shard) { s.Ports[2].Port = 81 }},
		{"port protocol", func(s *Shard) { s.Ports[3].Protocol = ProtocolSCTP }},
		{"port appProtocol", func(s *Shard) { s.Ports[2].AppProtocol = "h2c" }},
		{"port appProtocol added", func(s *Shard) { s.Ports[3].AppProtocol = "grpc" }},
		{"port added", func(s *Shard) { s.Ports = append(s.Ports, tcp("admin", 9901)) }},
		{"port removed", func(s *Shard) { s.Ports = s.Ports[:3] }},
		{"endpoint address", func(s *Shard) { s.Endpoints[1].Addresses = ips("10.0.0.3") }},
		{"endpoint address added", func(s *Shard) { s.Endpoints[1].Addresses = ips("10.0.0.2", "fd00::2") }},
		{"endpoint port name", func(s *Shard) { s.Endpoints[1].Ports[0].Name = "web" }},
		{"endpoint port number", func(s *Shard) { s.Endpoints[1].Ports[0].Port = 8081 }},
		{"endpoint port added", func(s *Shard) { s.Endpoints[1].Ports = append(s.Endpoints[1].Ports, eport("grpc", 9090)) }},
		{"region", func(s *Shard) { s.Endpoints[0].Locality.Region = "r2" }},
		{"zone", func(s *Shard) { s.Endpoints[0].Locality.Zone = "z9" }},
		{"subzone", func(s *Shard) { s.Endpoints[0].Locality.Subzone = "s2" }},
		{"node name", func(s *Shard) { s.Endpoints[0].NodeName = "n2" }},
		{"hostname", func(s *Shard) { s.Endpoints[0].Hostname = "h2" }},
		{"ready", func(s *Shard) { s.Endpoints[0].Conditions.Ready = false }},
		{"serving", func(s *Shard) { s.Endpoints[1].Conditions.Serving = false }},
		{"terminating", func(s *Shard) { s.Endpoints[1].Conditions.Terminating = false }},
		{"endpoint removed", func(s *Shard) { s.Endpoints = s.Endpoints[:2] }},
		{"endpoint added", func(s *Shard) { s.Endpoints = append(s.Endpoints, endpoint("10.9.9.9")) }},
	}
	base := richShard()
	base.Normalize()
	seen := map[Hash]string{base.Hash(): "base"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := cloneShard(base)
			tt.change(s)
			s.Normalize()
			if base.Equal(s) || s.Equal(base) {
				t.Errorf("Equal is true after changing the %s", tt.name)
			}
			h := s.Hash()
			if prev, ok := seen[h]; ok {
				t.Errorf("hash after changing the %s equals hash of %s", tt.name, prev)
			}
			seen[h] = tt.name
			if again := cloneShard(s).Hash(); again != h {
				t.Errorf("Hash is not deterministic: %v then %v", h, again)
			}
		})
	}
	if got := cloneShard(base); !got.Equal(base) || got.Hash() != base.Hash() {
		t.Error("a deep copy is not Equal / does not hash the same")
	}
}

// Equal is the registry's "nothing changed" test and Hash feeds the digests spokes and hubs compare:
// two shards that are Equal must hash the same, or a digest never converges (see Apply below).
func TestEqualShardsHashEqually(t *testing.T) {
	tests := []struct {
		name string
		a, b func(s *Shard)
	}{
		{
			name: "nil and empty endpoints",
			a:    func(s *Shard) { s.Endpoints = nil },
			b:    func(s *Shard) { s.Endpoints = []Endpoint{} },
		},
		{
			name: "nil and empty endpoint ports",
			a:    func(s *Shard) { s.Endpoints[1].Ports = nil },
			b:    func(s *Shard) { s.Endpoints[1].Ports = []EndpointPort{} },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := richShard(), richShard()
			tt.a(a)
			tt.b(b)
			a.Normalize()
			b.Normalize()
			if !a.Equal(b) {
				t.Skip("not Equal: nothing to check")
			}
			if a.Hash() != b.Hash() {
				t.Errorf("Equal shards hash differently: %v vs %v", a.Hash(), b.Hash())
			}
		})
	}
}

func TestShardEqualNil(t *testing.T) {
	var a, b *Shard
	s := richShard()
	if !a.Equal(b) {
		t.Error("nil.Equal(nil) = false")
	}
	if a.Equal(s) || s.Equal(a) {
		t.Error("nil and non-nil shards are Equal")
	}
}

func TestDigest(t *testing.T) {
	a := shard("east", keyWeb, []ServicePort{tcp("http", 80)}, endpoint("10.0.0.1", eport("http", 80)))
	b := shard("east", keyAPI, []ServicePort{tcp("grpc", 9090)}, endpoint("10.0.0.2", eport("grpc", 9090)))
	if got := Digest(map[ServiceKey]*Shard{}); got != ZeroHash {
		t.Errorf("Digest(empty) = %v, want ZeroHash", got)
	}
	if got := Digest(map[ServiceKey]*Shard(nil)); got != ZeroHash {
		t.Errorf("Digest(nil) = %v, want ZeroHash", got)
	}
	one := Digest(map[ServiceKey]*Shard{keyWeb: a})
	if one != a.Hash() {
		t.Errorf("Digest of one shard = %v, want its hash %v", one, a.Hash())
	}
	both := Digest(map[ServiceKey]*Shard{keyWeb: a, keyAPI: b})
	if both == one || both == ZeroHash {
		t.Errorf("Digest of two shards = %v", both)
	}
	if both != xorHash(a.Hash(), b.Hash()) {
		t.Error("Digest is not the XOR of the member hashes")
	}
}

func TestHashText(t *testing.T) {
	h := richShard().Hash()
	text, err := h.MarshalText()
	if err != nil || string(text) != h.String() || len(text) != 32 {
		t.Fatalf("MarshalText = %q, %v", text, err)
	}
	var back Hash
	if err := back.UnmarshalText(text); err != nil || back != h {
		t.Fatalf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, h)
	}
	for _, bad := range []string{"", "abc", strings.Repeat("0", 31), strings.Repeat("0", 33)} {
		if err := back.UnmarshalText([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("UnmarshalText(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if err := back.UnmarshalText([]byte(strings.Repeat("z", 32))); err == nil {
		t.Error("UnmarshalText accepted non-hex digits")
	}
	if ZeroHash.String() != strings.Repeat("0", 32) {
		t.Errorf("ZeroHash.String() = %q", ZeroHash.String())
	}
}

// xorHash combines two hashes the way a set digest does.
func xorHash(a, b Hash) Hash {
	for i := range a {
		a[i] ^= b[i]
	}
	return a
}
