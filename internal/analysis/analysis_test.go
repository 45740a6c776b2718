package analysis

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// synthTrial draws n latencies 200 µs + Exp(mean 500 µs) + shift, over ten one-second
// intervals. Every percentile of that distribution moves by exactly shift.
func synthTrial(rng *rand.Rand, mesh string, repeat, n int, shift int64, exp string, params results.TrialParams) results.Trial {
	const seconds = 10
	start := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC).Add(time.Duration(repeat) * time.Minute)
	lat := results.NewLatencyHistogram()
	ivs := make([]results.Interval, seconds)
	for i := range ivs {
		ivs[i] = results.Interval{Start: start.Add(time.Duration(i) * time.Second), Duration: time.Second, Histogram: results.NewLatencyHistogram()}
	}
	for i := 0; i < n; i++ {
		v := 200 + int64(rng.ExpFloat64()*500) + shift
		_ = lat.RecordValue(v)
		iv := &ivs[i*seconds/n]
		_ = iv.Histogram.RecordValue(v)
		iv.Count++
	}
	return results.Trial{ID: int64(repeat + 1), Repeat: repeat, Mesh: mesh, Experiment: exp, Kind: results.KindFixedRate, Params: params,
		Start: start, End: start.Add(seconds * time.Second),
		Result: results.TrialResult{Requests: int64(n), Latency: lat, Intervals: ivs}}
}

func synthRun(seed uint64, repeats, n int, shift int64) *results.Run {
	rng := rand.New(rand.NewPCG(seed, 99))
	run := &results.Run{ID: "synthetic", Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "sidecar", Profile: "envoy-sidecar"}}}
	p := results.TrialParams{RequestedRate: float64(n) / 10}
	for r := 0; r < repeats; r++ { // interleaved, as the runner does
		run.Trials = append(run.Trials, synthTrial(rng, "none", r, n, 0, "fixed", p))
		run.Trials = append(run.Trials, synthTrial(rng, "sidecar", r, n, shift, "fixed", p))
	}
	return run
}

func find(cs []Comparison, mesh string, m Metric) *Comparison {
	for i := range cs {
		if cs[i].Mesh == mesh && cs[i].Metric == m {
			return &cs[i]
		}
	}
	return nil
}

func TestPooledPercentilesEqualMergedHistogram(t *testing.T) {
	run := synthRun(1, 4, 3000, 0)
	g := Groups(run)[0]
	s := trialSample(g.Trials)
	qs := []float64{0.1, 1, 50, 90, 99, 99.9, 100}
	merged := results.NewLatencyHistogram()
	for _, tr := range g.Trials {
		merged.Merge(tr.Result.Latency)
	}
	p := s.pool(all(len(s.units)), qs)
	for i, q := range qs {
		if want := float64(merged.ValueAtQuantile(q)); p.quantiles[i] != want {
			t.Errorf("p%v: pooled %v, merged histogram %v", q, p.quantiles[i], want)
		}
	}
	if p.total != merged.TotalCount() || math.Abs(p.throughput-g.Throughput) > 1e-9 {
		t.Errorf("pooled totals %d / %v, group %d / %v", p.total, p.throughput, merged.TotalCount(), g.Throughput)
	}
	// The pooled percentile is not the average of the per-repeat percentiles.
	if g.P99 != merged.ValueAtQuantile(99) {
		t.Errorf("group p99 %d, merged %d", g.P99, merged.ValueAtQuantile(99))
	}
}

// A/A is never called a difference; with 100000 requests a side the intervals are
// tight enough to lie within the equivalence margins, so it is called equal.
func TestAAIsEqual(t *testing.T) {
	rep := Analyze(synthRun(2, 5, 20000, 0), Options{Seed: 1}, nil)
	for _, m := range []Metric{P50, P99} {
		c := find(rep.Comparisons, "sidecar", m)
		if c == nil {
			t.Fatalf("no comparison for %s", m)
		}
		if c.Verdict != Equal {
			t.Errorf("A/A %s: verdict %s, Δ %.1f [%.1f, %.1f] µs, floor %.2f%%", m, c.Verdict, c.Delta.Value, c.Delta.Lo, c.Delta.Hi, c.NoiseFloorPct)
		}
		if c.Unit != "repeats" || c.Repeats != 5 {
			t.Errorf("%s: interval over %s, %d repeats; want repeats, 5", m, c.Unit, c.Repeats)
		}
	}
}

