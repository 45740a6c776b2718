package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// aaStudy is the issue-16 A/A on the demo's bookinfo: two identical baselines, 5
// repeats of 6 s at 300 req/s, interleaved. The balancing, how idle CPUs wait, and how
// the deployments come and go (a fresh bring-up per repeat, or both meshes up together
// throughout) are filled in per configuration, and so are the repeats and their length.
const aaStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: bench-aa-noise-floor}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1, cpuPlacement: {loadgen: "1", sut: "0"}, cpuIdle: %s}
  workload: {graph: bookinfo}
  meshes:
    - {name: a, profile: none, options: {balancing: %[2]s}}
    - {name: b, profile: none, options: {balancing: %[2]s}}
  baseline: a
  experiments:
    - {name: latency, kind: fixed-rate, rate: 300, connections: 8, duration: %[5]s, warmup: %[6]s}
  repeats: %[4]d
  order: interleaved
  %[3]s
  seed: 16
`

// aaConfigs are measured one after the other in one benchmark run: the A/A as issue 16
// found it (per-connection balancing, the kernel's idle governor, a fresh bring-up per
// repeat), with per-request balancing alone, with idle CPUs polling too, and with both
// meshes up together so that the interleaved trials follow each other with no bring-up
// between them: as 5 and 15 blocks of 6 s, and as 100 blocks of 1 s (200 ms warm-up)
// or 90 (100 ms), which pair the two deployments second by second in about the demo's
// time (its file says four minutes; it took 3 m 28 s on 2026-11-25, and 90 blocks 3 m
// 23 s). The services' Go runtime is sized for their CPUs in all of them, which
// has no switch.
var aaConfigs = []struct {
	name, cpuIdle, balancing, deployments string
	repeats                               int
	duration, warmup                      string
}{
	{"before", "os", "per-connection", "freshBringUpPerRepeat: true", 5, "6s", "1s"},
	{"balancing", "os", "per-request", "freshBringUpPerRepeat: true", 5, "6s", "1s"},
	{"polling", "poll", "per-request", "freshBringUpPerRepeat: true", 5, "6s", "1s"},
	{"kept-up", "poll", "per-request", "keepMeshesUp: true", 5, "6s", "1s"},
	{"kept-up-15x6s", "poll", "per-request", "keepMeshesUp: true", 15, "6s", "1s"},
	{"kept-up-100x1s", "poll", "per-request", "keepMeshesUp: true", 100, "1s", "200ms"},
	{"kept-up-90x1s", "poll", "per-request", "keepMeshesUp: true", 90, "1s", "100ms"},
}

// BenchmarkAANoiseFloor reports, from one run, the A/A noise floor on p50 and p99 of
// two identical baselines for each configuration of aaConfigs (the larger |bound| of
// the interval of one against the other, %), analysed unpaired and paired, and how
// many trials had a skewed request mix. It is a measurement of this machine, not a
// pass/fail test:
//
//	go test -run XXX -bench AANoiseFloor -benchtime 1x -v ./internal/runner/
//
// MESHMARK_AA_CONFIGS=polling,kept-up measures only the configurations it names.
func BenchmarkAANoiseFloor(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	only := strings.Split(os.Getenv("MESHMARK_AA_CONFIGS"), ",")
	for range b.N {
		for _, cfg := range aaConfigs {
			if only[0] != "" && !slices.Contains(only, cfg.name) {
				continue
			}
			dir := b.TempDir()
			path := filepath.Join(dir, "aa.yaml")
			if err := os.WriteFile(path, []byte(fmt.Sprintf(aaStudy, cfg.cpuIdle, cfg.balancing, cfg.deployments, cfg.repeats, cfg.duration, cfg.warmup)), 0o644); err != nil {
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
			start := time.Now()
			run, err := Run(context.Background(), st, Options{Store: db, PodBinary: podBin})
			took := time.Since(start)
			db.Close()
			if err != nil {
				b.Fatal(err)
			}
			skewed := 0
			for _, tr := range run.Trials {
				if tr.Result.HasFlag(results.FlagMixSkewed) {
					skewed++
				}
			}
			b.Logf("%s (cpu idle %s, balancing %s, %s, %d x %s after %s warm-up): took %s; %s", cfg.name, cfg.cpuIdle, cfg.balancing, cfg.deployments,
				cfg.repeats, cfg.duration, cfg.warmup, took.Round(time.Second), run.Provenance.Placement["cpu-idle"])
			b.ReportMetric(took.Seconds(), "run-s-"+cfg.name)
			// The same trials analysed both ways: independently, and in pairs of one
			// interleaved block (analysis.Comparison.Paired).
			for _, how := range []struct {
				name     string
				unpaired bool
			}{{"unpaired", true}, {"paired", false}} {
				for _, c := range aaComparisons(run, "a", "b", analysis.Options{Seed: 1, Unpaired: how.unpaired}) {
					if c.Metric == analysis.P50 || c.Metric == analysis.P99 {
						b.Logf("%s %s A/A %s: Δ%% %+.1f [%+.1f, %+.1f], noise floor %.1f%%, %s", cfg.name, how.name, c.Metric, c.Pct.Value, c.Pct.Lo, c.Pct.Hi, c.NoiseFloorPct, c.Verdict)
						b.ReportMetric(c.NoiseFloorPct, string(c.Metric)+"-floor-%-"+cfg.name+"-"+how.name)
					}
				}
			}
			for _, m := range []string{"a", "b"} {
				var p50s []string
				for _, tr := range run.Trials {
					if tr.Mesh == m && tr.Result.Latency != nil {
						p50s = append(p50s, fmt.Sprint(tr.Result.Latency.ValueAtQuantile(50)))
					}
				}
				b.Logf("%s %s: trial p50s by repeat (µs): %s", cfg.name, m, strings.Join(p50s, " "))
			}
			b.ReportMetric(float64(skewed), "mix-skewed-trials-"+cfg.name)
			b.Logf("%s: %d of %d trials had a skewed request mix", cfg.name, skewed, len(run.Trials))
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
