package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/gateway"
	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/metrics"
	"github.com/meshmark/meshmark/internal/podcmd"
	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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
	if a, b := trialKeys(runs["local"], nil), trialKeys(runs["kubernetes"], nil); !slices.Equal(a, b) {
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

// verdictStudy compares no mesh with itself and with Istio's sidecar, interleaved, on
// deployments kept up throughout, so that all three share the machine's drift.
const verdictStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-verdicts}
spec:
  substrate:
%s
  workload: {graph: bookinfo}
  meshes:
    - {name: none-a, profile: none}
    - {name: none-b, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: strict}}
  baseline: none-a
  experiments:
    - {name: latency, kind: fixed-rate, rate: 150, connections: 8, duration: 4s, warmup: 1s}
  repeats: 4
  order: interleaved
  keepMeshesUp: true
  seed: 7
`

// TestVerdictsOnBothPlatforms: the same verdicts from the same study on either
// platform. The same mesh twice sets the noise floor; Istio's sidecar is worse than no
// mesh at the median, its interval above zero and its difference above that floor; the
// sidecars' proxies are seen carrying every trial's load, none bypassed. Each run
// records what its platform is made of: the local tools' versions, or the cluster's
// server and nodes.
func TestVerdictsOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, true)
	onBothPlatforms(t, l, verdictStudy, func(t *testing.T, run *results.Run, progress string) {
		if run.Status != results.StatusComplete || len(run.Trials) != 12 {
			t.Fatalf("run %s (%s) with %d trials; want complete with 3 meshes × 4 repeats", run.Status, run.StatusReason, len(run.Trials))
		}
		rep := analysis.Analyze(run, analysis.Options{Seed: 1}, nil)
		verdict := func(mesh string, m analysis.Metric) analysis.Comparison {
			for _, c := range rep.Comparisons {
				if c.Mesh == mesh && c.Metric == m {
					return c
				}
			}
			t.Fatalf("no comparison of %s on %s; have %d comparisons", mesh, m, len(rep.Comparisons))
			return analysis.Comparison{}
		}
		// The A/A pair is what noise alone does: its interval, both ways round, is the
		// floor a difference must clear (so its own verdict is never better or worse).
		for _, m := range []analysis.Metric{analysis.P50, analysis.P99} {
			c := verdict("none-b", m)
			t.Logf("A/A %s: base %.0f µs, value %.0f µs, Δ%% %.1f [%.1f, %.1f], noise floor %.1f%%, %s",
				m, c.Base, c.Value, c.Pct.Value, c.Pct.Lo, c.Pct.Hi, c.NoiseFloorPct, c.Verdict)
		}
		c := verdict("sidecar", analysis.P50)
		t.Logf("sidecar p50: base %.0f µs, value %.0f µs, Δ %.0f µs [%.0f, %.0f], Δ%% %.0f, noise floor %.1f%% (%s), %s",
			c.Base, c.Value, c.Delta.Value, c.Delta.Lo, c.Delta.Hi, c.Pct.Value, c.NoiseFloorPct, c.NoiseSource, c.Verdict)
		if c.NoiseSource != "a/a none-a=none-b" && c.NoiseSource != "a/a none-b=none-a" {
			t.Errorf("sidecar p50: noise floor from %q, want the A/A pair of none-a and none-b", c.NoiseSource)
		}
		if c.Verdict != analysis.Worse || c.Delta.Lo <= 0 || c.Pct.Value <= c.NoiseFloorPct {
			t.Errorf("sidecar p50: verdict %s, Δ [%.0f, %.0f] µs, Δ%% %.0f against a floor of %.1f%%; want worse, the interval above zero and the difference above the floor",
				c.Verdict, c.Delta.Lo, c.Delta.Hi, c.Pct.Value, c.NoiseFloorPct)
		}
		for _, tr := range run.Trials {
			if tr.Mesh == "sidecar" && len(tr.Result.ProxyStats) == 0 {
				t.Errorf("sidecar repeat %d: no proxy statistics stored", tr.Repeat+1)
			}
			if slices.Contains(tr.Result.Flags, results.FlagProxyBypassed) {
				t.Errorf("%s repeat %d: the entry's proxies counted fewer requests than were answered", tr.Mesh, tr.Repeat+1)
			}
		}
		if cp := run.Provenance.Cluster; cp != nil {
			if len(cp.Nodes) != 2 || !strings.HasPrefix(cp.ServerVersion, "v1.") {
				t.Errorf("cluster provenance %+v: want its server's version and its 2 nodes", cp)
			}
			return
		}
		for _, c := range []string{"envoy", "iptables", "ip"} {
			if run.Provenance.Components[c] == "" {
				t.Errorf("provenance components %v: no version of %s", run.Provenance.Components, c)
			}
		}
	})
	checkNothingLeft(t, l, "istio-system")
}

// mixGraph is two equal versions of one service behind a front that calls it.
const mixGraph = `name: split
services:
  - name: front
    isEntrypoint: true
    script: [call: back]
  - name: back
    versions:
      - {name: v1, weight: 1}
      - {name: v2, weight: 1}
