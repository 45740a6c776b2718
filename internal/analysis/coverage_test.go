package analysis

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// The designs simulated, with noise of the sizes measured on this machine
// (docs/report.md, A/A runs 1–9):
//   - fresh bring-ups: an A/A of 5 interleaved repeats of 6 s with a bring-up per
//     repeat gave paired p50 floors of 16–23 % as the issue found it, which a
//     bring-up's own log-sd of 0.13 reproduces (TestSimulationHasTheMeasuredNoise);
//   - the machine: one deployment kept up measured trial p50s from 352 to 647 µs
//     over 15 blocks, a range of 0.61 in log, about 3.5 standard deviations of 15
//     values: 0.15 per block, shared by the block's two trials;
//   - kept up: two identical deployments differed by −3.2, +1.6 and +1.3 % on p50
//     in runs 7–9 (0.02 of log-sd each); what is left to a trial of its own, beside its
//     300 requests' sampling, 0.05, brings the paired floor of 100 one-second blocks to
//     the 3.9–5.4 % measured.
var (
	designFresh = simDesign{name: "3 interleaved repeats of 10 s, a bring-up each (the default)", repeats: 3, requests: 3000, seconds: 10,
		interleaved: true, sdTrial: 0.13, sdBlock: 0.15}
	designTwo = simDesign{name: "2 interleaved repeats of 10 s", repeats: 2, requests: 3000, seconds: 10,
		interleaved: true, sdTrial: 0.13, sdBlock: 0.15}
	designOne = simDesign{name: "1 repeat of 10 s", repeats: 1, requests: 3000, seconds: 10,
		interleaved: true, sdTrial: 0.13, sdBlock: 0.15}
	designSequential = simDesign{name: "3 sequential repeats of 10 s (unpaired)", repeats: 3, requests: 3000, seconds: 10,
		sdTrial: 0.13, sdBlock: 0.15}
	designIssueAA = simDesign{name: "5 interleaved repeats of 6 s, a bring-up each (the issue-16 A/A)", repeats: 5, requests: 1800, seconds: 6,
		interleaved: true, sdTrial: 0.13, sdBlock: 0.15}
	designFreshNoStalls = simDesign{name: "3 interleaved repeats of 10 s, a bring-up each, no stalls", repeats: 3, requests: 3000, seconds: 10,
		interleaved: true, sdTrial: 0.13, sdBlock: 0.15, noStalls: true}
	designKeptUp = simDesign{name: "100 interleaved blocks of 1 s, both kept up", repeats: 100, requests: 300, seconds: 1,
		interleaved: true, keptUp: true, sdTrial: 0.05, sdBlock: 0.15, sdDeploy: 0.02}
)

// simDesign is one way a study runs its trials, with noise of the sizes measured on
// this machine (docs/report.md, "How small a difference a run can see"). Every latency
// of a trial is its speed factor times 200 µs + Exp(300 µs), so every percentile of a
// trial moves by exactly that factor, and the true relative difference between the
// meshes is known exactly at every percentile.
type simDesign struct {
	name     string
	repeats  int // interleaved blocks, or each mesh's repeats when sequential
	requests int // per trial
	seconds  int // per trial
	// interleaved: repeat r of both meshes ran in one block, before any trial of
	// repeat r+1, as the runner's interleaved order does; otherwise every repeat of
	// the baseline ran before the first of the mesh.
	interleaved bool
	// keptUp: each mesh ran on one deployment for the whole run (keepMeshesUp), whose
	// own speed (sdDeploy) is the same in all its trials.
	keptUp bool
	// Standard deviations of log speed: sdTrial of every trial on its own (a
	// bring-up's luck, and how the machine changes between two trials), sdBlock of the
	// machine per block, shared by the block's trials, sdDeploy of a kept-up
	// deployment.
	sdTrial, sdBlock, sdDeploy float64
	// intervals: record one-second interval histograms too (only the hierarchical
	// bootstrap reads them).
	intervals bool
	// aa: the second mesh is a second deployment of the baseline (profile none, no
	// effect), an A/A pair, whose interval sets the noise floor.
	aa bool
	// noStalls: latencies are 200 µs + Exp(300 µs) only, with no stalls in the tail.
	noStalls bool
}

