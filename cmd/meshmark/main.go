// Command meshmark measures what a service mesh costs and whether its security holds.
package main

import (
	"os"

	"github.com/meshmark/meshmark/internal/cli"
	"github.com/meshmark/meshmark/internal/localcluster"
)

func main() {
	// A local cluster's helpers are this executable started again for a role.
	localcluster.RunRole()
	os.Exit(cli.Main(os.Args[1:]))
}
