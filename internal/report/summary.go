package report

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/cost"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/reproduce"
	"github.com/meshmark/meshmark/internal/results"
)

// Num is a float that encodes NaN and ±Inf as JSON null: the analysis uses NaN for
// "not defined" (a % change against a zero baseline) and encoding/json refuses it.
type Num float64

// MarshalJSON writes null for NaN and infinities.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// UnmarshalJSON reads null back as NaN.
func (n *Num) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = Num(math.NaN())
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*n = Num(f)
	return nil
}

// Summary is the analysed view of one run that every format renders; the JSON format
// is this struct. Latencies are in milliseconds, rates in requests per second.
type Summary struct {
	RunID        string    `json:"run_id"`
	Study        string    `json:"study"`
	Status       string    `json:"status"`
	StatusReason string    `json:"status_reason,omitempty"`
	Started      time.Time `json:"started"`
	Ended        time.Time `json:"ended,omitzero"`
	Substrate    string    `json:"substrate,omitempty"`
	Baseline     string    `json:"baseline"`
	Confidence   float64   `json:"confidence"`

	Meshes []MeshInfo `json:"meshes"`
	// Reproduction opens the report when the run's study reproduces a published one:
	// that study's own tables and its figures beside the run's (internal/reproduce).
	Reproduction *reproduce.Reproduction `json:"reproduction,omitempty"`
	// Answers are the answer first: one short table per load point (see
	// analysis.Answer), in the report's units.
	Answers []AnswerPoint `json:"answers"`
	// SLOLine states the SLO the answer judges by; IntervalLine how the intervals were
	// computed; CapacityLines each closed-loop capacity with its spread over repeats.
	SLOLine       string   `json:"slo_line"`
	IntervalLine  string   `json:"interval_line,omitempty"`
	CapacityLines []string `json:"capacity_lines,omitempty"`

	Groups      []GroupRow      `json:"groups"`
	Verdicts    []VerdictRow    `json:"verdicts"`
	Comparisons []ComparisonRow `json:"comparisons"`
	// Sensitivity says how small a difference the comparisons could tell apart.
	Sensitivity string        `json:"sensitivity,omitempty"`
	SLO         SLOInfo       `json:"slo"`
	Capacity    []CapacityRow `json:"capacity"`
	Spectra     []Spectrum    `json:"spectra"`
	Heatmaps    []Heatmap     `json:"heatmaps"`
	TimeSeries  []TimeSeries  `json:"time_series"`
	Resources   []ResourceRow `json:"resources"`
	// MemoryMeasure names what the resources' memory is: RSS, or a container's working
	// set on a cluster (results.Run.MemoryMeasure).
	MemoryMeasure string `json:"memory_measure"`
	// ResourcesFrom names the experiments Resources and Costs are computed from.
	ResourcesFrom []string   `json:"resources_from"`
	CostModel     CostModel  `json:"cost_model"`
	Costs         []CostRow  `json:"costs"`
	Checks        []CheckRow `json:"checks"`
	// Effort is what installing each mesh on Kubernetes took (none on the local
	// substrate).
	Effort []EffortRow `json:"effort,omitempty"`
	// Security is the security matrix: one cell per mesh, security experiment and
	// probe, with the evidence behind each verdict.
	Security []analysis.SecurityCell `json:"security"`
	// SecurityProbes are the matrix's columns, in order.
	SecurityProbes []string `json:"security_probes"`
	// Excluded are the trials left out of every number because a process of the
	// system under test exited during them (or their attempt was measured again).
	Excluded   []analysis.ExcludedTrial `json:"excluded_trials,omitempty"`
	Provenance ProvenanceSummary        `json:"provenance"`

	// Network is bytes and packets per second per pod interface, per mesh, from the
	// experiments NetworkFrom names (chosen like ResourcesFrom).
	Network     []NetworkRow `json:"network"`
	NetworkFrom []string     `json:"network_from"`
}

// MeshInfo is one mesh under test.
type MeshInfo struct {
	Label    string            `json:"label"`
	Profile  string            `json:"profile"`
	Options  map[string]string `json:"options,omitempty"`
	Baseline bool              `json:"baseline"`
}

// AnswerPoint is analysis.Answer in the report's units: per mesh at one load point,
// the latency it adds to the baseline's, its CPU, memory, errors, security and verdict,
// with flags beside the numbers they qualify, and the meshes ranked.
type AnswerPoint struct {
	Experiment    string       `json:"experiment"`
	Step          int          `json:"step"`
	Label         string       `json:"label"`
	Kind          string       `json:"kind"`
	RequestedRate float64      `json:"requested_rate,omitempty"`
	Baseline      string       `json:"baseline"`
	Rows          []AnswerRow  `json:"rows"`
	Rankings      []RankingRow `json:"rankings,omitempty"`
}

// AnswerRow is one mesh at one load point. CPU is in cores per 1000 req/s served,
// memory in MiB (mean RSS summed over the mesh's proxies).
type AnswerRow struct {
	Mesh                 string          `json:"mesh"`
	Baseline             bool            `json:"baseline,omitempty"`
	Repeats              int             `json:"repeats"`
	P50Ms                Num             `json:"p50_ms"`
	P99Ms                Num             `json:"p99_ms"`
	AddedP50             *Added          `json:"added_p50,omitempty"`
	AddedP99             *Added          `json:"added_p99,omitempty"`
	ProxyCoresPer1000RPS Num             `json:"proxy_cores_per_1000_rps"`
	SUTCoresPer1000RPS   Num             `json:"sut_cores_per_1000_rps"`
	ProxyMemMiB          Num             `json:"proxy_mem_mib"`
	Proxies              int             `json:"proxies"`
	Requests             int64           `json:"requests"`
	Errors               int64           `json:"errors"`
	ErrorRate            Num             `json:"error_rate"`
	Security             string          `json:"security"`
	Verdict              string          `json:"verdict"`
	Flags                []analysis.Flag `json:"flags,omitempty"`
}

// Added is the latency a mesh adds at one percentile, against the baseline, in ms
// and in %, with intervals.
type Added struct {
	Ms      Num    `json:"ms"`
	LoMs    Num    `json:"lo_ms"`
	HiMs    Num    `json:"hi_ms"`
	Pct     Num    `json:"pct"`
	PctLo   Num    `json:"pct_lo"`
	PctHi   Num    `json:"pct_hi"`
	Verdict string `json:"verdict"`
}

// RankingRow is analysis.Ranking: the meshes fastest first on one metric, each step
// with the comparison behind it.
type RankingRow struct {
	Metric string        `json:"metric"`
	Order  []string      `json:"order"`
	Steps  []RankStepRow `json:"steps"`
	// Line is the ranking in words, as the terminal prints it.
	Line string `json:"line"`
}

// RankStepRow is one step of a ranking: Slower against Faster.
type RankStepRow struct {
	Faster   string `json:"faster"`
	Slower   string `json:"slower"`
	Symbol   string `json:"symbol"` // "<" significant, "=" equal within the margin, "~" not resolved
	Resolved bool   `json:"resolved"`
	Verdict  string `json:"verdict"`
	DeltaMs  Num    `json:"delta_ms"`
	LoMs     Num    `json:"lo_ms"`
	HiMs     Num    `json:"hi_ms"`
	Pct      Num    `json:"pct"`
	PctLo    Num    `json:"pct_lo"`
	PctHi    Num    `json:"pct_hi"`
}