// simEffect is the mesh's true effect on every percentile: +20 %.
var simEffect = math.Log(1.2)

// Stalls make the tail: in 40 % of seconds a stall of Exp(10 ms) holds up Poisson(6)
// consecutive requests, the later ones less. With 300 requests a second, a one-second
// block's p99 is its third-slowest request, so a stall sets it in about a third of
// the blocks; that brings the simulated p99 floor of 100 paired blocks (15.6 %, the
// median of TestSimulationHasTheMeasuredNoise's runs) near the 16.6–20.9 % measured,
// where stalls of 3 ms holding up four requests in 30 % of seconds gave 8.6 %.
const (
	stallsPerSecond = 0.4
	stallMean       = 10000.0
	stallRequests   = 6.0
)

// poisson draws from a Poisson distribution of the given mean (Knuth's method).
func poisson(rng *rand.Rand, mean float64) int {
	l, k, p := math.Exp(-mean), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// simRun draws one run of the design: a baseline "none" and a mesh "sidecar" whose
// latencies are simEffect slower. It returns the run, the mesh's true relative
// difference (%) and the difference between the two deployments actually measured
// (%), which differs from the first only when they were kept up.
func simRun(rng *rand.Rand, d simDesign) (run *results.Run, truePct, deployedPct float64) {
	run = &results.Run{ID: "sim", Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "sidecar", Profile: "envoy-sidecar"}}}
	effect := map[string]float64{"none": 0, "sidecar": simEffect}
	if d.aa {
		run.Meshes[1].Profile, effect["sidecar"] = "none", 0
	}
	if d.keptUp {
		run.Provenance.Placement = map[string]string{"meshes-up": "all together, each in its own testbed"}
	}
	deploy := map[string]float64{"none": 0, "sidecar": 0}
	if d.keptUp {
		deploy["none"], deploy["sidecar"] = rng.NormFloat64()*d.sdDeploy, rng.NormFloat64()*d.sdDeploy
	}
	p := results.TrialParams{RequestedRate: float64(d.requests) / float64(d.seconds)}
	t0 := time.Date(2026, 11, 25, 4, 0, 0, 0, time.UTC)
	trialLen := time.Duration(d.seconds) * time.Second
	// gap between trials: a warm-up, or a bring-up
	slot := trialLen + 200*time.Millisecond
	var id int64
	add := func(mesh string, repeat int, start time.Time, block float64) {
		id++
		speed := math.Exp(effect[mesh] + deploy[mesh] + block + rng.NormFloat64()*d.sdTrial)
		lat := results.NewLatencyHistogram()
		var ivs []results.Interval
		if d.intervals {
			ivs = make([]results.Interval, d.seconds)
			for i := range ivs {
				ivs[i] = results.Interval{Start: start.Add(time.Duration(i) * time.Second), Duration: time.Second, Histogram: results.NewLatencyHistogram()}
			}
		}
		perSecond := d.requests / d.seconds
		stalled := make([]float64, d.requests) // each request's extra wait behind a stall, µs
		for s := 0; s < d.seconds; s++ {
			if rng.Float64() >= stallsPerSecond || d.noStalls {
				continue
			}
			stall, k, first := rng.ExpFloat64()*stallMean, poisson(rng, stallRequests), s*perSecond+rng.IntN(perSecond)
			for j := 0; j < k && first+j < d.requests; j++ {
				stalled[first+j] = stall * (1 - float64(j)/float64(k))
			}
		}
		for i := 0; i < d.requests; i++ {
			v := int64(speed * (200 + rng.ExpFloat64()*300 + stalled[i]))
			_ = lat.RecordValue(v)
			if d.intervals {
				iv := &ivs[i*d.seconds/d.requests]
				_ = iv.Histogram.RecordValue(v)
				iv.Count++
			}
		}
		run.Trials = append(run.Trials, results.Trial{ID: id, Repeat: repeat, Mesh: mesh, Experiment: "latency", Kind: results.KindFixedRate,
			Params: p, Start: start, End: start.Add(trialLen), Result: results.TrialResult{Requests: int64(d.requests), Latency: lat, Intervals: ivs}})
	}
	if d.interleaved {
		for r := 0; r < d.repeats; r++ {
			block := rng.NormFloat64() * d.sdBlock
			order := []string{"none", "sidecar"}
			if rng.IntN(2) == 0 { // the runner's seeded order within a block
				order[0], order[1] = order[1], order[0]
			}
			for i, mesh := range order {
				add(mesh, r, t0.Add(time.Duration(2*r+i)*slot), block)
			}
		}
	} else {
		for i, mesh := range []string{"none", "sidecar"} {
			for r := 0; r < d.repeats; r++ {
				// sequential trials are minutes apart: each meets the machine as it is then
				add(mesh, r, t0.Add(time.Duration(i*d.repeats+r)*slot), rng.NormFloat64()*d.sdBlock)
			}
		}
	}
	return run, 100 * math.Expm1(effect["sidecar"]), 100 * math.Expm1(effect["sidecar"]+deploy["sidecar"]-deploy["none"])
}

