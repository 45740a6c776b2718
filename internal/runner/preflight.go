package runner

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/prereq"
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

// checkCPUs verifies the placement's CPUs are ones this process may run on.
func (r *runner) checkCPUs() []string {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return []string{"CPU placement: cannot read this process's CPUs: " + err.Error()}
	}
	var have []int
	for c := 0; c < len(allowed)*64; c++ {
		if allowed.IsSet(c) {
			have = append(have, c)
		}
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
			out = append(out, fmt.Sprintf("spec.substrate.local.cpuPlacement.%s: CPU %v not available to meshmark here (it may use CPUs %v)",
				part.what, missing, have))
		}
	}
	return out
}