// GroupRow is the pooled result of one mesh at one point (all repeats merged).
type GroupRow struct {
	Mesh            string  `json:"mesh"`
	Experiment      string  `json:"experiment"`
	Step            int     `json:"step"`
	Label           string  `json:"label"`
	Kind            string  `json:"kind"`
	RequestedRate   float64 `json:"requested_rate,omitempty"`
	Connections     int     `json:"connections,omitempty"`
	Repeats         int     `json:"repeats"`
	Requests        int64   `json:"requests"`
	Errors          int64   `json:"errors"`
	MinMs           Num     `json:"min_ms"`
	MeanMs          Num     `json:"mean_ms"`
	P50Ms           Num     `json:"p50_ms"`
	P90Ms           Num     `json:"p90_ms"`
	P99Ms           Num     `json:"p99_ms"`
	P999Ms          Num     `json:"p999_ms"`
	MaxMs           Num     `json:"max_ms"`
	Throughput      Num     `json:"throughput_rps"`
	ErrorRate       Num     `json:"error_rate"`
	GeneratorBehind int     `json:"generator_behind_trials"`
	// Saturated counts trials whose target could not keep up; Failures the requests
	// that failed without a response (in the latencies at their time to failure).
	Saturated       int     `json:"saturated_trials"`
	Failures        int64   `json:"failures"`
	Outliers        []int64 `json:"outlier_trials,omitempty"`
	Start           time.Time
	End             time.Time
	DurationSeconds float64 `json:"duration_seconds"`
}

// VerdictRow is one line of the verdict table: at one point, which mesh is best on one
// metric, by how much the runner-up trails (with its interval), and whether that is
// conclusive.
type VerdictRow struct {
	Label      string         `json:"label"`
	Experiment string         `json:"experiment"`
	Step       int            `json:"step"`
	Metric     string         `json:"metric"`
	Unit       string         `json:"unit"`
	Best       string         `json:"best"`
	RunnerUp   string         `json:"runner_up"`
	Verdict    string         `json:"verdict"`
	Values     map[string]Num `json:"values"`
	// GapPct is the runner-up against the best, in %, with its interval.
	GapPct Num `json:"gap_pct"`
	GapLo  Num `json:"gap_pct_lo"`
	GapHi  Num `json:"gap_pct_hi"`
}

// ComparisonRow is one mesh against the baseline on one metric at one point.
type ComparisonRow struct {
	Label         string `json:"label"`
	Experiment    string `json:"experiment"`
	Step          int    `json:"step"`
	Mesh          string `json:"mesh"`
	Reference     string `json:"reference"`
	Metric        string `json:"metric"`
	Unit          string `json:"unit"` // unit of Base, Value and Delta (ms for latency)
	Base          Num    `json:"base"`
	Value         Num    `json:"value"`
	Delta         Num    `json:"delta"`
	DeltaLo       Num    `json:"delta_lo"`
	DeltaHi       Num    `json:"delta_hi"`
	Pct           Num    `json:"pct"`
	PctLo         Num    `json:"pct_lo"`
	PctHi         Num    `json:"pct_hi"`
	NoiseFloorPct Num    `json:"noise_floor_pct"`
	NoiseSource   string `json:"noise_source"`
	Verdict       string `json:"verdict"`
	Resampled     string `json:"resampled"`
	// Paired: the differences were taken within each interleaved block.
	Paired  bool `json:"paired,omitempty"`
	Repeats int  `json:"repeats"`
}

// PairingNote says how many comparisons took their differences within interleaved
// blocks; empty when none did.
func (s *Summary) PairingNote() string {
	paired := 0
	for _, c := range s.Comparisons {
		if c.Paired {
			paired++
		}
	}
	if paired == 0 {
		return ""
	}
	return fmt.Sprintf("Repeats that ran in one interleaved block are compared within the block (%d of %d comparisons), so drift of the machine from block to block is not counted as noise.",
		paired, len(s.Comparisons))
}

// IntervalHeader is IntervalLine, or the intervals' level alone when the run has no
// comparison to name a method for.
func (s *Summary) IntervalHeader() string {
	if s.IntervalLine == "" {
		return fmt.Sprintf("%g%% intervals", 100*s.Confidence)
	}
	return s.IntervalLine
}

// SLOInfo is the SLO capacity was judged against.
type SLOInfo struct {
	// Text states every bound it judges ("p95 ≤ 50ms, p99 ≤ 100ms, errors ≤ 0%, ...").
	Text         string  `json:"text"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxErrorRate float64 `json:"max_error_rate"`
	MinAchieved  float64 `json:"min_achieved"`
	KneeFactor   float64 `json:"knee_factor"`
}

// CapacityRow is the sustainable maximum of one mesh in one sweep, with its curve.
type CapacityRow struct {
	Mesh          string          `json:"mesh"`
	Experiment    string          `json:"experiment"`
	XName         string          `json:"x_name"`
	Found         bool            `json:"found"`
	MaxX          float64         `json:"max_x"`
	MaxThroughput float64         `json:"max_throughput"`
	Limit         string          `json:"limit,omitempty"`
	HasKnee       bool            `json:"has_knee"`
	KneeX         float64         `json:"knee_x"`
	KneeRule      string          `json:"knee_rule"`
	Points        []CapacityPoint `json:"points"`
}

// CapacityPoint is one step of a sweep.
type CapacityPoint struct {
	X          float64 `json:"x"`
	Throughput float64 `json:"throughput"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	ErrorRate  float64 `json:"error_rate"`
	Meets      bool    `json:"meets"`
	Why        string  `json:"why,omitempty"`
}

// Spectrum is the percentile spectrum of every mesh at one point. X is 1/(1-q), so
// 10 is p90 and 1000 is p99.9, as HdrHistogram plots draw it.
type Spectrum struct {
	Experiment string           `json:"experiment"`
	Step       int              `json:"step"`
	Label      string           `json:"label"`
	Series     []SpectrumSeries `json:"series"`
}

// SpectrumSeries is one mesh's curve: [1/(1-q), latency ms] pairs.
type SpectrumSeries struct {
	Mesh   string       `json:"mesh"`
	Points [][2]float64 `json:"points"`
}

// Heatmap is S4's per-step picture for one mesh and one sweep: rows are latency
// buckets, columns steps, a cell the share of that step's requests in that bucket.
type Heatmap struct {
	Mesh       string   `json:"mesh"`
	Experiment string   `json:"experiment"`
	Columns    []string `json:"columns"`
	Rows       []string `json:"rows"` // bucket labels, fastest first
	// Cells are [column, row, share %, count].
	Cells [][4]float64 `json:"cells"`
}

// TimeSeries is one mesh's per-interval history; times are seconds since the run
// started. A nil entry in the value slices marks a gap between trials.
type TimeSeries struct {
	Mesh   string     `json:"mesh"`
	T      []float64  `json:"t"`
	Rate   []*float64 `json:"rate"`
	P99Ms  []*float64 `json:"p99_ms"`
	Errors []*float64 `json:"errors"`
}

// ResourceRow is one component of one mesh: CPU in cores, memory in MiB (RSS, or the
// working set on a cluster: Summary.MemoryMeasure).
type ResourceRow struct {
	Mesh       string  `json:"mesh"`
	Component  string  `json:"component"`
	Role       string  `json:"role"`
	Pod        string  `json:"pod,omitempty"`
	AvgCores   float64 `json:"avg_cores"`
	PeakCores  float64 `json:"peak_cores"`
	AvgMemMiB  float64 `json:"avg_mem_mib"`
	AvgPSSMiB  float64 `json:"avg_pss_mib"`
	PeakMemMiB float64 `json:"peak_mem_mib"`
	Samples    int     `json:"samples"`
}

