package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
)

// execResults runs one meshmark command line and returns its output and exit code.
func execResults(t *testing.T, args ...string) (string, int, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	code := 0
	if err != nil {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
	}
	return out.String(), code, err
}

// storeRun writes a run of 5 interleaved repeats of a none and a sidecar mesh, the
// sidecar slower by sidecarShift µs.
func storeRun(t *testing.T, s *store.Store, seed uint64, started time.Time, sidecarShift int64) string {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 1))
	run := &results.Run{Study: "cli-test", Seed: int64(seed), Started: started,
		Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "sidecar", Profile: "envoy-sidecar"}}}
	if err := s.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	for rep := 0; rep < 5; rep++ {
		for _, m := range []string{"none", "sidecar"} {
			shift := int64(0)
			if m == "sidecar" {
				shift = sidecarShift
			}
			begin := started.Add(time.Duration(rep) * time.Minute)
			tr := &results.Trial{Repeat: rep, Mesh: m, Experiment: "fixed", Kind: results.KindFixedRate,
				Params: results.TrialParams{RequestedRate: 1000}, Start: begin, End: begin.Add(5 * time.Second),
				Result: results.TrialResult{Requests: 5000, Latency: results.NewLatencyHistogram()}}
			for i := 0; i < 5; i++ {
				iv := results.Interval{Start: begin.Add(time.Duration(i) * time.Second), Duration: time.Second, RequestedRate: 1000,
					Histogram: results.NewLatencyHistogram()}
				for j := 0; j < 1000; j++ {
					v := 300 + int64(rng.ExpFloat64()*400) + shift
					_ = iv.Histogram.RecordValue(v)
					_ = tr.Result.Latency.RecordValue(v)
				}
				iv.Count, iv.AchievedRate = 1000, 1000
				tr.Result.Intervals = append(tr.Result.Intervals, iv)
			}
			if err := s.AddTrial(ctx, run.ID, tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.FinishRun(ctx, run.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	return run.ID
}

func TestResultsCommands(t *testing.T) {
	db := filepath.Join(t.TempDir(), "results.db")
	s, err := store.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	old := storeRun(t, s, 1, t0, 100)
	same := storeRun(t, s, 2, t0.Add(time.Hour), 100)
	slower := storeRun(t, s, 3, t0.Add(2*time.Hour), 400)
	s.Close()

	out, code, err := execResults(t, "ls", "--db", db)
	if code != 0 || !strings.Contains(out, old) || !strings.Contains(out, slower) || !strings.Contains(out, "complete") {
		t.Fatalf("ls: code %d err %v\n%s", code, err, out)
	}
	out, code, err = execResults(t, "show", "last", "--db", db, "--all")
	if code != 0 || !strings.Contains(out, "run "+slower) || !strings.Contains(out, "sidecar") || !strings.Contains(out, "worse") {
		t.Fatalf("show last: code %d err %v\n%s", code, err, out)
	}
	// The sidecar is 400 µs slower than none: its p50 row must say so.
	if !strings.Contains(out, "verdict table") || !strings.Contains(out, "overhead against none") {
		t.Errorf("show --all lacks the comparison sections:\n%s", out)
	}

	jsonPath := filepath.Join(t.TempDir(), "run.json")
	if _, code, err = execResults(t, "export", old[:6], "--db", db, "-o", jsonPath); code != 0 {
		t.Fatalf("export json: %v", err)
	}
	f, err := os.Open(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	exported, err := store.ReadJSON(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, _ = store.Open(context.Background(), db)
	stored, err := s.LoadRun(context.Background(), old)
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(exported.Trials) != 10 || !exported.Trials[3].Result.Latency.Equals(stored.Trials[3].Result.Latency) ||
		!exported.Trials[3].Result.Intervals[2].Histogram.Equals(stored.Trials[3].Result.Intervals[2].Histogram) {
		t.Error("JSON export does not carry the stored histograms losslessly")
	}

	out, code, _ = execResults(t, "export", old, "--db", db, "--format", "csv")
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if code != 0 || err != nil {
		t.Fatalf("export csv: code %d, %v", code, err)
	}
	if len(rows) != 1+10*(1+5) || strings.Join(rows[0], ",") != strings.Join(store.CSVHeader, ",") {
		t.Errorf("csv: %d rows (want header + 10 trials × (1 + 5 intervals)), header %v", len(rows), rows[0])
	}

	// Unchanged run: exit 0. 300 µs slower sidecar: p50 (~580 µs) rises ~50%: exit 3.
	if out, code, err = execResults(t, "compare", old, same, "--db", db, "--fail-if", "p50 > +10%"); code != 0 {
		t.Errorf("compare of equal runs: code %d, %v\n%s", code, err, out)
	}
	out, code, err = execResults(t, "compare", old, slower, "--db", db, "--mesh", "sidecar", "--fail-if", "p50 > +10%", "--fail-if", "p99 > +50ms")
	if code != exitGateFailed || !strings.Contains(out, "FAIL") || !strings.Contains(out, "ok  ") {
		t.Errorf("compare with a regression: code %d (want %d), %v\n%s", code, exitGateFailed, err, out)
	}
	if strings.Contains(out, "none") && strings.Contains(out, "\nfixed 1000 rps  none") {
		t.Errorf("--mesh sidecar also compared none:\n%s", out)
	}
	if _, code, err = execResults(t, "compare", old, slower, "--db", db, "--fail-if", "p99 >> 10%"); code != exitBadGate || !strings.Contains(err.Error(), "column") {
		t.Errorf("bad gate: code %d, %v", code, err)
	}
	if _, code, err = execResults(t, "show", "nosuchrun", "--db", db); code != 1 || !strings.Contains(err.Error(), "no such run") {
		t.Errorf("unknown run: code %d, %v", code, err)
	}
}
