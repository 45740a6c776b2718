package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/podcmd"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
)

// platformStudy is one study for both platforms: only its substrate differs. A
// fixed-rate experiment and a connections experiment with a rate (2 connections at 100
// req/s), through no mesh and through Istio's sidecar under strict mTLS, in two
// interleaved repeats on deployments kept up throughout (keepMeshesUp).
const platformStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms}
spec:
  substrate:
%s
  workload: {graph: bookinfo}
  meshes:
    - {name: baseline, profile: none}
    - {name: istio, profile: envoy-sidecar, options: {mtls: strict}}
  baseline: baseline
  experiments:
    - {name: latency, kind: fixed-rate, rate: 40, duration: 6s, warmup: 1s}
    - {name: conns, kind: connections, connections: [2], rate: 100, duration: 4s, warmup: 1s}
  repeats: 2
  keepMeshesUp: true
`

// TestSameStudyOnBothPlatforms runs one study, unchanged but for its substrate, on the
// local testbed and on the real two-node cluster, and holds both runs to the same
// assertions (checkRunOnEitherPlatform): the one runner walks the same plan on both,
// keeping both meshes up through the interleaved repeats (one bring-up each), turns
// each experiment into the same load (the rate kept, every request answered and in the
// histogram, the connections experiment never more requests in flight than its two
// connections), proves the sidecar mesh enrolled (strict mTLS seen at every service,
// plaintext refused) and reads the CPU and memory of the workload's and the sidecars'
// containers. What only one platform records is asserted by the tests of that platform.
func TestSameStudyOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, true)
	runs := onBothPlatforms(t, l, platformStudy, func(t *testing.T, run *results.Run, progress string) {
		checkRunOnEitherPlatform(t, run)
		// kept up: each mesh brought up once, though the repeats interleave them
		for _, m := range []string{"baseline", "istio"} {
			if n := strings.Count(progress, m+" up in "); n != 1 {
				t.Errorf("%s brought up %d times, want once (keepMeshesUp)", m, n)
			}
		}
	})
	if a, b := trialKeys(runs["local"]), trialKeys(runs["kubernetes"]); !slices.Equal(a, b) {
		t.Errorf("the plans differ:\n  local      %v\n  kubernetes %v", a, b)
	}
	checkNothingLeft(t, l, "istio-system")
}

// precisionStudy (a format, in which %% is %) asks for a precision no run can reach,
// a p50 difference of 0.001% between two configurations of no mesh, so that only the
// budget ends its rounds.
const precisionStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-precision}
spec:
  substrate:
%s
  workload: {graph: bookinfo}
  meshes:
    - {name: base-a, profile: none}
    - {name: base-b, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 50, duration: 1s, warmup: 200ms}
  repeats: 2
  precision: {p50: 0.001%%, budget: 40s}
`

// TestPrecisionAddsRoundsOnBothPlatforms: a precision target adds rounds of the last
// stage, on the local testbed as through the real generator pods of the cluster, in
// batches that at most double the repeats, until the next would not fit the budget,
// and the progress says so. (That a target met at once adds nothing is the runner's
// TestPrecisionMetAtOnceAddsNothing.)
func TestPrecisionAddsRoundsOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, false)
	onBothPlatforms(t, l, precisionStudy, func(t *testing.T, run *results.Run, progress string) {
		repeats := map[string]int{}
		for _, tr := range run.Trials {
			repeats[tr.Mesh] = max(repeats[tr.Mesh], tr.Repeat+1)
			if tr.Result.Requests < 45 || tr.Result.Requests > 55 || tr.Result.Errors != 0 {
				t.Errorf("%s repeat %d: %d requests, %d errors; want 50 (50/s for 1 s), none failed", tr.Mesh, tr.Repeat+1, tr.Result.Requests, tr.Result.Errors)
			}
		}
		t.Logf("repeats per mesh %v", repeats)
		if repeats["base-a"] < 3 || repeats["base-a"] != repeats["base-b"] || len(run.Trials) != 2*repeats["base-a"] {
			t.Errorf("repeats per mesh %v, %d trials: want more than the 2 planned, the same for both", repeats, len(run.Trials))
		}
		for _, want := range []string{"precision not met at 2 repeats", "adding repeats 3–", "would not fit the 40s budget"} {
			if !strings.Contains(progress, want) {
				t.Errorf("progress lacks %q", want)
			}
		}
	})
	checkNothingLeft(t, l, "")
}

