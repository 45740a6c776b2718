package analysis

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/meshmark/meshmark/internal/results"
)

// Answer is what a reader wants first at one load point: per mesh, the latency it adds
// to the baseline's at p50 and p99 with intervals, the CPU and memory it costs, its
// errors and security posture, and a one-line verdict, each number with the flags that
// qualify it beside it; and with several meshes, how they rank among themselves.
type Answer struct {
	Point
	Label         string  `json:"label"`
	Kind          string  `json:"kind"`
	RequestedRate float64 `json:"requested_rate,omitempty"`
	// Baseline is the baseline's label ("" when it was not measured here).
	Baseline string      `json:"baseline"`
	Rows     []AnswerRow `json:"rows"`
	// Rankings rank the meshes other than the baseline on RankedMetrics.
	Rankings []Ranking `json:"rankings,omitempty"`
}

// AnswerRow is one mesh at one point.
type AnswerRow struct {
	Mesh     string `json:"mesh"`
	Baseline bool   `json:"baseline,omitempty"`
	Repeats  int    `json:"repeats"`
	// P50 and P99 are the pooled percentiles (µs); AddedP50 and AddedP99 compare them
	// with the baseline's (nil for the baseline and where it was not measured).
	P50      int64       `json:"p50_us"`
	P99      int64       `json:"p99_us"`
	AddedP50 *Comparison `json:"added_p50,omitempty"`
	AddedP99 *Comparison `json:"added_p99,omitempty"`
	// ProxyCoresPer1000RPS is the CPU of the mesh's proxies (sidecars, node proxies,
	// gateways) per 1000 req/s served; SUTCoresPer1000RPS that of every sampled
	// process of the system under test (all but the load generator). NaN when not
	// sampled.
	ProxyCoresPer1000RPS float64 `json:"proxy_cores_per_1000_rps"`
	SUTCoresPer1000RPS   float64 `json:"sut_cores_per_1000_rps"`
	// ProxyRSS is the memory of the mesh's proxies, summed (bytes, mean RSS); 0 when
	// the mesh runs none.
	ProxyRSS   float64 `json:"proxy_rss_bytes"`
	Proxies    int     `json:"proxies"`
	Requests   int64   `json:"requests"`
	Errors     int64   `json:"errors"`
	ErrorRate  float64 `json:"error_rate"`
	Throughput float64 `json:"throughput"`
	// Security is the posture in a few words: mTLS mode and what the enrollment
	// check saw of it, plaintext refused or not, security probes.
	Security string `json:"security"`
	Verdict  string `json:"verdict"`
	Flags    []Flag `json:"flags,omitempty"`
}

// Fields of an answer row a Flag can stand beside.
const (
	FieldMesh     = "mesh"     // the row as a whole
	FieldLatency  = "latency"  // both p50 and p99
	FieldP50      = "p50"      // the added p50
	FieldP99      = "p99"      // the added p99
	FieldCPU      = "cpu"      // CPU per 1000 req/s
	FieldMemory   = "memory"   // proxies' memory
	FieldErrors   = "errors"   // errors
	FieldSecurity = "security" // security posture
)

// Flag qualifies a number of an answer row: Label is the few words shown beside it,
// Detail the sentence with the evidence, listed under the table.
type Flag struct {
	Field  string `json:"field"`
	Name   string `json:"name"` // a trial flag (results.Flag*), a verdict, "slo", "excluded", ...
	Label  string `json:"label"`
	Detail string `json:"detail,omitempty"`
	// Trials of Of carry it, for a flag of trials.
	Trials int `json:"trials,omitempty"`
	Of     int `json:"of,omitempty"`
}

// Beside returns the flags shown beside a field: those of the field itself and, for
// p50 and p99, those of the latency as a whole.
func (r AnswerRow) Beside(field string) []Flag {
	var out []Flag
	for _, f := range r.Flags {
		if f.Field == field || (f.Field == FieldLatency && (field == FieldP50 || field == FieldP99)) {
			out = append(out, f)
		}
	}
	return out
}

// trialFlagField says which number a trial flag qualifies; a flag not listed here
// (one added later) stands beside the mesh, so it is never dropped.
var trialFlagField = map[string]string{
	results.FlagGeneratorBehind: FieldLatency,
	results.FlagTargetSaturated: FieldLatency,
	results.FlagMixSkewed:       FieldLatency,
	results.FlagOutlier:         FieldP99,
	results.FlagProxyBypassed:   FieldSecurity,
	results.FlagProxyUnreadable: FieldSecurity,
}

