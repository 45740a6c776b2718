package runner

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
)

// runExperiment runs one planned trial: one or more load runs (a sweep or search has a
// step per load run), each stored as a results.Trial as soon as it ends.
func (r *runner) runExperiment(ctx context.Context, d *deployment, t *study.Trial) error {
	if t.Experiment.Kind == study.KindSecurity {
		return r.runSecurity(ctx, d, t)
	}
	return r.runLoad(t, r.localLoad(ctx, d, t))
}

// localLoad is the local testbed as a platform for runLoad: requests go to the entry
// service by its name in the load generator's pod, and the generator spins before sends
// only on CPUs of its own.
func (r *runner) localLoad(ctx context.Context, d *deployment, t *study.Trial) Load {
	return Load{
		Target: func(e *study.Experiment, path string) string { return r.targetURL(d, e, path) },
		NoSpin: !ownCPUs(placement(r.study.Spec.Substrate.Local)),
		Measure: func(spec load.Spec, params results.TrialParams) (*load.Result, error) {
			// Idle CPUs poll for the whole trial, from when it shows as running to its
			// stored end, not only while the load runs.
			defer r.holdCPUIdle()()
			return r.measureOn(ctx, t, r.driveLocal(d, t), spec, params)
		},
	}
}

// capacityProbes measure and store one step of a capacity search, however the substrate
// drives load: closed-loop over conns connections, or open-loop at rate.
type capacityProbes struct {
	closed func(conns, step int) (*load.Result, error)
	open   func(rate float64, step int) (*load.Result, error)
}

// Without a search in the study, an open-loop capacity is searched below the
// closed-loop sweep's best throughput: first at derivedSearchStart of it, then by
// bisection to derivedSearchPrecision, never below derivedSearchFloor of it. Usually two
// or three probes, since a target that keeps up in a closed loop at its best rate
// sustains some rate not far below it open-loop.
const (
	derivedSearchStart     = 0.8
	derivedSearchFloor     = 0.5
	derivedSearchPrecision = 10 // %
	// floorRetries is how many times a failed floor probe is run again before the
	// search gives up.
	floorRetries = 2
)

