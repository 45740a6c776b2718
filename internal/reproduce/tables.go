package reproduce

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/results"
)

// experiments lists the run's experiments of a kind that pass keep, in the order
// they were first measured, each with its groups' steps in order.
func (c *builder) experiments(kind string, keep func(*analysis.Group) bool) []string {
	var out []string
	for _, g := range c.rep.Groups {
		if g.Kind == kind && (keep == nil || keep(g)) && !slices.Contains(out, g.Experiment) {
			out = append(out, g.Experiment)
		}
	}
	return out
}

// steps lists an experiment's steps, each with one of its groups (for its label and
// parameters), in step order.
func (c *builder) steps(exp string) []*analysis.Group {
	var out []*analysis.Group
	seen := map[int]bool{}
	for _, g := range c.rep.Groups {
		if g.Experiment == exp && !seen[g.Step] {
			seen[g.Step] = true
			out = append(out, g)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out
}

func (c *builder) group(mesh, exp string, step int) *analysis.Group {
	return c.rep.Group(analysis.Key{Mesh: mesh, Experiment: exp, Step: step})
}

func merged(g *analysis.Group) *hdrhistogram.Histogram {
	h := results.NewLatencyHistogram()
	for _, t := range g.Trials {
		if t.Result.Latency != nil {
			h.Merge(t.Result.Latency)
		}
	}
	return h
}

func us(v int64) string { return analysis.FormatMicros(float64(v)) }

func errorsCell(g *analysis.Group) string {
	if g.Errors == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%.3g%%)", g.Errors, 100*g.ErrorRate)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// trialThroughputs is each repeat's served rate.
func trialThroughputs(g *analysis.Group) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, t := range g.Trials {
		if t.Duration() > 0 {
			x := t.Throughput() // served inside the window
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	return lo, hi
}

// nonBaseline are the run's meshes other than the baseline, the study's first.
func (c *builder) nonBaseline() []string {
	var out []string
	for _, m := range c.meshes() {
		if m != c.rep.Baseline {
			out = append(out, m)
		}
	}
	return out
}

// ---- S1: capacity, latency at 75% of capacity, verdicts.

func (c *builder) s1Tables() []Table {
	var out []Table
	for _, exp := range c.experiments(results.KindCapacity, nil) {
		t := Table{Title: "Capacity at max rate (S1's scenario 1): " + exp,
			Note:   "closed loop, each mesh as fast as it goes; p50 and p99 at that load, which S1 compared too; throughput per repeat shows their spread",
			Header: []string{"Mesh", "Capacity (req/s)", "Repeats", "p50 at max load", "p99 at max load", "Errors"}}
		for _, st := range c.steps(exp) {
			if st.Params.RequestedRate > 0 {
				continue // an open-loop search's probe, not S1's closed-loop capacity
			}
			for _, m := range c.meshes() {
				g := c.group(m, exp, st.Step)
				if g == nil {
					continue
				}
				lo, hi := trialThroughputs(g)
				spread := fmt.Sprintf("%d", g.Repeats)
				if g.Repeats > 1 && hi >= lo {
					spread += fmt.Sprintf(": %.0f–%.0f", lo, hi)
				}
				t.Rows = append(t.Rows, []string{c.meshName(m), fmt.Sprintf("%.0f", g.Throughput), spread, us(g.P50), us(g.P99), errorsCell(g)})
			}
		}
		out = append(out, t)
	}
	for _, exp := range c.experiments(results.KindConnections, nil) {
		t := Table{Title: "Pre-study: throughput as connections grow (S1): " + exp, Note: "where throughput stops rising is the connection count for capacity",
			Header: []string{"Connections"}}
		ms := c.meshes()
		for _, m := range ms {
			t.Header = append(t.Header, m+" req/s")
		}
		for _, st := range c.steps(exp) {
			row := []string{strconv.Itoa(st.Params.Connections)}
			for _, m := range ms {
				cell := "-"
				if g := c.group(m, exp, st.Step); g != nil {
					cell = fmt.Sprintf("%.0f", g.Throughput)
				}
				row = append(row, cell)
			}
			t.Rows = append(t.Rows, row)
		}
		out = append(out, t)
	}
	fixed := c.experiments(results.KindFixedRate, nil)
	for _, exp := range fixed {
		t := Table{Title: "Latency at a fixed rate, 75% of the lowest capacity (S1's scenario 2): " + exp,
			Note:   "percentiles of all repeats merged; p99 of each repeat (S1's samples) with outliers (Tukey's fences, kept) starred; SLO " + c.rep.SLO.String(),
			Header: []string{"Mesh", "Rate", "p50", "p75", "p90", "p99", "p99.9", "p99 per repeat", "SLO"}}
		for _, st := range c.steps(exp) {
			for _, m := range c.meshes() {
				g := c.group(m, exp, st.Step)
				if g == nil {
					continue
				}
				h := merged(g)
				var reps []string
				var p99s []int64
				for _, tr := range g.Trials {
					p99s = append(p99s, tr.Result.Latency.ValueAtQuantile(99))
					s := us(p99s[len(p99s)-1])
					if slices.Contains(g.Outliers, tr.ID) {
						s += "*"
					}
					reps = append(reps, s)
				}
				if len(reps) > maxListedRepeats {
					// Forty short blocks listed one by one are not S1's thirty samples
					// but a wall of numbers: their spread says the same in one cell.
					slices.Sort(p99s)
					reps = []string{fmt.Sprintf("%d blocks: %s–%s, median %s, %d outliers", len(p99s), us(p99s[0]), us(p99s[len(p99s)-1]), us(p99s[len(p99s)/2]), len(g.Outliers))}
				}
				slo := "met"
				if miss := c.rep.SLO.Misses(g); len(miss) > 0 {
					var whys []string
					for _, x := range miss {
						whys = append(whys, x.Why)
					}
					slo = "broken: " + strings.Join(whys, ", ")
				}
				t.Rows = append(t.Rows, []string{c.meshName(m), fmt.Sprintf("%.0f req/s", g.Params.RequestedRate), us(g.P50), us(h.ValueAtQuantile(75)),
					us(g.P90), us(g.P99), us(g.P999), strings.Join(reps, ", "), slo})
			}
		}
		out = append(out, t)
	}
	return append(out, c.s1Verdicts())
}

// maxListedRepeats is how many repeats' p99s a table lists one by one.
const maxListedRepeats = 10

// s1Verdicts is S1's verdict table: per parameter and metric, which mesh is better,
// judged by the run's intervals among the meshes other than the baseline.
func (c *builder) s1Verdicts() Table {
	ms := c.nonBaseline()
	t := Table{Title: "Verdict table (S1's parameter × metric × better)",
		Note:   "better: the best mesh when its interval against the runner-up resolves the difference (the analysis's verdict), else equal or not resolved; among the meshes other than the baseline",
		Header: []string{"Parameter", "Metric"}}
	t.Header = append(append(t.Header, ms...), "Better")
	add := func(param string, metric published.Metric, exp string, step int) {
		row := []string{param, string(metric)}
		vals := map[string]float64{}
		var have []string
		for _, m := range ms {
			g := c.group(m, exp, step)
			if g == nil {
				row = append(row, "-")
				continue
			}
			v, unit := c.valueOf(metric, g)
			vals[m] = v
			have = append(have, m)
			row = append(row, valueText(v, unit))
		}
		if !slices.ContainsFunc(have, func(m string) bool { return vals[m] != 0 && !math.IsNaN(vals[m]) }) {
			return // nothing of it was measured (no control plane sampled, say)
		}
		t.Rows = append(t.Rows, append(row, c.better(metric, exp, step, have, vals)))
	}
	for _, exp := range c.experiments(results.KindCapacity, nil) {
		for _, st := range c.steps(exp) {
			if st.Params.RequestedRate == 0 { // closed-loop points, not a search's probes
				add("capacity ("+st.Label+")", published.Throughput, exp, st.Step)
			}
		}
	}
	for _, exp := range c.experiments(results.KindFixedRate, nil) {
		for _, st := range c.steps(exp) {
			for _, m := range []published.Metric{published.P50, published.P99} {
				add("latency at 75% ("+st.Label+")", m, exp, st.Step)
			}
			row := []string{"latency at 75% (" + st.Label + ")", "SLO " + c.rep.SLO.String()}
			var met []string
			for _, m := range ms {
				g := c.group(m, exp, st.Step)
				switch {
				case g == nil:
					row = append(row, "-")
				case len(c.rep.SLO.Misses(g)) == 0:
					row = append(row, "met")
					met = append(met, m)
				default:
					row = append(row, "broken")
				}
			}
			better := strings.Join(met, ", ")
			switch {
			case len(met) == 0:
				better = "none meets it"
			case len(met) == len(ms) && len(ms) > 1:
				better = "all meet it"
			}
			t.Rows = append(t.Rows, append(row, better))
		}
	}
	for _, exp := range c.experiments(results.KindSoak, nil) {
		for _, st := range c.steps(exp) {
			for _, m := range []published.Metric{dataPlaneCPU, controlPlaneCPU, dataPlaneMemory, controlPlaneMemory} {
				add("soak ("+st.Label+")", m, exp, st.Step)
			}
		}
	}
	return t
}

// valueOf is a group's pooled value of a metric, in the unit valueText renders.
func (c *builder) valueOf(m published.Metric, g *analysis.Group) (float64, string) {
	if am, ok := analysisMetric[m]; ok {
		return g.Value(am), am.Unit()
	}
	switch m {
	case published.Mean:
		return merged(g).Mean(), "µs"
	}
	var sum float64
	units := resourceUnits(g, m)
	for _, u := range units {
		sum += u.num
	}
	if len(units) == 0 {
		return math.NaN(), ""
	}
	if m == dataPlaneCPU || m == controlPlaneCPU {
		return sum / float64(len(units)), "cores"
	}
	return sum / float64(len(units)), "MiB"
}

// better names the best of the meshes on a metric when the run resolves it against
// the runner-up.
func (c *builder) better(m published.Metric, exp string, step int, meshes []string, vals map[string]float64) string {
	var ok []string
	for _, x := range meshes {
		if !math.IsNaN(vals[x]) {
			ok = append(ok, x)
		}
	}
	if len(ok) < 2 {
		return "-"
	}
	higher := m == published.Throughput
	sort.SliceStable(ok, func(i, j int) bool {
		if higher {
			return vals[ok[i]] > vals[ok[j]]
		}
		return vals[ok[i]] < vals[ok[j]]
	})
	best, runner := ok[0], ok[1]
	o := c.compare(m, analysis.Key{Mesh: best, Experiment: exp, Step: step}, analysis.Key{Mesh: runner, Experiment: exp, Step: step})
	if o.missing != "" {
		return "-"
	}
	change := pctText(o.ratio)
	switch o.verdict {
	case analysis.Worse, analysis.Better:
		return fmt.Sprintf("%s (%s %s)", best, runner, change)
	case analysis.Equal:
		return fmt.Sprintf("equal (%s %s, within ±%g%%)", runner, change, o.margin)
	}
	return fmt.Sprintf("not resolved (%s %s)", runner, change)
}

// ---- S2: average latency per rate per mesh, with error incidence.

func (c *builder) s2Tables() []Table {
	type rate struct {
		exp  string
		step int
		rps  float64
	}
	var rates []rate
	for _, exp := range c.experiments(results.KindFixedRate, nil) {
		for _, st := range c.steps(exp) {
			rates = append(rates, rate{exp, st.Step, st.Params.RequestedRate})
		}
	}
	sort.SliceStable(rates, func(i, j int) bool { return rates[i].rps < rates[j].rps })
	ms := c.meshes()
	t := Table{Title: "Average latency per rate and mesh, with error incidence (S2's table)",
		Note:   "the mean of every request's latency over all repeats; × is the ratio to the baseline's mean at the same rate (S2 quoted Istio at 2400 rpm against the baseline)",
		Header: []string{"Rate"}}
	for _, m := range ms {
		t.Header = append(t.Header, m+" average", m+" errors")
	}
	bars := &Bars{Title: "Average latency per rate (S2's figure)", Unit: "ms"}
	for _, m := range ms {
		bars.Series = append(bars.Series, BarSeries{Name: m})
	}
	for _, r := range rates {
		row := []string{fmt.Sprintf("%g rpm (%g req/s)", 60*r.rps, r.rps)}
		bars.Categories = append(bars.Categories, fmt.Sprintf("%g rpm", 60*r.rps))
		var base float64
		if g := c.group(c.rep.Baseline, r.exp, r.step); g != nil {
			base = merged(g).Mean()
		}
		for i, m := range ms {
			g := c.group(m, r.exp, r.step)
			if g == nil {
				row = append(row, "-", "-")
				bars.Series[i].Values = append(bars.Series[i].Values, nil)
				continue
			}
			mean := merged(g).Mean()
			cell := analysis.FormatMicros(mean)
			if base > 0 && m != c.rep.Baseline {
				cell += fmt.Sprintf(" (×%.2f)", mean/base)
			}
			row = append(row, cell, errorsCell(g))
			v := mean / 1000
			bars.Series[i].Values = append(bars.Series[i].Values, &v)
		}
		t.Rows = append(t.Rows, row)
	}
	t.Bars = bars
	return []Table{t}
}

// ---- S3: users against response time, with a regression per configuration.

func (c *builder) s3Tables() []Table {
	exps := c.experiments(results.KindUsers, nil)
	type config struct{ mesh, path string }
	var configs []config
	for _, m := range c.meshes() {
		for _, path := range []string{"ingress", "internal"} {
			for _, exp := range exps {
				for _, st := range c.steps(exp) {
					if g := c.group(m, exp, st.Step); g != nil && pathMatches(g, path) && !slices.Contains(configs, config{m, path}) {
						configs = append(configs, config{m, path})
					}
				}
			}
		}
	}
	name := func(cf config) string {
		if cf.path == "ingress" {
			return c.meshName(cf.mesh) + ", through the ingress gateway"
		}
		return c.meshName(cf.mesh) + ", bypassing the gateway"
	}
	users := Table{Title: "Users against response time, per configuration (S3's table)",
		Note:   "Locust-like users; response time of every request, all repeats merged",
		Header: []string{"Configuration", "Users", "req/s", "Average", "p50", "p95", "p99", "Failures"}}
	reg := Table{Title: "Response time against request rate: regression per configuration (S3's analysis)",
		Note:   "least squares over every one-second interval of the configuration's trials: the interval's mean response time against its achieved rate; r is Pearson's correlation",
		Header: []string{"Configuration", "Intervals", "Slope (ms per req/s)", "Intercept (ms)", "r"}}
	for _, cf := range configs {
		var xs, ys []float64
		var gs []*analysis.Group
		for _, exp := range exps {
			for _, st := range c.steps(exp) {
				if g := c.group(cf.mesh, exp, st.Step); g != nil && pathMatches(g, cf.path) {
					gs = append(gs, g)
				}
			}
		}
		sort.SliceStable(gs, func(i, j int) bool { return gs[i].Params.Users < gs[j].Params.Users })
		for _, g := range gs {
			h := merged(g)
			users.Rows = append(users.Rows, []string{name(cf), strconv.Itoa(g.Params.Users), fmt.Sprintf("%.4g", g.Throughput),
				analysis.FormatMicros(h.Mean()), us(g.P50), us(g.P95), us(g.P99), errorsCell(g)})
			for _, t := range g.Trials {
				for _, iv := range t.Result.Intervals {
					if iv.Histogram != nil && iv.Histogram.TotalCount() > 0 && iv.Duration > 0 {
						xs = append(xs, iv.AchievedRate)
						ys = append(ys, iv.Histogram.Mean()/1000)
					}
				}
			}
		}
		slope, icept, r := regress(xs, ys)
		reg.Rows = append(reg.Rows, []string{name(cf), strconv.Itoa(len(xs)), num3(slope), num3(icept), num3(r)})
	}
	return []Table{users, reg}
}

// regress is the least-squares line of ys on xs and Pearson's r; NaN when xs do not
// vary.
func regress(xs, ys []float64) (slope, intercept, r float64) {
	n := float64(len(xs))
	if n < 2 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx, my = mx/n, my/n
	var sxx, syy, sxy float64
	for i := range xs {
		dx, dy := xs[i]-mx, ys[i]-my
		sxx += dx * dx
		syy += dy * dy
		sxy += dx * dy
	}
	if sxx == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	slope = sxy / sxx
	intercept = my - slope*mx
	r = math.NaN()
	if syy > 0 {
		r = sxy / math.Sqrt(sxx*syy)
	}
	return slope, intercept, r
}

func num3(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// ---- S4: P95/P99 per step, heatmaps, per-proxy CPU and RAM.

func (c *builder) s4Tables() []Table {
	var out []Table
	ms := c.meshes()
	for _, exp := range c.experiments(results.KindSteps, nil) {
		t := Table{Title: "P95 and P99 per step (S4's latency study): " + exp, Note: "all repeats merged per step", Header: []string{"Rate"}}
		for _, m := range ms {
			t.Header = append(t.Header, m+" P95", m+" P99")
		}
		for _, st := range c.steps(exp) {
			row := []string{fmt.Sprintf("%g rps", st.Params.RequestedRate)}
			for _, m := range ms {
				if g := c.group(m, exp, st.Step); g != nil {
					row = append(row, us(g.P95), us(g.P99))
				} else {
					row = append(row, "-", "-")
				}
			}
			t.Rows = append(t.Rows, row)
		}
		out = append(out, t)
		for _, m := range ms {
			if hm, ok := c.heatmap(m, exp); ok {
				out = append(out, hm)
			}
		}
	}
	for _, exp := range c.experiments(results.KindSoak, nil) {
		for _, st := range c.steps(exp) {
			out = append(out, c.proxyResources(exp, st))
		}
	}
	return out
}

// heatmap is S4's heatmap of one mesh in one sweep: rows latency buckets (1-2-5 µs
// edges), columns steps, a cell the share of the step's requests in the bucket and
// their count.
func (c *builder) heatmap(mesh, exp string) (Table, bool) {
	var gs []*analysis.Group
	for _, st := range c.steps(exp) {
		if g := c.group(mesh, exp, st.Step); g != nil {
			gs = append(gs, g)
		}
	}
	if len(gs) < 2 {
		return Table{}, false
	}
	hs := make([]*hdrhistogram.Histogram, len(gs))
	lo, hi := int64(math.MaxInt64), int64(0)
	for i, g := range gs {
		hs[i] = merged(g)
		if hs[i].TotalCount() > 0 {
			lo, hi = min(lo, hs[i].Min()), max(hi, hs[i].Max())
		}
	}
	if hi == 0 {
		return Table{}, false
	}
	edges := bucketEdges(lo, hi)
	t := Table{Title: fmt.Sprintf("Heatmap of %s (S4's figure): %s", c.meshName(mesh), exp),
		Note: "rows are latency buckets, columns steps; a cell is the share of that step's requests in that bucket, and their count", Header: []string{"Latency"}}
	for _, g := range gs {
		t.Header = append(t.Header, fmt.Sprintf("%g rps", g.Params.RequestedRate))
	}
	counts := make([][]int64, len(edges)-1)
	for r := range counts {
		counts[r] = make([]int64, len(gs))
	}
	for col, h := range hs {
		for _, bar := range h.Distribution() {
			if bar.Count == 0 {
				continue
			}
			r := sort.Search(len(edges), func(i int) bool { return edges[i] > bar.From }) - 1
			r = min(max(r, 0), len(counts)-1)
			counts[r][col] += bar.Count
		}
	}
	for r := range counts {
		row := []string{analysis.FormatMicros(float64(edges[r])) + "–" + analysis.FormatMicros(float64(edges[r+1]))}
		heat := make([]float64, len(gs)+1)
		for col, n := range counts[r] {
			total := hs[col].TotalCount()
			if n == 0 || total == 0 {
				row = append(row, "")
				continue
			}
			share := 100 * float64(n) / float64(total)
			heat[col+1] = share
			row = append(row, fmt.Sprintf("%.1f%% (%d)", share, n))
		}
		t.Rows = append(t.Rows, row)
		t.Heat = append(t.Heat, heat)
	}
	return t, true
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

// proxyResources is S4's resource table: per mesh, each of its own components' CPU
// and memory, per process and in total.
func (c *builder) proxyResources(exp string, st *analysis.Group) Table {
	t := Table{Title: "CPU and RAM per proxy (S4's resource study): " + st.Label,
		Note: "the mesh's own components (proxies, gateways, control plane): average CPU per process over each trial, the highest rate between two samples summed over processes, " +
			"mean and peak RSS; the mesh's total is what S4 quoted per mesh",
		Header: []string{"Mesh", "Component", "Role", "Processes", "CPU avg per process (cores)", "CPU peak, all (cores)", "RAM per process (MiB)", "RAM peak, all (MiB)", "RAM total (MiB)"}}
	for _, m := range c.meshes() {
		var total float64
		rows := 0
		for _, u := range c.rep.Resources {
			if u.Mesh != m || u.Experiment != exp || u.Step != st.Step || !meshRoles[u.Role] || u.Processes == 0 {
				continue
			}
			n := float64(u.Processes)
			total += u.RSSMean
			rows++
			t.Rows = append(t.Rows, []string{c.meshName(m), u.Component, u.Role, strconv.Itoa(u.Processes), num3(u.CPUCores / n), num3(u.CPUCoresPeak),
				fmt.Sprintf("%.1f", u.RSSMean/n/(1<<20)), fmt.Sprintf("%.1f", float64(u.RSSPeak)/(1<<20)), fmt.Sprintf("%.1f", u.RSSMean/(1<<20))})
		}
		switch {
		case rows > 1:
			t.Rows = append(t.Rows, []string{c.meshName(m), "total", "", "", "", "", "", "", fmt.Sprintf("%.1f", total/(1<<20))})
		case rows == 0 && c.group(m, exp, st.Step) != nil:
			t.Rows = append(t.Rows, []string{c.meshName(m), "none", "", "0", "", "", "", "", "0"})
		}
	}
	return t
}

// ---- S5: per connection count, internal and external.

func (c *builder) s5Tables() []Table {
	var out []Table
	ms := c.meshes()
	for _, path := range []string{"internal", "ingress"} {
		exps := c.experiments(results.KindConnections, func(g *analysis.Group) bool { return pathMatches(g, path) && !g.Params.KeepAlive })
		if len(exps) == 0 {
			continue
		}
		where := map[string]string{"internal": "internal (to the service)", "ingress": "external (through the ingress)"}[path]
		t := Table{Title: "Mean latency per connection count, " + where + " (S5's figure)",
			Note:   "closed loop without keep-alive, every request's latency over all repeats; % is against the baseline at the same count",
			Header: []string{"Connections"}}
		bars := &Bars{Title: "Mean latency per connection count, " + where, Unit: "ms"}
		for _, m := range ms {
			t.Header = append(t.Header, m)
			bars.Series = append(bars.Series, BarSeries{Name: m})
		}
		for _, exp := range exps {
			for _, st := range c.steps(exp) {
				row := []string{strconv.Itoa(st.Params.Connections)}
				bars.Categories = append(bars.Categories, fmt.Sprintf("%d conns", st.Params.Connections))
				var base float64
				if g := c.group(c.rep.Baseline, exp, st.Step); g != nil {
					base = merged(g).Mean()
				}
				for i, m := range ms {
					g := c.group(m, exp, st.Step)
					if g == nil {
						row = append(row, "-")
						bars.Series[i].Values = append(bars.Series[i].Values, nil)
						continue
					}
					mean := merged(g).Mean()
					cell := analysis.FormatMicros(mean)
					if base > 0 && m != c.rep.Baseline {
						cell += fmt.Sprintf(" (%+.1f%%)", 100*(mean/base-1))
					}
					row = append(row, cell)
					v := mean / 1000
					bars.Series[i].Values = append(bars.Series[i].Values, &v)
				}
				t.Rows = append(t.Rows, row)
			}
		}
		t.Bars = bars
		out = append(out, t)
	}
	return out
}
