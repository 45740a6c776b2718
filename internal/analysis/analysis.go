// Package analysis turns stored trials into answers: pooled percentiles (histograms
// are merged across repeats, percentiles are never averaged), overhead of each mesh
// against the baseline as Δ and % with t confidence intervals over repeats (see
// studentT), a noise floor, better/worse/equal/inconclusive verdicts, capacity under
// an SLO, outlier flags and regression gates between two runs.
package analysis

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// Metric is a quantity compared between meshes.
type Metric string

const (
	P50        Metric = "p50"
	P90        Metric = "p90"
	P95        Metric = "p95" // not in DefaultMetrics: compared where a study published it (S4)
	P99        Metric = "p99"
	P999       Metric = "p99.9"
	Throughput Metric = "throughput"
	ErrorRate  Metric = "error_rate"
)

// DefaultMetrics are compared unless Options.Metrics says otherwise.
var DefaultMetrics = []Metric{P50, P90, P99, P999, Throughput, ErrorRate}

// Percentile is the latency percentile a metric reads, or -1 for non-latency metrics.
func (m Metric) Percentile() float64 {
	switch m {
	case P50:
		return 50
	case P90:
		return 90
	case P95:
		return 95
	case P99:
		return 99
	case P999:
		return 99.9
	}
	return -1
}

// HigherIsBetter is true for throughput; latency and error rate are better lower.
func (m Metric) HigherIsBetter() bool { return m == Throughput }

// Unit is the unit of the metric's values: "µs", "req/s" or "" (a fraction).
func (m Metric) Unit() string {
	switch {
	case m.Percentile() >= 0:
		return results.HistogramUnitSymbol
	case m == Throughput:
		return "req/s"
	}
	return ""
}

// Verdict says how a mesh compares on one metric.
type Verdict string

const (
	Better Verdict = "better"
	Worse  Verdict = "worse"
	// Equal: the whole confidence interval of the difference lies within the metric's
	// practical-equivalence margin (see DefaultMargins): whatever the difference is,
	// it is too small to matter.
	Equal        Verdict = "equal"
	Inconclusive Verdict = "inconclusive"
	// Saturated: the system under test could not keep up with the load in some trial
	// of either group (results.FlagTargetSaturated), so the latencies compared are
	// those of a growing queue, not of the meshes at this rate; no verdict is given.
	Saturated Verdict = "saturated"
	// NoInterval: a group had fewer than two repeats, so nothing measured how much
	// the difference varies from repeat to repeat, and no interval would hold its
	// stated level.
	NoInterval Verdict = "inconclusive: too few repeats for an interval"
	// TooFewRequests: a trial of either group had fewer requests than the percentile
	// needs to lie inside its sample (100 for p99, 1000 for p99.9), so each trial's
	// figure is its slowest request, whose spread over trials no interval of these
	// repeats holds: a one-second block of 150 requests has no p99.9 of its own.
	TooFewRequests Verdict = "inconclusive: too few requests per trial for this percentile"
)

// DefaultMargins are the practical-equivalence margins: a difference smaller than this
// is not one anyone should act on, however sure the interval is. Latency and
// throughput margins are relative (% of the reference); the error-rate margin is
// absolute, in percentage points, because a relative change against a zero error rate
// is undefined. Tail percentiles get wider margins: their estimates move more.
var DefaultMargins = map[Metric]float64{
	P50:        2,   // %
	P90:        2,   // %
	P95:        3,   // %
	P99:        3,   // %
	P999:       5,   // %
	Throughput: 1,   // % (at a fixed rate, the achieved rate is the requested one)
	ErrorRate:  0.1, // percentage points
}

// AbsoluteMargin reports whether the metric's margin is in its own unit (percentage
// points of a fraction) rather than relative.
func (m Metric) AbsoluteMargin() bool { return m == ErrorRate }