// searchCapacity runs a capacity experiment with the substrate's probes and records the
// capacity it found for the trial's mesh: the best closed-loop throughput (capacity:
// closed-loop), or the highest open-loop rate that meets the SLO without saturating the
// target, searched as the study says or below the closed-loop best.
func (r *runner) searchCapacity(t *study.Trial, probes capacityProbes) error {
	e := t.Experiment
	step := 0
	best := 0.0
	bound := r.capacityErrorBound()
	var refused []string
	for _, c := range e.Connections {
		res, err := probes.closed(c, step)
		if err != nil {
			return err
		}
		step++
		// Throughput made of failures is not capacity: a broken proxy answering fast
		// with errors would otherwise set the rate every later experiment runs at.
		if rate := errorRate(res); rate > bound {
			refused = append(refused, fmt.Sprintf("%d conns: %.0f req/s with %.2f%% errors", c, res.AchievedRate, 100*rate))
			r.progress.note(fmt.Sprintf("warning: %s %s at %d conns failed %.2f%% of its requests (bound %.2f%%); its %.0f req/s is not a capacity",
				t.Mesh.Name, e.Name, c, 100*rate, 100*bound, res.AchievedRate))
			continue
		}
		if res.AchievedRate > best {
			best = res.AchievedRate
		}
	}
	closedBest := best
	s, floor := e.Search, 0.0
	if s == nil && e.CapacityBy != study.CapacityClosedLoop && closedBest > 0 {
		s = &study.Search{Start: derivedSearchStart * closedBest, Max: closedBest, Precision: derivedSearchPrecision}
		floor = derivedSearchFloor * closedBest
		r.progress.note(fmt.Sprintf("capacity %s %s repeat %d: closed-loop best %.0f req/s; searching the open-loop rate it sustains between %.0f and %.0f req/s",
			t.Mesh.Name, e.Name, t.Repeat+1, closedBest, floor, s.Max))
	}
	var missed string // why the last probe that failed did
	if s != nil {
		precision := s.Precision.Fraction()
		if precision <= 0 {
			precision = 0.05
		}
		probe := func(rate float64) (bool, error) {
			res, err := probes.open(rate, step)
			step++
			if err != nil {
				return false, err
			}
			if why := r.sloMiss(res, rate); why != "" {
				missed = fmt.Sprintf("at %.0f req/s %s", rate, why)
				return false, nil
			}
			return true, nil
		}
		// Invariant: lo meets the SLO (or is 0), hi is the highest rate not yet known to.
		lo, hi := s.Start, s.Max
		ok, err := probe(lo)
		if err != nil {
			return err
		}
		if !ok {
			lo, hi = 0, s.Start
			if floor > 0 {
				// A derived search goes no lower than its floor: a target that does not
				// sustain that, or a generator that cannot drive it, is a finding to
				// state, not a capacity to take shares of.
				if ok, err = probe(floor); err != nil {
					return err
				}
				// Failing the floor ends the run, so a failure is confirmed before it is
				// taken: a machine busy with something else for a few seconds (the
				// generator falling behind, or the target's CPU taken) is not the
				// target's capacity. A target that cannot sustain the floor fails it
				// every time.
				for retry := 0; !ok && retry < floorRetries; retry++ {
					r.progress.note(fmt.Sprintf("capacity %s %s repeat %d: the floor probe failed (%s); probing it again",
						t.Mesh.Name, e.Name, t.Repeat+1, missed))
					if ok, err = probe(floor); err != nil {
						return err
					}
				}
				if ok {
					lo = floor
				} else {
					hi = lo
				}
			}
		}
		for n := 0; n < 20 && hi-lo > precision*hi; n++ {
			mid := (lo + hi) / 2
			ok, err := probe(mid)
			if err != nil {
				return err
			}
			if ok {
				lo = mid
			} else {
				hi = mid
			}
		}
		best = lo
	}
	if best <= 0 {
		why := "no search probe met the SLO (" + missed + ")"
		if floor > 0 {
			why = fmt.Sprintf("it did not sustain %.0f%% of its closed-loop best in steady state (%s)", 100*derivedSearchFloor, missed)
		}
		if s == nil {
			why = fmt.Sprintf("every closed-loop trial failed more than %.2f%% of its requests (%s)", 100*bound, strings.Join(refused, "; "))
		}
		return fmt.Errorf("capacity of %s in %s (repeat %d): %s, so there is no capacity to report or to derive rates from",
			t.Mesh.Name, e.Name, t.Repeat+1, why)
	}
	r.addCapacity(e.Name, t.Mesh.Name, best)
	how := "closed-loop best"
	if s != nil {
		how = "open-loop, sustained under the SLO"
	}
	r.progress.note(fmt.Sprintf("capacity %s %s repeat %d: %.0f req/s (%s)", t.Mesh.Name, e.Name, t.Repeat+1, best, how))
	return nil
}

// capacityErrorBound is the highest error rate a capacity trial may have: the study's
// SLO's, or without one the default SLO's, which judges sweeps.
func (r *runner) capacityErrorBound() float64 {
	return r.study.Spec.SLO.Bounds().MaxErrorRate
}

// searchSLO is what a capacity search judges its probes by: the study's SLO, or,
// for a search derived from the closed-loop best without one, no errors at all and the
// default SLO's share of the requested rate served.
func (r *runner) searchSLO() analysis.SLO {
	if r.study.Spec.SLO != nil {
		return r.study.Spec.SLO.Bounds()
	}
	return analysis.SLO{MinAchieved: analysis.DefaultSLO().MinAchieved}
}

func errorRate(res *load.Result) float64 {
	if res.Completed <= 0 {
		return 0
	}
	return float64(res.Errors.Total()) / float64(res.Completed)
}

// sloMiss judges one probe, "" when it met the SLO, else why not: the target must be
// in steady state (a rate it cannot sustain is no capacity, however briefly it served
// it), the rate served inside the window, percentiles and error rate within the SLO
// (without one, no errors). A load generator that fell behind fails no probe by itself:
// its lag only adds to the latency, measured from the intended send times, and bunches
// the arrivals, so a probe that met all of this despite it was sustained; when a probe
// fails, the reason says the generator fell behind too, since that may be why.
func (r *runner) sloMiss(res *load.Result, rate float64) string {
	why := r.sloMissTarget(res, rate)
	if why != "" && res.Health.Bottleneck {
		why += " (and the load generator fell behind: " + strings.Join(res.Health.Why, "; ") + ")"
	}
	return why
}

