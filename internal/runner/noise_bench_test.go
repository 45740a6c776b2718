package runner

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// aaStudy is the issue-16 A/A: the demo's bookinfo with no mesh, twice, interleaved.
const aaStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: bench-aa-noise-floor}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1, cpuPlacement: {loadgen: "1", sut: "0"}}
  workload: {graph: bookinfo}
  meshes:
    - {name: none-a, profile: none}
    - {name: none-b, profile: none}
  baseline: none-a
  experiments:
    - {name: latency, kind: fixed-rate, rate: 300, connections: 8, duration: 6s, warmup: 1s}
  repeats: 5
  order: interleaved
  freshBringUpPerRepeat: true
  seed: 16
`

// BenchmarkAANoiseFloor runs the A/A study once per iteration and reports the A/A
// noise floor on p50 and p99 (the larger |bound| of the interval of one identical mesh
// against the other, %), and how many trials had a skewed request mix. It is a
// measurement of this machine, not a pass/fail test:
//
//	go test -run XXX -bench AANoiseFloor -benchtime 1x ./internal/runner/
func BenchmarkAANoiseFloor(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for range b.N {
		dir := b.TempDir()
		path := filepath.Join(dir, "aa.yaml")
		if err := os.WriteFile(path, []byte(aaStudy), 0o644); err != nil {
			b.Fatal(err)
		}
		st, err := study.ParseFile(path)
		if err != nil {
			b.Fatal(err)
		}
		db, err := store.Open(context.Background(), filepath.Join(dir, "results.db"))
		if err != nil {
			b.Fatal(err)
		}
		run, err := Run(context.Background(), st, Options{Store: db, ServiceBinary: meshmarkBin})
		db.Close()
		if err != nil {
			b.Fatal(err)
		}
		rep := analysis.Analyze(run, analysis.Options{Seed: 1}, nil)
		skewed := 0
		for _, tr := range run.Trials {
			if tr.Result.HasFlag(results.FlagMixSkewed) {
				skewed++
			}
		}
		for _, c := range rep.Comparisons {
			if c.Mesh != "none-b" {
				continue
			}
			switch c.Metric {
			case analysis.P50, analysis.P99:
				b.Logf("A/A %s: Δ%% %+.1f [%+.1f, %+.1f], noise floor %.1f%%, %s", c.Metric, c.Pct.Value, c.Pct.Lo, c.Pct.Hi, c.NoiseFloorPct, c.Verdict)
				b.ReportMetric(c.NoiseFloorPct, string(c.Metric)+"-floor-%")
			}
		}
		b.ReportMetric(float64(skewed), "mix-skewed-trials")
		b.Logf("%d of %d trials had a skewed request mix", skewed, len(run.Trials))
	}
}