func TestShiftIsWorseAndIntervalContainsTrueShift(t *testing.T) {
	const shift = 200
	rep := Analyze(synthRun(3, 5, 20000, shift), Options{Seed: 1}, nil)
	for _, m := range []Metric{P50, P90, P99} {
		c := find(rep.Comparisons, "sidecar", m)
		if c.Verdict != Worse {
			t.Errorf("%s: verdict %s, want worse (Δ %.1f [%.1f, %.1f])", m, c.Verdict, c.Delta.Value, c.Delta.Lo, c.Delta.Hi)
		}
		if !c.Delta.ExcludesZero() || !c.Delta.Contains(shift) {
			t.Errorf("%s: interval [%.1f, %.1f] µs should exclude 0 and contain the true shift %d", m, c.Delta.Lo, c.Delta.Hi, shift)
		}
		if c.Pct.Value <= 0 || c.Pct.Lo <= 0 {
			t.Errorf("%s: relative change %.2f%% [%.2f, %.2f]", m, c.Pct.Value, c.Pct.Lo, c.Pct.Hi)
		}
	}
	// Same rate offered to both: throughput is equal, not a difference.
	if c := find(rep.Comparisons, "sidecar", Throughput); c.Verdict != Equal {
		t.Errorf("throughput verdict %s: %+v", c.Verdict, c.Delta)
	}
	var won bool
	for _, w := range rep.Winners {
		if w.Metric == P50 {
			won = w.Best == "none" && w.Verdict == Better
		}
	}
	if !won {
		t.Errorf("verdict table does not name the baseline better on p50: %+v", rep.Winners)
	}
}

// Two repeats give a t interval with one degree of freedom: wide, but an interval
// (TestIntervalsHoldTheirCoverage measures its level). One repeat gives none: the
// verdict says so instead of a level it cannot have, in the comparison, the verdict
// table and the text.
func TestTooFewRepeatsForAnInterval(t *testing.T) {
	rep := Analyze(synthRun(4, 2, 20000, 200), Options{Metrics: []Metric{P50}}, nil)
	c := find(rep.Comparisons, "sidecar", P50)
	if c.Unit != "repeats" || !c.Paired || c.Method != "paired t on 2 interleaved blocks of 10s" {
		t.Errorf("two repeats: unit %q, paired %v, method %q", c.Unit, c.Paired, c.Method)
	}
	if c.Verdict != Worse || !c.Delta.Contains(200) {
		t.Errorf("two repeats: %s Δ [%.1f, %.1f]", c.Verdict, c.Delta.Lo, c.Delta.Hi)
	}

	run := synthRun(4, 1, 20000, 200)
	rep = Analyze(run, Options{Metrics: []Metric{P50, ErrorRate}}, nil)
	for _, m := range []Metric{P50, ErrorRate} {
		c = find(rep.Comparisons, "sidecar", m)
		if c.Verdict != NoInterval || !math.IsNaN(c.Delta.Lo) || !math.IsNaN(c.Pct.Hi) || c.Method != "no interval: 1 repeat and 1 repeat" {
			t.Errorf("one repeat, %s: verdict %q, Δ [%v, %v], Δ%% [%v, %v], method %q", m, c.Verdict, c.Delta.Lo, c.Delta.Hi, c.Pct.Lo, c.Pct.Hi, c.Method)
		}
		if math.Abs(c.Delta.Value-200) > 20 && m == P50 {
			t.Errorf("one repeat: the pooled difference %.0f µs is still shown", c.Delta.Value)
		}
	}
	for _, w := range rep.Winners {
		if w.Verdict != NoInterval {
			t.Errorf("verdict table, one repeat, %s: %s", w.Metric, w.Verdict)
		}
	}
	if len(rep.Sensitivity) != 0 {
		t.Errorf("one repeat has a sensitivity: %+v", rep.Sensitivity)
	}
	var buf strings.Builder
	if err := WriteRunSummary(&buf, run, rep); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "95% intervals: no interval: 1 repeat and 1 repeat") ||
		!strings.Contains(out, "inconclusive: too few repeats for an interval") || strings.Contains(out, "NaN") {
		t.Errorf("the text does not say there is no interval:\n%s", out)
	}
}

