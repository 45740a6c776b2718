package cli

import (
	"errors"
	"fmt"

	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		var print, plan bool
		c := &cobra.Command{
			Use:   "validate FILE...",
			Short: "Check study files and report every problem with file, line and field",
			Long: "Check study files and report every problem with file:line:column and the field path.\n" +
				"A name that is not a file but a built-in study (e.g. demo) validates the built-in.\n" +
				"Exit code 2 when any study is invalid.",
			Args: cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
				bad := 0
				for _, arg := range args {
					s, err := study.Load(arg)
					if err != nil {
						bad++
						var es study.Errors
						if errors.As(err, &es) {
							for _, e := range es {
								fmt.Fprintln(errOut, e)
							}
						} else {
							fmt.Fprintln(errOut, err)
						}
						continue
					}
					if err := runner.Check(s); err != nil {
						bad++
						fmt.Fprintln(errOut, err)
						continue
					}
					for _, w := range s.Warnings {
						fmt.Fprintf(errOut, "%s: warning: %s\n", s.File, w)
					}
					if print {
						y, err := s.Marshal()
						if err != nil {
							return err
						}
						if len(args) > 1 {
							fmt.Fprintf(out, "# %s\n", s.File)
						}
						fmt.Fprintf(out, "%s", y)
					}
					if plan {
						for _, t := range s.Plan() {
							bring := ""
							if t.BringUp {
								bring = "  (bring up)"
							}
							fmt.Fprintf(out, "%3d  stage %d  repeat %d  %-20s %s%s\n", t.Seq, t.Stage, t.Repeat+1, t.Mesh.Name, t.Experiment.Name, bring)
						}
					}
					if !print && !plan {
						fmt.Fprintf(out, "%s: ok (%d meshes, %d experiments, %d trials)\n", s.File, len(s.Spec.Meshes), len(s.Spec.Experiments), len(s.Plan()))
					}
				}
				if bad > 0 {
					return withExitCode(2, fmt.Errorf("%d of %d study file(s) invalid", bad, len(args)))
				}
				return nil
			},
		}
		c.Flags().BoolVar(&print, "print", false, "print each study normalised, with every default filled in")
		c.Flags().BoolVar(&plan, "plan", false, "print the trials in the order they will run")
		return c
	})
}
