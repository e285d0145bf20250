package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Host is a test host: a network namespace of its own, joined to the root
// namespace by a veth pair on a private /30 of 10.250.0.0/16. The API server
// accepts its address in EndpointSlices (it rejects loopback ones), and the
// root namespace reaches it directly.
type Host struct {
	// Netns is the name of the network namespace (`ip netns`).
	Netns string
	// IP is the host's address, inside its namespace.
	IP netip.Addr
	// RootIP is the root namespace's end of the veth pair: where the host's
	// connections from the root namespace come from.
	RootIP netip.Addr
}

// hostNetwork is where hosts take their /30s from.
var hostNetwork = netip.MustParsePrefix("10.250.0.0/16")

var (
	// hostSeq numbers the hosts of this test binary; with the pid it makes names unique.
	hostSeq atomic.Uint32
	// hostAddrs serializes choosing a free /30 and claiming it, within this binary.
	hostAddrs sync.Mutex
)

// NewHost creates a test host that lasts until the test ends. It needs root
// and iproute2; without them it skips the test, or fails it under NAVE_E2E_REQUIRE=1.
func NewHost(t testing.TB) *Host {
	t.Helper()
	ip := ipCommand(t)
	n := hostSeq.Add(1)
	pid := os.Getpid()
	netns := fmt.Sprintf("nave-%d-%d", pid, n)
	rootLink, nsLink := fmt.Sprintf("nv%x.%xr", pid, n), fmt.Sprintf("nv%x.%xn", pid, n)
	if len(rootLink) > 15 {
		t.Fatalf("interface name %s is longer than 15 bytes", rootLink)
	}
	// A name of ours can only exist if a crashed process with our pid left it.
	removeHost(ip, netns, rootLink)
	if err := run(ip, "netns", "add", netns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeHost(ip, netns, rootLink); err != nil {
			t.Errorf("remove test host %s: %v", netns, err)
		}
	})
	if err := run(ip, "link", "add", rootLink, "type", "veth", "peer", "name", nsLink, "netns", netns); err != nil {
		t.Fatal(err)
	}
	h := &Host{Netns: netns}
	hostAddrs.Lock()
	subnet, err := freeSubnet(int(n) + pid*64)
	if err == nil {
		h.RootIP, h.IP = subnet.Addr().Next(), subnet.Addr().Next().Next()
		err = run(ip, "addr", "add", prefixString(h.RootIP, subnet), "dev", rootLink)
	}
	hostAddrs.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"link", "set", rootLink, "up"},
		{"-n", netns, "addr", "add", prefixString(h.IP, subnet), "dev", nsLink},
		{"-n", netns, "link", "set", nsLink, "up"},
		{"-n", netns, "link", "set", "lo", "up"},
	} {
		if err := run(ip, args...); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// Listen opens a listening socket inside the host's namespace on its IP
// (port "0" picks a free one). The socket may be served from any goroutine.
func (h *Host) Listen(network, port string) (net.Listener, error) {
	var l net.Listener
	err := inNetns(filepath.Join("/run/netns", h.Netns), func() (err error) {
		l, err = net.Listen(network, net.JoinHostPort(h.IP.String(), port))
		return err
	})
	return l, err
}

// ipCommand finds iproute2's ip, checking that the test may use it.
func ipCommand(t testing.TB) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		unavailable(t, "test hosts need Linux network namespaces")
	}
	if os.Geteuid() != 0 {
		unavailable(t, "test hosts need root to create network namespaces")
	}
	for _, p := range []string{"ip", "/usr/sbin/ip", "/sbin/ip"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	unavailable(t, "test hosts need iproute2's ip command")
	return ""
}

// freeSubnet returns the first /30 of hostNetwork, from slot start on, that
// no interface of the root namespace has an address in. The slot is derived
// from the pid, so test binaries running at the same time start far apart.
func freeSubnet(start int) (netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Prefix{}, err
	}
	slots := 1 << (30 - hostNetwork.Bits())
	base := hostNetwork.Addr().As4()
	for i := range slots {
		slot := (start + i) % slots
		a := base
		a[2], a[3] = byte(slot>>6), byte(slot<<2)
		subnet := netip.PrefixFrom(netip.AddrFrom4(a), 30)
		if !inUse(subnet, addrs) {
			return subnet, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free /30 left in %s", hostNetwork)
}

func inUse(subnet netip.Prefix, addrs []net.Addr) bool {
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Overlaps(subnet) {
			return true
		}
	}
	return false
}

// prefixString is addr/bits of the subnet, as ip addr add wants it.
func prefixString(addr netip.Addr, subnet netip.Prefix) string {
	return netip.PrefixFrom(addr, subnet.Bits()).String()
}

// removeHost deletes a host's veth pair, then its namespace. The pair goes
// first: a namespace outlives `ip netns del` while sockets in it are open,
// and its end of the pair with it.
func removeHost(ip, netns, rootLink string) error {
	var errs []error
	if _, err := net.InterfaceByName(rootLink); err == nil {
		errs = append(errs, run(ip, "link", "del", rootLink))
	}
	if _, err := os.Stat(filepath.Join("/run/netns", netns)); err == nil {
		errs = append(errs, run(ip, "netns", "del", netns))
	}
	return errors.Join(errs...)
}

// run runs ip with arguments, returning its output in the error.
func run(ip string, args ...string) error {
	out, err := exec.Command(ip, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DialContext dials addr over TCP from inside the host's namespace: a gRPC
// ContextDialer (grpc.WithContextDialer) for a client that runs on the host.
func (h *Host) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetns(filepath.Join("/run/netns", h.Netns), func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}