`

// mixStudy (a format of a format: mixGraph's path, then its substrate) loads the front over one
// kept-alive connection: without a mesh balancing per connection, per request, and
// through Envoy sidecars.
const mixStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-request-mix}
spec:
  substrate:
%%s
  workload: {graph: %s}
  meshes:
    - {name: none, profile: none, options: {balancing: per-connection}}
    - {name: spread, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: off}}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, connections: 1, duration: 3s, warmup: 500ms}
  repeats: 1
  keepMeshesUp: true
`

// TestRequestMixOnBothPlatforms: what each version of a service served, read from its
// pods, against the graph's weights. Without a mesh balancing per connection, the
// service address picks a version per connection (the local testbed's VIP as
// kube-proxy does on the cluster), so the front's kept-alive connection sends nearly
// everything to one version and the trial is flagged and the report's row fails; per
// request, and through the sidecars' Envoy, the split follows the weights.
func TestRequestMixOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, true)
	graph := filepath.Join(t.TempDir(), "split.yaml")
	if err := os.WriteFile(graph, []byte(mixGraph), 0o644); err != nil {
		t.Fatal(err)
	}
	onBothPlatforms(t, l, fmt.Sprintf(mixStudy, graph), func(t *testing.T, run *results.Run, progress string) {
		if run.Status != results.StatusComplete || len(run.Trials) != 3 {
			t.Fatalf("run %s (%s) with %d trials; want complete with one per mesh", run.Status, run.StatusReason, len(run.Trials))
		}
		for _, tr := range run.Trials {
			var split []string
			for _, v := range tr.Result.Mix {
				split = append(split, fmt.Sprintf("%s %d (%.0f%%)", v.Version, v.Requests, 100*v.Share))
			}
			t.Logf("%s: back split %v, flags %v", tr.Mesh, split, tr.Result.Flags)
			if len(tr.Result.Mix) != 2 {
				t.Errorf("%s: mix %+v, want back's two versions", tr.Mesh, tr.Result.Mix)
				continue
			}
			if skewed := tr.Result.HasFlag(results.FlagMixSkewed); skewed != (tr.Mesh == "none") {
				t.Errorf("%s: split %v, flagged skewed %v; want only the baseline balancing per connection flagged", tr.Mesh, split, skewed)
			}
		}
		var md bytes.Buffer
		if err := report.Render(&md, report.Markdown, run, nil, report.Options{}); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"| none | request mix matches the graph's weights | FAIL | 1 of 1 trials off by more than 10 points",
			"balancing: per-connection: the service VIPs pick an endpoint per connection, as kube-proxy does",
			"| sidecar | request mix matches the graph's weights | PASS |", "| spread | request mix matches the graph's weights | PASS | 0 of 1 trials",
			"balancing: per-request: each caller picks a pod per request"} {
			if !strings.Contains(md.String(), want) {
				t.Errorf("report does not say %q", want)
			}
		}
		// Which version the kept-alive connection reached is chance. Nearly all traffic
		// goes to it, but not always all: when a response is slow, the generator and front
		// open a second connection, which may reach the other version (seen once: 97/3).
		if !regexp.MustCompile(`back v[12] (9\d|100)% \(intended 50%\)`).MatchString(md.String()) ||
			!regexp.MustCompile(`back v[12] \d% \(intended 50%\)`).MatchString(md.String()) {
			t.Error("report does not name the version that served nearly everything and the one that served nearly nothing")
		}
		if t.Failed() {
			t.Log(md.String())
		}
	})
	checkNothingLeft(t, l, "istio-system")
}

