// Command nave-spoke is `nave spoke` alone: a spoke candidate's binary,
// without the hub, its embedded etcd or the gateway agent.
package main

import (
	"github.com/navemesh/nave/cmd/internal/cli"
	"github.com/navemesh/nave/cmd/internal/spokecmd"
)

func main() { cli.Main("nave-spoke", spokecmd.Run) }
