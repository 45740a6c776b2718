package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/owner"
	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/results"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// faultStudy measures bookinfo once, through Envoy sidecars; the test kills one.
const faultStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-fault}
spec:
  substrate:
%s
  workload: {graph: bookinfo}
  meshes:
    - {name: sidecar, profile: envoy-sidecar, options: {mtls: off}}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, connections: 4, duration: 4s, warmup: 1s}
  repeats: 1
`

// TestKilledSidecarIsAFaultOnBothPlatforms kills productpage's sidecar Envoy with
// SIGKILL in the middle of the only trial, as a crash would. Locally that is a process
// of the testbed, whose exit the runner sees; on the real cluster a process of the
// istio-proxy container, which then ends (Istio's pilot-agent ends with its Envoy, with
// code 0) and which its kubelet starts again. On either platform the trial is stored as
// a fault naming the pod, the process or container, its role and how it ended, is left
// out of every result, and is measured once more on a fresh bring-up, cleanly; the
// report's checks say so, and nothing of the run is left. (The same holds for any
// process of the system under test: the runner does not tell them apart.)
func TestKilledSidecarIsAFaultOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, true)
	client := l.ClientOf(t)
	// Which Envoy is productpage's and the run's: locally one the run started, whose
	// service node names the pod; on the cluster one in the cgroup of productpage's pod
	// in the run's namespace.
	find := map[string]func(t *testing.T, runPID int) (int, string){
		"local": func(t *testing.T, runPID int) (int, string) {
			return processWhere(t, "envoy", func(pid int, args []string) string {
				if node := flagValue(args, "--service-node"); strings.HasPrefix(node, "productpage") && descendsFrom(pid, runPID) {
					return node
				}
				return ""
			})
		},
		"kubernetes": func(t *testing.T, _ int) (int, string) {
			pods := runPods(t, client, "productpage")
			return processWhere(t, "envoy", func(pid int, _ []string) string {
				cgroup, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
				for _, p := range pods {
					if uid := string(p.UID); strings.Contains(string(cgroup), uid) || strings.Contains(string(cgroup), strings.ReplaceAll(uid, "-", "_")) {
						return p.Name
					}
				}
				return ""
			})
		},
	}
	// What the fault must name, on each platform: the process and the testbed's wait on
	// it, or the container and the end of its kubelet's record of its last run.
	process := map[string]string{"local": "envoy", "kubernetes": "istio-proxy"}
	exit := map[string]string{"local": "signal: killed", "kubernetes": ", started again by its kubelet"}
	for _, p := range platformsOf(t, l, faultStudy) {
		t.Run(p.name, func(t *testing.T) {
			checkKilledIsAFault(t, p, "sidecar", "sidecar", process[p.name], exit[p.name], func(runPID int) (int, string) { return find[p.name](t, runPID) })
		})
	}
}

// runPods are the pods of the run's namespaces on the cluster (mmreal-*) whose name
// starts with prefix.
func runPods(t *testing.T, client kubernetes.Interface, prefix string) []corev1.Pod {
	t.Helper()
	nss, err := client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, ns := range nss.Items {
		if !strings.HasPrefix(ns.Name, "mmreal") {
			continue
		}
		pods, err := client.CoreV1().Pods(ns.Name).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, prefix) {
				out = append(out, p)
			}
		}
	}
	return out
}

// checkKilledIsAFault runs p's study in a process of its own, kills the process find
// finds 2.5 s into its trial, and holds the run to what a fault must make of it: the
// fault of a process of pod named process, of role, that ended as exit says (its end).
func checkKilledIsAFault(t *testing.T, p platform, meshName, role, process, exit string, find func(runPID int) (int, string)) {
	t.Helper()
	db := filepath.Join(t.TempDir(), "results.db")
	cmd, progress := startRunProcess(t, io.Discard, p.study, "--db", db, "--no-report")
	waitForTrials(t, progress, 0) // the trial has begun
	time.Sleep(2500 * time.Millisecond)
	pid, pod := find(cmd.Process.Pid)
	if pid == 0 {
		_ = cmd.Process.Kill()
		t.Fatalf("found no process of productpage's %s in the run", role)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", pid, err)
	}
	killed := time.Now()
	t.Logf("killed %s's %s, pid %d", pod, role, pid)
	var after []string
	for progress.Scan() {
		t.Log(progress.Text())
		after = append(after, progress.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run: %v", err)
	}
	p.checkNothingLeft(t)

	run := lastRun(t, db)
	if run.Status != results.StatusComplete || len(run.Trials) != 2 {
		t.Fatalf("run %s (%s) with %d trials, want complete with the fault trial and its repeat", run.Status, run.StatusReason, len(run.Trials))
	}
	faulted, repeated := run.Trials[0], run.Trials[1]
	if !faulted.Result.HasFlag(results.FlagFault) || len(faulted.Result.Faults) != 1 {
		t.Fatalf("first trial: flags %v, faults %+v; want one fault", faulted.Result.Flags, faulted.Result.Faults)
	}
	f := faulted.Result.Faults[0]
	t.Logf("fault: %s; %d errors of %d requests", f, faulted.Result.Errors, faulted.Result.Requests)
	if f.Pod != pod || f.Process != process || f.Role != role || f.Before || !strings.HasSuffix(f.Exit, exit) {
		t.Errorf("fault %+v, want pod %s, process %s, role %s, during the trial, ending %q", f, pod, process, role, exit)
	}
	if f.LogTail == "" {
		t.Errorf("the fault keeps nothing of the end of the process's log")
	}
	// A kubelet records the end to the second, and reports it a moment later.
	if f.At.Before(killed.Add(-time.Second)) || f.At.After(killed.Add(5*time.Second)) {
		t.Errorf("fault at %v, the kill at %v", f.At, killed)
	}
	if faulted.Result.Errors == 0 {
		t.Errorf("the fault trial failed no request")
	}
	if repeated.Result.Excluded() || len(repeated.Result.Faults) != 0 || repeated.Repeat != faulted.Repeat || repeated.Result.Errors != 0 {
		t.Errorf("repeat: flags %v, faults %v, repeat %d, %d errors; want a clean measurement of the same repeat",
			repeated.Result.Flags, repeated.Result.Faults, repeated.Repeat, repeated.Result.Errors)
	}
	an := analysis.Analyze(run, analysis.Options{Seed: 1}, nil)
	if len(an.Groups) != 1 || !slices.Equal(an.Groups[0].TrialIDs, []int64{repeated.ID}) || an.Groups[0].Errors != 0 {
		t.Errorf("pooled groups %+v: want only the repeated trial %d", an.Groups, repeated.ID)
	}
	var md bytes.Buffer
	if err := report.Render(&md, report.Markdown, run, an, report.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"no process of the system under test exited during a trial", pod + "/" + process, exit, "left out of every result", "measured them once more"} {
		if !strings.Contains(md.String(), w) {
			t.Errorf("report does not say %q", w)
		}
	}
	if ups := strings.Count(strings.Join(after, "\n"), meshName+" up in "); ups != 1 {
		t.Errorf("%d bring-ups after the kill, want 1, a fresh one for the repeat", ups)
	}
}

// processWhere finds a process named comm for which match returns its pod, and that
// pod.
func processWhere(t *testing.T, comm string, match func(pid int, args []string) string) (int, string) {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue
		}
		raw, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if pod := match(pid, strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")); pod != "" {
			return pid, pod
		}
	}
	return 0, ""
}

func flagValue(args []string, name string) string {
	if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// descendsFrom says whether process pid is ancestor's descendant.
func descendsFrom(pid, ancestor int) bool {
	for pid > 1 {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		fields, ok := owner.StatFields(stat)
		if !ok || len(fields) < 2 {
			return false
		}
		if pid, err = strconv.Atoi(fields[1]); err != nil {
			return false
		}
		if pid == ancestor {
			return true
		}
	}
	return false
}

// failingStudy measures a one-service graph, failing.yaml beside the study, whose
// service answers the share of requests given by ERROR_RATE with an error.
const failingStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-failing}
spec:
  substrate:
%s
  workload: {graph: failing.yaml}
  meshes:
    - {name: baseline, profile: none}
  experiments:
EXPERIMENTS  repeats: 1
`

