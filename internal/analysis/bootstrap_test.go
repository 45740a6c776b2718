package analysis

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/meshmark/meshmark/internal/results"
)

// percentileBootstrap is the interval method the analysis used before studentT, kept
// here so that the coverage test can plug it back in (Options.method) and show that
// it does not hold its level with few repeats: a percentile bootstrap of the pooled
// statistic over repeats (over interleaved blocks in pairs when paired), or over the
// trials' one-second intervals when either group has fewer than minRepeats repeats.
type percentileBootstrap struct {
	resamples  int // 4000 in the analysis as it was
	minRepeats int // 3
}

func (b percentileBootstrap) rng(opts Options, name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(opts.Seed, h.Sum64()))
}

func (b percentileBootstrap) change(ref, other *Group, paired bool, opts Options) intervals {
	sr, so, unitName := b.samples(ref, other)
	paired = paired && unitName == "repeats"
	rng := b.rng(opts, fmt.Sprintf("%s|%s|%s|%d", ref.Mesh, other.Mesh, ref.Experiment, ref.Step))
	rv, ov := bootstrap(sr, so, opts.Metrics, b.resamples, rng, paired)
	alpha := (1 - opts.Confidence) / 2
	iv := intervals{byMetric: map[Metric]bounds{}, unit: unitName, paired: paired,
		how: fmt.Sprintf("percentile bootstrap over %s, %d resamples", unitName, b.resamples)}
	for _, m := range opts.Metrics {
		deltas := make([]float64, 0, len(rv[m]))
		pcts := make([]float64, 0, len(rv[m]))
		for i := range rv[m] {
			d := ov[m][i] - rv[m][i]
			if math.IsNaN(d) {
				continue
			}
			deltas = append(deltas, d)
			if rv[m][i] != 0 {
				pcts = append(pcts, 100*d/rv[m][i])
			}
		}
		bd := bounds{deltaLo: quantile(deltas, alpha), deltaHi: quantile(deltas, 1-alpha), pctLo: math.NaN(), pctHi: math.NaN()}
		if len(pcts) == len(deltas) {
			bd.pctLo, bd.pctHi = quantile(pcts, alpha), quantile(pcts, 1-alpha)
		}
		iv.byMetric[m] = bd
	}
	return iv
}

// spread: two independent bootstrap resamples of the baseline are compared many
// times, and the floor is the 95th percentile of |Δ%| between them.
func (b percentileBootstrap) spread(base *Group, opts Options) (map[Metric]float64, string) {
	sa, sb, unitName := b.samples(base, base)
	rng := b.rng(opts, "noise|"+base.Mesh+"|"+base.Experiment+fmt.Sprint(base.Step))
	av, bv := bootstrap(sa, sb, opts.Metrics, b.resamples, rng, false)
	out := map[Metric]float64{}
	for _, m := range opts.Metrics {
		ref := base.Value(m)
		if ref == 0 {
			continue
		}
		var rel []float64
		for i := range av[m] {
			rel = append(rel, math.Abs(100*(bv[m][i]-av[m][i])/ref))
		}
		out[m] = quantile(rel, 0.95)
	}
	return out, unitName
}

// samples chooses the bootstrap unit for a pair of groups: repeats when both have at
// least minRepeats, else intervals when both have interval histograms, else repeats
// anyway.
func (b percentileBootstrap) samples(a, c *Group) (sa, sc *sample, unitName string) {
	if len(a.Trials) >= b.minRepeats && len(c.Trials) >= b.minRepeats {
		return trialSample(a.Trials), trialSample(c.Trials), "repeats"
	}
	ia, ic := intervalSample(a.Trials), intervalSample(c.Trials)
	if ia != nil && ic != nil && len(ia.units) >= 2 && len(ic.units) >= 2 {
		return ia, ic, "intervals"
	}
	return trialSample(a.Trials), trialSample(c.Trials), "repeats"
}

func percentilesOf(ms []Metric) []float64 {
	var qs []float64
	for _, m := range ms {
		if p := m.Percentile(); p >= 0 {
			qs = append(qs, p)
		}
	}
	sort.Float64s(qs)
	return qs
}

func statOf(p pooled, qs []float64, m Metric) float64 {
	switch m {
	case Throughput:
		return p.throughput
	case ErrorRate:
		return p.errorRate
	}
	want := m.Percentile()
	for i, q := range qs {
		if q == want {
			return p.quantiles[i]
		}
	}
	return math.NaN()
}

