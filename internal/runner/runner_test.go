package runner

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/metrics"
	"github.com/meshmark/meshmark/internal/podcmd/podcmdtest"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate"
)

// meshmarkBin is the real meshmark binary, built once: the kill test runs a whole study
// through it. podBin is meshmark-pod beside it, which the pods run.
var meshmarkBin, podBin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		// Network namespaces and iptables need root; `make test` runs as root.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "meshmark-runner-test-")
	if err != nil {
		panic(err)
	}
	meshmarkBin = filepath.Join(dir, "meshmark")
	build := exec.Command("go", "build", "-o", meshmarkBin, "github.com/meshmark/meshmark/cmd/meshmark")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		panic("build meshmark: " + err.Error())
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

// The same mesh listed twice must come out as no difference (equal or inconclusive), and an Envoy
// sidecar mesh must come out slower than no mesh at the median with an interval that
// excludes zero. One study measures both, interleaved, so they share the machine's drift.
const comparisonStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-aa-and-sidecar}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: bookinfo}
  meshes:
    - {name: none-a, profile: none}
    - {name: none-b, profile: none}
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: off}}
  baseline: none-a
  experiments:
    - {name: latency, kind: fixed-rate, rate: 150, connections: 8, duration: 6s, warmup: 1s}
  repeats: 4
  order: interleaved
  seed: 7
`

func TestAAInconclusiveAndSidecarWorse(t *testing.T) {
	needRoot(t)
	run, db := runStudy(t, parseStudy(t, comparisonStudy))
	if len(run.Trials) != 12 {
		t.Fatalf("stored %d trials, want 3 meshes × 4 repeats", len(run.Trials))
	}
	for _, m := range run.Meshes {
		if len(m.Enrollment) == 0 {
			t.Errorf("mesh %s: no enrollment check stored", m.Label)
		}
	}
	stored, err := db.LoadRun(context.Background(), run.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The versions of what every local run used are its provenance.
	for _, c := range []string{"envoy", "iptables", "ip"} {
		if stored.Provenance.Components[c] == "" {
			t.Errorf("provenance components %v: no version of %s", stored.Provenance.Components, c)
		}
	}
	rep := analysis.Analyze(stored, analysis.Options{Seed: 1}, nil)
	verdict := func(mesh string, m analysis.Metric) analysis.Comparison {
		for _, c := range rep.Comparisons {
			if c.Mesh == mesh && c.Metric == m {
				return c
			}
		}
		t.Fatalf("no comparison of %s on %s; have %d comparisons", mesh, m, len(rep.Comparisons))
		return analysis.Comparison{}
	}
	for _, m := range []analysis.Metric{analysis.P50, analysis.P99} {
		c := verdict("none-b", m)
		t.Logf("A/A %s: base %.0f µs, value %.0f µs, Δ%% %.1f [%.1f, %.1f], noise floor %.1f%%, %s",
			m, c.Base, c.Value, c.Pct.Value, c.Pct.Lo, c.Pct.Hi, c.NoiseFloorPct, c.Verdict)
		if c.Verdict == analysis.Better || c.Verdict == analysis.Worse {
			t.Errorf("A/A on %s: verdict %s, want %s or %s", m, c.Verdict, analysis.Equal, analysis.Inconclusive)
		}
	}
	c := verdict("sidecar", analysis.P50)
	t.Logf("sidecar p50: base %.0f µs, value %.0f µs, Δ %.0f µs [%.0f, %.0f], %s", c.Base, c.Value, c.Delta.Value, c.Delta.Lo, c.Delta.Hi, c.Verdict)
	if c.Verdict != analysis.Worse || !c.Delta.ExcludesZero() || c.Delta.Lo <= 0 {
		t.Errorf("sidecar p50: verdict %s with Δ interval [%.0f, %.0f] µs; want worse, interval above zero", c.Verdict, c.Delta.Lo, c.Delta.Hi)
	}
	// The sidecar's proxies were seen carrying the load.
	var proxied int
	for _, tr := range stored.Trials {
		if tr.Mesh == "sidecar" {
			proxied += len(tr.Result.ProxyStats)
		}
	}
	if proxied == 0 {
		t.Error("no proxy statistics stored for the sidecar mesh")
	}
	for _, tr := range stored.Trials {
		for _, f := range tr.Result.Flags {
			if f == results.FlagProxyBypassed {
				t.Errorf("trial %s repeat %d: the entry sidecars counted fewer requests than were answered", tr.Mesh, tr.Repeat)
			}
		}
	}
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

const killStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-kill}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: bookinfo}
  meshes:
    - {name: none, profile: none}
    - {name: sidecar, profile: envoy-sidecar}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, duration: 4s, warmup: 1s}
  repeats: 20
`