func (r *runner) sloMissTarget(res *load.Result, rate float64) string {
	if res.TargetSaturated() {
		return "the target saturated: " + convertSaturation(res.Saturation).String()
	}
	probe := analysis.Observed{ErrorRate: errorRate(res), Throughput: res.AchievedRate, RequestedRate: rate}
	if res.Latency.Histogram != nil {
		probe.Latency = res.Latency.Quantile
	}
	if miss := r.searchSLO().Judge(probe); len(miss) > 0 {
		return miss[0].Why
	}
	return ""
}

func (r *runner) addCapacity(exp, mesh string, v float64) {
	if r.capacities[exp] == nil {
		r.capacities[exp] = map[string][]float64{}
	}
	r.capacities[exp][mesh] = append(r.capacities[exp][mesh], v)
}

// rateOf resolves an experiment's rate. A relative rate is a share of the capacity
// every repeat of the mesh sustained (the lowest of its repeats; the plan runs capacity
// stages first), lowered by the back-offs the experiment has taken (see backOff).
func (r *runner) rateOf(e *study.Experiment, mesh string) (float64, bool, error) {
	if e.Rate.IsZero() {
		return 0, false, nil
	}
	if !e.Rate.IsRelative() {
		return e.Rate.PerSecond, true, nil
	}
	caps := map[string]float64{}
	for m, vs := range r.capacities[e.CapacityFrom] {
		caps[m] = slices.Min(vs)
	}
	v, err := e.Rate.Resolve(caps)
	if err != nil {
		return 0, false, fmt.Errorf("experiment %s: %w", e.Name, err)
	}
	v *= math.Pow(1-backoffStep, float64(len(r.backoffs[e.Name])))
	// Whole requests per second: a rate like 428.125 suggests a precision capacity
	// measurements do not have.
	rate := max(1, math.Round(v))
	if !r.rateNoted[e.Name] {
		if r.rateNoted == nil {
			r.rateNoted = map[string]bool{}
		}
		r.rateNoted[e.Name] = true
		r.progress.note(fmt.Sprintf("%s at %s = %.0f req/s; %s", e.Name, e.Rate, rate, r.capacitySpread(e.CapacityFrom)))
	}
	return rate, true, nil
}

// capacitySpread says what each mesh sustained in each repeat of a capacity
// experiment: "capacity per repeat: baseline 498-530 (512, 530, 498), ...".
func (r *runner) capacitySpread(exp string) string {
	var parts []string
	for _, m := range r.study.Spec.Meshes {
		vs := r.capacities[exp][m.Name]
		if len(vs) == 0 {
			continue
		}
		each := make([]string, len(vs))
		for i, v := range vs {
			each[i] = strconv.FormatFloat(math.Round(v), 'f', -1, 64)
		}
		parts = append(parts, fmt.Sprintf("%s %.0f–%.0f (%s)", m.Name, slices.Min(vs), slices.Max(vs), strings.Join(each, ", ")))
	}
	return fmt.Sprintf("capacity in req/s over the repeats of %s, lowest sustained by every repeat: %s", exp, strings.Join(parts, "; "))
}

// rateParams is what a trial at a relative rate stores about it: where the rate came
// from, and the back-offs that lowered it.
func (r *runner) rateParams(e *study.Experiment) map[string]string {
	if !e.Rate.IsRelative() {
		return nil
	}
	out := map[string]string{"rate_basis": e.Rate.String() + "; " + r.capacitySpread(e.CapacityFrom)}
	if b := r.backoffs[e.Name]; len(b) > 0 {
		out["backoff"] = fmt.Sprintf("%d × %.0f%%: %s", len(b), 100*backoffStep, strings.Join(b, "; "))
	}
	return out
}

