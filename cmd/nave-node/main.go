// Command nave-node is `nave node` alone: the node agent's binary (a
// node-local xDS relay), without the spoke's informers or the hub.
package main

import (
	"github.com/navemesh/nave/cmd/internal/cli"
	"github.com/navemesh/nave/cmd/internal/nodecmd"
)

func main() { cli.Main("nave-node", nodecmd.Run) }
