package cli

import (
	"io"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
)

// analyze runs the analysis with the SLO the run's own study file declared, so that
// `run`, `show` and `report` judge capacity alike.
func analyze(run *results.Run, opts analysis.Options) *analysis.Report {
	var slo *analysis.SLO
	if st, err := study.Parse(run.StudyPath, run.StudyFile); err == nil && st.Spec.SLO != nil {
		s := st.Spec.SLO.Bounds()
		slo = &s
	}
	if opts.Seed == 0 {
		opts.Seed = uint64(run.Seed)
	}
	return analysis.Analyze(run, opts, slo)
}

// printSummary is the terminal summary of a run, the answer first: the same as
// `meshmark show` (without --all).
func printSummary(w io.Writer, run *results.Run) error {
	rep := analyze(run, analysis.Options{})
	return analysis.WriteAnswerSummary(w, run, rep, false, openings(run, rep)...)
}
