package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/internal/testpki"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

func spiffeCluster(c string) string { return "spiffe://cluster.local/nave/cluster/" + c }

// copyTo writes src's content to dst atomically (a rotation, as a Secret
// volume update or cert-manager does it).
func copyTo(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, string(b))
}

// ownFiles copies an issued certificate to files of its own, which a test
// can later rotate.
func ownFiles(t *testing.T, is testpki.Issued) testpki.Issued {
	t.Helper()
	dir := t.TempDir()
	own := testpki.Issued{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), Serial: is.Serial}
	copyTo(t, is.CertFile, own.CertFile)
	copyTo(t, is.KeyFile, own.KeyFile)
	return own
}

// sayHello says hello for cluster to the federation port at addr, dialled
// with opts, and returns how the hub answered.
func sayHello(t *testing.T, addr, cluster string, opts ...grpc.DialOption) error {
	t.Helper()
	return onFederation(t, addr, opts, func(ctx context.Context, conn *grpc.ClientConn) error {
		stream, err := fedv1.NewFederationClient(conn).Publish(ctx)
		if err == nil {
			_ = stream.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: &fedv1.Hello{ClusterId: cluster, Network: "net1", SpokeId: "intruder"}}})
			_, err = stream.Recv()
		}
		return err
	})
}

// onFederation runs call on a connection to the federation port at addr,
// dialled with opts, with 5 s to answer.
func onFederation(t *testing.T, addr string, opts []grpc.DialOption, call func(context.Context, *grpc.ClientConn) error) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return call(ctx, conn)
}

// subscribe opens a replication subscription at addr, dialled with opts,
// without a hello, and returns how the hub answered: an admitted stream
// is refused at once with InvalidArgument.
func subscribe(t *testing.T, addr string, opts ...grpc.DialOption) error {
	t.Helper()
	return onFederation(t, addr, opts, func(ctx context.Context, conn *grpc.ClientConn) error {
		stream, err := fedv1.NewReplicationClient(conn).Subscribe(ctx)
		if err == nil {
			// A refused stream may be over before the send (io.EOF): its status comes with Recv.
			_ = stream.Send(&fedv1.ReplicaRequest{})
			_, err = stream.Recv()
		}
		return err
	})
}

// publishAs says hello for cluster over creds.
func publishAs(t *testing.T, addr string, creds credentials.TransportCredentials, cluster string) error {
	t.Helper()
	return sayHello(t, addr, cluster, grpc.WithTransportCredentials(creds))
}

// publishWithToken says hello for cluster with token, in plaintext.
func publishWithToken(t *testing.T, addr, token, cluster string) error {
	t.Helper()
	return sayHello(t, addr, cluster, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: token, AllowInsecure: true}))
}

