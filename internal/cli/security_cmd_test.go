package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
)

// storeSecurityRun writes a run whose sidecar mesh got the given verdict on the
// plaintext-refused probe (every other probe passes).
func storeSecurityRun(t *testing.T, s *store.Store, started time.Time, plaintext results.SecurityOutcome) string {
	t.Helper()
	ctx := context.Background()
	run := &results.Run{Study: "cli-security", Seed: 1, Started: started,
		Meshes: []results.Mesh{{Label: "none", Profile: "none"}, {Label: "sidecar", Profile: "envoy-sidecar"}}}
	if err := s.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	var probes []results.SecurityProbe
	for _, p := range results.SecurityProbes {
		o := results.SecurityPass
		if p == results.ProbePlaintext {
			o = plaintext
		}
		probes = append(probes, results.SecurityProbe{Probe: p, Outcome: o, Summary: p + " " + string(o)})
	}
	tr := &results.Trial{Mesh: "sidecar", Experiment: "security", Kind: results.KindSecurity, Start: started, End: started.Add(time.Second),
		Result: results.TrialResult{Security: probes}}
	if err := s.AddTrial(ctx, run.ID, tr); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRun(ctx, run.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	return run.ID
}

// `compare --fail-if security` exits 3 when a probe newly fails and 0 when nothing
// regressed; `show` prints the matrix.
func TestCompareFailIfSecurity(t *testing.T) {
	db := filepath.Join(t.TempDir(), "r.db")
	s, err := store.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC)
	good := storeSecurityRun(t, s, start, results.SecurityPass)
	again := storeSecurityRun(t, s, start.Add(time.Hour), results.SecurityPass)
	broken := storeSecurityRun(t, s, start.Add(2*time.Hour), results.SecurityFail)
	s.Close()

	if out, code, err := execResults(t, "compare", good, again, "--db", db, "--fail-if", "security"); code != 0 {
		t.Errorf("no regression: code %d, %v\n%s", code, err, out)
	}
	out, code, err := execResults(t, "compare", good, broken, "--db", db, "--fail-if", "security")
	if code != exitGateFailed || !strings.Contains(out, "FAIL security plaintext-refused on sidecar (security): pass → fail") {
		t.Errorf("regression: code %d (want %d), %v\n%s", code, exitGateFailed, err, out)
	}
	out, _, _ = execResults(t, "show", broken, "--db", db)
	if !strings.Contains(out, "PLAINTEXT-REFUSED") || !strings.Contains(out, "FAIL sidecar plaintext-refused") {
		t.Errorf("show prints no security matrix:\n%s", out)
	}
}
