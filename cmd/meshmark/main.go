// Command meshmark measures what a service mesh costs and whether its security holds.
package main

import (
	"os"

	"github.com/meshmark/meshmark/internal/cli"
	"github.com/meshmark/meshmark/internal/mesh/ambient"
)

func main() {
	// Hidden: the istio-ambient profile runs its CA as this child process, so the
	// sampler measures the control plane apart from meshmark itself.
	if len(os.Args) > 1 && os.Args[1] == ambient.ControlPlaneCommand {
		os.Exit(ambient.ControlPlaneMain(os.Args[2:]))
	}
	os.Exit(cli.Main(os.Args[1:]))
}
