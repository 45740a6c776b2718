package runner

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/sampler"
	"github.com/meshmark/meshmark/internal/store"
)

const faultStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-sidecar-fault}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1}
  workload: {graph: bookinfo}
  meshes:
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: off}}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, connections: 4, duration: 4s, warmup: 1s}
  repeats: 1
`

// sidecarKiller kills productpage's sidecar Envoy with SIGKILL two seconds into the
// first trial, as a crash would, and remembers its pid.
type sidecarKiller struct {
	t    *testing.T
	once sync.Once
	mu   sync.Mutex
	pid  int
	pod  string
}

func (k *sidecarKiller) Interval(mesh, experiment string, repeat int, iv load.Interval) {
	if iv.Start < 2*time.Second {
		return
	}
	k.once.Do(func() {
		pid, pod := ourEnvoy(k.t, "productpage")
		if pid == 0 {
			k.t.Error("found no productpage sidecar Envoy started by this test")
			return
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			k.t.Errorf("kill envoy %d: %v", pid, err)
			return
		}
		k.mu.Lock()
		k.pid, k.pod = pid, pod
		k.mu.Unlock()
		k.t.Logf("killed %s's sidecar Envoy, pid %d, %v into the trial", pod, pid, iv.Start)
	})
}

func (k *sidecarKiller) Round(string, string, int, sampler.Round) {}

// ourEnvoy finds an Envoy this test process started (its parent is us: `ip netns
// exec` and setpriv exec in place), for the pod whose name starts with prefix, so that
// nothing another test or user runs on this machine is touched.
func ourEnvoy(t *testing.T, prefix string) (int, string) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || !strings.Contains(s[:i], "(envoy") {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		for j := 0; j+1 < len(args); j++ {
			if args[j] == "--service-node" && strings.HasPrefix(args[j+1], prefix) {
				return pid, args[j+1]
			}
		}
	}
	return 0, ""
}

// A sidecar killed mid-trial makes that trial a fault: it is stored with the process,
// when and its log, left out of the pooled results, measured again on a fresh
// bring-up, and the report says so.
func TestKilledSidecarIsAFaultExcludedAndRepeated(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	killer := &sidecarKiller{t: t}
	run, err := Run(ctx, parseStudy(t, faultStudy), Options{Store: db, PodBinary: podBin, Progress: testWriter{t}, Observe: killer})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if killer.pid == 0 {
		t.Fatal("no sidecar was killed")
	}
	stored, err := db.LoadRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != results.StatusComplete || len(stored.Trials) != 2 {
		t.Fatalf("run %s with %d trials, want complete with the fault trial and its repeat", run.Status, len(stored.Trials))
	}
	faulted, repeated := stored.Trials[0], stored.Trials[1]
	if !faulted.Result.HasFlag(results.FlagFault) || len(faulted.Result.Faults) != 1 {
		t.Fatalf("first trial: flags %v, faults %+v; want one fault", faulted.Result.Flags, faulted.Result.Faults)
	}
	f := faulted.Result.Faults[0]
	t.Logf("fault: %s; %d errors of %d requests", f, faulted.Result.Errors, faulted.Result.Requests)
	if f.PID != killer.pid || f.Pod != killer.pod || f.Process != "envoy" || f.Role != "sidecar" || f.Exit != "signal: killed" {
		t.Errorf("fault %+v, want pod %s envoy pid %d killed", f, killer.pod, killer.pid)
	}
	if f.At.Before(faulted.Start) || f.At.After(faulted.End) {
		t.Errorf("fault seen at %v, outside the trial's window %v–%v", f.At, faulted.Start, faulted.End)
	}
	// The log itself goes with the testbed; its tail is kept with the trial.
	if !strings.HasSuffix(f.LogPath, killer.pod+".envoy.log") {
		t.Errorf("fault log path %q does not name %s's Envoy log", f.LogPath, killer.pod)
	}
	if repeated.Result.Excluded() || len(repeated.Result.Faults) != 0 || repeated.Repeat != faulted.Repeat || repeated.Result.Errors != 0 {
		t.Errorf("repeat: flags %v, faults %v, repeat %d, %d errors; want a clean measurement of the same repeat",
			repeated.Result.Flags, repeated.Result.Faults, repeated.Repeat, repeated.Result.Errors)
	}

	an := analysis.Analyze(stored, analysis.Options{Seed: 1}, nil)
	if len(an.Groups) != 1 || len(an.Groups[0].TrialIDs) != 1 || an.Groups[0].TrialIDs[0] != repeated.ID || an.Groups[0].Errors != 0 {
		t.Errorf("pooled groups %+v: want only the repeated trial %d", an.Groups, repeated.ID)
	}
	if len(an.Excluded) != 1 || an.Excluded[0].TrialID != faulted.ID {
		t.Errorf("excluded %+v, want the fault trial %d", an.Excluded, faulted.ID)
	}
	var md bytes.Buffer
	if err := report.Render(&md, report.Markdown, stored, an, report.Options{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"no process of the system under test exited during a trial", "FAIL", killer.pod + "/envoy (pid " + strconv.Itoa(killer.pid) + ")",
		"left out of every result", "measured them once more"}
	for _, w := range want {
		if !strings.Contains(md.String(), w) {
			t.Errorf("report does not say %q", w)
		}
	}
	if t.Failed() {
		t.Logf("report:\n%s", md.String())
	}
}

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
