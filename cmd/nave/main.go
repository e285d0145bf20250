// Command nave runs Nave's processes: the hub, a spoke, and a self-contained demo.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/navemesh/nave/cmd/internal/cli"
	"github.com/navemesh/nave/cmd/internal/hubcmd"
	"github.com/navemesh/nave/cmd/internal/nodecmd"
	"github.com/navemesh/nave/cmd/internal/spokecmd"
)

const usage = `nave: multi-cluster service discovery.

Usage:
  nave hub   [flags]   run a hub replica (federation, xDS and admin servers)
  nave spoke [flags]   run a spoke that publishes one cluster's services to a hub (also the nave-spoke binary)
  nave node  [flags]   run a node agent: a node-local xDS relay for the node's gRPC clients and gateways (also nave-node)
  nave gateway [flags] run Envoy as a Nave gateway (east-west or ingress): bootstrap, supervision,
                       hot restart, SDS, drain ('nave gateway install DIR' copies this binary to DIR)
  nave demo  [flags]   run a hub, three spokes, backends and an xDS client on this machine
  nave version         print the build

Run 'nave <command> -h' for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "hub":
		err = hubcmd.Run(ctx, args)
	case "spoke":
		err = spokecmd.Run(ctx, args)
	case "node":
		err = nodecmd.Run(ctx, args)
	case "gateway":
		err = runGateway(ctx, args)
	case "demo":
		err = runDemo(ctx, args)
	case "demo-client":
		err = runDemoClient(ctx, args)
	case "demo-backend":
		err = runDemoBackend(ctx, args)
	case "version":
		fmt.Println(cli.BuildVersion())
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "nave: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "nave %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
