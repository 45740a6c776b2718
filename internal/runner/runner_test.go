package runner

import (
	"context"
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

// Sidecar CPU is measured per component: it is above zero, twice the rate costs about
// twice the sidecar CPU, and the baseline has no sidecar rows at all. The rates keep the
// app's single core well below saturation, where Envoy's cost per request drops as work
// batches up and the ratio would fall under 2 for a reason that is not measurement error.
func TestSidecarCPUScalesWithRate(t *testing.T) {
	needRoot(t)
	// The ratio is a measurement on a shared 2-core machine: a run spoiled by someone
	// else's burst is measured once more before the test fails.
	for attempt := 1; ; attempt++ {
		ratio, low, high := sidecarCPURatio(t)
		if ratio >= 1.6 && ratio <= 2.4 {
			t.Logf("sidecar CPU at 2× the rate: %.2f× (%.3f → %.3f cores)", ratio, low, high)
			return
		}
		if attempt == 2 {
			t.Fatalf("sidecar CPU at 2× the rate is %.2f× (%.3f → %.3f cores), want 1.6–2.4×", ratio, low, high)
		}
		t.Logf("attempt %d: sidecar CPU ratio %.2f× outside 1.6–2.4×, measuring again", attempt, ratio)
	}
}

// sidecarCPURatio runs the CPU study, checks what must hold in every run, and returns
// the high/low ratio of sidecar CPU.
func sidecarCPURatio(t *testing.T) (ratio, low, high float64) {
	run, _ := runStudy(t, parseStudy(t, cpuStudy))
	rep := analysis.Analyze(run, analysis.Options{Seed: 1}, nil)
	cores := map[string]float64{}
	for _, u := range rep.Resources {
		t.Logf("%s %s %s/%s: %d procs, %.3f cores, %.3f per 1000 rps, peak RSS %.0f MiB",
			u.Mesh, u.Experiment, u.Component, u.Role, u.Processes, u.CPUCores, u.CoresPer1000RPS, float64(u.RSSPeak)/(1<<20))
		if u.Role != string(substrate.RoleSidecar) {
			continue
		}
		if u.Mesh == "none" {
			t.Errorf("baseline has a sidecar row: %+v", u)
		}
		cores[u.Experiment] += u.CPUCores
	}
	low, high = cores["low"], cores["high"]
	if low <= 0 || high <= 0 {
		t.Fatalf("sidecar CPU low %.4f, high %.4f cores: want both above zero", low, high)
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
	return high / low, low, high
}
