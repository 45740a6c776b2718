package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshmark/meshmark/internal/owner"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/topology"
	"golang.org/x/sys/unix"
)

// processPath is the PATH processes get; they do not inherit meshmark's environment,
// so that a run does not depend on the shell it was started from.
const processPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// target is a namespace a pod handle refers to: a pod or a node.
type target struct {
	name string // pod or node name
	ns   *netNS
	dir  string
	ip   netip.Addr
}

func (tb *Testbed) resolveTarget(p topology.Pod) (target, error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if err := tb.checkOpen(); err != nil {
		return target{}, err
	}
	if pd, ok := tb.pods[p.Name]; ok && pd.ns != nil && (p.NetNS == "" || p.NetNS == pd.ns.name) {
		return target{name: p.Name, ns: pd.ns, dir: pd.dir, ip: pd.topo.IP}, nil
	}
	for _, n := range tb.nodes {
		if n.name == p.Name && (p.NetNS == "" || p.NetNS == n.ns.name) {
			return target{name: n.name, ns: n.ns, dir: filepath.Join(tb.runDir, "pods", n.name), ip: n.gateway}, nil
		}
	}
	return target{}, fmt.Errorf("testbed %s: no pod %q (netns %q)", tb.id, p.Name, p.NetNS)
}

// Exec runs a short command as root in the pod's namespace through `ip netns exec`, so
// that it sees the pod's /etc/hosts, and returns its combined output.
func (tb *Testbed) Exec(ctx context.Context, p topology.Pod, stdin io.Reader, argv ...string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("testbed: Exec: empty command")
	}
	t, err := tb.resolveTarget(p)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.ns.name}, argv...)...)
	cmd.Stdin = stdin
	cmd.Env = []string{"PATH=" + processPath, "HOME=/root"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("testbed: %s: %s: %w: %s", t.name, strings.Join(argv, " "), err, strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}

// Proc is a process started with Start. It implements substrate.Process.
type Proc struct {
	spec    substrate.ProcessSpec
	pod     string
	logPath string
	cmd     *exec.Cmd
	grace   time.Duration
	done    chan struct{}
	waitErr error
	stop    sync.Once
}

var (
	_ substrate.Process = (*Proc)(nil)
	_ substrate.Exiting = (*Proc)(nil)
)

func (p *Proc) PID() int                    { return p.cmd.Process.Pid }
func (p *Proc) Spec() substrate.ProcessSpec { return p.spec }
func (p *Proc) Pod() string                 { return p.pod }
func (p *Proc) LogPath() string             { return p.logPath }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process ended; valid after Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.waitErr
}

// Stop sends SIGTERM to the process group, then SIGKILL after the grace period, and
// waits for the process to exit. Stopping a process that has exited is not an error.
func (p *Proc) Stop() error {
	p.stop.Do(func() { signalAndWait([]*Proc{p}, p.grace) })
	<-p.done
	return nil
}

// stopAll stops processes together, so Close waits one grace period, not one each.
func stopAll(procs []*Proc, grace time.Duration) {
	var todo []*Proc
	for _, p := range procs {
		p.stop.Do(func() { todo = append(todo, p) })
	}
	signalAndWait(todo, grace)
	for _, p := range procs {
		<-p.done
	}
}

func signalAndWait(procs []*Proc, grace time.Duration) {
	for _, p := range procs {
		// The negative pid addresses the group, so children die too.
		unix.Kill(-p.PID(), unix.SIGTERM)
	}
	deadline := time.After(grace)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
		}
	}
	groups := map[int]bool{}
	for _, p := range procs {
		unix.Kill(-p.PID(), unix.SIGKILL)
		groups[p.PID()] = true
	}
	// The leader's exit does not mean its children are gone: a child killed with the
	// group may still be tearing down, inside the pod's namespace, when Stop returns.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && groupsAlive(groups); {
		time.Sleep(5 * time.Millisecond)
	}
}

// groupsAlive reports whether a process of one of the process groups has not yet
// exited (a zombie has: it holds no namespace and waits only to be reaped).
func groupsAlive(groups map[int]bool) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// From field 3 on: state, ppid, pgrp.
		fields, ok := owner.StatFields(stat)
		if !ok || len(fields) < 3 || fields[0] == "Z" || fields[0] == "X" {
			continue
		}
		if pgrp, err := strconv.Atoi(fields[2]); err == nil && groups[pgrp] {
			return true
		}
	}
	return false
}

// Start runs a long-lived process in the pod's namespace as spec.UID (through
// `ip netns exec` and setpriv, so the pod's /etc/hosts applies), in its own process
// group, with stdout and stderr appended to a log file. With spec.Ready set, Start
// returns once Ready succeeds, and fails if the process exits or the start times out.
func (tb *Testbed) Start(ctx context.Context, p topology.Pod, spec substrate.ProcessSpec) (substrate.Process, error) {
	return tb.StartProc(ctx, p, spec)
}

