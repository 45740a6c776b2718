package runner

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/meshmark/meshmark/internal/owner"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/testbed"
)

const keepUpStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-keep-up}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: chain-2}
  meshes:
    - {name: a, profile: none}
    - {name: b, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 50, duration: 1s, warmup: 200ms}
  repeats: 3
  order: interleaved
  keepMeshesUp: true
`

// ownTestbeds counts the testbeds this process owns (their run directories' owner
// files name it): other test processes' testbeds are not this run's.
func ownTestbeds(t *testing.T) int {
	entries, err := os.ReadDir(testbed.RunRoot)
	if err != nil && !os.IsNotExist(err) {
		t.Error(err)
	}
	n := 0
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(testbed.RunRoot, e.Name(), "owner"))
		if err != nil {
			continue
		}
		if o, err := owner.Parse(data); err == nil && o.PID == os.Getpid() {
			n++
		}
	}
	return n
}

// testbedCounter records, at each trial's progress line, how many testbeds are up.
type testbedCounter struct {
	t       *testing.T
	mu      sync.Mutex
	atTrial []int
	bringUp int
}

func (w *testbedCounter) Write(p []byte) (int, error) {
	line := string(p)
	w.t.Log(strings.TrimRight(line, "\n"))
	w.mu.Lock()
	defer w.mu.Unlock()
	if strings.Contains(line, "run  ") {
		w.atTrial = append(w.atTrial, ownTestbeds(w.t))
	}
	if strings.Contains(line, " up in ") {
		w.bringUp++
	}
	return len(p), nil
}

// With keepMeshesUp the two meshes are brought up once each and both stay up while the
// interleaved trials switch between them; when the run ends nothing is left.
func TestKeepMeshesUpSwitchesWithoutBringUps(t *testing.T) {
	needRoot(t)
	if n := ownTestbeds(t); n != 0 {
		t.Fatalf("%d testbeds of this process before the run", n)
	}
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	w := &testbedCounter{t: t}
	run, err := Run(context.Background(), parseStudy(t, keepUpStudy), Options{Store: db, PodBinary: podBin, Progress: w})
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Trials) != 6 {
		t.Fatalf("%d trials, want 6", len(run.Trials))
	}
	// Repeat blocks hold each mesh once, so a block's two trials are of different
	// meshes: the mesh changes at least three times, each without a bring-up.
	changes := 0
	for i := 1; i < len(run.Trials); i++ {
		if run.Trials[i].Mesh != run.Trials[i-1].Mesh {
			changes++
		}
	}
	if changes < 3 {
		t.Errorf("the mesh changed %d times between trials, want at least 3", changes)
	}
	if w.bringUp != 2 {
		t.Errorf("%d bring-ups, want 2 (one per mesh)", w.bringUp)
	}
	if len(w.atTrial) != 6 {
		t.Fatalf("%d trial lines seen, want 6: %v", len(w.atTrial), w.atTrial)
	}
	// The first trial may come before the second mesh is up; from the first trial of
	// the second mesh on, both are up.
	second := 1
	for second < len(run.Trials) && run.Trials[second].Mesh == run.Trials[0].Mesh {
		second++
	}
	for i, n := range w.atTrial {
		want := 2
		if i < second {
			want = 1
		}
		if n != want {
			t.Errorf("trial %d (%s): %d testbeds up, want %d", i+1, run.Trials[i].Mesh, n, want)
		}
	}
	if got := run.Provenance.Placement["meshes-up"]; !strings.Contains(got, "all together") {
		t.Errorf("provenance placement meshes-up = %q", got)
	}
	if n := ownTestbeds(t); n != 0 {
		t.Errorf("%d testbeds left after the run", n)
	}
}
