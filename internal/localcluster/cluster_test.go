package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/meshmark/meshmark/internal/image"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) {
	RunRole()
	os.Exit(m.Run())
}

// needCluster skips a test that needs root and the cluster's binaries, or, under CI,
// fails it: CI installs them, so their absence there is a failure.
func needCluster(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if missing := Missing(); len(missing) > 0 {
		msg := fmt.Sprintf("a local cluster needs %s: run `meshmark setup --for cluster`", strings.Join(missing, ", "))
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// podBinary builds meshmark's in-pod binary, which the pause image and the test's
// pods are made of.
func podBinary(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "meshmark-pod")
	cmd := exec.Command("go", "build", "-o", out, "github.com/meshmark/meshmark/cmd/meshmark-pod")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build meshmark-pod: %v\n%s", err, b)
	}
	return out
}

// podImage is meshmark's image as the Kubernetes examples name it.
func podImage(bin string) Image {
	return Image{Name: "meshmark:dev", Build: func() (v1.Image, error) {
		return image.Build(image.Options{Binary: bin})
	}}
}

// TestUpRunsPodsOnEveryNodeAndDownLeavesTheHostAsItWas brings a two-node cluster up,
// runs a service on each node and a client that calls both by their cluster names,
// and takes the cluster down. Throughout, the host's kernel settings, network,
// mounts and cgroups stay as they were, and afterwards nothing of the cluster is left.
func TestUpRunsPodsOnEveryNodeAndDownLeavesTheHostAsItWas(t *testing.T) {
	needCluster(t)
	bin := podBinary(t)
	before := snapshotHost(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	ctx := context.Background()
	name := fmt.Sprintf("mmtest-%d", os.Getpid()%100000)
	var progress strings.Builder
	c, err := Up(ctx, Options{Name: name, Nodes: 2, Owned: true, Kubeconfig: kubeconfig, PauseBinary: bin,
		Images: []Image{podImage(bin)}, Progress: &progress})
	if err != nil {
		t.Fatalf("up: %v\nprogress:\n%s", err, progress.String())
	}
	t.Logf("up in %s:\n%s", c.Took, progress.String())
	downed := false
	defer func() {
		if !downed {
			_ = Down(ctx, name, nil)
		}
	}()

	during := snapshotHost(t)
	// The cluster's own namespaces are the changes it may make to the host while up, with
	// the directory that holds its state and its cgroup (in every hierarchy, under the
	// caller's memory cgroup's path, whose parents up may have had to create: down
	// removes them, which the last check holds it to).
	if d := filterDiff(before.diff(during), "netns", "exists "+StateRoot, "mounts", "cgroups "); len(d) > 0 {
		t.Errorf("the host changed while the cluster is up:\n%s", strings.Join(d, "\n"))
	}
	if !strings.Contains(during["netns"], NetNS(name)) {
		t.Errorf("no namespace %s among %s", NetNS(name), during["netns"])
	}

	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CurrentContext != name || cfg.Contexts[name] == nil {
		t.Errorf("kubeconfig %s: current context %q, contexts %v; want %s merged and current", kubeconfig, cfg.CurrentContext, cfg.Contexts, name)
	}
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 2 {
		t.Fatalf("%d nodes, want 2", len(nodes.Items))
	}
	for _, n := range nodes.Items {
		if v := n.Status.NodeInfo.KubeletVersion; v == "" || !strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") {
			t.Errorf("node %s: kubelet %q, runtime %q", n.Name, v, n.Status.NodeInfo.ContainerRuntimeVersion)
		}
	}
	servePodsOnEveryNode(ctx, t, client, c.State.Nodes)

	// A second look at the kernel settings, after the kubelets have run a while.
	if d := filterDiff(before.diff(snapshotHost(t)), "netns", "exists "+StateRoot, "mounts", "cgroups "); len(d) > 0 {
		t.Errorf("the host changed while pods ran:\n%s", strings.Join(d, "\n"))
	}

	if err := Down(ctx, name, nil); err != nil {
		t.Fatalf("down: %v", err)
	}
	downed = true
	if d := before.diff(snapshotHost(t)); len(d) > 0 {
		t.Errorf("down left the host changed:\n%s", strings.Join(d, "\n"))
	}
	if cfg, err := clientcmd.LoadFromFile(kubeconfig); err != nil || cfg.Contexts[name] != nil || cfg.CurrentContext == name {
		t.Errorf("kubeconfig after down: %v, %+v", err, cfg)
	}
	if _, err := os.Stat(Dir(name)); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", Dir(name), err)
	}
}

