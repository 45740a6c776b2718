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
	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/results"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// faultStudy measures bookinfo without a mesh once; the test kills a process of it.
const faultStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: both-platforms-fault}
spec:
  substrate:
%s
  workload: {graph: bookinfo}
  meshes:
    - {name: baseline, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, connections: 4, duration: 4s, warmup: 1s}
  repeats: 1
`

// TestKilledProcessIsAFaultOnBothPlatforms kills productpage's workload process with
// SIGKILL in the middle of the only trial, as a crash would: a process of the local
// testbed, or the process of a container on the real cluster, which its kubelet then
// starts again. On either platform the trial is stored as a fault naming the pod, the
// container or process, and how it ended, is left out of every result, and is measured
// once more on a fresh bring-up, cleanly; the report's checks say so, and nothing of
// the run is left.
func TestKilledProcessIsAFaultOnBothPlatforms(t *testing.T) {
	l := localAndCluster(t, false)
	client := l.ClientOf(t)
	// Which process is this run's, on each platform: on the local testbed one the run
	// started; on the cluster one of a pod of the run's namespaces.
	ours := map[string]func(t *testing.T, runPID, pid int, pod string) bool{
		"local": func(t *testing.T, runPID, pid int, _ string) bool { return descendsFrom(pid, runPID) },
		"kubernetes": func(t *testing.T, _, _ int, pod string) bool {
			nss, err := client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, ns := range nss.Items {
				if strings.HasPrefix(ns.Name, "mmreal") {
					if _, err := client.CoreV1().Pods(ns.Name).Get(context.Background(), pod, metav1.GetOptions{}); err == nil {
						return true
					}
				}
			}
			return false
		},
	}
	for _, p := range platformsOf(t, l, faultStudy) {
		t.Run(p.name, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "results.db")
			cmd, progress := startRunProcess(t, io.Discard, p.study, "--db", db, "--no-report")
			waitForTrials(t, progress, 0) // the trial has begun
			time.Sleep(2500 * time.Millisecond)
			pid, pod := serviceProcess(t, "productpage", func(pid int, pod string) bool { return ours[p.name](t, cmd.Process.Pid, pid, pod) })
			if pid == 0 {
				_ = cmd.Process.Kill()
				t.Fatal("found no productpage workload process of the run")
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill %d: %v", pid, err)
			}
			killed := time.Now()
			t.Logf("killed %s's workload process, pid %d", pod, pid)
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
			// How it ended, in each platform's words: the local testbed's wait on its
			// child, or the kubelet's record of the container's last run.
			exit := map[string]string{"local": "signal: killed", "kubernetes": "exit code 137 (Error), started again by its kubelet"}[p.name]
			if f.Pod != pod || f.Process != "app" || f.Role != "workload" || f.Before || f.Exit != exit {
				t.Errorf("fault %+v, want pod %s, process app, role workload, during the trial, %q", f, pod, exit)
			}
			// The kubelet records the end to the second, and reports it a moment later.
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
			for _, w := range []string{"no process of the system under test exited during a trial", pod + "/app", exit, "left out of every result", "measured them once more"} {
				if !strings.Contains(md.String(), w) {
					t.Errorf("report does not say %q", w)
				}
			}
			if ups := strings.Count(strings.Join(after, "\n"), "baseline up in "); ups != 1 {
				t.Errorf("%d bring-ups after the kill, want 1, a fresh one for the repeat", ups)
			}
		})
	}
}

// serviceProcess finds the process of a `meshmark-pod service` of the named service
// that ours accepts, and its pod (its --pod argument): the local testbed's and a
// container's alike.
func serviceProcess(t *testing.T, service string, ours func(pid int, pod string) bool) (int, string) {
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
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if !slices.Contains(args, "service") || flagValue(args, "--service") != service {
			continue
		}
		if pod := flagValue(args, "--pod"); pod != "" && ours(pid, pod) {
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
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			return false
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 {
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