func TestAANoiseFloorFromDuplicateProfile(t *testing.T) {
	run := synthRun(5, 5, 5000, 0)
	run.Meshes = append(run.Meshes, results.Mesh{Label: "sidecar-again", Profile: "envoy-sidecar"})
	rng := rand.New(rand.NewPCG(5, 5))
	for r := 0; r < 5; r++ {
		run.Trials = append(run.Trials, synthTrial(rng, "sidecar-again", r, 5000, 0, "fixed", run.Trials[0].Params))
	}
	rep := Analyze(run, Options{Seed: 1}, nil)
	c := find(rep.Comparisons, "sidecar", P99)
	if c.NoiseSource != "a/a sidecar=sidecar-again" || !(c.NoiseFloorPct > 0) {
		t.Errorf("noise floor %.2f%% from %q, want a positive A/A floor", c.NoiseFloorPct, c.NoiseSource)
	}
	plain := Analyze(synthRun(5, 5, 5000, 0), Options{Seed: 1}, nil)
	if c := find(plain.Comparisons, "sidecar", P99); c.NoiseSource != "baseline spread (repeats)" || !(c.NoiseFloorPct > 0) {
		t.Errorf("without A/A: floor %.2f%% from %q", c.NoiseFloorPct, c.NoiseSource)
	}
}

func TestTukeyFlagsTheOddRepeat(t *testing.T) {
	run := synthRun(6, 6, 5000, 0)
	// Repeat 3 of the baseline suffered a stall: add a tail of 50 ms values.
	for i := range run.Trials {
		tr := &run.Trials[i]
		if tr.Mesh == "none" && tr.Repeat == 3 {
			_ = tr.Result.Latency.RecordValues(50000, 200)
		}
	}
	rep := Analyze(run, Options{Seed: 1, Metrics: []Metric{P99}}, nil)
	g := rep.Group(Key{Mesh: "none", Experiment: "fixed"})
	if len(g.Outliers) != 1 || g.Outliers[0] != 4 {
		t.Errorf("outliers %v, want the trial of repeat 3 (id 4)", g.Outliers)
	}
	if g.Repeats != 6 {
		t.Errorf("an outlier was dropped: %d repeats left", g.Repeats)
	}
	if g.MixedParams {
		t.Error("repeats at the same rate reported as mixed")
	}
	if s := rep.Group(Key{Mesh: "sidecar", Experiment: "fixed"}); len(s.Outliers) != 0 {
		t.Errorf("clean group flagged: %v", s.Outliers)
	}
}

