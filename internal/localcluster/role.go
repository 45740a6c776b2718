package localcluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshmark/meshmark/internal/prereq"
	"golang.org/x/sys/unix"
)

// A cluster's helpers are this same executable, started again with roleEnv naming what
// to do: the node's mount namespace needs a process of its own to prepare it before it
// becomes containerd, and the API server's forwarder must outlive `cluster up`. Running
// the executable again works for meshmark and for a test binary alike, provided each
// calls RunRole first thing.
const (
	roleEnv       = "MESHMARK_CLUSTER_ROLE"
	roleNode      = "node"
	roleForward   = "forward"
	nodeDirEnv    = "MESHMARK_CLUSTER_NODE_DIR"
	clusterDirEnv = "MESHMARK_CLUSTER_DIR"
	forwardToEnv  = "MESHMARK_CLUSTER_FORWARD_TO"
)

// RunRole runs the cluster role this process was started for, and never returns, or
// returns at once when it was not started for one. meshmark's main and the TestMain of
// every package that brings a cluster up call it before anything else.
func RunRole() {
	role := os.Getenv(roleEnv)
	if role == "" {
		return
	}
	var err error
	switch role {
	case roleNode:
		err = nodeRole(os.Getenv(clusterDirEnv), os.Getenv(nodeDirEnv))
	case roleForward:
		err = forwardRole(os.NewFile(3, "api-listener"), os.Getenv(forwardToEnv))
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	fmt.Fprintf(os.Stderr, "meshmark cluster %s: %v\n", role, err)
	os.Exit(1)
}

// kernelTunables are the kernel settings the kubelet sets to its liking at start
// (pkg/kubelet/cm setupKernelTunables), with the values it wants. They are global: the
// node shows the kubelet files that already hold them instead, and the host's stay.
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// nodeRole is the first process of a node's PID namespace (started by `unshare --mount
// --pid --fork --mount-proc --propagation private` in the node's network namespace),
// with a private mount namespace and a /proc of its own. It gives the node its own
// /run, /var/lib, /var/log, /opt and an overlay /etc, then runs containerd as the
// node's init (initNode); the kubelet joins these namespaces later. When the node's
// processes are gone, the kernel drops the namespaces and every mount in them.
func nodeRole(clusterDir, nodeDir string) error {
	if clusterDir == "" || nodeDir == "" {
		return errors.New("cluster and node directories not given")
	}
	mount := func(source, target, fstype string, flags uintptr, data string) error {
		if err := unix.Mount(source, target, fstype, flags, data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", source, target, err)
		}
		return nil
	}
	steps := []func() error{
		func() error { return mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") },
		// The cluster's directory is under /var/lib, which is about to be the node's
		// own: keep it reachable at its path.
		func() error { return os.MkdirAll("/run/meshmark-cluster", 0o700) },
		func() error { return mount(clusterDir, "/run/meshmark-cluster", "", unix.MS_BIND, "") },
		func() error { return mount("tmpfs", "/var/lib", "tmpfs", 0, "mode=0755") },
		func() error { return os.MkdirAll(clusterDir, 0o700) },
		func() error { return mount("/run/meshmark-cluster", clusterDir, "", unix.MS_BIND, "") },
		func() error { return os.MkdirAll("/var/lib/kubelet", 0o755) },
		func() error {
			return mount(filepath.Join(nodeDir, "kubelet"), "/var/lib/kubelet", "", unix.MS_BIND, "")
		},
		func() error { return mount("tmpfs", "/var/log", "tmpfs", 0, "mode=0755") },
		func() error {
			return mount("overlay", "/etc", "overlay", 0, fmt.Sprintf("lowerdir=/etc,upperdir=%s,workdir=%s",
				filepath.Join(nodeDir, "etc-upper"), filepath.Join(nodeDir, "etc-work")))
		},
		func() error { return mount("tmpfs", "/opt", "tmpfs", 0, "mode=0755") },
		func() error { return os.MkdirAll("/opt/cni/bin", 0o755) },
		func() error { return mount(filepath.Join(nodeDir, "cni-bin"), "/opt/cni/bin", "", unix.MS_BIND, "") },
	}
	for key, value := range kernelTunables {
		file := filepath.Join(nodeDir, "sysctl", strings.ReplaceAll(key, "/", "."))
		steps = append(steps,
			func() error { return os.WriteFile(file, []byte(value+"\n"), 0o644) },
			func() error { return mount(file, filepath.Join("/proc/sys", key), "", unix.MS_BIND, "") })
	}
	// Everything above was private; shared now, within this namespace only, so that
	// what a pod mounts with propagation (istio-cni's view of /var/run/netns, the
	// kubelet's volumes) reaches the containers that ask for it. The host's mounts
	// are in other peer groups and see none of it.
	steps = append(steps, func() error { return mount("", "/", "", unix.MS_REC|unix.MS_SHARED, "") })
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	containerd, err := lookPath("containerd")
	if err != nil {
		return err
	}
	return initNode(containerd, "--config", filepath.Join(nodeDir, "containerd.toml"))
}

// initNode runs the node's containerd as the first process of the node's PID namespace
// does: it passes SIGTERM and SIGINT on, reaps every process the namespace's dying
// parents leave to it (the kubelet's and the shims' orphans), and ends with containerd.
func initNode(argv0 string, args ...string) error {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	cmd := exec.Command(argv0, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := cmd.Start(); err != nil {
		return err
	}
	main := cmd.Process.Pid
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			_ = cmd.Process.Signal(sig)
			continue
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == main {
				return fmt.Errorf("containerd ended: %v", ws)
			}
		}
	}
	return nil
}

// forwardRole serves the API server on the host's loopback: it accepts on the listener
// `cluster up` opened in the host's network namespace and passed down, and dials the
// API server from inside the cluster's, where it runs.
func forwardRole(l *os.File, to string) error {
	if to == "" {
		return errors.New("no address to forward to")
	}
	ln, err := net.FileListener(l)
	if err != nil {
		return fmt.Errorf("listener: %w", err)
	}
	l.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go forward(c, to)
	}
}

func forward(c net.Conn, to string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", to, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
	go pipe(up, c)
	go pipe(c, up)
	wg.Wait()
}

// lookPath finds a cluster binary: the tools directory meshmark setup installs into,
// then PATH (containerd, runc and nft come from Debian's packages).
func lookPath(name string) (string, error) {
	p, err := prereq.Tool(name)
	if err != nil {
		return "", fmt.Errorf("%s not found in %s/bin or on PATH: run `meshmark setup --for cluster`", name, prereq.ToolsDir())
	}
	return p, nil
}

// Binaries are the programs a local cluster runs or drives.
var Binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy",
	"coredns", "containerd", "containerd-shim-runc-v2", "runc", "ctr", "nft", "nsenter", "unshare", "ip"}

// cniPlugins are the CNI plugins every node's network uses.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// Missing names every binary a cluster needs that cannot be found.
func Missing() []string {
	var out []string
	for _, b := range Binaries {
		if _, err := lookPath(b); err != nil {
			out = append(out, b)
		}
	}
	for _, p := range cniPlugins {
		if _, err := os.Stat(filepath.Join(prereq.CNIPlugins(), p)); err != nil {
			out = append(out, "CNI plugin "+p)
		}
	}
	return out
}
