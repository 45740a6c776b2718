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
