package hub

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Validate reports every problem of c at once (errors.Join), before
// anything starts: flags that need others, pairs given apart, values out
// of range. What needs the files themselves (certificates, tokens,
// policies) is checked as they load.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.ID == "" {
		bad("--id: a replica needs a name")
	}
	if c.TrustDomain == "" {
		bad("--trust-domain: identities need one")
	}
	if (len(c.Join) > 0 || c.GossipAddr != "") && len(c.EtcdEndpoints) == 0 {
		// Epochs fence a cluster's sessions across replicas only if every replica draws them from one etcd.
		bad("hub replicas (--join, --gossip-addr) need a shared etcd: set --etcd-endpoints")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("--tls-cert and --tls-key go together")
	}
	if c.ClientCAFile != "" && c.TLSCertFile == "" && c.TLSKeyFile == "" {
		bad("--client-ca needs --tls-cert and --tls-key: client certificates travel over TLS")
	}
	if (len(c.Join) > 0 || c.GossipAddr != "") && c.TLSCertFile != "" && c.PeerCAFile == "" {
		bad("hub replicas whose federation port speaks TLS need --peer-ca: the CA that signed the replicas' certificates")
	}
	if (c.XDSTLSCertFile == "") != (c.XDSTLSKeyFile == "") {
		bad("--xds-tls-cert and --xds-tls-key go together")
	}
	if (c.XDSClientCAFile != "" || c.XDSPolicyFile != "") && c.XDSTLSCertFile == "" && c.XDSTLSKeyFile == "" {
		bad("--xds-client-ca and --xds-policy need --xds-tls-cert and --xds-tls-key")
	}
	if c.XDSPolicyFile != "" && c.XDSClientCAFile == "" {
		bad("--xds-policy needs --xds-client-ca: the policy is about client identities")
	}
	if c.EtcdTLS.enabled() {
		if len(c.EtcdEndpoints) == 0 {
			bad("--etcd-ca, --etcd-cert and --etcd-key are for an external etcd (--etcd-endpoints)")
		}
		if (c.EtcdTLS.CertFile == "") != (c.EtcdTLS.KeyFile == "") {
			bad("etcd TLS: --etcd-cert and --etcd-key go together")
		}
		if c.EtcdTLS.CAFile == "" {
			bad("etcd TLS: --etcd-ca is needed to trust etcd's certificate")
		}
	}
	if c.Liveness.StaleAfter <= 0 || c.Liveness.DropAfter <= 0 {
		bad("--stale-after and --drop-after must be positive (%v, %v)", c.Liveness.StaleAfter, c.Liveness.DropAfter)
	}
	for _, id := range slices.Sorted(maps.Keys(c.Liveness.Policies)) {
		if p := c.Liveness.Policies[id]; p != PolicyKeep && p != PolicyDrop {
			bad("cluster %s's policy %q: want keep or drop", id, p)
		}
	}
	if p := c.Liveness.DefaultPolicy; p != "" && p != PolicyKeep && p != PolicyDrop { // "": keep
		bad("--cluster-policy %q: want keep or drop", p)
	}
	if c.SnapshotInterval <= 0 {
		bad("--snapshot-interval must be positive (%v)", c.SnapshotInterval)
	}
	if c.SnapshotFormat != 1 && c.SnapshotFormat != 2 {
		bad("--snapshot-format %d: want 1 or 2", c.SnapshotFormat)
	}
	families := map[bool]int{}
	for _, p := range c.ClustersetCIDRs {
		if families[p.Addr().Is4()]++; families[p.Addr().Is4()] == 2 {
			bad("--clusterset-cidr: at most one IPv4 and one IPv6 range (%v)", c.ClustersetCIDRs)
		}
	}
	if c.IngressExposure.Selector != nil && len(c.IngressExposure.Namespaces) == 0 {
		bad("--ingress-selector needs --ingress-namespaces")
	}
	// Nested bounds a caller may set: zero would refuse every message or
	// hello, and a negative rate means nothing.
	f := c.Federation
	if f.MaxMessageBytes <= 0 || f.MaxFullStateBytes <= 0 || f.HelloTimeout <= 0 {
		bad("Federation.MaxMessageBytes, MaxFullStateBytes and HelloTimeout must be positive (%d, %d, %v)", f.MaxMessageBytes, f.MaxFullStateBytes, f.HelloTimeout)
	}
	if f.UpdatesPerSecond < 0 || f.UpdateBurst < 0 {
		bad("--updates-per-second %v (burst %d): want 0 (no bound) or more", f.UpdatesPerSecond, f.UpdateBurst)
	}
	if c.XDS.RequestsPerSecond < 0 {
		bad("--xds-requests-per-second %v: want 0 (no bound) or more", c.XDS.RequestsPerSecond)
	}
	l := c.Connections
	for _, b := range []struct {
		flag string
		v    int
	}{{"--max-connections", l.MaxConnections}, {"--max-connections-per-peer", l.MaxConnectionsPerPeer},
		{"--admin-max-connections", l.AdminMaxConnections}, {"--admin-max-connections-per-peer", l.AdminMaxConnectionsPerPeer},
		{"--max-xds-streams-per-peer", l.XDSStreamsPerPeer}, {"--max-streams-per-connection", l.MaxStreamsPerConnection}} {
		if b.v < 0 {
			bad("%s %d: want 0 (no bound) or more", b.flag, b.v)
		}
	}
	return errors.Join(errs...)
}
