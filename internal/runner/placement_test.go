package runner

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate"
)

// TestOwnCPUs: the open model may spin only where the load generator has CPUs the
// system under test does not run on.
func TestOwnCPUs(t *testing.T) {
	for _, c := range []struct {
		loadgen, sut []int
		want         bool
	}{
		{[]int{1}, []int{0}, true},
		{[]int{2, 3}, []int{0, 1}, true},
		{[]int{1}, []int{0, 1}, false},
		{nil, []int{0}, false},
		{[]int{1}, nil, false}, // the system under test may run anywhere, the generator's core too
		{nil, nil, false},
	} {
		if got := ownCPUs(c.loadgen, c.sut); got != c.want {
			t.Errorf("ownCPUs(%v, %v) = %v, want %v", c.loadgen, c.sut, got, c.want)
		}
	}
}

const placementStudy = `apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: runner-placement}
spec:
  substrate:
    local: {nodes: 2, loadgenNode: 1, cpuPlacement: {loadgen: "1", sut: "0"}}
  workload: {graph: chain-2}
  meshes:
    - {name: a, profile: none}
    - {name: b, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 50, duration: 1s, warmup: 200ms}
  repeats: 2
  freshBringUpPerRepeat: true
`

// maskWriter records, for each progress line that contains one of its keys, the CPUs
// meshmark's threads were allowed at that moment (the progress is written from the
// runner's own goroutine, so any of its threads shows the process's placement).
type maskWriter struct {
	t    *testing.T
	mu   sync.Mutex
	seen map[string][]int
	// qos lists the CPU-latency bound in force at each "run  " line (each trial), and
	// qosUp at each " up in " line (each bring-up done).
	qos, qosUp []int32
}

func (w *maskWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	w.t.Log(line)
	for _, key := range []string{"torn down", " up in ", "run  "} {
		if strings.Contains(line, key) {
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(0, &set); err != nil {
				w.t.Error(err)
			}
			w.mu.Lock()
			w.seen[key] = append(w.seen[key], set.Count())
			if us, err := cpuLatencyInForce(); err == nil {
				switch key {
				case "run  ":
					w.qos = append(w.qos, us)
				case " up in ":
					w.qosUp = append(w.qosUp, us)
				}
			}
			w.mu.Unlock()
		}
	}
	return len(p), nil
}

// With a placement, meshmark measures from the load generator's CPU only, but brings
// deployments up and down on every CPU it started with (a bring-up confined to the load
// generator's one CPU took twice as long for 100 pods), and gives them all back when
// the run ends. Idle CPUs poll while trials measure (cpuIdle defaults to poll), and
// are left to the kernel while deployments come and go and once the run is over.
func TestPlacementPinsTrialsNotBringUps(t *testing.T) {
	needRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	if !before.IsSet(0) || !before.IsSet(1) {
		t.Skipf("this test process may not use CPUs 0 and 1 (%d CPUs allowed)", before.Count())
	}
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	qosBefore, qosErr := cpuLatencyInForce()
	w := &maskWriter{t: t, seen: map[string][]int{}}
	run, err := Run(context.Background(), parseStudy(t, placementStudy), Options{Store: db, PodBinary: podBin, Progress: w})
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Trials) != 4 {
		t.Fatalf("%d trials, want 4", len(run.Trials))
	}
	for key, want := range map[string]int{"run  ": 1, " up in ": 1, "torn down": before.Count()} {
		got := w.seen[key]
		if len(got) < 3 {
			t.Errorf("progress lines with %q: %d, want one per trial or deployment", key, len(got))
		}
		for _, n := range got {
			if n != want {
				t.Errorf("at %q meshmark could use %d CPUs, want %d (all seen: %v)", key, n, want, got)
			}
		}
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("after the run meshmark may use %d CPUs, before it %d", after.Count(), before.Count())
	}

	if qosErr != nil {
		t.Logf("cpu idle not checked: %v", qosErr)
		return
	}
	if got := run.Provenance.Placement["cpu-idle"]; !strings.HasPrefix(got, "poll") {
		t.Errorf("provenance cpu-idle = %q, want poll", got)
	}
	if len(w.qos) != 4 {
		t.Errorf("CPU-latency bound read at %d trials, want 4", len(w.qos))
	}
	for i, us := range w.qos {
		if us != 0 {
			t.Errorf("trial %d ran with a CPU-latency bound of %d µs, want 0 (idle CPUs polling)", i, us)
		}
	}
	if len(w.qosUp) == 0 {
		t.Error("no bring-up seen")
	}
	for i, us := range w.qosUp {
		if us != qosBefore {
			t.Errorf("bring-up %d ended with a CPU-latency bound of %d µs, want %d as outside the run", i, us, qosBefore)
		}
	}
	if us, err := cpuLatencyInForce(); err != nil || us != qosBefore {
		t.Errorf("after the run the CPU-latency bound is %d µs (%v), before it %d µs", us, err, qosBefore)
	}
}