// Options tune the analysis. The zero value means the defaults.
type Options struct {
	// Confidence is the two-sided interval level (default 0.95).
	Confidence float64
	// Seed seeds an interval method that resamples (the bootstraps the coverage test
	// plugs in); studentT draws no random numbers, so the same trials always give the
	// same intervals.
	Seed    uint64
	Metrics []Metric
	// TukeyK is the fence multiplier for outlier trials (default 1.5).
	TukeyK float64
	// Margins override DefaultMargins per metric (see Equal); a metric not named
	// keeps its default.
	Margins map[Metric]float64
	// Unpaired treats the two groups of a comparison as independent even when their
	// repeats ran interleaved in blocks (see pairedByRepeat); for measuring what the
	// pairing gains.
	Unpaired bool

	// method computes the intervals (studentT unless a test plugs in another).
	method intervalMethod
}

// Margin is the practical-equivalence margin of a metric under these options.
func (o Options) Margin(m Metric) float64 {
	if v, ok := o.Margins[m]; ok {
		return v
	}
	return DefaultMargins[m]
}

func (o Options) withDefaults() Options {
	if o.Confidence <= 0 || o.Confidence >= 1 {
		o.Confidence = 0.95
	}
	if len(o.Metrics) == 0 {
		o.Metrics = DefaultMetrics
	}
	if o.method == nil {
		o.method = studentT{}
	}
	if o.TukeyK <= 0 {
		o.TukeyK = 1.5
	}
	return o
}

// Key identifies a group of trials that measure the same thing: one mesh, one
// experiment, one step of it; the group's trials are its repeats.
type Key struct {
	Mesh       string `json:"mesh"`
	Experiment string `json:"experiment"`
	Step       int    `json:"step"`
}

// Point identifies a measuring point regardless of mesh.
type Point struct {
	Experiment string `json:"experiment"`
	Step       int    `json:"step"`
}

// Estimate is a point value with a confidence interval.
type Estimate struct {
	Value float64 `json:"value"`
	Lo    float64 `json:"lo"`
	Hi    float64 `json:"hi"`
}

// MarshalJSON writes NaN bounds (a relative change against zero) as null.
func (e Estimate) MarshalJSON() ([]byte, error) {
	f := func(v float64) *float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		Value *float64 `json:"value"`
		Lo    *float64 `json:"lo"`
		Hi    *float64 `json:"hi"`
	}{f(e.Value), f(e.Lo), f(e.Hi)})
}

// UnmarshalJSON reads null bounds back as NaN.
func (e *Estimate) UnmarshalJSON(b []byte) error {
	var v struct{ Value, Lo, Hi *float64 }
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	g := func(p *float64) float64 {
		if p == nil {
			return math.NaN()
		}
		return *p
	}
	*e = Estimate{g(v.Value), g(v.Lo), g(v.Hi)}
	return nil
}

// ExcludesZero reports whether the interval lies strictly on one side of zero.
func (e Estimate) ExcludesZero() bool { return e.Lo > 0 || e.Hi < 0 }

// Contains reports whether v lies in the interval.
func (e Estimate) Contains(v float64) bool { return e.Lo <= v && v <= e.Hi }

// Group is the pooled view of one Key.
type Group struct {
	Key
	Kind   string              `json:"kind"`
	Params results.TrialParams `json:"params"`
	Label  string              `json:"label"` // "1000 rps", "64 conns", ...
	// Trials are the repeats, ordered by repeat.
	Trials   []*results.Trial `json:"-"`
	TrialIDs []int64          `json:"trial_ids"`
	Repeats  int              `json:"repeats"`
	Requests int64            `json:"requests"`
	Errors   int64            `json:"errors"`
	// Pooled percentiles of the merged latency histogram, µs.
	P50             int64   `json:"p50_us"`
	P90             int64   `json:"p90_us"`
	P95             int64   `json:"p95_us"`
	P99             int64   `json:"p99_us"`
	P999            int64   `json:"p999_us"`
	Max             int64   `json:"max_us"`
	Throughput      float64 `json:"throughput"`
	ErrorRate       float64 `json:"error_rate"`
	GeneratorBehind int     `json:"generator_behind"` // trials whose generator fell behind
	ProxyBypassed   int     `json:"proxy_bypassed"`   // trials in which traffic went around the mesh
	// Saturated counts trials whose target could not keep up (see Saturated).
	Saturated int `json:"saturated"`
	// Failures is how many requests failed without a response; the latencies count
	// them at their time to failure (in runs stored since meshmark timed them).
	Failures int64 `json:"failures"`
	// Outliers are ids of trials outside Tukey's fences on trial p99 (kept, not removed).
	Outliers []int64 `json:"outliers,omitempty"`
	// MixedParams is set when the repeats of this step ran with different load
	// parameters (e.g. a rate search probing different rates at the same step index):
	// pooling them is then questionable and reports should say so.
	MixedParams bool `json:"mixed_params,omitempty"`

	// perTrial holds each metric's value in each trial, in the order of Trials: the
	// intervals are computed from how these vary (see studentT).
	perTrial map[Metric][]float64
	// latency is the trials' histograms as counts, for each trial's share of the
	// pooled percentiles (see contributions).
	latency *latencyCounts
}