// spoilsLatency are trial flags whose trials did not measure the mesh's latency: the
// verdict names them before any number.
var spoilsLatency = map[string]string{
	results.FlagTargetSaturated: "saturated",
	results.FlagGeneratorBehind: "the load generator fell behind",
}

// proxyRoles are the roles whose processes carry the mesh's traffic.
var proxyRoles = map[string]bool{"sidecar": true, "node-proxy": true, "gateway": true, "proxy": true}

// Answers builds the answer of every load point of a run, in the order the points
// were first measured. Closed-loop capacity points are left out (each mesh ran at its
// own rate; see CapacityLines).
func Answers(run *results.Run, rep *Report) []Answer {
	rankings := Rank(run, rep)
	var out []Answer
	for _, pt := range points(rep.Groups) {
		var at []*Group
		for _, g := range rep.Groups {
			if g.Experiment == pt.Experiment && g.Step == pt.Step {
				at = append(at, g)
			}
		}
		if at[0].Kind == results.KindCapacity {
			continue
		}
		a := Answer{Point: pt, Label: at[0].Label, Kind: at[0].Kind, RequestedRate: at[0].Params.RequestedRate}
		// Meshes in the run's order, the baseline first.
		order := func(g *Group) int {
			if g.Mesh == rep.Baseline {
				return -1
			}
			return slices.IndexFunc(run.Meshes, func(m results.Mesh) bool { return m.Label == g.Mesh })
		}
		sort.SliceStable(at, func(i, j int) bool { return order(at[i]) < order(at[j]) })
		for _, g := range at {
			if g.Mesh == rep.Baseline {
				a.Baseline = g.Mesh
			}
			a.Rows = append(a.Rows, answerRow(run, rep, g))
		}
		for _, r := range rankings {
			if r.Point == pt {
				a.Rankings = append(a.Rankings, r)
			}
		}
		out = append(out, a)
	}
	return out
}

func answerRow(run *results.Run, rep *Report, g *Group) AnswerRow {
	r := AnswerRow{Mesh: g.Mesh, Baseline: g.Mesh == rep.Baseline, Repeats: g.Repeats, P50: g.P50, P99: g.P99,
		Requests: g.Requests, Errors: g.Errors, ErrorRate: g.ErrorRate, Throughput: g.Throughput,
		ProxyCoresPer1000RPS: math.NaN(), SUTCoresPer1000RPS: math.NaN()}
	for i := range rep.Comparisons {
		c := &rep.Comparisons[i]
		if c.Mesh != g.Mesh || c.Point != (Point{g.Experiment, g.Step}) {
			continue
		}
		switch c.Metric {
		case P50:
			r.AddedP50 = c
		case P99:
			r.AddedP99 = c
		}
	}
	var proxyCores, sutCores float64
	sampled, sutSampled := false, false
	for _, u := range rep.Resources {
		if u.Key != g.Key || u.Role == "load-generator" {
			continue
		}
		sutCores += u.CPUCores
		sutSampled = true
		if proxyRoles[u.Role] {
			proxyCores += u.CPUCores
			r.ProxyRSS += u.RSSMean
			r.Proxies += u.Processes
			sampled = true
		}
	}
	if g.Throughput > 0 {
		if sampled {
			r.ProxyCoresPer1000RPS = proxyCores / (g.Throughput / 1000)
		} else if sutSampled {
			r.ProxyCoresPer1000RPS = 0 // sampled, and no proxy among what ran
		}
		if sutSampled {
			r.SUTCoresPer1000RPS = sutCores / (g.Throughput / 1000)
		}
	}
	var sec []Flag
	r.Security, sec = securityPosture(run, g.Mesh)
	r.Flags = append(r.Flags, sec...)
	r.Flags = append(r.Flags, groupFlags(rep, g)...)
	for _, c := range []*Comparison{r.AddedP50, r.AddedP99} {
		if c == nil || c.Verdict == Worse || c.Verdict == Better || saidBeside(r.Flags, string(c.Metric), string(c.Verdict)) {
			continue
		}
		f := Flag{Field: string(c.Metric), Name: string(c.Verdict), Label: string(c.Verdict)}
		switch c.Verdict {
		case Inconclusive:
			f.Label = "inconclusive"
		case Equal:
			f.Label = fmt.Sprintf("equal (±%g%%)", c.Margin)
		}
		r.Flags = append(r.Flags, f)
	}
	for _, miss := range rep.SLO.Misses(g) {
		field := FieldMesh
		switch miss.Metric {
		case P50:
			field = FieldP50
		case P99:
			field = FieldP99
		case ErrorRate:
			field = FieldErrors
		}
		label := "breaks SLO"
		if miss.Metric == Throughput {
			label = fmt.Sprintf("served %.0f%%, breaks SLO", 100*g.Throughput/g.Params.RequestedRate)
		}
		r.Flags = append(r.Flags, Flag{Field: field, Name: "slo", Label: label, Detail: miss.Why + ": breaks the SLO (" + rep.SLO.String() + ")"})
	}
	r.Verdict = rowVerdict(rep, r, g)
	return r
}

