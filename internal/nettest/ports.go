package nettest

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// FreeAddr returns a 127.0.0.1 address nothing listens on, for servers that
// take an address rather than a listener (other processes, or servers that
// restart on the same port). The port is below the kernel's ephemeral range,
// so no outgoing connection can take it (on any local address) between now
// and when the server binds it; it is free for TCP and UDP (gossip needs
// both), and handed out once among the test processes running at the same
// time: a server that restarts on its port (etcd stopped and started again)
// finds it free, not taken meanwhile by another package's test.
func FreeAddr() (string, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	low := ephemeralLow()
	for range 1000 {
		port := 10000 + rand.IntN(low-10000)
		if portsTaken[port] || !reserve(port) {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		portsTaken[port] = true
		return addr, nil
	}
	return "", errors.New("no free port below the ephemeral range")
}

var (
	portsMu    sync.Mutex
	portsTaken = map[int]bool{}
	// reserved are the lock files of the ports this process holds; they
	// stay open (and locked) until it exits, when the kernel releases them.
	reserved []*os.File
)

// reserve takes port for this process among the test processes on the
// machine: an exclusive lock on a file named for it, which the kernel
// releases when the process ends however it ends (no file to clean up).
// False when another live process holds it. Where locks cannot be taken,
// every port counts as free (the in-process bookkeeping still applies).
func reserve(port int) bool {
	dir := filepath.Join(os.TempDir(), "nave-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return !errors.Is(err, syscall.EWOULDBLOCK)
	}
	reserved = append(reserved, f)
	return true
}

// ephemeralLow is the start of the kernel's ephemeral port range (32768 by default).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				return n
			}
		}
	}
	return 32768
}
