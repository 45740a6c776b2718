package runner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/study"
)

// Platform is where a run brings its meshes up and measures them: the local testbed
// (testbedPlatform, built in) or one registered with RegisterPlatform (a Kubernetes
// cluster: package kubeplatform). Walk goes over the plan on either, so bring-ups,
// back-offs, fault re-measures and precision rounds are decided in one place for all.
// D is the platform's deployment of one mesh.
type Platform[D comparable] interface {
	// BringUp deploys trial t's mesh and workload and proves the mesh enrolled them,
	// saying so on the progress display. When it fails it returns what it created, if
	// anything, for TearDown.
	BringUp(ctx context.Context, t *study.Trial) (D, error)
	// Measure runs trial t on d, storing each load run as it ends (Host.RunLoad).
	Measure(ctx context.Context, d D, t *study.Trial) error
	// TearDown removes d. final says the run is ending with d up (after an error or an
	// interrupt too) rather than making way for another bring-up: what a study asks to
	// keep (cleanup: false on a cluster) is kept then only, since a second bring-up of
	// the mesh, or of another that shares its control plane, would meet it.
	TearDown(d D, final bool)
	// Finish releases what outlives the deployments, once the last is torn down.
	Finish()
}

// Walk walks the run's plan on p: see runPlan.
func Walk[D comparable](ctx context.Context, h *Host, p Platform[D]) error {
	return runPlan(ctx, h.r, p)
}

// runPlan walks the plan on p. A mesh stays up across consecutive trials unless the plan
// asks for a fresh bring-up; one mesh is up at a time, or with keepMeshesUp every mesh
// brought up so far, until the run ends. Everything brought up is torn down at the end,
// after an error or an interrupt too.
func runPlan[D comparable](ctx context.Context, r *runner, p Platform[D]) error {
	var none D
	up := map[string]D{}
	down := func(name string, final bool) {
		if d, ok := up[name]; ok {
			p.TearDown(d, final)
			delete(up, name)
		}
	}
	defer func() {
		for _, name := range slices.Sorted(maps.Keys(up)) {
			down(name, true)
		}
		p.Finish()
	}()
	var precisionStart time.Time
	// The plan may grow while it runs: a precision target adds rounds at its end, a
	// back-off the trials to measure again.
	for i := 0; i < len(r.plan); i++ {
		t := &r.plan[i]
		for attempt := 0; ; attempt++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			cur, isUp := up[t.Mesh.Name]
			if attempt > 0 || t.BringUp || !isUp {
				down(t.Mesh.Name, false)
				if !r.study.Spec.KeepMeshesUp {
					for _, name := range slices.Sorted(maps.Keys(up)) {
						down(name, false) // the previous trial's mesh: one is up at a time
					}
				}
				d, err := p.BringUp(ctx, t)
				if d != none {
					up[t.Mesh.Name] = d
				}
				if err != nil {
					return err
				}
				cur = d
			}
			first := len(r.run.Trials)
			err := p.Measure(ctx, cur, t)
			var be *backoffError
			if errors.As(err, &be) {
				// The experiment again, every mesh and repeat, at the lower rate.
				if err := r.flagBackedOff(ctx, be.exp); err != nil {
					return err
				}
				r.plan = r.study.Remeasure(r.plan, i, be.exp)
				break
			}
			var fe *faultError
			if !errors.As(err, &fe) {
				if err != nil {
					return err
				}
				break
			}
			if err := r.supersede(ctx, first); err != nil {
				return err
			}
			for _, f := range fe.faults {
				where := "; log " + f.LogPath
				if f.LogPath == "" { // a container's: its kubelet keeps the log, and the trial its end
					where = ""
					if f.LogTail != "" {
						where = "; the end of its log is stored with the trial"
					}
				}
				r.progress.note(fmt.Sprintf("fault: %s during %s on %s%s", f, fe.label, fe.mesh, where))
			}
			if attempt >= maxFaultRetries {
				return fmt.Errorf("%w; it was measured %d times on fresh bring-ups and faulted each time, so the run stops: the deployment does not stay up under this load (the fault trials are stored)", err, attempt+1)
			}
			r.progress.note(fmt.Sprintf("the fault trial is kept but left out of the results; bringing %s up again to measure %s (repeat %d) once more",
				t.Mesh.Name, t.Experiment.Name, t.Repeat+1))
		}
		if i == len(r.plan)-1 && r.study.Spec.Precision != nil {
			if precisionStart.IsZero() {
				precisionStart = time.Now()
			}
			r.plan = append(r.plan, r.precisionRound(precisionStart)...)
		}
	}
	r.progress.done()
	return nil
}

func init() {
	RegisterPlatform(PlatformKind{Substrate: substrateLocal, Check: func(*Host) error { return nil }, Open: openTestbed})
}

// openTestbed checks that this machine can host every mesh of the study (preflight)
// and returns the walk of the plan over local testbeds, with meshmark's own CPUs given
// back after it, whatever the placement pinned.
func openTestbed(ctx context.Context, h *Host) (func(ctx context.Context) error, error) {
	r := h.r
	if err := r.preflight(ctx); err != nil {
		return nil, err
	}
	r.cpuIdle, r.cpuIdlePoll = cpuIdleFor(r.study.Spec.Substrate.Local.CPUIdle)
	return func(ctx context.Context) error {
		r.saveCPUs()
		defer func() { _ = r.unpin() }()
		return runPlan(ctx, r, &testbedPlatform{r: r, checked: map[string]bool{}})
	}, nil
}

// testbedPlatform is the local substrate: each deployment is a testbed of network
// namespaces with real proxies.
type testbedPlatform struct {
	r *runner
	// checked holds the meshes whose equivalence check is stored: a mesh brought up
	// again is checked again, but stored once.
	checked map[string]bool
}

func (p *testbedPlatform) BringUp(ctx context.Context, t *study.Trial) (*deployment, error) {
	r := p.r
	r.progress.phase(fmt.Sprintf("bring-up %s (repeat %d)", t.Mesh.Name, t.Repeat+1))
	d, err := r.bringUp(ctx, t.Mesh)
	if err != nil {
		return nil, err
	}
	r.progress.note(fmt.Sprintf("%s up in %s (%s): %d pods, enrollment %s", t.Mesh.Name, d.took.Round(time.Millisecond),
		strings.Join(d.phases, ", "), len(d.app.Pods()), d.enrollment.Summary()))
	if e := d.enrollment; len(e.Plaintext) > 0 {
		r.progress.note(fmt.Sprintf("%s: %s", t.Mesh.Name, meshprobe.DescribeProof(e.Plaintext, e.PlaintextControl)))
	}
	if err := r.recordEnrollment(ctx, d, !p.checked[t.Mesh.Name]); err != nil {
		return d, err
	}
	p.checked[t.Mesh.Name] = true
	if !d.enrollment.Pass {
		return d, fmt.Errorf("mesh %s is not set up as claimed, refusing to measure it: %s", t.Mesh.Name, d.enrollment.Summary())
	}
	return d, nil
}

func (p *testbedPlatform) Measure(ctx context.Context, d *deployment, t *study.Trial) error {
	return p.r.runExperiment(ctx, d, t)
}

func (p *testbedPlatform) TearDown(d *deployment, _ bool) { p.r.tearDown(d) }

func (p *testbedPlatform) Finish() {}