// capacityStudy searches each of two deployments of no mesh for its capacity, a
// closed-loop point over 4 connections then an SLO-bounded open-loop bisection, and
// runs a later experiment at half the lowest capacity found, twice, on deployments kept
// up throughout.
const capacityStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-capacity}
spec:
  substrate:
%s
  workload: {graph: bookinfo}
  meshes:
    - {name: baseline, profile: none}
    - {name: again, profile: none}
  experiments:
    - name: cap
      kind: capacity
      connections: [4]
      search: {start: 100, max: 4000, precision: 20%%}
      duration: 2s
      warmup: 500ms
    - {name: half, kind: fixed-rate, rate: 50%% of lowest capacity, capacityFrom: cap, duration: 3s, warmup: 1s, repeats: 2}
  repeats: 1
  keepMeshesUp: true
  slo: {p99: 50ms, errorRate: 0.1%%}
`

// capacitySLOP99 is capacityStudy's SLO on p99.
const capacitySLOP99 = 50 * time.Millisecond

// TestCapacityOnBothPlatforms: the one capacity search, through the local testbed's
// generator and through the cluster's generator pods. On each platform a closed-loop
// point and then open-loop probes by bisection, each probe judged against the SLO with
// the target in steady state; the capacity each mesh reports is the highest probe that
// met it, and the later experiment runs at half the lowest of them, and keeps up.
func TestCapacityOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, false)
	runs := onBothPlatforms(t, l, capacityStudy, func(t *testing.T, run *results.Run, progress string) {
		if run.Status != results.StatusComplete {
			t.Fatalf("run %s (%s), want complete", run.Status, run.StatusReason)
		}
		lowest := 0.0
		for _, m := range []string{"baseline", "again"} {
			reported := reportedCapacity(t, progress, m, "cap")
			closed, probes, best := 0, 0, 0.0
			for _, tr := range run.Trials {
				if tr.Mesh != m || tr.Experiment != "cap" {
					continue
				}
				if tr.Params.Extra["search"] != "probe" {
					closed++
					continue
				}
				probes++
				res := tr.Result
				p99 := results.Duration(res.Latency.ValueAtQuantile(99))
				// served inside the window, and the target in steady state, as the runner
				// judges (a generator that fell behind only made the latency worse)
				achieved := float64(res.Window.Completed) / tr.Duration().Seconds()
				met := res.Errors*1000 <= res.Requests && p99 <= capacitySLOP99 &&
					achieved >= 0.95*tr.Params.RequestedRate && !res.Saturated()
				t.Logf("%s probe %.0f req/s: achieved %.0f, p99 %v, saturated %v, met %v", m, tr.Params.RequestedRate, achieved, p99, res.Saturated(), met)
				if met && tr.Params.RequestedRate > best {
					best = tr.Params.RequestedRate
				}
			}
			if closed != 1 || probes < 3 {
				t.Fatalf("%s: %d closed-loop points and %d open-loop probes; want the one at 4 connections, then a bisection from 100 to 4000 req/s", m, closed, probes)
			}
			// The runner's own judgement may differ from this recomputation at the
			// margin (the achieved rate over the window against the engine's), so allow
			// one bisection step.
			if best == 0 || reported < 0.8*best || reported > 1.25*best {
				t.Errorf("%s: capacity reported %.0f req/s; the highest probe that met the SLO was %.0f", m, reported, best)
			}
			if lowest == 0 || reported < lowest {
				lowest = reported
			}
		}
		halves := 0
		for _, tr := range run.Trials {
			if tr.Experiment != "half" {
				continue
			}
			halves++
			res := tr.Result
			if tr.Params.RequestedRate < 0.49*lowest || tr.Params.RequestedRate > 0.51*lowest {
				t.Errorf("%s half: at %.0f req/s; want half the lowest capacity, %.0f", tr.Mesh, tr.Params.RequestedRate, lowest/2)
			}
			if res.Errors != 0 || tr.Throughput() < 0.95*tr.Params.RequestedRate || res.Saturated() {
				t.Errorf("%s half: %d errors, %.0f of %.0f req/s, flags %v; want it kept up at half its capacity",
					tr.Mesh, res.Errors, tr.Throughput(), tr.Params.RequestedRate, res.Flags)
			}
		}
		if halves != 4 {
			t.Errorf("%d trials of half; want 2 repeats on each mesh", halves)
		}
	})
	// The probes follow what each platform sustains; the rest of the plan is the same.
	probe := func(tr results.Trial) bool { return tr.Params.Extra["search"] == "probe" }
	if a, b := trialKeys(runs["local"], probe), trialKeys(runs["kubernetes"], probe); !slices.Equal(a, b) {
		t.Errorf("the plans differ:\n  local      %v\n  kubernetes %v", a, b)
	}
	checkNothingLeft(t, l, "")
}

// reportedCapacity is the capacity the progress reports for a mesh's first repeat of a
// capacity experiment.
func reportedCapacity(t *testing.T, progress, mesh, exp string) float64 {
	t.Helper()
	m := regexp.MustCompile(`capacity ` + mesh + ` ` + exp + ` repeat 1: (\d+) req/s \(open-loop, sustained under the SLO\)`).FindStringSubmatch(progress)
	if m == nil {
		t.Fatalf("the progress does not report %s's sustained capacity", mesh)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// stopStudy is long enough (20 repeats) to be stopped mid-way wherever it runs: no
// mesh and Istio's sidecar, both kept up.
const stopStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-stopped}
spec:
  substrate:
%s
  workload: {graph: bookinfo}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, duration: 4s, warmup: 1s}
  repeats: 20
  keepMeshesUp: true
`

