package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshmark/meshmark/internal/owner"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Options shape a cluster.
type Options struct {
	Name  string // default DefaultName
	Nodes int    // default 2
	// Owned ties the cluster to this process: `meshmark clean` removes it once the
	// process is gone. Tests set it; `meshmark cluster up` does not, since its cluster
	// outlives the command.
	Owned bool
	// Kubeconfig is the file to merge the cluster's context into: empty means
	// $KUBECONFIG's first file, else ~/.kube/config; "-" merges nothing.
	Kubeconfig string
	// PauseBinary is the static executable the pods' sandbox image is made of (it must
	// wait for a signal when given "pause"): meshmark's in-pod binary.
	PauseBinary string
	// Images are loaded into every node besides the pause image and CoreDNS.
	Images []Image
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
	// Timeout bounds the whole bring-up; default 5 minutes.
	Timeout time.Duration
}

// Cluster is a running local cluster.
type Cluster struct {
	State *State
	// Kubeconfig is a file with the cluster's admin context only (named after the
	// cluster), apart from whichever kubeconfig the context was merged into.
	Kubeconfig string
	Server     string // https://127.0.0.1:PORT
	Took       time.Duration
}

// Client is an admin clientset for the cluster.
func (c *Cluster) Client() (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// bringup is the state of one `up`.
type bringup struct {
	opts  Options
	st    *State
	dir   string
	pki   *clusterPKI
	began time.Time
}

func (b *bringup) progress(format string, args ...any) {
	if b.opts.Progress != nil {
		fmt.Fprintf(b.opts.Progress, "[%5.1fs] %s\n", time.Since(b.began).Seconds(), fmt.Sprintf(format, args...))
	}
}

// Up brings a cluster up and waits until its nodes are ready and cluster DNS answers.
// On failure it takes down whatever it made, and the error carries the last lines of
// the logs of what failed.
func Up(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Minute
	}
	if err := checkName(opts.Name); err != nil {
		return nil, err
	}
	if opts.Nodes < 1 || opts.Nodes > MaxNodes {
		return nil, fmt.Errorf("--nodes %d: a local cluster has 1 to %d nodes", opts.Nodes, MaxNodes)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("cluster up needs root (network namespaces, mounts, cgroups)")
	}
	if missing := Missing(); len(missing) > 0 {
		return nil, fmt.Errorf("cluster up needs %s: run `meshmark setup --for cluster`", strings.Join(missing, ", "))
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	b := &bringup{opts: opts, dir: Dir(opts.Name), began: time.Now()}
	if _, err := os.Stat(b.dir); err == nil {
		return nil, fmt.Errorf("cluster %s exists (%s): `meshmark cluster down --name %s` removes it", opts.Name, b.dir, opts.Name)
	}
	b.st = &State{Name: opts.Name, Phase: PhaseStarting, Since: time.Now().UTC(), PIDs: map[string]int{}}
	// Until it is up, a cluster is its bring-up's: `meshmark clean` takes apart what a
	// killed `cluster up` left.
	if b.st.Owner, err = owner.Current(); err != nil {
		return nil, err
	}
	for i := 0; i < opts.Nodes; i++ {
		b.st.Nodes = append(b.st.Nodes, Node{Name: nodeName(opts.Name, i), NetNS: NodeNetNS(opts.Name, i),
			Address: nodeAddress(i).String(), PodCIDR: nodePodCIDR(i).String(), Bridge: bridgeName(i)})
	}
	if err := os.MkdirAll(filepath.Join(b.dir, "logs"), 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w%s", err, b.logTails())
			if derr := teardown(context.WithoutCancel(ctx), b.st, nil); derr != nil {
				err = errors.Join(err, fmt.Errorf("taking down what was made: %w", derr))
			}
			c = nil
		}
	}()
	if err := b.st.save(); err != nil {
		return nil, err
	}
	steps := []struct {
		what string
		do   func(context.Context) error
	}{
		{"cgroups", b.makeCgroups},
		{"network namespaces " + NetNS(opts.Name) + "{,.node0…}", func(ctx context.Context) error { return makeNetwork(ctx, b.st) }},
		{"certificates", b.makePKI},
		{"etcd and the API server", b.startAPIServer},
		{"controller manager, scheduler", b.startControllers},
		{"nodes", b.startNodes},
		{"images", b.loadImages},
		{"nodes ready", b.waitNodesReady},
		{"CoreDNS", b.startDNS},
	}
	for _, s := range steps {
		b.progress("%s", s.what)
		if err := s.do(ctx); err != nil {
			return nil, fmt.Errorf("cluster %s: %s: %w", opts.Name, s.what, err)
		}
		if err := b.st.save(); err != nil {
			return nil, err
		}
	}
	c = &Cluster{State: b.st, Kubeconfig: filepath.Join(b.dir, "kubeconfig"), Server: b.server()}
	if opts.Kubeconfig != "-" {
		path, err := mergeKubeconfig(opts.Kubeconfig, b.st.Name, c.Kubeconfig)
		if err != nil {
			return nil, err
		}
		b.st.Kubeconfig, b.st.Context = path, b.st.Name
		b.progress("context %s merged into %s", b.st.Name, path)
	}
	b.st.Phase = PhaseUp
	if !opts.Owned {
		b.st.Owner = owner.Owner{}
	}
	if err := b.st.save(); err != nil {
		return nil, err
	}
	c.Took = time.Since(b.began)
	return c, nil
}