// hierarchicalBootstrap is another candidate studentT was chosen over: a percentile
// bootstrap that draws repeats (blocks in pairs when paired), then, within each drawn
// repeat, its one-second intervals, so that both the spread between repeats and the
// noise within them are resampled. Its spread (the floor without an A/A pair) is not
// implemented: the coverage test reads intervals only.
type hierarchicalBootstrap struct{ resamples int }

func (b hierarchicalBootstrap) change(ref, other *Group, paired bool, opts Options) intervals {
	sr, so := intervalSample(ref.Trials), intervalSample(other.Trials)
	if sr == nil || so == nil || len(ref.Trials) < 2 || len(other.Trials) < 2 {
		return intervals{how: "no interval"}
	}
	rng := percentileBootstrap{}.rng(opts, ref.Mesh+"|"+other.Mesh)
	qs := percentilesOf(opts.Metrics)
	// offsets[k] is where trial k's intervals start among the sample's units.
	offsets := func(g *Group) []int {
		var out []int
		n := 0
		for _, t := range g.Trials {
			out = append(out, n)
			n += len(t.Result.Intervals)
		}
		return append(out, n)
	}
	or, oo := offsets(ref), offsets(other)
	draw := func(s *sample, off, trials []int) pooled {
		var idx []int
		for _, k := range trials {
			n := off[k+1] - off[k]
			for range n {
				idx = append(idx, off[k]+rng.IntN(n))
			}
		}
		return s.pool(idx, qs)
	}
	pick := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = rng.IntN(n)
		}
		return out
	}
	pcts := map[Metric][]float64{}
	for range b.resamples {
		tr := pick(len(ref.Trials))
		to := tr
		if !paired {
			to = pick(len(other.Trials))
		}
		pr, po := draw(sr, or, tr), draw(so, oo, to)
		for _, m := range opts.Metrics {
			if r := statOf(pr, qs, m); r != 0 {
				pcts[m] = append(pcts[m], 100*(statOf(po, qs, m)-r)/r)
			}
		}
	}
	alpha := (1 - opts.Confidence) / 2
	iv := intervals{byMetric: map[Metric]bounds{}, unit: "repeats", paired: paired, how: "hierarchical percentile bootstrap"}
	for _, m := range opts.Metrics {
		lo, hi := quantile(pcts[m], alpha), quantile(pcts[m], 1-alpha)
		base := ref.Value(m)
		iv.byMetric[m] = bounds{deltaLo: base * lo / 100, deltaHi: base * hi / 100, pctLo: lo, pctHi: hi}
	}
	return iv
}

func (hierarchicalBootstrap) spread(*Group, Options) (map[Metric]float64, string) {
	return map[Metric]float64{}, "repeats"
}

// bootstrap draws resamples of both samples and returns, per metric, the resampled
// values of the reference and of the other group. Paired samples (unit i of one goes
// with unit i of the other) are drawn with the same indices.
func bootstrap(ref, other *sample, ms []Metric, resamples int, rng *rand.Rand, paired bool) (refVals, otherVals map[Metric][]float64) {
	qs := percentilesOf(ms)
	refVals, otherVals = map[Metric][]float64{}, map[Metric][]float64{}
	draw := func(s *sample, idx []int, into map[Metric][]float64) {
		for i := range idx {
			idx[i] = rng.IntN(len(s.units))
		}
		p := s.pool(idx, qs)
		for _, m := range ms {
			into[m] = append(into[m], statOf(p, qs, m))
		}
	}
	ri, oi := make([]int, len(ref.units)), make([]int, len(other.units))
	for i := 0; i < resamples; i++ {
		draw(ref, ri, refVals)
		if paired {
			copy(oi, ri)
			p := other.pool(oi, qs)
			for _, m := range ms {
				otherVals[m] = append(otherVals[m], statOf(p, qs, m))
			}
			continue
		}
		draw(other, oi, otherVals)
	}
	return refVals, otherVals
}

// unit is one resampling unit (a repeat, or an interval when there are too few
// repeats): its cumulative latency counts on the group's value grid and its totals.
type unit struct {
	cum      []int64 // cum[j] = values ≤ grid[j]
	requests int64
	errors   int64
	seconds  float64
}

// sample is a group of units sharing one value grid. Pooling a multiset of units is
// the sum of their count vectors, which is exactly what merging HDR histograms does;
// percentiles of the pool are found by binary search on the summed cumulative counts,
// so a resample costs O(units · log(grid)) instead of a pass over the grid.
type sample struct {
	grid  []int64 // highest equivalent value of each non-empty bucket, ascending
	units []unit
}

