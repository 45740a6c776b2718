package localcluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupFS is where the cgroup hierarchies are mounted.
const cgroupFS = "/sys/fs/cgroup"

// hierarchies lists the mounted cgroup hierarchies (each v1 controller's directory and
// cgroup2's, which on a hybrid host is "unified").
func hierarchies() ([]string, error) {
	entries, err := os.ReadDir(cgroupFS)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(cgroupFS, e.Name())
		// cpu,cpuacct style names are symlinks to the combined hierarchy.
		if e.Type()&os.ModeSymlink != 0 {
			continue
		}
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no cgroup hierarchy under %s", cgroupFS)
	}
	return out, nil
}

// clusterCgroup is where a cluster's processes live: under the cgroup the caller's
// memory is accounted to, so that a session's or a CI job's limits still hold, and the
// same path in every hierarchy, because the kubelet's cgroupfs driver takes one path
// for all of them.
func clusterCgroup(name string) (string, error) {
	base := "/"
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			base = parts[2]
		}
	}
	return filepath.Join(base, "meshmark-cluster-"+name), nil
}

// makeCgroup creates path in every hierarchy and returns the directories it created,
// parents first. A new cpuset cgroup has no CPUs or memory nodes until given its
// parent's, and takes no process before.
func makeCgroup(path string) (created []string, err error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		parts := strings.Split(strings.Trim(path, "/"), "/")
		dir := h
		for _, part := range parts {
			dir = filepath.Join(dir, part)
			if _, err := os.Stat(dir); err == nil {
				// A parent another cluster created (the caller's path, in a hierarchy
				// that lacked it) is this cluster's to remove too, should it be the
				// last one out.
				if dir != filepath.Join(h, path) && onlyClusters(dir) {
					created = append(created, dir)
				}
				continue
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				return created, fmt.Errorf("create cgroup %s: %w", dir, err)
			}
			created = append(created, dir)
			if filepath.Base(h) == "cpuset" {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
					if err != nil {
						return created, err
					}
					if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
						return created, fmt.Errorf("cgroup %s: %s: %w", dir, f, err)
					}
				}
			}
		}
	}
	return created, nil
}

// joinCgroup moves pid into path in every hierarchy; its children are born there.
func joinCgroup(path string, pid int) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		f := filepath.Join(h, path, "cgroup.procs")
		if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move %d into %s: %w", pid, f, err)
		}
	}
	return nil
}

// cgroupPIDs lists every process in path and below it, in every hierarchy: the kubelet
// moves containers into its own cgroups, which are below path too.
func cgroupPIDs(path string) ([]int, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	var out []int
	for _, h := range hs {
		root := filepath.Join(h, path)
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				return err
			}
			if !d.IsDir() {
				return nil
			}
			data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil // removed meanwhile
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// killCgroup kills every process under path and waits until none is left. The freezer
// stops the tree first, so that nothing forks between the listing and the kill.
func killCgroup(path string, timeout time.Duration) error {
	freezer := filepath.Join(cgroupFS, "freezer", path, "freezer.state")
	frozen := os.WriteFile(freezer, []byte("FROZEN"), 0o644) == nil
	deadline := time.Now().Add(timeout)
	killed := map[int]bool{}
	for {
		pids, err := cgroupPIDs(path)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				killed[pid] = true
			}
		}
		// A frozen process dies only once thawed.
		if frozen {
			_ = os.WriteFile(freezer, []byte("THAWED"), 0o644)
			frozen = false
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v still alive after %v", path, pids, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if frozen {
		_ = os.WriteFile(freezer, []byte("THAWED"), 0o644)
	}
	// A process leaves its cgroup early in its exit, before it has released its
	// mounts and namespaces: wait until each one killed has finished dying.
	for pid := range killed {
		for running(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if running(pid) {
			return fmt.Errorf("cgroup %s: process %d still alive %v after SIGKILL", path, pid, timeout)
		}
	}
	return nil
}

// removeCgroup removes path and everything below it in every hierarchy, deepest first,
// and then the parents that up created (created, as makeCgroup returned them). The
// processes must be gone.
func removeCgroup(path string, created []string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		root := filepath.Join(h, path)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirCgroup(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for i := len(created) - 1; i >= 0; i-- {
		// A parent that still holds something (another cluster, or processes) is
		// not left behind by this cluster: whoever is in it removes it or owns it.
		if _, err := os.Stat(created[i]); err == nil && !emptyCgroup(created[i]) {
			continue
		}
		if err := rmdirCgroup(created[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// emptyCgroup says whether dir holds no process and no child cgroup.
func emptyCgroup(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.IsDir() {
			return false
		}
	}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return err == nil && len(strings.TrimSpace(string(procs))) == 0
}

// onlyClusters says whether dir holds nothing but local clusters' cgroups: no process
// of its own, and every child either a cluster's or, below it, the same.
func onlyClusters(dir string) bool {
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil || len(strings.TrimSpace(string(procs))) > 0 {
		return false
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	children := 0
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		children++
		if !strings.HasPrefix(e.Name(), "meshmark-cluster-") && !onlyClusters(filepath.Join(dir, e.Name())) {
			return false
		}
	}
	return children > 0
}

// rmdirCgroup removes one cgroup directory; the kernel may take a moment to release a
// cgroup whose last process has just died.
func rmdirCgroup(dir string) error {
	var err error
	for range 50 {
		err = syscall.Rmdir(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}