// TestStoppedRunsOnBothPlatforms stops a run as a user would, in a process of its own,
// on the local testbed and on the real cluster. Ctrl-C (SIGINT) in the middle of a trial
// ends it gracefully: the command exits 130, the finished trials are kept in a run
// marked incomplete, a report of them is written, and nothing of the run is left, with
// no clean. SIGKILL in the middle of a trial loses nothing committed: an earlier run
// in the same database stays as it was, and `meshmark clean` (with --kubernetes on a
// cluster) removes what the run left and marks it incomplete with its finished trials.
// Its live metrics were served until then.
func TestStoppedRunsOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, true)
	for _, p := range platformsOf(t, l, stopStudy) {
		t.Run(p.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Run("interrupted", func(t *testing.T) {
				db := filepath.Join(dir, "interrupted.db")
				var stdout strings.Builder
				cmd, progress := startRunProcess(t, &stdout, p.study, "--db", db, "--report-dir", dir)
				waitForTrials(t, progress, 1) // the first finished, the second under load
				time.Sleep(1500 * time.Millisecond)
				if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
					t.Fatal(err)
				}
				for progress.Scan() {
					t.Log(progress.Text())
				}
				var exit *exec.ExitError
				if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 130 {
					t.Errorf("exit after SIGINT: %v, want code 130", err)
				}
				p.checkNothingLeft(t)
				run := lastRun(t, db)
				if run.Status != results.StatusIncomplete || len(run.Trials) != 1 {
					t.Errorf("interrupted run: %s with %d trials, want incomplete with the 1 finished", run.Status, len(run.Trials))
				}
				if !strings.Contains(stdout.String(), "report.html") {
					t.Errorf("no report written of the finished trials; stdout:\n%s", stdout.String())
				}
			})
			t.Run("killed", func(t *testing.T) {
				db := filepath.Join(dir, "killed.db")
				earlier := storeFinishedRun(t, db)
				metricsAddr := freeLoopbackAddr(t)
				cmd, progress := startRunProcess(t, io.Discard, p.study, "--db", db, "--no-report", "--metrics-addr", metricsAddr)
				waitForTrials(t, progress, 2) // two committed, the third under load
				time.Sleep(2 * time.Second)
				checkLiveMetrics(t, metricsAddr)
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				_ = cmd.Wait()
				out, errOut, err := execCLI(append([]string{"clean", "--db", db}, p.clean...)...)
				t.Logf("meshmark clean:\n%s%s", out, errOut)
				if err != nil {
					t.Fatalf("meshmark clean: %v", err)
				}
				if !strings.Contains(out, "removed") || !strings.Contains(out, "marked incomplete") {
					t.Errorf("clean removed nothing of the killed run or did not mark it incomplete")
				}
				p.checkNothingLeft(t)
				s, err := store.Open(context.Background(), db)
				if err != nil {
					t.Fatalf("store after the kill: %v", err)
				}
				defer s.Close()
				if got, err := s.LoadRun(context.Background(), earlier); err != nil || got.Status != results.StatusComplete || got.Study != "earlier" {
					t.Errorf("the earlier run after the kill: %+v, %v", got, err)
				}
				killed, err := s.LoadRun(context.Background(), "last")
				if err != nil || killed.ID == earlier {
					t.Fatalf("the killed run is not in the store: %v", err)
				}
				if killed.Status != results.StatusIncomplete || len(killed.Trials) < 2 {
					t.Errorf("killed run: %s with %d trials, want incomplete with the 2 that finished", killed.Status, len(killed.Trials))
				}
			})
		})
	}
}

