// Package runner executes a study: for every planned trial it brings up the
// application under the trial's mesh on the substrate, proves the mesh is enrolled,
// drives the load, samples resources and proxy statistics, and stores the trial as soon
// as it finishes, so that an interrupted run keeps everything it measured. One walk
// over the plan (runPlan), one translation of experiments into load (runLoad) and one
// assembly of trials (measureOn) serve every platform: the local testbed, built in, and
// those registered with RegisterPlatform (a Kubernetes cluster, package kubeplatform),
// each of which brings meshes up, drives load and tears down in its own way.
package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/workload"

	_ "github.com/meshmark/meshmark/internal/mesh/meshes" // every built-in mesh profile
	"golang.org/x/sys/unix"
)

// Options configure a run.
type Options struct {
	Store *store.Store
	// Progress receives the live progress display (phase, mesh, repeat, experiment,
	// rate, p99, ETA); nil shows nothing.
	Progress io.Writer
	// Interactive redraws one progress line in place instead of printing a line every
	// few seconds.
	Interactive bool
	// LogDir keeps process logs after the run; empty keeps them only while it runs.
	LogDir string
	// Version is meshmark's own version, for provenance.
	Version string
	// PodBinary is the meshmark-pod executable the workload and load-generator pods
	// run (a copy of it); empty means podcmd.Find's: the one beside the running
	// meshmark, where `make build` puts it.
	PodBinary string
	// Observe, when set, is told about every load interval and sampler round (live
	// metrics).
	Observe Observer
}

// ErrInterrupted is returned when the run was cancelled; the trials that finished are
// stored and the run is marked incomplete.
var ErrInterrupted = errors.New("run interrupted; finished trials are kept")

type runner struct {
	study *study.Study
	graph *workload.Graph
	opts  Options
	run   *results.Run
	plan  []study.Trial
	// capacities[experiment][mesh] lists the capacity each repeat measured.
	capacities map[string]map[string][]float64
	// backoffs[experiment] says why each back-off of its rate was taken (see backOff);
	// rateNoted[experiment] is set once its rate was said.
	backoffs  map[string][]string
	rateNoted map[string]bool
	progress  *progress
	// substrate says where the run measures, as stored with it.
	substrate string
	// cluster is the Kubernetes cluster the run measures on, for provenance; nil on
	// the local substrate.
	cluster *results.ClusterProvenance
	// startCPUs is the CPU mask meshmark had before the placement pinned it.
	startCPUs *unix.CPUSet
	// cpuIdle says how idle CPUs waited during the trials (cpuIdleFor), for
	// provenance; cpuIdlePoll is whether trials make them poll.
	cpuIdle     string
	cpuIdlePoll bool
}

// Run executes the study and returns the stored run. On cancellation it returns the run
// so far with ErrInterrupted.
func Run(ctx context.Context, st *study.Study, opts Options) (*results.Run, error) {
	if opts.Store == nil {
		return nil, errors.New("runner: no results store")
	}
	r := &runner{study: st, opts: opts, capacities: map[string]map[string][]float64{}}
	if err := r.prepare(); err != nil {
		return nil, err
	}
	kind, err := platformFor(st)
	if err != nil {
		return nil, err
	}
	h := &Host{r: r}
	if err := kind.Check(h); err != nil {
		return nil, err
	}
	walk, err := kind.Open(ctx, h)
	if err != nil {
		return nil, err
	}
	if err := r.createRun(ctx); err != nil {
		return nil, err
	}
	err = walk(ctx)
	status, reason := results.StatusComplete, ""
	switch {
	case err == nil:
	case ctx.Err() != nil:
		status, reason, err = results.StatusIncomplete, "interrupted", ErrInterrupted
	default:
		status, reason = results.StatusFailed, err.Error()
	}
	// The run's own context may be cancelled; finishing it must still reach the store.
	fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ferr := opts.Store.FinishRun(fctx, r.run.ID, status, reason); ferr != nil {
		err = errors.Join(err, ferr)
	}
	r.run.Status, r.run.StatusReason, r.run.Ended = status, reason, time.Now()
	return r.run, err
}