// Back-off: when a trial at a relative rate saturates its target, the rate was not
// below every mesh's knee after all (capacity varies between bring-ups). The runner
// then lowers the experiment's rate by backoffStep and measures the experiment again
// from its first trial, every mesh and repeat at the new rate, at most maxBackoffs
// times; the trials at the old rate stay stored, flagged FlagBackedOff and left out.
// After the last back-off a saturated trial stays in, flagged, and its point's
// verdicts say "saturated".
const (
	backoffStep = 0.10
	maxBackoffs = 3
)

// backoffError asks execute to measure an experiment again at a lower rate.
type backoffError struct {
	exp *study.Experiment
}

func (b *backoffError) Error() string {
	return fmt.Sprintf("experiment %s saturated its target; measured again at a lower rate", b.exp.Name)
}

// backOff returns a backoffError when the trial that produced res ran at a relative
// rate, saturated its target and back-offs remain; it says why in the progress output.
func (r *runner) backOff(t *study.Trial, res *load.Result, rate float64) error {
	e := t.Experiment
	if !e.Rate.IsRelative() || res == nil || !res.TargetSaturated() {
		return nil
	}
	if !res.Saturation.Overloaded {
		r.progress.note(fmt.Sprintf("%s on %s (repeat %d) stalled on its target's connections at %.0f req/s; a lower rate would not cure that, so it is not backed off; the trial stays flagged",
			e.Name, t.Mesh.Name, t.Repeat+1, rate))
		return nil
	}
	done := r.backoffs[e.Name]
	if len(done) >= maxBackoffs {
		r.progress.note(fmt.Sprintf("%s on %s (repeat %d) saturated its target at %.0f req/s after %d back-offs; the trial stays flagged and its point's verdicts say saturated",
			e.Name, t.Mesh.Name, t.Repeat+1, rate, len(done)))
		return nil
	}
	if r.backoffs == nil {
		r.backoffs = map[string][]string{}
	}
	why := fmt.Sprintf("%s saturated at %.0f req/s in repeat %d (%s)", t.Mesh.Name, rate, t.Repeat+1, convertSaturation(res.Saturation))
	r.backoffs[e.Name] = append(done, why)
	next, _, _ := r.rateOf(e, t.Mesh.Name)
	r.progress.note(fmt.Sprintf("back-off %d of %d: %s; measuring %s again for every mesh and repeat at %.0f req/s (%.0f%% lower)",
		len(done)+1, maxBackoffs, why, e.Name, next, 100*backoffStep))
	return &backoffError{exp: e}
}

// targetURL is where the experiment sends requests on the local testbed: path on the
// entry service, or on the ingress gateway in front of it, by the name the load
// generator's pod knows it by (the mesh's own, where it has one).
func (r *runner) targetURL(d *deployment, e *study.Experiment, path string) string {
	if e.Path == study.PathIngress {
		return "http://" + gateway.Service + ":" + strconv.Itoa(gateway.Port) + path
	}
	if ma, ok := d.profile.(mesh.Addressing); ok {
		if authority, _, ok := ma.CalleeAddress(d.client, d.entry.Service); ok {
			return "http://" + authority + path // the mesh's own name for the entry
		}
	}
	return "http://" + d.entry.Service + ":" + strconv.Itoa(d.entry.Port) + path
}

// generatorResolve is where the load generator's pod dials each name a load may use,
// as `generator --resolve HOST:PORT:ADDR` takes it: every service of the testbed by its
// name and port to its virtual IP, and by the mesh's own name for it (mesh.Addressing)
// to where the mesh has that name lead from the generator's pod. Nothing else resolves,
// so load cannot leave the namespaces meshmark created.
func generatorResolve(d *deployment) []string {
	var out []string
	ma, _ := d.profile.(mesh.Addressing)
	for _, s := range d.app.Services {
		port := strconv.Itoa(s.Port)
		out = append(out, s.Name+":"+port+":"+net.JoinHostPort(s.VIP.String(), port))
		if ma == nil {
			continue
		}
		if authority, dial, ok := ma.CalleeAddress(d.client, s.Name); ok {
			if ip, err := netip.ParseAddrPort(dial); err == nil && testbedRange.Contains(ip.Addr()) {
				out = append(out, authority+":"+dial)
			}
		}
	}
	return out
}

var testbedRange = netip.MustParsePrefix("198.18.0.0/15")
