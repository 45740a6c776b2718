package analysis

import "testing"

// TestAbsurdBoundsAreNotPrintedDigitByDigit: two repeats give a t interval with 1
// degree of freedom (t = 12.7), whose bounds on a ratio can reach 10^10; the answer says
// the bound is beyond 9999 instead of printing eleven digits no one can use.
func TestAbsurdBoundsAreNotPrintedDigitByDigit(t *testing.T) {
	got := AddedLatency(Estimate{Value: 132e3, Lo: -284e3, Hi: 26287201967e3})
	if got != "+132ms [-284, >+9999]" {
		t.Errorf("added latency %q", got)
	}
	if got := pct(Estimate{Value: 8.5, Lo: -100, Hi: 519983.4}); got != "+8.5% [-100.0, >+9999]" {
		t.Errorf("percent %q", got)
	}
	if got := AddedLatency(Estimate{Value: 1200, Lo: 1010, Hi: 1430}); got != "+1.20ms [+1.01, +1.43]" {
		t.Errorf("ordinary interval %q", got)
	}
}

// A proxy that carried none of a point's requests (the baseline's ingress, measured on
// the internal path) sums to rounding noise around zero: the answer says 0, not
// "-7.95e-17", and keeps three figures for what was measured.
func TestCPUNearZeroReadsZero(t *testing.T) {
	for _, c := range []struct {
		proxy, sut float64
		want       string
	}{
		{-7.95e-17, 0.321, "0 (0.321)"},
		{3.07e-17, 0.348, "0 (0.348)"},
		{0.00337, 0.293, "0.00337 (0.293)"},
		{2.134, 2.72, "2.13 (2.72)"},
	} {
		if got := cpuText(AnswerRow{Proxies: 1, ProxyCoresPer1000RPS: c.proxy, SUTCoresPer1000RPS: c.sut}); got != c.want {
			t.Errorf("proxies %g, SUT %g: %q, want %q", c.proxy, c.sut, got, c.want)
		}
	}
}
