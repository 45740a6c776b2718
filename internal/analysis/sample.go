package analysis

import (
	"math"
	"sort"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/meshmark/meshmark/internal/results"
)

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
