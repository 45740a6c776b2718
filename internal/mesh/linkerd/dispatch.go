package linkerd

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshmark/meshmark/internal/mesh/linkerd/controlplane"
)

// The control plane is this package's own child process, `<binary> linkerd-controlplane
// --config FILE`. It is dispatched here, before any command line is parsed, so that every
// binary that links the profile can serve it: meshmark itself, and the test binaries of
// the packages that run studies (whose own main would try to run tests).
func init() {
	if dispatchControlPlane && len(os.Args) > 1 && os.Args[1] == ControlPlaneCommand {
		os.Exit(controlPlaneMain(os.Args[2:]))
	}
}

// dispatchControlPlane is cleared by this package's own tests, whose TestMain runs a
// control plane of its own (one that can be told to refuse identities). Package
// variables are set before any init runs, so a test's variable initializer can clear it.
var dispatchControlPlane = true

// controlPlaneMain runs the control plane until SIGTERM or interrupt and returns the
// exit code: 2 for bad arguments or config, 1 when serving fails.
func controlPlaneMain(args []string) int {
	fs := flag.NewFlagSet(ControlPlaneCommand, flag.ContinueOnError)
	config := fs.String("config", "", "control-plane config written by the linkerd profile")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *config == "" {
		fmt.Fprintln(os.Stderr, ControlPlaneCommand+": --config is required")
		return 2
	}
	cfg, err := controlplane.LoadConfig(*config)
	if err != nil {
		fmt.Fprintln(os.Stderr, ControlPlaneCommand+":", err)
		return 2
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := controlplane.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, ControlPlaneCommand+":", err)
		return 1
	}
	return 0
}