func TestCapacityAndKnee(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	run := &results.Run{ID: "sweep", Meshes: []results.Mesh{{Label: "none", Profile: "none"}}}
	// Latency grows with load: +0 µs up to 400 rps, then +2 ms per 100 rps; at 800 rps
	// a fifth of the offered rate is not served.
	for step, rate := range []float64{100, 200, 300, 400, 500, 600, 700, 800} {
		shift := int64(0)
		if rate > 400 {
			shift = int64(rate-400) / 100 * 2000
		}
		tr := synthTrial(rng, "none", 0, int(rate)*10, shift, "steps", results.TrialParams{RequestedRate: rate, Step: step})
		if rate == 800 {
			tr.Result.Requests = int64(float64(tr.Result.Requests) * 0.8)
		}
		run.Trials = append(run.Trials, tr)
	}
	slo := SLO{P99: 8 * time.Millisecond, MaxErrorRate: 0.01, MinAchieved: 0.95, KneeFactor: 3}
	probe := synthTrial(rng, "none", 1, 1000, 0, "steps", results.TrialParams{RequestedRate: 150, Step: 0})
	run.Trials = append(run.Trials, probe)
	rep := Analyze(run, Options{Seed: 1}, &slo)
	if g := rep.Group(Key{Mesh: "none", Experiment: "steps", Step: 0}); !g.MixedParams {
		t.Error("step 0 pooled 100 and 150 rps without saying so")
	}
	if len(rep.Capacity) != 1 {
		t.Fatalf("capacity results: %d", len(rep.Capacity))
	}
	c := rep.Capacity[0]
	// p99 ≈ 200+2303+shift µs: 500 rps → 4.5 ms, 600 → 6.5 ms, 700 → 8.5 ms.
	if !c.Found || c.MaxX != 600 || c.Limit == "" {
		t.Errorf("capacity %v rps (found %v, limit %q), want 600", c.MaxX, c.Found, c.Limit)
	}
	// Low-load p99 ≈ 2.5 ms; 3× is 7.5 ms, first exceeded at 700 rps.
	if !c.HasKnee || c.KneeX != 700 {
		t.Errorf("knee at %v (has %v), want 700; rule %s", c.KneeX, c.HasKnee, c.KneeRule)
	}
	if c.Points[7].Meets || c.Points[7].Why == "" {
		t.Errorf("800 rps step with a fifth unserved passes: %+v", c.Points[7])
	}
}

func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 12345)) }

func TestResourcesFromCumulativeSamples(t *testing.T) {
	run := synthRun(8, 2, 1000, 0) // 100 rps for 10 s
	for i := range run.Trials {
		tr := &run.Trials[i]
		if tr.Mesh != "sidecar" {
			continue
		}
		// Two sidecars; each burns 0.25 cores for 8 s, except one second at 1 core.
		for _, pod := range []string{"a-0", "b-0"} {
			cpu := 10.0 // cumulative seconds since the process started
			for s := 0; s <= 8; s++ {
				if s > 0 {
					if s == 4 {
						cpu += 1
					} else {
						cpu += 0.25
					}
				}
				tr.Result.Resources = append(tr.Result.Resources, results.ResourceSample{Component: "envoy", Role: "proxy", Pod: pod,
					Mesh: "sidecar", T: tr.Start.Add(time.Duration(s) * time.Second), CPUUserSeconds: cpu * 0.8, CPUSysSeconds: cpu * 0.2,
					RSSBytes: int64(40+s) << 20, PSSBytes: 30 << 20})
			}
		}
	}
	rep := Analyze(run, Options{Seed: 1, Metrics: []Metric{P50}}, nil)
	var got *ResourceUsage
	for i := range rep.Resources {
		if rep.Resources[i].Mesh == "sidecar" && rep.Resources[i].Component == "envoy" {
			got = &rep.Resources[i]
		}
	}
	if got == nil {
		t.Fatalf("no envoy usage: %+v", rep.Resources)
	}
	// (7·0.25 + 1)/8 = 0.34375 cores per sidecar, two sidecars.
	if math.Abs(got.CPUCores-0.6875) > 1e-9 || math.Abs(got.CPUCoresPeak-2) > 1e-9 || got.Processes != 2 {
		t.Errorf("cores %v peak %v processes %d, want 0.6875, 2, 2", got.CPUCores, got.CPUCoresPeak, got.Processes)
	}
	if got.RSSPeak != 2*(48<<20) || got.PSSPeak != 2*(30<<20) || math.Abs(got.RSSMean-2*44*(1<<20)) > 1 {
		t.Errorf("rss peak %d mean %v pss %d", got.RSSPeak, got.RSSMean, got.PSSPeak)
	}
	if math.Abs(got.CoresPer1000RPS-0.6875/0.1) > 1e-6 {
		t.Errorf("cores per 1000 rps %v", got.CoresPer1000RPS)
	}
}