// server is the API server as the host reaches it.
func (b *bringup) server() string { return "https://127.0.0.1:" + strconv.Itoa(b.st.APIPort) }

// inside is the API server as the cluster's components reach it.
func inside() string { return "https://" + nodeAddress(0).String() + ":" + strconv.Itoa(apiPort) }

func (b *bringup) makeCgroups(context.Context) error {
	cg, err := clusterCgroup(b.st.Name)
	if err != nil {
		return err
	}
	b.st.Cgroup = cg
	groups := []string{"control-plane"}
	for _, n := range b.st.Nodes {
		groups = append(groups, n.Name, n.Name+"-daemons")
	}
	for _, g := range groups {
		created, err := makeCgroup(filepath.Join(cg, g))
		b.st.CreatedCgroups = append(b.st.CreatedCgroups, created...)
		if err != nil {
			return err
		}
	}
	return nil
}

func (b *bringup) makePKI(context.Context) error {
	p, err := makePKI(filepath.Join(b.dir, "pki"), b.st.Nodes)
	if err != nil {
		return err
	}
	b.pki = p
	dir := filepath.Join(b.dir, "kubeconfigs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, c := range p.components {
		if _, err := p.kubeconfig(dir, name, inside(), c); err != nil {
			return err
		}
	}
	return nil
}

// daemon is a long-lived process of the cluster.
type daemon struct {
	name string
	argv []string
	env  []string
	// netns is the node's namespace the daemon runs in (node 0's when empty); cgroup
	// is below the cluster's; nodeOf, when set, is a node's first process, whose
	// network, mount and PID namespaces the daemon joins (a kubelet).
	netns  string
	cgroup string
	nodeOf int
	// extra are files the daemon inherits from descriptor 3 on.
	extra []*os.File
}

