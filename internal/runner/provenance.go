package runner

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate"
)

// collectProvenance records the machine and the versions of everything that ran.
func collectProvenance(version string, st *study.Study) results.Provenance {
	p := results.Provenance{
		Cores:           runtime.NumCPU(),
		MeshmarkVersion: version,
		GoVersion:       runtime.Version(),
		Components:      map[string]string{},
		Placement:       map[string]string{},
	}
	p.Hostname, _ = os.Hostname()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		p.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	p.OS = osRelease()
	p.CPUModel = cpuModel()
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		p.MemoryBytes = int64(si.Totalram) * int64(si.Unit)
	}
	// Only the components every local run uses: checking every prerequisite (the
	// cluster's and the tests' tools too) took 11 s of each run's start.
	found, _ := prereq.CheckNamed(context.Background(), "envoy", "iptables", "ip")
	for _, st := range found {
		if st.OK() {
			p.Components[st.Item.Name] = st.Version
		}
	}
	if local := st.Spec.Substrate.Local; local != nil {
		lg, sut := placement(local)
		p.Placement[string(substrate.RoleLoadGen)] = describeCPUs(lg)
		p.Placement["system-under-test"] = describeCPUs(sut)
		p.Placement["loadgen-node"] = fmt.Sprintf("node%d", local.LoadgenNode)
		p.Placement["nodes"] = fmt.Sprint(local.Nodes)
		if st.Spec.KeepMeshesUp {
			// the other meshes' pods sit idle beside every trial, on the same CPUs
			p.Placement["meshes-up"] = "all together, each in its own testbed"
		}
	}
	p.Components["mesh-profiles"] = strings.Join(mesh.Names(), ",")
	return p
}

func describeCPUs(cpus []int) string {
	if len(cpus) == 0 {
		return "unpinned"
	}
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = fmt.Sprint(c)
	}
	return "cpus " + strings.Join(s, ",")
}

func osRelease() string {
	f, err := os.Open("/etc/os-release")
	if err != nil {
		return runtime.GOOS
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return runtime.GOOS
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// placement decides which CPUs the load generator and the system under test use: the
// study's choice, else with two or more cores the last core for the generator and the
// rest for everything it measures, so the generator never competes with the mesh.
func placement(local *study.LocalSubstrate) (loadgen, sut []int) {
	if cp := local.CPUPlacement; cp != nil {
		loadgen, _ = cp.Loadgen.CPUs()
		sut, _ = cp.SUT.CPUs()
		return loadgen, sut
	}
	n := runtime.NumCPU()
	if n < 2 {
		return nil, nil
	}
	loadgen = []int{n - 1}
	for i := 0; i < n-1; i++ {
		sut = append(sut, i)
	}
	return loadgen, sut
}

// ownCPUs reports whether a placement gives the load generator CPUs of its own, where
// it may spin to keep its send times without slowing the system under test.
func ownCPUs(loadgen, sut []int) bool {
	if len(loadgen) == 0 || len(sut) == 0 {
		return false
	}
	for _, l := range loadgen {
		if slices.Contains(sut, l) {
			return false
		}
	}
	return true
}

// pin applies the placement: every thread of the load generator's process and of
// meshmark itself (which drives it, samples and stores, and must not take CPU from the
// system under test either) on the load generator's CPUs, and of every other process
// the testbed started on the system under test's. Threads created later inherit their
// creator's mask, and so do the processes meshmark starts: see unpin.
func (r *runner) pin(d *deployment) error {
	loadgen, sut := placement(r.study.Spec.Substrate.Local)
	if len(loadgen) > 0 {
		if err := pinPID(os.Getpid(), loadgen); err != nil {
			return fmt.Errorf("pin meshmark: %w", err)
		}
	}
	for _, p := range d.tb.Processes() {
		cpus, what := sut, "pin"
		if p.Spec().Role == substrate.RoleLoadGen {
			cpus, what = loadgen, "pin load generator"
		}
		if len(cpus) == 0 {
			continue
		}
		if err := pinPID(p.PID(), cpus); err != nil {
			return fmt.Errorf("%s %s/%s: %w", what, p.Pod(), p.Spec().Name, err)
		}
	}
	return nil
}

// unpin gives meshmark back the CPUs it started with, for bringing a deployment up or
// down. Pinned to the load generator's CPU, it would start every proxy and service of
// the next deployment there too, and a 100-pod bring-up ran on one of two cores.
func (r *runner) unpin() error {
	if r.startCPUs == nil {
		return nil
	}
	return pinMask(os.Getpid(), *r.startCPUs)
}

// saveCPUs records the CPUs meshmark may run on before any placement narrows them.
func (r *runner) saveCPUs() {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		r.startCPUs = &set
	}
}

func pinPID(pid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return pinMask(pid, set)
}

func pinMask(pid int, set unix.CPUSet) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		var tid int
		if _, err := fmt.Sscan(t.Name(), &tid); err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return err
		}
	}
	return nil
}

// checkProfile fails early for a mesh whose profile is unknown or whose options are bad.
func checkProfile(m study.Mesh) error {
	_, err := mesh.New(m.Profile, m.Options)
	return err
}
