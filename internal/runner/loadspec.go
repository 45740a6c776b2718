package runner

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
)

// An experiment becomes load once, here, for every platform: runLoad walks a trial's
// load runs (one per rate, step, connection count or capacity probe) and loadSpec turns
// each into the load.Spec that the platform's generators run, the local testbed's one
// generator process or a cluster's generator pods alike. A platform brings only where
// the requests go (Target), whether its generator may spin, and how it measures and
// stores a run (MeasureLoad, which measureOn turns into a trial).

// Target is where a platform's generators send an experiment's requests: the URL of
// path on the entry service (or on the ingress gateway in front of it). path is
// absolute.
type Target func(e *study.Experiment, path string) string

// MeasureLoad drives one load run on a platform and stores it as a trial.
type MeasureLoad func(spec load.Spec, params results.TrialParams) (*load.Result, error)

// loadRun is one load run of an experiment.
type loadRun struct {
	// rate is the open model's; 0 runs the closed model over conns, or the users.
	rate float64
	// conns are the open model's connections opened up front, or the closed model's.
	conns int
	// capInFlight caps the open model's requests in flight at conns (a connections
	// experiment with a rate measures what conns connections carry at that rate).
	capInFlight bool
	users       bool
	// length is measured after warmup.
	length, warmup time.Duration
}

// Load is what a platform brings to the translation.
type Load struct {
	Target Target
	// NoSpin keeps the open model from spinning before sends, where the generator
	// shares its CPUs with the system under test.
	NoSpin  bool
	Measure MeasureLoad
}

// runLoad runs a trial's load runs on a platform, each stored as soon as it ends. A run
// at a relative rate that saturated its target asks for the experiment again at a lower
// rate (backOff's *backoffError), which the platform's plan walk carries out.
func (r *runner) runLoad(t *study.Trial, p Load) error {
	e := t.Experiment
	run := func(lr loadRun, params results.TrialParams) (*load.Result, error) {
		spec, err := r.loadSpec(t, p, lr)
		if err != nil {
			return nil, fmt.Errorf("experiment %s: %w", e.Name, err)
		}
		return p.Measure(spec, params)
	}
	rate, hasRate, err := r.rateOf(e, t.Mesh.Name)
	if err != nil {
		return err
	}
	length, warmup := e.Duration.D(), e.Warmup.D()
	switch e.Kind {
	case study.KindCapacity:
		return r.searchCapacity(t, capacityProbes{
			closed: func(conns, step int) (*load.Result, error) {
				return run(loadRun{conns: conns, length: length, warmup: warmup}, results.TrialParams{Connections: conns, Step: step})
			},
			open: func(rate float64, step int) (*load.Result, error) {
				return run(loadRun{rate: rate, conns: firstConns(e), length: length, warmup: warmup},
					results.TrialParams{RequestedRate: rate, Step: step, Extra: map[string]string{"search": "probe"}})
			},
		})
	case study.KindSteps:
		for i, rate := range e.StepRates() {
			warm := time.Duration(0)
			if i == 0 {
				warm = warmup
			}
			if _, err := run(loadRun{rate: rate, conns: firstConns(e), length: e.Each.D(), warmup: warm}, results.TrialParams{RequestedRate: rate, Step: i}); err != nil {
				return err
			}
		}
		return nil
	case study.KindConnections:
		for i, conns := range e.Connections {
			lr := loadRun{conns: conns, length: length, warmup: warmup}
			params := results.TrialParams{Connections: conns, Step: i}
			if hasRate {
				lr.rate, lr.capInFlight = rate, true
				params.RequestedRate = rate
				params.Extra = r.rateParams(e)
			}
			res, err := run(lr, params)
			if err != nil {
				return err
			}
			if err := r.backOff(t, res, params.RequestedRate); err != nil {
				return err
			}
		}
		return nil
	case study.KindUsers:
		_, err := run(loadRun{users: true, length: length, warmup: warmup}, results.TrialParams{Users: e.Users})
		return err
	default: // fixed-rate, soak
		if !hasRate {
			return fmt.Errorf("experiment %s: no rate", e.Name)
		}
		res, err := run(loadRun{rate: rate, conns: firstConns(e), length: length, warmup: warmup}, results.TrialParams{RequestedRate: rate, Extra: r.rateParams(e)})
		if err != nil {
			return err
		}
		return r.backOff(t, res, rate)
	}
}

// firstConns is the connections an open-model experiment opens up front: the first of
// its list, if any.
func firstConns(e *study.Experiment) int {
	if len(e.Connections) > 0 {
		return e.Connections[0]
	}
	return 0
}

// judgedIntervals is how many intervals a short trial's window is cut into at the least,
// so that the saturation rules (load.DetectSaturation), which read the backlog at every
// interval's end, have a trend to read: with the engine's 1 s a trial of many short
// paired blocks, as the demo runs, had one interval per block and was never judged.
const judgedIntervals = 5

