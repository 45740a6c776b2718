package analysis

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
)

// bringUpRun is synthRun where every trial also carries an offset of its own (a
// bring-up's luck, drawn with sd spread µs), the variance that dominates between
// repeats on the testbed, and every repeat a drift of the machine that moves both of
// its trials alike (sd drift µs), as this VM's load moves over minutes.
func bringUpRun(seed uint64, repeats int, spread, drift float64) *results.Run {
	rng := rand.New(rand.NewPCG(seed, 7))
	run := &results.Run{ID: "synthetic", Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "sidecar", Profile: "envoy-sidecar"}}}
	p := results.TrialParams{RequestedRate: 100}
	for r := 0; r < repeats; r++ {
		d := rng.NormFloat64() * drift
		for _, m := range []string{"none", "sidecar"} {
			run.Trials = append(run.Trials, synthTrial(rng, m, r, 1000, int64(rng.NormFloat64()*spread+d)+300, "fixed", p))
		}
	}
	return run
}

// The plan's rule: a sensitivity measured with few repeats, scaled to more, predicts
// the sensitivity a run with that many achieves, within a factor of 2 — over twenty
// independent pairs of runs (4 repeats planning 16), the median within a third. The
// repeats are taken in pairs (one interleaved block each), so a 4-repeat pilot
// knows the spread from 3 differences only: one time in six or seven it misjudges it
// by more than 2 (40 pairs of runs: 6 outside); the test allows a fifth.
func TestSensitivityScalesWithRepeats(t *testing.T) {
	var ratios []float64
	outside := 0
	const pairs = 20
	for seed := uint64(1); seed <= pairs; seed++ {
		pilotRun, realRun := bringUpRun(seed, 4, 60, 60), bringUpRun(seed+100, 16, 60, 60)
		pilot := SensitivityOf(Analyze(pilotRun, Options{Seed: 1}, nil).Comparisons)
		real := SensitivityOf(Analyze(realRun, Options{Seed: 1}, nil).Comparisons)
		var planned, achieved float64
		for _, s := range pilot {
			if s.Metric == P50 {
				if s.Unit != "repeats" || s.Repeats != 4 {
					t.Fatalf("pilot sensitivity %+v: want an interval over 4 repeats", s)
				}
				planned = s.At(16)
			}
		}
		for _, s := range real {
			if s.Metric == P50 {
				achieved = s.Pct
			}
		}
		r := planned / achieved
		t.Logf("seed %d: planned ±%.2f%%, achieved ±%.2f%% (ratio %.2f)", seed, planned, achieved, r)
		if math.IsNaN(r) {
			t.Fatalf("seed %d: planned ±%.2f%% for 16 repeats, achieved ±%.2f%%", seed, planned, achieved)
		}
		if r < 0.5 || r > 2 {
			outside++
		}
		ratios = append(ratios, r)
	}
	if outside > pairs/5 {
		t.Errorf("%d of %d plans missed the achieved sensitivity by more than a factor of 2", outside, pairs)
	}
	slices.Sort(ratios)
	if m := (ratios[pairs/2-1] + ratios[pairs/2]) / 2; m < 0.67 || m > 1.5 {
		t.Errorf("median ratio planned/achieved %.2f", m)
	}
}