// simResult is, for one metric over the runs of a design, the fraction of the
// intervals that contained the difference between the deployments measured and the
// one between the meshes, and the mean half-width and noise floor (%).
type simResult struct {
	metric               Metric
	covered, coveredMesh float64
	halfWidth, floor     float64
	medianHalfWidth      float64
	noInterval           int
}

// simCoverage draws n runs of the design and analyses each (the whole of Analyze, or
// with intervalsOnly just the comparison, for the slow methods kept for contrast).
func simCoverage(seed uint64, d simDesign, n int, opts Options, intervalsOnly bool) []simResult {
	rng := rand.New(rand.NewPCG(seed, 27))
	ms := []Metric{P50, P99}
	opts.Metrics = ms
	out := make([]simResult, len(ms))
	for i := range ms {
		out[i].metric = ms[i]
	}
	widths := make([][]float64, len(ms))
	for k := 0; k < n; k++ {
		run, truePct, deployedPct := simRun(rng, d)
		opts.Seed = uint64(k)
		var cs []Comparison
		if intervalsOnly {
			var base, mesh *Group
			for _, g := range Groups(run) {
				if g.Mesh == "none" {
					base = g
				} else {
					mesh = g
				}
			}
			cs = compareGroups(base, mesh, opts, nil)
		} else {
			cs = Analyze(run, opts, nil).Comparisons
		}
		for i, m := range ms {
			c := find(cs, "sidecar", m)
			if math.IsNaN(c.Pct.Lo) {
				out[i].noInterval++
				continue
			}
			if c.Pct.Contains(deployedPct) {
				out[i].covered++
			}
			if c.Pct.Contains(truePct) {
				out[i].coveredMesh++
			}
			out[i].halfWidth += (c.Pct.Hi - c.Pct.Lo) / 2
			widths[i] = append(widths[i], (c.Pct.Hi-c.Pct.Lo)/2)
			out[i].floor += c.NoiseFloorPct
		}
	}
	for i := range out {
		if k := float64(n - out[i].noInterval); k > 0 {
			out[i].covered /= k
			out[i].coveredMesh /= k
			out[i].halfWidth /= k
			out[i].floor /= k
			out[i].medianHalfWidth = quantile(widths[i], 0.5)
		}
	}
	return out
}

