package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/study"
)

// preflight checks, before the run is created and long before the first trial,
// everything the whole study needs on this machine: root, network namespaces, the
// testbed's tools, every prerequisite of every mesh in it (binaries at their pinned
// versions, kernel modules) and the CPUs the placement names. It returns one error
// listing everything missing, each with how to install it, so that a study does not
// measure its first mesh for a minute and then stop at the second.
func (r *runner) preflight(ctx context.Context) error {
	var problems []string
	if os.Geteuid() != 0 {
		problems = append(problems, "root: meshmark run creates network namespaces and iptables rules; run it as root (sudo)")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		problems = append(problems, "network namespaces: this kernel has none (/proc/self/ns/net: "+err.Error()+")")
	}
	names := slices.Clone(prereq.LocalSubstrate)
	usedBy := map[string][]string{}
	for _, m := range r.study.Spec.Meshes {
		reg, ok := mesh.Lookup(m.Profile)
		if !ok {
			continue // prepare has already refused an unknown profile
		}
		if reg.KubernetesOnly != "" {
			// The study loader refuses it already; a study built in code must be too.
			problems = append(problems, fmt.Sprintf("mesh %s: profile %s runs on spec.substrate.kubernetes only: %s", m.Name, m.Profile, reg.KubernetesOnly))
		}
		for _, n := range reg.Needs {
			if len(usedBy[n]) == 0 && !slices.Contains(names, n) {
				names = append(names, n)
			}
			usedBy[n] = append(usedBy[n], m.Name)
		}
	}
	found, unknown := prereq.CheckNamed(ctx, names...)
	for _, st := range found {
		if p := st.Problem(); p != "" {
			if ms := usedBy[st.Item.Name]; len(ms) > 0 {
				p += fmt.Sprintf(" [needed by mesh %s]", strings.Join(ms, ", "))
			}
			problems = append(problems, p)
		}
	}
	for _, n := range unknown {
		problems = append(problems, fmt.Sprintf("%s: mesh %s names it as a prerequisite, but meshmark knows no such item (a bug in the profile)",
			n, strings.Join(usedBy[n], ", ")))
	}
	problems = append(problems, r.checkCPUs()...)
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s: this machine cannot run the study; nothing was measured:\n  - %s", r.study.File, strings.Join(problems, "\n  - "))
}

// checkCPUs verifies the placement's CPUs exist and this machine's cgroup lets
// meshmark use them. It does not read this process's own affinity: the runner pins
// itself to the load generator's CPUs, and a second study in the same process (tests)
// must still see the machine's.
func (r *runner) checkCPUs() []string {
	have, source, err := usableCPUs()
	if err != nil {
		return []string{"CPU placement: cannot tell which CPUs this machine has: " + err.Error()}
	}
	loadgen, sut := placement(r.study.Spec.Substrate.Local)
	var out []string
	for _, part := range []struct {
		what string
		cpus []int
	}{{"loadgen", loadgen}, {"sut", sut}} {
		var missing []int
		for _, c := range part.cpus {
			if !slices.Contains(have, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			out = append(out, fmt.Sprintf("spec.substrate.local.cpuPlacement.%s: CPU %v not available to meshmark here (it may use CPUs %v, from %s)",
				part.what, missing, have, source))
		}
	}
	return out
}

// usableCPUs lists the CPUs processes in meshmark's cgroup may run on (cgroup v2
// cpuset.cpus.effective), else the machine's online CPUs.
func usableCPUs() ([]int, string, error) {
	var files []string
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if path, ok := strings.CutPrefix(line, "0::"); ok {
				files = append(files, filepath.Join("/sys/fs/cgroup", path, "cpuset.cpus.effective"))
			}
		}
	}
	files = append(files, "/sys/fs/cgroup/cpuset.cpus.effective", "/sys/devices/system/cpu/online")
	var lastErr error
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || strings.TrimSpace(string(b)) == "" {
			lastErr = err
			continue
		}
		cpus, err := study.CPUList(strings.TrimSpace(string(b))).CPUs()
		if err != nil {
			return nil, f, fmt.Errorf("%s: %w", f, err)
		}
		return cpus, f, nil
	}
	return nil, "", lastErr
}
