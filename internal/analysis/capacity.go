package analysis

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// SLO is what "sustainable" means, the one meshmark judges by: the runner's capacity
// search judges each probe by it and the analysis each pooled step (Judge). A study's
// spec.slo becomes one in one place (study.SLO.Bounds); without one, DefaultSLO. Zero
// latency bounds are not checked; the error rate always is, so that a bound of zero
// allows no errors.
type SLO struct {
	P50  time.Duration `json:"p50"`
	P90  time.Duration `json:"p90,omitempty"`
	P95  time.Duration `json:"p95,omitempty"`
	P99  time.Duration `json:"p99"`
	P999 time.Duration `json:"p999,omitempty"`
	// MaxErrorRate is the highest share of requests that may fail.
	MaxErrorRate float64 `json:"max_error_rate"`
	// MinAchieved is the fraction of the requested rate that must actually be served
	// (open-model load only): a rate the system could not keep up with is not
	// sustainable whatever its latency says.
	MinAchieved float64 `json:"min_achieved"`
	// KneeFactor: the knee is the first step whose p99 exceeds KneeFactor times the
	// p99 at the lowest step (default 3).
	KneeFactor float64 `json:"knee_factor"`
}

// DefaultSLO is the SLO of study S1 (p50 ≤ 300 ms, p99 ≤ 1 s, ~no errors) with the
// achieved rate within 5% of the requested one.
func DefaultSLO() SLO {
	return SLO{P50: 300 * time.Millisecond, P99: time.Second, MaxErrorRate: 0.001, MinAchieved: 0.95, KneeFactor: 3}
}

// CapacityPoint is one step of a sweep.
type CapacityPoint struct {
	Step       int     `json:"step"`
	Label      string  `json:"label"`
	X          float64 `json:"x"`
	Throughput float64 `json:"throughput"`
	P50        int64   `json:"p50_us"`
	P99        int64   `json:"p99_us"`
	ErrorRate  float64 `json:"error_rate"`
	Meets      bool    `json:"meets"`
	Why        string  `json:"why,omitempty"` // which part of the SLO failed
}

// Capacity is the answer for one mesh and one sweep experiment.
type Capacity struct {
	Mesh       string          `json:"mesh"`
	Experiment string          `json:"experiment"`
	XName      string          `json:"x_name"` // "rps", "connections" or "users"
	Points     []CapacityPoint `json:"points"`
	// Found is false when even the lowest step misses the SLO.
	Found bool `json:"found"`
	// MaxX is the highest step value that meets the SLO with every lower step meeting
	// it too: a pass above the first failure is treated as noise, not capacity.
	MaxX          float64 `json:"max_x"`
	MaxThroughput float64 `json:"max_throughput"`
	// Limit says why the step after MaxX failed ("" when every step passed).
	Limit    string  `json:"limit,omitempty"`
	KneeX    float64 `json:"knee_x"`
	HasKnee  bool    `json:"has_knee"`
	KneeRule string  `json:"knee_rule"`
}

// CapacityAll finds capacity for every (mesh, experiment) that has two or more steps.
func CapacityAll(groups []*Group, slo SLO) []Capacity {
	type me struct{ mesh, exp string }
	var order []me
	by := map[me][]*Group{}
	for _, g := range groups {
		k := me{g.Mesh, g.Experiment}
		if by[k] == nil {
			order = append(order, k)
		}
		by[k] = append(by[k], g)
	}
	var out []Capacity
	for _, k := range order {
		if len(by[k]) >= 2 {
			out = append(out, CapacityOf(by[k], slo))
		}
	}
	return out
}