// prepare resolves the workload and checks every mesh profile and experiment before
// anything is created, so bad input fails in a second, not after an hour.
func (r *runner) prepare() error {
	if err := r.prepareGraph(); err != nil {
		return err
	}
	for i, m := range r.study.Spec.Meshes {
		if err := checkProfile(m); err != nil {
			return fmt.Errorf("%s: spec.meshes[%d] (%s): %w", r.study.File, i, m.Name, err)
		}
	}
	for i, e := range r.study.Spec.Experiments {
		if err := r.checkClient(e); err != nil {
			return fmt.Errorf("%s: spec.experiments[%d] (%s): %w", r.study.File, i, e.Name, err)
		}
	}
	r.plan = r.study.Plan()
	r.substrate = substrateLocal
	r.progress = newProgress(r.opts.Progress, r.opts.Interactive, r.estimate())
	return nil
}

// prepareGraph loads the study's graph with its replica overrides, as prepare does for
// a run.
func (r *runner) prepareGraph() error {
	w := r.study.Spec.Workload
	src := w.Graph
	if w.IsGraphFile() {
		src = r.study.Resolve(w.Graph)
	}
	g, err := workload.Load(src)
	if err != nil {
		return err
	}
	for svc, n := range w.Replicas {
		s := g.Service(svc)
		if s == nil {
			return fmt.Errorf("%s: spec.workload.replicas.%s: graph %s has no service %q", r.study.File, svc, g.Name, svc)
		}
		for _, v := range s.Versions {
			v.Replicas = n
		}
	}
	r.graph = g
	return nil
}

func (r *runner) createRun(ctx context.Context) error {
	raw, _ := r.study.Marshal()
	if r.study.File != "" {
		if b, err := os.ReadFile(r.study.File); err == nil {
			raw = b
		}
	}
	run := &results.Run{
		Study:      r.study.Metadata.Name,
		StudyPath:  r.study.File,
		StudyFile:  raw,
		Status:     results.StatusRunning,
		Started:    time.Now(),
		Seed:       int64(r.study.Spec.Seed),
		OwnerPID:   os.Getpid(),
		Substrate:  r.substrate,
		Provenance: collectProvenance(r.opts.Version, r.study),
		Baseline:   r.study.Spec.Baseline,
	}
	if b := r.study.BaselineMesh(); b != nil && run.Baseline == "" {
		run.Baseline = b.Name
	}
	run.OwnerHost = run.Provenance.Hostname
	run.Provenance.Cluster = r.cluster
	if r.cpuIdle != "" {
		run.Provenance.Placement["cpu-idle"] = r.cpuIdle
	}
	for _, m := range r.study.Spec.Meshes {
		opts := stringOptions(m.Options)
		// How a baseline balanced is part of what its numbers mean; the default is
		// written down, so the report can say it of runs made under another default.
		if p, err := mesh.New(m.Profile, m.Options); err == nil {
			if sp, ok := p.(mesh.Spreader); ok {
				if opts == nil {
					opts = map[string]string{}
				}
				opts["balancing"] = sp.Balancing()
			}
		}
		run.Meshes = append(run.Meshes, results.Mesh{Label: m.Name, Profile: m.Profile, Options: opts})
	}
	if err := r.opts.Store.CreateRun(ctx, run); err != nil {
		return err
	}
	r.run = run
	return nil
}