// NetworkRow is one interface of one pod of one mesh: rates in bytes and packets per
// second, the mean of the trials' rates (analysis.NetworkUsage pooled over the points
// of the NetworkFrom experiments, weighted by their trials); drops are summed.
type NetworkRow struct {
	Mesh            string  `json:"mesh"`
	Pod             string  `json:"pod"`
	Node            string  `json:"node,omitempty"`
	Interface       string  `json:"interface"`
	RxBytesPerSec   float64 `json:"rx_bytes_per_s"`
	TxBytesPerSec   float64 `json:"tx_bytes_per_s"`
	RxPacketsPerSec float64 `json:"rx_packets_per_s"`
	TxPacketsPerSec float64 `json:"tx_packets_per_s"`
	RxDropped       int64   `json:"rx_dropped"`
	TxDropped       int64   `json:"tx_dropped"`
	Trials          int     `json:"trials"`
}

// CostModel is the instance type the overhead is priced on (see internal/cost).
type CostModel struct {
	Instance      string  `json:"instance"`
	VCPU          float64 `json:"vcpu"`
	MemoryGiB     float64 `json:"memory_gib"`
	PricePerHour  float64 `json:"price_per_hour"`
	Currency      string  `json:"currency"`
	HoursPerMonth float64 `json:"hours_per_month"`
	Region        string  `json:"region,omitempty"`
	Source        string  `json:"source"`
	AsOf          string  `json:"as_of,omitempty"`
	Table         string  `json:"table"`
}

// DefaultInstance is the instance type costs are priced on unless Options.Instance
// names another.
const DefaultInstance = "aws/m6i.large"

// CostRow is what one mesh costs at the load it was measured under. Usage counts every
// measured component but the load generator (memory as PSS where known, else RSS);
// Mesh* counts only the mesh's own components (proxies, gateways, control planes).
// The overhead over the baseline is priced by internal/cost on CostModel's instance.
type CostRow struct {
	Mesh                string  `json:"mesh"`
	VCPU                float64 `json:"vcpu"`
	MemMiB              float64 `json:"mem_mib"`
	MeshVCPU            float64 `json:"mesh_vcpu"`
	MeshMemMiB          float64 `json:"mesh_mem_mib"`
	Throughput          float64 `json:"throughput_rps"`
	ExtraVCPU           float64 `json:"extra_vcpu"`
	ExtraMemGiB         float64 `json:"extra_mem_gib"`
	InstanceEquivalents float64 `json:"instance_equivalents"`
	BoundBy             string  `json:"bound_by"`
	PerMonth            float64 `json:"per_month"`
	PerMillionRequests  float64 `json:"per_million_requests"`
}

// CheckRow is one pass/fail check: enrollment, mTLS on the wire, plaintext refused,
// load generator kept up.
type CheckRow struct {
	Mesh   string `json:"mesh"`
	Check  string `json:"check"`
	Pass   bool   `json:"pass"`
	Detail string `json:"detail"`
	// NotApplicable is a check that has nothing to hold this mesh to (a baseline that
	// installs nothing has nothing to enroll): shown as n/a, neither pass nor fail.
	NotApplicable bool `json:"not_applicable,omitempty"`
}

// Result is the row's verdict as the reports print it: PASS, FAIL or n/a.
func (c CheckRow) Result() string {
	switch {
	case c.NotApplicable:
		return "n/a"
	case c.Pass:
		return "PASS"
	}
	return "FAIL"
}

// ProvenanceSummary is where the numbers came from.
type ProvenanceSummary struct {
	results.Provenance
	StudyPath string         `json:"study_path,omitempty"`
	StudyFile string         `json:"study_file,omitempty"`
	Seed      int64          `json:"seed"`
	Configs   []ConfigDigest `json:"config_digests"`
}

// ConfigDigest names a generated config by its hash (the content stays in the store).
type ConfigDigest struct {
	Name      string `json:"name"`
	Mesh      string `json:"mesh,omitempty"`
	Component string `json:"component,omitempty"`
	SHA256    string `json:"sha256"`
	Bytes     int    `json:"bytes"`
}

// meshRoles are the roles whose resources a mesh adds on top of the workload.
var meshRoles = map[string]bool{"sidecar": true, "node-proxy": true, "gateway": true, "control-plane": true, "proxy": true}

func ms(us int64) Num { return Num(float64(us) / 1000) }

// Summarize builds the analysed view of a run. an may be nil, in which case the run
// is analysed here with the default options.
func Summarize(run *results.Run, an *analysis.Report, opts Options) *Summary {
	if an == nil {
		an = analysis.Analyze(run, analysis.Options{Seed: uint64(run.Seed)}, nil)
	}
	prices := opts.Prices
	if prices == nil {
		prices = cost.Default()
	}
	instance := opts.Instance
	if instance == "" {
		instance = DefaultInstance
	}
	if prices.Instance(instance) == nil && len(prices.Instances) > 0 {
		instance = prices.Instances[0].Name
	}
	s := &Summary{RunID: run.ID, Study: run.Study, Status: string(run.Status), StatusReason: run.StatusReason,
		Started: run.Started, Ended: run.Ended, Substrate: run.Substrate, Baseline: an.Baseline,
		Confidence: an.Options.Confidence}
	for _, m := range run.Meshes {
		s.Meshes = append(s.Meshes, MeshInfo{Label: m.Label, Profile: m.Profile, Options: m.Options, Baseline: m.Label == an.Baseline})
	}
	s.Reproduction = reproduce.Build(run, an)
	s.Answers = answerPoints(analysis.Answers(run, an))
	s.SLOLine, s.IntervalLine = an.SLOLine(), an.IntervalLine()
	for _, l := range analysis.CapacityLines(run, an) {
		s.CapacityLines = append(s.CapacityLines, l.Line)
	}
	s.Groups = groupRows(an.Groups)
	s.Verdicts = verdictRows(an.Winners)
	s.Comparisons = comparisonRows(an.Comparisons)
	if len(an.Sensitivity) > 0 {
		s.Sensitivity = "Sensitivity: " + analysis.SensitivityLine(an.Sensitivity) + "."
		for _, c := range an.Caveats {
			s.Sensitivity += " Note: " + c + "."
		}
	}
	s.SLO, s.Capacity = capacityRows(an)
	s.Spectra = spectra(an.Groups, meshOrder(run))
	s.Heatmaps = heatmaps(an.Groups)
	s.TimeSeries = timeSeries(run)
	s.Resources = resourceRows(run)
	use := resourceExperiments(run)
	for e := range use {
		s.ResourcesFrom = append(s.ResourcesFrom, e)
	}
	sort.Strings(s.ResourcesFrom)
	netUse := networkExperiments(run)
	s.Network = networkRows(an.Network, netUse, meshOrder(run))
	for e := range netUse {
		s.NetworkFrom = append(s.NetworkFrom, e)
	}
	sort.Strings(s.NetworkFrom)
	var loadGroups []GroupRow
	for _, g := range s.Groups {
		if use[g.Experiment] {
			loadGroups = append(loadGroups, g)
		}
	}
	s.CostModel, s.Costs = costRows(s.Resources, loadGroups, meshOrder(run), an.Baseline, prices, instance)
	s.Checks = checkRows(run, an.Groups)
	s.MemoryMeasure = run.MemoryMeasure()
	s.Effort = effortRows(run)
	s.Security = analysis.SecurityMatrix(run)
	s.SecurityProbes = results.SecurityProbes
	s.Excluded = an.Excluded
	s.Provenance = provenance(run)
	return s
}

func meshOrder(run *results.Run) []string {
	var out []string
	for _, m := range run.Meshes {
		out = append(out, m.Label)
	}
	return out
}

