package analysis

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// FormatMicros renders a latency in µs with a readable unit.
func FormatMicros(us float64) string {
	switch {
	case math.IsNaN(us):
		return "-"
	case math.Abs(us) < 1000:
		return fmt.Sprintf("%.0fµs", us)
	case math.Abs(us) < 1e6:
		return fmt.Sprintf("%.3gms", us/1e3)
	}
	return fmt.Sprintf("%.3gs", us/1e6)
}

// FormatValue renders a metric value in its unit.
func FormatValue(m Metric, v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case m.Percentile() >= 0:
		return FormatMicros(v)
	case m == Throughput:
		return fmt.Sprintf("%.1f/s", v)
	}
	return fmt.Sprintf("%.3g%%", 100*v)
}

// FormatDelta renders a change of a metric: "+123µs", "+1.2%" (relative) etc.
func FormatDelta(m Metric, v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	sign := "+"
	if v < 0 {
		sign = "-"
	}
	switch {
	case m.Percentile() >= 0:
		return sign + FormatMicros(math.Abs(v))
	case m == Throughput:
		return fmt.Sprintf("%+.1f/s", v)
	}
	return fmt.Sprintf("%+.3gpp", 100*v)
}

func pct(e Estimate) string {
	switch {
	case math.IsNaN(e.Value):
		return "-"
	case math.IsNaN(e.Lo) || math.IsNaN(e.Hi):
		return fmt.Sprintf("%+.1f%% [-, -]", e.Value) // no interval (NoInterval)
	}
	return fmt.Sprintf("%+.1f%% [%s, %s]", e.Value, SignedBound(e.Lo, signed1), SignedBound(e.Hi, signed1))
}

func signed1(x float64) string { return fmt.Sprintf("%+.1f", x) }

// WriteRunSummary prints every detail of a run (what `meshmark show --all` prints
// under the answer): the run, its meshes, a percentile table per mesh and point, the
// comparisons with the baseline, the verdict table, resources, network per pod
// interface and capacity.
func WriteRunSummary(w io.Writer, run *results.Run, rep *Report) error {
	writeRunHeader(w, run)
	return writeRunDetails(w, run, rep)
}

// writeRunHeader prints the run, when and where it ran.
func writeRunHeader(w io.Writer, run *results.Run) {
	p := run.Provenance
	fmt.Fprintf(w, "run %s  study %s  %s", run.ID, run.Study, run.Status)
	if run.StatusReason != "" {
		fmt.Fprintf(w, " (%s)", run.StatusReason)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "started %s", run.Started.Local().Format(time.DateTime))
	if !run.Ended.IsZero() {
		fmt.Fprintf(w, ", took %s", run.Ended.Sub(run.Started).Round(time.Second))
	}
	fmt.Fprintf(w, ", seed %d", run.Seed)
	if run.Substrate != "" {
		fmt.Fprintf(w, ", substrate %s", run.Substrate)
	}
	fmt.Fprintln(w)
	if p.Kernel != "" || p.CPUModel != "" {
		fmt.Fprintf(w, "host: kernel %s, %s, %d cores, meshmark %s\n", p.Kernel, p.CPUModel, p.Cores, p.MeshmarkVersion)
	}
	if len(p.Components) > 0 {
		var cs []string
		for k, v := range p.Components {
			cs = append(cs, k+" "+v)
		}
		sort.Strings(cs)
		fmt.Fprintf(w, "components: %s\n", strings.Join(cs, ", "))
	}
}