// StartProc is Start returning the concrete type.
func (tb *Testbed) StartProc(ctx context.Context, p topology.Pod, spec substrate.ProcessSpec) (*Proc, error) {
	if len(spec.Argv) == 0 {
		return nil, fmt.Errorf("testbed: start %q: empty argv", spec.Name)
	}
	if err := checkDNSLabel("process name", spec.Name); err != nil {
		return nil, err
	}
	t, err := tb.resolveTarget(p)
	if err != nil {
		return nil, err
	}
	tb.mu.Lock()
	for _, other := range tb.procs {
		if other.pod == t.name && other.spec.Name == spec.Name {
			select {
			case <-other.done:
			default:
				tb.mu.Unlock()
				return nil, fmt.Errorf("testbed: pod %s already runs a process named %q", t.name, spec.Name)
			}
		}
	}
	tb.mu.Unlock()

	logDir := filepath.Join(tb.runDir, "logs")
	if tb.opts.LogDir != "" {
		logDir = tb.opts.LogDir
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			return nil, fmt.Errorf("testbed: %w", err)
		}
	}
	logPath := filepath.Join(logDir, t.name+"."+spec.Name+".log")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	defer logFile.Close()

	args := []string{"netns", "exec", t.ns.name}
	if spec.UID != 0 {
		uid := strconv.Itoa(spec.UID)
		args = append(args, "setpriv", "--reuid="+uid, "--regid="+uid, "--clear-groups", "--")
	}
	args = append(args, spec.Argv...)
	// Not CommandContext: the process outlives the call; Stop and Close end it.
	cmd := exec.Command("ip", args...)
	cmd.Dir = t.dir
	cmd.Env = append([]string{"PATH=" + processPath, "HOME=" + t.dir, "POD_NAME=" + t.name, "POD_IP=" + t.ip.String()}, spec.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testbed: %s: start %s: %w", t.name, spec.Name, err)
	}
	proc := &Proc{spec: spec, pod: t.name, logPath: logPath, cmd: cmd, grace: tb.opts.StopGrace, done: make(chan struct{})}
	go func() {
		proc.waitErr = cmd.Wait()
		close(proc.done)
	}()
	tb.mu.Lock()
	closed := tb.closed
	tb.procs = append(tb.procs, proc)
	tb.mu.Unlock()
	if closed { // Close ran meanwhile and did not see this process
		proc.Stop()
		return nil, fmt.Errorf("testbed %s is closed", tb.id)
	}
	if spec.Ready == nil {
		return proc, nil
	}
	if err := waitReady(ctx, proc, tb.opts.StartTimeout); err != nil {
		proc.Stop()
		return nil, fmt.Errorf("testbed: %s: %s not ready: %w%s", t.name, spec.Name, err, logTail(logPath))
	}
	return proc, nil
}

