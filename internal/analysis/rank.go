package analysis

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/meshmark/meshmark/internal/results"
)

// Ranking orders the meshes at one point on one metric, fastest first, and says for
// each step from one mesh to the next whether its comparison resolved it. The order
// is that of the pooled values; a step is resolved only when the slower mesh's
// interval against the faster one says Worse (as Winners judges the best against the
// runner-up: noise floor and margin included), so a reader sees which of the order's
// steps the run can stand behind and which it cannot.
type Ranking struct {
	Point
	Label  string `json:"label"`
	Metric Metric `json:"metric"`
	// Order is the meshes, fastest first.
	Order []string `json:"order"`
	// Steps[i] compares Order[i+1] against Order[i].
	Steps []RankStep `json:"steps"`
}

// RankStep is one step of a ranking: the slower mesh against the faster.
type RankStep struct {
	Faster string `json:"faster"`
	Slower string `json:"slower"`
	// Comparison is Slower with Faster as its reference.
	Comparison Comparison `json:"comparison"`
	// Resolved: the slower mesh is conclusively slower (Comparison.Verdict is Worse).
	Resolved bool `json:"resolved"`
}

// Symbol is how a step reads in a ranking line: "<" resolved, "=" equal within the
// metric's margin, "~" not resolved (whatever else the comparison's verdict says).
func (s RankStep) Symbol() string {
	switch {
	case s.Resolved:
		return "<"
	case s.Comparison.Verdict == Equal:
		return "="
	}
	return "~"
}

// RankedMetrics are the metrics the answer ranks meshes on.
var RankedMetrics = []Metric{P50, P99}

// Rank ranks the meshes other than the baseline at every point where two or more of
// them were measured, on each of metrics (RankedMetrics when none are given). The
// baseline is left out: each mesh's row already says what it adds to it.
func Rank(run *results.Run, rep *Report, metrics ...Metric) []Ranking {
	if len(metrics) == 0 {
		metrics = RankedMetrics
	}
	opts := rep.Options.withDefaults()
	var out []Ranking
	for _, pt := range points(rep.Groups) {
		var at []*Group
		for _, g := range rep.Groups {
			if g.Experiment == pt.Experiment && g.Step == pt.Step && g.Mesh != rep.Baseline {
				at = append(at, g)
			}
		}
		if len(at) < 2 || at[0].Kind == results.KindCapacity {
			continue // closed-loop maxima: every mesh ran at its own rate, latencies do not compare
		}
		floors := NoiseFloor(run, rep.Groups, pt, opts)
		for _, m := range metrics {
			sorted := append([]*Group(nil), at...)
			sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Value(m) < sorted[j].Value(m) })
			r := Ranking{Point: pt, Label: at[0].Label, Metric: m}
			o := opts
			o.Metrics = []Metric{m}
			for i, g := range sorted {
				r.Order = append(r.Order, g.Mesh)
				if i == 0 {
					continue
				}
				c := compareGroups(sorted[i-1], g, o, floors)[0]
				r.Steps = append(r.Steps, RankStep{Faster: sorted[i-1].Mesh, Slower: g.Mesh, Comparison: c, Resolved: c.Verdict == Worse})
			}
			out = append(out, r)
		}
	}
	return out
}

// Line is the ranking in one line: "fastest to slowest at p99: a < b ~ c (< significant;
// b ~ c: +3.1% [-2.0, +8.4] not resolved)". Every step that is not significant is
// named with its change and interval.
func (r Ranking) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fastest to slowest at %s: %s", r.Metric, r.Order[0])
	var open []string
	for i, s := range r.Steps {
		fmt.Fprintf(&b, " %s %s", s.Symbol(), r.Order[i+1])
		if !s.Resolved {
			open = append(open, fmt.Sprintf("%s %s %s: %s", s.Faster, s.Symbol(), s.Slower, stepChange(s.Comparison)))
		}
	}
	switch {
	case len(open) == 0:
		b.WriteString(" (each step significant)")
	case len(open) == len(r.Steps):
		fmt.Fprintf(&b, " (no step significant; %s)", strings.Join(open, "; "))
	default:
		fmt.Fprintf(&b, " (< significant; %s)", strings.Join(open, "; "))
	}
	return b.String()
}

// Unresolved lists the steps that are not significant.
func (r Ranking) Unresolved() []RankStep {
	var out []RankStep
	for _, s := range r.Steps {
		if !s.Resolved {
			out = append(out, s)
		}
	}
	return out
}

// stepChange is a comparison's change with its interval (relative when it has one)
// and why the step is not significant: equal within the margin, not resolved, or the
// comparison's own verdict when it is another (say, saturated).
func stepChange(c Comparison) string {
	s := FormatDelta(c.Metric, c.Delta.Value) + " [" + FormatDelta(c.Metric, c.Delta.Lo) + ", " + FormatDelta(c.Metric, c.Delta.Hi) + "]"
	if !math.IsNaN(c.Pct.Value) {
		s = pct(c.Pct)
	}
	switch c.Verdict {
	case Equal:
		return s + fmt.Sprintf(" equal within ±%g%%", c.Margin)
	case Inconclusive, Worse, Better:
		return s + " not resolved"
	}
	return s + " " + string(c.Verdict)
}
