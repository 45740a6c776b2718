package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/store"
)

// run --plan runs nothing: it scales the stored run's sensitivity to the planned
// repeats, and says how to get a run to plan from when there is none.
func TestRunPlan(t *testing.T) {
	db, id := storeTinyRun(t)
	dir := t.TempDir()
	write := func(name, graph string) string {
		path := filepath.Join(dir, name+".yaml")
		doc := fmt.Sprintf(`apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: %s}
spec:
  workload: {graph: %s}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar}
  experiments:
    - {name: fixed, kind: fixed-rate, rate: 100, duration: 10s, warmup: 1s}
  repeats: 12
`, name, graph)
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	out, code, err := execResults(t, "run", "--plan", "--db", db, write("tiny", "bookinfo"))
	if code != 0 {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	s, err := store.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	run, err := s.LoadRun(context.Background(), id)
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	var p50 analysis.Sensitivity
	for _, x := range analysis.Analyze(run, analysis.Options{}, nil).Sensitivity {
		if x.Metric == analysis.P50 {
			p50 = x
		}
	}
	for _, want := range []string{"plan for study tiny: 12 repeats", "estimated from 1 stored runs (" + id + ")",
		fmt.Sprintf("p50    ±%.3g%%   (measured ±%.3g%% at 3 repeats)", p50.At(12), p50.Pct)} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	if p50.At(12) >= p50.Pct {
		t.Errorf("more repeats, no better: %v at 12 vs %v at 3", p50.At(12), p50.Pct)
	}
	if runs, _ := store.Open(context.Background(), db); runs != nil {
		list, _ := runs.ListRuns(context.Background())
		runs.Close()
		if len(list) != 1 {
			t.Errorf("--plan stored a run: %d runs", len(list))
		}
	}

	out, code, _ = execResults(t, "run", "--plan", "--db", db, write("other", "emojivoto"))
	if code != 0 || !strings.Contains(out, "no stored run of study other or graph emojivoto") || !strings.Contains(out, "pilot") {
		t.Errorf("plan without a stored run: exit %d\n%s", code, out)
	}
}
