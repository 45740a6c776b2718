package report

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/results"
)

func renderJSON(w io.Writer, s *Summary) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// CSVHeader is the header of the CSV report: one row per mesh and point, pooled over
// repeats, with the change of p99 against the baseline.
var CSVHeader = []string{"run_id", "experiment", "step", "label", "mesh", "profile", "baseline", "repeats", "requests", "errors",
	"error_rate", "throughput_rps", "min_ms", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms",
	"p99_delta_ms", "p99_delta_lo_ms", "p99_delta_hi_ms", "p99_pct", "p99_verdict", "generator_behind_trials"}

func renderCSV(w io.Writer, s *Summary) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	profile := map[string]string{}
	for _, m := range s.Meshes {
		profile[m.Label] = m.Profile
	}
	for _, g := range s.Groups {
		c := s.comparison(g.Mesh, g.Experiment, g.Step, "p99")
		row := []string{s.RunID, g.Experiment, strconv.Itoa(g.Step), g.Label, g.Mesh, profile[g.Mesh], strconv.FormatBool(g.Mesh == s.Baseline),
			strconv.Itoa(g.Repeats), strconv.FormatInt(g.Requests, 10), strconv.FormatInt(g.Errors, 10),
			num(g.ErrorRate), num(g.Throughput), num(g.MinMs), num(g.MeanMs), num(g.P50Ms), num(g.P90Ms), num(g.P99Ms), num(g.P999Ms), num(g.MaxMs),
			"", "", "", "", "", strconv.Itoa(g.GeneratorBehind)}
		if c != nil {
			row[19], row[20], row[21], row[22], row[23] = num(c.Delta), num(c.DeltaLo), num(c.DeltaHi), num(c.Pct), c.Verdict
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func (s *Summary) comparison(mesh, exp string, step int, metric string) *ComparisonRow {
	for i := range s.Comparisons {
		c := &s.Comparisons[i]
		if c.Mesh == mesh && c.Experiment == exp && c.Step == step && c.Metric == metric {
			return c
		}
	}
	return nil
}

// num formats a number for machines: shortest exact form, empty when undefined.
func num(n Num) string {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return ""
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// sig formats a number for people: four significant digits, "—" when undefined.
func sig(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "—"
	}
	if f != 0 && math.Abs(f) >= 1e4 {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'g', 4, 64)
}

func pct(f Num) string {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return "—"
	}
	return fmt.Sprintf("%+.1f%%", float64(f))
}

func interval(lo, hi Num, unit string) string {
	if math.IsNaN(float64(lo)) || math.IsNaN(float64(hi)) {
		return "—"
	}
	if unit == "%" {
		return fmt.Sprintf("[%+.1f%%, %+.1f%%]", float64(lo), float64(hi))
	}
	return fmt.Sprintf("[%s, %s]", sig(float64(lo)), sig(float64(hi)))
}

// metricValue formats a metric's value with its unit.
func metricValue(v Num, unit string) string {
	f := float64(v)
	switch unit {
	case "ms":
		return sig(f) + " ms"
	case "fraction":
		return sig(100*f) + "%"
	case "req/s":
		return sig(f) + " req/s"
	}
	return sig(f)
}

// mdCell escapes what would break a table cell.
func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

type mdWriter struct {
	w   *bufio.Writer
	err error
}

func (m *mdWriter) printf(format string, args ...any) {
	if m.err == nil {
		_, m.err = fmt.Fprintf(m.w, format, args...)
	}
}

func (m *mdWriter) table(header []string, rows [][]string) {
	m.printf("| %s |\n|", strings.Join(header, " | "))
	for range header {
		m.printf("---|")
	}
	m.printf("\n")
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = mdCell(c)
		}
		m.printf("| %s |\n", strings.Join(cells, " | "))
	}
	m.printf("\n")
}

func (m *mdWriter) section(title string, empty bool, why string) bool {
	m.printf("## %s\n\n", title)
	if empty {
		m.printf("_%s_\n\n", why)
	}
	return !empty
}

// Markdown section titles, shared with the HTML page.
const (
	titleAnswer      = "The answer"
	titleVerdicts    = "Verdicts"
	titleComparisons = "Overhead against the baseline"
	titleResults     = "Pooled results"
	titleCapacity    = "Capacity under the SLO"
	titleResources   = "Resources per component"
	titleNetwork     = "Network per pod"
	titleCost        = "Cost per mesh"
	titleChecks      = "Checks"
	titleSecurity    = "Security matrix"
	titleEffort      = "Install effort on Kubernetes"
	titleProvenance  = "Provenance"
)