func mergedLatency(g *analysis.Group) *hdrhistogram.Histogram {
	h := results.NewLatencyHistogram()
	for _, t := range g.Trials {
		if t.Result.Latency != nil {
			h.Merge(t.Result.Latency)
		}
	}
	return h
}

func groupRows(groups []*analysis.Group) []GroupRow {
	var out []GroupRow
	for _, g := range groups {
		h := mergedLatency(g)
		r := GroupRow{Mesh: g.Mesh, Experiment: g.Experiment, Step: g.Step, Label: g.Label, Kind: g.Kind,
			RequestedRate: g.Params.RequestedRate, Connections: g.Params.Connections, Repeats: g.Repeats,
			Requests: g.Requests, Errors: g.Errors, MinMs: ms(h.Min()), MeanMs: Num(h.Mean() / 1000),
			P50Ms: ms(g.P50), P90Ms: ms(g.P90), P99Ms: ms(g.P99), P999Ms: ms(g.P999), MaxMs: ms(g.Max),
			Throughput: Num(g.Throughput), ErrorRate: Num(g.ErrorRate), GeneratorBehind: g.GeneratorBehind, Outliers: g.Outliers,
			Saturated: g.Saturated, Failures: g.Failures}
		for i, t := range g.Trials {
			if i == 0 || t.Start.Before(r.Start) {
				r.Start = t.Start
			}
			if t.End.After(r.End) {
				r.End = t.End
			}
			r.DurationSeconds += t.Duration().Seconds()
		}
		out = append(out, r)
	}
	return out
}

// scale converts a metric's analysis unit (µs for latency) to the report's (ms).
func scale(m analysis.Metric) (float64, string) {
	if m.Percentile() >= 0 {
		return 1.0 / 1000, "ms"
	}
	if m == analysis.ErrorRate {
		return 1, "fraction"
	}
	return 1, m.Unit()
}

func verdictRows(ws []analysis.Winner) []VerdictRow {
	var out []VerdictRow
	for _, w := range ws {
		f, unit := scale(w.Metric)
		v := VerdictRow{Label: w.Label, Experiment: w.Experiment, Step: w.Step, Metric: string(w.Metric), Unit: unit,
			Best: w.Best, RunnerUp: w.RunnerUp, Verdict: string(w.Verdict), Values: map[string]Num{},
			GapPct: Num(w.Against.Pct.Value), GapLo: Num(w.Against.Pct.Lo), GapHi: Num(w.Against.Pct.Hi)}
		for k, x := range w.Values {
			v.Values[k] = Num(x * f)
		}
		out = append(out, v)
	}
	return out
}

func answerPoints(as []analysis.Answer) []AnswerPoint {
	var out []AnswerPoint
	for _, a := range as {
		p := AnswerPoint{Experiment: a.Experiment, Step: a.Step, Label: a.Label, Kind: a.Kind, RequestedRate: a.RequestedRate, Baseline: a.Baseline}
		for _, r := range a.Rows {
			p.Rows = append(p.Rows, AnswerRow{Mesh: r.Mesh, Baseline: r.Baseline, Repeats: r.Repeats, P50Ms: ms(r.P50), P99Ms: ms(r.P99),
				AddedP50: added(r.AddedP50), AddedP99: added(r.AddedP99),
				ProxyCoresPer1000RPS: Num(r.ProxyCoresPer1000RPS), SUTCoresPer1000RPS: Num(r.SUTCoresPer1000RPS),
				ProxyMemMiB: Num(r.ProxyRSS / (1 << 20)), Proxies: r.Proxies, Requests: r.Requests, Errors: r.Errors, ErrorRate: Num(r.ErrorRate),
				Security: r.Security, Verdict: r.Verdict, Flags: r.Flags})
		}
		for _, rk := range a.Rankings {
			row := RankingRow{Metric: string(rk.Metric), Order: rk.Order, Line: rk.Line()}
			for _, st := range rk.Steps {
				c := st.Comparison
				row.Steps = append(row.Steps, RankStepRow{Faster: st.Faster, Slower: st.Slower, Symbol: st.Symbol(), Resolved: st.Resolved,
					Verdict: string(c.Verdict), DeltaMs: Num(c.Delta.Value / 1000), LoMs: Num(c.Delta.Lo / 1000), HiMs: Num(c.Delta.Hi / 1000),
					Pct: Num(c.Pct.Value), PctLo: Num(c.Pct.Lo), PctHi: Num(c.Pct.Hi)})
			}
			p.Rankings = append(p.Rankings, row)
		}
		out = append(out, p)
	}
	return out
}

// added converts a latency comparison (µs) to the report's ms; nil stays nil.
func added(c *analysis.Comparison) *Added {
	if c == nil {
		return nil
	}
	return &Added{Ms: Num(c.Delta.Value / 1000), LoMs: Num(c.Delta.Lo / 1000), HiMs: Num(c.Delta.Hi / 1000),
		Pct: Num(c.Pct.Value), PctLo: Num(c.Pct.Lo), PctHi: Num(c.Pct.Hi), Verdict: string(c.Verdict)}
}

// Beside returns the labels of the flags shown beside a field of the row (see
// analysis.AnswerRow.Beside).
func (r AnswerRow) Beside(field string) []string {
	var out []string
	for _, f := range r.Flags {
		if f.Field == field || (f.Field == analysis.FieldLatency && (field == analysis.FieldP50 || field == analysis.FieldP99)) {
			out = append(out, f.Label)
		}
	}
	return out
}

func comparisonRows(cs []analysis.Comparison) []ComparisonRow {
	var out []ComparisonRow
	for _, c := range cs {
		f, unit := scale(c.Metric)
		out = append(out, ComparisonRow{Label: c.Label, Experiment: c.Experiment, Step: c.Step, Mesh: c.Mesh, Reference: c.Reference,
			Metric: string(c.Metric), Unit: unit, Base: Num(c.Base * f), Value: Num(c.Value * f),
			Delta: Num(c.Delta.Value * f), DeltaLo: Num(c.Delta.Lo * f), DeltaHi: Num(c.Delta.Hi * f),
			Pct: Num(c.Pct.Value), PctLo: Num(c.Pct.Lo), PctHi: Num(c.Pct.Hi), NoiseFloorPct: Num(c.NoiseFloorPct),
			NoiseSource: c.NoiseSource, Verdict: string(c.Verdict), Resampled: c.Unit, Paired: c.Paired, Repeats: c.Repeats})
	}
	return out
}

func capacityRows(an *analysis.Report) (SLOInfo, []CapacityRow) {
	slo := an.SLO
	info := SLOInfo{Text: slo.String(), P50Ms: float64(slo.P50) / float64(time.Millisecond), P99Ms: float64(slo.P99) / float64(time.Millisecond),
		MaxErrorRate: slo.MaxErrorRate, MinAchieved: slo.MinAchieved, KneeFactor: slo.KneeFactor}
	var out []CapacityRow
	for _, c := range an.Capacity {
		r := CapacityRow{Mesh: c.Mesh, Experiment: c.Experiment, XName: c.XName, Found: c.Found, MaxX: c.MaxX,
			MaxThroughput: c.MaxThroughput, Limit: c.Limit, HasKnee: c.HasKnee, KneeX: c.KneeX, KneeRule: c.KneeRule}
		for _, p := range c.Points {
			r.Points = append(r.Points, CapacityPoint{X: p.X, Throughput: p.Throughput, P50Ms: float64(p.P50) / 1000,
				P99Ms: float64(p.P99) / 1000, ErrorRate: p.ErrorRate, Meets: p.Meets, Why: p.Why})
		}
		out = append(out, r)
	}
	// A closed-loop capacity experiment at one connection count has no sweep, but its
	// throughput is the capacity measured.
	swept := map[[2]string]bool{}
	for _, c := range an.Capacity {
		swept[[2]string{c.Mesh, c.Experiment}] = true
	}
	for _, g := range an.Groups {
		if g.Kind != results.KindCapacity || swept[[2]string{g.Mesh, g.Experiment}] {
			continue
		}
		x, name := float64(g.Params.Connections), "connections"
		if g.Params.Users > 0 {
			x, name = float64(g.Params.Users), "users"
		}
		out = append(out, CapacityRow{Mesh: g.Mesh, Experiment: g.Experiment, XName: name, Found: true, MaxX: x, MaxThroughput: g.Throughput,
			Limit: "closed-loop maximum (" + g.Label + ")", KneeRule: "no sweep, no knee",
			Points: []CapacityPoint{{X: x, Throughput: g.Throughput, P50Ms: float64(g.P50) / 1000, P99Ms: float64(g.P99) / 1000, ErrorRate: g.ErrorRate, Meets: true}}})
	}
	return info, out
}

