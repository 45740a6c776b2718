package runner

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshmark/meshmark/internal/store"
)

// TestOwnCPUs: the open model may spin only where the load generator has CPUs the
// system under test does not run on.
func TestOwnCPUs(t *testing.T) {
	for _, c := range []struct {
		loadgen, sut []int
		want         bool
	}{
		{[]int{1}, []int{0}, true},
		{[]int{2, 3}, []int{0, 1}, true},
		{[]int{1}, []int{0, 1}, false},
		{nil, []int{0}, false},
		{[]int{1}, nil, false}, // the system under test may run anywhere, the generator's core too
		{nil, nil, false},
	} {
		if got := ownCPUs(c.loadgen, c.sut); got != c.want {
			t.Errorf("ownCPUs(%v, %v) = %v, want %v", c.loadgen, c.sut, got, c.want)
		}
	}
}

const placementStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-placement}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1, cpuPlacement: {loadgen: "1", sut: "0"}}
  workload: {graph: chain-2}
  meshes:
    - {name: a, profile: none}
    - {name: b, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 50, duration: 1s, warmup: 200ms}
  repeats: 2
  freshBringUpPerRepeat: true
`

// maskWriter records, for each progress line that contains one of its keys, the CPUs
// meshmark's threads were allowed at that moment (the progress is written from the
// runner's own goroutine, so any of its threads shows the process's placement).
type maskWriter struct {
	t    *testing.T
	mu   sync.Mutex
	seen map[string][]int
}

func (w *maskWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	w.t.Log(line)
	for _, key := range []string{"torn down", " up in ", "run  "} {
		if strings.Contains(line, key) {
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(0, &set); err != nil {
				w.t.Error(err)
			}
			w.mu.Lock()
			w.seen[key] = append(w.seen[key], set.Count())
			w.mu.Unlock()
		}
	}
	return len(p), nil
}

// With a placement, meshmark measures from the load generator's CPU only, but brings
// deployments up and down on every CPU it started with (a bring-up confined to the load
// generator's one CPU took twice as long for 100 pods), and gives them all back when
// the run ends.
func TestPlacementPinsTrialsNotBringUps(t *testing.T) {
	needRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	if !before.IsSet(0) || !before.IsSet(1) {
		t.Skipf("this test process may not use CPUs 0 and 1 (%d CPUs allowed)", before.Count())
	}
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	w := &maskWriter{t: t, seen: map[string][]int{}}
	run, err := Run(context.Background(), parseStudy(t, placementStudy), Options{Store: db, ServiceBinary: meshmarkBin, Progress: w})
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Trials) != 4 {
		t.Fatalf("%d trials, want 4", len(run.Trials))
	}
	for key, want := range map[string]int{"run  ": 1, " up in ": 1, "torn down": before.Count()} {
		got := w.seen[key]
		if len(got) < 3 {
			t.Errorf("progress lines with %q: %d, want one per trial or deployment", key, len(got))
		}
		for _, n := range got {
			if n != want {
				t.Errorf("at %q meshmark could use %d CPUs, want %d (all seen: %v)", key, n, want, got)
			}
		}
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("after the run meshmark may use %d CPUs, before it %d", after.Count(), before.Count())
	}
}
