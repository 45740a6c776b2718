package analysis

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/meshmark/meshmark/internal/results"
)

// IntervalLine names how the run's intervals were computed, in one line: "95%
// intervals: paired t on 3 interleaved blocks of 10s" (see studentT and
// IntervalMethods). Empty without comparisons.
func (r *Report) IntervalLine() string {
	if len(r.Comparisons) == 0 {
		return ""
	}
	return fmt.Sprintf("%.0f%% intervals: %s", 100*r.Options.Confidence, IntervalMethods(r.Comparisons))
}

// SLOLine states the SLO the answer's flags judge by and where it came from.
func (r *Report) SLOLine() string {
	from := "the default; the study sets none"
	if r.SLOFromStudy {
		from = "set by the study"
	}
	return fmt.Sprintf("SLO (%s): %s", from, r.SLO)
}

// WriteAnswers prints the answer: the SLO and the interval method, one table per load
// point (each number with its flags beside it, the rankings and the flags' evidence
// under it), and the closed-loop capacities.
func WriteAnswers(w io.Writer, run *results.Run, rep *Report, answers []Answer) error {
	fmt.Fprintln(w, rep.SLOLine())
	if line := rep.IntervalLine(); line != "" {
		fmt.Fprintln(w, line)
	}
	conf := fmt.Sprintf("%.0f%%", 100*rep.Options.Confidence)
	said := map[string]bool{}
	for _, a := range answers {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "%s: %s\n", a.Label, answerHeadline(a))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "MESH\tADDED P50 [%s]\tADDED P99 [%s]\tCPU/1000 REQ/S PROXIES (SUT)\tPROXY MEM\tERRORS\tSECURITY\tVERDICT\n", conf, conf)
		for _, r := range a.Rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				withFlags(r.Mesh, r.Beside(FieldMesh)),
				withFlags(addedText(r, P50), r.Beside(FieldP50)),
				withFlags(addedText(r, P99), r.Beside(FieldP99)),
				withFlags(cpuText(r), r.Beside(FieldCPU)),
				withFlags(memText(r), r.Beside(FieldMemory)),
				withFlags(errorsText(r), r.Beside(FieldErrors)),
				withFlags(r.Security, r.Beside(FieldSecurity)),
				r.Verdict)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, rk := range a.Rankings {
			fmt.Fprintln(w, rk.Line())
		}
		for _, r := range a.Rows {
			for _, f := range r.Flags {
				// What holds for a mesh at every point (a failed probe) is said once.
				if line := r.Mesh + ": " + f.Detail; f.Detail != "" && !said[line] {
					said[line] = true
					fmt.Fprintf(w, "  %s\n", line)
				}
			}
		}
	}
	if lines := CapacityLines(run, rep); len(lines) > 0 {
		fmt.Fprintln(w)
		for _, l := range lines {
			fmt.Fprintln(w, l.Line)
		}
	}
	return nil
}

// answerHeadline says how many repeats a point had and the baseline's own latency,
// which the rows' added latencies are relative to.
func answerHeadline(a Answer) string {
	lo, hi := math.MaxInt, 0
	for _, r := range a.Rows {
		lo, hi = min(lo, r.Repeats), max(hi, r.Repeats)
	}
	s := fmt.Sprintf("%d repeats", lo)
	if hi != lo {
		s = fmt.Sprintf("%d–%d repeats", lo, hi)
	}
	for _, r := range a.Rows {
		if r.Baseline {
			return s + fmt.Sprintf("; latency added to %s's p50 %s and p99 %s", r.Mesh, FormatMicros(float64(r.P50)), FormatMicros(float64(r.P99)))
		}
	}
	return s + "; no baseline measured here, so nothing is added to"
}

func withFlags(s string, flags []Flag) string {
	if len(flags) == 0 {
		return s
	}
	labels := make([]string, len(flags))
	for i, f := range flags {
		labels[i] = f.Label
	}
	return s + " (" + strings.Join(labels, "; ") + ")"
}

// addedText is the latency a mesh adds at a percentile with its interval, the bounds
// in the unit of the value; the baseline's own value for the baseline.
func addedText(r AnswerRow, m Metric) string {
	c := r.AddedP50
	own := r.P50
	if m == P99 {
		c, own = r.AddedP99, r.P99
	}
	if c == nil {
		if r.Baseline {
			return "base " + FormatMicros(float64(own))
		}
		return "-"
	}
	return AddedLatency(c.Delta)
}