// writeRunDetails prints the meshes and every table of the analysis.
func writeRunDetails(w io.Writer, run *results.Run, rep *Report) error {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MESH\tPROFILE\tOPTIONS\tEQUIVALENCE CHECK")
	for _, m := range run.Meshes {
		var opts []string
		for k, v := range m.Options {
			opts = append(opts, k+"="+v)
		}
		sort.Strings(opts)
		check := "not stored"
		if len(m.Enrollment) > 0 {
			check = "stored"
		}
		base := ""
		if m.Label == rep.Baseline {
			base = " (baseline)"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\n", m.Label, base, m.Profile, strings.Join(opts, ","), check)
	}
	tw.Flush()
	fmt.Fprintln(w)
	if sec := SecurityMatrix(run); len(sec) > 0 {
		if err := WriteSecurityMatrix(w, sec); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	if len(rep.Groups) == 0 {
		fmt.Fprintln(w, "no load trials stored")
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "POINT\tMESH\tREPEATS\tREQUESTS\tERRORS\tTHROUGHPUT\tP50\tP90\tP99\tP99.9\tMAX\tNOTES\t")
	for _, g := range rep.Groups {
		var notes []string
		if g.ProxyBypassed > 0 {
			notes = append(notes, fmt.Sprintf("traffic bypassed the mesh in %d", g.ProxyBypassed))
		}
		if g.Saturated > 0 {
			notes = append(notes, fmt.Sprintf("TARGET SATURATED in %d of %d: latency of a growing queue", g.Saturated, g.Repeats))
		}
		if g.GeneratorBehind > 0 {
			notes = append(notes, fmt.Sprintf("generator behind in %d", g.GeneratorBehind))
		}
		if g.Failures > 0 {
			notes = append(notes, fmt.Sprintf("%d failed without a response (in the latency at their time to failure)", g.Failures))
		}
		if g.MixedParams {
			notes = append(notes, "repeats ran at different load parameters")
		}
		if len(g.Outliers) > 0 {
			notes = append(notes, fmt.Sprintf("outlier trials %v", g.Outliers))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.3g%%\t%.1f/s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", g.Label, g.Mesh, g.Repeats, g.Requests,
			100*g.ErrorRate, g.Throughput, FormatMicros(float64(g.P50)), FormatMicros(float64(g.P90)), FormatMicros(float64(g.P99)),
			FormatMicros(float64(g.P999)), FormatMicros(float64(g.Max)), strings.Join(notes, "; "))
	}
	tw.Flush()
	if len(rep.Excluded) > 0 {
		fmt.Fprintf(w, "\n%d trials left out of every number above:\n", len(rep.Excluded))
		for _, x := range rep.Excluded {
			why := "its attempt was cut short by a fault and measured again"
			if x.Flag == results.FlagBackedOff {
				why = "a trial at this rate saturated the target, so the experiment was measured again at a lower rate"
			}
			if x.Flag == results.FlagFault {
				var fs []string
				for _, f := range x.Faults {
					fs = append(fs, f.String())
				}
				why = "fault: " + strings.Join(fs, "; ") + "; measured again"
			}
			fmt.Fprintf(w, "  trial %d, %s on %s, repeat %d: %s\n", x.TrialID, x.Label, x.Mesh, x.Repeat+1, why)
		}
	}
	if len(rep.Comparisons) > 0 {
		fmt.Fprintf(w, "\noverhead against %s (%.0f%% intervals: %s):\n", rep.Baseline, 100*rep.Options.Confidence, IntervalMethods(rep.Comparisons))
		if err := WriteComparisons(w, rep.Comparisons); err != nil {
			return err
		}
		if len(rep.Sensitivity) > 0 {
			fmt.Fprintf(w, "\nsensitivity: %s\n", SensitivityLine(rep.Sensitivity))
		}
		for _, c := range rep.Caveats {
			fmt.Fprintf(w, "note: %s\n", c)
		}
	}
	if len(rep.Winners) > 0 {
		fmt.Fprintln(w, "\nverdict table:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "POINT\tMETRIC\tBETTER\tVALUES\tRUNNER-UP Δ")
		for _, v := range rep.Winners {
			better := v.Best
			if v.Verdict != Better {
				better = string(v.Verdict)
			}
			var vals []string
			for _, m := range run.Meshes {
				if x, ok := v.Values[m.Label]; ok {
					vals = append(vals, m.Label+" "+FormatValue(v.Metric, x))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s %s\n", v.Label, v.Metric, better, strings.Join(vals, ", "), v.RunnerUp, pct(v.Against.Pct))
		}
		tw.Flush()
	}
	if len(rep.Resources) > 0 {
		fmt.Fprintln(w, "\nresources (summed over processes, mean over repeats):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		mem := strings.ToUpper(run.MemoryMeasure())
		fmt.Fprintf(tw, "POINT\tMESH\tCOMPONENT\tROLE\tPROCS\tCPU CORES\tPEAK\tCORES/1000 RPS\t%s MEAN\t%s PEAK\tPSS PEAK\t\n", mem, mem)
		for _, u := range rep.Resources {
			// A cluster's kubelets report no PSS: not measured, not zero.
			pss := "n/a"
			if u.PSSPeak > 0 || run.Substrate != "kubernetes" {
				pss = mib(float64(u.PSSPeak))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%s\t%s\t%s\t\n", u.Label, u.Mesh, u.Component, u.Role, u.Processes,
				u.CPUCores, u.CPUCoresPeak, u.CoresPer1000RPS, mib(u.RSSMean), mib(float64(u.RSSPeak)), pss)
		}
		tw.Flush()
	}
	if len(rep.Network) > 0 {
		fmt.Fprintln(w, "\nnetwork per pod interface (rates mean over repeats, drops summed; lo only when it carried traffic):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "POINT\tMESH\tPOD\tIFACE\tRX\tTX\tRX PKT/S\tTX PKT/S\tDROPPED RX/TX\t")
		for _, u := range rep.Network {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t%d/%d\t\n", u.Label, u.Mesh, u.Pod, u.Interface,
				byteRate(u.RxBytesPerSec), byteRate(u.TxBytesPerSec), u.RxPacketsPerSec, u.TxPacketsPerSec, u.RxDropped, u.TxDropped)
		}
		tw.Flush()
	}
	for i, c := range rep.Capacity {
		if i == 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "capacity of %s in %s: ", c.Mesh, c.Experiment)
		if c.Found {
			fmt.Fprintf(w, "%g %s (%.1f req/s served)", c.MaxX, c.XName, c.MaxThroughput)
		} else {
			fmt.Fprint(w, "the lowest step already misses the SLO")
		}
		if c.Limit != "" {
			fmt.Fprintf(w, "; next step: %s", c.Limit)
		}
		if c.HasKnee {
			fmt.Fprintf(w, "; knee at %g %s (%s)", c.KneeX, c.XName, c.KneeRule)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// WriteComparisons prints one line per comparison.
func WriteComparisons(w io.Writer, cs []Comparison) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POINT\tMESH\tMETRIC\tREFERENCE\tVALUE\tΔ [interval]\tΔ% [interval]\tNOISE FLOOR\tVERDICT")
	for _, c := range cs {
		floor := "-"
		if c.NoiseSource != "" {
			floor = fmt.Sprintf("%.1f%% (%s)", c.NoiseFloorPct, c.NoiseSource)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s [%s, %s]\t%s\t%s\t%s\n", c.Label, c.Mesh, c.Metric,
			FormatValue(c.Metric, c.Base), FormatValue(c.Metric, c.Value),
			FormatDelta(c.Metric, c.Delta.Value), FormatDelta(c.Metric, c.Delta.Lo), FormatDelta(c.Metric, c.Delta.Hi),
			pct(c.Pct), floor, c.Verdict)
	}
	return tw.Flush()
}

// byteRate renders bytes per second with a binary unit.
func byteRate(b float64) string {
	switch {
	case b < 1<<10:
		return fmt.Sprintf("%.0fB/s", b)
	case b < 1<<20:
		return fmt.Sprintf("%.1fKiB/s", b/(1<<10))
	case b < 1<<30:
		return fmt.Sprintf("%.1fMiB/s", b/(1<<20))
	}
	return fmt.Sprintf("%.2fGiB/s", b/(1<<30))
}

func mib(b float64) string { return fmt.Sprintf("%.1fMiB", b/(1<<20)) }

// SensitivityLine says in one line how small a difference the run could tell apart
// per metric: "p50 ±4.1%, p99 ±23%, ... (half the 95% interval's width, median over 6
// comparisons, 5 repeats)".
func SensitivityLine(ss []Sensitivity) string {
	var parts []string
	n, repeats, unit := 0, 0, "repeats"
	for _, s := range ss {
		if s.Metric == ErrorRate || s.Metric == Throughput {
			continue // at a fixed rate these hardly move; the latencies are what a study resolves
		}
		parts = append(parts, fmt.Sprintf("%s ±%.3g%%", s.Metric, s.Pct))
		n, repeats, unit = max(n, s.Comparisons), max(repeats, s.Repeats), s.Unit
	}
	if len(parts) == 0 {
		return "no latency comparison"
	}
	return fmt.Sprintf("%s (the smallest relative difference the comparisons could tell apart: half the width of their interval on the ratio of the two meshes' values, median over %d comparisons, %d %s)",
		strings.Join(parts, ", "), n, repeats, unit)
}
