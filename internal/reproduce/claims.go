package reproduce

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/results"
)

// point is a load point of the run a claim is tested at: A's group is at Key; B's at
// BKey (the same point unless the claim moves B to another path).
type point struct {
	key, bKey analysis.Point
	label     string
}

// points lists the run's load points matching where a claim was measured, in the
// order they were first measured.
func (c *builder) points(at published.Point, bPath string) []point {
	type exp struct {
		name  string
		steps []*analysis.Group // one group per step, of any mesh
	}
	var exps []*exp
	byName := map[string]*exp{}
	seen := map[analysis.Point]bool{}
	for _, g := range c.rep.Groups {
		if g.Kind != at.Kind || !pathMatches(g, at.Path) || (at.NoKeepAlive && g.Params.KeepAlive) {
			continue
		}
		if at.RPS > 0 && math.Abs(g.Params.RequestedRate-at.RPS) > 1e-9*at.RPS {
			continue
		}
		e := byName[g.Experiment]
		if e == nil {
			e = &exp{name: g.Experiment}
			byName[g.Experiment] = e
			exps = append(exps, e)
		}
		if pt := (analysis.Point{Experiment: g.Experiment, Step: g.Step}); !seen[pt] {
			seen[pt] = true
			e.steps = append(e.steps, g)
		}
	}
	var out []point
	for _, e := range exps {
		steps := e.steps
		if at.MiddleStep {
			sort.SliceStable(steps, func(i, j int) bool { return steps[i].Step < steps[j].Step })
			steps = steps[(len(steps)-1)/2 : (len(steps)-1)/2+1]
		}
		for _, g := range steps {
			pt := point{key: analysis.Point{Experiment: g.Experiment, Step: g.Step}, label: g.Label}
			pt.bKey = pt.key
			if bPath != "" {
				b := c.samePointOn(g, bPath)
				if b == nil {
					continue
				}
				pt.bKey = analysis.Point{Experiment: b.Experiment, Step: b.Step}
				pt.label += " against " + b.Label
			}
			out = append(out, pt)
		}
	}
	return out
}

func pathMatches(g *analysis.Group, path string) bool {
	if path == "" {
		return true
	}
	p := g.Params.Path
	if p == "" {
		p = "internal"
	}
	return p == path
}

// samePointOn finds the group of another experiment of g's kind that ran the same
// load as g on the given path.
func (c *builder) samePointOn(g *analysis.Group, path string) *analysis.Group {
	for _, o := range c.rep.Groups {
		p, q := o.Params, g.Params
		if o.Kind == g.Kind && pathMatches(o, path) && !pathMatches(o, g.Params.Path) &&
			p.RequestedRate == q.RequestedRate && p.Users == q.Users && p.Connections == q.Connections && p.KeepAlive == q.KeepAlive {
			return o
		}
	}
	return nil
}

// evaluate tests one claim at every matching point of the run.
func (c *builder) evaluate(cl published.Claim) []Evaluation {
	a, b := c.roleMesh(cl.A), c.roleMesh(cl.B)
	base := Evaluation{Claim: cl.ID, Kind: string(cl.Kind), Metric: string(cl.Metric), Where: cl.At.Published,
		Published: cl.Figure, Expect: expect(cl, a, b), Ratio: nan()}
	for _, m := range []RoleMesh{a, b} {
		if m.Mesh == "" {
			base.Mark, base.Reason = NotMeasured, fmt.Sprintf("no mesh of this run stands for %s", m.Title)
			return []Evaluation{base}
		}
	}
	pts := c.points(cl.At, cl.BPath)
	if len(pts) == 0 {
		base.Mark, base.Reason = NotMeasured, "the run has no "+describe(cl.At, cl.BPath)
		return []Evaluation{base}
	}
	var out []Evaluation
	for _, pt := range pts {
		e := base
		e.Point = pt.label
		ka := analysis.Key{Mesh: a.Mesh, Experiment: pt.key.Experiment, Step: pt.key.Step}
		kb := analysis.Key{Mesh: b.Mesh, Experiment: pt.bKey.Experiment, Step: pt.bKey.Step}
		c.test(&e, cl, ka, kb)
		// What no run here can test is said last, over whatever the numbers said: the
		// numbers stay beside it.
		switch {
		case cl.Unlike != "":
			e.Mark, e.Reason = NotComparable, cl.Unlike
		case a.Unlike != "":
			e.Mark, e.Reason = NotComparable, a.Unlike
		case b.Unlike != "":
			e.Mark, e.Reason = NotComparable, b.Unlike
		}
		out = append(out, e)
	}
	return out
}