// precisionRound decides, once the plan has run out, whether the study's precision
// target calls for another round of its last stage: it returns that round, or nil when
// every target is met, when the round would not end within the budget (counted from
// started, when the planned trials were done; a round is assumed to take as long as
// the last one), or when no comparison can be judged. It says which.
func (r *runner) precisionRound(started time.Time) []study.Trial {
	pr := r.study.Spec.Precision
	last := r.plan[len(r.plan)-1]
	round := r.study.ExtraRound(last.Repeat+1, r.plan)
	if len(round) == 0 {
		r.progress.note("precision: the last stage has no load experiment to repeat")
		return nil
	}
	inRound := map[string]bool{}
	for _, t := range round {
		inRound[t.Experiment.Name] = true
	}
	var cs []analysis.Comparison
	for _, c := range analysis.Analyze(r.run, analysis.Options{}, nil).Comparisons {
		if inRound[c.Experiment] {
			cs = append(cs, c)
		}
	}
	sens := map[string]analysis.Sensitivity{}
	for _, x := range analysis.SensitivityOf(cs) {
		sens[string(x.Metric)] = x
	}
	var short, met []string
	current := last.Repeat + 1
	need := current + 1
	for _, tg := range pr.Targets() {
		x, ok := sens[tg.Metric]
		switch {
		case !ok && current < 2:
			// One repeat has no interval (analysis.NoInterval): a second gives one.
			short = append(short, fmt.Sprintf("%s has no interval at 1 repeat (target %.3g%%)", tg.Metric, tg.Pct))
		case !ok:
			r.progress.note(fmt.Sprintf("precision: no comparison gives %s a sensitivity (is there a baseline at every point?); no repeats added", tg.Metric))
			return nil
		case x.Pct > tg.Pct:
			short = append(short, fmt.Sprintf("%s ±%.3g%% (target %.3g%%)", tg.Metric, x.Pct, tg.Pct))
			need = max(need, repeatsFor(x, tg.Pct, current))
		default:
			met = append(met, fmt.Sprintf("%s ±%.3g%%", tg.Metric, x.Pct))
		}
	}
	if len(short) == 0 {
		r.progress.note(fmt.Sprintf("precision met at %d repeats: %s", current, strings.Join(met, ", ")))
		return nil
	}
	// A round lasts about as long as the last repeat of the stage did.
	var roundTook time.Duration
	for i := len(r.run.Trials) - 1; i >= 0; i-- {
		tr := &r.run.Trials[i]
		if tr.Repeat != last.Repeat {
			break
		}
		roundTook = time.Since(tr.Start)
	}
	spent := time.Since(started)
	left := pr.Budget.D() - spent
	if roundTook > left {
		r.progress.note(fmt.Sprintf("precision not met at %d repeats: %s; another round (about %s) would not fit the %s budget (%s spent)",
			current, strings.Join(short, ", "), roundTook.Round(time.Second), pr.Budget, spent.Round(time.Second)))
		return nil
	}
	// As many rounds as the target is estimated to need, so that the analysis, which
	// takes longer the more trials there are, does not run between every two; at most as
	// many as there are already, since an estimate from few repeats is to be checked
	// before it is trusted far; and no more than fit in the budget.
	rounds := min(need-current, current)
	if roundTook > 0 {
		rounds = min(rounds, int(left/roundTook))
	}
	rounds = max(rounds, 1)
	added := round
	for k := 1; k < rounds; k++ {
		added = append(added, r.study.ExtraRound(current+k, append(slices.Clip(r.plan), added...))...)
	}
	what := fmt.Sprintf("adding repeat %d", current+1)
	if rounds > 1 {
		what = fmt.Sprintf("adding repeats %d–%d (about %s; the target is estimated to need %d)", current+1, current+rounds,
			(time.Duration(rounds) * roundTook).Round(time.Second), need)
	}
	r.progress.note(fmt.Sprintf("precision not met at %d repeats: %s; %s", current, strings.Join(short, ", "), what))
	return added
}

// repeatsFor is how many repeats the sensitivity x is estimated to need to reach target
// (%), as analysis.Sensitivity.At scales it; one more than current when it cannot scale
// (intervals within trials) or the target is out of any reach.
func repeatsFor(x analysis.Sensitivity, target float64, current int) int {
	if x.Unit != "repeats" {
		return current + 1
	}
	for n := current + 1; n <= 100*current; n++ {
		if x.At(n) <= target {
			return n
		}
	}
	return 100 * current
}