// saturatedCell says in how many of a group's trials the target saturated.
func saturatedCell(n, of int) string {
	if n == 0 {
		return "no"
	}
	return fmt.Sprintf("**%d of %d**", n, of)
}

// networkHeader is the header of the network table (Markdown and HTML).
var networkHeader = []string{"Mesh", "Pod", "Interface", "Rx KiB/s", "Tx KiB/s", "Rx pkt/s", "Tx pkt/s", "Dropped rx / tx"}

func renderMarkdown(w io.Writer, s *Summary) error {
	m := &mdWriter{w: bufio.NewWriter(w)}
	m.printf("# meshmark report: %s\n\n", mdCell(s.Study))
	m.printf("Run `%s`, %s, started %s", s.RunID, s.Status, s.Started.UTC().Format(time.RFC3339))
	if !s.Ended.IsZero() {
		m.printf(", took %s", s.Ended.Sub(s.Started).Round(time.Second))
	}
	m.printf(". Baseline: **%s**. %s; latencies are pooled over repeats by merging histograms.",
		s.Baseline, s.IntervalHeader())
	if note := s.PairingNote(); note != "" {
		m.printf(" %s", note)
	}
	m.printf("\n\n")
	if s.StatusReason != "" {
		m.printf("> Status: %s\n\n", mdCell(s.StatusReason))
	}

	m.reproduction(s)
	m.answer(s)
	if m.section(titleVerdicts, len(s.Verdicts) == 0, "No point was measured on two or more meshes, so there is nothing to rank.") {
		var rows [][]string
		for _, v := range s.Verdicts {
			rows = append(rows, []string{v.Label, v.Metric, v.Best, metricValue(v.Values[v.Best], v.Unit), v.RunnerUp,
				metricValue(v.Values[v.RunnerUp], v.Unit), pct(v.GapPct), interval(v.GapLo, v.GapHi, "%"), v.Verdict})
		}
		m.table([]string{"Point", "Metric", "Best", "Value", "Runner-up", "Runner-up value", "Runner-up vs best", "Interval", "Verdict"}, rows)
	}
	if m.section(titleComparisons, len(s.Comparisons) == 0, "No mesh shares a point with the baseline.") {
		var rows [][]string
		for _, c := range s.Comparisons {
			rows = append(rows, []string{c.Label, c.Mesh, c.Metric, metricValue(c.Base, c.Unit), metricValue(c.Value, c.Unit),
				sig(float64(c.Delta)), interval(c.DeltaLo, c.DeltaHi, c.Unit), pct(c.Pct), interval(c.PctLo, c.PctHi, "%"),
				fmt.Sprintf("%.1f%%", float64(c.NoiseFloorPct)), c.Verdict})
		}
		m.table([]string{"Point", "Mesh", "Metric", "Baseline", "Mesh value", "Δ", "Δ interval", "Δ%", "Δ% interval", "Noise floor", "Verdict"}, rows)
		if s.Sensitivity != "" {
			m.printf("%s\n\n", s.Sensitivity)
		}
	}
	if m.section(titleResults, len(s.Groups) == 0, "This run has no successful trials.") {
		var rows [][]string
		for _, g := range s.Groups {
			rows = append(rows, []string{g.Label, g.Mesh, strconv.Itoa(g.Repeats), strconv.FormatInt(g.Requests, 10),
				sig(float64(g.Throughput)), sig(float64(g.P50Ms)), sig(float64(g.P90Ms)), sig(float64(g.P99Ms)), sig(float64(g.P999Ms)),
				sig(float64(g.MaxMs)), sig(100 * float64(g.ErrorRate)), strconv.FormatInt(g.Failures, 10), saturatedCell(g.Saturated, g.Repeats)})
		}
		m.table([]string{"Point", "Mesh", "Repeats", "Requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "errors %",
			"failed without response", "target saturated"}, rows)
		m.printf("req/s is what the target served inside each trial's measured window. Latencies count every request, those that failed without a response at their time to failure.\n\n")
	}
	if m.section(titleCapacity, len(s.Capacity) == 0, "This run has no sweep (steps, connections or users), so no capacity was searched.") {
		m.printf("SLO: %s.\n\n", s.SLO.Text)
		var rows [][]string
		for _, c := range s.Capacity {
			maxX, knee := "none", "none"
			if c.Found {
				maxX = sig(c.MaxX) + " " + c.XName
			}
			if c.HasKnee {
				knee = sig(c.KneeX) + " " + c.XName
			}
			rows = append(rows, []string{c.Experiment, c.Mesh, maxX, sig(c.MaxThroughput), knee, orDash(c.Limit)})
		}
		m.table([]string{"Experiment", "Mesh", "Capacity", "req/s at capacity", "Knee", "Limited by"}, rows)
	}
	if m.section(titleResources, len(s.Resources) == 0, "No resource samples were recorded in this run.") {
		m.printf("From experiments: %s.\n\n", strings.Join(s.ResourcesFrom, ", "))
		var rows [][]string
		for _, r := range s.Resources {
			rows = append(rows, []string{r.Mesh, r.Component, r.Role, orDash(r.Pod), sig(r.AvgCores), sig(r.PeakCores), sig(r.AvgMemMiB), sig(r.PeakMemMiB)})
		}
		mem := s.MemoryMeasure
		if mem == "" {
			mem = "RSS"
		}
		m.table([]string{"Mesh", "Component", "Role", "Pod", "CPU avg (cores)", "CPU peak (cores)", mem + " avg (MiB)", mem + " peak (MiB)"}, rows)
	}
	m.printf("### %s\n\n", titleNetwork)
	if len(s.Network) == 0 {
		m.printf("_No network counters were recorded in this run._\n\n")
	} else {
		m.printf("From experiments: %s. Rates are the mean over repeats, drops are summed; loopback (lo) is listed only where it carried traffic.\n\n",
			strings.Join(s.NetworkFrom, ", "))
		var rows [][]string
		for _, r := range s.Network {
			rows = append(rows, []string{r.Mesh, r.Pod, r.Interface, sig(r.RxBytesPerSec / (1 << 10)), sig(r.TxBytesPerSec / (1 << 10)),
				sig(r.RxPacketsPerSec), sig(r.TxPacketsPerSec), fmt.Sprintf("%d / %d", r.RxDropped, r.TxDropped)})
		}
		m.table(networkHeader, rows)
	}
	if m.section(titleCost, len(s.Costs) == 0, "No resource samples, so no cost.") {
		cm := s.CostModel
		m.printf("Usage is every measured component but the load generator, at the load measured. The overhead over the baseline is priced on %s (%g vCPU, %g GiB, %s %.4f/hour, %s; %s) as the share of that instance it fills, %g hours a month.\n\n",
			cm.Instance, cm.VCPU, cm.MemoryGiB, cm.Currency, cm.PricePerHour, orDash(cm.Source), cm.Table, cm.HoursPerMonth)
		var rows [][]string
		for _, c := range s.Costs {
			rows = append(rows, []string{c.Mesh, sig(c.VCPU), sig(c.MemMiB), sig(c.MeshVCPU), sig(c.MeshMemMiB), sig(c.Throughput),
				fmt.Sprintf("%+.3f", c.ExtraVCPU), fmt.Sprintf("%+.3f", c.ExtraMemGiB), fmt.Sprintf("%.3f (%s)", c.InstanceEquivalents, orDash(c.BoundBy)),
				fmt.Sprintf("%.2f", c.PerMonth), fmt.Sprintf("%.4f", c.PerMillionRequests)})
		}
		m.table([]string{"Mesh", "vCPU", "Memory (MiB)", "Mesh vCPU", "Mesh memory (MiB)", "req/s", "Extra vCPU", "Extra GiB",
			"Instances (bound by)", s.CostModel.Currency + "/month", s.CostModel.Currency + " per million requests"}, rows)
	}
	if m.section(titleSecurity, len(s.Security) == 0, "This run has no security experiment.") {
		m.printf("pass: promised and held on every check; fail: promised and broken; expected: not promised with these options, and indeed not held; n/a: does not apply.\n\n")
		type row struct{ mesh, exp string }
		var order []row
		cells := map[row]map[string]string{}
		for _, c := range s.Security {
			r := row{c.Mesh, c.Experiment}
			if cells[r] == nil {
				cells[r] = map[string]string{}
				order = append(order, r)
			}
			cells[r][c.Probe] = string(c.Outcome)
		}
		var rows [][]string
		for _, r := range order {
			line := []string{r.mesh, r.exp}
			for _, p := range s.SecurityProbes {
				line = append(line, orDash(cells[r][p]))
			}
			rows = append(rows, line)
		}
		m.table(append([]string{"Mesh", "Experiment"}, s.SecurityProbes...), rows)
		rows = nil
		for _, c := range s.Security {
			rows = append(rows, []string{c.Mesh, c.Probe, string(c.Outcome), orDash(c.Promised), c.Summary})
		}
		m.table([]string{"Mesh", "Probe", "Outcome", "Promised", "Observed"}, rows)
	}
	if m.section(titleChecks, len(s.Checks) == 0, "No checks were stored with this run.") {
		var rows [][]string
		for _, c := range s.Checks {
			rows = append(rows, []string{c.Mesh, c.Check, c.Result(), c.Detail})
		}
		m.table([]string{"Mesh", "Check", "Result", "Detail"}, rows)
	}
	if len(s.Effort) > 0 {
		m.section(titleEffort, false, "")
		m.printf("What installing each mesh on the cluster took, as a user would meet it: the median time from the start of an install until every object was ready, the objects it created, the CRDs it added and the chart values set (the full record is the run's %s config).\n\n", results.InstallEffortConfig)
		var rows [][]string
		for _, e := range s.Effort {
			rows = append(rows, []string{e.Mesh, strconv.Itoa(e.Installs), sig(float64(e.ReadySeconds)), strconv.Itoa(e.Objects), strconv.Itoa(e.CRDs), strconv.Itoa(e.Values), mdCell(e.Charts)})
		}
		m.table([]string{"Mesh", "Installs", "Ready (s)", "Objects", "CRDs added", "Values set", "Charts"}, rows)
	}
	m.section(titleProvenance, false, "")
	m.table([]string{"Item", "Value"}, provenanceRows(s))
	if len(s.Provenance.Configs) > 0 {
		var rows [][]string
		for _, c := range s.Provenance.Configs {
			rows = append(rows, []string{c.Name, orDash(c.Mesh), orDash(c.Component), "`" + c.SHA256 + "`"})
		}
		m.table([]string{"Config", "Mesh", "Component", "SHA-256"}, rows)
	}
	if m.err == nil {
		m.err = m.w.Flush()
	}
	return m.err
}