// describe says what kind of point a claim needs, for "not measured".
func describe(at published.Point, bPath string) string {
	s := at.Kind + " experiment"
	if at.RPS > 0 {
		s = fmt.Sprintf("%s at %g req/s", s, at.RPS)
	}
	if at.Path != "" {
		s += " on the " + at.Path + " path"
	}
	if at.NoKeepAlive {
		s += " without keep-alive"
	}
	if bPath != "" {
		s += " with the same load on the " + bPath + " path"
	}
	return s + " (" + at.Published + ")"
}

// expect says what the run must show to agree.
func expect(cl published.Claim, a, b RoleMesh) string {
	an, bn := a.Mesh, b.Mesh
	if an == "" {
		an = a.Title
	}
	if bn == "" {
		bn = b.Title
	}
	if a.Role == b.Role {
		an += " (" + cl.At.Path + ")"
		bn += " (" + cl.BPath + ")"
	}
	if cl.Kind == published.Order {
		return fmt.Sprintf("%s lower than %s at %s", an, bn, cl.Metric)
	}
	lo, hi := cl.Range()
	pub := ratioText(cl.Lo)
	if cl.Hi != cl.Lo {
		pub += "–" + ratioText(cl.Hi)
	}
	s := fmt.Sprintf("%s ÷ %s at %s within %s–%s (published %s", bn, an, cl.Metric, ratioText(lo), ratioText(hi), pub)
	if cl.Band.Why != "" {
		s += "; " + cl.Band.Why
	}
	return s + ")"
}