// CapacityOf evaluates one sweep (the groups of one mesh and experiment, one per step).
func CapacityOf(steps []*Group, slo SLO) Capacity {
	if slo.KneeFactor <= 0 {
		slo.KneeFactor = 3
	}
	steps = append([]*Group(nil), steps...)
	sort.SliceStable(steps, func(i, j int) bool { return xOf(steps[i]) < xOf(steps[j]) })
	c := Capacity{Mesh: steps[0].Mesh, Experiment: steps[0].Experiment, XName: xName(steps[0].Params)}
	open := steps[0].Params.RequestedRate > 0
	c.KneeRule = fmt.Sprintf("first step whose p99 exceeds %g× the p99 of the lowest step", slo.KneeFactor)
	if !open {
		c.KneeRule += ", or whose throughput rises less than 5% over the previous step"
	}
	failed := false
	for i, g := range steps {
		p := CapacityPoint{Step: g.Step, Label: g.Label, X: xOf(g), Throughput: g.Throughput, P50: g.P50, P99: g.P99, ErrorRate: g.ErrorRate, Meets: true}
		if miss := slo.Misses(g); len(miss) > 0 {
			p.Meets, p.Why = false, miss[0].Why
		} else if g.Saturated > 0 {
			p.Meets, p.Why = false, fmt.Sprintf("the target saturated in %d of %d trials", g.Saturated, g.Repeats)
		}
		if !failed {
			if p.Meets {
				c.Found, c.MaxX, c.MaxThroughput = true, p.X, p.Throughput
			} else {
				failed, c.Limit = true, p.Why
			}
		}
		if !c.HasKnee && i > 0 {
			low := steps[0].P99
			knee := low > 0 && float64(g.P99) > slo.KneeFactor*float64(low)
			if !open && steps[i-1].Throughput > 0 && g.Throughput < 1.05*steps[i-1].Throughput {
				knee = true
			}
			if knee {
				c.HasKnee, c.KneeX = true, p.X
			}
		}
		c.Points = append(c.Points, p)
	}
	return c
}

// SLOMiss is one part of the SLO a group broke.
type SLOMiss struct {
	// Metric is what broke it: P50, P99, ErrorRate or Throughput (served less than
	// MinAchieved of the requested rate).
	Metric Metric `json:"metric"`
	// Why says it with the numbers: "p99 1.99s > 1s".
	Why string `json:"why"`
}

// Observed is what an SLO judges: one trial's figures (the runner's search probe) or a
// step's pooled over its repeats (Group).
type Observed struct {
	// Latency is a percentile (50, 90, 95, 99, 99.9) of the latencies; nil when none
	// were measured, and then no latency bound is judged.
	Latency func(percentile float64) time.Duration
	// ErrorRate is the share of requests that failed.
	ErrorRate float64
	// Throughput is the rate served, RequestedRate the rate asked for (0 for
	// closed-model load, whose rate is what the target answers).
	Throughput, RequestedRate float64
}

// Judge lists the parts of the SLO o breaks, in the order p50, p90, p95, p99, p99.9,
// error rate, served rate (the last for open-model load only); none when it meets
// every part.
func (slo SLO) Judge(o Observed) []SLOMiss {
	var out []SLOMiss
	if o.Latency != nil {
		for _, b := range []struct {
			metric Metric
			bound  time.Duration
		}{{P50, slo.P50}, {P90, slo.P90}, {P95, slo.P95}, {P99, slo.P99}, {P999, slo.P999}} {
			if got := o.Latency(b.metric.Percentile()); b.bound > 0 && got > b.bound {
				out = append(out, SLOMiss{b.metric, fmt.Sprintf("%s %s > %v", b.metric, FormatMicros(float64(got)/float64(time.Microsecond)), b.bound)})
			}
		}
	}
	if o.ErrorRate > slo.MaxErrorRate {
		out = append(out, SLOMiss{ErrorRate, fmt.Sprintf("error rate %.3g%% > %.3g%%", 100*o.ErrorRate, 100*slo.MaxErrorRate)})
	}
	if rate := o.RequestedRate; rate > 0 && slo.MinAchieved > 0 && o.Throughput < slo.MinAchieved*rate {
		out = append(out, SLOMiss{Throughput, fmt.Sprintf("served %.0f of %.0f req/s requested", o.Throughput, rate)})
	}
	return out
}

