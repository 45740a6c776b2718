package cli

import (
	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		var db string
		var resamples int
		var all bool
		c := &cobra.Command{
			Use:   "show RUN",
			Short: "Summarise a run: per load point, what each mesh adds to the baseline's latency, its CPU, memory, errors and security, and a verdict",
			Long: "show prints the answer first: per load point, one table with each mesh's added p50 and p99 " +
				"against the baseline with confidence intervals (t intervals over repeats, named in the output), CPU per 1000 req/s, proxy memory, errors, " +
				"security posture and a one-line verdict, flags (saturation, SLO broken, inconclusive, ...) " +
				"beside the number they qualify, and the meshes ranked among themselves. --all adds every " +
				"detail: meshes, the percentile table per mesh and point (histograms merged across repeats), " +
				"each metric's comparison with the baseline, the verdict table, resources, network per pod " +
				"and capacity for sweeps.\n\n" +
				"RUN is a run id, a unique prefix of one, or \"last\".",
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				runs, err := loadRuns(cmd.Context(), db, args[0])
				if err != nil {
					return err
				}
				run := runs[0]
				rep := analyze(run, analysis.Options{})
				return analysis.WriteAnswerSummary(cmd.OutOrStdout(), run, rep, all, openings(run, rep)...)
			},
		}
		addDBFlag(c, &db)
		c.Flags().BoolVar(&all, "all", false, "after the answer, every detail: per-metric comparisons, verdict table, percentiles, resources, network per pod")
		c.Flags().IntVar(&resamples, "resamples", 0, "ignored")
		_ = c.Flags().MarkDeprecated("resamples", "intervals are t intervals over repeats now, which resample nothing")
		return c
	})
}