func tlsCreds(t *testing.T, ca string, is testpki.Issued) credentials.TransportCredentials {
	t.Helper()
	store, err := identity.Load(identity.Files{Cert: is.CertFile, Key: is.KeyFile, CA: ca}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return store.ClientCreds("", nil)
}

func (h *testHub) cluster(c registry.ClusterID) hub.ClusterStatus { return h.View().Clusters[c] }

// metricAtLeast awaits a metric series (by its text form) reaching n.
func (h *testHub) metricAtLeast(t *testing.T, series string, n float64) {
	t.Helper()
	// 30 s: 2,000 streams opened and refused under -race on a loaded machine once took over 10.
	awaitFor(t, series, 30*time.Second, func() bool {
		for _, line := range strings.Split(httpBody(h.admin+"/metrics"), "\n") {
			var v float64
			if rest, ok := strings.CutPrefix(line, series+" "); ok {
				if _, err := fmt.Sscan(rest, &v); err == nil && v >= n {
					return true
				}
			}
		}
		return false
	})
}

// Spokes authenticate with certificates naming their cluster: the right one
// publishes; another cluster's certificate, a replica's, an expired one,
// one of an unknown CA and a plaintext client are each refused with their
// reason and change nothing. Certificates rotate with no dropped session
// and no failed RPC; a revoked or expired one ends its session.
func TestFederationMTLS(t *testing.T) {
	ca := testpki.NewCA(t, "nave")
	server := ownFiles(t, ca.Issue(t, "hub", testpki.Cert{Hosts: []string{"127.0.0.1"}, Usages: serverUsage}))
	crl := filepath.Join(t.TempDir(), "crl.pem")
	copyTo(t, ca.CRL(t, 1), crl)
	h := startHub(t, func(c *hub.Config) {
		c.TLSCertFile, c.TLSKeyFile, c.ClientCAFile, c.CRLFile = server.CertFile, server.KeyFile, ca.File, crl
		c.TokensFile = "" // certificates only
	})
	east := ownFiles(t, ca.Issue(t, "east", testpki.Cert{URI: spiffeCluster("east")}))
	dir := filepath.Join(t.TempDir(), "east")
	writeService(t, dir, "echo", endpoint{xdstest.StartBackend(t, "east", "127.0.0.1"), "z1", true})
	startSpoke(t, h, "east", dir, "r1", func(c *spoke.Config) {
		c.HubCAFile, c.CertFile, c.KeyFile, c.TokenFile = ca.File, east.CertFile, east.KeyFile, ""
	})
	await(t, "echo published by east's certificate", func() bool { return len(h.clustersOf("default/echo")) == 1 })
	epoch := h.cluster("east").Epoch
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel() // before the poller's cleanup waits for it
	poller := xdstest.StartPoller(ctx, t, "client", xdstest.NewClient(t, h.XDSAddr.String(), "client", locality("r1", "z1"), "echo.default.svc.clusterset.local:8080"))

	fed := h.FederationAddr.String()
	west := ca.Issue(t, "west", testpki.Cert{URI: spiffeCluster("west")})
	replica := ca.Issue(t, "replica", testpki.Cert{URI: "spiffe://cluster.local/nave/replica/r2"})
	expired := ca.Issue(t, "expired", testpki.Cert{URI: spiffeCluster("east"), NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	stranger := testpki.NewCA(t, "stranger")
	foreign := stranger.Issue(t, "east", testpki.Cert{URI: spiffeCluster("east")})
	for _, c := range []struct {
		name  string
		creds credentials.TransportCredentials
		code  codes.Code
		says  string
	}{
		{"another cluster's certificate", tlsCreds(t, ca.File, west), codes.PermissionDenied, `cannot publish for cluster "east"`},
		{"a replica's certificate", tlsCreds(t, ca.File, replica), codes.PermissionDenied, "replica"},
		// Refused at the handshake: with TLS 1.3 the client may see its
		// connection closed before the alert; the hub's metric says why (below).
		{"an expired certificate", tlsCreds(t, ca.File, expired), codes.Unavailable, ""},
		{"an unknown CA's certificate", tlsCreds(t, ca.File, foreign), codes.Unavailable, ""},
		{"a plaintext client", insecure.NewCredentials(), codes.Unavailable, ""},
	} {
		err := publishAs(t, fed, c.creds, "east")
		if status.Code(err) != c.code || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.code, c.says)
		}
	}
	h.metricAtLeast(t, `nave_tls_refused_handshakes_total{port="federation",reason="expired"}`, 1)
	h.metricAtLeast(t, `nave_tls_refused_handshakes_total{port="federation",reason="untrusted"}`, 1)
	if got := h.cluster("east"); !got.Connected || got.Epoch != epoch || got.Endpoints != 1 || len(h.View().Clusters) != 1 {
		t.Fatalf("the refusals changed the state: %+v (clusters %d)", got, len(h.View().Clusters))
	}

	// Rotation: new certificates for the spoke and the hub, written over the old ones.
	east2 := ca.Issue(t, "east-2", testpki.Cert{URI: spiffeCluster("east")})
	copyTo(t, east2.KeyFile, east.KeyFile)
	copyTo(t, east2.CertFile, east.CertFile)
	server2 := ca.Issue(t, "hub-2", testpki.Cert{Hosts: []string{"127.0.0.1"}, Usages: serverUsage})
	copyTo(t, server2.KeyFile, server.KeyFile)
	copyTo(t, server2.CertFile, server.CertFile)
	awaitFor(t, "the hub serving its new certificate", 10*time.Second, func() bool {
		c, err := tls.Dial("tcp", fed, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
		if err != nil {
			return false
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Cmp(server2.Serial) == 0
	})
	if got := h.cluster("east"); !got.Connected || got.Epoch != epoch {
		t.Fatalf("the rotation dropped east's session: %+v, epoch was %d", got, epoch)
	}
	if calls, failed := poller.Failures(); len(failed) > 0 {
		t.Fatalf("%d of %d RPCs failed across the rotation: %v", len(failed), calls, failed)
	}

	// Revoking the certificate east's session was opened with ends it.
	copyTo(t, ca.CRL(t, 2, east.Serial), crl)
	awaitFor(t, "east's session ended by the revocation", 10*time.Second, func() bool { return !h.cluster("east").Connected })
	// It reconnects with the rotated certificate, which is not revoked.
	awaitFor(t, "east back with its new certificate", 10*time.Second, func() bool { return h.cluster("east").Connected })
	// Revoking that one too keeps it out.
	copyTo(t, ca.CRL(t, 3, east.Serial, east2.Serial), crl)
	awaitFor(t, "east out", 10*time.Second, func() bool { return !h.cluster("east").Connected })
	h.metricAtLeast(t, `nave_tls_refused_handshakes_total{port="federation",reason="revoked"}`, 1)

	// A certificate that expires while its session is open ends the session.
	north := ca.Issue(t, "north", testpki.Cert{URI: spiffeCluster("north"), NotAfter: time.Now().Add(3 * time.Second)})
	northDir := filepath.Join(t.TempDir(), "north")
	writeService(t, northDir, "other", endpoint{xdstest.StartBackend(t, "north", "127.0.0.1"), "z1", true})
	startSpoke(t, h, "north", northDir, "r1", func(c *spoke.Config) {
		c.HubCAFile, c.CertFile, c.KeyFile, c.TokenFile = ca.File, north.CertFile, north.KeyFile, ""
	})
	awaitFor(t, "north connected", 10*time.Second, func() bool { return h.cluster("north").Connected })
	awaitFor(t, "north's session ended when its certificate expired", 10*time.Second, func() bool { return !h.cluster("north").Connected })
}

var serverUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}

// grpc-go xDS clients connect over mTLS with the credentials of their
// bootstrap; the policy gives each identity its own namespace only.
func TestXDSOverMTLSWithPolicy(t *testing.T) {
	ca := testpki.NewCA(t, "nave")
	server := ca.Issue(t, "hub-xds", testpki.Cert{Hosts: []string{"127.0.0.1"}, Usages: serverUsage})
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, policy, "rules:\n- identity: spiffe://cluster.local/ns/*\n  namespaces: [$namespace]\n")
	crl := filepath.Join(t.TempDir(), "crl.pem")
	copyTo(t, ca.CRL(t, 1), crl)
	h := startHub(t, func(c *hub.Config) {
		c.XDSTLSCertFile, c.XDSTLSKeyFile, c.XDSClientCAFile, c.XDSPolicyFile = server.CertFile, server.KeyFile, ca.File, policy
		c.CRLFile = crl
	})
	dir := filepath.Join(t.TempDir(), "east")
	writeService(t, dir, "echo", endpoint{xdstest.StartBackend(t, "east", "127.0.0.1"), "z1", true})
	startSpoke(t, h, "east", dir, "r1")
	await(t, "echo published", func() bool { return len(h.clustersOf("default/echo")) == 1 })
	target := "echo.default.svc.clusterset.local:8080"

	mine := ca.Issue(t, "default-client", testpki.Cert{URI: "spiffe://cluster.local/ns/default/sa/client"})
	ctx, cancelAll := context.WithCancel(testContext(t))
	defer cancelAll() // before the poller's cleanup waits for it
	client := xdstest.NewClientTLS(t, h.XDSAddr.String(), "mine", locality("r1", "z1"), target, xdstest.TLSFiles{CA: ca.File, Cert: mine.CertFile, Key: mine.KeyFile})
	xdstest.StartPoller(ctx, t, "mine", client) // waits for its first answer

	// Another namespace's identity gets nothing of default's services.
	other := ca.Issue(t, "other-client", testpki.Cert{URI: "spiffe://cluster.local/ns/other/sa/client"})
	denied := xdstest.NewClientTLS(t, h.XDSAddr.String(), "other", locality("r1", "z1"), target, xdstest.TLSFiles{CA: ca.File, Cert: other.CertFile, Key: other.KeyFile})
	callCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := denied.Check(callCtx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatal("an identity of namespace other reached a service of namespace default")
	}
	h.metricAtLeast(t, `nave_xds_denied_resources_total{type="lds"}`, 1)

	// The policy file changes: a grant that changed ends its stream, whose
	// client comes back under the new policy; the first client's grant did
	// not change, and its poller sees no failed call.
	writeFile(t, policy, "rules:\n- identity: spiffe://cluster.local/ns/other/sa/client\n  namespaces: [default]\n- identity: spiffe://cluster.local/ns/*\n  namespaces: [$namespace]\n")
	awaitFor(t, "namespace other's identity served default's services under the new policy", 20*time.Second, func() bool {
		callCtx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := denied.Check(callCtx, &healthpb.HealthCheckRequest{})
		return err == nil
	})

	// A client without a certificate, or with an unknown CA's, gets no connection.
	stranger := testpki.NewCA(t, "stranger")
	foreign := stranger.Issue(t, "client", testpki.Cert{URI: "spiffe://cluster.local/ns/default/sa/client"})
	refused := xdstest.NewClientTLS(t, h.XDSAddr.String(), "stranger", locality("r1", "z1"), target, xdstest.TLSFiles{CA: ca.File, Cert: foreign.CertFile, Key: foreign.KeyFile})
	callCtx2, cancel2 := context.WithTimeout(ctx, 3*time.Second)
	defer cancel2()
	if _, err := refused.Check(callCtx2, &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatal("a client of an unknown CA was served")
	}
	h.metricAtLeast(t, `nave_tls_refused_handshakes_total{port="xds",reason="untrusted"}`, 1)

	// Revoking the first client's certificate ends its xDS stream: it
	// reconnects, and that handshake is refused.
	copyTo(t, ca.CRL(t, 2, mine.Serial), crl)
	h.metricAtLeast(t, `nave_tls_refused_handshakes_total{port="xds",reason="revoked"}`, 1)
}

// Replicas know each other by their own identities (no peer token): a
// service a spoke publishes at one replica reaches the other's clients.
func TestReplicasAuthenticateByCertificate(t *testing.T) {
	ca := testpki.NewCA(t, "nave")
	etcd := startTestEtcd(t, "127.0.0.1")
	gossip := []string{freeAddr(t), freeAddr(t)}
	var replicas []*testHub
	for i, id := range []string{"hub-a", "hub-b"} {
		cert := ca.Issue(t, id, testpki.Cert{URI: "spiffe://cluster.local/nave/replica/" + id, Hosts: []string{"127.0.0.1"}})
		replicas = append(replicas, startHub(t, func(c *hub.Config) {
			c.ID, c.EtcdEndpoints, c.TokensFile = id, []string{etcd.endpoint()}, ""
			c.GossipAddr, c.AdvertiseHost, c.Join, c.FastGossip = gossip[i], "127.0.0.1", []string{gossip[1-i]}, true
			c.TLSCertFile, c.TLSKeyFile, c.ClientCAFile, c.PeerCAFile = cert.CertFile, cert.KeyFile, ca.File, ca.File
		}))
	}
	east := ca.Issue(t, "east", testpki.Cert{URI: spiffeCluster("east")})
	dir := filepath.Join(t.TempDir(), "east")
	writeService(t, dir, "echo", endpoint{xdstest.StartBackend(t, "east", "127.0.0.1"), "z1", true})
	startSpoke(t, replicas[0], "east", dir, "r1", func(c *spoke.Config) {
		c.HubCAFile, c.CertFile, c.KeyFile, c.TokenFile = ca.File, east.CertFile, east.KeyFile, ""
	})
	awaitFor(t, "echo replicated to hub-b", 30*time.Second, func() bool { return len(replicas[1].clustersOf("default/echo")) == 1 })

	// A cluster's certificate cannot replicate.
	if err := subscribe(t, replicas[1].FederationAddr.String(), grpc.WithTransportCredentials(tlsCreds(t, ca.File, east))); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a cluster's certificate replicating: %v, want PermissionDenied", err)
	}
}