func TestNetworkRatesByHand(t *testing.T) {
	run := synthRun(8, 2, 1000, 0)
	type pt struct {
		s                                    int // seconds after the trial start
		rx, tx, rxPkt, txPkt, rxDrop, txDrop int64
	}
	add := func(tr *results.Trial, pod, iface string, pts ...pt) {
		for _, p := range pts {
			tr.Result.Network = append(tr.Result.Network, results.NetSample{Pod: pod, Node: "n1", Mesh: tr.Mesh, Interface: iface,
				T: tr.Start.Add(time.Duration(p.s) * time.Second), RxBytes: p.rx, TxBytes: p.tx, RxPackets: p.rxPkt, TxPackets: p.txPkt,
				RxDropped: p.rxDrop, TxDropped: p.txDrop})
		}
	}
	for i := range run.Trials {
		tr := &run.Trials[i]
		if tr.Mesh != "sidecar" {
			continue
		}
		if tr.Repeat == 0 {
			// Out of order on purpose: the analysis sorts by time.
			add(tr, "a-0", "eth0", pt{s: 10, rx: 21000, tx: 10500, rxPkt: 110, txPkt: 60, rxDrop: 3}, pt{s: 0, rx: 1000, tx: 500, rxPkt: 10, txPkt: 10, rxDrop: 1},
				pt{s: 5, rx: 9000, tx: 5000, rxPkt: 50, txPkt: 30, rxDrop: 2})
			add(tr, "c-0", "eth0", pt{s: 0}, pt{s: 10, rx: 1000, tx: 2000})
			add(tr, "b-0", "lo", pt{s: 0, rx: 100, tx: 100}, pt{s: 10, rx: 5100, tx: 5100})
		} else {
			add(tr, "a-0", "eth0", pt{s: 0}, pt{s: 10, rx: 40000, tx: 30000, rxPkt: 300, txPkt: 200, rxDrop: 1, txDrop: 4})
			add(tr, "c-0", "eth0", pt{s: 0, rx: 5000, tx: 5000}, pt{s: 10, rx: 10, tx: 10}) // counters reset: skipped
			add(tr, "b-0", "lo", pt{s: 0, rx: 7}, pt{s: 10, rx: 7})
		}
		add(tr, "a-0", "lo", pt{s: 0, rx: 42, tx: 42}, pt{s: 10, rx: 42, tx: 42}) // never moved: left out
		add(tr, "d-0", "eth0", pt{s: 3, rx: 99})                                  // one sample: no rate
	}
	rep := Analyze(run, Options{Seed: 1, Metrics: []Metric{P50}}, nil)
	got := map[string]NetworkUsage{}
	var order []string
	for _, u := range rep.Network {
		if u.Mesh != "sidecar" || u.Experiment != "fixed" {
			t.Errorf("row for a group without network samples: %+v", u)
		}
		got[u.Pod+"/"+u.Interface] = u
		order = append(order, u.Pod+"/"+u.Interface)
	}
	if want := []string{"a-0/eth0", "b-0/lo", "c-0/eth0"}; fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("rows %v, want %v", order, want)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	// a-0 eth0: repeat 0 moves 20000 B in, 10000 B out, 100 and 50 packets in 10 s;
	// repeat 1 40000, 30000, 300, 200. Means: 3000 and 2000 B/s, 20 and 12.5 pkt/s.
	a := got["a-0/eth0"]
	if a.Trials != 2 || !near(a.RxBytesPerSec, 3000) || !near(a.TxBytesPerSec, 2000) || !near(a.RxPacketsPerSec, 20) ||
		!near(a.TxPacketsPerSec, 12.5) || a.RxDropped != 3 || a.TxDropped != 4 || a.Node != "n1" || a.Label != "fixed 100 rps" {
		t.Errorf("a-0 eth0 = %+v, want 2 trials, 3000/2000 B/s, 20/12.5 pkt/s, 3/4 dropped", a)
	}
	// b-0 lo carried 5000 B each way in repeat 0 and nothing in repeat 1: (500+0)/2.
	if b := got["b-0/lo"]; b.Trials != 2 || !near(b.RxBytesPerSec, 250) || !near(b.TxBytesPerSec, 250) {
		t.Errorf("b-0 lo = %+v, want 250 B/s each way over 2 trials", b)
	}
	// c-0 counters went backwards in repeat 1: only repeat 0 counts (1000 B, 2000 B in 10 s).
	if c := got["c-0/eth0"]; c.Trials != 1 || !near(c.RxBytesPerSec, 100) || !near(c.TxBytesPerSec, 200) {
		t.Errorf("c-0 eth0 = %+v, want 100/200 B/s from one trial", c)
	}
	var buf strings.Builder
	if err := WriteRunSummary(&buf, run, rep); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"network per pod interface", "2.9KiB/s", "2.0KiB/s", "250B/s", "3/4"} {
		if !strings.Contains(out, want) {
			t.Errorf("run summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "d-0") {
		t.Errorf("run summary shows an interface with a single sample:\n%s", out)
	}
}

// A mesh listed twice is judged against the floor its own pair sets, and must never be
// called better or worse, whichever of the two is the reference. Repeats that differ a
// lot from one another (a keep-alive connection pinned to one backend version per
// trial, as in bookinfo without a mesh) make the relative change lopsided: +60% one way
// round is -38% the other.
func TestAAPairNeverJudgedAgainstItsOwnFloor(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		run := &results.Run{ID: "aa", Baseline: "none-a", Meshes: []results.Mesh{{Label: "none-a", Profile: "none"}, {Label: "none-b", Profile: "none"}}}
		p := results.TrialParams{RequestedRate: 150}
		for r := 0; r < 4; r++ {
			order := []string{"none-a", "none-b"}
			if seed%2 == 0 { // the runner's interleaving may run the duplicate first
				order[0], order[1] = order[1], order[0]
			}
			for _, mesh := range order {
				shift := int64(0)
				if rng.IntN(3) == 0 { // this trial's connection landed on the slow version
					shift = 1500
				}
				run.Trials = append(run.Trials, synthTrial(rng, mesh, r, 900, shift, "fixed", p))
			}
		}
		rep := Analyze(run, Options{Seed: 1}, nil)
		for _, m := range []Metric{P50, P99} {
			c := find(rep.Comparisons, "none-b", m)
			if c.Verdict == Better || c.Verdict == Worse {
				t.Errorf("seed %d, A/A %s: %s, Δ%% %.1f [%.1f, %.1f] against its own floor %.1f%%", seed, m, c.Verdict, c.Pct.Value, c.Pct.Lo, c.Pct.Hi, c.NoiseFloorPct)
			}
		}
	}
}