// localAndCluster readies both platforms for onBothPlatforms: root for the local
// testbed, and the shared real cluster with meshmark's image, and with the meshes'
// images where the study installs a mesh. The local testbed's pods run the same in-pod
// binary as the cluster's image.
func localAndCluster(t *testing.T, meshImages bool) *kubetest.Local {
	t.Helper()
	needRootForLocal(t)
	l := kubetest.SharedLocal(t)
	if meshImages {
		images, _, err := mesh.LocalImages()
		if err != nil {
			t.Fatal(err)
		}
		l.LoadImages(t, images...)
	}
	t.Setenv(podcmd.BinaryEnv, l.PodBinary)
	return l
}

// onBothPlatforms runs one study, a document with one %s for its substrate, unchanged
// but for that substrate: on the local testbed (two nodes, the generator on the
// second) and on the real two-node cluster. It holds each run and its progress to
// check, in a subtest named for the platform, and returns the runs by platform.
func onBothPlatforms(t *testing.T, l *kubetest.Local, study string, check func(t *testing.T, run *results.Run, progress string)) map[string]*results.Run {
	t.Helper()
	runs := map[string]*results.Run{}
	for _, p := range []struct{ name, substrate string }{
		{"local", "    local: {nodes: 2, loadgenNode: 1}"},
		{"kubernetes", fmt.Sprintf("    kubernetes: {kubeconfig: %s, image: %s, namespacePrefix: mmreal}", l.Kubeconfig, l.Image)},
	} {
		path := filepath.Join(t.TempDir(), "study.yaml")
		if err := os.WriteFile(path, []byte(fmt.Sprintf(study, p.substrate)), 0o644); err != nil {
			t.Fatal(err)
		}
		db := filepath.Join(t.TempDir(), "results.db")
		_, progress, err := execCLI("run", "--db", db, "--no-report", path)
		if err != nil {
			t.Fatalf("%s: run: %v\n%s", p.name, err, progress)
		}
		runs[p.name] = lastRun(t, db)
		t.Run(p.name, func(t *testing.T) {
			check(t, runs[p.name], progress)
			if t.Failed() {
				t.Logf("the run's progress:\n%s", progress)
			}
		})
	}
	return runs
}

