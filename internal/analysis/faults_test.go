package analysis

import (
	"fmt"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/results"
)

// A fault trial (a process of the system under test exited) and the superseded trials
// of its attempt stay in the run but in no pooled number: the groups hold exactly the
// clean repeats, and Excluded lists the others with their faults.
func TestFaultTrialsAreLeftOutOfPooling(t *testing.T) {
	run := synthRun(5, 4, 2000, 0)
	clean := Analyze(run, Options{Seed: 1}, nil)
	rng := newRNG(9)
	// A fault trial with huge latencies and a superseded one, for the sidecar.
	fault := synthTrial(rng, "sidecar", 1, 2000, 50000, "fixed", run.Trials[1].Params)
	fault.ID, fault.Result.Errors = 100, 1500
	fault.Result.Flags = []string{results.FlagFault}
	fault.Result.Faults = []results.Fault{{Pod: "productpage-v1-0", Process: "envoy", PID: 7, Exit: "signal: killed"}}
	superseded := synthTrial(rng, "sidecar", 1, 2000, 50000, "fixed", run.Trials[1].Params)
	superseded.ID = 101
	superseded.Result.Flags = []string{results.FlagSuperseded}
	run.Trials = append(run.Trials, fault, superseded)

	rep := Analyze(run, Options{Seed: 1}, nil)
	for i, g := range rep.Groups {
		c := clean.Groups[i]
		if g.Repeats != c.Repeats || g.P99 != c.P99 || g.Errors != 0 || g.Throughput != c.Throughput {
			t.Errorf("group %s: %d repeats, p99 %d, %d errors; without the fault trials %d, %d, 0", g.Mesh, g.Repeats, g.P99, g.Errors, c.Repeats, c.P99)
		}
	}
	for i, c := range rep.Comparisons {
		if fmt.Sprint(c.Pct) != fmt.Sprint(clean.Comparisons[i].Pct) || c.Verdict != clean.Comparisons[i].Verdict {
			t.Errorf("comparison %s %s changed with the fault trials present: %+v vs %+v", c.Mesh, c.Metric, c.Pct, clean.Comparisons[i].Pct)
		}
	}
	if len(rep.Excluded) != 2 || rep.Excluded[0].Flag != results.FlagFault || rep.Excluded[0].Faults[0].Process != "envoy" ||
		rep.Excluded[1].Flag != results.FlagSuperseded || rep.Excluded[1].TrialID != 101 {
		t.Errorf("excluded %+v", rep.Excluded)
	}
	var text strings.Builder
	if err := WriteRunSummary(&text, run, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 trials left out of every number above", "trial 100, fixed", "fault: productpage-v1-0/envoy (pid 7)",
		"trial 101, fixed", "cut short by a fault and measured again"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("run summary does not say %q:\n%s", want, text.String())
		}
	}
}