// TestPairedRepeatsTakeDriftOut: when the machine drifts from one interleaved block to
// the next (both meshes' trials of a block moved alike), differences within blocks
// give intervals that still cover the true difference but are narrower than taking
// each mesh's repeats on their own, which counts the drift as noise twice. Sequential
// order (all of one mesh, then the other) is never paired.
func TestPairedRepeatsTakeDriftOut(t *testing.T) {
	const reps, shift = 40, 60
	covered, narrower := 0, 0
	var pairedWidth, unpairedWidth float64
	for i := 0; i < reps; i++ {
		run := bringUpRun(uint64(300+i), 6, 15, 150)
		for j := range run.Trials {
			if run.Trials[j].Mesh == "sidecar" {
				shiftTrial(&run.Trials[j], shift)
			}
		}
		opts := Options{Metrics: []Metric{P50}}
		paired := find(Analyze(run, opts, nil).Comparisons, "sidecar", P50)
		opts.Unpaired = true
		unpaired := find(Analyze(run, opts, nil).Comparisons, "sidecar", P50)
		if !paired.Paired || unpaired.Paired {
			t.Fatalf("interleaved blocks: paired %v, with Unpaired %v", paired.Paired, unpaired.Paired)
		}
		if paired.Delta.Contains(shift) {
			covered++
		}
		pw, uw := paired.Delta.Hi-paired.Delta.Lo, unpaired.Delta.Hi-unpaired.Delta.Lo
		if pw < uw {
			narrower++
		}
		pairedWidth += pw / reps
		unpairedWidth += uw / reps
	}
	t.Logf("paired intervals: cover %d/%d, narrower %d/%d, mean width %.0f µs against %.0f unpaired", covered, reps, narrower, reps, pairedWidth, unpairedWidth)
	if frac := float64(covered) / reps; frac < 0.8 {
		t.Errorf("paired 95%% intervals covered the true shift in %.0f%% of %d runs", 100*frac, reps)
	}
	if narrower < reps*9/10 || pairedWidth > unpairedWidth/2 {
		t.Errorf("paired intervals narrower in %d of %d runs, mean width %.0f against %.0f: the drift was not taken out", narrower, reps, pairedWidth, unpairedWidth)
	}

	// Sequential: mesh B's repeats all after mesh A's. Same repeats, but no blocks.
	run := bringUpRun(7, 6, 15, 150)
	for j := range run.Trials {
		if run.Trials[j].Mesh == "sidecar" {
			run.Trials[j].Start = run.Trials[j].Start.Add(time.Hour)
			run.Trials[j].End = run.Trials[j].End.Add(time.Hour)
		}
	}
	if c := find(Analyze(run, Options{Seed: 1, Metrics: []Metric{P50}}, nil).Comparisons, "sidecar", P50); c.Paired {
		t.Error("sequential order was taken in pairs")
	}
	// A repeat missing on one side (a failed trial): unpaired.
	run = bringUpRun(8, 6, 15, 150)
	run.Trials = run.Trials[:len(run.Trials)-1]
	if c := find(Analyze(run, Options{Seed: 1, Metrics: []Metric{P50}}, nil).Comparisons, "sidecar", P50); c.Paired {
		t.Error("groups with different repeats were taken in pairs")
	}
}