// While meshmark holds the poll request, no CPU enters an idle state deeper than
// polling: the kernel's own per-state counters do not move. cpuIdle: os holds nothing.
func TestCPUIdlePollKeepsCPUsOutOfSleep(t *testing.T) {
	needRoot(t)
	before, err := cpuLatencyInForce()
	if err != nil {
		t.Skipf("no CPU-latency PM QoS here: %v", err)
	}
	applied, poll := cpuIdleFor(study.CPUIdleOS)
	if us, _ := cpuLatencyInForce(); us != before || poll || !strings.HasPrefix(applied, "os") {
		t.Errorf("cpuIdle os: bound %d µs (before %d), poll %v, applied %q", us, before, poll, applied)
	}
	r := &runner{}
	r.cpuIdle, r.cpuIdlePoll = cpuIdleFor(study.CPUIdlePoll)
	if !r.cpuIdlePoll || !strings.HasPrefix(r.cpuIdle, "poll") {
		t.Fatalf("cpuIdle poll: poll %v, applied %q", r.cpuIdlePoll, r.cpuIdle)
	}
	if us, _ := cpuLatencyInForce(); us != before {
		t.Errorf("deciding held a CPU-latency bound of %d µs (before %d)", us, before)
	}
	release := r.holdCPUIdle()
	if us, _ := cpuLatencyInForce(); us != 0 {
		t.Errorf("held: CPU-latency bound %d µs, want 0", us)
	}
	sleeps := deepIdleEntries(t)
	time.Sleep(300 * time.Millisecond)
	if more := deepIdleEntries(t) - sleeps; sleeps >= 0 && more != 0 {
		t.Errorf("held: CPUs entered an idle state deeper than polling %d times in 300 ms", more)
	}
	release()
	if us, _ := cpuLatencyInForce(); us != before {
		t.Errorf("released: CPU-latency bound %d µs, want %d as before", us, before)
	}
}

// deepIdleEntries sums, over every CPU, how often it entered a cpuidle state other
// than POLL; -1 when the kernel exposes no cpuidle states.
func deepIdleEntries(t *testing.T) int64 {
	names, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*/cpuidle/state[0-9]*/name")
	if len(names) == 0 {
		return -1
	}
	var sum int64
	for _, n := range names {
		name, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(name)) == "POLL" {
			continue
		}
		usage, err := os.ReadFile(filepath.Join(filepath.Dir(n), "usage"))
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// A service pinned to the system-under-test CPUs starts with its Go runtime sized for
// them, not for the machine; the load generator's process is pinned to its own CPU,
// sized for it, apart from them.
func TestPinnedServicesSizedForTheirCPUs(t *testing.T) {
	needRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	r := &runner{study: parseStudy(t, placementStudy), opts: Options{PodBinary: podBin}, capacities: map[string]map[string][]float64{}}
	if err := r.prepare(); err != nil {
		t.Fatal(err)
	}
	r.saveCPUs()
	defer func() { _ = r.unpin() }()
	d, err := r.bringUp(context.Background(), &r.study.Spec.Meshes[0])
	if d != nil {
		defer d.close()
	}
	if err != nil {
		t.Fatal(err)
	}
	apps, gens := 0, 0
	for _, p := range d.tb.Processes() {
		cpu := 0
		switch p.Spec().Role {
		case substrate.RoleWorkload:
			apps++
		case substrate.RoleLoadGen:
			gens++
			cpu = 1
			if p.Pod() != d.client.Name || !strings.HasSuffix(p.Spec().Argv[0], "/meshmark-pod") || p.Spec().Argv[1] != "generator" {
				t.Errorf("the load generator runs %q in pod %s, want meshmark-pod generator in %s", p.Spec().Argv, p.Pod(), d.client.Name)
			}
		default:
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.PID()))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(strings.Split(string(env), "\x00"), "GOMAXPROCS=1") {
			t.Errorf("%s/%s pinned to CPU %d runs without GOMAXPROCS=1: %q", p.Pod(), p.Spec().Name, cpu, env)
		}
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(p.PID(), &set); err != nil {
			t.Fatal(err)
		}
		if set.Count() != 1 || !set.IsSet(cpu) {
			t.Errorf("%s/%s may run on %d CPUs (CPU %d: %v), want CPU %d alone", p.Pod(), p.Spec().Name, set.Count(), cpu, set.IsSet(cpu), cpu)
		}
	}
	if apps != 2 || gens != 1 {
		t.Errorf("%d workload processes and %d load generators, want 2 (chain-2) and 1", apps, gens)
	}
}

// cpuLatencyInForce reads the CPU-latency bound the kernel enforces now: the smallest
// request held by any process, or its default when none is.
func cpuLatencyInForce() (int32, error) {
	b, err := os.ReadFile(cpuLatencyQoS)
	if err != nil {
		return 0, err
	}
	if len(b) < 4 {
		return 0, fmt.Errorf("%s: read %d bytes, want 4", cpuLatencyQoS, len(b))
	}
	return int32(binary.NativeEndian.Uint32(b)), nil
}