// A runner killed with SIGKILL mid-run loses nothing that was committed: earlier runs
// stay intact, the killed run is reported incomplete with its finished trials, and
// `meshmark clean` removes everything the run left on the host.
func TestKilledRunIsIncompleteAndCleanable(t *testing.T) {
	needRoot(t)
	studyPath, dbPath := writeStudy(t, killStudy)
	before := meshmarkNamespaces(t)

	// An earlier, finished run in the same database.
	ctx := context.Background()
	db, err := store.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	old := &results.Run{Study: "earlier", Status: results.StatusRunning, Started: time.Now(), OwnerPID: os.Getpid(),
		Meshes: []results.Mesh{{Label: "none", Profile: "none"}}}
	if err := db.CreateRun(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := db.FinishRun(ctx, old.ID, results.StatusComplete, ""); err != nil {
		t.Fatal(err)
	}
	db.Close()

	metricsAddr := freeLoopbackAddr(t)
	cmd, sc := startRun(t, os.Stderr, studyPath, "--db", dbPath, "--no-report", "--metrics-addr", metricsAddr)
	// Kill it in the middle of its second trial: one trial is committed, one is not.
	finished := 0
	for sc.Scan() {
		line := sc.Text()
		t.Log(line)
		if strings.Contains(line, "done:") {
			finished++
		}
		if finished == 2 && strings.Contains(line, " run ") {
			time.Sleep(2 * time.Second)
			break
		}
	}
	if finished < 2 {
		t.Fatalf("the run ended before two trials finished")
	}
	checkLiveMetrics(t, metricsAddr)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	if out, err := exec.Command(meshmarkBin, "clean", "--db", dbPath).CombinedOutput(); err != nil {
		t.Fatalf("meshmark clean: %v\n%s", err, out)
	} else {
		t.Logf("meshmark clean:\n%s", out)
		if !strings.Contains(string(out), "marked incomplete") {
			t.Errorf("meshmark clean did not report marking the killed run incomplete")
		}
	}
	if after := meshmarkNamespaces(t); len(after) > len(before) {
		t.Errorf("namespaces left after clean: %v (before the run: %v)", after, before)
	}

	db, err = store.Open(ctx, dbPath)
	if err != nil {
		t.Fatalf("store after kill: %v", err)
	}
	defer db.Close()
	got, err := db.LoadRun(ctx, old.ID)
	if err != nil || got.Status != results.StatusComplete || got.Study != "earlier" {
		t.Fatalf("earlier run after kill: %+v, %v", got, err)
	}
	runs, err := db.ListRuns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var killed *results.Run
	for _, r := range runs {
		if r.ID != old.ID {
			killed, err = db.LoadRun(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if killed == nil {
		t.Fatal("the killed run is not in the store")
	}
	if killed.Status != results.StatusIncomplete {
		t.Errorf("killed run status %s, want %s", killed.Status, results.StatusIncomplete)
	}
	if len(killed.Trials) < 2 {
		t.Errorf("killed run kept %d trials, want the 2 that finished", len(killed.Trials))
	}
}

// writeStudy puts a study file and the path for its results database in a fresh
// directory.
func writeStudy(t *testing.T, yaml string) (studyPath, dbPath string) {
	t.Helper()
	dir := t.TempDir()
	studyPath = filepath.Join(dir, "study.yaml")
	if err := os.WriteFile(studyPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return studyPath, filepath.Join(dir, "results.db")
}

// startRun starts `meshmark run STUDY args...` as its own process, the way a user runs
// it, and returns it with a scanner over its progress output. A run still going after
// three minutes is killed so a stuck test ends.
func startRun(t *testing.T, stdout io.Writer, studyPath string, args ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(meshmarkBin, append([]string{"run", studyPath}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.AfterFunc(3*time.Minute, func() { cmd.Process.Kill() })
	t.Cleanup(func() { deadline.Stop() })
	return cmd, bufio.NewScanner(stderr)
}

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

func meshmarkNamespaces(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "mm-") {
			ns = append(ns, f[0])
		}
	}
	return ns
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

// Ctrl-C stops a run gracefully: the finished trials are kept, the run is marked
// incomplete, the command exits 130 and nothing is left on the host, without `clean`.
func TestInterruptKeepsFinishedTrials(t *testing.T) {
	needRoot(t)
	studyPath, dbPath := writeStudy(t, killStudy)
	before := meshmarkNamespaces(t)
	var stdout strings.Builder
	cmd, sc := startRun(t, &stdout, studyPath, "--db", dbPath, "--report-dir", filepath.Dir(studyPath))
	for sc.Scan() {
		t.Log(sc.Text())
		if strings.Contains(sc.Text(), " run ") && strings.Contains(sc.Text(), "repeat 1") && strings.Contains(sc.Text(), "sidecar") {
			break // the first trial (none) finished; interrupt the second mid-load
		}
	}
	time.Sleep(1500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		t.Log(sc.Text())
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("exit after SIGINT: %v, want code 130", err)
	}
	if after := meshmarkNamespaces(t); len(after) > len(before) {
		t.Errorf("namespaces left after an interrupted run: %v", after)
	}
	db, err := store.Open(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	run, err := db.LoadRun(context.Background(), "last")
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != results.StatusIncomplete || len(run.Trials) != 1 {
		t.Errorf("interrupted run: status %s with %d trials, want incomplete with the 1 finished", run.Status, len(run.Trials))
	}
	if !strings.Contains(stdout.String(), "report.html") {
		t.Errorf("no report written for the finished trials; stdout:\n%s", stdout.String())
	}
}

const searchStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-capacity-search}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: bookinfo}
  meshes:
    - {name: none, profile: none}
  experiments:
    - name: capacity
      kind: capacity
      search: {start: 100, max: 4000, precision: 20%}
      duration: 1500ms
      warmup: 500ms
    - {name: latency, kind: fixed-rate, rate: 75% of lowest capacity, capacityFrom: capacity, duration: 1500ms, warmup: 500ms}
  repeats: 1
  slo: {p99: 20ms, errorRate: 0.1%}
`

// The SLO-bounded capacity search bisects open-loop rates, and a relative rate is
// resolved from the highest probe that met the SLO.
func TestCapacitySearchFeedsRelativeRate(t *testing.T) {
	needRoot(t)
	run, _ := runStudy(t, parseStudy(t, searchStudy))
	var best, fixed float64
	probes := 0
	for _, tr := range run.Trials {
		switch tr.Experiment {
		case "capacity":
			if tr.Params.Extra["search"] != "probe" {
				continue // the closed-loop sweep at the default connection count
			}
			probes++
			p99 := results.Duration(tr.Result.Latency.ValueAtQuantile(99))
			// served inside the window, and the target in steady state, as the runner judges
			// (a generator that fell behind only made the latency worse)
			achieved := float64(tr.Result.Window.Completed) / tr.Duration().Seconds()
			met := tr.Result.Errors*1000 <= tr.Result.Requests && p99 <= 20*time.Millisecond &&
				achieved >= 0.95*tr.Params.RequestedRate && !tr.Result.Saturated()
			t.Logf("probe %.0f req/s: achieved %.0f, p99 %v, saturated %v, met %v", tr.Params.RequestedRate, achieved, p99, tr.Result.Saturated(), met)
			if met && tr.Params.RequestedRate > best {
				best = tr.Params.RequestedRate
			}
		case "latency":
			fixed = tr.Params.RequestedRate
		}
	}
	if probes < 3 {
		t.Fatalf("%d probes: a bisection from 100 to 4000 at 20%% needs several", probes)
	}
	if best == 0 {
		t.Fatal("no probe met the SLO, not even the start rate")
	}
	// The runner's own judgement may differ from this recomputation at the margin
	// (achieved rate over the window vs. the engine's), so allow one bisection step.
	if want := 0.75 * best; fixed < 0.75*want || fixed > 1.25*want {
		t.Errorf("fixed rate %.0f req/s, want 75%% of the best probe %.0f = %.0f", fixed, best, want)
	}
}