// shiftTrial moves every latency of a trial up by d µs.
func shiftTrial(t *results.Trial, d int64) {
	moved := results.NewLatencyHistogram()
	for _, b := range t.Result.Latency.Distribution() {
		if b.Count > 0 {
			_ = moved.RecordValues(b.To+d, b.Count)
		}
	}
	t.Result.Latency = moved
	t.Result.Intervals = nil
}

// A run whose meshes were each kept up on one deployment says that its intervals do not
// cover the difference between deployments, unless an A/A pair's noise floor does.
func TestOneDeploymentCaveat(t *testing.T) {
	run := synthRun(3, 5, 2000, 0)
	if rep := Analyze(run, Options{Seed: 1}, nil); len(rep.Caveats) != 0 {
		t.Errorf("fresh bring-ups: caveats %q, want none", rep.Caveats)
	}
	run.Provenance.Placement = map[string]string{"meshes-up": "all together, each in its own testbed"}
	if rep := Analyze(run, Options{Seed: 1}, nil); !slices.Equal(rep.Caveats, []string{OneDeploymentCaveat}) {
		t.Errorf("meshes kept up: caveats %q, want the one-deployment caveat", rep.Caveats)
	}
	// The sidecar made a second baseline: an A/A pair, whose floor covers deployments.
	run.Meshes[1].Profile = "none"
	if rep := Analyze(run, Options{Seed: 1}, nil); len(rep.Caveats) != 0 {
		t.Errorf("meshes kept up with an A/A pair: caveats %q, want none", rep.Caveats)
	}
}

// TestSLOJudgesEveryBoundItSets: one SLO judges a pooled step and a single probe alike:
// every percentile it bounds (p95 too, which a study may set), the error rate even when
// its bound is zero (no errors allowed), and the served share of an open-model rate;
// with no latencies measured, no latency bound is judged.
func TestSLOJudgesEveryBoundItSets(t *testing.T) {
	slo := SLO{P95: 50 * time.Millisecond, P99: 100 * time.Millisecond, MinAchieved: 0.95}
	g := &Group{P50: 20000, P95: 60000, P99: 90000, ErrorRate: 0.001, Throughput: 900, Params: results.TrialParams{RequestedRate: 1000}}
	var got []string
	for _, m := range slo.Misses(g) {
		got = append(got, string(m.Metric)+": "+m.Why)
	}
	want := []string{"p95: p95 60ms > 50ms", "error_rate: error rate 0.1% > 0%", "throughput: served 900 of 1000 req/s requested"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("misses %q, want %q", got, want)
	}
	probe := Observed{ErrorRate: 0, Throughput: 1000, RequestedRate: 1000,
		Latency: func(p float64) time.Duration { return time.Duration(p) * time.Millisecond }}
	if miss := slo.Judge(probe); len(miss) != 1 || miss[0].Metric != P95 || miss[0].Why != "p95 95ms > 50ms" {
		t.Errorf("probe: %+v, want p95 only", miss)
	}
	probe.Latency = nil
	if miss := slo.Judge(probe); len(miss) != 0 {
		t.Errorf("no latencies measured: %+v, want no miss", miss)
	}
	if s := slo.String(); s != "p95 ≤ 50ms, p99 ≤ 100ms, errors ≤ 0%, served ≥ 95% of the requested rate" {
		t.Errorf("String %q", s)
	}
}

