package cli

import (
	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		var db string
		var resamples int
		c := &cobra.Command{
			Use:   "show RUN",
			Short: "Summarise a run: meshes, pooled percentiles per mesh, overhead against the baseline with intervals",
			Long: "show prints a run's provenance, its meshes, a percentile table per mesh and " +
				"measuring point (histograms merged across repeats), each mesh's overhead against the " +
				"baseline with bootstrap confidence intervals and a verdict, and capacity for sweeps.\n\n" +
				"RUN is a run id, a unique prefix of one, or \"last\".",
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				runs, err := loadRuns(cmd.Context(), db, args[0])
				if err != nil {
					return err
				}
				run := runs[0]
				rep := analyze(run, analysis.Options{Resamples: resamples})
				return analysis.WriteRunSummary(cmd.OutOrStdout(), run, rep)
			},
		}
		addDBFlag(c, &db)
		c.Flags().IntVar(&resamples, "resamples", 4000, "bootstrap resamples per comparison (2000..100000)")
		return c
	})
}