// answerHeader is the header of an answer table (Markdown and HTML).
func answerHeader(s *Summary) []string {
	conf := fmt.Sprintf("%.0f%%", 100*s.Confidence)
	return []string{"Mesh", "Added p50 [" + conf + "]", "Added p99 [" + conf + "]", "CPU / 1000 req/s: proxies (system under test)",
		"Proxy memory", "Errors", "Security", "Verdict"}
}

// answerCells are one answer row's cells, each number with the labels of the flags
// that qualify it (see AnswerRow.Beside), as text.
func answerCells(r AnswerRow, flag func(string, []string) string) []string {
	addedCell := func(a *Added, own Num) string {
		if a == nil {
			if r.Baseline {
				return "base " + sig(float64(own)) + " ms"
			}
			return "—"
		}
		return analysis.AddedLatency(analysis.Estimate{Value: 1000 * float64(a.Ms), Lo: 1000 * float64(a.LoMs), Hi: 1000 * float64(a.HiMs)})
	}
	cpu := "—"
	if r.Proxies > 0 && !math.IsNaN(float64(r.ProxyCoresPer1000RPS)) {
		cpu = fmt.Sprintf("%.3g", float64(r.ProxyCoresPer1000RPS))
	}
	if f := float64(r.SUTCoresPer1000RPS); !math.IsNaN(f) {
		cpu += fmt.Sprintf(" (%.3g)", f)
	}
	mem := "—"
	if r.Proxies > 0 {
		mem = fmt.Sprintf("%.0f MiB", float64(r.ProxyMemMiB))
	}
	errs := "0"
	if r.Errors > 0 {
		errs = fmt.Sprintf("%d (%.3g%%)", r.Errors, 100*float64(r.ErrorRate))
	}
	return []string{flag(r.Mesh, r.Beside(analysis.FieldMesh)), flag(addedCell(r.AddedP50, r.P50Ms), r.Beside(analysis.FieldP50)),
		flag(addedCell(r.AddedP99, r.P99Ms), r.Beside(analysis.FieldP99)), flag(cpu, r.Beside(analysis.FieldCPU)),
		flag(mem, r.Beside(analysis.FieldMemory)), flag(errs, r.Beside(analysis.FieldErrors)),
		flag(r.Security, r.Beside(analysis.FieldSecurity)), r.Verdict}
}

