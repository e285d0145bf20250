// Command nave-node is `nave node` alone: the node agent's binary (a
// node-local xDS relay), without the spoke's informers or the hub.
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
	"github.com/navemesh/nave/cmd/internal/nodecmd"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(cli.BuildVersion())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := nodecmd.Run(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "nave-node: %v\n", err)
		os.Exit(1)
	}
}
