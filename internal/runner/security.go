package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/security"
	"github.com/meshmark/meshmark/internal/study"
)

// runSecurity runs a security experiment's probes against the deployment and stores
// their verdicts as one trial. The wire is captured only here, never during a load
// trial, so capturing costs the performance results nothing.
func (r *runner) runSecurity(ctx context.Context, d *deployment, t *study.Trial) error {
	e := t.Experiment
	r.progress.phase(fmt.Sprintf("security probes on %s: %v", t.Mesh.Name, e.Probes))
	tgt := security.Target{
		Sub:      d.tb,
		App:      &d.app,
		Profile:  d.profile,
		Progress: func(s string) { r.progress.note("     " + s) },
		Traffic: func(ctx context.Context, n int) error {
			// The app's own traffic, sent by the load generator as it sends load (the
			// entry service's protocol), closed-loop on a few connections.
			spec, err := r.loadSpec(t, r.localLoad(ctx, d, t), loadRun{conns: min(4, n), length: time.Minute})
			if err != nil {
				return err
			}
			spec.Count = int64(n)
			res, _, err := d.gen.Run(ctx, spec, nil)
			if err != nil {
				return fmt.Errorf("%w%s", err, d.generatorEnd())
			}
			if res.Succeeded == 0 {
				return fmt.Errorf("none of %d requests through %s succeeded %v", res.Completed, spec.Request.URL, res.ErrorSamples)
			}
			return nil
		},
	}
	if d.app.Service(gateway.Service) != nil {
		tgt.Gateway = gateway.Service
	}
	start := time.Now()
	probes, err := security.Run(ctx, tgt, security.Options{Probes: e.Probes, Requests: e.Requests})
	if err != nil {
		return err
	}
	trial := &results.Trial{Repeat: t.Repeat, Mesh: t.Mesh.Name, Experiment: e.Name, Kind: results.KindSecurity,
		Start: start.UTC(), End: time.Now().UTC(), Result: results.TrialResult{Security: probes}}
	if err := r.opts.Store.AddTrial(ctx, r.run.ID, trial); err != nil {
		return err
	}
	r.run.Trials = append(r.run.Trials, *trial)
	return nil
}
