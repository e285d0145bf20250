package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/internal/testpki"
)

// publishAsNorth opens a session for cluster north (its token, another
// address than the legitimate spoke's) with hello, and returns the
// stream and its welcome, or how the hub ended it.
func (a *abuseHub) publishAsNorth(hello *fedv1.Hello) (fedv1.Federation_PublishClient, *fedv1.Welcome, error) {
	a.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	conn, err := grpc.NewClient(a.FederationAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(federation.TokenCredentials{Token: tokens["north"], AllowInsecure: true}),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { conn.Close() })
	st, err := fedv1.NewFederationClient(conn).Publish(a.ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Hello{Hello: hello}}); err != nil && err != io.EOF {
		return nil, nil, err
	}
	m, err := st.Recv()
	return st, m.GetWelcome(), err
}

// A hello whose strings are over their bounds is refused before the hub
// issues an epoch or records the cluster (a 1.6 MiB build once made the
// leader's batched catalog write fail for every cluster).
func TestAbuseOversizedHello(t *testing.T) {
	a := startAbuseHub(t)
	for _, c := range []struct {
		what  string
		hello *fedv1.Hello
	}{
		{"a build of 1.6 MiB", &fedv1.Hello{ClusterId: "north", SpokeBuild: strings.Repeat("b", 1600<<10)}},
		{"a spoke ID of 1 MiB", &fedv1.Hello{ClusterId: "north", SpokeId: strings.Repeat("s", 1<<20)}},
		{"a network of 1 MiB", &fedv1.Hello{ClusterId: "north", Network: strings.Repeat("n", 1<<20)}},
		{"a network that is no label value", &fedv1.Hello{ClusterId: "north", Network: "net/1"}},
	} {
		_, welcome, err := a.publishAsNorth(c.hello)
		if welcome != nil || status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: welcome %v, %.300v; want InvalidArgument", c.what, welcome, err)
		} else if n := len(status.Convert(err).Message()); n > 200 {
			t.Errorf("%s: the refusal repeats the hello (%d bytes)", c.what, n)
		}
	}
	if _, ok := a.View().Clusters["north"]; ok {
		t.Fatal("refused hellos left cluster north in the hub's view")
	}
	a.converges("oversized hellos")
	// At the bounds, the session begins.
	_, welcome, err := a.publishAsNorth(&fedv1.Hello{ClusterId: "north", Network: strings.Repeat("n", 63),
		SpokeId: strings.Repeat("s", federation.MaxSpokeIDBytes), SpokeBuild: strings.Repeat("b", federation.MaxSpokeBuildBytes)})
	if welcome == nil {
		t.Fatalf("a hello at the bounds: %v", err)
	}
	await(t, "north's session recorded", func() bool { return a.View().Clusters["north"].Connected })
}

// The IPv4 broadcast address is neither an endpoint nor a gateway.
func TestAbuseBroadcastAddresses(t *testing.T) {
	a := startAbuseHub(t)
	st, welcome, err := a.publishAsNorth(&fedv1.Hello{ClusterId: "north", Network: "net-north",
		Gateways: &fedv1.NetworkGateways{Gateways: []*fedv1.NetworkGateway{{Address: "255.255.255.255", Port: 15443}}}})
	if welcome == nil {
		t.Fatalf("hello: %v", err)
	}
	u := &fedv1.Update{Nonce: "1", Version: 1, Upserts: []*fedv1.Shard{{
		Service:   &fedv1.ServiceKey{Namespace: "flood", Name: "svc"},
		Ports:     []*fedv1.ServicePort{{Name: "p", Port: 80, Protocol: "TCP"}},
		Endpoints: []*fedv1.Endpoint{{Addresses: []string{"255.255.255.255"}, Ready: true}},
	}}}
	if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || m.GetNack() == nil || !strings.Contains(m.GetNack().GetRejections()[0].GetReason(), "unicast") {
		t.Fatalf("an endpoint at the broadcast address was answered %v, %v; want a NACK", m, err)
	}
	// A gateway there, in the hello or after it, is refused and not
	// recorded (the hub keeps what it held: none). The session takes its
	// messages in order: once the update after it is acknowledged, the
	// announcement was handled.
	if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Gateways{Gateways: &fedv1.NetworkGateways{
		Gateways: []*fedv1.NetworkGateway{{Address: "255.255.255.255", Port: 15443}}}}}); err != nil {
		t.Fatal(err)
	}
	u = &fedv1.Update{Nonce: "2", Version: 2, Upserts: []*fedv1.Shard{{
		Service:   &fedv1.ServiceKey{Namespace: "flood", Name: "ok"},
		Ports:     []*fedv1.ServicePort{{Name: "p", Port: 80, Protocol: "TCP"}},
		Endpoints: []*fedv1.Endpoint{{Addresses: []string{"10.9.9.9"}, Ready: true}},
	}}}
	if err := st.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Update{Update: u}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetAck() == nil {
		t.Fatalf("a valid update was answered %v, %v", m, err)
	}
	if gws := a.View().Clusters["north"].Gateways; len(gws) != 0 {
		t.Fatalf("north's gateways are %v", gws)
	}
	if got := a.clustersOf("flood/svc"); len(got) != 0 {
		t.Fatalf("flood/svc is published by %v", got)
	}
	a.converges("broadcast addresses")
}

// A TLS handshake without a client certificate on an xDS port that requires
// one is refused, counted and logged (rate-limited), hundreds of times,
// while a client with a certificate still gets through.
func TestAbuseTLSHandshakesWithoutClientCertificate(t *testing.T) {
	ca := testpki.NewCA(t, "nave")
	server := ca.Issue(t, "hub-xds", testpki.Cert{Hosts: []string{"127.0.0.1"}, Usages: serverUsage})
	h := startHub(t, func(c *hub.Config) {
		c.XDSTLSCertFile, c.XDSTLSKeyFile, c.XDSClientCAFile = server.CertFile, server.KeyFile, ca.File
	})
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	handshake := func(certs []tls.Certificate) error {
		d := &net.Dialer{Timeout: 30 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
		conn, err := tls.DialWithDialer(d, "tcp", h.XDSAddr.String(), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1",
			Certificates: certs, NextProtos: []string{"h2"}})
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		// With TLS 1.3 the server's refusal arrives after the client's
		// handshake; a connection it kept sends its HTTP/2 settings.
		_, err = conn.Read(make([]byte, 1))
		return err
	}
	const n = 200
	for i := range n {
		if err := handshake(nil); err == nil {
			t.Fatalf("handshake %d without a client certificate was let through", i)
		}
	}
	h.metricAtLeast(t, `nave_tls_refused_handshakes_total{port="xds",reason="no_client_certificate"}`, n)
	client := ca.Issue(t, "client", testpki.Cert{URI: "spiffe://cluster.local/ns/default/sa/client"})
	pair, err := tls.LoadX509KeyPair(client.CertFile, client.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake([]tls.Certificate{pair}); err != nil {
		t.Fatalf("a client with a certificate: %v", err)
	}
}