// checkRunOnEitherPlatform is what a run of platformStudy must show wherever it ran.
func checkRunOnEitherPlatform(t *testing.T, run *results.Run) {
	t.Helper()
	if run.Status != results.StatusComplete || len(run.Trials) != 8 {
		t.Fatalf("run %s (%s) with %d trials; want complete with 2 experiments × 2 meshes × 2 repeats", run.Status, run.StatusReason, len(run.Trials))
	}
	if got := run.Provenance.Placement["meshes-up"]; !strings.Contains(got, "all together") {
		t.Errorf("provenance placement meshes-up = %q, want the meshes kept up all together", got)
	}
	for _, tr := range run.Trials {
		res := tr.Result
		t.Logf("%s %s: %d requests, %.1f req/s of %.0f, peak %d in flight, flags %v", tr.Mesh, tr.Experiment, res.Requests,
			tr.Throughput(), tr.Params.RequestedRate, res.Generator.PeakInFlight, res.Flags)
		if res.Errors != 0 || res.Latency.TotalCount() != res.Requests {
			t.Errorf("%s %s: %d errors, %d requests in the histogram of %d; want none failed, every one in it",
				tr.Mesh, tr.Experiment, res.Errors, res.Latency.TotalCount(), res.Requests)
		}
		switch tr.Experiment {
		case "latency":
			// 40 req/s for 6 s after the warm-up, well below bookinfo's knee. (The
			// generator's own lag is not held to: on this 2-core machine running the
			// cluster too, a generator pod's sends were once seen bunched in a trial.)
			if res.Requests < 235 || res.Requests > 245 || res.Saturated() {
				t.Errorf("%s latency: %d requests, flags %v; want 240 (40/s for 6 s), the target not saturated", tr.Mesh, res.Requests, res.Flags)
			}
		case "conns":
			if g := res.Generator; g.PeakInFlight == 0 || g.PeakInFlight > 2 {
				t.Errorf("%s conns: peak %d requests in flight; want at most the experiment's 2 connections", tr.Mesh, g.PeakInFlight)
			}
		}
		want := map[string]substrate.Role{"baseline": substrate.RoleWorkload, "istio": substrate.RoleSidecar}[tr.Mesh]
		if measured := measuredRoles(tr); !measured[substrate.RoleWorkload] || !measured[want] {
			t.Errorf("%s %s: containers with CPU and memory read: %v; want the workload's and %s", tr.Mesh, tr.Experiment, measured, want)
		}
	}
	for _, m := range run.Meshes {
		var e mesh.Enrollment
		if err := json.Unmarshal(m.Enrollment, &e); err != nil {
			t.Fatalf("%s: enrollment %s: %v", m.Label, m.Enrollment, err)
		}
		if !e.Pass {
			t.Errorf("%s: enrollment failed: %v", m.Label, e.Failures)
		}
		if m.Label == "baseline" {
			// No pod in any mesh: bookinfo's six and the load generator's.
			meshed := 0
			for _, p := range e.Pods {
				if p.Meshed {
					meshed++
				}
			}
			if len(e.Pods) < 7 || meshed != 0 {
				t.Errorf("baseline: enrollment lists %d pods, %d meshed; want bookinfo's and the generator's, none meshed", len(e.Pods), meshed)
			}
			continue
		}
		if e.MTLS != mesh.MTLSStrict || e.PlaintextRefused == nil || !*e.PlaintextRefused {
			t.Errorf("istio: enrollment mTLS %q, plaintext refused %v; want strict, refused", e.MTLS, e.PlaintextRefused)
		}
		// The plaintext proof in the same fields on both platforms: each request from
		// outside the mesh refused, each positive control answered.
		refusedAt := map[string]bool{}
		for _, p := range e.Plaintext {
			if was, ok := refusedAt[p.Service]; ok && !was {
				continue
			}
			refusedAt[p.Service] = p.Refused
		}
		for _, svc := range []string{"productpage", "details", "reviews", "ratings"} {
			if !refusedAt[svc] {
				t.Errorf("istio: plaintext requests from outside the mesh %+v; want %s called and refused", e.Plaintext, svc)
			}
		}
		if len(e.PlaintextControl) == 0 || slices.ContainsFunc(e.PlaintextControl, func(c meshprobe.PlaintextProbe) bool { return c.Refused }) {
			t.Errorf("istio: positive controls %+v; want each answered", e.PlaintextControl)
		}
		seen := map[string]bool{}
		for _, p := range e.Pods {
			if p.MTLSObserved == "mtls" {
				seen[p.Service] = true
			}
		}
		for _, svc := range []string{"productpage", "details", "reviews"} {
			if !seen[svc] {
				t.Errorf("istio: mTLS seen on the wire at %v; want %s among them", seen, svc)
			}
		}
	}
}

// trialKeys lists a run's trials as the plan names them, in run order.
func trialKeys(run *results.Run) []string {
	var keys []string
	for _, tr := range run.Trials {
		keys = append(keys, fmt.Sprintf("%s/%s/r%d", tr.Mesh, tr.Experiment, tr.Repeat))
	}
	return keys
}

// needRootForLocal skips where the local testbed cannot run (it needs root); under CI a
// missing root fails instead.
func needRootForLocal(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if strings.TrimSpace(os.Getenv("CI")) != "" {
		t.Fatal("the local testbed needs root")
	}
	t.Skip("the local testbed needs root")
}
