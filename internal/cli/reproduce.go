package cli

import (
	"io"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/reproduce"
	"github.com/meshmark/meshmark/internal/results"
)

// openings are what a run's terminal summary opens with before the answer: the
// published study's own tables and its figures beside the run's, when the run's study
// file declares spec.reproduces.
func openings(run *results.Run, rep *analysis.Report) []func(io.Writer) error {
	r := reproduce.Build(run, rep)
	if r == nil {
		return nil
	}
	return []func(io.Writer) error{r.WriteText}
}
