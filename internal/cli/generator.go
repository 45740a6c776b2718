package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/loadgen"
	"github.com/spf13/cobra"
)

func init() {
	register(newGeneratorCommand)
}

func newGeneratorCommand() *cobra.Command {
	return podCommand("generator", "generator [--listen ADDR] [--allow-namespace NS] [--resolve HOST:PORT:ADDR]... [--raw-dir DIR]",
		"Serve load plans over gRPC: a remote load generator for `meshmark load --generators` and for runs on Kubernetes",
		`generator waits for plans, each a versioned load spec (JSON, docs/load.md) and this
generator's share of it, runs one at a time, and streams every interval's histograms back
as it ends, then the result. A plan stops as soon as the driver goes away.

Targets: loopback and 198.18.0.0/15 only, unless --allow-any-target; --allow-namespace NS
also allows the Kubernetes services of namespace NS by name (NAME, NAME.NS, NAME.NS.svc,
NAME.NS.svc.cluster.local), which is how generator pods run. --resolve HOST:PORT:ADDR
dials ADDR for HOST:PORT, as curl's --resolve does. --raw-dir keeps every request of
every plan as a raw CSV log (the format of `+"`meshmark load --raw`"+`). --listen takes
host:port, or unix:PATH.

Listen on loopback unless the network between driver and generator is yours: a
generator loads whatever its rules allow for whoever reaches it. The small binary
meshmark-pod runs the same command (`+"`meshmark-pod generator`"+`), as generator pods
and the local testbed do. --help lists the flags.

Example:
  meshmark generator --listen 127.0.0.1:7070
  meshmark load http://127.0.0.1:8080/ --rate 1000 -d 30s --generators 127.0.0.1:7070,127.0.0.1:7071`, false)
}

// runRemoteLoad drives the load through the generators that --generators names and
// writes the merged result as a local run would.
func runRemoteLoad(cmd *cobra.Command, f loadFlags, spec load.Spec) error {
	if f.raw != "" {
		return withExitCode(2, errors.New("--raw is written by each generator with --generators: start them with --raw-dir"))
	}
	stderr := cmd.ErrOrStderr()
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	pool, err := loadgen.Dial(ctx, f.generators)
	cancel()
	if err != nil {
		return err
	}
	defer pool.Close()
	tty := isTerminal(stderr)
	var progress func(load.Progress)
	if tty || f.progress {
		progress = func(p load.Progress) {
			if tty {
				fmt.Fprintf(stderr, "\r\033[K%s", load.ProgressLine(p))
			} else {
				fmt.Fprintln(stderr, load.ProgressLine(p))
			}
		}
	}
	res, _, err := pool.Run(cmd.Context(), spec, progress)
	if tty {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		return err
	}
	if err := writeResult(cmd, res, f.format, f.output); err != nil {
		return err
	}
	return noneSucceeded(res)
}
