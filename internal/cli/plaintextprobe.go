package cli

import (
	"fmt"
	"net"
	"os"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/spf13/cobra"
)

func init() {
	register(newPlaintextProbeCommand)
}

// newPlaintextProbeCommand is what the plaintext probe's pods run on a cluster under
// strict mTLS (see kube.ProbePlaintext); hidden, since nobody types it.
func newPlaintextProbeCommand() *cobra.Command {
	var (
		targets     []string
		messageFile string
	)
	c := &cobra.Command{
		Use:    kube.PlaintextProbeCommand + " --target SERVICE=HOST:PORT[/PROTOCOL]... [--message-file FILE]",
		Short:  "Call each target once in plaintext, as a caller outside the mesh, and report how each ended (a probe pod's command)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(targets) == 0 {
				return withExitCode(2, fmt.Errorf("no --target"))
			}
			var ts []mesh.PlaintextTarget
			for _, s := range targets {
				t, err := kube.ParsePlaintextTarget(s)
				if err != nil {
					return withExitCode(2, err)
				}
				ts = append(ts, t)
			}
			report := kube.RunPlaintextProbe(cmd.Context(), ts, (&net.Dialer{}).DialContext)
			// The log keeps the report too, which the pod's status falls back to when
			// the file cannot be written.
			fmt.Fprintln(cmd.OutOrStdout(), string(report))
			if messageFile != "" {
				if err := os.WriteFile(messageFile, report, 0o644); err != nil {
					return fmt.Errorf("writing the report: %w", err)
				}
			}
			return nil
		},
	}
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withExitCode(2, err) })
	c.Flags().StringArrayVar(&targets, "target", nil, "a service to call: SERVICE=HOST:PORT[/PROTOCOL], protocol http (default), h2c or grpc; repeatable")
	c.Flags().StringVar(&messageFile, "message-file", "", "also write the report here (a pod's termination message file)")
	return c
}
