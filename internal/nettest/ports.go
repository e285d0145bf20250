package nettest

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// FreeAddr returns a 127.0.0.1 address nothing listens on, for servers that
// take an address rather than a listener (other processes, or servers that
// restart on the same port). The port is below the kernel's ephemeral range,
// so no outgoing connection can take it (on any local address) between now
// and when the server binds it; it is free for TCP and UDP (gossip needs
// both), and handed out once per process.
func FreeAddr() (string, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	low := ephemeralLow()
	for range 1000 {
		port := 10000 + rand.IntN(low-10000)
		if portsTaken[port] {
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
)

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