// filterDiff drops the lines about the named keys.
// filterDiff leaves out the differences of the given keys; a key ending in a space
// stands for every key it begins (one per cgroup hierarchy).
func filterDiff(lines []string, keys ...string) []string {
	var out []string
next:
	for _, l := range lines {
		for _, k := range keys {
			if strings.HasPrefix(l, k+":") || strings.HasSuffix(k, " ") && strings.HasPrefix(l, k) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

// servePodsOnEveryNode runs meshmark's workload service pinned to each node, behind a
// Service of its own, and a plaintext probe pod on the first node that calls both by
// their cluster DNS names: it reaches the other node's pod through kube-proxy and the
// routes between the nodes' bridges, and its own node's pod through the bridge.
func servePodsOnEveryNode(ctx context.Context, t *testing.T, client kubernetes.Interface, nodes []Node) {
	t.Helper()
	const ns = "default"
	var targets []string
	for i, n := range nodes {
		svc := fmt.Sprintf("echo%d", i)
		labels := map[string]string{"app": svc}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{
				NodeName: n.Name,
				Containers: []corev1.Container{{
					Name: "app", Image: "meshmark:dev", ImagePullPolicy: corev1.PullNever,
					Args:  []string{"service", "--graph", "chain-1", "--service", "svc-0", "--listen", ":8080"},
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				}},
			},
		}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: ns},
			Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		targets = append(targets, "--target", fmt.Sprintf("%s=%s.%s.svc.cluster.local:80", svc, svc, ns))
	}
	for i, n := range nodes {
		waitPod(ctx, t, client, ns, fmt.Sprintf("echo%d", i), func(p *corev1.Pod) bool {
			if p.Spec.NodeName != n.Name {
				t.Fatalf("pod %s on %s, want %s", p.Name, p.Spec.NodeName, n.Name)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true
				}
			}
			return p.Status.Phase == corev1.PodRunning
		})
	}
	// kube-proxy rejects a Service's traffic until it has programmed its endpoints, a
	// moment after the EndpointSlice says they are ready; a refusal then is that lag, so
	// the probe runs again, a few times.
	for i := range nodes {
		waitEndpoints(ctx, t, client, ns, fmt.Sprintf("echo%d", i))
	}
	var report []meshprobe.PlaintextProbe
	for attempt := 1; ; attempt++ {
		report = probeOnce(ctx, t, client, ns, fmt.Sprintf("probe-%d", attempt), nodes[0].Name, targets)
		if len(report) != len(nodes) {
			t.Fatalf("the probe reported %d services, want %d: %+v", len(report), len(nodes), report)
		}
		if attempt == 5 || !slices.ContainsFunc(report, func(r meshprobe.PlaintextProbe) bool { return r.Refused }) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	for _, r := range report {
		if r.Refused {
			t.Errorf("service %s did not answer the probe: %s", r.Service, r.Observed)
		}
	}
}

// probeOnce runs meshmark's plaintext probe in a pod on node and returns its report.
func probeOnce(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name, node string, targets []string) []meshprobe.PlaintextProbe {
	t.Helper()
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "probe", Image: "meshmark:dev", ImagePullPolicy: corev1.PullNever,
				Args: append([]string{"plaintext-probe", "--message-file", "/dev/termination-log"}, targets...),
			}},
		},
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(ctx, t, client, ns, name, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	msg := ""
	for _, cs := range p.Status.ContainerStatuses {
		if term := cs.State.Terminated; term != nil {
			msg = term.Message
		}
	}
	var report []meshprobe.PlaintextProbe
	if err := json.Unmarshal([]byte(msg), &report); err != nil {
		t.Fatalf("the probe's report %q: %v", msg, err)
	}
	return report
}

// waitEndpoints waits until the Service's EndpointSlices hold a ready endpoint.
func waitEndpoints(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, svc string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + svc})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s has no ready endpoint after a minute", svc)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitPod(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name string, done func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && done(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s: not done after 2 minutes: %v %+v", ns, name, err, p.Status)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestCleanTakesApartAClusterWhoseOwnerDied makes a cluster look as a killed test
// leaves it (its owner gone) and checks that Clean removes it, and that it leaves a
// cluster that `cluster up` finished.
func TestCleanTakesApartAClusterWhoseOwnerDied(t *testing.T) {
	needCluster(t)
	bin := podBinary(t)
	before := snapshotHost(t)
	ctx := context.Background()
	name := fmt.Sprintf("mmclean-%d", os.Getpid()%100000)
	if _, err := Up(ctx, Options{Name: name, Nodes: 1, Owned: true, Kubeconfig: "-", PauseBinary: bin}); err != nil {
		t.Fatal(err)
	}
	defer Down(ctx, name, nil)

	// A cluster `cluster up` finished has no owner and stays.
	st, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	owner := st.Owner
	st.Owner.PID = 0
	if err := st.save(); err != nil {
		t.Fatal(err)
	}
	cleaned, err := Clean(ctx, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := find(cleaned, name); c == nil || c.Removed {
		t.Fatalf("clean: %+v; want %s kept", cleaned, name)
	}

	// A process that has exited stands for the dead owner.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	st.Owner = owner
	st.Owner.PID = dead.Process.Pid
	if err := st.save(); err != nil {
		t.Fatal(err)
	}
	pids, _ := cgroupPIDs(st.Cgroup)
	cleaned, err = Clean(ctx, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := find(cleaned, name); c == nil || !c.Removed {
		t.Fatalf("clean: %+v; want %s removed", cleaned, name)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil && running(pid) {
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Errorf("process %d of the cluster still runs: %s (%s)", pid, strings.TrimSpace(string(stat)), strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	if d := before.diff(snapshotHost(t)); len(d) > 0 {
		t.Errorf("clean left the host changed:\n%s", strings.Join(d, "\n"))
	}
}

func find(cs []Cleaned, name string) *Cleaned {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}
