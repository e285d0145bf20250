package hub

import (
	"fmt"
	"net"
	"testing"
)

// The embedded etcd retries ports taken before it bound them: what
// net.Listen says then must be recognised, wrapped as etcd wraps it.
func TestAddrInUseIsRecognised(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = net.Listen("tcp", l.Addr().String())
	if err == nil {
		t.Fatal("a second listener on a taken port")
	}
	if !addrInUse(fmt.Errorf("start embedded etcd: %w", err)) {
		t.Errorf("addrInUse(%v) = false", err)
	}
	if addrInUse(fmt.Errorf("permission denied")) {
		t.Error("addrInUse of another error = true")
	}
}
