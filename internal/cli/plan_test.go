package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
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
	if code != 0 || !strings.Contains(out, "no stored run of study other with two or more repeats") || !strings.Contains(out, "pilot") {
		t.Errorf("plan without a stored run: exit %d\n%s", code, out)
	}
	// A study of another name on the same graph measured another design: its runs say
	// nothing about this one's sensitivity or time.
	out, code, _ = execResults(t, "run", "--plan", "--db", db, write("same-graph", "bookinfo"))
	if code != 0 || !strings.Contains(out, "no stored run of study same-graph with two or more repeats") ||
		!strings.Contains(out, "runs of other studies are not used, since they measured another design: "+id+" (tiny)") || strings.Contains(out, "estimated from") {
		t.Errorf("plan of another study on the same graph used the stored run of tiny: exit %d\n%s", code, out)
	}
}

// run --plan prints the expected wall time: the planned load time scaled by how much
// longer than their planned load time the stored complete runs of the same study took.
func TestRunPlanExpectsWallTime(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "results.db")
	s, err := store.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	study := func(name string, repeats int) string {
		return fmt.Sprintf(`apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: %s}
spec:
  workload: {graph: bookinfo}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar}
  experiments:
    - {name: fixed, kind: fixed-rate, rate: 100, duration: 10s, warmup: 1s}
  repeats: %d
`, name, repeats)
	}
	// Stored: 3 repeats × 2 meshes × 11 s = 66 s planned under load, 132 s of wall time.
	for _, name := range []string{"timed", "another"} {
		run := &results.Run{Study: name, StudyPath: name + ".yaml", StudyFile: []byte(study(name, 3)), Started: time.Now().Add(-132 * time.Second),
			Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "sidecar", Profile: "envoy-sidecar"}}}
		if name == "another" {
			run.Started = time.Now().Add(-660 * time.Second) // ten times its load: must not count
		}
		if err := s.CreateRun(ctx, run); err != nil {
			t.Fatal(err)
		}
		if err := s.FinishRun(ctx, run.ID, results.StatusComplete, ""); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	path := filepath.Join(t.TempDir(), "timed.yaml")
	if err := os.WriteFile(path, []byte(study("timed", 12)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code, err := execResults(t, "run", "--plan", "--db", db, path)
	if code != 0 {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	// 12 repeats × 2 meshes × 11 s = 264 s under load, × 2.00 = 528 s.
	if !strings.Contains(out, "plan for study timed: 12 repeats per mesh and point, 24 trials, ") || !strings.Contains(out, ", 4m24s under load") ||
		!regexp.MustCompile(`expected wall time: about 8m4[89]s \(the load time × 2\.00, the median ratio of wall time to planned load time of 1 stored complete runs of this study: `).MatchString(out) {
		t.Errorf("plan does not expect 8m48s:\n%s", out)
	}
	path = filepath.Join(t.TempDir(), "fresh.yaml")
	if err := os.WriteFile(path, []byte(study("fresh", 12)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, _ = execResults(t, "run", "--plan", "--db", db, path)
	if !strings.Contains(out, "expected wall time: more than 4m24s: ") || !strings.Contains(out, "no stored complete run of study fresh") {
		t.Errorf("plan without a timed run of the study:\n%s", out)
	}
}