func ratioText(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	switch {
	case x >= 1e4:
		return ">9999" // a few repeats' t interval; its digits would mean nothing
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	case x >= 2:
		return fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.3f", x)
}

// outcome is the run's comparison of B against A on a claim's metric.
type outcome struct {
	ratio   analysis.Estimate // B over A
	verdict analysis.Verdict  // of B against A
	margin  float64           // %, the practical-equivalence margin applied
	va, vb  float64           // the pooled values, in the metric's unit
	unit    string
	spoiled string // why the latencies cannot be compared, when they cannot
	missing string // why there is nothing to compare, when there is not
}

// test measures the claim's metric at A's and B's groups and marks the evaluation.
func (c *builder) test(e *Evaluation, cl published.Claim, ka, kb analysis.Key) {
	o := c.compare(cl.Metric, ka, kb)
	if o.missing != "" {
		e.Mark, e.Reason = NotMeasured, o.missing
		return
	}
	e.Ratio = o.ratio
	an, bn := ka.Mesh, kb.Mesh
	if an == bn {
		an, bn = ka.Mesh+" ("+ka.Experiment+")", kb.Mesh+" ("+kb.Experiment+")"
	}
	e.Ours = fmt.Sprintf("%s %s, %s %s; %s ÷ %s %s [%s, %s]", an, valueText(o.va, o.unit), bn, valueText(o.vb, o.unit),
		bn, an, ratioText(o.ratio.Value), ratioText(o.ratio.Lo), ratioText(o.ratio.Hi))
	if o.spoiled != "" {
		e.Mark, e.Reason = NotResolved, o.spoiled
		return
	}
	if cl.Kind == published.Order {
		e.Mark, e.Reason = orderMark(o, ka.Mesh, kb.Mesh)
		return
	}
	e.Mark, e.Reason = ratioMark(o, cl)
}

// orderMark marks "A lower than B" by the run's verdict of B against A.
func orderMark(o outcome, a, b string) (Mark, string) {
	switch o.verdict {
	case analysis.Worse, analysis.Better:
		if o.vb > o.va {
			return Agrees, ""
		}
		return Disagrees, fmt.Sprintf("the run resolves %s lower than %s", b, a)
	case analysis.Equal:
		return Disagrees, fmt.Sprintf("the run resolves the two equal within ±%g%%, where the study saw a difference", o.margin)
	case analysis.Inconclusive:
		return NotResolved, fmt.Sprintf("the interval of %s against %s, %s, does not tell them apart beyond the noise and the ±%g%% margin",
			b, a, pctText(o.ratio), o.margin)
	}
	return NotResolved, fmt.Sprintf("the comparison's verdict is %s", o.verdict)
}

// ratioMark marks a ratio by where its interval lies against the claim's band.
func ratioMark(o outcome, cl published.Claim) (Mark, string) {
	lo, hi := cl.Range()
	r := o.ratio
	switch {
	case math.IsNaN(r.Lo) || math.IsNaN(r.Hi):
		return NotResolved, "the run gives no interval for the ratio"
	case !slices.Contains([]analysis.Verdict{analysis.Worse, analysis.Better, analysis.Equal, analysis.Inconclusive}, o.verdict):
		return NotResolved, fmt.Sprintf("the comparison's verdict is %s", o.verdict)
	case r.Lo >= lo && r.Hi <= hi:
		return Agrees, ""
	case r.Hi < lo:
		return Disagrees, fmt.Sprintf("the whole interval lies below %s", ratioText(lo))
	case r.Lo > hi:
		return Disagrees, fmt.Sprintf("the whole interval lies above %s", ratioText(hi))
	}
	return NotResolved, fmt.Sprintf("the interval [%s, %s] straddles the edge of %s–%s", ratioText(r.Lo), ratioText(r.Hi), ratioText(lo), ratioText(hi))
}

func pctText(r analysis.Estimate) string {
	signed1 := func(x float64) string { return fmt.Sprintf("%+.1f", x) }
	if math.IsNaN(r.Lo) || math.IsNaN(r.Hi) {
		return fmt.Sprintf("%+.1f%% [-, -]", 100*(r.Value-1)) // no interval, as analysis prints it
	}
	return fmt.Sprintf("%+.1f%% [%s, %s]", 100*(r.Value-1), analysis.SignedBound(100*(r.Lo-1), signed1), analysis.SignedBound(100*(r.Hi-1), signed1))
}

// valueText renders a value in its unit: latencies (µs) as analysis prints them.
func valueText(v float64, unit string) string {
	switch unit {
	case "µs":
		return analysis.FormatMicros(v)
	case "MiB":
		return fmt.Sprintf("%.0f MiB", v)
	case "req/s":
		return fmt.Sprintf("%.4g req/s", v)
	case "cores":
		return fmt.Sprintf("%.3g cores", v)
	}
	return fmt.Sprintf("%.4g", v)
}

// analysisMetric is the analysis's metric for a claim's, when it compares it.
var analysisMetric = map[published.Metric]analysis.Metric{
	published.P50: analysis.P50, published.P95: analysis.P95, published.P99: analysis.P99, published.Throughput: analysis.Throughput,
}

// compare compares B against A on a metric: through the analysis's comparisons for
// the metrics it compares, through a t interval over the trials' values for the
// others (compareTrials).
func (c *builder) compare(m published.Metric, ka, kb analysis.Key) outcome {
	ga, gb := c.rep.Group(ka), c.rep.Group(kb)
	for _, x := range []struct {
		g *analysis.Group
		k analysis.Key
	}{{ga, ka}, {gb, kb}} {
		if x.g == nil {
			return outcome{missing: fmt.Sprintf("%s was not measured at %s step %d", x.k.Mesh, x.k.Experiment, x.k.Step)}
		}
	}
	var o outcome
	if am, ok := analysisMetric[m]; ok {
		cmp, _ := analysis.ComparePair(c.run, c.rep, ka, kb, am)
		o = outcome{verdict: cmp.Verdict, margin: cmp.Margin, va: ga.Value(am), vb: gb.Value(am), unit: am.Unit(), ratio: nan()}
		if !math.IsNaN(cmp.Pct.Value) {
			o.ratio = analysis.Estimate{Value: 1 + cmp.Pct.Value/100, Lo: 1 + cmp.Pct.Lo/100, Hi: 1 + cmp.Pct.Hi/100}
		}
	} else {
		o = c.compareTrials(m, ga, gb)
	}
	if o.missing != "" {
		return o
	}
	if m != published.Throughput && m != published.MeshMemory && ga.Kind != results.KindCapacity {
		var behind []string
		for _, g := range []*analysis.Group{ga, gb} {
			if g.GeneratorBehind > 0 {
				behind = append(behind, fmt.Sprintf("%d of %d trials of %s", g.GeneratorBehind, g.Repeats, g.Mesh))
			}
		}
		if len(behind) > 0 {
			o.spoiled = "the load generator fell behind in " + strings.Join(behind, " and ") + ", so the latency is not what the meshes gave"
		}
	}
	return o
}
