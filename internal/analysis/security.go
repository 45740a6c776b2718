package analysis

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/meshmark/meshmark/internal/results"
)

// SecurityCell is one mesh's verdict on one probe of one security experiment.
type SecurityCell struct {
	Mesh       string `json:"mesh"`
	Experiment string `json:"experiment"`
	results.SecurityProbe
}

// SecurityMatrix lists every stored probe verdict of a run, by mesh in the run's
// order, then experiment, then probe in results.SecurityProbes order.
func SecurityMatrix(run *results.Run) []SecurityCell {
	var out []SecurityCell
	for _, m := range run.Meshes {
		for i := range run.Trials {
			t := &run.Trials[i]
			if t.Mesh != m.Label || t.Kind != results.KindSecurity {
				continue
			}
			for _, p := range t.Result.Security {
				out = append(out, SecurityCell{Mesh: t.Mesh, Experiment: t.Experiment, SecurityProbe: p})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b SecurityCell) int {
		if a.Mesh != b.Mesh {
			return 0 // keep the run's mesh order
		}
		if a.Experiment != b.Experiment {
			return strings.Compare(a.Experiment, b.Experiment)
		}
		return slices.Index(results.SecurityProbes, a.Probe) - slices.Index(results.SecurityProbes, b.Probe)
	})
	return out
}

// WriteSecurityMatrix prints the matrix (mesh × probe → outcome) and, under it, one
// line per failed probe saying what broke.
func WriteSecurityMatrix(w io.Writer, cells []SecurityCell) error {
	if len(cells) == 0 {
		return nil
	}
	type row struct{ mesh, exp string }
	var rows []row
	at := map[row]map[string]results.SecurityProbe{}
	for _, c := range cells {
		r := row{c.Mesh, c.Experiment}
		if at[r] == nil {
			at[r] = map[string]results.SecurityProbe{}
			rows = append(rows, r)
		}
		at[r][c.Probe] = c.SecurityProbe
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "SECURITY\tMESH\t%s\n", strings.ToUpper(strings.Join(results.SecurityProbes, "\t")))
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s", r.exp, r.mesh)
		for _, p := range results.SecurityProbes {
			out := "-"
			if c, ok := at[r][p]; ok {
				out = string(c.Outcome)
			}
			fmt.Fprintf(tw, "\t%s", out)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range cells {
		if c.Outcome == results.SecurityFail {
			fmt.Fprintf(w, "FAIL %s %s: %s (promised: %s)\n", c.Mesh, c.Probe, c.Summary, c.Promised)
		}
	}
	return nil
}

// SecurityChange is one probe's verdict in two runs.
type SecurityChange struct {
	Mesh       string                  `json:"mesh"`
	Experiment string                  `json:"experiment"`
	Probe      string                  `json:"probe"`
	Before     results.SecurityOutcome `json:"before,omitempty"` // empty: not run in RUN_A
	After      results.SecurityOutcome `json:"after"`
	// Regressed: the probe fails in RUN_B and did not in RUN_A (or was not run there).
	Regressed bool   `json:"regressed"`
	Summary   string `json:"summary"`
}

// CompareSecurity pairs RUN_B's probe verdicts with RUN_A's, for the meshes given (all
// when empty). A failure in RUN_B that RUN_A did not have is a regression, including
// a probe RUN_A did not run: a gate must not pass a failure only because it is new.
func CompareSecurity(a, b *results.Run, meshes []string) []SecurityChange {
	type key struct{ mesh, exp, probe string }
	before := map[key]results.SecurityOutcome{}
	for _, c := range SecurityMatrix(a) {
		before[key{c.Mesh, c.Experiment, c.Probe}] = c.Outcome
	}
	var out []SecurityChange
	for _, c := range SecurityMatrix(b) {
		if len(meshes) > 0 && !slices.Contains(meshes, c.Mesh) {
			continue
		}
		old := before[key{c.Mesh, c.Experiment, c.Probe}]
		out = append(out, SecurityChange{Mesh: c.Mesh, Experiment: c.Experiment, Probe: c.Probe, Before: old, After: c.Outcome,
			Regressed: c.Outcome == results.SecurityFail && old != results.SecurityFail, Summary: c.Summary})
	}
	return out
}

// CheckSecurityGate is `--fail-if security`: one result per probe of RUN_B, failed
// where it regressed.
func CheckSecurityGate(g Gate, changes []SecurityChange) (out []GateResult, failed bool) {
	for _, c := range changes {
		was := string(c.Before)
		if was == "" {
			was = "not run"
		}
		why := fmt.Sprintf("security %s on %s (%s): %s → %s", c.Probe, c.Mesh, c.Experiment, was, c.After)
		if c.Regressed {
			why += ": " + c.Summary
		}
		ch := c
		out = append(out, GateResult{Gate: g, Failed: c.Regressed, Why: why, Security: &ch})
		failed = failed || c.Regressed
	}
	return out, failed
}
