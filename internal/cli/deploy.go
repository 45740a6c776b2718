package cli

import (
	"fmt"
	"time"

	"github.com/meshmark/meshmark/internal/runner/kubeplatform"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		var keep bool
		c := &cobra.Command{
			Use:   "deploy STUDY",
			Short: "Bring a Kubernetes study's workload up on its cluster, wait until it is ready, and remove it",
			Long: "deploy is the bring-up half of a run on spec.substrate.kubernetes: for each mesh it " +
				"creates a namespace labelled for meshmark, the graph's Deployments and Services, waits " +
				"until every pod is ready (showing progress, and saying in the cluster's words why pods " +
				"wait when they do), then deletes the namespace. It tells whether a cluster can host " +
				"the study before a long run is spent on it. --keep leaves the namespaces; " +
				"`meshmark clean --kubernetes --all RUN` removes them.",
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				st, err := study.Load(args[0])
				if err != nil {
					return withExitCode(2, err)
				}
				deps, err := kubeplatform.Deploy(cmd.Context(), st, kubeplatform.DeployOptions{Keep: keep, Progress: cmd.ErrOrStderr(), Version: Version})
				for _, d := range deps {
					fmt.Fprintf(cmd.OutOrStdout(), "%-20s %-36s %3d pods  %3d objects  ready in %s\n", d.Mesh, d.Namespace, d.Pods, d.Objects, d.Ready.Round(100*time.Millisecond))
				}
				return err
			},
		}
		c.Flags().BoolVar(&keep, "keep", false, "leave the deployments on the cluster")
		return c
	})
}
