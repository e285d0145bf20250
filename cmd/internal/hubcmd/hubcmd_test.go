package hubcmd

import (
	"slices"
	"strings"
	"testing"

	"github.com/navemesh/nave/hub"
)

// Lists are trimmed as every list flag is (--etcd-endpoints was split as
// given, spaces and empty items included).
func TestParseTrimsLists(t *testing.T) {
	cfg, _, err := Parse([]string{"--etcd-endpoints", " http://a:2379, http://b:2379 ,", "--join", "x:7946,,y:7946",
		"--cluster-policies", "east=drop, west=keep"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http://a:2379", "http://b:2379"}; !slices.Equal(cfg.EtcdEndpoints, want) {
		t.Errorf("etcd endpoints %q, want %q", cfg.EtcdEndpoints, want)
	}
	if want := []string{"x:7946", "y:7946"}; !slices.Equal(cfg.Join, want) {
		t.Errorf("join %q, want %q", cfg.Join, want)
	}
	if cfg.Liveness.Policies["east"] != hub.PolicyDrop || cfg.Liveness.Policies["west"] != hub.PolicyKeep {
		t.Errorf("policies %v", cfg.Liveness.Policies)
	}
}

// Every problem of the command line is reported at once, not the first
// one a start would trip over.
func TestParseReportsEveryProblemAtOnce(t *testing.T) {
	_, _, err := Parse([]string{
		"--join", "x:7946", // without --etcd-endpoints
		"--xds-policy", "p.yaml", // without --xds-client-ca nor xDS TLS
		"--tls-cert", "c.pem", // without --tls-key
		"--cluster-policy", "sometimes",
		"--cluster-policies", "east=never,west",
		"--clusterset-cidr", "10.0.0.0/8,10.1.0.0/16,not-a-cidr",
		"--max-connections", "-1",
		"--updates-per-second", "-5",
		"--xds-requests-per-second", "-1",
		"--snapshot-interval", "0s",
	})
	if err == nil {
		t.Fatal("parsed")
	}
	for _, want := range []string{
		"need a shared etcd", "--xds-policy needs --xds-client-ca", "need --xds-tls-cert and --xds-tls-key",
		"--tls-cert and --tls-key go together", `--cluster-policy "sometimes"`, `cluster east's policy "never"`,
		`--cluster-policies "west"`, `--clusterset-cidr "not-a-cidr"`, "at most one IPv4 and one IPv6 range",
		"--max-connections -1", "--updates-per-second -5", "--xds-requests-per-second -1", "--snapshot-interval must be positive",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
}
