package nettest

import (
	"net"
	"strconv"
	"testing"
)

// A port FreeAddr hands out is held for the whole process: another test
// process (or another lock on it here, which the kernel treats alike)
// cannot reserve it, so a server that stops and starts again on it finds
// it free.
func TestFreeAddrHoldsItsPortAcrossProcesses(t *testing.T) {
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	if reserve(port) {
		t.Fatalf("port %d was reserved again after FreeAddr handed it out", port)
	}
}
