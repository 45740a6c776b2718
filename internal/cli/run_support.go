package cli

import (
	"context"
	"path/filepath"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/metrics"
	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/runner"
)

// serveMetrics starts the live /metrics endpoint and returns the observer that feeds it.
func serveMetrics(_ context.Context, addr string) (runner.Observer, func(), error) {
	rec := metrics.New()
	srv, err := rec.Listen(addr)
	if err != nil {
		return nil, nil, err
	}
	return runner.MetricsObserver{Recorder: rec}, func() { srv.Close() }, nil
}

// writeReports writes the run's reports into dir/<run id>/, HTML first.
func writeReports(ctx context.Context, run *results.Run, dir string) ([]string, error) {
	return report.Write(ctx, run, analyze(run, analysis.Options{}), filepath.Join(dir, "meshmark-"+run.ID), report.Options{})
}
