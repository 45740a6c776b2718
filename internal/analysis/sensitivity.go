package analysis

import (
	"math"
	"slices"
)

// Sensitivity is the smallest relative difference between two meshes that a run's
// comparisons could tell apart, for one metric: the median, over its comparisons, of
// half the width of the Δ% interval (a difference smaller than that is inside the
// interval of no difference), with the repeats per mesh those comparisons had.
type Sensitivity struct {
	Metric      Metric  `json:"metric"`
	Pct         float64 `json:"pct"`
	Repeats     int     `json:"repeats"`
	Comparisons int     `json:"comparisons"`
	// Unit is what the intervals resampled: "repeats", or "intervals" when there were
	// too few repeats (then At cannot scale it by repeats honestly).
	Unit string `json:"unit"`
}

// SensitivityOf summarises comparisons per metric, in the order of DefaultMetrics.
// Comparisons that resampled repeats are preferred: they carry the variance between
// bring-ups, which dominates on this testbed; interval-resampled ones are used only
// for a metric that has no other.
func SensitivityOf(cs []Comparison) []Sensitivity {
	type acc struct {
		half    []float64
		repeats []int
	}
	by := map[Metric]map[string]*acc{}
	for _, c := range cs {
		if math.IsNaN(c.Pct.Lo) || math.IsNaN(c.Pct.Hi) {
			continue
		}
		if by[c.Metric] == nil {
			by[c.Metric] = map[string]*acc{}
		}
		a := by[c.Metric][c.Unit]
		if a == nil {
			a = &acc{}
			by[c.Metric][c.Unit] = a
		}
		a.half = append(a.half, (c.Pct.Hi-c.Pct.Lo)/2)
		a.repeats = append(a.repeats, min(c.Repeats, c.BaseRepeats))
	}
	var out []Sensitivity
	for _, m := range DefaultMetrics {
		units := by[m]
		unit := "repeats"
		a := units[unit]
		if a == nil {
			unit = "intervals"
			a = units[unit]
		}
		if a == nil {
			continue
		}
		slices.Sort(a.repeats)
		out = append(out, Sensitivity{Metric: m, Pct: quantile(a.half, 0.5), Repeats: a.repeats[len(a.repeats)/2],
			Comparisons: len(a.half), Unit: unit})
	}
	return out
}

// At estimates the sensitivity with another number of repeats per mesh, the repeats'
// spread staying what this run measured (trial durations assumed unchanged). A
// bootstrap interval of a mean of n repeats is as wide as σ·√(n−1)/n, not σ/√n: it
// resamples the n values it has, whose spread is (n−1)/n of the true variance. So
// it narrows a little more slowly than one over √n from a pilot of few repeats.
func (s Sensitivity) At(repeats int) float64 {
	if repeats < 2 || s.Repeats < 2 {
		return math.NaN()
	}
	width := func(n float64) float64 { return math.Sqrt(n-1) / n }
	return s.Pct * width(float64(repeats)) / width(float64(s.Repeats))
}
