package runner

import (
	"io"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/study"
)

// The capacity search's floor probe decides whether a run goes on at all, so a failure
// is probed again, twice, before it is taken. The probes here are scripted results,
// not load runs: whether the generator falls behind depends on what else the machine is
// doing, which a test cannot arrange on demand; the saturation tests in this package
// drive real servers.
func TestFloorProbeConfirmedBeforeTheSearchGivesUp(t *testing.T) {
	served := func(rate float64, behind bool) *load.Result {
		return &load.Result{AchievedRate: rate, Health: load.Health{Bottleneck: behind, Why: []string{"send lag"}}}
	}
	for _, tc := range []struct {
		name string
		// floor is what each probe at the floor returns, in turn.
		floor     []*load.Result
		wantErr   bool
		wantFloor int // probes at the floor
	}{
		{"behind once, then sustained", []*load.Result{served(900, true), served(1000, false)}, false, 2},
		{"behind every time", []*load.Result{served(900, true), served(900, true), served(900, true)}, true, 3},
		{"the target short once, then sustained", []*load.Result{served(900, false), served(1000, false)}, false, 2},
		{"the target short every time", []*load.Result{served(900, false)}, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &study.Study{}
			r := &runner{study: st, progress: newProgress(io.Discard, false, 0), capacities: map[string]map[string][]float64{}}
			trial := &study.Trial{Mesh: &study.Mesh{Name: "m"}, Experiment: &study.Experiment{Name: "capacity", Kind: study.KindCapacity, Connections: []int{16}}}
			atFloor := 0
			probes := capacityProbes{
				closed: func(int, int) (*load.Result, error) { return served(2000, false), nil },
				open: func(rate float64, _ int) (*load.Result, error) {
					if rate != 1000 { // above the floor of 50% of 2000: the target falls short
						return served(rate/2, false), nil
					}
					res := tc.floor[min(atFloor, len(tc.floor)-1)]
					atFloor++
					return res, nil
				},
			}
			err := r.searchCapacity(trial, probes)
			if (err != nil) != tc.wantErr {
				t.Fatalf("searchCapacity: %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "did not sustain") {
				t.Errorf("error %q does not say the floor was not sustained", err)
			}
			if atFloor != tc.wantFloor {
				t.Errorf("%d probes at the floor, want %d", atFloor, tc.wantFloor)
			}
		})
	}
}