// Value returns the group's pooled value of a metric.
func (g *Group) Value(m Metric) float64 {
	switch m {
	case P50:
		return float64(g.P50)
	case P90:
		return float64(g.P90)
	case P95:
		return float64(g.P95)
	case P99:
		return float64(g.P99)
	case P999:
		return float64(g.P999)
	case Throughput:
		return g.Throughput
	case ErrorRate:
		return g.ErrorRate
	}
	return math.NaN()
}

// Comparison is one metric of one mesh against a reference (the baseline mesh, or
// the same mesh in an older run).
type Comparison struct {
	Point
	Label     string  `json:"label"`
	Mesh      string  `json:"mesh"`
	Reference string  `json:"reference"`
	Metric    Metric  `json:"metric"`
	Base      float64 `json:"base"`  // reference pooled value
	Value     float64 `json:"value"` // this mesh's pooled value
	// Delta is Value-Base in the metric's unit; Pct is 100·Delta/Base (NaN when Base
	// is 0).
	Delta Estimate `json:"delta"`
	Pct   Estimate `json:"pct"`
	// NoiseFloorPct is the relative change noise alone produces (see NoiseFloor).
	NoiseFloorPct float64 `json:"noise_floor_pct"`
	NoiseSource   string  `json:"noise_source"`
	// Margin is the practical-equivalence margin applied (% of Base, or percentage
	// points for the error rate; see DefaultMargins).
	Margin  float64 `json:"margin"`
	Verdict Verdict `json:"verdict"`
	// Unit is what the interval's spread was measured over: "repeats" (each an
	// interleaved block when Paired), or "" when there is no interval (NoInterval).
	Unit string `json:"unit"`
	// Paired says the difference was taken repeat by repeat, one repeat's trial of
	// each group together, because they ran in the same interleaved block.
	Paired bool `json:"paired,omitempty"`
	// Method names how the interval was computed, e.g. "paired t on 100 interleaved
	// blocks of 1s" (see studentT).
	Method      string `json:"method"`
	Repeats     int    `json:"repeats"`
	BaseRepeats int    `json:"base_repeats"`
}

// Report is everything Analyze finds in one run.
type Report struct {
	RunID       string       `json:"run_id"`
	Baseline    string       `json:"baseline"`
	Options     Options      `json:"options"`
	Groups      []*Group     `json:"groups"`
	Comparisons []Comparison `json:"comparisons"`
	// Sensitivity is, per metric, the smallest difference the comparisons could tell
	// apart (see SensitivityOf).
	Sensitivity []Sensitivity `json:"sensitivity,omitempty"`
	Winners     []Winner      `json:"winners"`
	Capacity    []Capacity    `json:"capacity,omitempty"`
	// Resources is CPU and memory per mesh, point, component and role.
	Resources []ResourceUsage `json:"resources,omitempty"`
	// Network is bytes and packets per second per mesh, point, pod and interface.
	Network []NetworkUsage `json:"network,omitempty"`
	// Excluded lists the trials left out of every number above because a process of
	// the system under test exited during them, or their attempt was measured again.
	Excluded []ExcludedTrial `json:"excluded,omitempty"`
	// Caveats say what the intervals above do not cover, for this run's design.
	Caveats []string `json:"caveats,omitempty"`
	// SLO is what capacity and the answer's SLO flags were judged against;
	// SLOFromStudy says the run's study set it (else it is DefaultSLO).
	SLO          SLO  `json:"slo"`
	SLOFromStudy bool `json:"slo_from_study,omitempty"`
}