// A percentile that a trial's requests cannot place (p99.9 of 150 requests is the
// slowest one) gets no verdict, however its interval falls; one they can place does.
func TestTooFewRequestsForAPercentile(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want map[Metric]bool // metric → verdict withheld
	}{
		{150, map[Metric]bool{P50: false, P99: false, P999: true}},
		{3000, map[Metric]bool{P50: false, P99: false, P999: false}},
	} {
		rep := Analyze(synthRun(5, 20, tc.n, 3000), Options{}, nil)
		for m, withheld := range tc.want {
			c := find(rep.Comparisons, "sidecar", m)
			if c == nil {
				t.Fatalf("%d requests: no %s comparison", tc.n, m)
			}
			if (c.Verdict == TooFewRequests) != withheld {
				t.Errorf("%d requests per trial, %s: verdict %q, want withheld %v", tc.n, m, c.Verdict, withheld)
			}
		}
	}
}

// A capacity search probes each mesh at rates of its own under one step index: the
// groups at such a step ran at different loads, and comparing them (or naming a
// winner there) compares loads, not meshes. The demo's `show --all` printed
// intervals such as +27 ms [−10 ms, +1.96e+12 s] for them. Points where every mesh ran
// the same load are compared as before.
func TestNoComparisonAcrossDifferentLoads(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	run := &results.Run{ID: "probes", Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "sidecar", Profile: "envoy-sidecar"}}}
	id := int64(0)
	add := func(mesh string, repeat int, exp string, p results.TrialParams, shift int64) {
		tr := synthTrial(rng, mesh, repeat, 2000, shift, exp, p)
		id++
		tr.ID = id
		run.Trials = append(run.Trials, tr)
	}
	for r := 0; r < 3; r++ {
		add("none", r, "search", results.TrialParams{RequestedRate: 1000, Step: 0}, 0)
		add("sidecar", r, "search", results.TrialParams{RequestedRate: 200, Step: 0}, 3000)
		// a step whose repeats probed different rates, the same for both meshes
		add("none", r, "search", results.TrialParams{RequestedRate: float64(100 * (r + 1)), Step: 1}, 0)
		add("sidecar", r, "search", results.TrialParams{RequestedRate: float64(100 * (r + 1)), Step: 1}, 3000)
		add("none", r, "fixed", results.TrialParams{RequestedRate: 150}, 0)
		add("sidecar", r, "fixed", results.TrialParams{RequestedRate: 150}, 3000)
	}
	rep := Analyze(run, Options{Seed: 1, Metrics: []Metric{P50}}, nil)
	var fixed int
	for _, c := range rep.Comparisons {
		if c.Point.Experiment == "search" {
			t.Errorf("compared at %s step %d, where the meshes ran different loads: %+v", c.Point.Experiment, c.Point.Step, c)
		}
		if c.Point.Experiment == "fixed" {
			fixed++
		}
	}
	for _, w := range rep.Winners {
		if w.Point.Experiment == "search" {
			t.Errorf("a winner at %s step %d: %+v", w.Point.Experiment, w.Point.Step, w)
		}
	}
	if fixed != 1 || len(rep.Winners) != 1 {
		t.Errorf("at the fixed rate: %d comparisons and %d winners, want 1 and 1", fixed, len(rep.Winners))
	}
}