// AddedLatency renders a latency change (µs) and its interval with one unit: "+1.20ms
// [+1.01, +1.43]".
func AddedLatency(e Estimate) string {
	if math.IsNaN(e.Value) {
		return "-"
	}
	scale, unit := 1.0, "µs"
	switch a := math.Abs(e.Value); {
	case a >= 1e6:
		scale, unit = 1e6, "s"
	case a >= 1e3:
		scale, unit = 1e3, "ms"
	}
	s := signed3(e.Value/scale) + unit
	if !math.IsNaN(e.Lo) && !math.IsNaN(e.Hi) {
		s += " [" + SignedBound(e.Lo/scale, signed3) + ", " + SignedBound(e.Hi/scale, signed3) + "]"
	}
	return s
}

// SignedBound is an interval's bound as format writes it, or ">+9999" or "<-9999"
// beyond those: with few repeats a t interval can reach absurd lengths (2 repeats: t =
// 12.7), and eleven digits there would only hide that the bound is unknown in practice.
func SignedBound(x float64, format func(float64) string) string {
	switch {
	case x >= 1e4:
		return ">+9999"
	case x <= -1e4:
		return "<-9999"
	}
	return format(x)
}

// signed3 is x with a sign and about three significant digits, never in exponent
// form ("+1000", "+12.3", "-0.412").
func signed3(x float64) string {
	switch a := math.Abs(x); {
	case a >= 100:
		return fmt.Sprintf("%+.0f", x)
	case a >= 10:
		return fmt.Sprintf("%+.1f", x)
	case a >= 1:
		return fmt.Sprintf("%+.2f", x)
	}
	return fmt.Sprintf("%+.3f", x)
}

func cpuText(r AnswerRow) string {
	s := "-"
	if !math.IsNaN(r.ProxyCoresPer1000RPS) && r.Proxies > 0 {
		s = coresText(r.ProxyCoresPer1000RPS)
	}
	if !math.IsNaN(r.SUTCoresPer1000RPS) {
		s += " (" + coresText(r.SUTCoresPer1000RPS) + ")"
	}
	return s
}

// coresText prints cores per 1000 req/s to three figures. Proxies that carried none of
// a point's requests (the baseline's ingress on the internal path) sum to rounding
// noise around zero, which reads as "-7.95e-17" unless it is called 0: a millionth of a
// core is far below what a kubelet's or cgroup's counters resolve.
func coresText(v float64) string {
	if math.Abs(v) < 1e-6 {
		v = 0
	}
	return fmt.Sprintf("%.3g", v)
}

func memText(r AnswerRow) string {
	if r.Proxies == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fMiB", r.ProxyRSS/(1<<20))
}

func errorsText(r AnswerRow) string {
	if r.Errors == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%.3g%%)", r.Errors, 100*r.ErrorRate)
}

// WriteAnswerSummary prints the terminal summary of a run, the answer first: the run,
// the answer tables, how small a difference the run could see and what its intervals
// do not cover. With all, every detail follows (WriteRunSummary's tables: per-metric
// comparisons, the verdict table, percentiles, resources and network per pod).
// Openings come between the run and the answer: a published study's own tables when
// the run reproduces one (internal/reproduce).
func WriteAnswerSummary(w io.Writer, run *results.Run, rep *Report, all bool, openings ...func(io.Writer) error) error {
	writeRunHeader(w, run)
	fmt.Fprintln(w)
	for _, open := range openings {
		if err := open(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	// What a security experiment found is part of the answer, not a detail: a study of
	// security alone has nothing else to say.
	sec := SecurityMatrix(run)
	if len(sec) > 0 {
		if err := WriteSecurityMatrix(w, sec); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	if len(rep.Groups) == 0 {
		if len(sec) == 0 {
			fmt.Fprintln(w, "no load trials stored")
		}
	} else if err := WriteAnswers(w, run, rep, Answers(run, rep)); err != nil {
		return err
	}
	if len(rep.Sensitivity) > 0 {
		fmt.Fprintf(w, "\nsensitivity: %s\n", SensitivityLine(rep.Sensitivity))
	}
	for _, c := range rep.Caveats {
		fmt.Fprintf(w, "note: %s\n", c)
	}
	if all {
		fmt.Fprintln(w, "\nin detail:")
		return writeRunDetails(w, run, rep)
	}
	fmt.Fprintf(w, "\nper-metric comparisons, the verdict table, percentiles, resources and network per pod: meshmark show %s --all, or the report\n", run.ID)
	return nil
}
