package registry

import (
	"errors"
	"strings"
	"testing"
)

// A gateway's IP address follows the rules of an endpoint's: one host,
// dialled from another network.
func TestGatewayValidate(t *testing.T) {
	for _, c := range []struct {
		gw   Gateway
		want string // "" valid, else a part of the error
	}{
		{Gateway{"192.0.2.10", 15443}, ""},
		{Gateway{"2001:db8::10", 15443}, ""},
		{Gateway{"gw.east.example.com", 15443}, ""},
		{Gateway{"10.0.0.255", 15443}, ""},
		{Gateway{"0.0.0.0", 15443}, "cannot be dialled"},
		{Gateway{"::", 15443}, "cannot be dialled"},
		{Gateway{"::ffff:0.0.0.0", 15443}, "cannot be dialled"},
		{Gateway{"255.255.255.255", 15443}, "cannot be dialled"},
		{Gateway{"::ffff:255.255.255.255", 15443}, "cannot be dialled"},
		{Gateway{"224.0.0.1", 15443}, "cannot be dialled"},
		{Gateway{"239.255.255.250", 15443}, "cannot be dialled"},
		{Gateway{"ff02::1", 15443}, "cannot be dialled"},
		{Gateway{"::ffff:224.0.0.1", 15443}, "cannot be dialled"},
		{Gateway{"fe80::1%eth0", 15443}, "cannot be dialled"},
		{Gateway{"192.0.2.10", 0}, "port"},
		{Gateway{"192.0.2.10", 65536}, "port"},
		{Gateway{"", 15443}, "neither"},
		{Gateway{"Not_A_Name", 15443}, "neither"},
		{Gateway{strings.Repeat("a", 254), 15443}, "254 bytes"},
		{Gateway{strings.Repeat("a", 1<<20), 15443}, "1048576 bytes"},
	} {
		err := c.gw.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%.40s: %v, want valid", c.gw.Address, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalid)):
			t.Errorf("%.40s: %v, want ErrInvalid saying %q", c.gw.Address, err, c.want)
		case err != nil && len(err.Error()) > 600:
			t.Errorf("%.40s: the error repeats the address (%d bytes)", c.gw.Address, len(err.Error()))
		}
	}
	// What parses is validated the same way.
	for _, s := range []string{"255.255.255.255:15443", "[::ffff:255.255.255.255]:15443", "224.0.0.1:15443", "0.0.0.0:15443"} {
		if _, err := ParseGateway(s); err == nil {
			t.Errorf("ParseGateway(%s) accepted it", s)
		}
	}
	if _, err := NormalizeGateways([]Gateway{{"192.0.2.10", 15443}, {"255.255.255.255", 15443}}); err == nil {
		t.Error("NormalizeGateways accepted the broadcast address")
	}
}

func TestValidateNetwork(t *testing.T) {
	for _, c := range []struct {
		n    Network
		want string
	}{
		{"", ""}, {"net1", ""}, {"east-net", ""}, {"Network_1.eu", ""}, {Network(strings.Repeat("n", 63)), ""},
		{Network(strings.Repeat("n", 64)), "64 bytes"},
		{Network(strings.Repeat("n", 1<<20)), "1048576 bytes"},
		{"-net", "label value"}, {"net/1", "label value"}, {"net 1", "label value"}, {"net.", "label value"},
	} {
		err := ValidateNetwork(c.n)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%.40s: %v, want valid", c.n, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalid)):
			t.Errorf("%.40s: %v, want ErrInvalid saying %q", c.n, err, c.want)
		}
	}
}

// An over-long cluster ID is refused without repeating it.
func TestValidateClusterIDDoesNotRepeatALongID(t *testing.T) {
	err := ValidateClusterID(ClusterID(strings.Repeat("e", 1<<20)))
	if err == nil || len(err.Error()) > 200 || !strings.Contains(err.Error(), "1048576 bytes") {
		t.Fatalf("a cluster ID of 1 MiB: %.200v (%d bytes), want a short error giving its length", err, len(err.Error()))
	}
}