// Nominal 95 % intervals must cover the true difference at least 93 % of the time in
// every design the analysis gives intervals for, at p50 and p99, against noise of the
// sizes measured on this machine; one repeat gets no interval. The percentile
// bootstrap the analysis used before (and a hierarchical one) is plugged back in and
// must be seen to miss at the default three repeats, or this test could not tell the
// methods apart. With both meshes kept up, the interval covers the difference between
// the two deployments measured, not between the meshes: that it does not cover the
// latter at p50 is what OneDeploymentCaveat says, and is checked too.
func TestIntervalsHoldTheirCoverage(t *testing.T) {
	const atLeast = 0.93
	for _, c := range []struct {
		d simDesign
		n int
	}{{designFresh, 600}, {designTwo, 400}, {designSequential, 300}, {designIssueAA, 400}, {designFreshNoStalls, 400}, {designKeptUp, 100}} {
		start := time.Now()
		for _, r := range simCoverage(1, c.d, c.n, Options{}, false) {
			t.Logf("%s, %s: covered %.1f %% of %d (the meshes' difference: %.1f %%), half-width median %.1f %% (mean %.1f), floor %.1f %%",
				c.d.name, r.metric, 100*r.covered, c.n, 100*r.coveredMesh, r.medianHalfWidth, r.halfWidth, r.floor)
			if r.noInterval > 0 || r.covered < atLeast {
				t.Errorf("%s, %s: 95 %% intervals covered %.1f %% of %d runs (%d without an interval), want at least %.0f %%",
					c.d.name, r.metric, 100*r.covered, c.n, r.noInterval, 100*atLeast)
			}
			// p50's interval is a few percent wide, as narrow as deployments differ;
			// p99's is wide enough to hide it.
			if c.d.keptUp && r.metric == P50 && r.coveredMesh >= atLeast {
				t.Errorf("%s, %s: covered the meshes' difference %.1f %% of the time though each was one deployment; is OneDeploymentCaveat still needed?",
					c.d.name, r.metric, 100*r.coveredMesh)
			}
		}
		t.Logf("(%s)", time.Since(start).Round(time.Millisecond))
	}
	for _, r := range simCoverage(1, designOne, 20, Options{}, false) {
		if r.noInterval != 20 {
			t.Errorf("%s, %s: %d of 20 runs got an interval", designOne.name, r.metric, 20-r.noInterval)
		}
	}

	// The methods studentT was chosen over, on the default design: 60 runs tell 75 %
	// from 93 % by three standard errors. Each must miss on p50 or p99.
	withIntervals := designFresh
	withIntervals.intervals = true
	for _, m := range []struct {
		name   string
		method intervalMethod
	}{{"percentile bootstrap (as before)", percentileBootstrap{resamples: 1000, minRepeats: 3}}, {"hierarchical bootstrap", hierarchicalBootstrap{resamples: 500}}} {
		start := time.Now()
		worst := 1.0
		for _, r := range simCoverage(1, withIntervals, 60, Options{method: m.method}, true) {
			t.Logf("%s, %s, %s: covered %.1f %% of 60, half-width median %.1f %%", designFresh.name, r.metric, m.name, 100*r.covered, r.medianHalfWidth)
			worst = min(worst, r.covered)
		}
		if worst >= atLeast {
			t.Errorf("%s: the %s covered at least %.1f %%: the simulation no longer tells it from studentT", designFresh.name, m.name, 100*worst)
		}
		t.Logf("(%s)", time.Since(start).Round(time.Millisecond))
	}

	// Why studentT spans two intervals (see its comment), logged for the record: each
	// half alone, where the other is needed.
	for _, c := range []struct {
		d simDesign
		n int
	}{{designFreshNoStalls, 400}, {designKeptUp, 40}} {
		for _, half := range []intervalMethod{linearisedOnly{}, ownOnly{}} {
			for _, r := range simCoverage(1, c.d, c.n, Options{method: half}, true) {
				t.Logf("%s, %s, %T alone: covered %.1f %% of %d, half-width median %.1f %%", c.d.name, r.metric, half, 100*r.covered, c.n, r.medianHalfWidth)
			}
		}
	}
}