// spectrumQuantiles run from p0 to p99.999 at ten points per decade of 1/(1-q).
func spectrumQuantiles() []float64 {
	var qs []float64
	for k := 0; k <= 50; k++ {
		qs = append(qs, 100*(1-math.Pow(10, -float64(k)/10)))
	}
	return qs
}

func spectra(groups []*analysis.Group, order []string) []Spectrum {
	type pt struct {
		exp  string
		step int
	}
	pts, by := groupBy(groups, func(g *analysis.Group) pt { return pt{g.Experiment, g.Step} })
	qs := spectrumQuantiles()
	var out []Spectrum
	for _, p := range pts {
		gs := by[p]
		sort.SliceStable(gs, func(i, j int) bool { return indexOf(order, gs[i].Mesh) < indexOf(order, gs[j].Mesh) })
		sp := Spectrum{Experiment: p.exp, Step: p.step, Label: gs[0].Label}
		for _, g := range gs {
			h := mergedLatency(g)
			if h.TotalCount() == 0 {
				continue
			}
			ser := SpectrumSeries{Mesh: g.Mesh}
			for _, q := range qs {
				// Beyond what the sample can resolve the curve would be a flat line of max.
				if float64(h.TotalCount())*(1-q/100) < 1 && q > 0 {
					break
				}
				ser.Points = append(ser.Points, [2]float64{1 / (1 - q/100), float64(h.ValueAtQuantile(q)) / 1000})
			}
			ser.Points = append(ser.Points, [2]float64{math.Max(float64(h.TotalCount()), 1), float64(h.Max()) / 1000})
			sp.Series = append(sp.Series, ser)
		}
		out = append(out, sp)
	}
	return out
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return len(xs)
}

// bucketEdges are 1-2-5 steps (µs) from the largest edge at or below lo to the first
// edge above hi.
func bucketEdges(lo, hi int64) []int64 {
	var edges []int64
	for dec := int64(1); ; dec *= 10 {
		for _, m := range []int64{1, 2, 5} {
			e := m * dec
			if e <= lo {
				edges = edges[:0]
			}
			edges = append(edges, e)
			if e > hi || dec > math.MaxInt64/50 {
				return edges
			}
		}
	}
}

func fmtMicros(us int64) string {
	switch {
	case us >= 1_000_000:
		return strconv.FormatFloat(float64(us)/1e6, 'g', 4, 64) + " s"
	case us >= 1000:
		return strconv.FormatFloat(float64(us)/1e3, 'g', 4, 64) + " ms"
	}
	return strconv.FormatInt(us, 10) + " µs"
}

// groupBy buckets groups by key, keeping the keys in the order they first appear.
func groupBy[K comparable](groups []*analysis.Group, key func(*analysis.Group) K) ([]K, map[K][]*analysis.Group) {
	var order []K
	by := map[K][]*analysis.Group{}
	for _, g := range groups {
		k := key(g)
		if by[k] == nil {
			order = append(order, k)
		}
		by[k] = append(by[k], g)
	}
	return order, by
}

func heatmaps(groups []*analysis.Group) []Heatmap {
	type me struct{ mesh, exp string }
	order, by := groupBy(groups, func(g *analysis.Group) me { return me{g.Mesh, g.Experiment} })
	var out []Heatmap
	for _, k := range order {
		gs := by[k]
		if len(gs) < 2 {
			continue
		}
		sort.SliceStable(gs, func(i, j int) bool { return gs[i].Step < gs[j].Step })
		hs := make([]*hdrhistogram.Histogram, len(gs))
		lo, hi := int64(math.MaxInt64), int64(0)
		for i, g := range gs {
			hs[i] = mergedLatency(g)
			if hs[i].TotalCount() == 0 {
				continue
			}
			lo, hi = min(lo, hs[i].Min()), max(hi, hs[i].Max())
		}
		if hi == 0 {
			continue
		}
		edges := bucketEdges(lo, hi)
		hm := Heatmap{Mesh: k.mesh, Experiment: k.exp}
		for i := 0; i+1 < len(edges); i++ {
			hm.Rows = append(hm.Rows, fmtMicros(edges[i])+" – "+fmtMicros(edges[i+1]))
		}
		for c, g := range gs {
			hm.Columns = append(hm.Columns, columnLabel(g))
			counts := make([]int64, len(edges)-1)
			for _, bar := range hs[c].Distribution() {
				if bar.Count == 0 {
					continue
				}
				// Bars are narrower than buckets, so a bar's lower end places it.
				r := sort.Search(len(edges), func(i int) bool { return edges[i] > bar.From }) - 1
				r = min(max(r, 0), len(counts)-1)
				counts[r] += bar.Count
			}
			total := hs[c].TotalCount()
			for r, n := range counts {
				if n == 0 || total == 0 {
					continue
				}
				hm.Cells = append(hm.Cells, [4]float64{float64(c), float64(r), 100 * float64(n) / float64(total), float64(n)})
			}
		}
		out = append(out, hm)
	}
	return out
}

func columnLabel(g *analysis.Group) string {
	p := g.Params
	switch {
	case p.RequestedRate > 0:
		return analysis.RateLabel(p.RequestedRate)
	case p.Users > 0:
		return strconv.Itoa(p.Users) + " users"
	case p.Connections > 0:
		return strconv.Itoa(p.Connections) + " conns"
	}
	return "step " + strconv.Itoa(g.Step)
}

func timeSeries(run *results.Run) []TimeSeries {
	type iv struct {
		t, dur    float64
		rate, p99 float64
		errs      float64
	}
	per := map[string][]iv{}
	for i := range run.Trials {
		t := &run.Trials[i]
		for _, x := range t.Result.Intervals {
			p99 := x.P99
			if p99 == 0 && x.Histogram != nil {
				p99 = x.Histogram.ValueAtQuantile(99)
			}
			per[t.Mesh] = append(per[t.Mesh], iv{t: x.Start.Sub(run.Started).Seconds(), dur: x.Duration.Seconds(),
				rate: x.AchievedRate, p99: float64(p99) / 1000, errs: float64(x.Errors)})
		}
	}
	var out []TimeSeries
	for _, m := range meshOrder(run) {
		ivs := per[m]
		if len(ivs) == 0 {
			continue
		}
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].t < ivs[j].t })
		ts := TimeSeries{Mesh: m}
		for i, x := range ivs {
			if i > 0 && x.t-ivs[i-1].t > 2*math.Max(x.dur, ivs[i-1].dur) {
				ts.T = append(ts.T, (x.t+ivs[i-1].t)/2)
				ts.Rate, ts.P99Ms, ts.Errors = append(ts.Rate, nil), append(ts.P99Ms, nil), append(ts.Errors, nil)
			}
			rate, p99, errs := x.rate, x.p99, x.errs
			ts.T = append(ts.T, x.t)
			ts.Rate, ts.P99Ms, ts.Errors = append(ts.Rate, &rate), append(ts.P99Ms, &p99), append(ts.Errors, &errs)
		}
		out = append(out, ts)
	}
	return out
}

