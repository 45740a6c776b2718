package cli

import (
	"encoding/json"
	"fmt"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/spf13/cobra"
)

// Exit codes of `meshmark compare`.
const (
	exitBadGate    = 2
	exitGateFailed = 3
)

func init() {
	register(func() *cobra.Command {
		var db string
		var gates, meshes []string
		var resamples int
		var seed uint64
		var asJSON bool
		c := &cobra.Command{
			Use:   "compare RUN_A RUN_B",
			Short: "Compare the same meshes and experiments across two runs (old → new), optionally as a CI gate",
			Long: "compare pairs every mesh × experiment × step present in both runs and prints the change " +
				"from RUN_A to RUN_B with confidence intervals (Welch t over the two runs' repeats), the noise floor (from RUN_A) and a " +
				"verdict.\n\n" +
				"--fail-if adds a gate: <metric> <op> <threshold>, metric p50|p90|p99|p99.9|throughput|error_rate, " +
				"op > >= < <=, threshold a signed number with a unit: % (relative), us|ms|s (latency), rps " +
				"(throughput), pp (error-rate percentage points). Examples: 'p99 > +10%', 'p50 > +2ms', " +
				"'throughput < -5%', 'error_rate > +0.5pp'. A gate fails when the change crosses the threshold " +
				"and its confidence interval excludes zero, so noise alone never fails it. " +
				"--fail-if security fails when a security probe fails in RUN_B and did not in RUN_A.\n\n" +
				"Exit status: 0 when no gate fails, 3 when a gate fails, 2 for a malformed gate, 1 for other errors.\n" +
				"RUN_A and RUN_B are run ids, unique prefixes of them, or \"last\".",
			Args: cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				var parsed []analysis.Gate
				for _, g := range gates {
					p, err := analysis.ParseGate(g)
					if err != nil {
						return withExitCode(exitBadGate, err)
					}
					parsed = append(parsed, p)
				}
				runs, err := loadRuns(cmd.Context(), db, args[0], args[1])
				if err != nil {
					return err
				}
				a, b := runs[0], runs[1]
				cs, err := analysis.CompareRuns(a, b, meshes, analysis.Options{})
				if err != nil {
					return err
				}
				results, failed := analysis.CheckGates(parsed, cs)
				security := analysis.CompareSecurity(a, b, meshes)
				for _, g := range parsed {
					if g.Security {
						rs, f := analysis.CheckSecurityGate(g, security)
						if len(rs) == 0 {
							return fmt.Errorf("--fail-if security: run %s has no security experiment to judge", b.ID)
						}
						results, failed = append(results, rs...), failed || f
					}
				}
				out := cmd.OutOrStdout()
				if asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					if err := enc.Encode(map[string]any{"a": a.ID, "b": b.ID, "comparisons": cs, "security": security, "gates": results, "failed": failed}); err != nil {
						return err
					}
				} else {
					fmt.Fprintf(out, "run %s (%s) → run %s (%s); 95%% intervals: %s\n", a.ID, a.Study, b.ID, b.Study, analysis.IntervalMethods(cs))
					if err := analysis.WriteComparisons(out, cs); err != nil {
						return err
					}
					for _, r := range results {
						mark := "ok  "
						if r.Failed {
							mark = "FAIL"
						}
						fmt.Fprintf(out, "%s %s\n", mark, r.Why)
					}
				}
				if failed {
					n := 0
					for _, r := range results {
						if r.Failed {
							n++
						}
					}
					return withExitCode(exitGateFailed, fmt.Errorf("%d gate check(s) failed", n))
				}
				return nil
			},
		}
		addDBFlag(c, &db)
		c.Flags().StringArrayVar(&gates, "fail-if", nil, "gate expression, e.g. 'p99 > +10%' or 'security' (repeatable)")
		c.Flags().StringSliceVar(&meshes, "mesh", nil, "compare only these meshes (repeatable or comma-separated)")
		c.Flags().IntVar(&resamples, "resamples", 0, "ignored")
		c.Flags().Uint64Var(&seed, "seed", 0, "ignored")
		for _, f := range []string{"resamples", "seed"} {
			_ = c.Flags().MarkDeprecated(f, "intervals are t intervals over repeats now, which resample nothing")
		}
		c.Flags().BoolVar(&asJSON, "json", false, "print comparisons and gate results as JSON")
		return c
	})
}