func waitReady(ctx context.Context, p *Proc, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wait := 5 * time.Millisecond
	for {
		err := p.spec.Ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("process exited (%v)", p.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("%w (last check: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// logTail returns the end of a log for error messages.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return ""
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return "\nlog " + path + ":\n" + string(data)
}

// Processes lists every process started so far.
func (tb *Testbed) Processes() []substrate.Process {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	out := make([]substrate.Process, len(tb.procs))
	for i, p := range tb.procs {
		out[i] = p
	}
	return out
}

// File ownership for WriteFile: owner ProxyUID, group WorkloadUID (the gid workload
// processes run with). So mode 0600 is readable by the proxy only, 0640 by the proxy
// and the workload, 0644 by everyone.
const (
	fileUID = substrate.ProxyUID
	fileGID = substrate.WorkloadUID
)

// WriteFile stores a file under the pod's directory in the run dir (name may contain
// sub-directories) and returns its absolute path. See fileUID for who can read it.
func (tb *Testbed) WriteFile(p topology.Pod, name string, data []byte, mode uint32) (string, error) {
	t, err := tb.resolveTarget(p)
	if err != nil {
		return "", err
	}
	clean := filepath.Clean(name)
	if name == "" || filepath.IsAbs(clean) || clean == "." || strings.HasPrefix(clean, "..") {
		return "", fmt.Errorf("testbed: WriteFile %q: name must be a relative path inside the pod directory", name)
	}
	path := filepath.Join(t.dir, clean)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("testbed: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return "", fmt.Errorf("testbed: %w", err)
	}
	_, werr := tmp.Write(data)
	err = errors.Join(werr, tmp.Chown(fileUID, fileGID), tmp.Chmod(os.FileMode(mode&0o7777)), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("testbed: WriteFile %s: %w", path, err)
	}
	return path, nil
}

// DialContextAs opens a TCP connection from inside the pod as if a process running as
// uid had opened it (see substrate.UIDDialer).
func (tb *Testbed) DialContextAs(ctx context.Context, p topology.Pod, uid int, network, addr string) (net.Conn, error) {
	if uid < 0 {
		return nil, fmt.Errorf("testbed: dial as uid %d: not a uid", uid)
	}
	if network != "tcp" && network != "tcp4" && network != "tcp6" {
		return nil, fmt.Errorf("testbed: dial as uid %d: %s: only TCP", uid, network)
	}
	t, err := tb.resolveTarget(p)
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("testbed: dial %s: %w", addr, err)
	}
	ip, err := tb.lookupHost(host, t)
	if err != nil {
		return nil, err
	}
	portNum, err := net.LookupPort(network, port)
	if err != nil {
		return nil, fmt.Errorf("testbed: dial %s: %w", addr, err)
	}
	conn, err := dialTCPInNetNSAs(ctx, t.ns.fd(), netip.AddrPortFrom(ip, uint16(portNum)), uid)
	if err != nil {
		return nil, fmt.Errorf("testbed: dial %s from %s as uid %d: %w", addr, t.name, uid, err)
	}
	return conn, nil
}

// ListenIn opens a TCP listener inside the pod's namespace (substrate.PodListener): the
// socket is created and bound on a thread that entered the namespace, and keeps that
// namespace for its life. addr is the local address ("" host: every address of the pod).
func (tb *Testbed) ListenIn(p topology.Pod, network, addr string) (net.Listener, error) {
	if network != "tcp" && network != "tcp4" {
		return nil, fmt.Errorf("testbed: listen in %s: %s: only TCP", p.Name, network)
	}
	t, err := tb.resolveTarget(p)
	if err != nil {
		return nil, err
	}
	var ln net.Listener
	err = inNetNS(t.ns.fd(), func() error {
		var lerr error
		ln, lerr = net.Listen(network, addr)
		return lerr
	})
	if err != nil {
		return nil, fmt.Errorf("testbed: listen on %s in %s: %w", addr, t.name, err)
	}
	return ln, nil
}

// DialContext opens a connection from inside the pod's namespace: the socket is created
// on a thread that entered the namespace, which costs two setns calls and no fork
// (see dialTCPInNetNS).
// Host names resolve the way the pod's /etc/hosts resolves them (services, the pod's
// own name, localhost); anything else must be an IP address.
func (tb *Testbed) DialContext(ctx context.Context, p topology.Pod, network, addr string) (net.Conn, error) {
	t, err := tb.resolveTarget(p)
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("testbed: dial %s: %w", addr, err)
	}
	ip, err := tb.lookupHost(host, t)
	if err != nil {
		return nil, err
	}
	portNum, err := net.LookupPort(network, port)
	if err != nil {
		return nil, fmt.Errorf("testbed: dial %s: %w", addr, err)
	}
	switch network {
	case "tcp", "tcp4", "tcp6":
		conn, err := dialTCPInNetNS(ctx, t.ns.fd(), netip.AddrPortFrom(ip, uint16(portNum)))
		if err != nil {
			return nil, fmt.Errorf("testbed: dial %s from %s: %w", addr, t.name, err)
		}
		return conn, nil
	}
	// An IP literal keeps the dialer from resolving names or racing addresses in other
	// goroutines, whose threads would not be in the namespace.
	target := net.JoinHostPort(ip.String(), port)
	var conn net.Conn
	err = inNetNS(t.ns.fd(), func() error {
		var d net.Dialer
		var derr error
		conn, derr = d.DialContext(ctx, network, target)
		return derr
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("testbed: dial %s from %s: %w", addr, t.name, err)
	}
	return conn, nil
}

func (tb *Testbed) lookupHost(host string, t target) (netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip, nil
	}
	if host == "localhost" {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1}), nil
	}
	if host == t.name {
		return t.ip, nil
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	ns := tb.opts.Namespace
	for _, s := range tb.services {
		switch host {
		case s.name, s.name + "." + ns, s.name + "." + ns + ".svc", s.name + "." + ns + ".svc.cluster.local":
			return s.vip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("testbed: %s: cannot resolve %q: not a service of this testbed", t.name, host)
}

// Sysctl sets sysctls of the pod's (or node's) network namespace only, e.g.
// {"net.ipv4.tcp_tw_reuse": "1"} for a load generator that opens a connection per
// request. Keys outside net.* are refused: they are not per-namespace and would change
// the host.
func (tb *Testbed) Sysctl(p topology.Pod, values map[string]string) error {
	t, err := tb.resolveTarget(p)
	if err != nil {
		return err
	}
	for key := range values {
		if !strings.HasPrefix(key, "net.") || strings.Contains(key, "/") || strings.Contains(key, "..") {
			return fmt.Errorf("testbed: sysctl %q: only net.* keys are per network namespace", key)
		}
	}
	if err := writeSysctl(t.ns.fd(), values); err != nil {
		return fmt.Errorf("testbed: %s: %w", t.name, err)
	}
	return nil
}
