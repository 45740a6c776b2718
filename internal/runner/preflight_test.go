package runner

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/store"
)

// A study whose mesh needs a binary this machine does not have, and whose placement
// names a CPU it does not have, fails before anything is created, with one message
// naming both, how to install the binary, and which mesh needs it.
func TestPreflightNamesEverythingMissingBeforeTheFirstTrial(t *testing.T) {
	needRoot(t)
	t.Setenv("MESHMARK_TOOLS", t.TempDir()) // an empty tools dir
	t.Setenv("MESHMARK_ENVOY", "")
	t.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	if p, err := exec.LookPath("envoy"); err == nil {
		t.Skipf("envoy is installed system-wide at %s; this test needs a machine without it", p)
	}
	st := parseStudy(t, `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-preflight}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1, cpuPlacement: {loadgen: "1023", sut: "0"}}
  workload: {graph: bookinfo}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, duration: 2s, warmup: 500ms}
  repeats: 1
`)
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	start := time.Now()
	run, err := Run(ctx, st, Options{Store: db, PodBinary: podBin, Progress: testWriter{t}})
	if err == nil {
		t.Fatal("the run started without envoy")
	}
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	for _, want := range []string{"envoy (the sidecar proxy", "missing", "meshmark setup", "[needed by mesh sidecar]",
		"cpuPlacement.loadgen: CPU [1023] not available", "nothing was measured"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q", want)
		}
	}
	if strings.Contains(err.Error(), "iptables") || strings.Contains(err.Error(), "setpriv") {
		t.Errorf("error names tools that are present: %v", err)
	}
	runs, lerr := db.ListRuns(ctx)
	if run != nil || lerr != nil || len(runs) != 0 {
		t.Errorf("a run was created (%v, %d runs stored, %v); preflight must fail before", run, len(runs), lerr)
	}
}

// A study built in code, past the loader that refuses it, meets the preflight: a
// Kubernetes-only profile has nothing to run on this machine.
func TestPreflightRefusesKubernetesOnlyProfiles(t *testing.T) {
	st := parseStudy(t, `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: local-cilium}
spec:
  workload: {graph: bookinfo}
  meshes:
    - {name: baseline, profile: none}
    - {name: cilium, profile: envoy-sidecar}
  experiments:
    - {name: lat, kind: fixed-rate, rate: 100, duration: 20s}
`)
	st.Spec.Meshes[1].Profile = "cilium"
	err := (&runner{study: st}).preflight(context.Background())
	if err == nil || !strings.Contains(err.Error(), "mesh cilium: profile cilium runs on spec.substrate.kubernetes only: Cilium's data plane is eBPF") {
		t.Errorf("preflight: %v", err)
	}
}
