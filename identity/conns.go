package identity

import (
	"context"
	"crypto/x509"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// Conns are the connections a server accepted over TLS, by the client
// certificate they were opened with. A session that ends because its
// certificate no longer holds closes its connection too: a client then
// reconnects with a new handshake, and so with its new certificate,
// instead of opening new streams on a connection whose certificate no
// longer holds.
type Conns struct {
	mu     sync.Mutex // guards byLeaf
	byLeaf map[*x509.Certificate]map[net.Conn]struct{}
}

// NewConns returns an empty set of connections.
func NewConns() *Conns { return &Conns{byLeaf: map[*x509.Certificate]map[net.Conn]struct{}{}} }

// Creds wraps a server's transport credentials so that c knows its connections.
func (c *Conns) Creds(creds credentials.TransportCredentials) credentials.TransportCredentials {
	return connsCreds{TransportCredentials: creds, conns: c}
}

// Close closes every connection opened with leaf.
func (c *Conns) Close(leaf *x509.Certificate) {
	c.mu.Lock()
	conns := c.byLeaf[leaf]
	delete(c.byLeaf, leaf)
	c.mu.Unlock()
	for conn := range conns {
		conn.Close()
	}
}

func (c *Conns) add(leaf *x509.Certificate, conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byLeaf[leaf] == nil {
		c.byLeaf[leaf] = map[net.Conn]struct{}{}
	}
	c.byLeaf[leaf][conn] = struct{}{}
}

func (c *Conns) remove(leaf *x509.Certificate, conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byLeaf[leaf], conn)
	if len(c.byLeaf[leaf]) == 0 {
		delete(c.byLeaf, leaf)
	}
}

type connsCreds struct {
	credentials.TransportCredentials
	conns *Conns
}

func (cc connsCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := cc.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, info, err
	}
	tlsInfo, ok := info.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		return conn, info, nil
	}
	leaf := tlsInfo.State.PeerCertificates[0]
	tracked := &trackedConn{Conn: conn, conns: cc.conns, leaf: leaf}
	cc.conns.add(leaf, tracked)
	return tracked, info, nil
}

func (cc connsCreds) Clone() credentials.TransportCredentials {
	return connsCreds{TransportCredentials: cc.TransportCredentials.Clone(), conns: cc.conns}
}

func (cc connsCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return cc.TransportCredentials.ClientHandshake(ctx, authority, raw)
}

type trackedConn struct {
	net.Conn
	conns *Conns
	leaf  *x509.Certificate
	once  sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() { t.conns.remove(t.leaf, t) })
	return t.Conn.Close()
}
