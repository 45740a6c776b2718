package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
)

// A trial whose target saturated is named wherever its point's numbers appear: the
// verdicts there say saturated, the pooled results count it, and the checks fail with
// its evidence; a trial the runner backed off from is counted apart.
func TestSaturatedTrialInReport(t *testing.T) {
	run := syntheticRun(t)
	var sat, backed *results.Trial
	for i := range run.Trials {
		tr := &run.Trials[i]
		if tr.Experiment == "fixed" && tr.Mesh == "sidecar-mtls" {
			switch {
			case sat == nil:
				sat = tr
			case backed == nil:
				backed = tr
			}
		}
	}
	sat.ID, backed.ID = 9001, 9002
	sat.Result.Flags = append(sat.Result.Flags, results.FlagTargetSaturated)
	sat.Result.Saturation = &results.Saturation{Saturated: true, BacklogFrom: 4, BacklogTo: 666, IntendedRate: 600, CompletedRate: 420}
	backed.Result.Flags = append(backed.Result.Flags, results.FlagTargetSaturated, results.FlagBackedOff)
	backed.Result.Saturation = &results.Saturation{Saturated: true}
	an := analysis.Analyze(run, analysis.Options{Seed: 42}, nil)

	s := Summarize(run, an, Options{})
	for _, v := range s.Verdicts {
		if strings.HasPrefix(v.Label, "fixed") && v.Verdict != string(analysis.Saturated) && (v.Best == "sidecar-mtls" || v.RunnerUp == "sidecar-mtls") {
			t.Errorf("verdict at %s on %s: %s, want saturated", v.Label, v.Metric, v.Verdict)
		}
	}
	for _, g := range s.Groups {
		want := 0
		if g.Experiment == "fixed" && g.Mesh == "sidecar-mtls" {
			want = 1
		}
		if g.Saturated != want {
			t.Errorf("group %s %s: %d saturated trials", g.Label, g.Mesh, g.Saturated)
		}
	}
	var check *CheckRow
	for i := range s.Checks {
		if s.Checks[i].Mesh == "sidecar-mtls" && strings.Contains(s.Checks[i].Check, "kept up with the load") {
			check = &s.Checks[i]
		}
	}
	if check == nil || check.Pass || !strings.Contains(check.Detail, "trial 9001") || !strings.Contains(check.Detail, "4 → 666") ||
		!strings.Contains(check.Detail, "1 trials saturated at a rate the runner then lowered") {
		t.Errorf("saturation check: %+v", check)
	}
	var md bytes.Buffer
	if err := Render(&md, Markdown, run, an, Options{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| saturated |") || !strings.Contains(md.String(), "**1 of 2**") {
		t.Errorf("the Markdown report does not name the saturation")
	}
}
