package cli

import (
	"fmt"
	"sort"
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
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PROFILES")
				for _, n := range mesh.Names() {
					reg, _ := mesh.Lookup(n)
					fmt.Fprintf(tw, "  %s\t%s\n", n, reg.Summary)
				}
				fmt.Fprintln(tw, "\nOPTIONS (spec.meshes[].options), every profile unless it says otherwise")
				fmt.Fprintln(tw, "  KEY\tVALUES\tDEFAULT")
				for _, d := range mesh.OptionDocs() {
					fmt.Fprintf(tw, "  %s\t%s\t%s\n", d.Key, d.Values, d.Default)
				}
				for _, n := range mesh.Names() {
					reg, _ := mesh.Lookup(n)
					if len(reg.Own) == 0 && len(reg.Unsupported) == 0 {
						continue
					}
					fmt.Fprintf(tw, "\n%s\n", n)
					for _, k := range sortedKeys(reg.Own) {
						fmt.Fprintf(tw, "  %s\t%s\n", k, reg.Own[k])
					}
					for _, k := range sortedKeys(reg.Unsupported) {
						fmt.Fprintf(tw, "  %s\tnot supported: %s\n", k, reg.Unsupported[k])
					}
				}
				return tw.Flush()
			},
		})
		return cmd
	})
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
