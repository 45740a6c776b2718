package runner

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
)

// burnGraph is one service that burns burnMS of CPU per request. Pinned to one CPU
// (cpuPlacement sut: "0"), it can serve at most 1000/burnMS requests a second, less
// its HTTP handling and whatever else runs on that CPU.
const (
	burnMS    = 20
	burnGraph = `name: burn
services:
  - name: front
    isEntrypoint: true
    script:
      - cpu: 20ms
`
)

const saturationStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-saturation}
spec:
  substrate:
    local:
      nodes: 2
      loadgenNode: 1
      cpuPlacement: {loadgen: "1", sut: "0"}
  workload: {graph: burn.yaml}
  meshes:
    - {name: base, profile: none}
    - {name: other, profile: none}
  experiments:
    - {name: capacity, kind: capacity, connections: 8, duration: 3s, warmup: 1s}
    - {name: closed, kind: capacity, capacity: closed-loop, connections: 8, duration: 3s, warmup: 1s}
    - {name: below, kind: fixed-rate, rate: 75% of lowest capacity, capacityFrom: capacity, connections: 8, duration: 1s, warmup: 500ms}
    - {name: over, kind: fixed-rate, rate: 500% of lowest capacity, capacityFrom: closed, connections: 8, duration: 2s, warmup: 1s}
  repeats: 1
  seed: 3
  slo: {p99: 200ms, errorRate: 1%}
