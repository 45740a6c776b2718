package cli

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// planRuns is how many stored runs a plan reads at most, newest first.
const planRuns = 5

// planStudy prints, running nothing, how small a difference between two meshes the
// study's planned repeats should tell apart per metric, estimated from the stored runs
// of the same study (by name) or of the same workload graph: each run's sensitivity
// (analysis.SensitivityOf) scaled to the planned repeats, the median over the runs.
func planStudy(cmd *cobra.Command, st *study.Study, f runFlags) error {
	out := cmd.OutOrStdout()
	db, err := studyDB(st, f.db)
	if err != nil {
		return err
	}
	s, err := store.Open(cmd.Context(), db)
	if err != nil {
		return err
	}
	defer s.Close()
	summaries, err := s.ListRuns(cmd.Context())
	if err != nil {
		return err
	}
	repeats := max(st.Spec.Repeats, 2)
	est := map[analysis.Metric][]float64{}
	measured := map[analysis.Metric][]string{}
	var used []string
	for _, sum := range summaries {
		if len(used) == planRuns {
			break
		}
		run, err := s.LoadRun(cmd.Context(), sum.ID)
		if err != nil {
			return err
		}
		if run.Study != st.Metadata.Name && storedGraph(run.StudyFile) != st.Spec.Workload.Graph {
			continue
		}
		useful := false
		for _, x := range analysis.Analyze(run, analysis.Options{}, nil).Sensitivity {
			if x.Unit != "repeats" {
				continue // too few repeats: intervals within trials, which do not scale with repeats
			}
			useful = true
			est[x.Metric] = append(est[x.Metric], x.At(repeats))
			measured[x.Metric] = append(measured[x.Metric], fmt.Sprintf("±%.3g%% at %d", x.Pct, x.Repeats))
		}
		if useful {
			used = append(used, run.ID)
		}
	}
	fmt.Fprintf(out, "plan for study %s: %d repeats per mesh and point\n", st.Metadata.Name, repeats)
	if len(used) == 0 {
		fmt.Fprintf(out, "no stored run of study %s or graph %s with two or more repeats and a baseline to compare with in %s:\n"+
			"run it once with few repeats and short trials (a pilot, e.g. repeats: 5, duration: 5s), then plan again\n",
			st.Metadata.Name, st.Spec.Workload.Graph, s.Path())
		return nil
	}
	fmt.Fprintf(out, "estimated from %d stored runs (%s): the smallest difference between two meshes the comparisons should tell apart,\n"+
		"half the width of a 95%% interval, assuming trial durations as in those runs and a machine as noisy as it was then\n", len(used), strings.Join(used, ", "))
	for _, m := range analysis.DefaultMetrics {
		xs := est[m]
		if len(xs) == 0 || m == analysis.ErrorRate || m == analysis.Throughput {
			continue
		}
		slices.Sort(xs)
		fmt.Fprintf(out, "  %-6s ±%.3g%%   (measured %s repeats)\n", m, median(xs), strings.Join(measured[m], ", "))
	}
	return nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// storedGraph reads the workload graph a stored study file names ("" when it does not
// parse).
func storedGraph(raw []byte) string {
	var doc struct {
		Spec struct {
			Workload struct {
				Graph string `yaml:"graph"`
			} `yaml:"workload"`
		} `yaml:"spec"`
	}
	if yaml.Unmarshal(raw, &doc) != nil {
		return ""
	}
	return doc.Spec.Workload.Graph
}
