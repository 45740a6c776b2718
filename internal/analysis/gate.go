package analysis

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Gate is a regression rule for `meshmark compare --fail-if`, e.g. "p99 > +10%".
//
// Grammar (spaces optional):
//
//	gate      = metric op threshold | "security"
//	metric    = "p50" | "p90" | "p99" | "p99.9" | "p999" | "throughput" | "error_rate"
//	op        = ">" | ">=" | "<" | "<="
//	threshold = [ "+" | "-" ] number unit
//	unit      = "%"                       relative change, any metric
//	          | "us" | "µs" | "ms" | "s"  absolute change, latency metrics
//	          | "rps"                     absolute change in req/s, throughput
//	          | "pp"                      absolute change in percentage points, error_rate
//
// The change is new − old (run B − run A). A gate fails when the point estimate of the
// change crosses the threshold and the change is real: its confidence interval
// excludes zero. Noise alone therefore never fails a gate.
//
// The gate "security" fails when a security probe fails in RUN_B and did not in RUN_A
// (see CompareSecurity).
type Gate struct {
	Raw      string
	Metric   Metric
	Op       string
	Value    float64 // in the metric's unit (µs, req/s, fraction) or percent if Relative
	Relative bool
	Security bool `json:",omitempty"`
}

// GateError is a gate expression that does not parse.
type GateError struct {
	Expr   string
	Column int // 1-based
	Msg    string
}

func (e *GateError) Error() string {
	return fmt.Sprintf("gate %q: column %d: %s (example: 'p99 > +10%%', 'p50 > +2ms', 'throughput < -5%%', 'error_rate > +0.5pp')", e.Expr, e.Column, e.Msg)
}

var gateMetrics = map[string]Metric{"p50": P50, "p90": P90, "p99": P99, "p99.9": P999, "p999": P999,
	"throughput": Throughput, "error_rate": ErrorRate}

// ParseGate parses one gate expression.
func ParseGate(expr string) (Gate, error) {
	g := Gate{Raw: expr}
	if strings.EqualFold(strings.TrimSpace(expr), "security") {
		g.Security = true
		return g, nil
	}
	i := 0
	fail := func(msg string, args ...any) (Gate, error) {
		return Gate{}, &GateError{Expr: expr, Column: len([]rune(expr[:i])) + 1, Msg: fmt.Sprintf(msg, args...)}
	}
	skip := func() {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t') {
			i++
		}
	}
	skip()
	start := i
	for i < len(expr) && (isWordByte(expr[i])) {
		i++
	}
	name := strings.ToLower(expr[start:i])
	if name == "" {
		return fail("expected a metric (p50, p90, p99, p99.9, throughput, error_rate)")
	}
	m, ok := gateMetrics[name]
	if !ok {
		i = start
		return fail("unknown metric %q (want p50, p90, p99, p99.9, throughput, error_rate, or the gate security)", name)
	}
	g.Metric = m
	skip()
	switch {
	case strings.HasPrefix(expr[i:], ">="), strings.HasPrefix(expr[i:], "<="):
		g.Op = expr[i : i+2]
		i += 2
	case strings.HasPrefix(expr[i:], ">"), strings.HasPrefix(expr[i:], "<"):
		g.Op = expr[i : i+1]
		i++
	default:
		return fail("expected a comparison (>, >=, <, <=) after %q", name)
	}
	skip()
	numStart := i
	if i < len(expr) && (expr[i] == '+' || expr[i] == '-') {
		i++
	}
	for i < len(expr) && (expr[i] >= '0' && expr[i] <= '9' || expr[i] == '.') {
		i++
	}
	v, err := strconv.ParseFloat(expr[numStart:i], 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		i = numStart
		return fail("expected a number such as +10 after %q", g.Op)
	}
	if v == 0 {
		v = 0 // -0 would print as "+-0"
	}
	skip()
	unitStart := i
	for i < len(expr) && expr[i] != ' ' && expr[i] != '\t' {
		i++
	}
	unit := strings.ToLower(expr[unitStart:i])
	skip()
	if i != len(expr) {
		return fail("unexpected %q after the threshold", expr[i:])
	}
	i = unitStart
	latency := m.Percentile() >= 0
	switch {
	case unit == "%":
		g.Value, g.Relative = v, true
	case latency && (unit == "us" || unit == "µs"):
		g.Value = v
	case latency && unit == "ms":
		g.Value = v * 1e3
	case latency && unit == "s":
		g.Value = v * 1e6
	case m == Throughput && unit == "rps":
		g.Value = v
	case m == ErrorRate && unit == "pp":
		g.Value = v / 100
	case unit == "":
		return fail("the threshold needs a unit (%s)", unitsFor(m))
	default:
		return fail("unit %q does not fit %s (use %s)", unit, m, unitsFor(m))
	}
	return g, nil
}

func isWordByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '.'
}

func unitsFor(m Metric) string {
	switch {
	case m.Percentile() >= 0:
		return "%, us, ms or s"
	case m == Throughput:
		return "% or rps"
	}
	return "% (relative) or pp (percentage points)"
}

// String renders the gate in canonical form (which ParseGate reads back).
func (g Gate) String() string {
	if g.Security {
		return "security"
	}
	num := func(v float64) string {
		s := strconv.FormatFloat(v, 'f', -1, 64)
		if v >= 0 {
			s = "+" + s
		}
		return s
	}
	switch {
	case g.Relative:
		return fmt.Sprintf("%s %s %s%%", g.Metric, g.Op, num(g.Value))
	case g.Metric.Percentile() >= 0:
		return fmt.Sprintf("%s %s %sus", g.Metric, g.Op, num(g.Value))
	case g.Metric == Throughput:
		return fmt.Sprintf("%s %s %srps", g.Metric, g.Op, num(g.Value))
	}
	return fmt.Sprintf("%s %s %spp", g.Metric, g.Op, num(g.Value*100))
}

// Check evaluates the gate on a comparison of the same metric. It returns whether the
// gate fails and a sentence saying why or why not.
func (g Gate) Check(c Comparison) (failed bool, why string) {
	if c.Metric != g.Metric {
		return false, ""
	}
	change := c.Delta.Value
	shown := fmt.Sprintf("%+.4g%s", change, c.Metric.Unit())
	if c.Metric == ErrorRate {
		shown = fmt.Sprintf("%+.3gpp", 100*change)
	}
	if g.Relative {
		change = c.Pct.Value
		if c.Base == 0 {
			change = 0
			if c.Value > 0 {
				change = math.Inf(1)
			}
		}
		shown = fmt.Sprintf("%+.2f%%", change)
	}
	var crossed bool
	switch g.Op {
	case ">":
		crossed = change > g.Value
	case ">=":
		crossed = change >= g.Value
	case "<":
		crossed = change < g.Value
	case "<=":
		crossed = change <= g.Value
	}
	where := fmt.Sprintf("%s %s", c.Mesh, c.Label)
	switch {
	case !crossed:
		return false, fmt.Sprintf("%s: %s %s, within %s", where, c.Metric, shown, g)
	case c.Verdict == NoInterval:
		return false, fmt.Sprintf("%s: %s %s crosses %s, but with %d and %d repeats there is no interval to tell it from noise; not failing (measure two repeats or more)",
			where, c.Metric, shown, g, c.BaseRepeats, c.Repeats)
	case c.Verdict == TooFewRequests:
		return false, fmt.Sprintf("%s: %s %s crosses %s, but its trials had too few requests to place that percentile; not failing (longer trials or a higher rate)",
			where, c.Metric, shown, g)
	case !c.Delta.ExcludesZero():
		return false, fmt.Sprintf("%s: %s %s crosses %s but its confidence interval includes no change; not failing on noise", where, c.Metric, shown, g)
	}
	return true, fmt.Sprintf("%s: %s %s violates %s", where, c.Metric, shown, g)
}