// The peer token rotates with every replica replicating throughout: the
// new token added second everywhere, then moved first, then the old one
// removed. A change made at hub-a reaches hub-b after each step; at the
// end the new token replicates and the old one no longer does.
func TestPeerTokenRotated(t *testing.T) {
	const old, next = "peer-old-0123456789abcdef", "peer-new-0123456789abcdef"
	etcd := startTestEtcd(t, "127.0.0.1")
	gossip := []string{freeAddr(t), freeAddr(t)}
	var replicas []*testHub
	var files []string
	for i, id := range []string{"hub-a", "hub-b"} {
		file := filepath.Join(t.TempDir(), "peer-token")
		writeFile(t, file, old+"\n")
		files = append(files, file)
		replicas = append(replicas, startHub(t, func(c *hub.Config) {
			c.ID, c.EtcdEndpoints, c.PeerTokenFile = id, []string{etcd.endpoint()}, file
			c.GossipAddr, c.AdvertiseHost, c.Join, c.FastGossip = gossip[i], "127.0.0.1", []string{gossip[1-i]}, true
		}))
	}
	dir := filepath.Join(t.TempDir(), "east")
	backend := xdstest.StartBackend(t, "east", "127.0.0.1")
	writeService(t, dir, "echo", endpoint{backend, "z1", true})
	startSpoke(t, replicas[0], "east", dir, "r1")
	awaitFor(t, "echo replicated to hub-b", 30*time.Second, func() bool { return len(replicas[1].clustersOf("default/echo")) == 1 })
	replicateWith := func(h *testHub, token string) codes.Code {
		return status.Code(subscribe(t, h.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: token, AllowInsecure: true})))
	}
	everywhere := func(what string, cond func(*testHub) bool) {
		t.Helper()
		awaitFor(t, what, 10*time.Second, func() bool { return cond(replicas[0]) && cond(replicas[1]) })
	}
	var oldSession fedv1.Replication_SubscribeClient
	for step, content := range []string{old + "\n" + next + "\n", next + "\n" + old + "\n", next + "\n"} {
		for _, f := range files {
			writeFile(t, f, content)
		}
		switch step {
		case 0:
			everywhere("the new token accepted", func(h *testHub) bool { return replicateWith(h, next) != codes.Unauthenticated })
			oldSession = subscribeAs(t, replicas[1], old)
		case 1:
			time.Sleep(2500 * time.Millisecond) // nothing tells which token a replica presents: two reload periods
		case 2:
			everywhere("the old token refused", func(h *testHub) bool { return replicateWith(h, old) == codes.Unauthenticated })
			// A subscription opened with the old token ends with it.
			for {
				if _, err := oldSession.Recv(); err != nil {
					if status.Code(err) != codes.Unauthenticated {
						t.Fatalf("the old token's subscription ended with %v, want Unauthenticated", err)
					}
					break
				}
			}
		}
		name := fmt.Sprintf("step%d", step)
		writeService(t, dir, name, endpoint{backend, "z1", true})
		awaitFor(t, name+" replicated to hub-b", 30*time.Second, func() bool { return len(replicas[1].clustersOf("default/"+name)) == 1 })
	}
	if code := replicateWith(replicas[1], next); code == codes.Unauthenticated {
		t.Fatal("the new token does not replicate")
	}
}