// loadInterval is the load engine's interval for a window after a warm-up: 1 s, or a
// judgedIntervals-th of a window shorter than judgedIntervals seconds (no less than
// 100 ms), shortened so that the warm-up is a whole number of intervals. The rules
// compare the backlog with what it was as the warm-up ended; an interval that closed
// after it left them the run's start to compare with, when nothing was due yet, and
// then the backlog of a target that keeps up counted as growth.
func loadInterval(window, warmup time.Duration) time.Duration {
	base := time.Second
	if window > 0 && window < judgedIntervals*time.Second {
		base = max(window/judgedIntervals, 100*time.Millisecond)
	}
	if warmup >= 100*time.Millisecond {
		k := (warmup + base - 1) / base
		base = warmup / k
	}
	return base
}

// loadSpec is the load of one run of the trial's experiment: its request in the
// experiment's protocol to the platform's target, its model, its timing.
func (r *runner) loadSpec(t *study.Trial, p Load, lr loadRun) (load.Spec, error) {
	e := t.Experiment
	cfg := load.Config{
		Request:          load.Request{Method: "GET", URL: p.Target(e, r.entryPath(r.study.Spec.Workload.Entrypoint))},
		Duration:         lr.length + lr.warmup,
		Interval:         loadInterval(lr.length, lr.warmup),
		Count:            int64(e.Requests),
		Warmup:           lr.warmup,
		DisableKeepAlive: !e.KeepAlive,
	}
	switch {
	case lr.users:
		um := &load.UsersModel{
			Users:      e.Users,
			SpawnRate:  e.SpawnRate,
			Think:      load.Think{Min: e.ThinkTime.Min, Max: e.ThinkTime.Max},
			Iterations: e.RequestsPerUser,
			// Every mesh and experiment of a repeat meets the same users, who wait,
			// choose and arrive alike (common random numbers), so what differs between
			// them is the system's doing, not the draw's; each repeat draws anew.
			Seed: usersSeed(r.study.Spec.Seed, t.Repeat),
		}
		for _, task := range e.Tasks {
			req := cfg.Request
			req.Method = task.Method
			req.URL = p.Target(e, r.entryPath(task.Path))
			um.Tasks = append(um.Tasks, load.Task{Name: task.Name, Weight: task.Weight, Request: req})
		}
		cfg.Users = um
	case lr.rate > 0:
		arrival := load.Constant
		if e.Arrival == study.ArrivalPoisson {
			arrival = load.Poisson
		}
		cfg.Open = &load.OpenModel{
			Schedule:    load.ScheduleSpec{Arrival: arrival, Rate: lr.rate, Seed: r.study.Spec.Seed},
			Connections: lr.conns,
		}
		if lr.capInFlight {
			cfg.Open.MaxInFlight = lr.conns
		}
		if p.NoSpin {
			cfg.Open.SpinWindow = -1
		}
	default:
		cfg.Closed = &load.ClosedModel{Connections: lr.conns}
	}
	spec := load.NewSpec(cfg)
	if e.Streams > 1 {
		spec.Streams = e.Streams
	}
	switch r.clientProtocol(*e) {
	case study.ProtocolH2C:
		spec.Protocol = load.ProtocolH2C
	case study.ProtocolGRPC:
		// A call of the entry path's method (workload.CallMethod unless the path names
		// one), which gRPC carries as the URL's path.
		u, err := url.Parse(spec.Request.URL)
		if err != nil {
			return spec, err
		}
		u.Path = grpcMethodOf(u.Path)
		spec.Request.URL, spec.Request.Method, spec.Protocol = u.String(), "POST", load.ProtocolGRPC
	default:
		spec.Protocol = load.ProtocolHTTP1
	}
	return spec, nil
}

// entryPath is the path requests take: path, else the graph's entry path, else /.
func (r *runner) entryPath(path string) string {
	if path == "" {
		path = r.graph.Entrypoint().Path
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return path
}

// specParams records with a trial what its load sent: the URL, method and protocol.
func specParams(params *results.TrialParams, e *study.Experiment, spec load.Spec) {
	if params.Extra == nil {
		params.Extra = map[string]string{}
	}
	params.KeepAlive = !spec.DisableKeepAlive
	params.Path = string(e.Path)
	if e.Streams > 1 {
		params.Extra["streams"] = fmt.Sprint(e.Streams)
	}
	method := spec.Request.Method
	if method == "" {
		method = "GET"
	}
	params.Extra["url"], params.Extra["method"], params.Extra["protocol"] = spec.Request.URL, method, protocolLabels[protocolOf(spec)]
}

// protocolOf is the study's name for the protocol a spec's load speaks.
func protocolOf(spec load.Spec) study.ClientProtocol {
	switch spec.Protocol {
	case load.ProtocolH2C:
		return study.ProtocolH2C
	case load.ProtocolGRPC:
		return study.ProtocolGRPC
	}
	return study.ProtocolHTTP1
}

// usersSeed is the seed of a trial's Locust-like users: the study's, moved on by the
// repeat alone. A generator pod moves it on by its index times 0x9e3779b97f4a7c15
// (loadgen), so a repeat moves it by another stride, and no repeat's users are another
// generator's.
func usersSeed(studySeed uint64, repeat int) uint64 {
	return studySeed + uint64(repeat)<<32
}
