package sampler

import (
	"testing"
	"time"
)

// A closing sample taken milliseconds after a regular one must not turn one 10 ms CPU
// tick into a peak of several cores.
func TestPeakIgnoresTinyClosingGap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	proc := func(cpu time.Duration) []ProcSample {
		return []ProcSample{{Target: Target{PID: 1, Role: "sidecar", Pod: "p", Component: "envoy"}, StartTicks: 1, User: cpu}}
	}
	rounds := []Round{
		{Time: t0, Procs: proc(0)},
		{Time: t0.Add(time.Second), Procs: proc(300 * time.Millisecond)},
		{Time: t0.Add(2 * time.Second), Procs: proc(600 * time.Millisecond)},
		{Time: t0.Add(2*time.Second + 4*time.Millisecond), Procs: proc(610 * time.Millisecond)},
	}
	sum, err := Summarize(rounds, SummaryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := sum.Group(ByRole, "sidecar")
	if g == nil {
		t.Fatal("no sidecar group")
	}
	if g.PeakVCPU < 0.29 || g.PeakVCPU > 0.31 {
		t.Errorf("peak %.3f vCPU, want 0.3 (the 4 ms gap read as %.1f cores)", g.PeakVCPU, 0.01/0.004)
	}
	if got := PeakWindow([]time.Time{t0, t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(2*time.Second + 4*time.Millisecond)}); got != 500*time.Millisecond {
		t.Errorf("PeakWindow = %v, want half the median gap, 500ms", got)
	}
}