// OneDeploymentCaveat is said of a run whose meshes were each measured on one
// deployment kept up throughout (keepMeshesUp) with no A/A pair among them. Its trials
// pair second by second and its intervals are narrow, but they cover how trials vary,
// not how two deployments of one mesh differ: in one A/A of identical kept-up
// deployments on the machine of docs/report.md, the paired p50 interval was -3.2 %
// [-5.0, -1.2], excluding zero. An A/A pair at a point raises the noise floor of every
// comparison there to cover it.
const OneDeploymentCaveat = "each mesh was measured on one deployment, kept up throughout (keepMeshesUp): the intervals cover how its trials varied, not how two deployments of the same mesh differ, which can be a few percent on p50 (docs/report.md); add a second deployment of the baseline (an A/A pair) to the study, and its noise floor will cover it"

// ExcludedTrial is a stored trial the analysis leaves out, and why.
type ExcludedTrial struct {
	Key
	TrialID int64           `json:"trial_id"`
	Repeat  int             `json:"repeat"`
	Label   string          `json:"label"`
	Flag    string          `json:"flag"` // results.FlagFault, FlagSuperseded or FlagBackedOff
	Faults  []results.Fault `json:"faults,omitempty"`
}

// Excluded lists a run's trials that Groups leaves out for a fault.
func Excluded(run *results.Run) []ExcludedTrial {
	var out []ExcludedTrial
	for i := range run.Trials {
		t := &run.Trials[i]
		if !t.Result.Excluded() {
			continue
		}
		flag := results.FlagSuperseded
		switch {
		case t.Result.HasFlag(results.FlagFault):
			flag = results.FlagFault
		case t.Result.HasFlag(results.FlagBackedOff):
			flag = results.FlagBackedOff
		}
		out = append(out, ExcludedTrial{Key: Key{Mesh: t.Mesh, Experiment: t.Experiment, Step: t.Params.Step}, TrialID: t.ID,
			Repeat: t.Repeat, Label: paramLabel(t), Flag: flag, Faults: t.Result.Faults})
	}
	return out
}

// Group returns the group for a key, or nil.
func (r *Report) Group(k Key) *Group {
	for _, g := range r.Groups {
		if g.Key == k {
			return g
		}
	}
	return nil
}

// Groups splits a run's trials by Key, in the order the keys first appear, with the
// pooled statistics filled in. Failed trials (Trial.Error set) are left out, and so
// are trials during which a process of the system under test exited and the attempts
// measured again because of one (results.TrialResult.Excluded; see Excluded).
func Groups(run *results.Run) []*Group {
	var order []Key
	byKey := map[Key]*Group{}
	for i := range run.Trials {
		t := &run.Trials[i]
		if t.Error != "" || t.Result.Latency == nil || t.Result.Excluded() {
			continue
		}
		k := Key{Mesh: t.Mesh, Experiment: t.Experiment, Step: t.Params.Step}
		g := byKey[k]
		if g == nil {
			g = &Group{Key: k, Kind: t.Kind, Params: t.Params, Label: paramLabel(t)}
			byKey[k] = g
			order = append(order, k)
		}
		g.Trials = append(g.Trials, t)
	}
	out := make([]*Group, 0, len(order))
	for _, k := range order {
		g := byKey[k]
		sort.SliceStable(g.Trials, func(i, j int) bool { return g.Trials[i].Repeat < g.Trials[j].Repeat })
		fillGroup(g)
		out = append(out, g)
	}
	return out
}

// RateLabel is a requested rate as labels show it, to a tenth of a request a second: a
// capacity search's probes are shares of a measured rate, and their float's shortest
// form read "1413.6000000000001 rps".
func RateLabel(rate float64) string {
	return strconv.FormatFloat(math.Round(rate*10)/10, 'f', -1, 64) + " rps"
}