func TestSensitivityOf(t *testing.T) {
	cs := []Comparison{
		{Metric: P50, Pct: Estimate{Lo: -4, Hi: 6}, Unit: "repeats", Repeats: 5, BaseRepeats: 5},
		{Metric: P50, Pct: Estimate{Lo: -1, Hi: 1}, Unit: "repeats", Repeats: 5, BaseRepeats: 5},
		{Metric: P50, Pct: Estimate{Lo: -10, Hi: 10}, Unit: "repeats", Repeats: 5, BaseRepeats: 5},
		{Metric: P50, Pct: Estimate{Lo: -50, Hi: 50}, Unit: "intervals", Repeats: 2, BaseRepeats: 2},
		{Metric: P99, Pct: Estimate{Lo: -20, Hi: 20}, Unit: "intervals", Repeats: 2, BaseRepeats: 2},
		{Metric: P90, Pct: Estimate{Lo: math.NaN(), Hi: math.NaN()}, Unit: "repeats", Repeats: 5, BaseRepeats: 5},
		// A point repeated twice (a capacity stage before many latency blocks) says
		// nothing of the sensitivity of the five-repeat points.
		{Metric: P50, Pct: Estimate{Lo: -900, Hi: 900}, Unit: "repeats", Repeats: 2, BaseRepeats: 2},
		{Metric: P50, Pct: Estimate{Lo: -800, Hi: 800}, Unit: "repeats", Repeats: 5, BaseRepeats: 2},
	}
	got := SensitivityOf(cs)
	// The median comparison is the one of [-4, +6] %: ratios 0.96 to 1.06, whose
	// logs are 0.0991 apart, half of it 0.0496, exp of that 1.0508.
	if len(got) != 2 || got[0].Metric != P50 || math.Abs(got[0].Pct-5.08) > 0.005 || got[0].Comparisons != 3 || got[0].Unit != "repeats" || got[0].Repeats != 5 {
		t.Fatalf("SensitivityOf: %+v", got)
	}
	// [-20, +20] %: ratios 0.8 to 1.2, log(1.5)/2 apart, so ±22.5 % on the ratio.
	if got[1].Metric != P99 || got[1].Unit != "intervals" || math.Abs(got[1].Pct-22.47) > 0.005 {
		t.Errorf("a metric with interval comparisons only: %+v", got[1])
	}
	// Rescale so that the arithmetic below reads in round numbers.
	got[0].Pct = 5
	// ±5% at 5 unpaired repeats: t(0.975; 8) = 2.306 and c4(8) = 0.9693 (tables), so
	// 5 = 2.306·0.9693·σ/√5 and σ = 5.002; at 20 repeats t(0.975; 38) = 2.024 and
	// c4(38) = 0.9934: 2.024·0.9934·σ/√20 = 2.249.
	if a := got[0].At(20); math.Abs(a-2.249) > 0.005 {
		t.Errorf("At(20) = %v, want 2.249", a)
	}
	// Paired, the degrees of freedom are 4 and 19: 2.776·0.9400/√5 against 2.093·0.9869/√20.
	paired := got[0]
	paired.Paired = true
	if a := paired.At(20); math.Abs(a-5*(2.093*0.9869/math.Sqrt(20))/(2.776*0.9400/math.Sqrt(5))) > 0.005 {
		t.Errorf("paired At(20) = %v", a)
	}
	if a := got[0].At(5); math.Abs(a-5) > 1e-9 {
		t.Errorf("At(its own repeats) = %v, want 5", a)
	}
	if !math.IsNaN(got[0].At(1)) {
		t.Error("At(1) is a number: one repeat has no spread")
	}
}

// The sensitivity is a property of the trials compared, not of which mesh is called
// the reference: a mesh at 3.6 times the baseline's p50, known to ±3 %, is ±3 % read
// from either side, where half the Δ% interval's width was ±10.5 % one way round and
// ±0.8 % the other (the demo's sidecar against its baseline, 2026-11-28).
func TestSensitivityIsTheSameBothWaysRound(t *testing.T) {
	ratio := func(lo, hi float64) Comparison {
		return Comparison{Metric: P50, Pct: Estimate{Lo: 100 * (lo - 1), Hi: 100 * (hi - 1)}, Unit: "repeats", Repeats: 50, BaseRepeats: 50, Paired: true}
	}
	meshOverBase := SensitivityOf([]Comparison{ratio(3.53, 3.74)})
	baseOverMesh := SensitivityOf([]Comparison{ratio(1/3.74, 1/3.53)})
	if len(meshOverBase) != 1 || len(baseOverMesh) != 1 {
		t.Fatalf("SensitivityOf: %+v and %+v", meshOverBase, baseOverMesh)
	}
	a, b := meshOverBase[0].Pct, baseOverMesh[0].Pct
	if math.Abs(a-b) > 1e-9 || math.Abs(a-2.93) > 0.01 {
		t.Errorf("sensitivity %.3f%% one way round and %.3f%% the other, want both 2.93%%", a, b)
	}
	// A linear interval that reaches -100 % has no ratio: its half-width in % stands.
	if s := SensitivityOf([]Comparison{{Metric: P50, Pct: Estimate{Lo: -120, Hi: 80}, Unit: "repeats", Repeats: 5, BaseRepeats: 5}}); len(s) != 1 || s[0].Pct != 100 {
		t.Errorf("interval reaching -100%%: %+v", s)
	}
}