// Misses lists the parts of the SLO the pooled group breaks (see Judge).
func (slo SLO) Misses(g *Group) []SLOMiss {
	pooled := map[float64]int64{50: g.P50, 90: g.P90, 95: g.P95, 99: g.P99, 99.9: g.P999}
	return slo.Judge(Observed{
		Latency:   func(p float64) time.Duration { return results.Duration(pooled[p]) },
		ErrorRate: g.ErrorRate, Throughput: g.Throughput, RequestedRate: g.Params.RequestedRate,
	})
}

// String states the SLO: "p50 ≤ 300ms, p99 ≤ 1s, errors ≤ 0.1%, served ≥ 95% of the
// requested rate".
func (slo SLO) String() string {
	var parts []string
	if slo.P50 > 0 {
		parts = append(parts, fmt.Sprintf("p50 ≤ %v", slo.P50))
	}
	if slo.P90 > 0 {
		parts = append(parts, fmt.Sprintf("p90 ≤ %v", slo.P90))
	}
	if slo.P95 > 0 {
		parts = append(parts, fmt.Sprintf("p95 ≤ %v", slo.P95))
	}
	if slo.P99 > 0 {
		parts = append(parts, fmt.Sprintf("p99 ≤ %v", slo.P99))
	}
	if slo.P999 > 0 {
		parts = append(parts, fmt.Sprintf("p99.9 ≤ %v", slo.P999))
	}
	parts = append(parts, fmt.Sprintf("errors ≤ %.3g%%", 100*slo.MaxErrorRate))
	if slo.MinAchieved > 0 {
		parts = append(parts, fmt.Sprintf("served ≥ %.3g%% of the requested rate", 100*slo.MinAchieved))
	}
	return strings.Join(parts, ", ")
}

func xOf(g *Group) float64 {
	p := g.Params
	switch {
	case p.RequestedRate > 0:
		return p.RequestedRate
	case p.Users > 0:
		return float64(p.Users)
	case p.Connections > 0:
		return float64(p.Connections)
	}
	return float64(g.Step)
}

func xName(p results.TrialParams) string {
	switch {
	case p.RequestedRate > 0:
		return "rps"
	case p.Users > 0:
		return "users"
	case p.Connections > 0:
		return "connections"
	}
	return "step"
}

// OutlierMinDeviation is how far (relative to the group's median trial p99) a trial
// must lie before it is flagged. With five repeats the quartiles are so uncertain that
// Tukey's fences alone flag trials differing by a percent or two; such a trial is
// statistically odd but practically identical, and flagging it would only teach
// users to ignore the flag.
const OutlierMinDeviation = 0.10

// TukeyOutliers flags trials whose p99 lies outside Tukey's fences
// [Q1 − k·IQR, Q3 + k·IQR] of the group's trial p99s and more than
// OutlierMinDeviation away from their median. It needs four trials; flagged trials are
// reported, never removed. Returns trial ids (or repeat numbers for trials not yet
// stored).
func TukeyOutliers(trials []*results.Trial, k float64) []int64 {
	if len(trials) < 4 {
		return nil
	}
	p99 := make([]float64, len(trials))
	for i, t := range trials {
		p99[i] = float64(t.Result.Latency.ValueAtQuantile(99))
	}
	sorted := append([]float64(nil), p99...)
	q1, q3 := quantile(sorted, 0.25), quantile(sorted, 0.75)
	median := quantile(sorted, 0.5)
	iqr := q3 - q1
	var out []int64
	for i, t := range trials {
		outside := p99[i] < q1-k*iqr || p99[i] > q3+k*iqr
		material := median > 0 && math.Abs(p99[i]-median)/median > OutlierMinDeviation
		if outside && material {
			id := t.ID
			if id == 0 {
				id = int64(t.Repeat)
			}
			out = append(out, id)
		}
	}
	return out
}