// linearisedOnly and ownOnly are the two halves of studentT, each alone.
type linearisedOnly struct{}
type ownOnly struct{}

func halfInterval(ref, other *Group, paired bool, opts Options, own bool) intervals {
	iv := intervals{byMetric: map[Metric]bounds{}, unit: "repeats", paired: paired}
	p := 1 - (1-opts.Confidence)/2
	for _, m := range opts.Metrics {
		base, val := ref.Value(m), other.Value(m)
		logs := logScale(m, ref, other)
		f := func(v float64) float64 { return v }
		if logs {
			f = math.Log
		}
		lo, hi := differenceInterval(contributions(ref, m, logs), contributions(other, m, logs), paired, f(val)-f(base), p)
		if own {
			lo, hi = differenceInterval(apply(f, ref.perTrial[m]), apply(f, other.perTrial[m]), paired, math.NaN(), p)
		}
		b := bounds{deltaLo: lo, deltaHi: hi, pctLo: 100 * lo / base, pctHi: 100 * hi / base}
		if logs {
			b = bounds{deltaLo: base * math.Expm1(lo), deltaHi: base * math.Expm1(hi), pctLo: 100 * math.Expm1(lo), pctHi: 100 * math.Expm1(hi)}
		}
		iv.byMetric[m] = b
	}
	return iv
}

func (linearisedOnly) change(ref, other *Group, paired bool, opts Options) intervals {
	return halfInterval(ref, other, paired, opts, false)
}
func (ownOnly) change(ref, other *Group, paired bool, opts Options) intervals {
	return halfInterval(ref, other, paired, opts, true)
}
func (linearisedOnly) spread(*Group, Options) (map[Metric]float64, string) { return nil, "repeats" }
func (ownOnly) spread(*Group, Options) (map[Metric]float64, string)        { return nil, "repeats" }

// The simulation has this machine's noise: A/A floors of its designs, computed as the
// measurements were (the percentile bootstrap, which was the analysis then), land
// where docs/report.md's runs 7–9 did: p50 16–23 % for 5 repeats of 6 s with fresh
// bring-ups; p50 3.9–5.4 % and p99 16.6–20.9 % for 100 one-second blocks kept up. The
// median of a few simulated runs must be within a factor of about 1.5 of them.
func TestSimulationHasTheMeasuredNoise(t *testing.T) {
	old := Options{method: percentileBootstrap{resamples: 1000, minRepeats: 3}}
	for _, c := range []struct {
		d      simDesign
		n      int
		metric Metric
		lo, hi float64 // measured range, %
	}{
		{designIssueAA, 15, P50, 16.1, 22.7},
		{designKeptUp, 7, P50, 3.9, 5.4},
		{designKeptUp, 7, P99, 16.6, 20.9},
	} {
		d := c.d
		d.aa = true
		rng := rand.New(rand.NewPCG(2, 27))
		var floors []float64
		for k := 0; k < c.n; k++ {
			run, _, _ := simRun(rng, d)
			old.Metrics = []Metric{c.metric}
			floors = append(floors, find(Analyze(run, old, nil).Comparisons, "sidecar", c.metric).NoiseFloorPct)
		}
		slices.Sort(floors)
		med := floors[len(floors)/2]
		t.Logf("%s, A/A %s floor: median %.1f %% over %d runs (measured %.1f–%.1f %%); all %.1f", d.name, c.metric, med, c.n, c.lo, c.hi, floors)
		if med < c.lo/1.5 || med > c.hi*1.5 {
			t.Errorf("%s: simulated A/A %s floor %.1f %%, measured %.1f–%.1f %%", d.name, c.metric, med, c.lo, c.hi)
		}
	}
}