// saidBeside reports whether a flag beside field already says word (a comparison's
// "saturated" verdict beside a latency its trials' "target saturated 2/3" qualifies).
func saidBeside(flags []Flag, field, word string) bool {
	for _, f := range flags {
		if (f.Field == field || f.Field == FieldLatency) && strings.Contains(f.Label, word) {
			return true
		}
	}
	return false
}

// groupFlags are the flags its trials carry, its excluded trials and its outliers.
func groupFlags(rep *Report, g *Group) []Flag {
	var out []Flag
	var names []string
	trials := map[string][]string{}
	for _, t := range g.Trials {
		flags := slices.Clone(t.Result.Flags)
		if t.Result.Generator.Behind && !slices.Contains(flags, results.FlagGeneratorBehind) {
			flags = append(flags, results.FlagGeneratorBehind)
		}
		for _, f := range flags {
			if trials[f] == nil {
				names = append(names, f)
			}
			trials[f] = append(trials[f], trialName(t))
		}
	}
	for _, name := range names {
		field, ok := trialFlagField[name]
		if !ok {
			field = FieldMesh
		}
		words := strings.ReplaceAll(name, "-", " ")
		out = append(out, Flag{Field: field, Name: name, Label: fmt.Sprintf("%s %d/%d", words, len(trials[name]), g.Repeats),
			Detail: fmt.Sprintf("%s in %d of %d trials (%s)", words, len(trials[name]), g.Repeats, strings.Join(trials[name], ", ")),
			Trials: len(trials[name]), Of: g.Repeats})
	}
	var excluded []string
	for _, x := range rep.Excluded {
		if x.Key == g.Key {
			why := strings.ReplaceAll(x.Flag, "-", " ")
			switch {
			case x.Flag == results.FlagFault && len(x.Faults) > 0:
				why = "fault: " + x.Faults[0].String()
			case x.Flag == results.FlagSuperseded:
				why = "its attempt was measured again"
			}
			excluded = append(excluded, fmt.Sprintf("trial %d, repeat %d: %s", x.TrialID, x.Repeat+1, why))
		}
	}
	if len(excluded) > 0 {
		out = append(out, Flag{Field: FieldMesh, Name: "excluded", Label: plural(len(excluded), "trial") + " excluded",
			Detail: "left out of every number: " + strings.Join(excluded, "; ")})
	}
	if len(g.Outliers) > 0 {
		var ids []string
		for _, id := range g.Outliers {
			ids = append(ids, fmt.Sprint(id))
		}
		out = append(out, Flag{Field: FieldP99, Name: "outlier", Label: plural(len(ids), "outlier trial"),
			Detail: "trial p99 outside Tukey's fences (kept): trials " + strings.Join(ids, ", ")})
	}
	if g.MixedParams {
		out = append(out, Flag{Field: FieldMesh, Name: "mixed-params", Label: "mixed load", Detail: "its repeats ran at different load parameters, pooled together"})
	}
	return out
}

func trialName(t *results.Trial) string {
	if t.ID != 0 {
		return fmt.Sprintf("trial %d", t.ID)
	}
	return fmt.Sprintf("repeat %d", t.Repeat+1)
}