// start starts a daemon inside a node's network namespace, in its own session (a
// Ctrl-C of `cluster up` must not reach it) and born into the cluster's cgroup, where
// down and clean find it whatever becomes of its parent.
func (b *bringup) start(d daemon) (int, error) {
	ns := d.netns
	if ns == "" {
		ns = b.st.Nodes[0].NetNS
	}
	args := []string{"--net=" + netnsPath(ns)}
	if d.nodeOf != 0 {
		args = []string{fmt.Sprintf("--target=%d", d.nodeOf), "--net", "--mount", "--pid"}
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return 0, err
	}
	logf, err := os.OpenFile(b.logPath(d.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command(nsenter, append(append(args, "--"), d.argv...)...)
	cmd.Env = append(os.Environ(), d.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = d.extra
	cg := filepath.Join(b.st.Cgroup, d.cgroup)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if fd, err := os.Open(filepath.Join(cgroupFS, "unified", cg)); err == nil {
		defer fd.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(fd.Fd())
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", d.name, err)
	}
	pid := cmd.Process.Pid
	// Reap it if it ends while this process lives; otherwise init does.
	go func() { _ = cmd.Wait() }()
	b.st.PIDs[d.name] = pid
	if err := joinCgroup(cg, pid); err != nil {
		return pid, err
	}
	return pid, nil
}

func (b *bringup) logPath(name string) string { return filepath.Join(b.dir, "logs", name+".log") }

// alive fails when a daemon has ended, so that a wait gives up at once with its log.
func (b *bringup) alive(names ...string) error {
	for _, n := range names {
		pid := b.st.PIDs[n]
		if pid == 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); err != nil {
			return fmt.Errorf("%s exited (log: %s)", n, b.logPath(n))
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(st), ") Z ") {
			return fmt.Errorf("%s exited (log: %s)", n, b.logPath(n))
		}
	}
	return nil
}

// waitFor polls f until it succeeds, a watched daemon ends, or ctx ends.
func (b *bringup) waitFor(ctx context.Context, what string, watch []string, f func() error) error {
	var last error
	for {
		if err := b.alive(watch...); err != nil {
			return err
		}
		if last = f(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (b *bringup) startAPIServer(ctx context.Context) error {
	etcd, err := lookPath("etcd")
	if err != nil {
		return err
	}
	if _, err := b.start(daemon{name: "etcd", cgroup: "control-plane", argv: []string{etcd,
		"--data-dir", filepath.Join(b.dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380", "--listen-metrics-urls", "http://127.0.0.1:2381",
		// A test cluster is thrown away, not recovered: no fsync.
		"--unsafe-no-fsync"}}); err != nil {
		return err
	}
	apiserver, err := lookPath("kube-apiserver")
	if err != nil {
		return err
	}
	p := b.pki
	if _, err := b.start(daemon{name: "kube-apiserver", cgroup: "control-plane", argv: []string{apiserver,
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--advertise-address", nodeAddress(0).String(),
		"--secure-port", strconv.Itoa(apiPort),
		"--tls-cert-file", p.apiserver.cert, "--tls-private-key-file", p.apiserver.key,
		"--client-ca-file", p.caCert,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p.saPub, "--service-account-signing-key-file", p.saKey,
		"--api-audiences", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", servicePrefix.String(),
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true",
		// Debian's etcd is 3.4; over it the watch cache fell behind by seconds (see
		// the paper-only test cluster), and every controller waited for its own writes.
		"--watch-cache=false",
		"--kubelet-preferred-address-types", "InternalIP",
		"--kubelet-client-certificate", p.apiserverKubelet.cert, "--kubelet-client-key", p.apiserverKubelet.key,
		"--cert-dir", filepath.Join(b.dir, "apiserver-certs")}}); err != nil {
		return err
	}
	// The host reaches the API server only through a loopback port: a listener opened
	// here, in the host's namespace, and served by a forwarder inside the cluster's.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	lf, err := ln.(*net.TCPListener).File()
	ln.Close()
	if err != nil {
		return err
	}
	defer lf.Close()
	b.st.APIPort = ln.Addr().(*net.TCPAddr).Port
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if _, err := b.start(daemon{name: "api-forwarder", cgroup: "control-plane", argv: []string{self},
		env:   []string{roleEnv + "=" + roleForward, forwardToEnv + "=" + net.JoinHostPort(nodeAddress(0).String(), strconv.Itoa(apiPort))},
		extra: []*os.File{lf}}); err != nil {
		return err
	}
	if err := writeAdminKubeconfig(filepath.Join(b.dir, "kubeconfig"), b.st.Name, b.server(), p); err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.caPEM)
	cert, err := tls.LoadX509KeyPair(p.admin.cert, p.admin.key)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	return b.waitFor(ctx, "the API server to be ready", []string{"etcd", "kube-apiserver", "api-forwarder"}, func() error {
		resp, err := hc.Get(b.server() + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return fmt.Errorf("readyz: %s: %s", resp.Status, body)
		}
		return nil
	})
}

func (b *bringup) startControllers(ctx context.Context) error {
	kc := func(name string) string { return filepath.Join(b.dir, "kubeconfigs", name+".conf") }
	cm, err := lookPath("kube-controller-manager")
	if err != nil {
		return err
	}
	if _, err := b.start(daemon{name: "kube-controller-manager", cgroup: "control-plane", argv: []string{cm,
		"--kubeconfig", kc("controller-manager"), "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", "10257",
		"--service-account-private-key-file", b.pki.saKey, "--root-ca-file", b.pki.caCert,
		"--cluster-signing-cert-file", b.pki.caCert, "--cluster-signing-key-file", b.pki.caKey,
		"--use-service-account-credentials=true",
		// Pods get addresses from each node's own range (host-local IPAM), not from
		// node CIDRs the controller would hand out.
		"--controllers", "*,-nodeipam",
		"--kube-api-qps", "100", "--kube-api-burst", "200"}}); err != nil {
		return err
	}
	sched, err := lookPath("kube-scheduler")
	if err != nil {
		return err
	}
	_, err = b.start(daemon{name: "kube-scheduler", cgroup: "control-plane", argv: []string{sched,
		"--kubeconfig", kc("scheduler"), "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", "10259"}})
	return err
}

// startNodes starts each node: its first process (nodeRole), which prepares the
// node's mount namespace and runs its containerd; its kubelet, in the node's network,
// mount and PID namespaces; and its kube-proxy, in its network namespace, as every
// node of a cluster runs one.
func (b *bringup) startNodes(ctx context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return err
	}
	kubelet, err := lookPath("kubelet")
	if err != nil {
		return err
	}
	proxy, err := lookPath("kube-proxy")
	if err != nil {
		return err
	}
	for _, n := range b.st.Nodes {
		nodeDir := filepath.Join(b.dir, "nodes", n.Name)
		cgroupRoot := filepath.Join(b.st.Cgroup, n.Name)
		if err := writeNodeFiles(n, nodeDir, cgroupRoot, b.pki.caCert); err != nil {
			return err
		}
		name := n.Name + "-node"
		// unshare forks the node's first process into the new PID namespace, with a
		// /proc of its own, and kills it should unshare itself be killed.
		pid, err := b.start(daemon{name: name, netns: n.NetNS, cgroup: n.Name + "-daemons",
			argv: []string{unshare, "--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "--propagation", "private", self},
			env:  []string{roleEnv + "=" + roleNode, clusterDirEnv + "=" + b.dir, nodeDirEnv + "=" + nodeDir}})
		if err != nil {
			return err
		}
		var first int
		if err := b.waitFor(ctx, name+"'s containerd", []string{name}, func() error {
			if first == 0 {
				if first, err = firstChild(pid); err != nil {
					return err
				}
			}
			c, err := net.Dial("unix", containerdSocket(nodeDir))
			if err == nil {
				c.Close()
			}
			return err
		}); err != nil {
			return err
		}
		if _, err := b.start(daemon{name: n.Name + "-kubelet", cgroup: n.Name + "-daemons", nodeOf: first, argv: []string{kubelet,
			"--config", filepath.Join(nodeDir, "kubelet.yaml"),
			"--kubeconfig", filepath.Join(b.dir, "kubeconfigs", n.Name+".conf"),
			"--hostname-override", n.Name, "--node-ip", n.Address,
			"--node-labels", NodeLabel + "=" + b.st.Name}}); err != nil {
			return err
		}
		cfg := filepath.Join(nodeDir, "kube-proxy.yaml")
		if err := os.WriteFile(cfg, []byte(kubeProxyConfig(filepath.Join(b.dir, "kubeconfigs", "kube-proxy.conf"), n)), 0o600); err != nil {
			return err
		}
		if _, err := b.start(daemon{name: n.Name + "-kube-proxy", netns: n.NetNS, cgroup: n.Name + "-daemons",
			argv: []string{proxy, "--config", cfg}}); err != nil {
			return err
		}
	}
	return nil
}

// firstChild is the child unshare forked: the node's first process.
func firstChild(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("unshare (pid %d) has not forked yet", pid)
	}
	return strconv.Atoi(f[0])
}

func (b *bringup) client() (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(b.dir, "kubeconfig"))
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = 50, 100
	return kubernetes.NewForConfig(rc)
}

func (b *bringup) daemons() []string {
	var out []string
	for name := range b.st.PIDs {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

func (b *bringup) waitNodesReady(ctx context.Context) error {
	client, err := b.client()
	if err != nil {
		return err
	}
	return b.waitFor(ctx, "every node Ready", b.daemons(), func() error {
		var notReady []string
		for _, n := range b.st.Nodes {
			node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				notReady = append(notReady, n.Name+" (not registered)")
				continue
			}
			ready := false
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					ready = c.Status == corev1.ConditionTrue
					if !ready {
						notReady = append(notReady, n.Name+" ("+c.Message+")")
					}
				}
			}
			if !ready && len(notReady) == 0 {
				notReady = append(notReady, n.Name)
			}
		}
		if len(notReady) > 0 {
			return fmt.Errorf("not ready: %s", strings.Join(notReady, ", "))
		}
		return nil
	})
}

// logTails is the end of every daemon's log, for an error.
func (b *bringup) logTails() string {
	var sb strings.Builder
	for _, name := range b.daemons() {
		data, _ := os.ReadFile(b.logPath(name))
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 6 {
			lines = lines[len(lines)-6:]
		}
		fmt.Fprintf(&sb, "\n--- %s (last lines of %s)\n%s", name, b.logPath(name), strings.Join(lines, "\n"))
	}
	return sb.String()
}
