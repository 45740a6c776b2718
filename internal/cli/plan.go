package cli

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// planRuns is how many stored runs a plan reads at most, newest first.
const planRuns = 5

// planStudy prints, running nothing, the study's expected wall time and how small a
// difference between two meshes its planned repeats should tell apart per metric,
// both estimated from stored runs of the same study (by name; another study's runs
// measured another design): each run's sensitivity (analysis.SensitivityOf) scaled to
// the planned repeats, the median over the runs; the planned load time scaled by the
// ratio of wall time to planned load time of the stored complete runs.
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
	// The sensitivity projected is the comparisons', which the most repeated
	// experiment (the latency blocks, in a study that sets repeats per experiment) has.
	fewest, most := 0, 0
	for i := range st.Spec.Experiments {
		if e := &st.Spec.Experiments[i]; e.Kind != study.KindSecurity {
			n := st.Spec.RepeatsOf(e)
			most = max(most, n)
			if fewest == 0 || n < fewest {
				fewest = n
			}
		}
	}
	if most == 0 { // security experiments only: each runs once per mesh
		fewest, most = 1, 1
	}
	repeats := max(most, 2)
	est := map[analysis.Metric][]float64{}
	measured := map[analysis.Metric][]string{}
	var used, others []string
	var ratios []float64
	var timed []string
	for _, sum := range summaries {
		if len(used) == planRuns {
			break
		}
		if sum.Study != st.Metadata.Name {
			if len(others) < planRuns {
				others = append(others, sum.ID+" ("+sum.Study+")")
			}
			continue
		}
		run, err := s.LoadRun(cmd.Context(), sum.ID)
		if err != nil {
			return err
		}
		if r, ok := wallRatio(run); ok && len(ratios) < planRuns {
			ratios = append(ratios, r)
			timed = append(timed, run.ID)
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
	plan := st.Plan()
	load, bringUps := runner.PlannedLoadTime(st), 0
	for _, t := range plan {
		if t.BringUp {
			bringUps++
		}
	}
	repeatWords := fmt.Sprintf("%d repeats", most)
	if fewest < most {
		repeatWords = fmt.Sprintf("%d to %d repeats", fewest, most)
	}
	fmt.Fprintf(out, "plan for study %s: %s per mesh and point, %d trials, %d bring-ups, %s under load (warm-ups included)\n",
		st.Metadata.Name, repeatWords, len(plan), bringUps, load.Round(time.Second))
	if len(ratios) > 0 {
		slices.Sort(ratios)
		fmt.Fprintf(out, "expected wall time: about %s (the load time × %.2f, the median ratio of wall time to planned load time of %d stored complete runs of this study: %s)\n",
			time.Duration(float64(load)*median(ratios)).Round(time.Second), median(ratios), len(ratios), strings.Join(timed, ", "))
	} else {
		fmt.Fprintf(out, "expected wall time: more than %s: %d bring-ups and their checks come on top, and no stored complete run of study %s says how long they take here\n",
			load.Round(time.Second), bringUps, st.Metadata.Name)
	}
	if len(used) == 0 {
		fmt.Fprintf(out, "no stored run of study %s with two or more repeats and a baseline to compare with in %s:\n"+
			"run it once with few repeats and short trials (a pilot, e.g. repeats: 5, duration: 5s), then plan again\n",
			st.Metadata.Name, s.Path())
		if len(others) > 0 {
			fmt.Fprintf(out, "(runs of other studies are not used, since they measured another design: %s)\n", strings.Join(others, ", "))
		}
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

// wallRatio is a complete stored run's wall time over the load time its own study file
// planned: what bring-ups, checks and searches add on this machine.
func wallRatio(run *results.Run) (float64, bool) {
	if run.Status != results.StatusComplete || run.Ended.IsZero() || len(run.StudyFile) == 0 {
		return 0, false
	}
	st, err := study.Parse(run.StudyPath, run.StudyFile)
	if err != nil {
		return 0, false
	}
	load := runner.PlannedLoadTime(st)
	wall := run.Ended.Sub(run.Started)
	if load <= 0 || wall <= 0 {
		return 0, false
	}
	return float64(wall) / float64(load), true
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
