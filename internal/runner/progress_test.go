package runner

import (
	"testing"
	"time"
)

// etaOf is what the progress line shows as the time left, as a duration.
func etaOf(t *testing.T, p *progress, inTrial time.Duration) time.Duration {
	t.Helper()
	s := p.eta(inTrial)
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("ETA %q is not a duration: %v", s, err)
	}
	return d
}

// The first progress line of a run comes a fraction of a second into its first trial,
// after preflight and a bring-up: the time left is about the plan's, not the hours an
// extrapolation from 14 s of wall time over 60 ms of load promised (seen on S4's run:
// "ETA 8h57m16s" for a run that took ten minutes).
func TestETAAtTheStartIsAboutThePlan(t *testing.T) {
	planned := 580 * time.Second
	p := &progress{start: time.Now().Add(-14 * time.Second), planned: planned, current: 2 * time.Second}
	got := etaOf(t, p, 60*time.Millisecond)
	if got < planned-time.Second || got > 2*planned {
		t.Errorf("ETA %s at the start of a run planned for %s", got, planned)
	}
}

// Once most of the plan has run, the ETA follows the run's own pace: 750 s of wall time
// for 500 s of load leaves about 1.5 × 100 s.
func TestETAFollowsTheRunsPace(t *testing.T) {
	p := &progress{start: time.Now().Add(-750 * time.Second), planned: 600 * time.Second, spent: 500 * time.Second}
	got := etaOf(t, p, 0)
	if got < 135*time.Second || got > 155*time.Second {
		t.Errorf("ETA %s after 500 s of 600 s of load in 750 s, want about 150 s", got)
	}
	p.spent = 650 * time.Second // a search ran longer than planned
	if got := etaOf(t, p, 0); got != 0 {
		t.Errorf("ETA %s with the plan's load time all spent, want 0", got)
	}
}