func paramLabel(t *results.Trial) string {
	p := t.Params
	switch {
	case p.RequestedRate > 0:
		return t.Experiment + " " + RateLabel(p.RequestedRate)
	case p.Users > 0:
		return fmt.Sprintf("%s %d users", t.Experiment, p.Users)
	case p.Connections > 0:
		return fmt.Sprintf("%s %d conns", t.Experiment, p.Connections)
	}
	return fmt.Sprintf("%s step %d", t.Experiment, p.Step)
}

func fillGroup(g *Group) {
	merged := results.NewLatencyHistogram()
	var secs float64
	var served int64
	for _, t := range g.Trials {
		merged.Merge(t.Result.Latency)
		g.Requests += t.Result.Requests
		g.Errors += t.Result.Errors
		served += t.Result.Served()
		secs += t.Duration().Seconds()
		g.TrialIDs = append(g.TrialIDs, t.ID)
		if t.Result.Generator.Behind || t.Result.HasFlag(results.FlagGeneratorBehind) {
			g.GeneratorBehind++
		}
		if t.Result.HasFlag(results.FlagProxyBypassed) {
			g.ProxyBypassed++
		}
		if t.Result.Saturated() {
			g.Saturated++
		}
		g.Failures += t.Result.Failures()
		if !sameLoadParams(t.Params, g.Params) {
			g.MixedParams = true
		}
	}
	g.Repeats = len(g.Trials)
	g.latency = newLatencyCounts(g.Trials)
	g.perTrial = trialValues(g)
	if merged.TotalCount() > 0 {
		g.P50, g.P90, g.P99, g.P999 = merged.ValueAtQuantile(50), merged.ValueAtQuantile(90), merged.ValueAtQuantile(99), merged.ValueAtQuantile(99.9)
		g.P95 = merged.ValueAtQuantile(95)
		g.Max = merged.ValueAtQuantile(100)
	}
	if secs > 0 {
		g.Throughput = float64(served) / secs
	}
	if g.Requests > 0 {
		g.ErrorRate = float64(g.Errors) / float64(g.Requests)
	}
}

// trialValues is every default metric's value in each trial of g: its own percentiles,
// throughput and error rate, as fillGroup computes them over the pooled trials.
func trialValues(g *Group) map[Metric][]float64 {
	var ms []Metric
	var qs []float64
	// P95 is compared only where a study published it, but then with the same method.
	for _, m := range append(slices.Clone(DefaultMetrics), P95) {
		if p := m.Percentile(); p >= 0 && !slices.Contains(ms, m) {
			ms, qs = append(ms, m), append(qs, p)
		}
	}
	// percentiles reads the histogram once, in ascending order of the quantiles.
	order := make([]int, len(ms))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(qs[a], qs[b]) })
	sortedMs, sortedQs := make([]Metric, len(ms)), make([]float64, len(qs))
	for i, j := range order {
		sortedMs[i], sortedQs[i] = ms[j], qs[j]
	}
	ms, qs = sortedMs, sortedQs
	out := map[Metric][]float64{}
	for i, t := range g.Trials {
		for k, v := range g.latency.percentiles(i, i+1, qs) {
			out[ms[k]] = append(out[ms[k]], v)
		}
		var tput, errRate float64
		if secs := t.Duration().Seconds(); secs > 0 {
			tput = float64(t.Result.Requests-t.Result.Errors) / secs
		}
		if t.Result.Requests > 0 {
			errRate = float64(t.Result.Errors) / float64(t.Result.Requests)
		}
		out[Throughput] = append(out[Throughput], tput)
		out[ErrorRate] = append(out[ErrorRate], errRate)
	}
	return out
}

