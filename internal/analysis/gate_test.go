package analysis

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseGate(t *testing.T) {
	good := []struct {
		in   string
		want Gate
	}{
		{"p99 > +10%", Gate{Metric: P99, Op: ">", Value: 10, Relative: true}},
		{"p50>2ms", Gate{Metric: P50, Op: ">", Value: 2000}},
		{"  p99.9 >= +250us ", Gate{Metric: P999, Op: ">=", Value: 250}},
		{"p999 > 1.5s", Gate{Metric: P999, Op: ">", Value: 1.5e6}},
		{"P90 > 300µs", Gate{Metric: P90, Op: ">", Value: 300}},
		{"throughput < -5%", Gate{Metric: Throughput, Op: "<", Value: -5, Relative: true}},
		{"throughput <= -100rps", Gate{Metric: Throughput, Op: "<=", Value: -100}},
		{"error_rate > +0.5pp", Gate{Metric: ErrorRate, Op: ">", Value: 0.005}},
	}
	for _, c := range good {
		g, err := ParseGate(c.in)
		if err != nil {
			t.Errorf("ParseGate(%q): %v", c.in, err)
			continue
		}
		c.want.Raw = c.in
		if g != c.want {
			t.Errorf("ParseGate(%q) = %+v, want %+v", c.in, g, c.want)
		}
	}
	bad := []struct{ in, msg string }{
		{"", "expected a metric"},
		{"p98 > 10%", `unknown metric "p98"`},
		{"p99 10%", "expected a comparison"},
		{"p99 >> 10%", "expected a number"},
		{"p99 > ten%", "expected a number"},
		{"p99 > 10", "needs a unit"},
		{"p99 > 10rps", `unit "rps" does not fit p99`},
		{"throughput < 5ms", `unit "ms" does not fit throughput`},
		{"error_rate > 1ms", "pp (percentage points)"},
		{"p99 > 10% and more", "unexpected"},
		{"p99 > " + strings.Repeat("9", 400) + "%", "expected a number"},
		{"p99 > 1e3%", `unit "e3%"`},
	}
	for _, c := range bad {
		_, err := ParseGate(c.in)
		var ge *GateError
		if !errors.As(err, &ge) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("ParseGate(%q) = %v, want an error containing %q", c.in, err, c.msg)
		}
	}
}

func TestGateCheck(t *testing.T) {
	worse := Comparison{Mesh: "sidecar", Metric: P99, Base: 1000, Value: 1200,
		Delta: Estimate{200, 150, 250}, Pct: Estimate{20, 15, 25}}
	noisy := worse
	noisy.Delta, noisy.Pct = Estimate{200, -50, 450}, Estimate{20, -5, 45}
	for _, c := range []struct {
		gate string
		on   Comparison
		fail bool
	}{
		{"p99 > +10%", worse, true},
		{"p99 > +25%", worse, false},
		{"p99 > +150us", worse, true},
		{"p99 > +1ms", worse, false},
		{"p99 < -10%", worse, false},
		{"p99 > +10%", noisy, false}, // crosses but the interval includes zero
		{"p50 > +10%", worse, false}, // other metric
	} {
		g, err := ParseGate(c.gate)
		if err != nil {
			t.Fatal(err)
		}
		if f, why := g.Check(c.on); f != c.fail {
			t.Errorf("%s on Δ%v: failed=%v (%s), want %v", c.gate, c.on.Pct, f, why, c.fail)
		}
	}
	// One repeat: no interval, so no failing, and the reason says so.
	single := worse
	single.Delta, single.Pct, single.Verdict, single.Repeats, single.BaseRepeats = Estimate{200, math.NaN(), math.NaN()}, Estimate{20, math.NaN(), math.NaN()}, NoInterval, 1, 1
	if f, why := (Gate{Metric: P99, Op: ">", Value: 10, Relative: true}).Check(single); f || !strings.Contains(why, "no interval") {
		t.Errorf("one repeat: failed=%v (%s), want not failing for want of an interval", f, why)
	}
	g, _ := ParseGate("error_rate > +10%")
	fromZero := Comparison{Metric: ErrorRate, Base: 0, Value: 0.02, Delta: Estimate{0.02, 0.01, 0.03}, Pct: Estimate{math.NaN(), math.NaN(), math.NaN()}}
	if f, _ := g.Check(fromZero); !f {
		t.Error("errors appearing from zero must fail a relative error_rate gate")
	}
}

func FuzzParseGate(f *testing.F) {
	for _, s := range []string{"p99 > +10%", "p50>2ms", "throughput < -5%", "error_rate >= 0.1pp", "p99.9 > 1s", "", "p99 >", "µs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGate(s)
		if err != nil {
			var ge *GateError
			if !errors.As(err, &ge) || ge.Column < 1 || ge.Column > len([]rune(s))+1 {
				t.Fatalf("ParseGate(%q): error %v without a valid column", s, err)
			}
			return
		}
		if math.IsNaN(g.Value) || math.IsInf(g.Value, 0) {
			t.Fatalf("ParseGate(%q) accepted %v", s, g.Value)
		}
		// The canonical form must parse back to the same gate.
		again, err := ParseGate(g.String())
		if err != nil {
			t.Fatalf("canonical %q of %q does not parse: %v", g.String(), s, err)
		}
		again.Raw = g.Raw
		if again.Metric != g.Metric || again.Op != g.Op || again.Relative != g.Relative || math.Abs(again.Value-g.Value) > 1e-9*math.Max(1, math.Abs(g.Value)) {
			t.Fatalf("round trip of %q: %+v then %+v", s, g, again)
		}
	})
}

func TestCompareRunsGates(t *testing.T) {
	old, same, shifted := synthRun(20, 5, 20000, 0), synthRun(21, 5, 20000, 0), synthRun(22, 5, 20000, 0)
	old.ID, same.ID, shifted.ID = "old", "same", "new"
	// In the new run the sidecar got 200 µs slower.
	for i := range shifted.Trials {
		if shifted.Trials[i].Mesh == "sidecar" {
			shifted.Trials[i] = synthTrial(newRNG(uint64(i)), "sidecar", shifted.Trials[i].Repeat, 20000, 200, "fixed", shifted.Trials[i].Params)
		}
	}
	gate, _ := ParseGate("p50 > +10%")
	cs, err := CompareRuns(old, shifted, []string{"sidecar"}, Options{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res, failed := CheckGates([]Gate{gate}, cs); !failed || len(res) != 1 {
		t.Errorf("+200 µs on p50 (~+36%%) did not fail p50 > +10%%: %+v", res)
	}
	cs, err = CompareRuns(old, same, nil, Options{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res, failed := CheckGates([]Gate{gate}, cs); failed || len(res) != 2 {
		t.Errorf("an unchanged run failed the gate or was not checked on both meshes: %+v", res)
	}
	if _, err := CompareRuns(old, same, []string{"linkerd"}, Options{}); err == nil || !strings.Contains(err.Error(), "linkerd") {
		t.Errorf("unknown mesh: %v", err)
	}
}