// startRunProcess starts `meshmark run` in a process of its own (this test binary as
// the meshmark command), to be signalled as a user would, and returns it with a
// scanner over its progress. A run still going after three minutes is killed.
func startRunProcess(t *testing.T, stdout io.Writer, study string, args ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv, _ := json.Marshal(append([]string{"run", study}, args...))
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "MESHMARK_CLI_ARGS="+string(argv))
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.AfterFunc(3*time.Minute, func() { _ = cmd.Process.Kill() })
	t.Cleanup(func() { deadline.Stop() })
	return cmd, bufio.NewScanner(stderr)
}

// waitForTrials reads a run's progress until n trials have finished and the next has
// begun.
func waitForTrials(t *testing.T, progress *bufio.Scanner, n int) {
	t.Helper()
	finished := 0
	for progress.Scan() {
		line := progress.Text()
		t.Log(line)
		if strings.Contains(line, "done:") {
			finished++
		}
		if finished == n && strings.Contains(line, "] run ") {
			return
		}
	}
	t.Fatalf("the run ended before %d trials finished and another began", n)
}

// storeFinishedRun stores a finished run of another study in the database at db, and
// returns its id.
func storeFinishedRun(t *testing.T, db string) string {
	t.Helper()
	ctx := context.Background()
	s, err := store.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	run := &results.Run{Study: "earlier", Status: results.StatusRunning, Started: time.Now(), OwnerPID: os.Getpid(),
		Meshes: []results.Mesh{{Label: "none", Profile: "none"}}}
	if err := s.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRun(ctx, run.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	return run.ID
}

// freeLoopbackAddr is a loopback address with a port free a moment ago.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// checkLiveMetrics scrapes /metrics of a running study and parses it with the
// Prometheus text parser: it must be valid exposition text carrying the load rate and
// per-component CPU.
func checkLiveMetrics(t *testing.T, addr string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics during the run: %v", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not valid exposition text: %v", err)
	}
	for _, name := range []string{metrics.NameAchievedRPS, metrics.NameCPUSeconds, metrics.NameLatency} {
		if f, ok := families[name]; !ok || len(f.GetMetric()) == 0 {
			t.Errorf("/metrics has no %s series during the run", name)
		}
	}
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

// platform is one of the two a study runs on, with the study written for it, the
// arguments that make `meshmark clean` clean it, and what must not be left on it.
type platform struct {
	name, study      string
	clean            []string
	checkNothingLeft func(t *testing.T)
}

// platformsOf writes a study, a document with one %s for its substrate, for each
// platform, unchanged but for that substrate: the local testbed and the real cluster,
// each of two nodes, the app on the first and the load generators on the second.
func platformsOf(t *testing.T, l *kubetest.Local, study string) []platform {
	t.Helper()
	var ps []platform
	for _, p := range []platform{
		{name: "local", study: "    local: {nodes: 2, loadgenNode: 1}",
			checkNothingLeft: func(t *testing.T) { checkNoTestbedLeft(t) }},
		{name: "kubernetes", study: fmt.Sprintf("    kubernetes:\n      {kubeconfig: %s, image: %s, namespacePrefix: mmreal,\n"+
			"       sutNodeSelector: {kubernetes.io/hostname: %s}, loadgenNodeSelector: {kubernetes.io/hostname: %s}}",
			l.Kubeconfig, l.Image, l.State.Nodes[0].Name, l.State.Nodes[1].Name),
			clean:            []string{"--kubernetes", "--kubeconfig", l.Kubeconfig},
			checkNothingLeft: func(t *testing.T) { checkNothingLeft(t, l, "istio-system") }},
	} {
		path := filepath.Join(t.TempDir(), p.name+"-study.yaml")
		if err := os.WriteFile(path, []byte(fmt.Sprintf(study, p.study)), 0o644); err != nil {
			t.Fatal(err)
		}
		p.study = path
		ps = append(ps, p)
	}
	return ps
}