// Analyze pools every group of a run, compares each mesh with the baseline at every
// point, measures the noise floor, names a winner per point and metric, flags outlier
// trials and finds capacity for sweep experiments (with the default SLO when slo is
// nil).
func Analyze(run *results.Run, opts Options, slo *SLO) *Report {
	opts = opts.withDefaults()
	rep := &Report{RunID: run.ID, Baseline: run.BaselineLabel(), Options: opts, Groups: Groups(run), Excluded: Excluded(run)}
	for _, g := range rep.Groups {
		g.Outliers = TukeyOutliers(g.Trials, opts.TukeyK)
	}
	for _, pt := range points(rep.Groups) {
		base := rep.Group(Key{Mesh: rep.Baseline, Experiment: pt.Experiment, Step: pt.Step})
		if base == nil {
			continue
		}
		floors := NoiseFloor(run, rep.Groups, pt, opts)
		for _, g := range rep.Groups {
			if g.Experiment != pt.Experiment || g.Step != pt.Step || g.Mesh == rep.Baseline || !sameLoad(base, g) {
				continue
			}
			for _, c := range compareGroups(base, g, opts, floors) {
				c.Reference = rep.Baseline
				rep.Comparisons = append(rep.Comparisons, c)
			}
		}
	}
	rep.Sensitivity = SensitivityOf(rep.Comparisons)
	if run.Provenance.Placement["meshes-up"] != "" && len(rep.Comparisons) > 0 &&
		!slices.ContainsFunc(rep.Comparisons, func(c Comparison) bool { return strings.HasPrefix(c.NoiseSource, "a/a ") }) {
		rep.Caveats = append(rep.Caveats, OneDeploymentCaveat)
	}
	rep.Winners = Winners(run, rep.Groups, opts)
	rep.SLO = DefaultSLO()
	if slo != nil {
		rep.SLO, rep.SLOFromStudy = *slo, true
	}
	rep.Capacity = CapacityAll(rep.Groups, rep.SLO)
	rep.Resources = Resources(rep.Groups)
	rep.Network = Network(rep.Groups)
	return rep
}

// sameLoad says whether every trial of the groups ran at one load: the same rate,
// connections and users. A capacity search probes each mesh at rates of its own under
// one step index (the baseline at 1348 req/s where a sidecar mesh was at 190); their
// latencies there differ by the load as much as by the mesh, and comparing them gave
// intervals such as +27 ms [−10 ms, +1.96e+12 s]. Their place is the capacity
// analysis, which reads each mesh's probes on their own.
func sameLoad(groups ...*Group) bool {
	for _, g := range groups {
		if g.MixedParams || !sameLoadParams(g.Params, groups[0].Params) {
			return false
		}
	}
	return true
}

// sameLoadParams says whether two trials ran at one load: rate, connections and users.
func sameLoadParams(p, q results.TrialParams) bool {
	return p.RequestedRate == q.RequestedRate && p.Connections == q.Connections && p.Users == q.Users
}

