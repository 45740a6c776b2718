package cli

import (
	"errors"

	"github.com/meshmark/meshmark/internal/podcmd"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		return podCommand("service", "service --graph FILE|BUILTIN --service NAME [--version V] [--listen ADDR]",
			"Run one service of a workload graph over HTTP/1.1, h2c or gRPC (what each pod runs)",
			`Run one service of a service graph (see docs/graph.md): it answers HTTP/1.1 and
cleartext HTTP/2, and gRPC when the graph says the service speaks it. Each request runs
the service's script (calls, sleeps, CPU burn) and is answered with a JSON trace of every
service it went through. Built-in graphs: bookinfo, emojivoto, online-boutique,
teastore, chain-N, fanout-N, optionally with options, e.g. bookinfo:replicas=3.

With --print, write the graph file of a built-in graph and exit.

Pods run the same command from the small binary meshmark-pod (`+"`meshmark-pod service`"+`),
which links none of meshmark's Kubernetes, Helm or SQLite code. --help lists the flags.`, false)
	})
}

// podCommand is a command of the small in-pod binary (package podcmd), offered by
// meshmark too: its flags are podcmd's, so cobra passes the arguments through.
func podCommand(name, use, short, long string, hidden bool) *cobra.Command {
	return &cobra.Command{
		Use:                use,
		Short:              short,
		Long:               long,
		Hidden:             hidden,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := podcmd.Run(cmd.Context(), name, args, cmd.OutOrStdout(), cmd.ErrOrStderr())
			var ue *podcmd.UsageError
			if errors.As(err, &ue) {
				return withExitCode(2, err)
			}
			return err
		},
	}
}
