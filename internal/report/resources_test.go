package report

import (
	"math"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// Samples a millisecond apart must not turn one scheduler tick into a peak of many
// cores: peak CPU is averaged over at least a second.
func TestPeakCPUIgnoresCloseSamples(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	h := results.NewLatencyHistogram()
	_ = h.RecordValue(100)
	sample := func(d time.Duration, cpu float64) results.ResourceSample {
		return results.ResourceSample{Component: "envoy", Role: "sidecar", Pod: "p", T: t0.Add(d), CPUUserSeconds: cpu, RSSBytes: 1 << 20}
	}
	run := &results.Run{Meshes: []results.Mesh{{Label: "m", Profile: "envoy-sidecar"}}, Trials: []results.Trial{{Mesh: "m", Experiment: "e",
		Start: t0, End: t0.Add(3 * time.Second), Result: results.TrialResult{Requests: 1, Latency: h, Resources: []results.ResourceSample{
			sample(0, 0), sample(time.Millisecond, 0.01), sample(time.Second, 0.30), sample(2*time.Second, 0.60), sample(3*time.Second, 0.90)}}}}}
	rows := resourceRows(run)
	if len(rows) != 1 {
		t.Fatalf("rows = %+v", rows)
	}
	if r := rows[0]; math.Abs(r.AvgCores-0.3) > 1e-9 || r.PeakCores > 0.31 || r.PeakCores < 0.29 {
		t.Errorf("avg %.3f peak %.3f cores, want 0.3 and about 0.3", r.AvgCores, r.PeakCores)
	}
}

func TestClosedLoopCapacityIsReported(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	var trials []results.Trial
	for rep := 0; rep < 2; rep++ {
		h := results.NewLatencyHistogram()
		for v := int64(100); v < 200; v++ {
			_ = h.RecordValue(v)
		}
		trials = append(trials, results.Trial{Repeat: rep, Mesh: "m", Experiment: "cap", Kind: results.KindCapacity,
			Params: results.TrialParams{Connections: 16}, Start: t0, End: t0.Add(10 * time.Second),
			Result: results.TrialResult{Requests: 30000, Latency: h}})
	}
	s := Summarize(&results.Run{Meshes: []results.Mesh{{Label: "m", Profile: "none"}}, Trials: trials}, nil, Options{})
	if len(s.Capacity) != 1 {
		t.Fatalf("capacity = %+v", s.Capacity)
	}
	if c := s.Capacity[0]; c.MaxX != 16 || c.XName != "connections" || math.Abs(c.MaxThroughput-3000) > 1e-9 {
		t.Errorf("closed-loop capacity = %+v, want 3000 req/s at 16 connections", c)
	}
}
