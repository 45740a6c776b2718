package reproduce

import (
	"math"
	"sort"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/published"
	"github.com/meshmark/meshmark/internal/results"
)

// The analysis compares percentiles, throughput and error rates; two of the studies
// published other quantities, mean latency (S2, S5) and the memory of the mesh's
// components (S4). Those are compared here with the analysis's method
// (analysis.RatioInterval): a t interval over repeats on the log ratio, paired when
// both meshes ran each repeat in one interleaved block, at the analysis's confidence,
// with a verdict that needs the interval to exclude no change and the change to exceed
// a margin. With fewer than three repeats, mean latency resamples
// the trials' one-second intervals instead (as the analysis does); memory needs two.

// memoryMargin is the practical-equivalence margin of the mesh's memory, in %: a
// proxy's resident memory moves by a few percent from one bring-up to the next.
const memoryMargin = 5

// unitValue is one resampling unit: its share of a ratio's numerator and denominator
// (a trial's latency sum and count, or its mesh memory and 1).
type unitValue struct {
	repeat   int
	start    time.Time
	num, den float64
}

// meshRoles are the roles of the mesh's own components: what S4's totals counted.
var meshRoles = map[string]bool{"sidecar": true, "node-proxy": true, "gateway": true, "control-plane": true, "proxy": true}

// compareTrials compares B against A on mean latency or the mesh's memory.
func (c *builder) compareTrials(m published.Metric, ga, gb *analysis.Group) outcome {
	opts := c.rep.Options
	o := outcome{ratio: nan(), verdict: analysis.Inconclusive}
	var ua, ub []unitValue
	switch m {
	case published.Mean:
		o.unit, o.margin = "µs", opts.Margin(analysis.P50)
		ua, ub = latencyUnits(ga, 3), latencyUnits(gb, 3)
		if len(ua) < 3 || len(ub) < 3 {
			if ia, ib := intervalUnits(ga), intervalUnits(gb); len(ia) >= 2 && len(ib) >= 2 {
				ua, ub = ia, ib
			}
		}
	case published.MeshMemory, dataPlaneMemory, controlPlaneMemory, dataPlaneCPU, controlPlaneCPU:
		o.unit, o.margin = "MiB", memoryMargin
		if m == dataPlaneCPU || m == controlPlaneCPU {
			o.unit = "cores"
		}
		ua, ub = resourceUnits(ga, m), resourceUnits(gb, m)
		if len(ua) == 0 || len(ub) == 0 {
			o.missing = "no resource samples were recorded there"
			return o
		}
	default:
		o.missing = "meshmark does not measure " + string(m)
		return o
	}
	o.va, o.vb = ratioOf(ua), ratioOf(ub)
	if o.va > 0 {
		o.ratio.Value = o.vb / o.va
	}
	if len(ua) < 2 || len(ub) < 2 || o.va <= 0 {
		return o
	}
	conf := opts.Confidence
	if conf <= 0 || conf >= 1 {
		conf = 0.95
	}
	paired := pairable(ua, ub)
	o.ratio.Lo, o.ratio.Hi = analysis.RatioInterval(unitRatios(ua), unitRatios(ub), paired, math.Log(o.vb/o.va), conf)
	o.verdict = trialVerdict(o.ratio, o.margin)
	return o
}

// trialVerdict judges B against A as the analysis judges a comparison (without a
// noise floor, which it measures only for its own metrics): equal when the whole
// interval lies within the margin, worse or better when it excludes no change and the
// change exceeds the margin, inconclusive otherwise. Higher is worse for both metrics.
func trialVerdict(r analysis.Estimate, margin float64) analysis.Verdict {
	lo, hi, point := 100*(r.Lo-1), 100*(r.Hi-1), 100*(r.Value-1)
	switch {
	case lo >= -margin && hi <= margin:
		return analysis.Equal
	case lo > 0 && point > margin:
		return analysis.Worse
	case hi < 0 && point < -margin:
		return analysis.Better
	}
	return analysis.Inconclusive
}

func ratioOf(us []unitValue) float64 {
	var num, den float64
	for _, u := range us {
		num += u.num
		den += u.den
	}
	if den == 0 {
		return math.NaN()
	}
	return num / den
}

