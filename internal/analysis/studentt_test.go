package analysis

import (
	"math"
	"testing"
)

// Against the printed tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2) and the
// normal limit.
func TestTQuantileMatchesTables(t *testing.T) {
	for _, c := range []struct{ p, df, want float64 }{
		{0.975, 1, 12.706},
		{0.975, 2, 4.303},
		{0.975, 3, 3.182},
		{0.975, 4, 2.776},
		{0.975, 9, 2.262},
		{0.975, 30, 2.042},
		{0.975, 99, 1.984},
		{0.95, 5, 2.015},
		{0.995, 10, 3.169},
		{0.975, 1e7, 1.960},
		{0.025, 4, -2.776},
		{0.5, 3, 0},
	} {
		if got := tQuantile(c.p, c.df); math.Abs(got-c.want) > 0.0015 {
			t.Errorf("t(%v; df %v) = %.4f, want %.3f", c.p, c.df, got, c.want)
		}
	}
	// Welch's degrees of freedom are fractional: between its neighbours, and the
	// distribution function inverts it.
	q := tQuantile(0.975, 2.5)
	if !(q < 4.303 && q > 3.182) || math.Abs(tCDF(q, 2.5)-0.975) > 1e-9 {
		t.Errorf("t(0.975; df 2.5) = %v, CDF there %v", q, tCDF(q, 2.5))
	}
	for _, bad := range [][2]float64{{0, 3}, {1, 3}, {0.5, 0}, {math.NaN(), 3}} {
		if !math.IsNaN(tQuantile(bad[0], bad[1])) {
			t.Errorf("t(%v; df %v) is a number", bad[0], bad[1])
		}
	}
	if got := c4(2); math.Abs(got-0.8862) > 1e-4 {
		t.Errorf("c4 at df 2 = %v, want 0.8862 (three values)", got)
	}
}