// rowVerdict is the row's verdict in one line: what spoils its latency first, then the
// SLO it breaks, then what it adds at p50 and p99.
func rowVerdict(rep *Report, r AnswerRow, g *Group) string {
	var parts []string
	for _, f := range r.Flags {
		if why, ok := spoilsLatency[f.Name]; ok {
			parts = append(parts, fmt.Sprintf("%s in %d of %d trials, so its latency is not comparable", why, f.Trials, f.Of))
		}
	}
	// Another verdict than the four (say, saturated) is named unless a flag above
	// already said it.
	var other []string
	for _, c := range []*Comparison{r.AddedP50, r.AddedP99} {
		if c != nil && !standardVerdict(c.Verdict) && !strings.Contains(strings.Join(parts, " "), string(c.Verdict)) {
			other = append(other, fmt.Sprintf("%s %s", c.Metric, c.Verdict))
		}
	}
	parts = append(parts, other...)
	if miss := rep.SLO.Misses(g); len(miss) > 0 {
		var whys []string
		for _, m := range miss {
			whys = append(whys, m.Why)
		}
		parts = append(parts, "breaks the SLO: "+strings.Join(whys, ", "))
	}
	if r.Baseline {
		parts = append([]string{"reference"}, parts...)
		return strings.Join(parts, "; ")
	}
	if r.AddedP50 == nil && r.AddedP99 == nil {
		return strings.Join(append(parts, "no baseline at this point"), "; ")
	}
	if lv := latencyVerdict(r.AddedP50, r.AddedP99); lv != "" {
		parts = append(parts, lv)
	}
	return strings.Join(parts, "; ")
}

func standardVerdict(v Verdict) bool {
	return slices.Contains([]Verdict{Better, Worse, Equal, Inconclusive}, v)
}

// latencyVerdict says what a mesh adds at p50 and p99 in a few words (comparisons of
// another verdict are left to rowVerdict).
func latencyVerdict(cs ...*Comparison) string {
	var worse, better, equal, open []string
	for _, c := range cs {
		if c == nil || !standardVerdict(c.Verdict) {
			continue
		}
		switch c.Verdict {
		case Worse:
			worse = append(worse, FormatDelta(c.Metric, c.Delta.Value)+" at "+string(c.Metric))
		case Better:
			better = append(better, FormatDelta(c.Metric, c.Delta.Value)+" at "+string(c.Metric))
		case Equal:
			equal = append(equal, string(c.Metric))
		default:
			open = append(open, string(c.Metric))
		}
	}
	var parts []string
	if len(worse) > 0 {
		parts = append(parts, "slower: "+strings.Join(worse, ", "))
	}
	if len(better) > 0 {
		parts = append(parts, "faster: "+strings.Join(better, ", "))
	}
	if len(equal) > 0 {
		parts = append(parts, "same latency at "+strings.Join(equal, " and "))
	}
	if len(open) > 0 {
		parts = append(parts, strings.Join(open, " and ")+" not resolved")
	}
	return strings.Join(parts, "; ")
}

// enrollmentView is the part of the stored equivalence check (internal/mesh's
// Enrollment, as JSON) the answer reads; fields added later do not break it.
type enrollmentView struct {
	MTLS             string   `json:"mtls"`
	Pass             bool     `json:"pass"`
	Failures         []string `json:"failures"`
	PlaintextRefused *bool    `json:"plaintext_refused"`
	Pods             []struct {
		Service      string `json:"service"`
		Meshed       bool   `json:"meshed"`
		MTLSObserved string `json:"mtls_observed"`
		// OutsidePlaintext: the check's plaintext from outside the mesh that a
		// permissive pod accepted.
		OutsidePlaintext uint64 `json:"outside_plaintext_requests"`
	} `json:"pods"`
	Traffic *struct {
		Proven bool `json:"proven"`
		Held   int  `json:"held"`
	} `json:"traffic"`
}

