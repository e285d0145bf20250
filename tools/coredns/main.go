// Command coredns is the real CoreDNS, built from the github.com/coredns/coredns
// module with only the plugins Nave's tests use: the kubernetes plugin (with its
// multicluster option, which answers clusterset.local from ServiceImports and
// EndpointSlices) and what a test needs around it. It lives in its own module so
// that Nave's go.mod never depends on CoreDNS.
package main

import (
	"log"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// Each plugin registers itself with the "dns" server type in its init.
	_ "github.com/coredns/coredns/plugin/bind"       // listen on 127.0.0.1 only
	_ "github.com/coredns/coredns/plugin/cache"      // as a cluster's Corefile has it
	_ "github.com/coredns/coredns/plugin/errors"     // log errors
	_ "github.com/coredns/coredns/plugin/health"     // /health (liveness)
	_ "github.com/coredns/coredns/plugin/kubernetes" // cluster.local and, with multicluster, clusterset.local
	_ "github.com/coredns/coredns/plugin/log"        // log queries
	_ "github.com/coredns/coredns/plugin/ready"      // /ready: 200 once the kubernetes plugin's informers synced
)

// directives are the plugins above in the order a query passes them, which is
// their order in CoreDNS's plugin.cfg. A Corefile may use only these.
var directives = []string{
	"bind",
	"ready",
	"health",
	"errors",
	"log",
	"cache",
	"kubernetes",
}

func main() {
	// Before the Corefile is read: it replaces the full list generated from plugin.cfg.
	if err := dnsserver.SetDirectives(directives); err != nil {
		log.Fatal(err)
	}
	coremain.Run()
}