func points(groups []*Group) []Point {
	seen := map[Point]bool{}
	var out []Point
	for _, g := range groups {
		p := Point{g.Experiment, g.Step}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// Floor is the noise floor of one metric.
type Floor struct {
	Pct    float64
	Source string
}

// pairedByRepeat says whether the repeats of a and b can be taken in pairs: both hold
// the same repeats, and each repeat's trials of both ran in one block, before any
// trial of the next repeat, as interleaved order runs them. Drift of the machine over
// the run (minutes of other work, thermal or frequency changes) then moves both trials
// of a pair alike, and differences within pairs take it out instead of counting it as
// noise twice. Sequential order, or a repeat measured again after later ones, is
// treated as unpaired.
func pairedByRepeat(a, b *Group) bool {
	if len(a.Trials) != len(b.Trials) || len(a.Trials) < 2 {
		return false
	}
	type span struct{ first, last time.Time }
	blocks := make([]span, len(a.Trials))
	for i := range a.Trials {
		ta, tb := a.Trials[i], b.Trials[i]
		if ta.Repeat != tb.Repeat || ta.Start.IsZero() || tb.Start.IsZero() {
			return false
		}
		blocks[i] = span{ta.Start, ta.Start}
		if tb.Start.Before(ta.Start) {
			blocks[i].first = tb.Start
		} else {
			blocks[i].last = tb.Start
		}
		if i > 0 && !blocks[i-1].last.Before(blocks[i].first) {
			return false
		}
	}
	return true
}

// compareGroups compares other against ref on every metric.
func compareGroups(ref, other *Group, opts Options, floors map[Metric]Floor) []Comparison {
	opts = opts.withDefaults()
	paired := !opts.Unpaired && pairedByRepeat(ref, other)
	ivs := opts.method.change(ref, other, paired, opts)
	var out []Comparison
	for _, m := range opts.Metrics {
		base, val := ref.Value(m), other.Value(m)
		b, ok := ivs.byMetric[m]
		if !ok {
			b = noBounds
		}
		c := Comparison{Point: Point{other.Experiment, other.Step}, Label: other.Label, Mesh: other.Mesh, Reference: ref.Mesh,
			Metric: m, Base: base, Value: val, Unit: ivs.unit, Paired: ivs.paired, Method: ivs.how,
			Repeats: len(other.Trials), BaseRepeats: len(ref.Trials)}
		c.Delta = Estimate{Value: val - base, Lo: b.deltaLo, Hi: b.deltaHi}
		c.Pct = Estimate{Value: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
		if base != 0 {
			c.Pct = Estimate{Value: 100 * (val - base) / base, Lo: b.pctLo, Hi: b.pctHi}
		}
		if f, ok := floors[m]; ok {
			c.NoiseFloorPct, c.NoiseSource = f.Pct, f.Source
		}
		c.Margin = opts.Margin(m)
		c.Verdict = NoInterval
		if ivs.unit != "" {
			c.Verdict = verdict(c)
		}
		if q := m.Percentile(); q > 0 && float64(fewestRequests(ref, other))*(1-q/100) < 1 {
			c.Verdict = TooFewRequests
		}
		if ref.Saturated > 0 || other.Saturated > 0 {
			c.Verdict = Saturated
		}
		out = append(out, c)
	}
	return out
}

// fewestRequests is the fewest requests any trial of the groups measured.
func fewestRequests(groups ...*Group) int64 {
	fewest := int64(math.MaxInt64)
	for _, g := range groups {
		for _, tr := range g.Trials {
			fewest = min(fewest, tr.Result.Requests)
		}
	}
	return fewest
}

// verdict: equal when the whole interval lies within the practical-equivalence margin
// (identical values give [0, 0], which always does); otherwise a change counts only
// when its interval excludes zero and the point estimate is larger than both the
// noise floor and the margin; anything else is inconclusive.
func verdict(c Comparison) Verdict {
	var lo, hi, point, floor float64
	if c.Metric.AbsoluteMargin() {
		// a fraction, compared in percentage points
		lo, hi, point, floor = 100*c.Delta.Lo, 100*c.Delta.Hi, 100*c.Delta.Value, 0
	} else {
		lo, hi, point, floor = c.Pct.Lo, c.Pct.Hi, c.Pct.Value, c.NoiseFloorPct
		if math.IsNaN(point) && c.Delta.Lo == 0 && c.Delta.Hi == 0 {
			lo, hi, point = 0, 0, 0 // both zero: no change at all
		}
	}
	if !math.IsNaN(lo) && !math.IsNaN(hi) && -c.Margin <= lo && hi <= c.Margin {
		return Equal
	}
	if !c.Delta.ExcludesZero() {
		return Inconclusive
	}
	if !math.IsNaN(point) && math.Abs(point) <= max(floor, c.Margin) {
		return Inconclusive
	}
	up := c.Delta.Value > 0
	if up == c.Metric.HigherIsBetter() {
		return Better
	}
	return Worse
}

// quantile of xs (sorted in place) by linear interpolation; NaN when empty.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sort.Float64s(xs)
	pos := q * float64(len(xs)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(xs)-1)
	return xs[lo] + (pos-float64(lo))*(xs[hi]-xs[lo])
}

// NoiseFloor measures, for every metric at one point, how large a relative change
// noise alone produces:
//   - A/A: when two meshes at the point have the same profile and options, the floor
//     is the largest |%| bound of the interval of one against the other, taken both
//     ways round (the worst pair when there are several);
//   - otherwise the baseline's own spread: the difference that two independent
//     measurements of the baseline, each as many repeats as it had, exceed one time
//     in twenty (intervalMethod.spread).
//
// With fewer than two repeats of the baseline there is no floor.
func NoiseFloor(run *results.Run, groups []*Group, pt Point, opts Options) map[Metric]Floor {
	opts = opts.withDefaults()
	floors := map[Metric]Floor{}
	var at []*Group
	for _, g := range groups {
		if g.Experiment == pt.Experiment && g.Step == pt.Step {
			at = append(at, g)
		}
	}
	for i := 0; i < len(at); i++ {
		for j := i + 1; j < len(at); j++ {
			if !sameConfig(run.Mesh(at[i].Mesh), run.Mesh(at[j].Mesh)) {
				continue
			}
			// Both ways round: a relative change is not symmetric (+60% one way is -38%
			// the other), and the floor must cover whichever of the pair is the reference.
			both := append(compareGroups(at[i], at[j], opts, nil), compareGroups(at[j], at[i], opts, nil)...)
			for _, c := range both {
				if math.IsNaN(c.Pct.Lo) {
					continue
				}
				f := math.Max(math.Abs(c.Pct.Lo), math.Abs(c.Pct.Hi))
				if f >= floors[c.Metric].Pct {
					floors[c.Metric] = Floor{Pct: f, Source: "a/a " + at[i].Mesh + "=" + at[j].Mesh}
				}
			}
		}
	}
	if len(floors) > 0 {
		return floors
	}
	var base *Group
	for _, g := range at {
		if g.Mesh == run.BaselineLabel() {
			base = g
		}
	}
	if base == nil {
		return floors
	}
	spread, unit := opts.method.spread(base, opts)
	for m, pct := range spread {
		floors[m] = Floor{Pct: pct, Source: "baseline spread (" + unit + ")"}
	}
	return floors
}

func sameConfig(a, b *results.Mesh) bool {
	if a == nil || b == nil || a.Profile != b.Profile || len(a.Options) != len(b.Options) {
		return false
	}
	for k, v := range a.Options {
		if w, ok := b.Options[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Winner names the best mesh at one point for one metric.
type Winner struct {
	Point
	Label  string             `json:"label"`
	Metric Metric             `json:"metric"`
	Values map[string]float64 `json:"values"` // mesh → pooled value
	// Best is the mesh with the best pooled value; Verdict is Better when its
	// comparison with the runner-up is conclusive, Inconclusive otherwise.
	Best     string     `json:"best"`
	RunnerUp string     `json:"runner_up"`
	Verdict  Verdict    `json:"verdict"`
	Against  Comparison `json:"against"` // runner-up compared with Best
}

// Winners builds the verdict table: for each point and metric, which mesh is best
// and whether that is conclusive.
func Winners(run *results.Run, groups []*Group, opts Options) []Winner {
	opts = opts.withDefaults()
	var out []Winner
	for _, pt := range points(groups) {
		var at []*Group
		for _, g := range groups {
			if g.Experiment == pt.Experiment && g.Step == pt.Step {
				at = append(at, g)
			}
		}
		if len(at) < 2 || !sameLoad(at...) {
			continue
		}
		floors := NoiseFloor(run, groups, pt, opts)
		for _, m := range opts.Metrics {
			sorted := append([]*Group(nil), at...)
			sort.SliceStable(sorted, func(i, j int) bool {
				if m.HigherIsBetter() {
					return sorted[i].Value(m) > sorted[j].Value(m)
				}
				return sorted[i].Value(m) < sorted[j].Value(m)
			})
			w := Winner{Point: pt, Label: at[0].Label, Metric: m, Values: map[string]float64{},
				Best: sorted[0].Mesh, RunnerUp: sorted[1].Mesh, Verdict: Inconclusive}
			for _, g := range at {
				w.Values[g.Mesh] = g.Value(m)
			}
			o := opts
			o.Metrics = []Metric{m}
			c := compareGroups(sorted[0], sorted[1], o, floors)[0]
			w.Against = c
			// The runner-up is worse than the best when the comparison says so; equal
			// when the two cannot differ by more than the margin.
			switch c.Verdict {
			case Worse:
				w.Verdict = Better
			case Equal, NoInterval, TooFewRequests, Saturated:
				w.Verdict = c.Verdict
			}
			out = append(out, w)
		}
	}
	return out
}