// securityPosture says in a few words what a mesh's stored checks proved of its
// security, and flags what failed.
func securityPosture(run *results.Run, mesh string) (string, []Flag) {
	m := run.Mesh(mesh)
	if m == nil {
		return "-", nil
	}
	var parts []string
	var flags []Flag
	if len(m.Enrollment) == 0 {
		parts = append(parts, "no check stored")
	} else {
		var e enrollmentView
		if err := json.Unmarshal(m.Enrollment, &e); err != nil {
			parts = append(parts, "check unreadable")
		} else {
			meshed, services, mtls, outside := 0, 0, 0, uint64(0)
			for _, p := range e.Pods {
				outside += p.OutsidePlaintext
				if p.Meshed {
					meshed++
				}
				// Only where mTLS was looked for on the wire: the local substrate's
				// reading of each proxy, or a cluster's proxy counters around the
				// probe burst, where the mesh's counters tell it.
				if p.Service != "" && p.MTLSObserved != "" {
					services++
					if p.MTLSObserved == "mtls" {
						mtls++
					}
				}
			}
			switch {
			case meshed == 0 && m.Profile == results.BaselineProfile:
				parts = append(parts, "no mesh, plaintext")
			case e.MTLS == "" || e.MTLS == "off" || e.MTLS == "disable" || e.MTLS == "disabled":
				parts = append(parts, fmt.Sprintf("no mTLS, %d/%d pods enrolled", meshed, len(e.Pods)))
			case services > 0:
				parts = append(parts, fmt.Sprintf("%s mTLS seen %d/%d", e.MTLS, mtls, services))
			default:
				parts = append(parts, e.MTLS+" mTLS")
			}
			switch {
			case e.PlaintextRefused != nil:
				parts = append(parts, map[bool]string{true: "plaintext refused", false: "plaintext accepted"}[*e.PlaintextRefused])
			case outside > 0:
				parts = append(parts, "plaintext accepted") // from outside the mesh, as permissive mode promises
			}
			if e.Traffic != nil && e.Traffic.Held > 0 {
				parts = append(parts, map[bool]string{true: "traffic proven", false: "traffic not proven"}[e.Traffic.Proven])
			}
			if !e.Pass {
				flags = append(flags, Flag{Field: FieldSecurity, Name: "enrollment-failed", Label: "enrollment failed",
					Detail: "the equivalence check failed: " + strings.Join(e.Failures, "; ")})
			}
		}
	}
	held, failed := 0, []string{}
	for _, c := range SecurityMatrix(run) {
		if c.Mesh != mesh {
			continue
		}
		switch c.Outcome {
		case results.SecurityPass:
			held++
		case results.SecurityFail:
			failed = append(failed, c.Probe)
		}
	}
	if held+len(failed) > 0 {
		parts = append(parts, fmt.Sprintf("probes held %d/%d", held, held+len(failed)))
	}
	if len(failed) > 0 {
		flags = append(flags, Flag{Field: FieldSecurity, Name: "probe-failed", Label: plural(len(failed), "probe") + " failed",
			Detail: "promised and broken: " + strings.Join(failed, ", ")})
	}
	return strings.Join(parts, ", "), flags
}

// CapacityLine is a closed-loop capacity experiment in one line: each mesh's pooled
// throughput with the spread of its repeats.
type CapacityLine struct {
	Experiment string `json:"experiment"`
	Label      string `json:"label"`
	Line       string `json:"line"`
}

// CapacityLines says what every closed-loop capacity point measured, per mesh: the
// pooled rate and the lowest and highest repeat, since a rate taken as a share of "the
// lowest capacity" is only below every knee if every repeat sustained it; then, for
// every experiment at a relative rate, the open-loop capacity each repeat sustained
// that its rate was taken from, and the back-offs that lowered it, as the runner
// stored them with its trials.
func CapacityLines(run *results.Run, rep *Report) []CapacityLine {
	var out []CapacityLine
	for _, pt := range points(rep.Groups) {
		var parts []string
		label := ""
		for _, m := range run.Meshes {
			g := rep.Group(Key{Mesh: m.Label, Experiment: pt.Experiment, Step: pt.Step})
			if g == nil || g.Kind != results.KindCapacity || g.Params.RequestedRate > 0 {
				continue // an open-loop search's probe is not a capacity by itself
			}
			label = g.Label
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, t := range g.Trials {
				if t.Duration() > 0 {
					x := t.Throughput()
					lo, hi = min(lo, x), max(hi, x)
				}
			}
			s := fmt.Sprintf("%s %.0f req/s", m.Label, g.Throughput)
			if g.Repeats > 1 && hi >= lo {
				s += fmt.Sprintf(" (repeats %.0f–%.0f)", lo, hi)
			}
			parts = append(parts, s)
		}
		if len(parts) > 0 {
			out = append(out, CapacityLine{Experiment: pt.Experiment, Label: label, Line: "closed-loop capacity, " + label + ": " + strings.Join(parts, ", ")})
		}
	}
	said := map[string]bool{}
	for i := range run.Trials {
		t := &run.Trials[i]
		basis := t.Params.Extra["rate_basis"]
		if basis == "" || t.Result.Excluded() || said[t.Experiment] {
			continue
		}
		said[t.Experiment] = true
		line := fmt.Sprintf("%s at %s", t.Experiment, basis)
		if b := t.Params.Extra["backoff"]; b != "" {
			line += fmt.Sprintf("; backed off %s, to %.0f req/s", b, t.Params.RequestedRate)
		}
		out = append(out, CapacityLine{Experiment: t.Experiment, Label: t.Experiment, Line: line})
	}
	return out
}

// plural is "1 probe", "2 probes".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
