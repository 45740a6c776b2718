package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
)

// storeTinyRun stores a two-mesh, three-repeat run in a fresh database.
func storeTinyRun(t *testing.T) (db, id string) {
	t.Helper()
	ctx := context.Background()
	db = filepath.Join(t.TempDir(), "results.db")
	st, err := store.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	start := time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)
	run := &results.Run{Study: "tiny", Started: start, Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "sidecar", Profile: "envoy-sidecar"}}}
	if err := st.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	for rep := 0; rep < 3; rep++ {
		for i, m := range []string{"none", "sidecar"} {
			h := results.NewLatencyHistogram()
			for v := int64(1); v <= 1000; v++ {
				_ = h.RecordValue(v*int64(i+1) + int64(rep))
			}
			tr := results.Trial{Repeat: rep, Mesh: m, Experiment: "fixed", Kind: results.KindFixedRate,
				Params: results.TrialParams{RequestedRate: 100}, Start: start.Add(time.Duration(rep*20+i*10) * time.Second),
				End: start.Add(time.Duration(rep*20+i*10+10) * time.Second), Result: results.TrialResult{Requests: 1000, Latency: h}}
			if err := st.AddTrial(ctx, run.ID, &tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := st.FinishRun(ctx, run.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	return db, run.ID
}

func TestReportCommand(t *testing.T) {
	db, id := storeTinyRun(t)
	dir := t.TempDir()
	md := filepath.Join(dir, "r.md")
	if code := Main([]string{"report", "last", "--db", db, "--format", "md", "-o", md}); code != 0 {
		t.Fatalf("report md exit %d", code)
	}
	b, err := os.ReadFile(md)
	if err != nil || !strings.Contains(string(b), "| fixed 100 rps | sidecar |") || !strings.Contains(string(b), id) {
		t.Fatalf("markdown report lacks the run: %v\n%s", err, b)
	}
	html := filepath.Join(dir, "r.html")
	if code := Main([]string{"report", id[:8], "--db", db, "-o", html}); code != 0 {
		t.Fatalf("report html exit %d", code)
	}
	if b, err := os.ReadFile(html); err != nil || !strings.Contains(string(b), "<!DOCTYPE html>") {
		t.Fatalf("html report: %v", err)
	}
	if code := Main([]string{"report", "last", "--db", db, "--dir", filepath.Join(dir, "all")}); code != 0 {
		t.Fatalf("report --dir exit %d", code)
	}
	if code := Main([]string{"report", "last", "--db", db, "--format", "pdf"}); code != 2 {
		t.Errorf("bad format: exit %d, want 2", code)
	}
	if code := Main([]string{"report", "nosuchrun", "--db", db, "--format", "md"}); code != 3 {
		t.Errorf("unknown run: exit %d, want 3", code)
	}
}
