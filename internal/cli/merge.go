package cli

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/spf13/cobra"
)

func init() {
	register(func() *cobra.Command {
		var format, output string
		c := &cobra.Command{
			Use:   "merge RESULT.json...",
			Short: "Merge the results of load generators that ran side by side into one, exactly",
			Long: "merge reads `meshmark load --format json` results of generators that drove one " +
				"target at the same time (processes, or pods on several nodes) and prints the result " +
				"of all their requests together: counts and rates add up, and the HDR histograms merge " +
				"bucket by bucket, so every percentile is that of all the requests, not an average " +
				"of the generators' percentiles.",
			Args: cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if format != "table" && format != "json" && format != "csv" {
					return withExitCode(2, fmt.Errorf("--format %q: want table, json or csv", format))
				}
				var results []*load.Result
				for _, path := range args {
					data, err := os.ReadFile(path)
					if err != nil {
						return withExitCode(2, err)
					}
					var r load.Result
					if err := json.Unmarshal(data, &r); err != nil {
						return withExitCode(2, fmt.Errorf("%s: not a meshmark load result (--format json): %w", path, err))
					}
					results = append(results, &r)
				}
				merged, err := load.Merge(results)
				if err != nil {
					return withExitCode(2, err)
				}
				return writeResult(cmd, merged, format, output)
			},
		}
		c.Flags().StringVar(&format, "format", "table", "output format: table, json or csv")
		c.Flags().StringVarP(&output, "output", "o", "", "write the result to this file instead of stdout")
		return c
	})
}
