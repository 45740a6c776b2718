package cli

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
)

// analyze runs the analysis with the SLO the run's own study file declared.
func analyze(run *results.Run) *analysis.Report {
	var slo *analysis.SLO
	if st, err := study.Parse(run.StudyPath, run.StudyFile); err == nil && st.Spec.SLO != nil {
		s := analysis.DefaultSLO()
		s.P50, s.P99 = st.Spec.SLO.P50.D(), st.Spec.SLO.P99.D()
		s.MaxErrorRate = st.Spec.SLO.ErrorRate.Fraction()
		slo = &s
	}
	return analysis.Analyze(run, analysis.Options{Seed: uint64(run.Seed)}, slo)
}

// printSummary is the terminal summary of a run: pooled percentiles per mesh, overhead
// against the baseline with 95% intervals, and the verdict table.
func printSummary(w io.Writer, run *results.Run) error {
	rep := analyze(run)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nLatency, pooled over repeats (corrected for coordinated omission)\n")
	fmt.Fprintln(tw, "experiment\tmesh\trepeats\trequests\treq/s\tp50\tp90\tp99\tp99.9\tmax\terrors\t")
	for _, g := range rep.Groups {
		flag := ""
		if g.GeneratorBehind > 0 {
			flag = " (generator behind)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%.2f%%%s\t\n", g.Label, g.Mesh, g.Repeats, g.Requests, g.Throughput,
			us(g.P50), us(g.P90), us(g.P99), us(g.P999), us(g.Max), 100*g.ErrorRate, flag)
	}
	tw.Flush()

	if len(rep.Comparisons) > 0 {
		fmt.Fprintf(w, "\nOverhead against %s (Δ and %%, bootstrap 95%% interval)\n", rep.Baseline)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "experiment\tmesh\tmetric\tbaseline\tmesh value\tΔ [95% CI]\t% [95% CI]\tverdict")
		for _, c := range rep.Comparisons {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Label, c.Mesh, c.Metric,
				value(c.Metric, c.Base), value(c.Metric, c.Value), deltaCI(c.Metric, c.Delta), pctCI(c.Pct), c.Verdict)
		}
		tw.Flush()
	}
	if len(rep.Capacity) > 0 {
		fmt.Fprintf(w, "\nCapacity under the SLO\n")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "experiment\tmesh\tmax sustainable\tthroughput\tknee\tlimited by")
		for _, c := range rep.Capacity {
			knee := "-"
			if c.HasKnee {
				knee = fmt.Sprintf("%.0f %s", c.KneeX, c.XName)
			}
			maxX := "not found"
			if c.Found {
				maxX = fmt.Sprintf("%.0f %s", c.MaxX, c.XName)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f req/s\t%s\t%s\n", c.Experiment, c.Mesh, maxX, c.MaxThroughput, knee, dash(c.Limit))
		}
		tw.Flush()
	}
	if len(rep.Winners) > 0 {
		fmt.Fprintf(w, "\nVerdict\n")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "parameter\tmetric\tbetter\tvalues\tdifference [95% CI]")
		for _, win := range rep.Winners {
			best := win.Best
			if win.Verdict != analysis.Better {
				best = "inconclusive (" + win.Best + " ahead)"
			}
			var vals []string
			for _, m := range run.Meshes {
				if v, ok := win.Values[m.Label]; ok {
					vals = append(vals, m.Label+" "+value(win.Metric, v))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", win.Label, win.Metric, best, strings.Join(vals, ", "), pctCI(win.Against.Pct))
		}
		tw.Flush()
	}
	return nil
}

func us(v int64) string { return results.Duration(v).Round(time.Microsecond).String() }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func value(m analysis.Metric, v float64) string {
	switch m.Unit() {
	case "µs", "us":
		return us(int64(math.Round(v)))
	case "":
		return fmt.Sprintf("%.3f%%", 100*v)
	default:
		return fmt.Sprintf("%.1f %s", v, m.Unit())
	}
}

func deltaCI(m analysis.Metric, e analysis.Estimate) string {
	f := func(v float64) string {
		s := value(m, math.Abs(v))
		if v < 0 {
			return "-" + s
		}
		return "+" + s
	}
	return fmt.Sprintf("%s [%s, %s]", f(e.Value), f(e.Lo), f(e.Hi))
}

func pctCI(e analysis.Estimate) string {
	if math.IsNaN(e.Value) {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f%% [%+.1f, %+.1f]", e.Value, e.Lo, e.Hi)
}