// onBothPlatforms runs one study (see platformsOf) on both platforms, holds each run
// and its progress to check, in a subtest named for the platform, and returns the runs
// by platform.
func onBothPlatforms(t *testing.T, l *kubetest.Local, study string, check func(t *testing.T, run *results.Run, progress string)) map[string]*results.Run {
	t.Helper()
	runs := map[string]*results.Run{}
	for _, p := range platformsOf(t, l, study) {
		db := filepath.Join(t.TempDir(), "results.db")
		_, progress, err := execCLI("run", "--db", db, "--no-report", p.study)
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

// checkNoTestbedLeft wants no network namespace of a local testbed (mm-*) on the host.
func checkNoTestbedLeft(t *testing.T) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "mm-") {
			t.Errorf("network namespace %s left on the host", f[0])
		}
	}
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

// trialKeys lists a run's trials as the plan names them, in run order, leaving out
// those skip (if given) says.
func trialKeys(run *results.Run, skip func(results.Trial) bool) []string {
	var keys []string
	for _, tr := range run.Trials {
		if skip == nil || !skip(tr) {
			keys = append(keys, fmt.Sprintf("%s/%s/r%d", tr.Mesh, tr.Experiment, tr.Repeat))
		}
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

// protocolGraph's entry speaks gRPC, and its calls go out over gRPC, h2c and HTTP/1.1.
const protocolGraph = `name: protocols
services:
  - name: front
    isEntrypoint: true
    protocol: grpc
    script:
      - - call: emoji
        - call: voting
  - name: emoji
    protocol: grpc
    script: [call: ratings]
  - name: voting
    protocol: http2
  - name: ratings
`

// protocolStudy drives protocolGraph (at protocols.yaml) without a mesh and
// through strict-mTLS sidecars, two gRPC streams on each of four connections.
const protocolStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-protocols}
spec:
  substrate:
%s
  workload: {graph: protocols.yaml}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: strict}}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 60, connections: 4, streams: 2, duration: 3s, warmup: 1s}
  repeats: 1
`

// TestProtocolsOnBothPlatforms: an entry service that speaks gRPC is driven with gRPC
// calls (protocol auto), several streams per connection, and every request of a graph
// whose calls are gRPC, h2c and HTTP/1.1 succeeds, without a mesh and through
// strict-mTLS sidecars, which enrolled every pod. (That the local sidecars spoke
// HTTP/2 upstream is the runner's TestMixedProtocolsThroughSidecars.)
func TestProtocolsOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, true)
	graph := filepath.Join(t.TempDir(), "protocols.yaml")
	if err := os.WriteFile(graph, []byte(protocolGraph), 0o644); err != nil {
		t.Fatal(err)
	}
	onBothPlatforms(t, l, strings.Replace(protocolStudy, "protocols.yaml", graph, 1), func(t *testing.T, run *results.Run, progress string) {
		if run.Status != results.StatusComplete || len(run.Trials) != 2 {
			t.Fatalf("run %s (%s) with %d trials; want complete with one per mesh", run.Status, run.StatusReason, len(run.Trials))
		}
		for _, m := range run.Meshes {
			var e mesh.Enrollment
			if err := json.Unmarshal(m.Enrollment, &e); err != nil || !e.Pass {
				t.Errorf("%s enrollment: %v %+v", m.Label, err, e.Failures)
			}
		}
		for _, tr := range run.Trials {
			r := tr.Result
			if p := tr.Params.Extra["protocol"]; p != "gRPC" || tr.Params.Extra["streams"] != "2" || !strings.HasSuffix(tr.Params.Extra["url"], "/meshmark.Workload/Call") {
				t.Errorf("%s: driven with %q, streams %q, url %q", tr.Mesh, p, tr.Params.Extra["streams"], tr.Params.Extra["url"])
			}
			if r.Requests < 170 || r.Errors != 0 || r.StatusCodes[200] != r.Requests {
				t.Errorf("%s: %d requests, %d errors %v, codes %v; want 180, all answered 200", tr.Mesh, r.Requests, r.Errors, r.ErrorsByKind, r.StatusCodes)
			}
		}
	})
	checkNothingLeft(t, l, "istio-system")
}

// ingressStudy measures bookinfo without a mesh and through strict-mTLS sidecars, on
// the internal path and through the ingress gateway in front of productpage.
const ingressStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-ingress}
spec:
  substrate:
%s
  workload: {graph: bookinfo}
  meshes:
    - {name: baseline, profile: none}
    - {name: istio, profile: envoy-sidecar, options: {mtls: strict}}
  experiments:
    - {name: internal, kind: fixed-rate, rate: 40, duration: 4s, warmup: 1s}
    - {name: ingress, kind: fixed-rate, rate: 40, duration: 4s, warmup: 1s, path: ingress}
  repeats: 1
`