// pairable: both hold the same repeats, one unit each, and each repeat's two units ran
// in one block, before any unit of the next repeat (interleaved order); intervals are
// never paired.
func pairable(a, b []unitValue) bool {
	if len(a) != len(b) || len(a) < 2 {
		return false
	}
	prevLast := time.Time{}
	for i := range a {
		if a[i].repeat != b[i].repeat || a[i].repeat < 0 || a[i].start.IsZero() || b[i].start.IsZero() {
			return false
		}
		first, last := a[i].start, b[i].start
		if last.Before(first) {
			first, last = last, first
		}
		if i > 0 && !prevLast.Before(first) {
			return false
		}
		prevLast = last
	}
	return true
}

// latencyUnits are a group's trials as units of mean latency, when it has at least
// min of them.
func latencyUnits(g *analysis.Group, minTrials int) []unitValue {
	if len(g.Trials) < minTrials {
		return nil
	}
	var out []unitValue
	for _, t := range g.Trials {
		h := t.Result.Latency
		if h == nil || h.TotalCount() == 0 {
			return nil
		}
		out = append(out, unitValue{repeat: t.Repeat, start: t.Start, num: h.Mean() * float64(h.TotalCount()), den: float64(h.TotalCount())})
	}
	return out
}

// intervalUnits are a group's one-second intervals as units of mean latency (never
// paired: repeat -1).
func intervalUnits(g *analysis.Group) []unitValue {
	var out []unitValue
	for _, t := range g.Trials {
		for _, iv := range t.Result.Intervals {
			if iv.Histogram == nil {
				return nil
			}
			if n := iv.Histogram.TotalCount(); n > 0 {
				out = append(out, unitValue{repeat: -1, num: iv.Histogram.Mean() * float64(n), den: float64(n)})
			}
		}
	}
	return out
}

// Resource quantities the S1 verdict table compares besides the claims' metrics.
const (
	dataPlaneCPU       published.Metric = "data-plane CPU"
	controlPlaneCPU    published.Metric = "control-plane CPU"
	dataPlaneMemory    published.Metric = "data-plane memory"
	controlPlaneMemory published.Metric = "control-plane memory"
)

// resourceRoles are the roles a resource metric sums.
func resourceRoles(m published.Metric) func(role string) bool {
	switch m {
	case dataPlaneCPU, dataPlaneMemory:
		return func(r string) bool { return meshRoles[r] && r != "control-plane" }
	case controlPlaneCPU, controlPlaneMemory:
		return func(r string) bool { return r == "control-plane" }
	}
	return func(r string) bool { return meshRoles[r] }
}

// resourceUnits are a group's trials as units of a resource metric (den 1): memory in
// MiB, CPU in cores; trials without resource samples are left out.
func resourceUnits(g *analysis.Group, m published.Metric) []unitValue {
	in := resourceRoles(m)
	cpu := m == dataPlaneCPU || m == controlPlaneCPU
	var out []unitValue
	for _, t := range g.Trials {
		if len(t.Result.Resources) == 0 {
			continue
		}
		mem, cores := trialResources(t, in)
		v := mem / (1 << 20)
		if cpu {
			v = cores
		}
		out = append(out, unitValue{repeat: t.Repeat, start: t.Start, num: v, den: 1})
	}
	return out
}

// trialResources sums, over a trial's processes whose role is in, each process's mean
// RSS (bytes) and its CPU from its first sample to its last (cores).
func trialResources(t *results.Trial, in func(string) bool) (mem, cores float64) {
	type proc struct{ component, pod, node string }
	by := map[proc][]results.ResourceSample{}
	for _, s := range t.Result.Resources {
		if in(s.Role) {
			k := proc{s.Component, s.Pod, s.Node}
			by[k] = append(by[k], s)
		}
	}
	for _, ss := range by {
		sort.Slice(ss, func(i, j int) bool { return ss[i].T.Before(ss[j].T) })
		var sum float64
		for _, s := range ss {
			sum += float64(s.RSSBytes)
		}
		mem += sum / float64(len(ss))
		first, last := ss[0], ss[len(ss)-1]
		if secs := last.T.Sub(first.T).Seconds(); secs > 0 {
			cores += (last.CPUUserSeconds + last.CPUSysSeconds - first.CPUUserSeconds - first.CPUSysSeconds) / secs
		}
	}
	return mem, cores
}

// unitRatios is each unit's own value (its numerator over its denominator).
func unitRatios(us []unitValue) []float64 {
	out := make([]float64, len(us))
	for i, u := range us {
		out[i] = u.num / u.den
	}
	return out
}
