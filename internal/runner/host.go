package runner

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/workload"
)

// PlatformKind is a platform as it registers itself: everything about it is in its own
// package (the local testbed's, the embedded default, in this one), and the runner
// knows it by the substrate a study names.
type PlatformKind struct {
	// Substrate is the study's spec.substrate key that asks for the platform.
	Substrate string
	// Check refuses, before anything is created and without reaching the platform,
	// what it cannot do of the study h runs, at the study file's field: for `meshmark
	// validate` and the start of a run.
	Check func(h *Host) error
	// Open reaches the platform, checks that it can host the run and records, with
	// Host.Describe, what the run is stored with; it returns the walk of the plan over
	// the platform (Walk with its Platform). It runs before the run is stored.
	Open func(ctx context.Context, h *Host) (walk func(ctx context.Context) error, err error)
}

var (
	platformsMu sync.Mutex
	platforms   = map[string]PlatformKind{}
)

// RegisterPlatform makes a platform known to every run; a package registers its own
// in init. A second registration of one substrate panics, as two packages claiming it
// is a build mistake.
func RegisterPlatform(k PlatformKind) {
	platformsMu.Lock()
	defer platformsMu.Unlock()
	if _, dup := platforms[k.Substrate]; dup {
		panic("runner: platform for substrate " + k.Substrate + " registered twice")
	}
	platforms[k.Substrate] = k
}

// substrateLocal is the embedded platform's substrate: the local testbed.
const substrateLocal = "local"

// platformFor is the registered platform the study asks for, or an error at the
// study's substrate when no package of this build registered it.
func platformFor(st *study.Study) (*PlatformKind, error) {
	name := st.Spec.Substrate.Name()
	platformsMu.Lock()
	defer platformsMu.Unlock()
	k, ok := platforms[name]
	if !ok {
		return nil, st.ErrorAt("spec.substrate."+name, fmt.Errorf("this meshmark has no platform for substrate %s built in", name))
	}
	return &k, nil
}

// Check says what a run of st would refuse on its platform, at the field that asks
// for it, without reaching the platform: for `meshmark validate`, so that it says what
// run will do. (The local testbed's own checks need the machine: preflight, at the
// start of a run.)
func Check(st *study.Study) error {
	kind, err := platformFor(st)
	if err != nil {
		return err
	}
	h, err := NewHost(st, Options{}, nil)
	if err != nil {
		return err
	}
	return kind.Check(h)
}

// Host is a run as a platform sees it: the study and its graph, the run's options,
// store and progress display, and the runner's one translation of experiments into
// load and one assembly of trials. A Host from NewHost has no run (meshmark deploy):
// what would be stored with it is then kept nowhere.
type Host struct{ r *runner }

// NewHost is a host with no run, for bringing a study's deployments up without
// measuring them; progress, when not nil, receives one line per step.
func NewHost(st *study.Study, opts Options, progress io.Writer) (*Host, error) {
	r := &runner{study: st, opts: opts, progress: newProgress(progress, false, 0)}
	if err := r.prepareGraph(); err != nil {
		return nil, err
	}
	return &Host{r: r}, nil
}

// Study is the study being run.
func (h *Host) Study() *study.Study { return h.r.study }

// Graph is the study's workload graph, with its replica overrides.
func (h *Host) Graph() *workload.Graph { return h.r.graph }

// Options are the run's.
func (h *Host) Options() Options { return h.r.opts }

// RunID is the stored run's id, or "" without one.
func (h *Host) RunID() string {
	if h.r.run == nil {
		return ""
	}
	return h.r.run.ID
}

// Note says something on the progress display.
func (h *Host) Note(s string) { h.r.progress.note(s) }

// Phase starts a phase of the run on the progress display.
func (h *Host) Phase(s string) { h.r.progress.phase(s) }

// Describe records where the run measures, before it is stored: the substrate's name
// and, on a cluster, the cluster's provenance.
func (h *Host) Describe(substrate string, cluster *results.ClusterProvenance) {
	h.r.substrate, h.r.cluster = substrate, cluster
}

// StoreEnrollment keeps a mesh's enrollment check with the run.
func (h *Host) StoreEnrollment(ctx context.Context, meshName string, enr mesh.Enrollment) error {
	return h.r.storeEnrollment(ctx, meshName, enr)
}

// AddConfigs keeps generated configurations with the run's provenance.
func (h *Host) AddConfigs(ctx context.Context, gcs ...results.GeneratedConfig) error {
	return h.r.addConfigs(ctx, gcs...)
}

// UpdateProvenance lets edit change the run's provenance, and stores it when edit
// says it changed it. Without a run, edit is not called.
func (h *Host) UpdateProvenance(ctx context.Context, edit func(p *results.Provenance) (changed bool)) error {
	if h.r.run == nil || !edit(&h.r.run.Provenance) {
		return nil
	}
	return h.r.opts.Store.SetProvenance(ctx, h.r.run.ID, h.r.run.Provenance)
}

// RunLoad runs trial t's load runs on a platform, each turned into load once, by the
// runner, and stored as soon as it ends.
func (h *Host) RunLoad(t *study.Trial, p Load) error { return h.r.runLoad(t, p) }

// MeasureOn drives one load run of trial t with drive and stores it as a trial, with
// its flags, evidence and faults: the MeasureLoad of a platform's Load.
func (h *Host) MeasureOn(ctx context.Context, t *study.Trial, drive Drive, spec load.Spec, params results.TrialParams) (*load.Result, error) {
	return h.r.measureOn(ctx, t, drive, spec, params)
}

// ProbeSpec is the load of a short open-loop run of e at rate for length, with no
// warm-up, to the platform's target: what a platform sends to prove its deployment
// before it is measured.
func (h *Host) ProbeSpec(e *study.Experiment, target Target, rate float64, length time.Duration) (load.Spec, error) {
	return h.r.loadSpec(&study.Trial{Experiment: e}, Load{Target: target}, loadRun{rate: rate, length: length})
}

// ClientProtocol is the protocol the load generator speaks to the entry service in e.
func (h *Host) ClientProtocol(e study.Experiment) study.ClientProtocol { return h.r.clientProtocol(e) }