// TestFailedRunsOnBothPlatforms: two runs whose answers are errors fail, on the local
// testbed as on the real cluster, saying why, stored failed with the reason, and leave
// nothing behind.
//   - Every request answered with an error: a trial in which no request succeeded
//     measured nothing of the system but that it did not serve. The run fails naming
//     what the requests got, and stores no trial rather than one with its numbers.
//   - A capacity search against a service that fails 20% of requests: with no SLO the
//     default error bound (0.1%) applies, and the closed-loop trial that exceeds it is
//     no capacity. The run stops there, keeping that trial, instead of deriving the
//     next experiment's rate from failures.
func TestFailedRunsOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, false)
	for _, tc := range []struct {
		name, errorRate, experiments string
		// err is what the run's error must say; trials, how many are stored.
		err    string
		trials int
	}{
		{"no success", "100%", "    - {name: latency, kind: fixed-rate, rate: 50, duration: 2s, warmup: 500ms}\n",
			`latency 50 req/s on baseline, repeat 1(, through 1 load generators)?: no request succeeded: \d+ measured, all failed \(non-2xx \d+\); answers 500×\d+`, 0},
		{"errors are not capacity", "20%", "    - {name: capacity, kind: capacity, connections: [2], duration: 2s, warmup: 500ms}\n" +
			"    - {name: latency, kind: fixed-rate, rate: 50% of lowest capacity, capacityFrom: capacity, duration: 1s, warmup: 200ms}\n",
			`capacity of baseline in capacity \(repeat 1\): .*0\.10%.*so there is no capacity to report or to derive rates from`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			study := strings.Replace(failingStudy, "EXPERIMENTS", strings.ReplaceAll(tc.experiments, "%", "%%"), 1)
			for _, p := range platformsOf(t, l, study) {
				t.Run(p.name, func(t *testing.T) {
					graph := "name: failing\nservices:\n  - {name: front, isEntrypoint: true, errorRate: \"" + tc.errorRate + "\"}\n"
					if err := os.WriteFile(filepath.Join(filepath.Dir(p.study), "failing.yaml"), []byte(graph), 0o644); err != nil {
						t.Fatal(err)
					}
					db := filepath.Join(t.TempDir(), "results.db")
					_, progress, err := execCLI("run", "--db", db, "--no-report", p.study)
					if err == nil || !regexp.MustCompile(tc.err).MatchString(err.Error()) {
						t.Fatalf("run: %v\nwant an error matching %s\n%s", err, tc.err, progress)
					}
					t.Logf("run: %v", err)
					run := lastRun(t, db)
					if run.Status != results.StatusFailed || !regexp.MustCompile(tc.err).MatchString(run.StatusReason) || len(run.Trials) != tc.trials {
						t.Errorf("stored run: %s (%s) with %d trials; want failed, saying why, with %d", run.Status, run.StatusReason, len(run.Trials), tc.trials)
					}
					for _, tr := range run.Trials {
						if tr.Result.Errors*100 < tr.Result.Requests*10 {
							t.Errorf("%s trial: %d errors of %d requests, want about 20%%", tr.Experiment, tr.Result.Errors, tr.Result.Requests)
						}
					}
					p.checkNothingLeft(t)
				})
			}
		})
	}
}
