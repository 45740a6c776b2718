package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/podcmd/podcmdtest"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate"
)

// podBin is meshmark-pod, built once, which the pods run.
var podBin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		// Network namespaces and iptables need root; `make test` runs as root.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "meshmark-runner-test-")
	if err != nil {
		panic(err)
	}
	if podBin, err = podcmdtest.Build(dir); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and iptables")
	}
}

func parseStudy(t *testing.T, yaml string) *study.Study {
	t.Helper()
	path := filepath.Join(t.TempDir(), "study.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := study.ParseFile(path)
	if err != nil {
		t.Fatalf("study: %v", err)
	}
	return st
}

// runStudy runs a study into a fresh store, requires it to complete, and returns the
// run and the store (closed when the test ends).
func runStudy(t *testing.T, st *study.Study) (*results.Run, *store.Store) {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	run, err := Run(context.Background(), st, Options{Store: db, PodBinary: podBin, Progress: testWriter{t}})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if run.Status != results.StatusComplete {
		t.Fatalf("run status %s (%s)", run.Status, run.StatusReason)
	}
	return run, db
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

const cpuStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-sidecar-cpu}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: bookinfo}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: off}}
  experiments:
    - {name: low, kind: fixed-rate, rate: 100, connections: 8, duration: 10s, warmup: 1s}
    - {name: high, kind: fixed-rate, rate: 200, connections: 8, duration: 10s, warmup: 1s}
  repeats: 2
  order: interleaved
`

// Sidecar CPU is measured per component: it is above zero, it grows with the rate as
// the app's own CPU does in the same trials, and the baseline has no sidecar rows at
// all. The rates keep the app's single core well below saturation. Twice the rate does
// not cost twice the CPU on this VM, for any process: at 100 req/s each request pays
// more for waking idle CPUs than at 200 (the sidecars' p50 fell from 2.9 to 2.4 ms),
// and in one CI run the sidecars measured 1.57× and 1.58× while the app's own
// processes in the same trials measured 1.61× and 1.69× (without a mesh, 1.54× and
// 1.44×). So the sidecars' ratio is held to the app's in the same trials, and to
// clearly more than nothing.
func TestSidecarCPUScalesWithRate(t *testing.T) {
	needRoot(t)
	// The ratio is a measurement on a shared 2-core machine: a run spoiled by someone
	// else's burst is measured once more before the test fails.
	for attempt := 1; ; attempt++ {
		ratio, appRatio, low, high := sidecarCPURatio(t)
		msg := fmt.Sprintf("sidecar CPU at 2× the rate: %.2f× (%.3f → %.3f cores), the app's in the same trials %.2f×", ratio, low, high, appRatio)
		if ratio >= 1.3 && ratio <= 2.4 && ratio >= 0.75*appRatio && ratio <= 1.33*appRatio {
			t.Log(msg)
			return
		}
		if attempt == 2 {
			t.Fatalf("%s; want 1.3–2.4×, and within 0.75–1.33 of the app's", msg)
		}
		t.Logf("attempt %d: %s, measuring again", attempt, msg)
	}
}

// sidecarCPURatio runs cpuStudy and returns the sidecars' cores at 200 req/s over those
// at 100, the same ratio for the app's own processes in the sidecar mesh's trials, and
// the sidecars' cores at each rate.
func sidecarCPURatio(t *testing.T) (ratio, appRatio, low, high float64) {
	run, _ := runStudy(t, parseStudy(t, cpuStudy))
	rep := analysis.Analyze(run, analysis.Options{Seed: 1}, nil)
	cores, app := map[string]float64{}, map[string]float64{}
	for _, u := range rep.Resources {
		t.Logf("%s %s %s/%s: %d procs, %.3f cores, %.3f per 1000 rps, peak RSS %.0f MiB",
			u.Mesh, u.Experiment, u.Component, u.Role, u.Processes, u.CPUCores, u.CoresPer1000RPS, float64(u.RSSPeak)/(1<<20))
		if u.Mesh == "sidecar" && u.Role == string(substrate.RoleWorkload) {
			app[u.Experiment] += u.CPUCores
		}
		if u.Role != string(substrate.RoleSidecar) {
			continue
		}
		if u.Mesh == "none" {
			t.Errorf("baseline has a sidecar row: %+v", u)
		}
		cores[u.Experiment] += u.CPUCores
	}
	low, high = cores["low"], cores["high"]
	if low <= 0 || high <= 0 || app["low"] <= 0 {
		t.Fatalf("sidecar CPU low %.4f, high %.4f cores, the app's at low %.4f: want all above zero", low, high, app["low"])
	}
	for _, tr := range run.Trials {
		var gen bool
		for _, s := range tr.Result.Resources {
			gen = gen || s.Role == string(substrate.RoleLoadGen)
		}
		if !gen {
			t.Errorf("trial %s/%s: the load generator's own CPU is not recorded", tr.Mesh, tr.Experiment)
		}
	}
	// Bytes per pod interface: the entry pod's eth0 carried at least a response per
	// request both ways.
	var found bool
	for _, n := range rep.Network {
		if n.Mesh == "sidecar" && n.Experiment == "high" && strings.HasPrefix(n.Pod, "productpage-") && n.Interface == "eth0" {
			found = true
			t.Logf("productpage eth0 at 200 req/s: rx %.0f B/s, tx %.0f B/s", n.RxBytesPerSec, n.TxBytesPerSec)
			if n.TxBytesPerSec < 200*5*1024 {
				t.Errorf("productpage eth0 sent %.0f B/s at 200 req/s of 5 KiB pages", n.TxBytesPerSec)
			}
		}
	}
	if !found {
		t.Error("no network row for productpage's eth0")
	}
	return high / low, app["high"] / app["low"], low, high
}