// supersede flags the trials an attempt stored before its fault (the earlier steps of
// a sweep or search): the attempt is measured again whole, so they are left out too.
func (r *runner) supersede(ctx context.Context, first int) error {
	var ids []int64
	for i := first; i < len(r.run.Trials); i++ {
		tr := &r.run.Trials[i]
		if tr.Result.HasFlag(results.FlagFault) {
			continue
		}
		tr.Result.Flags = append(tr.Result.Flags, results.FlagSuperseded)
		ids = append(ids, tr.ID)
	}
	if len(ids) == 0 {
		return nil
	}
	return r.opts.Store.FlagTrials(ctx, r.run.ID, results.FlagSuperseded, ids...)
}

// flagBackedOff flags every trial of exp measured so far (and not already left out)
// FlagBackedOff: the experiment is measured again at a lower rate.
func (r *runner) flagBackedOff(ctx context.Context, exp *study.Experiment) error {
	var ids []int64
	for i := range r.run.Trials {
		tr := &r.run.Trials[i]
		if tr.Experiment != exp.Name || tr.Result.Excluded() {
			continue
		}
		tr.Result.Flags = append(tr.Result.Flags, results.FlagBackedOff)
		ids = append(ids, tr.ID)
	}
	if len(ids) == 0 {
		return nil
	}
	return r.opts.Store.FlagTrials(ctx, r.run.ID, results.FlagBackedOff, ids...)
}

// tearDown removes a deployment and says how long that took.
func (r *runner) tearDown(d *deployment) {
	if d == nil {
		return
	}
	start := time.Now()
	if err := r.unpin(); err != nil {
		r.progress.note(fmt.Sprintf("tearing %s down on the load generator's CPUs only: %v", d.mesh.Name, err))
	}
	d.close()
	r.progress.note(fmt.Sprintf("%s torn down in %s", d.mesh.Name, time.Since(start).Round(time.Millisecond)))
}

// storeEnrollment keeps a mesh's enrollment check with the run, on either platform;
// a deployment outside a run (meshmark deploy) keeps it nowhere.
func (r *runner) storeEnrollment(ctx context.Context, meshName string, enr mesh.Enrollment) error {
	if r.run == nil {
		return nil
	}
	check, err := json.Marshal(enr)
	if err != nil {
		return err
	}
	if err := r.opts.Store.SetEnrollment(ctx, r.run.ID, meshName, check); err != nil {
		return err
	}
	if rm := r.run.Mesh(meshName); rm != nil {
		rm.Enrollment = check
	}
	return nil
}

// recordEnrollment stores the equivalence check with the run; the first bring-up of
// each mesh also stores its generated configs for provenance.
func (r *runner) recordEnrollment(ctx context.Context, d *deployment, first bool) error {
	if err := r.storeEnrollment(ctx, d.mesh.Name, d.enrollment); err != nil {
		return err
	}
	if !first {
		return nil
	}
	configs := d.profile.Configs()
	names := make([]string, 0, len(configs))
	for n := range configs {
		names = append(names, n)
	}
	sort.Strings(names)
	var gcs []results.GeneratedConfig
	for _, n := range names {
		gcs = append(gcs, results.NewGeneratedConfig(n, d.mesh.Name, d.mesh.Profile, configs[n]))
	}
	return r.addConfigs(ctx, gcs...)
}

// addConfigs keeps generated configurations with the run's provenance; outside a run
// (meshmark deploy) nowhere.
func (r *runner) addConfigs(ctx context.Context, gcs ...results.GeneratedConfig) error {
	if r.run == nil || len(gcs) == 0 {
		return nil
	}
	r.run.Provenance.Configs = append(r.run.Provenance.Configs, gcs...)
	return r.opts.Store.AddConfigs(ctx, r.run.ID, gcs...)
}

func stringOptions(m map[string]any) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}
