// Command nave-spoke is `nave spoke` alone: a spoke candidate's binary,
// without the hub, its embedded etcd or the gateway agent.
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
	"github.com/navemesh/nave/cmd/internal/spokecmd"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(cli.BuildVersion())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := spokecmd.Run(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "nave-spoke: %v\n", err)
		os.Exit(1)
	}
}
