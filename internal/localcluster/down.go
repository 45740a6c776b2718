package localcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Down takes the named cluster apart: its processes (containers included), its
// network namespace, its cgroups, its kubeconfig context and its directory.
func Down(ctx context.Context, name string, progress io.Writer) error {
	if err := checkName(name); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("cluster down needs root")
	}
	st, err := Load(name)
	if errors.Is(err, os.ErrNotExist) {
		if leftovers(name) {
			return teardown(ctx, &State{Name: name}, progress)
		}
		return fmt.Errorf("no cluster named %s (clusters: %s)", name, listOrNone())
	}
	if err != nil {
		return err
	}
	return teardown(ctx, st, progress)
}

func listOrNone() string {
	names, _ := List()
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// leftovers says whether a cluster without a state file left a namespace behind.
func leftovers(name string) bool { return len(netnsOf(name)) > 0 }

// stopOrder is the order in which down stops daemons, kubelets first so that they do
// not restart what is being stopped; whatever is left then is killed through the
// cgroup.
var stopOrder = []string{"-kubelet", "-kube-proxy", "-node", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd", "api-forwarder"}

// teardown removes what up made, as far as it got; every step runs even when an
// earlier one failed, and the errors are joined.
func teardown(ctx context.Context, st *State, progress io.Writer) error {
	say := func(format string, args ...any) {
		if progress != nil {
			fmt.Fprintf(progress, format+"\n", args...)
		}
	}
	var errs []error
	if _, err := os.Stat(Dir(st.Name)); err == nil && st.Phase != "" {
		st.Phase = PhaseStopping
		_ = st.save()
	}
	if st.Cgroup == "" {
		st.Cgroup, _ = clusterCgroup(st.Name)
	}
	// Everything in the cluster now, to wait for at the end: a process that the
	// daemons' stopping makes exit on its own leaves the cgroup early in its exit,
	// before it has let go of its mounts and namespaces, so the cgroup's emptying
	// alone does not say it is gone.
	members, _ := cgroupPIDs(st.Cgroup)
	if len(st.PIDs) > 0 {
		say("stopping %d daemons", len(st.PIDs))
		for _, suffix := range stopOrder {
			var group []int
			for name, pid := range st.PIDs {
				if strings.HasSuffix(name, suffix) || name == suffix {
					group = append(group, pid)
				}
			}
			stopAll(group, 5*time.Second)
		}
	}
	say("killing what is left in cgroup %s", st.Cgroup)
	if err := killCgroup(st.Cgroup, 15*time.Second); err != nil {
		errs = append(errs, err)
	}
	waitGone(members, 15*time.Second)
	say("removing network namespaces %s", strings.Join(netnsOf(st.Name), ", "))
	if err := removeNetwork(ctx, st.Name); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroup(st.Cgroup, st.CreatedCgroups); err != nil {
		errs = append(errs, err)
	}
	if st.Kubeconfig != "" {
		say("removing context %s from %s", st.Context, st.Kubeconfig)
		if err := unmergeKubeconfig(st.Kubeconfig, st.Context); err != nil {
			errs = append(errs, err)
		}
	}
	dir := Dir(st.Name)
	if mounts := mountsUnder(dir); len(mounts) > 0 {
		errs = append(errs, fmt.Errorf("%s still has mounts (%s): left in place", dir, strings.Join(mounts, ", ")))
	} else if err := removeDir(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// stopAll sends SIGTERM to pids and waits up to grace for them to go, then kills
// them. Pids that are already gone are skipped.
func stopAll(pids []int, grace time.Duration) {
	var live []int
	for _, pid := range pids {
		if syscall.Kill(pid, syscall.SIGTERM) == nil {
			live = append(live, pid)
		}
	}
	deadline := time.Now().Add(grace)
	for _, pid := range live {
		for running(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if running(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// waitGone waits, up to timeout, until none of pids is running.
func waitGone(pids []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for pid != os.Getpid() && running(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// running says whether pid is a live process (a zombie is not).
func running(pid int) bool {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(st)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(s[i+1:], " Z")
}

// mountsUnder lists the host's mounts at or below dir: removing a directory through a
// mount would delete what the mount shows.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// removeDir removes a cluster's directory. Overlay and container storage released by
// the kernel a moment after their last process died can make the first try fail.
func removeDir(dir string) error {
	var err error
	for range 20 {
		if err = os.RemoveAll(dir); err == nil {
			if parent := filepath.Dir(dir); parent == StateRoot {
				_ = os.Remove(StateRoot) // only when no other cluster is there
			}
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("remove %s: %w", dir, err)
}
