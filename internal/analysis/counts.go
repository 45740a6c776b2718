package analysis

import (
	"math"
	"sync"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/meshmark/meshmark/internal/results"
)

// latencyCounts is a group's trials' latency histograms as sparse counts on one
// layout, so that the percentiles of any run of its trials, and how many of a trial's
// values lie below a value, can be had without merging histograms again.
type latencyCounts struct {
	trials  []sparseCounts
	values  []int64 // the highest value equivalent to each count index
	scratch []int64 // summed counts, kept zeroed between uses
}

// sparseCounts is one histogram's non-zero counts, by count index, ascending.
type sparseCounts struct {
	idx []int32
	n   []int64
}

// latencyLayout is results.NewLatencyHistogram's: its snapshot (without counts) and
// the highest value equivalent to each count index.
var latencyLayout = sync.OnceValues(func() (*hdrhistogram.Snapshot, []int64) {
	h := results.NewLatencyHistogram()
	_ = h.RecordValue(h.HighestTrackableValue())
	var values []int64
	for _, b := range h.Distribution() { // bar i is count index i, up to the value recorded
		values = append(values, b.To)
	}
	s := h.Export()
	s.Counts = nil
	return s, values
})

// newLatencyCounts reads the trials' histograms, each on results.NewLatencyHistogram's
// layout (one that is not is re-recorded on it first).
func newLatencyCounts(trials []*results.Trial) *latencyCounts {
	layout, values := latencyLayout()
	lc := &latencyCounts{values: values, scratch: make([]int64, len(values))}
	for _, t := range trials {
		s := t.Result.Latency.Export()
		if s.LowestTrackableValue != layout.LowestTrackableValue || s.HighestTrackableValue != layout.HighestTrackableValue ||
			s.SignificantFigures != layout.SignificantFigures {
			h := results.NewLatencyHistogram()
			h.Merge(t.Result.Latency)
			s = h.Export()
		}
		var sc sparseCounts
		for i, c := range s.Counts[:min(len(s.Counts), len(values))] {
			if c != 0 {
				sc.idx, sc.n = append(sc.idx, int32(i)), append(sc.n, c)
			}
		}
		lc.trials = append(lc.trials, sc)
	}
	return lc
}

// percentiles are the percentiles qs (ascending, in (0, 100]) of trials [lo, hi)
// pooled, as hdrhistogram's ValueAtPercentile gives them for the merged histogram:
// the value of the first count index at which the cumulative count reaches
// round(q/100·total), within [1, total]; 0 when the trials recorded nothing.
func (lc *latencyCounts) percentiles(lo, hi int, qs []float64) []float64 {
	out := make([]float64, len(qs))
	scratch := lc.scratch
	var total int64
	first, last := len(lc.values), -1
	for _, s := range lc.trials[lo:hi] {
		for k, i := range s.idx {
			scratch[i] += s.n[k]
			total += s.n[k]
			first, last = min(first, int(i)), max(last, int(i))
		}
	}
	if total == 0 {
		return out
	}
	var cum int64
	qi := 0
	rank := valueRank(qs[0], total)
	for i := first; i <= last; i++ {
		cum += scratch[i]
		scratch[i] = 0
		for qi < len(qs) && cum >= rank {
			out[qi] = float64(lc.values[i])
			if qi++; qi < len(qs) {
				rank = valueRank(qs[qi], total)
			}
		}
	}
	return out
}

// valueRank is the rank of the p-th percentile among total values as hdrhistogram's
// ValueAtPercentile takes it: round(p/100·total), within [1, total].
func valueRank(p float64, total int64) int64 {
	r := p/100*float64(total) + 0.5
	switch {
	case !(r >= 1):
		return 1
	case r >= float64(total):
		return total
	}
	return int64(math.Floor(r))
}

// countBelow is how many values trial k recorded at or below v.
func (lc *latencyCounts) countBelow(k int, v float64) int64 {
	var c int64
	s := lc.trials[k]
	for j, i := range s.idx {
		if float64(lc.values[i]) > v {
			break
		}
		c += s.n[j]
	}
	return c
}

// total is how many values trial k recorded.
func (lc *latencyCounts) total(k int) int64 {
	var c int64
	for _, n := range lc.trials[k].n {
		c += n
	}
	return c
}