// subscribeAs opens a replication subscription to h as a replica
// presenting token, and returns it once it carries state.
func subscribeAs(t *testing.T, h *testHub, token string) fedv1.Replication_SubscribeClient {
	t.Helper()
	conn, err := grpc.NewClient(h.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: token, AllowInsecure: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := fedv1.NewReplicationClient(conn).Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedv1.ReplicaRequest{Kind: &fedv1.ReplicaRequest_Hello{Hello: &fedv1.ReplicaHello{ReplicaId: "probe"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("subscribing with a good token: %v", err)
	}
	return stream
}

// Tokens are read again when their file changes: a rotated token admits
// new sessions at once, and a withdrawn one ends the open session.
func TestTokensReloaded(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.yaml")
	writeFile(t, file, "east: east-token-0123456789abcdef\n")
	h := startHub(t, func(c *hub.Config) { c.TokensFile = file })
	dir := filepath.Join(t.TempDir(), "east")
	writeService(t, dir, "echo", endpoint{xdstest.StartBackend(t, "east", "127.0.0.1"), "z1", true})
	startSpoke(t, h, "east", dir, "r1")
	// Connected comes before the first state is applied, and with it the session's epoch.
	await(t, "echo published with the token", func() bool { c := h.cluster("east"); return c.Connected && c.Version > 0 })
	epoch := h.cluster("east").Epoch

	// Another cluster's token added: east's session is untouched.
	writeFile(t, file, "east: east-token-0123456789abcdef\nwest: west-token-0123456789abcdef\n")
	awaitFor(t, "west's new token admitted", 10*time.Second, func() bool {
		err := publishWithToken(t, h.FederationAddr.String(), "west-token-0123456789abcdef", "west")
		return status.Code(err) != codes.Unauthenticated
	})
	if got := h.cluster("east"); !got.Connected || got.Epoch != epoch {
		t.Fatalf("adding a token touched east's session: %+v (epoch was %d)", got, epoch)
	}
	// East's token withdrawn: its session ends and stays ended.
	writeFile(t, file, "west: west-token-0123456789abcdef\n")
	awaitFor(t, "east's session ended", 10*time.Second, func() bool { return !h.cluster("east").Connected })
	time.Sleep(300 * time.Millisecond) // the spoke retries every 200ms at most
	if h.cluster("east").Connected {
		t.Fatal("east reconnected with a withdrawn token")
	}
}