// resourceExperiments picks the experiments resources are reported from: those run
// at a fixed load when there are any (a closed-loop capacity trial runs every mesh at
// a different rate, so its CPU says nothing comparable), else every experiment.
func resourceExperiments(run *results.Run) map[string]bool {
	return experimentsWith(run, func(t *results.Trial) bool { return len(t.Result.Resources) > 0 })
}

// networkExperiments picks the experiments network rows are reported from, by the
// same rule as resourceExperiments.
func networkExperiments(run *results.Run) map[string]bool {
	return experimentsWith(run, func(t *results.Trial) bool { return len(t.Result.Network) > 0 })
}

func experimentsWith(run *results.Run, has func(*results.Trial) bool) map[string]bool {
	fixed, all := map[string]bool{}, map[string]bool{}
	for i := range run.Trials {
		t := &run.Trials[i]
		if !has(t) {
			continue
		}
		all[t.Experiment] = true
		if t.Kind != results.KindCapacity && t.Kind != results.KindConnections {
			fixed[t.Experiment] = true
		}
	}
	if len(fixed) > 0 {
		return fixed
	}
	return all
}

// resourceRows differentiates the cumulative CPU counters of every component within
// each trial, then pools trials: average of the trial averages, peak of the peaks.
func resourceRows(run *results.Run) []ResourceRow {
	type key struct{ mesh, component, role, pod string }
	type acc struct {
		avgCores, avgMem, avgPSS []float64
		peakCores                float64
		peakMem                  int64
		samples                  int
	}
	var order []key
	by := map[key]*acc{}
	use := resourceExperiments(run)
	for i := range run.Trials {
		t := &run.Trials[i]
		if !use[t.Experiment] || t.Result.Excluded() {
			continue
		}
		per := map[key][]results.ResourceSample{}
		var korder []key
		for _, s := range t.Result.Resources {
			k := key{t.Mesh, s.Component, s.Role, s.Pod}
			if per[k] == nil {
				korder = append(korder, k)
			}
			per[k] = append(per[k], s)
		}
		for _, k := range korder {
			ss := per[k]
			sort.Slice(ss, func(i, j int) bool { return ss[i].T.Before(ss[j].T) })
			a := by[k]
			if a == nil {
				a = &acc{}
				by[k] = a
				order = append(order, k)
			}
			a.samples += len(ss)
			var memSum, pssSum float64
			from := 0
			for j, s := range ss {
				memSum += float64(s.RSSBytes)
				pssSum += float64(s.PSSBytes)
				a.peakMem = max(a.peakMem, s.RSSBytes)
				// Peak CPU is measured over at least peakWindow: two samples a millisecond
				// apart would turn one scheduler tick into dozens of "cores".
				for from+1 < j && s.T.Sub(ss[from+1].T) >= peakWindow {
					from++
				}
				if dt := s.T.Sub(ss[from].T); dt >= peakWindow {
					a.peakCores = math.Max(a.peakCores, (cpu(s)-cpu(ss[from]))/dt.Seconds())
				}
			}
			a.avgMem = append(a.avgMem, memSum/float64(len(ss)))
			a.avgPSS = append(a.avgPSS, pssSum/float64(len(ss)))
			if span := ss[len(ss)-1].T.Sub(ss[0].T).Seconds(); span > 0 {
				a.avgCores = append(a.avgCores, (cpu(ss[len(ss)-1])-cpu(ss[0]))/span)
			}
		}
	}
	// Mesh by mesh in the run's order, the mesh's own components first.
	meshes := meshOrder(run)
	rank := func(k key) int {
		if meshRoles[k.role] {
			return 0
		}
		if k.role == "load-generator" {
			return 2
		}
		return 1
	}
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if mi, mj := indexOf(meshes, a.mesh), indexOf(meshes, b.mesh); mi != mj {
			return mi < mj
		}
		if ri, rj := rank(a), rank(b); ri != rj {
			return ri < rj
		}
		if a.component != b.component {
			return a.component < b.component
		}
		return a.pod < b.pod
	})
	var out []ResourceRow
	for _, k := range order {
		a := by[k]
		out = append(out, ResourceRow{Mesh: k.mesh, Component: k.component, Role: k.role, Pod: k.pod,
			AvgCores: mean(a.avgCores), PeakCores: a.peakCores, AvgMemMiB: mean(a.avgMem) / (1 << 20), AvgPSSMiB: mean(a.avgPSS) / (1 << 20),
			PeakMemMiB: float64(a.peakMem) / (1 << 20), Samples: a.samples})
	}
	return out
}

// networkRows pools the analysis's per-point network rows of the chosen experiments
// into one row per mesh, pod, node and interface: rates weighted by trials (so the
// mean of every trial's rate), drops summed. Meshes in the run's order, then pod,
// node, interface.
func networkRows(usage []analysis.NetworkUsage, use map[string]bool, meshes []string) []NetworkRow {
	type key struct{ mesh, pod, node, iface string }
	by := map[key]*NetworkRow{}
	var order []key
	for _, u := range usage {
		if !use[u.Experiment] || u.Trials == 0 {
			continue
		}
		k := key{u.Mesh, u.Pod, u.Node, u.Interface}
		r := by[k]
		if r == nil {
			r = &NetworkRow{Mesh: u.Mesh, Pod: u.Pod, Node: u.Node, Interface: u.Interface}
			by[k] = r
			order = append(order, k)
		}
		n := float64(u.Trials)
		r.RxBytesPerSec += u.RxBytesPerSec * n
		r.TxBytesPerSec += u.TxBytesPerSec * n
		r.RxPacketsPerSec += u.RxPacketsPerSec * n
		r.TxPacketsPerSec += u.TxPacketsPerSec * n
		r.RxDropped += u.RxDropped
		r.TxDropped += u.TxDropped
		r.Trials += u.Trials
	}
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if mi, mj := indexOf(meshes, a.mesh), indexOf(meshes, b.mesh); mi != mj {
			return mi < mj
		}
		if a.pod != b.pod {
			return a.pod < b.pod
		}
		if a.node != b.node {
			return a.node < b.node
		}
		return a.iface < b.iface
	})
	out := make([]NetworkRow, 0, len(order))
	for _, k := range order {
		r := *by[k]
		n := float64(r.Trials)
		r.RxBytesPerSec, r.TxBytesPerSec = r.RxBytesPerSec/n, r.TxBytesPerSec/n
		r.RxPacketsPerSec, r.TxPacketsPerSec = r.RxPacketsPerSec/n, r.TxPacketsPerSec/n
		out = append(out, r)
	}
	return out
}

// peakWindow is the shortest span peak CPU is averaged over.
const peakWindow = time.Second