// TestIngressOnBothPlatforms: path: ingress sends the requests through an ingress
// gateway in front of the entry service, on the local testbed and on the cluster alike,
// and every one is answered. Without a mesh it is the plain gateway (Envoy) in a pod of
// its own, among the app's pods; through Istio's sidecars it is Istio's own gateway
// (on the cluster, istiod's, from a Gateway API Gateway), which alone can reach an
// entry service that refuses plaintext (strict mTLS). Either way the gateway's
// container, sampled under the gateway role, used CPU in the ingress trial, and the
// internal trial's requests go to productpage itself.
func TestIngressOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, true)
	gw, err := gateway.LocalImage()
	if err != nil {
		t.Fatal(err)
	}
	l.LoadImages(t, gw)
	onBothPlatforms(t, l, ingressStudy, func(t *testing.T, run *results.Run, progress string) {
		if run.Status != results.StatusComplete || len(run.Trials) != 4 {
			t.Fatalf("run %s (%s) with %d trials; want complete with one per mesh and path", run.Status, run.StatusReason, len(run.Trials))
		}
		for _, m := range run.Meshes {
			var e mesh.Enrollment
			if err := json.Unmarshal(m.Enrollment, &e); err != nil || !e.Pass {
				t.Errorf("%s enrollment: %v %+v", m.Label, err, e.Failures)
			}
			plain := func(p mesh.PodEnrollment) bool { return strings.HasPrefix(p.Pod, "ingress-gateway") && !p.Meshed }
			if m.Label == "baseline" && !slices.ContainsFunc(e.Pods, plain) {
				t.Errorf("baseline: the plain gateway's pod is not among the app's pods: %+v", e.Pods)
			}
		}
		for _, tr := range run.Trials {
			r := tr.Result
			t.Logf("%s %s: %d requests to %s, p50 %.2f ms, flags %v", tr.Mesh, tr.Experiment, r.Requests, tr.Params.Extra["url"],
				float64(r.Latency.ValueAtQuantile(50))/1e3, r.Flags)
			if r.Requests < 155 || r.Errors != 0 || r.StatusCodes[200] != r.Requests {
				t.Errorf("%s %s: %d requests, %d errors %v, codes %v; want 160, all answered 200", tr.Mesh, tr.Experiment, r.Requests, r.Errors, r.ErrorsByKind, r.StatusCodes)
			}
			host := "productpage"
			if tr.Experiment == "ingress" {
				host = "ingress-gateway" // the plain gateway's; istiod's is ingress-gateway-istio
			}
			u, err := url.Parse(tr.Params.Extra["url"])
			if err != nil || !strings.HasPrefix(strings.Split(u.Hostname(), ".")[0], host) || u.Path != "/productpage" || tr.Params.Path != tr.Experiment {
				t.Errorf("%s %s: url %q, path %q; want %s's /productpage on the %s path", tr.Mesh, tr.Experiment, tr.Params.Extra["url"], tr.Params.Path, host, tr.Experiment)
			}
			if gatewayUsed := measuredRoles(tr)[substrate.RoleGateway]; tr.Experiment == "ingress" && !gatewayUsed {
				t.Errorf("%s ingress: the gateway's CPU and memory were not read; want them, under the gateway role", tr.Mesh)
			}
		}
	})
	checkNothingLeft(t, l, "istio-system")
}
