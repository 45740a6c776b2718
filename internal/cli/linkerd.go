package cli

import (
	"log"

	"github.com/spf13/cobra"

	"github.com/meshmark/meshmark/internal/mesh/linkerd/controlplane"
)

// linkerd-controlplane is started by the linkerd profile inside the testbed, never by a
// user, so it is hidden.
func init() {
	register(func() *cobra.Command {
		var config string
		cmd := &cobra.Command{
			Use:    "linkerd-controlplane --config FILE",
			Short:  "Serve the Linkerd identity, destination and policy APIs for one app (started by the linkerd profile)",
			Hidden: true,
			Args:   cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				cfg, err := controlplane.LoadConfig(config)
				if err != nil {
					return withExitCode(2, err)
				}
				log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)
				return controlplane.Run(cmd.Context(), cfg)
			},
		}
		cmd.Flags().StringVar(&config, "config", "", "control-plane config written by the linkerd profile")
		_ = cmd.MarkFlagRequired("config")
		return cmd
	})
}
