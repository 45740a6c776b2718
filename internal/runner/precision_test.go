package runner

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/store"
)

// syncBuffer is a bytes.Buffer safe for the progress writer's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const precisionStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-precision}
spec:
  substrate:
    local: {nodes: 1}
  workload: {graph: GRAPH}
  meshes:
    - {name: a, profile: none}
    - {name: b, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 200, duration: 2s, warmup: 300ms}
  repeats: 3
  precision: PRECISION
`

// sleepyChain is chain-2 whose second service takes 3 ms: a p50 of milliseconds, which
// an A/A pair at 3 repeats resolves to some tens of percent, where chain-2's p50 of a
// few hundred µs moved by ±200% between bring-ups on a quiet machine.
const sleepyChain = `name: sleepy-chain
services:
  - name: svc-0
    isEntrypoint: true
    script: [call: svc-1]
  - name: svc-1
    script: [sleep: 3ms]
`

// A precision target met by the planned repeats adds no round, and the progress says
// it was met. (That an unreachable one adds rounds until the budget, on both platforms,
// is cli's TestPrecisionAddsRoundsOnBothPlatforms.)
func TestPrecisionMetAtOnceAddsNothing(t *testing.T) {
	needRoot(t)
	graph := filepath.Join(t.TempDir(), "sleepy-chain.yaml")
	if err := os.WriteFile(graph, []byte(sleepyChain), 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var out syncBuffer
	// A/A of the baseline at 3 repeats resolves a p50 of milliseconds to some tens of
	// percent at worst (t with 2 degrees of freedom is 4.3).
	run, err := Run(context.Background(), parseStudy(t, strings.NewReplacer("PRECISION", "{p50: 100%}", "GRAPH", graph).Replace(precisionStudy)),
		Options{Store: db, PodBinary: podBin, Progress: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	repeats := 0
	for _, tr := range run.Trials {
		repeats = max(repeats, tr.Repeat+1)
	}
	if repeats != 3 || len(run.Trials) != 6 || !strings.Contains(out.String(), "precision met at 3 repeats: p50") {
		t.Errorf("a target met at once: %d repeats, %d trials; want the 3 planned, both meshes each\n%s", repeats, len(run.Trials), out.String())
	}
}

// repeatsFor finds the fewest repeats whose estimated sensitivity reaches the target,
// and one more round when it cannot scale the interval or nothing reaches it soon.
func TestRepeatsForATarget(t *testing.T) {
	x := analysis.Sensitivity{Metric: analysis.P50, Pct: 10, Repeats: 4, Unit: "repeats"}
	n := repeatsFor(x, 5, 4)
	if !(x.At(n) <= 5) || !(x.At(n-1) > 5) {
		t.Errorf("repeatsFor gave %d: sensitivity %.3g there, %.3g at one fewer; want the first at or under 5%%", n, x.At(n), x.At(n-1))
	}
	if n := repeatsFor(x, 5, 30); n != 31 {
		t.Errorf("already past the estimate at 30 repeats (the interval came out wider than scaled): %d, want one more round", n)
	}
	if n := repeatsFor(analysis.Sensitivity{Metric: analysis.P50, Pct: 10, Repeats: 1, Unit: "intervals"}, 5, 1); n != 2 {
		t.Errorf("intervals: %d, want one more round", n)
	}
	if n := repeatsFor(x, 0, 4); n != 400 {
		t.Errorf("a 0%% target: %d, want the search's end, 100 times the repeats", n)
	}
}
