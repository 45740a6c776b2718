package analysis

import (
	"math"
	"slices"
)

// Sensitivity is the smallest relative difference between two meshes that a run's
// comparisons could tell apart, for one metric: the median, over its comparisons, of
// half the width of the interval of the ratio of the two meshes' values, in % (see
// halfWidthOfRatio; a difference smaller than that is inside the interval of no
// difference), with the repeats per mesh those comparisons had.
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
		a.half = append(a.half, halfWidthOfRatio(c.Pct))
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

// halfWidthOfRatio is a Δ% interval's half-width measured on the ratio of the two
// values, 100·(exp(h)−1) for h half the width of its log: how precisely the run knows
// by what factor the two differ. Half the width in % of the reference, which it
// equals for two meshes close to each other, grows with the difference: a sidecar
// that multiplies the baseline's p50 by 3.6, known to ±3 %, is +262 % [+253, +274],
// ±10.5 % of the baseline's p50, and read the other way round (the baseline against
// the sidecar) the same trials give −72.4 % [−73.3, −71.7], ±0.8 %. That is the size
// of the difference, not the run's resolution; the ratio's half-width is the same
// both ways round. An interval that reaches −100 % (a linear one, of values that
// can be zero) has no ratio to take: its half-width in % is kept.
func halfWidthOfRatio(pct Estimate) float64 {
	lo, hi := 1+pct.Lo/100, 1+pct.Hi/100
	if !(lo > 0) || !(hi > 0) {
		return (pct.Hi - pct.Lo) / 2
	}
	return 100 * math.Expm1((math.Log(hi)-math.Log(lo))/2)
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
