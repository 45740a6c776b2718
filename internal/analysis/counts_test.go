package analysis

import (
	"testing"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/meshmark/meshmark/internal/results"
)

// The counts the intervals read give the same percentiles as the histograms they come
// from: each trial's own, any run of trials pooled (as merging their histograms
// does), and a trial recorded on another histogram layout is read on the standard one.
func TestLatencyCountsMatchHistograms(t *testing.T) {
	run := synthRun(1, 4, 3000, 0)
	g := Groups(run)[0]
	// One trial recorded with two significant digits instead of three.
	odd := hdrhistogram.New(1, 60_000_000, 2)
	for _, b := range g.Trials[2].Result.Latency.Distribution() {
		if b.Count > 0 {
			_ = odd.RecordValues(b.To, b.Count)
		}
	}
	g.Trials[2].Result.Latency = odd
	lc := newLatencyCounts(g.Trials)
	qs := []float64{0.1, 1, 50, 90, 99, 99.9, 100}
	for k, tr := range g.Trials {
		h := tr.Result.Latency
		if k == 2 {
			h = results.NewLatencyHistogram()
			h.Merge(odd)
		}
		got := lc.percentiles(k, k+1, qs)
		for i, q := range qs {
			if want := float64(h.ValueAtQuantile(q)); got[i] != want {
				t.Errorf("trial %d p%v: counts %v, histogram %v", k, q, got[i], want)
			}
		}
		if lc.total(k) != h.TotalCount() {
			t.Errorf("trial %d: %d values counted, histogram %d", k, lc.total(k), h.TotalCount())
		}
		p50 := h.ValueAtQuantile(50)
		if below := lc.countBelow(k, float64(p50)); below < h.TotalCount()/2 || lc.countBelow(k, float64(p50)-1) >= below {
			t.Errorf("trial %d: %d of %d at or below its p50 %d", k, below, h.TotalCount(), p50)
		}
	}
	merged := results.NewLatencyHistogram()
	for _, tr := range g.Trials[1:3] {
		merged.Merge(tr.Result.Latency)
	}
	got := lc.percentiles(1, 3, qs)
	for i, q := range qs {
		if want := float64(merged.ValueAtQuantile(q)); got[i] != want {
			t.Errorf("trials 1-2 pooled, p%v: counts %v, merged histogram %v", q, got[i], want)
		}
	}
	if got := lc.percentiles(0, 0, qs); got[2] != 0 {
		t.Errorf("no trials: p50 %v, want 0", got[2])
	}
}