func newSample(hists []*hdrhistogram.Histogram, reqs, errs []int64, secs []float64) *sample {
	set := map[int64]struct{}{}
	dists := make([][]hdrhistogram.Bar, len(hists))
	for i, h := range hists {
		if h == nil {
			continue
		}
		for _, b := range h.Distribution() {
			if b.Count > 0 {
				set[b.To] = struct{}{}
				dists[i] = append(dists[i], b)
			}
		}
	}
	s := &sample{grid: make([]int64, 0, len(set))}
	for v := range set {
		s.grid = append(s.grid, v)
	}
	sort.Slice(s.grid, func(i, j int) bool { return s.grid[i] < s.grid[j] })
	index := make(map[int64]int, len(s.grid))
	for i, v := range s.grid {
		index[v] = i
	}
	for i := range hists {
		u := unit{cum: make([]int64, len(s.grid)), requests: reqs[i], errors: errs[i], seconds: secs[i]}
		for _, b := range dists[i] {
			u.cum[index[b.To]] += b.Count
		}
		for j := 1; j < len(u.cum); j++ {
			u.cum[j] += u.cum[j-1]
		}
		s.units = append(s.units, u)
	}
	return s
}

// pooled holds the statistics of one multiset of units.
type pooled struct {
	total      int64
	quantiles  []float64 // µs, aligned with the quantiles asked for
	throughput float64   // successful requests / s
	errorRate  float64
}

// pool computes the statistics of the chosen units (indices may repeat). qs are
// percentiles in [0,100], ascending. Percentiles mirror hdrhistogram's
// ValueAtPercentile: the rank is round(p/100·total) clamped to [1,total] and the
// answer is the highest equivalent value of the bucket where the cumulative count
// reaches the rank.
func (s *sample) pool(idx []int, qs []float64) pooled {
	p := pooled{quantiles: make([]float64, len(qs))}
	var reqs, errs int64
	var secs float64
	last := len(s.grid) - 1
	for _, k := range idx {
		u := &s.units[k]
		if last >= 0 {
			p.total += u.cum[last]
		}
		reqs += u.requests
		errs += u.errors
		secs += u.seconds
	}
	cumAt := func(j int) int64 {
		var c int64
		for _, k := range idx {
			c += s.units[k].cum[j]
		}
		return c
	}
	lo := 0
	for qi, q := range qs {
		if p.total == 0 {
			p.quantiles[qi] = math.NaN()
			continue
		}
		rank := int64(1)
		if r := q/100*float64(p.total) + 0.5; r >= float64(p.total) {
			rank = p.total
		} else if r >= 1 {
			rank = int64(r)
		}
		// smallest j ≥ lo with cumAt(j) ≥ rank; ranks ascend with qs so lo only grows.
		hi := last
		for lo < hi {
			mid := (lo + hi) / 2
			if cumAt(mid) >= rank {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		p.quantiles[qi] = float64(s.grid[lo])
	}
	if secs > 0 {
		p.throughput = float64(reqs-errs) / secs
	}
	if reqs > 0 {
		p.errorRate = float64(errs) / float64(reqs)
	}
	return p
}

// trialSample builds a sample whose units are the given trials (one per repeat).
func trialSample(trials []*results.Trial) *sample {
	n := len(trials)
	hists, reqs, errs, secs := make([]*hdrhistogram.Histogram, n), make([]int64, n), make([]int64, n), make([]float64, n)
	for i, t := range trials {
		hists[i], reqs[i], errs[i], secs[i] = t.Result.Latency, t.Result.Requests, t.Result.Errors, t.Duration().Seconds()
	}
	return newSample(hists, reqs, errs, secs)
}

// intervalSample builds a sample whose units are the per-interval histograms of all
// the trials; nil when some trial has no interval histograms.
func intervalSample(trials []*results.Trial) *sample {
	var hists []*hdrhistogram.Histogram
	var reqs, errs []int64
	var secs []float64
	for _, t := range trials {
		if len(t.Result.Intervals) == 0 {
			return nil
		}
		for _, iv := range t.Result.Intervals {
			if iv.Histogram == nil {
				return nil
			}
			hists = append(hists, iv.Histogram)
			reqs = append(reqs, iv.Count)
			errs = append(errs, iv.Errors)
			secs = append(secs, iv.Duration.Seconds())
		}
	}
	return newSample(hists, reqs, errs, secs)
}
