package analysis

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
)

// A trial whose target saturated never enters a verdict silently: every comparison and
// the verdict table at its point say "saturated", though the sidecar's 2 ms shift
// would otherwise be a clear "worse"; the text summary names it beside the numbers.
// Other points are not touched.
func TestSaturatedTrialMakesItsPointSaturated(t *testing.T) {
	run := synthRun(3, 3, 3000, 2000)
	rng := rand.New(rand.NewPCG(4, 4))
	p := results.TrialParams{RequestedRate: 100}
	for r := 0; r < 3; r++ {
		run.Trials = append(run.Trials, synthTrial(rng, "none", r, 1000, 0, "other", p), synthTrial(rng, "sidecar", r, 1000, 2000, "other", p))
	}
	clean := Analyze(run, Options{Seed: 1}, nil)
	if c := find(clean.Comparisons, "sidecar", P50); c == nil || c.Verdict != Worse {
		t.Fatalf("before the flag: %+v, want worse", c)
	}
	sat := &run.Trials[3] // sidecar, repeat 2, at "fixed"
	if sat.Mesh != "sidecar" || sat.Experiment != "fixed" {
		t.Fatalf("trial 3 is %s %s", sat.Mesh, sat.Experiment)
	}
	sat.Result.Flags = append(sat.Result.Flags, results.FlagTargetSaturated)
	sat.Result.Saturation = &results.Saturation{Saturated: true, BacklogFrom: 2, BacklogTo: 800, IntendedRate: 300, CompletedRate: 220}

	rep := Analyze(run, Options{Seed: 1}, nil)
	for _, c := range rep.Comparisons {
		want := Saturated
		if c.Experiment == "other" {
			want = verdictOf(clean.Comparisons, c)
		}
		if c.Verdict != want {
			t.Errorf("%s %s %s: verdict %s, want %s", c.Experiment, c.Mesh, c.Metric, c.Verdict, want)
		}
	}
	for _, w := range rep.Winners {
		if w.Experiment == "fixed" && w.Verdict != Saturated {
			t.Errorf("verdict table at %s %s: %s, want saturated", w.Label, w.Metric, w.Verdict)
		}
	}
	if g := rep.Group(Key{Mesh: "sidecar", Experiment: "fixed"}); g == nil || g.Saturated != 1 {
		t.Errorf("group: %+v, want one saturated trial", g)
	}
	var out strings.Builder
	if err := WriteRunSummary(&out, run, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "TARGET SATURATED in 1 of 3") || !strings.Contains(out.String(), "saturated") {
		t.Errorf("summary does not name the saturated trial:\n%s", out.String())
	}
}

func verdictOf(cs []Comparison, c Comparison) Verdict {
	for _, x := range cs {
		if x.Point == c.Point && x.Mesh == c.Mesh && x.Metric == c.Metric {
			return x.Verdict
		}
	}
	return ""
}

// The throughput is what the target served inside the window: a saturated step that
// answered its backlog after the window served less than it was asked, and the
// capacity analysis says so, where counting the requests intended in the window passed
// it at the requested rate. Its latency here is below the SLO, as it is for a
// short step that has not queued for long, so only the served rate can fail it.
func TestCapacityUsesTheRateServedInTheWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	run := &results.Run{Meshes: []results.Mesh{{Label: "none", Profile: "none"}}}
	for step, rate := range []float64{100, 200, 300} {
		tr := synthTrial(rng, "none", 0, int(rate*10), 0, "steps", results.TrialParams{RequestedRate: rate, Step: step})
		served := int64(rate * 10)
		if rate > 250 { // a target of 250 req/s
			served = 2500
			tr.Result.Saturation = &results.Saturation{Saturated: true}
		}
		tr.Result.Window = &results.WindowCount{Completed: served, Succeeded: served}
		run.Trials = append(run.Trials, tr)
	}
	groups := Groups(run)
	c := CapacityOf(groups, DefaultSLO())
	if !c.Found || c.MaxX != 200 || !strings.Contains(c.Limit, "served 250 of 300") {
		t.Errorf("capacity %+v, want 200 rps, limited by serving 250 of the 300 req/s requested", c)
	}
	run.Trials[2].Result.Window = nil // as stored before the window was counted
	groups = Groups(run)
	if groups[2].Throughput != 300 || groups[2].Saturated != 1 {
		t.Errorf("without a window count: throughput %v, saturated %d", groups[2].Throughput, groups[2].Saturated)
	}
	if c := CapacityOf(groups, DefaultSLO()); c.MaxX != 200 || !strings.Contains(c.Limit, "saturated") {
		t.Errorf("capacity %+v, want 200 rps, limited by the saturated step", c)
	}
}
