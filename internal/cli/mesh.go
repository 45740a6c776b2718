package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/meshmark/meshmark/internal/mesh"
	_ "github.com/meshmark/meshmark/internal/mesh/meshes" // register every profile
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		cmd := &cobra.Command{
			Use:   "mesh",
			Short: "Mesh profiles: what can be compared and with which options",
		}
		cmd.AddCommand(&cobra.Command{
			Use:   "list",
			Short: "List the mesh profiles and the options a study file may set for them",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				out := cmd.OutOrStdout()
				fmt.Fprintln(out, "PROFILES")
				for _, n := range mesh.Names() {
					fmt.Fprintf(out, "  %s\n", n)
				}
				fmt.Fprintln(out, "\nOPTIONS (spec.meshes[].options)")
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "  KEY\tVALUES\tDEFAULT")
				for _, d := range mesh.OptionDocs() {
					fmt.Fprintf(tw, "  %s\t%s\t%s\n", d.Key, d.Values, d.Default)
				}
				return tw.Flush()
			},
		})
		return cmd
	})
}