// answerHeadline says a point's repeats and the baseline's own latency.
func answerHeadline(p AnswerPoint) string {
	lo, hi := math.MaxInt, 0
	for _, r := range p.Rows {
		lo, hi = min(lo, r.Repeats), max(hi, r.Repeats)
	}
	s := fmt.Sprintf("%d repeats", lo)
	if hi != lo {
		s = fmt.Sprintf("%d–%d repeats", lo, hi)
	}
	for _, r := range p.Rows {
		if r.Baseline {
			return s + fmt.Sprintf("; latency added to %s's p50 %s ms and p99 %s ms.", r.Mesh, sig(float64(r.P50Ms)), sig(float64(r.P99Ms)))
		}
	}
	return s + "; no baseline was measured at this point."
}

// answer writes the answer section: one table per load point with its rankings and
// the flags' evidence, then the closed-loop capacities.
func (m *mdWriter) answer(s *Summary) {
	if !m.section(titleAnswer, len(s.Answers) == 0 && len(s.CapacityLines) == 0, "This run has no load point to answer for.") {
		return
	}
	m.printf("%s.", mdCell(s.SLOLine))
	if s.IntervalLine != "" {
		m.printf(" %s.", mdCell(s.IntervalLine))
	}
	m.printf("\n\n")
	flag := func(v string, labels []string) string {
		if len(labels) == 0 {
			return v
		}
		return v + " **(" + strings.Join(labels, "; ") + ")**"
	}
	said := map[string]bool{}
	for _, p := range s.Answers {
		m.printf("### %s\n\n%s\n\n", mdCell(p.Label), answerHeadline(p))
		var rows [][]string
		for _, r := range p.Rows {
			rows = append(rows, answerCells(r, flag))
		}
		m.table(answerHeader(s), rows)
		var notes []string
		for _, rk := range p.Rankings {
			notes = append(notes, rk.Line)
		}
		for _, r := range p.Rows {
			for _, f := range r.Flags {
				if line := r.Mesh + ": " + f.Detail; f.Detail != "" && !said[line] {
					said[line] = true
					notes = append(notes, line)
				}
			}
		}
		for _, n := range notes {
			m.printf("- %s\n", mdCell(n))
		}
		if len(notes) > 0 {
			m.printf("\n")
		}
	}
	for _, l := range s.CapacityLines {
		m.printf("- %s\n", mdCell(l))
	}
	if len(s.CapacityLines) > 0 {
		m.printf("\n")
	}
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// provenanceRows lists the machine, versions and placement as item/value pairs.
func provenanceRows(s *Summary) [][]string {
	p := s.Provenance
	// On a cluster the machine meshmark ran on only drove it: its rows say so.
	host := ""
	if p.Cluster != nil {
		host = "meshmark's host: "
	}
	rows := [][]string{
		{host + "Host", orDash(p.Hostname)}, {host + "Kernel", orDash(p.Kernel)}, {host + "OS", orDash(p.OS)}, {host + "CPU", orDash(p.CPUModel)},
		{host + "Cores", strconv.Itoa(p.Cores)}, {host + "Memory", fmt.Sprintf("%.1f GiB", float64(p.MemoryBytes)/(1<<30))},
		{"meshmark", orDash(p.MeshmarkVersion)}, {"Go", orDash(p.GoVersion)}, {"Substrate", orDash(s.Substrate)},
		{"Study file", orDash(p.StudyPath)}, {"Seed", strconv.FormatInt(p.Seed, 10)},
	}
	if c := p.Cluster; c != nil {
		rows = append(rows, []string{"cluster", fmt.Sprintf("%s (context %s)", c.Server, orDash(c.Context))},
			[]string{"cluster: Kubernetes", orDash(c.ServerVersion)}, []string{"cluster: nodes", strconv.Itoa(len(c.Nodes))})
		for _, n := range c.Nodes {
			rows = append(rows, []string{"node " + n.Name, fmt.Sprintf("kubelet %s, %s, kernel %s, %s, %s, %s CPUs, %s memory",
				orDash(n.KubeletVersion), orDash(n.OSImage), orDash(n.KernelVersion), orDash(n.ContainerRuntime), orDash(n.Architecture), orDash(n.CPU), orDash(n.Memory))})
		}
		for _, im := range c.Images {
			id := im.ImageID
			if id == "" {
				id = "digest not reported by the kubelet"
			}
			rows = append(rows, []string{fmt.Sprintf("image: %s, container %s", im.Mesh, im.Container), fmt.Sprintf("%s (%s), %d pods", im.Image, id, im.Pods)})
		}
	}
	if p.StudyFile != "" {
		rows = append(rows, []string{"Study file SHA-256", "`" + sha256Hex(p.StudyFile) + "`"})
	}
	for _, k := range sortedKeys(p.Components) {
		rows = append(rows, []string{"version: " + k, p.Components[k]})
	}
	for _, k := range sortedKeys(p.Placement) {
		rows = append(rows, []string{"placement: " + k, p.Placement[k]})
	}
	return rows
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
