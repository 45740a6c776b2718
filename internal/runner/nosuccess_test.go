package runner

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// TestTrialWithNoSuccessFailsTheRun: a trial in which no request succeeded measured
// nothing of the system but that it did not serve; the run fails saying so, and is
// stored failed with that reason, rather than complete with the trial's numbers.
func TestTrialWithNoSuccessFailsTheRun(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	graph := "name: broken\nservices:\n  - name: front\n    isEntrypoint: true\n    errorRate: 100%\n"
	if err := os.WriteFile(filepath.Join(dir, "broken.yaml"), []byte(graph), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: no-success}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: broken.yaml}
  meshes:
    - {name: baseline, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 50, duration: 2s, warmup: 500ms}
`
	path := filepath.Join(dir, "study.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := study.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(context.Background(), filepath.Join(dir, "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	run, err := Run(context.Background(), st, Options{Store: db, PodBinary: podBin, Progress: testWriter{t}})
	if err == nil || !strings.Contains(err.Error(), "latency 50 req/s on baseline, repeat 1: no request succeeded: 100 measured, all failed (non-2xx 100); answers 500×100; the trial is not stored") {
		t.Fatalf("run: %v; want it to fail, saying no request succeeded", err)
	}
	stored, lerr := db.LoadRun(context.Background(), run.ID)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if stored.Status != results.StatusFailed || !strings.Contains(stored.StatusReason, "no request succeeded") || len(stored.Trials) != 0 {
		t.Errorf("stored run: status %s (%s), %d trials; want failed, saying why, and no trial", stored.Status, stored.StatusReason, len(stored.Trials))
	}
}
