package analysis

import (
	"math"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
)

// scaledRun is synthRun with the sidecar's trials changed by f (latencies, and
// throughput through its requests), to place a difference exactly.
func scaledRun(seed uint64, n int, latFactor, reqFactor float64) *results.Run {
	run := synthRun(seed, 5, n, 0)
	for i := range run.Trials {
		t := &run.Trials[i]
		if t.Mesh != "sidecar" {
			continue
		}
		h := results.NewLatencyHistogram()
		for _, b := range t.Result.Latency.Distribution() {
			if b.Count > 0 {
				_ = h.RecordValues(int64(math.Round(float64(b.From)*latFactor)), b.Count)
			}
		}
		t.Result.Latency = h
		t.Result.Intervals = nil
		t.Result.Requests = int64(math.Round(float64(t.Result.Requests) * reqFactor))
	}
	return run
}

// Verdict hygiene: identical values are equal, not inconclusive; a throughput that
// differs by a sure but negligible −0.05 % is equal, not worse; a sure difference
// beyond the margin is still worse; the margins can be overridden.
func TestEquivalenceMargins(t *testing.T) {
	same := synthRun(11, 5, 5000, 0)
	for i := range same.Trials { // every trial of both meshes measured the same values
		id, mesh, repeat := same.Trials[i].ID, same.Trials[i].Mesh, same.Trials[i].Repeat
		same.Trials[i] = same.Trials[0]
		same.Trials[i].ID, same.Trials[i].Mesh, same.Trials[i].Repeat = id, mesh, repeat
	}
	rep := Analyze(same, Options{Seed: 1}, nil)
	for _, m := range DefaultMetrics {
		if c := find(rep.Comparisons, "sidecar", m); c.Verdict != Equal {
			t.Errorf("identical values, %s: verdict %s (Δ%% %+v, Δ %+v)", m, c.Verdict, c.Pct, c.Delta)
		}
	}
	for _, w := range rep.Winners {
		if w.Verdict != Equal {
			t.Errorf("identical values: winner on %s is %s (%s)", w.Metric, w.Best, w.Verdict)
		}
	}

	tiny := Analyze(scaledRun(12, 5000, 1, 0.9995), Options{Seed: 1}, nil)
	c := find(tiny.Comparisons, "sidecar", Throughput)
	t.Logf("throughput −0.05%%: Δ%% %.3f [%.3f, %.3f], margin %.1f%%, %s", c.Pct.Value, c.Pct.Lo, c.Pct.Hi, c.Margin, c.Verdict)
	if c.Verdict != Equal || c.Margin != DefaultMargins[Throughput] {
		t.Errorf("throughput −0.05%%: verdict %s with margin %.1f, want equal within %.1f%%", c.Verdict, c.Margin, DefaultMargins[Throughput])
	}

	slower := Analyze(scaledRun(13, 5000, 1.10, 1), Options{Seed: 1}, nil)
	if c := find(slower.Comparisons, "sidecar", P50); c.Verdict != Worse {
		t.Errorf("p50 +10%%: verdict %s (Δ%% %.2f [%.2f, %.2f])", c.Verdict, c.Pct.Value, c.Pct.Lo, c.Pct.Hi)
	}
	wide := Analyze(scaledRun(13, 5000, 1.10, 1), Options{Seed: 1, Margins: map[Metric]float64{P50: 20}}, nil)
	if c := find(wide.Comparisons, "sidecar", P50); c.Verdict != Equal || c.Margin != 20 {
		t.Errorf("p50 +10%% with a 20%% margin: verdict %s, margin %.0f; want equal", c.Verdict, c.Margin)
	}
}
