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
	// Unit is what the intervals measured their spread over: "repeats" (the only unit
	// studentT uses; At scales by it).
	Unit string `json:"unit"`
	// Paired: every one of these comparisons took its repeats in pairs (interleaved
	// blocks), so its t interval had one degree of freedom less than the repeats.
	Paired bool `json:"paired,omitempty"`
}

// SensitivityOf summarises comparisons per metric, in the order of DefaultMetrics.
// Comparisons without an interval (NoInterval) are left out. Comparisons over repeats
// are preferred to any other unit, and among them those with the most repeats: a study
// that sets repeats per experiment (two capacity searches, sixty latency blocks) puts
// its comparisons on the most repeated points, and the median over all its points
// would be a two-repeat interval's, which says nothing of them.
func SensitivityOf(cs []Comparison) []Sensitivity {
	most := map[Metric]int{}
	for _, c := range cs {
		if !math.IsNaN(c.Pct.Lo) && !math.IsNaN(c.Pct.Hi) && c.Unit == "repeats" {
			most[c.Metric] = max(most[c.Metric], min(c.Repeats, c.BaseRepeats))
		}
	}
	type acc struct {
		half     []float64
		repeats  []int
		unpaired bool
	}
	by := map[Metric]map[string]*acc{}
	for _, c := range cs {
		if math.IsNaN(c.Pct.Lo) || math.IsNaN(c.Pct.Hi) || c.Unit == "repeats" && min(c.Repeats, c.BaseRepeats) < most[c.Metric] {
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
		a.unpaired = a.unpaired || !c.Paired
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
			Comparisons: len(a.half), Unit: unit, Paired: !a.unpaired})
	}
	return out
}

// At estimates the sensitivity with another number of repeats per mesh, the repeats'
// spread staying what this run measured (trial durations assumed unchanged). A t
// interval of n repeats is t(0.975; ν)·s/√n wide each way, with ν = n−1 degrees of
// freedom when paired (about 2(n−1) when not), and its s from few repeats is on
// average c4(ν)·σ: so the width scales as t(0.975; ν)·c4(ν)/√n. From three repeats,
// where t is 4.30, more repeats narrow it much faster than one over √n.
func (s Sensitivity) At(repeats int) float64 {
	if repeats < 2 || s.Repeats < 2 {
		return math.NaN()
	}
	width := func(n int) float64 {
		df := float64(n - 1)
		if !s.Paired {
			df *= 2
		}
		return tQuantile(0.975, df) * c4(df) / math.Sqrt(float64(n))
	}
	return s.Pct * width(repeats) / width(s.Repeats)
}
