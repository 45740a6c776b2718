package localcluster

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// hostState is what a cluster must leave as it found it on the host: the kernel's
// global settings, the host's network namespace (its links, addresses, routes and
// netfilter rules), the named network namespaces, the host's mounts, the cgroups at
// every hierarchy's root, and the directories containerd and the kubelet create when
// they run on a host directly.
type hostState map[string]string

// volatileSysctls change on their own (counters, random values, the last pid) and say
// nothing about what a cluster did.
var volatileSysctls = []string{
	"kernel/random/", "kernel/ns_last_pid", "kernel/pty/nr", "kernel/tainted",
	"fs/dentry-state", "fs/file-nr", "fs/inode-nr", "fs/inode-state", "fs/quota/",
	"vm/stat_refresh", "vm/drop_caches", "vm/compact_memory", "kernel/usermodehelper",
	"fs/binfmt_misc", "kernel/sched_domain",
}

func snapshotHost(t *testing.T) hostState {
	t.Helper()
	s := hostState{}
	for _, dir := range []string{"kernel", "vm", "fs", "net/core", "net/ipv4", "net/bridge", "net/netfilter"} {
		root := filepath.Join("/proc/sys", dir)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			key := strings.TrimPrefix(p, "/proc/sys/")
			for _, v := range volatileSysctls {
				if strings.HasPrefix(key, v) {
					return nil
				}
			}
			if info, err := d.Info(); err != nil || info.Mode().Perm()&0o444 == 0 {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil {
				s["sysctl "+key] = strings.TrimSpace(string(b))
			}
			return nil
		})
	}
	for name, argv := range map[string][]string{
		"links":    {"ip", "-o", "link"},
		"addrs":    {"ip", "-o", "addr"},
		"routes":   {"ip", "route", "show", "table", "all"},
		"nft":      {"nft", "list", "ruleset"},
		"iptables": {"iptables-save"},
	} {
		out, err := exec.Command(argv[0], argv[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(argv, " "), err)
		}
		s[name] = stripCounters(string(out))
	}
	s["netns"] = namesIn(t, "/run/netns", func(n string) bool { return !strings.HasPrefix(n, "mm-") }) // the local testbed's come and go
	s["mounts"] = mountPoints(t)
	hs, err := hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		s["cgroups "+h] = namesIn(t, h, func(n string) bool { return !strings.Contains(n, ".") })
	}
	for _, p := range []string{"/run/containerd", "/var/lib/kubelet", "/var/lib/cni", "/var/lib/containerd", "/var/log/pods",
		"/var/log/containers", "/etc/cni", "/opt/cni", "/run/netns/cni", "/etc/kubernetes", StateRoot} {
		_, err := os.Stat(p)
		s["exists "+p] = fmt.Sprint(err == nil)
	}
	return s
}

// stripCounters removes packet and byte counts, which change as traffic passes.
func stripCounters(s string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "#") {
			continue // iptables-save's dated comments
		}
		if i := strings.Index(line, " counter packets"); i >= 0 {
			line = line[:i]
		}
		if strings.HasPrefix(line, ":") { // iptables chain counters
			if i := strings.Index(line, " ["); i >= 0 {
				line = line[:i]
			}
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func namesIn(t *testing.T, dir string, keep func(string) bool) string {
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if keep(e.Name()) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

func mountPoints(t *testing.T) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && !strings.HasPrefix(fields[4], "/run/netns/mm-") {
			points = append(points, fields[4])
		}
	}
	sort.Strings(points)
	return strings.Join(points, " ")
}

// diff lists what differs between two snapshots.
func (a hostState) diff(b hostState) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			out = append(out, k+": gone")
		} else if v != w {
			out = append(out, fmt.Sprintf("%s: %q, now %q", k, clip(v), clip(w)))
		}
	}
	for k, w := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("%s: new %q", k, clip(w)))
		}
	}
	sort.Strings(out)
	return out
}

func clip(s string) string {
	if len(s) > 400 {
		return s[:400] + "…"
	}
	return s
}
