package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// aaStudy is the issue-16 A/A on the demo's bookinfo: the baseline four times, two
// balancing per connection (the old default) and two per request (the new one),
// every repeat interleaved, so both balancings meet the same machine in one run.
const aaStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: bench-aa-noise-floor}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1, cpuPlacement: {loadgen: "1", sut: "0"}}
  workload: {graph: bookinfo}
  meshes:
    - {name: conn-a, profile: none, options: {balancing: per-connection}}
    - {name: conn-b, profile: none, options: {balancing: per-connection}}
    - {name: req-a, profile: none, options: {balancing: per-request}}
    - {name: req-b, profile: none, options: {balancing: per-request}}
  baseline: conn-a
  experiments:
    - {name: latency, kind: fixed-rate, rate: 300, connections: 8, duration: 6s, warmup: 1s}
  repeats: 5
  order: interleaved
  freshBringUpPerRepeat: true
  seed: 16
`

// BenchmarkAANoiseFloor reports, from one run, the A/A noise floor on p50 and p99 of
// two identical baselines for each balancing (the larger |bound| of the interval of one
// against the other, both ways round, %), and how many of each one's trials had a
// skewed request mix. It is a measurement of this machine, not a pass/fail test:
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
		for _, pair := range []struct{ name, a, b string }{{"per-connection", "conn-a", "conn-b"}, {"per-request", "req-a", "req-b"}} {
			skewed, trials := 0, 0
			for _, tr := range run.Trials {
				if tr.Mesh == pair.a || tr.Mesh == pair.b {
					trials++
					if tr.Result.HasFlag(results.FlagMixSkewed) {
						skewed++
					}
				}
			}
			// The same trials resampled both ways: independently (before pairing) and
			// in pairs of one interleaved block (analysis.Comparison.Paired).
			for _, how := range []struct {
				name     string
				unpaired bool
			}{{"unpaired", true}, {"paired", false}} {
				for _, c := range aaComparisons(run, pair.a, pair.b, analysis.Options{Seed: 1, Unpaired: how.unpaired}) {
					if c.Metric == analysis.P50 || c.Metric == analysis.P99 {
						b.Logf("%s %s A/A %s: Δ%% %+.1f [%+.1f, %+.1f], noise floor %.1f%%, %s", pair.name, how.name, c.Metric, c.Pct.Value, c.Pct.Lo, c.Pct.Hi, c.NoiseFloorPct, c.Verdict)
						b.ReportMetric(c.NoiseFloorPct, string(c.Metric)+"-floor-%-"+pair.name+"-"+how.name)
					}
				}
			}
			for _, m := range []string{pair.a, pair.b} {
				var p50s []string
				for _, tr := range run.Trials {
					if tr.Mesh == m && tr.Result.Latency != nil {
						p50s = append(p50s, fmt.Sprint(tr.Result.Latency.ValueAtQuantile(50)))
					}
				}
				b.Logf("%s: trial p50s by repeat (µs): %s", m, strings.Join(p50s, " "))
			}
			b.ReportMetric(float64(skewed), "mix-skewed-trials-"+pair.name)
			b.Logf("%s: %d of %d trials had a skewed request mix", pair.name, skewed, trials)
		}
	}
}

// aaComparisons analyses the pair a, b alone (b against a), as an A/A pair.
func aaComparisons(run *results.Run, a, b string, opts analysis.Options) []analysis.Comparison {
	sub := *run
	sub.Meshes, sub.Trials, sub.Baseline = nil, nil, a
	for _, m := range run.Meshes {
		if m.Label == a || m.Label == b {
			sub.Meshes = append(sub.Meshes, m)
		}
	}
	for _, t := range run.Trials {
		if t.Mesh == a || t.Mesh == b {
			sub.Trials = append(sub.Trials, t)
		}
	}
	var out []analysis.Comparison
	for _, c := range analysis.Analyze(&sub, opts, nil).Comparisons {
		if c.Mesh == b {
			out = append(out, c)
		}
	}
	return out
}