func cpu(s results.ResourceSample) float64 { return s.CPUUserSeconds + s.CPUSysSeconds }

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func costRows(res []ResourceRow, groups []GroupRow, order []string, baseline string, prices *cost.Table, instance string) (CostModel, []CostRow) {
	var cm CostModel
	in := prices.Instance(instance)
	if in != nil {
		cm = CostModel{Instance: in.Name, VCPU: in.VCPU, MemoryGiB: in.MemoryGiB, PricePerHour: in.PricePerHour, Currency: prices.Currency,
			HoursPerMonth: prices.HoursPerMonth, Region: in.Region, Source: in.Source, AsOf: in.AsOf, Table: prices.Origin}
	}
	var rows []CostRow
	for _, m := range order {
		c := CostRow{Mesh: m}
		seen := false
		for _, r := range res {
			if r.Mesh != m || r.Role == "load-generator" {
				continue
			}
			seen = true
			mem := r.AvgMemMiB
			if r.AvgPSSMiB > 0 {
				mem = r.AvgPSSMiB
			}
			c.VCPU += r.AvgCores
			c.MemMiB += mem
			if meshRoles[r.Role] {
				c.MeshVCPU += r.AvgCores
				c.MeshMemMiB += mem
			}
		}
		if !seen {
			continue
		}
		var reqs, secs float64
		for _, g := range groups {
			if g.Mesh == m {
				reqs += float64(g.Requests - g.Errors)
				secs += g.DurationSeconds
			}
		}
		if secs > 0 {
			c.Throughput = reqs / secs
		}
		rows = append(rows, c)
	}
	var base *CostRow
	for i := range rows {
		if rows[i].Mesh == baseline {
			base = &rows[i]
		}
	}
	if base == nil || in == nil {
		return cm, rows
	}
	baseUsage := cost.Usage{VCPU: base.VCPU, MemoryMiB: base.MemMiB}
	for i := range rows {
		c := &rows[i]
		e, err := prices.Estimate(in.Name, baseUsage, cost.Usage{VCPU: c.VCPU, MemoryMiB: c.MemMiB}, c.Throughput)
		if err != nil {
			continue
		}
		c.ExtraVCPU, c.ExtraMemGiB, c.InstanceEquivalents, c.BoundBy = e.ExtraVCPU, e.ExtraMemoryGiB, e.InstanceEquivalents, e.BoundBy
		c.PerMonth, c.PerMillionRequests = e.PerMonth, e.PerMillionRequests
	}
	return cm, rows
}

// enrollment mirrors the JSON the mesh package stores as the equivalence check; only
// the fields the report shows are read, so new fields do not break old reports.
type enrollment struct {
	MTLS             string   `json:"mtls"`
	Pass             bool     `json:"pass"`
	Failures         []string `json:"failures"`
	PlaintextRefused *bool    `json:"plaintext_refused"`
	// Plaintext and PlaintextControl are the plaintext requests from outside the mesh
	// and their positive controls (mesh.Enrollment); runs stored before they were kept
	// have neither.
	Plaintext        []meshprobe.PlaintextProbe `json:"plaintext"`
	PlaintextControl []meshprobe.PlaintextProbe `json:"plaintext_control"`
	Pods             []struct {
		Pod          string `json:"pod"`
		Service      string `json:"service"`
		Meshed       bool   `json:"meshed"`
		Sidecar      bool   `json:"sidecar"`
		Answered     bool   `json:"answered"`
		MTLSObserved string `json:"mtls_observed"`
		// OutsidePlaintext: the check's own plaintext from outside the mesh, which
		// a permissive pod accepted (left out of MTLSObserved).
		OutsidePlaintext uint64 `json:"outside_plaintext_requests"`
	} `json:"pods"`
}

func checkRows(run *results.Run, groups []*analysis.Group) []CheckRow {
	var out []CheckRow
	for _, m := range run.Meshes {
		switch {
		case len(m.Enrollment) == 0 && m.Profile == results.BaselineProfile && run.Substrate == "kubernetes":
			// On a cluster the baseline installs nothing and its pods are plain pods:
			// there is no mesh to have enrolled them.
			out = append(out, CheckRow{Mesh: m.Label, Check: "enrollment", NotApplicable: true,
				Detail: "the baseline installs no mesh on the cluster: there is nothing to enroll"})
		case len(m.Enrollment) == 0:
			out = append(out, CheckRow{Mesh: m.Label, Check: "enrollment", Pass: false, Detail: "no equivalence check stored with this run"})
		default:
			var e enrollment
			if err := json.Unmarshal(m.Enrollment, &e); err != nil {
				out = append(out, CheckRow{Mesh: m.Label, Check: "enrollment", Pass: false, Detail: "stored check is unreadable: " + err.Error()})
			} else {
				out = append(out, enrollmentChecks(m, e)...)
			}
		}
		total, behind, bypassed := 0, 0, 0
		for _, g := range groups {
			if g.Mesh == m.Label {
				total += g.Repeats
				behind += g.GeneratorBehind
				bypassed += g.ProxyBypassed
			}
		}
		if total > 0 {
			out = append(out, CheckRow{Mesh: m.Label, Check: "load generator kept up", Pass: behind == 0,
				Detail: fmt.Sprintf("%d of %d trials fell behind their schedule", behind, total)})
		}
		if total > 0 && m.Profile != results.BaselineProfile {
			out = append(out, CheckRow{Mesh: m.Label, Check: "every request crossed the mesh's proxies at the entry service", Pass: bypassed == 0,
				Detail: fmt.Sprintf("in %d of %d trials the proxies counted fewer requests (or, for L4 proxies, no connection) than were answered", bypassed, total)})
		}
		if row, ok := saturationCheck(run, m.Label); ok {
			out = append(out, row)
		}
		if row, ok := faultCheck(run, m.Label); ok {
			out = append(out, row)
		}
		if row, ok := mixCheck(run, m); ok {
			out = append(out, row)
		}
	}
	return out
}

// mixCheck says whether each service's versions served the shares of its requests the
// graph's weights intend, and how the mesh balances (a baseline per request, by its
// callers, or per connection, through the testbed's kube-proxy-like service VIPs).
func mixCheck(run *results.Run, m results.Mesh) (CheckRow, bool) {
	judged, skewed := 0, 0
	var worst string
	for i := range run.Trials {
		t := &run.Trials[i]
		if t.Mesh != m.Label || len(t.Result.Mix) == 0 || t.Result.Excluded() {
			continue
		}
		judged++
		if !t.Result.HasFlag(results.FlagMixSkewed) {
			continue
		}
		skewed++
		if worst == "" {
			var parts []string
			for _, v := range t.Result.Mix {
				parts = append(parts, fmt.Sprintf("%s %s %.0f%% (intended %.0f%%)", v.Service, v.Version, 100*v.Share, 100*v.Intended))
			}
			worst = fmt.Sprintf("; e.g. trial %d: %s", t.ID, strings.Join(parts, ", "))
		}
	}
	if judged == 0 {
		return CheckRow{}, false
	}
	balancing := "the mesh's proxies balance"
	switch {
	case m.Profile == results.BaselineProfile && m.Options["balancing"] == mesh.BalancePerRequest:
		balancing = "no mesh, balancing: per-request: each caller picks a pod per request by the versions' weights, as the meshes' proxies do"
	case m.Profile == results.BaselineProfile:
		// runs stored before the option existed balanced this way
		balancing = "no mesh, balancing: per-connection: the service VIPs pick an endpoint per connection, as kube-proxy does, so kept-alive connections fix the split at bring-up"
	}
	return CheckRow{Mesh: m.Label, Check: "request mix matches the graph's weights", Pass: skewed == 0,
		Detail: fmt.Sprintf("%d of %d trials off by more than %.0f points for some service (%s)%s", skewed, judged, 100*results.MixTolerance, balancing, worst)}, true
}