`

// A service of known capacity, measured through the whole runner: its capacity is the
// open-loop rate it sustained (searched below the closed-loop best, not the closed-loop
// best itself); at 75% of it, in a block of 1 s as the demo's paired blocks are (judged
// over intervals of 167 ms, three to the warm-up), nothing is flagged on the target and
// the rate is served;
// at 500% of its closed-loop best (capacity: closed-loop, which a busy machine does not
// bend as it bends an open-loop search, whose probes fail when the generator is starved),
// still 365% after three back-offs, every trial saturates the target, since what one CPU
// can serve is the ceiling whatever else the machine runs (a capacity measured while
// other work took that CPU can be a third of what it serves a minute later), which the runner stores with the evidence, backs off
// from three times by 10% (keeping the trials it backed off from, flagged and left
// out), and, still saturated, leaves in with its point's verdicts saying saturated.
func TestSaturatedTargetFlaggedAndBackedOff(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "burn.yaml"), []byte(burnGraph), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "study.yaml")
	if err := os.WriteFile(path, []byte(saturationStudy), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := study.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	run, db := runStudyTo(t, st, &out)
	progress := out.String()
	stored, err := db.LoadRun(context.Background(), run.ID)
	if err != nil {
		t.Fatal(err)
	}
	ceiling := 1000.0 / burnMS * 1.05 // what one CPU can do, and a little for timing

	// Capacity: an open-loop search ran below the closed-loop best, and its result is what
	// the relative rates are shares of.
	probes := 0
	for _, tr := range stored.Trials {
		if tr.Experiment == "capacity" && tr.Params.Extra["search"] == "probe" {
			probes++
		}
	}
	if probes < 2*2 || !strings.Contains(progress, "open-loop, sustained under the SLO") {
		t.Errorf("%d open-loop search probes over two meshes; progress:\n%s", probes, progress)
	}
	lowest := min(capacityIn(t, progress, "base", "capacity"), capacityIn(t, progress, "other", "capacity"))
	closedLowest := min(capacityIn(t, progress, "base", "closed"), capacityIn(t, progress, "other", "closed"))
	if lowest <= 0 || lowest > ceiling || closedLowest > ceiling {
		t.Fatalf("lowest capacity %.0f req/s, closed-loop %.0f; one CPU at %d ms a request serves at most %.0f", lowest, closedLowest, burnMS, ceiling)
	}

	var below, over []results.Trial
	for _, tr := range stored.Trials {
		switch tr.Experiment {
		case "below":
			below = append(below, tr)
		case "over":
			over = append(over, tr)
		}
	}
	if len(below) != 2 {
		t.Fatalf("%d trials at 75%%, want one per mesh", len(below))
	}
	for _, tr := range below {
		w := tr.Result.Window
		served := float64(w.Completed) / tr.Duration().Seconds()
		t.Logf("75%%: %s at %.0f req/s served %.1f/s, %s", tr.Mesh, tr.Params.RequestedRate, served, tr.Result.Saturation)
		if math.Abs(tr.Params.RequestedRate-0.75*lowest) > 1 { // the capacity is read as printed, rounded
			t.Errorf("75%% of lowest capacity %.0f ran at %.0f req/s", lowest, tr.Params.RequestedRate)
		}
		// a starved generator may be flagged; the target may not
		if tr.Result.Saturated() || tr.Result.Saturation == nil || len(tr.Result.Flags) > 0 && tr.Result.Flags[0] != results.FlagGeneratorBehind {
			t.Errorf("%s at 75%% of capacity: flags %v, evidence %v", tr.Mesh, tr.Result.Flags, tr.Result.Saturation)
		}
		// within 5%, or a request or two at the few requests a second a busy machine's
		// search may come to
		if d := math.Abs(served-tr.Params.RequestedRate) * tr.Duration().Seconds(); d > max(0.05*tr.Params.RequestedRate*tr.Duration().Seconds(), 2) {
			t.Errorf("%s at 75%% of capacity served %.1f of %.0f req/s", tr.Mesh, served, tr.Params.RequestedRate)
		}
		if !strings.Contains(tr.Params.Extra["rate_basis"], "lowest sustained by every repeat") {
			t.Errorf("%s: rate basis %q", tr.Mesh, tr.Params.Extra["rate_basis"])
		}
	}

	// At 500%: the first mesh's trial saturated, was backed off from three times, and
	// then stayed; the other mesh ran once at the lowered rate and saturated too.
	if len(over) != 5 {
		t.Fatalf("%d trials at 500%%, want the first mesh's measured 4 times (3 back-offs) and the other's once", len(over))
	}
	rate := math.Round(5 * closedLowest)
	first := over[0].Mesh // the plan's order of meshes is drawn from the seed
	for i, tr := range over {
		s := tr.Result.Saturation
		served := float64(tr.Result.Window.Completed) / tr.Duration().Seconds()
		t.Logf("over %d: %s at %.0f req/s served %.1f/s, flags %v, %s, backoff %q", i, tr.Mesh, tr.Params.RequestedRate, served, tr.Result.Flags, s, tr.Params.Extra["backoff"])
		if (i < 4) != (tr.Mesh == first) {
			t.Errorf("trial %d at 500%% is %s's, want the first mesh's (%s) four times, then the other's", i, tr.Mesh, first)
		}
		if want := math.Round(rate * math.Pow(0.9, float64(min(i, 3)))); math.Abs(tr.Params.RequestedRate-want) > 2 {
			t.Errorf("trial %d at 500%% ran at %.0f req/s, want %.0f (%d back-offs of 10%%)", i, tr.Params.RequestedRate, want, min(i, 3))
		}
		if !tr.Result.HasFlag(results.FlagTargetSaturated) || s == nil || s.BacklogTo <= s.BacklogFrom ||
			s.CompletedRate > 0.8*s.IntendedRate || served > ceiling {
			t.Errorf("trial %d at 500%%: flags %v, evidence %v, served %.1f/s (at most %.0f)", i, tr.Result.Flags, s, served, ceiling)
		}
		if backedOff := tr.Result.HasFlag(results.FlagBackedOff); backedOff != (i < 3) {
			t.Errorf("trial %d at 500%%: backed-off %v", i, backedOff)
		}
		if want := fmt.Sprintf("%d × 10%%", min(i, 3)); i > 0 && !strings.HasPrefix(tr.Params.Extra["backoff"], want) {
			t.Errorf("trial %d at 500%%: backoff %q, want it to start %q", i, tr.Params.Extra["backoff"], want)
		}
	}
	if !strings.Contains(progress, "back-off 3 of 3") || !strings.Contains(progress, "after 3 back-offs") {
		t.Errorf("progress does not say it backed off:\n%s", progress)
	}

	rep := analysis.Analyze(stored, analysis.Options{Seed: 1}, nil)
	for _, c := range rep.Comparisons {
		if c.Experiment != "below" && c.Experiment != "over" {
			continue // the capacity searches' probes above capacity saturate by design
		}
		if saturated := c.Verdict == analysis.Saturated; saturated != (c.Experiment == "over") {
			t.Errorf("%s %s %s: verdict %s", c.Experiment, c.Mesh, c.Metric, c.Verdict)
		}
	}
	if len(rep.Excluded) != 3 || rep.Excluded[0].Flag != results.FlagBackedOff {
		t.Errorf("excluded: %+v, want the 3 trials backed off from", rep.Excluded)
	}
	// The answer says what each relative rate was a share of, and the back-offs.
	var lines []string
	for _, l := range analysis.CapacityLines(stored, rep) {
		lines = append(lines, l.Line)
	}
	all := strings.Join(lines, "\n")
	if !strings.Contains(all, "below at 75% of lowest capacity; capacity in req/s over the repeats of capacity") ||
		!strings.Contains(all, "over at 500% of lowest capacity; capacity in req/s over the repeats of closed") || !strings.Contains(all, "backed off 3 × 10%") {
		t.Errorf("capacity lines:\n%s", all)
	}
}

// runStudyTo is runStudy with the progress output also written to w. A machine so
// busy that the load generator cannot keep even a slow open-loop schedule cannot measure
// an open-loop capacity, and the run stops saying so: the test is then skipped with
// that reason, as nothing it asserts could be measured.
func runStudyTo(t *testing.T, st *study.Study, w io.Writer) (*results.Run, *store.Store) {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	run, err := Run(context.Background(), st, Options{Store: db, PodBinary: podBin, Progress: io.MultiWriter(testWriter{t}, w)})
	if err != nil && strings.Contains(err.Error(), "of its closed-loop best in steady state") && strings.Contains(err.Error(), "the load generator fell behind") {
		t.Skipf("the machine starved the load generator: %v", err)
	}
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if run.Status != results.StatusComplete {
		t.Fatalf("run status %s (%s)", run.Status, run.StatusReason)
	}
	return run, db
}

// capacityIn reads the capacity the progress output gives a mesh's only repeat in a
// capacity experiment.
func capacityIn(t *testing.T, progress, mesh, exp string) float64 {
	t.Helper()
	prefix := "capacity " + mesh + " " + exp + " repeat 1: "
	for _, line := range strings.Split(progress, "\n") {
		if i := strings.Index(line, prefix); i >= 0 {
			var v float64
			// the result, not the line that starts a search ("closed-loop best ...")
			if _, err := fmt.Sscanf(line[i+len(prefix):], "%g req/s", &v); err == nil {
				return v
			}
		}
	}
	t.Fatalf("no capacity of %s in the progress output", mesh)
	return 0
}