// saturationCheck says whether the mesh's system under test kept up with every
// open-loop trial, and where it did not, with the evidence; trials the runner backed off
// from are counted apart, since they are left out.
func saturationCheck(run *results.Run, mesh string) (CheckRow, bool) {
	judged, backedOff := 0, 0
	var saturated []string
	for i := range run.Trials {
		t := &run.Trials[i]
		if t.Mesh != mesh || t.Result.Saturation == nil && !t.Result.Saturated() {
			continue
		}
		judged++
		switch {
		case t.Result.HasFlag(results.FlagBackedOff):
			backedOff++
		case t.Result.Saturated() && !t.Result.Excluded():
			what := "saturated"
			if s := t.Result.Saturation; s != nil {
				what = s.String()
			}
			saturated = append(saturated, fmt.Sprintf("trial %d (%s, repeat %d): %s", t.ID, t.Experiment, t.Repeat+1, what))
		}
	}
	if judged == 0 {
		return CheckRow{}, false
	}
	row := CheckRow{Mesh: mesh, Check: "the system under test kept up with the load (no saturated trial)", Pass: len(saturated) == 0,
		Detail: fmt.Sprintf("its backlog held steady, with no sends queued for a connection, in all %d open-loop trials", judged-backedOff)}
	if len(saturated) > 0 {
		row.Detail = strings.Join(saturated, "; ") + ". Their latency is that of a queue; verdicts at their points say saturated"
	}
	if backedOff > 0 {
		row.Detail += fmt.Sprintf(" (%d trials saturated at a rate the runner then lowered; they are kept but left out)", backedOff)
	}
	return row, true
}

// faultCheck says whether every process of the mesh's system under test stayed up
// through every trial, and which did not, when, and what became of the trial.
func faultCheck(run *results.Run, mesh string) (CheckRow, bool) {
	trials, superseded := 0, 0
	var faults []string
	for i := range run.Trials {
		t := &run.Trials[i]
		if t.Mesh != mesh {
			continue
		}
		trials++
		if t.Result.HasFlag(results.FlagSuperseded) && !t.Result.HasFlag(results.FlagFault) {
			superseded++
		}
		for _, f := range t.Result.Faults {
			faults = append(faults, fmt.Sprintf("trial %d (%s, repeat %d): %s", t.ID, t.Experiment, t.Repeat+1, f))
		}
	}
	if trials == 0 {
		return CheckRow{}, false
	}
	row := CheckRow{Mesh: mesh, Check: "no process of the system under test exited during a trial", Pass: len(faults) == 0,
		Detail: fmt.Sprintf("every process stayed up through all %d trials", trials)}
	if len(faults) > 0 {
		row.Detail = strings.Join(faults, "; ") + ". Fault trials are kept but left out of every result, capacity and verdict; the runner brought the mesh up again and measured them once more"
		if superseded > 0 {
			row.Detail += fmt.Sprintf(" (with %d earlier trials of the same attempt)", superseded)
		}
	}
	return row, true
}

func enrollmentChecks(m results.Mesh, e enrollment) []CheckRow {
	meshed, services, answered := 0, 0, 0
	mtls, plain, outside := 0, 0, uint64(0)
	for _, p := range e.Pods {
		outside += p.OutsidePlaintext
		if p.Meshed {
			meshed++
		}
		if p.Answered {
			answered++
		}
		// Only pods whose inbound the check looked at on the wire, as the answer's
		// security column counts them: an ingress gateway takes plaintext from outside
		// by design and is not looked at.
		if p.Service != "" && p.MTLSObserved != "" {
			services++
			switch p.MTLSObserved {
			case "mtls":
				mtls++
			case "plaintext", "mixed":
				plain++
			}
		}
	}
	detail := fmt.Sprintf("%d/%d pods meshed, %d answered the probe", meshed, len(e.Pods), answered)
	if len(e.Failures) > 0 {
		detail += "; " + fmt.Sprint(e.Failures)
	}
	out := []CheckRow{{Mesh: m.Label, Check: "enrollment", Pass: e.Pass, Detail: detail}}
	if e.MTLS != "" && e.MTLS != "off" && e.MTLS != "disable" && services > 0 {
		detail := fmt.Sprintf("%d/%d service pods saw only mTLS inbound, %d saw plaintext", mtls, services, plain)
		if outside > 0 {
			detail = fmt.Sprintf("%d/%d service pods saw only mTLS from the mesh's pods, %d saw plaintext; the check's own %d plaintext requests from outside the mesh were accepted, as %s mTLS allows",
				mtls, services, plain, outside, e.MTLS)
		}
		out = append(out, CheckRow{Mesh: m.Label, Check: "mTLS on the wire (" + e.MTLS + ")", Pass: services > 0 && mtls == services, Detail: detail})
	}
	if e.PlaintextRefused != nil {
		out = append(out, CheckRow{Mesh: m.Label, Check: "plaintext from outside refused", Pass: *e.PlaintextRefused, Detail: plaintextDetail(e)})
	}
	return out
}

// plaintextDetail says how the plaintext requests from outside the mesh ended and
// whether their positive controls were answered, the same way for either platform.
func plaintextDetail(e enrollment) string {
	if len(e.Plaintext) == 0 {
		return map[bool]string{true: "a plaintext request from outside the mesh was refused by every service pod", false: "a plaintext request from outside the mesh got through"}[*e.PlaintextRefused]
	}
	return meshprobe.DescribeProof(e.Plaintext, e.PlaintextControl)
}

func provenance(run *results.Run) ProvenanceSummary {
	p := ProvenanceSummary{Provenance: run.Provenance, StudyPath: run.StudyPath, StudyFile: string(run.StudyFile), Seed: run.Seed}
	for _, c := range run.Provenance.Configs {
		sum := c.SHA256
		if sum == "" {
			sum = results.SHA256Hex(c.Content)
		}
		p.Configs = append(p.Configs, ConfigDigest{Name: c.Name, Mesh: c.Mesh, Component: c.Component, SHA256: sum, Bytes: len(c.Content)})
	}
	p.Provenance.Configs = nil
	return p
}

// EffortRow is what installing one mesh on Kubernetes took, over the run's installs of it
// (one per bring-up).
type EffortRow struct {
	Mesh     string `json:"mesh"`
	Installs int    `json:"installs"`
	// ReadySeconds is the median time from the start of an install until every object
	// was ready.
	ReadySeconds Num    `json:"ready_seconds"`
	Objects      int    `json:"objects"`
	CRDs         int    `json:"crds"`
	Values       int    `json:"values"`
	Charts       string `json:"charts"`
}

// effortRows reads the install records of the run's provenance, per mesh in the run's
// order.
func effortRows(run *results.Run) []EffortRow {
	byMesh := map[string][]results.InstallEffort{}
	for _, gc := range run.Provenance.Configs {
		if gc.Name != results.InstallEffortConfig {
			continue
		}
		var e results.InstallEffort
		if json.Unmarshal(gc.Content, &e) == nil {
			byMesh[gc.Mesh] = append(byMesh[gc.Mesh], e)
		}
	}
	var rows []EffortRow
	for _, m := range meshOrder(run) {
		installs := byMesh[m]
		if len(installs) == 0 {
			continue
		}
		var ready []float64
		for _, e := range installs {
			ready = append(ready, e.Ready.Seconds())
		}
		sort.Float64s(ready)
		last := installs[len(installs)-1]
		var charts []string
		for _, ch := range last.Charts {
			c := ch.Chart
			if ch.Version != "" {
				c += " " + ch.Version
			}
			charts = append(charts, c)
		}
		rows = append(rows, EffortRow{Mesh: m, Installs: len(installs), ReadySeconds: Num(ready[len(ready)/2]),
			Objects: last.Objects, CRDs: len(last.CRDs), Values: last.Values, Charts: strings.Join(charts, ", ")})
	}
	return rows
}
