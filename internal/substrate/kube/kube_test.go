package kube

// These tests run against a real control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler) with kwok in place of the kubelets: see
// package kubetest. What cannot happen on it is said where it matters: no container
// starts, so readiness here is kwok's word, and nothing is measured. The tests whose
// subject is a pod, a wait on a kubelet's word or a load generator run on real nodes
// instead (realnodes_test.go).

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/localcluster"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/meshmark/meshmark/internal/workload"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes"
)

var cluster *kubetest.Cluster

func TestMain(m *testing.M) {
	localcluster.RunRole()
	// A child that deploys and is killed, for TestCleanRemovesAKilledRun.
	if os.Getenv("MESHMARK_KUBE_TEST_CHILD") != "" {
		os.Exit(deployAndHang())
	}
	if os.Getenv("MESHMARK_KUBE_TEST_INSTALL") != "" {
		os.Exit(installAndHang())
	}
	if missing, how := kubetest.Missing(); len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "kube tests on paper skipped: %s missing (%s)\n", strings.Join(missing, ", "), how)
		os.Exit(kubetest.Main(m))
	}
	dir, err := os.MkdirTemp("", "meshmark-kubetest-")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	// The third node's kubelet resource metrics cannot be read (TestResourcesPerRoleFromKubeletMetrics).
	cluster, err = kubetest.Start(ctx, dir, kubetest.Options{Nodes: 3, NoResourceMetrics: []int{2}})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test cluster:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	observeRequest = holdToCheckedRights
	code := kubetest.Main(m) // takes the real nodes' cluster down too, if a test used it
	cluster.Stop()
	os.RemoveAll(dir)
	if code == 0 && len(unchecked) > 0 {
		// Every request meshmark's code made in these tests must be one whose right it
		// asks the API server for before anything is created (neededRights at connect,
		// InstallRights before a mesh): otherwise an RBAC denial would stop a run half-way.
		fmt.Fprintln(os.Stderr, "FAIL: requests made without their right being checked first (add them to neededRights or meshRights):")
		for _, u := range slices.Sorted(maps.Keys(unchecked)) {
			fmt.Fprintf(os.Stderr, "  %s (e.g. %s)\n", u, unchecked[u])
		}
		code = 1
	}
	os.Exit(code)
}

// unchecked collects, by right, a request meshmark's clients made whose right the
// Cluster had not checked (holdToCheckedRights).
var (
	uncheckedMu sync.Mutex
	unchecked   = map[string]string{}
	requestInfo = &apirequest.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
)

// holdToCheckedRights reads each request as the API server's authorizer would (verb,
// group, resource, subresource) and records it when its Cluster did not check that
// right: the derivation of what meshmark needs from what it does.
func holdToCheckedRights(c *Cluster, req *http.Request) {
	info, err := requestInfo.NewRequestInfo(req)
	if err != nil || !info.IsResourceRequest || info.Resource == "selfsubjectaccessreviews" {
		return // discovery and the rights check itself need no right
	}
	ra := authv1.ResourceAttributes{Verb: info.Verb, Group: info.APIGroup, Resource: info.Resource, Subresource: info.Subresource}
	if c != nil && c.hasChecked(ra) {
		return
	}
	uncheckedMu.Lock()
	defer uncheckedMu.Unlock()
	if _, seen := unchecked[rightKey(ra)]; !seen {
		unchecked[rightKey(ra)] = req.Method + " " + req.URL.Path
	}
}

func needCluster(t *testing.T) {
	t.Helper()
	if cluster == nil {
		missing, how := kubetest.Missing()
		t.Skipf("no test cluster: %s missing (%s)", strings.Join(missing, ", "), how)
	}
}

func connect(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	cfg.Kubeconfig = cluster.Kubeconfig
	if cfg.Image == "" {
		cfg.Image = "registry.example/meshmark:test"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
	c, err := Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func bookinfoSpec(t *testing.T, run string) AppSpec {
	t.Helper()
	g, err := workload.Builtin("bookinfo")
	if err != nil {
		t.Fatal(err)
	}
	return AppSpec{
		Run: run, Mesh: "baseline",
		Deployments: g.Deployments(),
		Args:        func(d workload.Deployment) []string { return g.ServiceArgs(d, PodNameArg) },
		Files:       map[string][]byte{"graph.yaml": []byte("name: test\n")},
	}
}

// labelled lists every object of the kinds a run creates that carry the run's label,
// in every namespace.
func labelled(t *testing.T, run string) []string {
	t.Helper()
	client, err := cluster.Client()
	if err != nil {
		t.Fatal(err)
	}
	return labelledIn(t, client, run)
}

// labelledIn is labelled on the cluster of client.
func labelledIn(t *testing.T, client kubernetes.Interface, run string) []string {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: RunLabel + "=" + run}
	var out []string
	nss, err := client.CoreV1().Namespaces().List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range nss.Items {
		out = append(out, "namespace/"+x.Name)
	}
	deps, err := client.AppsV1().Deployments("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range deps.Items {
		out = append(out, "deployment/"+x.Namespace+"/"+x.Name)
	}
	rss, err := client.AppsV1().ReplicaSets("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range rss.Items {
		out = append(out, "replicaset/"+x.Namespace+"/"+x.Name)
	}
	pods, err := client.CoreV1().Pods("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range pods.Items {
		out = append(out, "pod/"+x.Namespace+"/"+x.Name)
	}
	svcs, err := client.CoreV1().Services("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range svcs.Items {
		out = append(out, "service/"+x.Namespace+"/"+x.Name)
	}
	cms, err := client.CoreV1().ConfigMaps("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range cms.Items {
		out = append(out, "configmap/"+x.Namespace+"/"+x.Name)
	}
	return out
}

func countEndpoints(slices []discoveryv1.EndpointSlice) int {
	n := 0
	for _, s := range slices {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				n++
			}
		}
	}
	return n
}

func TestConnectErrors(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	dir := t.TempDir()
	garbled := filepath.Join(dir, "garbled")
	if err := os.WriteFile(garbled, []byte("apiVersion: v1\nclusters: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	unreachable := filepath.Join(dir, "unreachable")
	// Port 1 on loopback: nothing listens there, so the connection is refused at once.
	old := string(kc)
	i := strings.Index(old, "server: ")
	j := strings.Index(old[i:], "\n")
	if err := os.WriteFile(unreachable, []byte(old[:i]+"server: https://127.0.0.1:1"+old[i+j:]), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"no file", Config{Kubeconfig: filepath.Join(dir, "nope")}, []string{"kubeconfig " + filepath.Join(dir, "nope"), "no such file"}},
		{"garbled", Config{Kubeconfig: garbled}, []string{"kubeconfig " + garbled}},
		{"no such context", Config{Kubeconfig: cluster.Kubeconfig, Context: "prod"}, []string{`has no context "prod" (contexts: admin, viewer)`}},
		{"unreachable", Config{Kubeconfig: unreachable}, []string{"cluster https://127.0.0.1:1 (context admin) does not answer", "connection refused"}},
		{"rbac", Config{Kubeconfig: cluster.Kubeconfig, Context: cluster.ViewerContext}, []string{"RBAC denies this user, for a run: create namespaces, get namespaces, list namespaces, delete namespaces, create deployments.apps"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Connect(ctx, tc.cfg)
			if err == nil {
				t.Fatal("connected")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// deployAndHang is the killed run: it deploys, says so on stdout, and waits to be killed.
func deployAndHang() int {
	c, err := Connect(context.Background(), Config{
		Kubeconfig: os.Getenv("MESHMARK_KUBE_TEST_KUBECONFIG"), Image: "registry.example/meshmark:test",
	})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	app, err := c.Deploy(context.Background(), AppSpec{
		Run: os.Getenv("MESHMARK_KUBE_TEST_CHILD"), Mesh: "baseline",
		Deployments: []workload.Deployment{{Service: "web", Version: "v1", Replicas: 2, Port: 8080}},
		Args:        func(workload.Deployment) []string { return []string{"service"} },
	})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("deployed", app.Namespace)
	time.Sleep(time.Hour)
	return 0
}

func TestCleanRemovesAKilledRun(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "MESHMARK_KUBE_TEST_CHILD=0badf0", "MESHMARK_KUBE_TEST_KUBECONFIG="+cluster.Kubeconfig)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 256)
	n, _ := out.Read(line)
	if !strings.HasPrefix(string(line[:n]), "deployed meshmark-0badf0-baseline") {
		_ = cmd.Process.Kill()
		t.Fatalf("child: %q", line[:n])
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	// A live run of this process, which clean must leave alone.
	c := connect(t, Config{})
	live, err := c.Deploy(ctx, AppSpec{
		Run: "11ve00", Mesh: "baseline",
		Deployments: []workload.Deployment{{Service: "web", Version: "v1", Replicas: 1, Port: 8080}},
		Args:        func(workload.Deployment) []string { return []string{"service"} },
	})
	t.Cleanup(func() { _ = c.Teardown(context.Background(), live) })
	if err != nil {
		t.Fatal(err)
	}
	report, err := c.Clean(ctx, CleanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]CleanedNamespace{}
	for _, ns := range report {
		got[ns.Name] = ns
	}
	if k := got["meshmark-0badf0-baseline"]; !k.Removed || k.Run != "0badf0" {
		t.Errorf("killed run's namespace: %+v", k)
	}
	if l := got["meshmark-11ve00-baseline"]; l.Removed || !strings.Contains(l.Kept, "is alive") {
		t.Errorf("live run's namespace: %+v", l)
	}
	if left := labelled(t, "0badf0"); len(left) > 0 {
		t.Errorf("clean left %v", left)
	}
	if left := labelled(t, "11ve00"); len(left) == 0 {
		t.Error("clean removed the live run")
	}
	// --all, limited to one run, takes the live one too.
	if _, err := c.Clean(ctx, CleanOptions{All: true, Runs: []string{"11ve00"}}); err != nil {
		t.Fatal(err)
	}
	if left := labelled(t, "11ve00"); len(left) > 0 {
		t.Errorf("clean --all left %v", left)
	}
}

func TestDescribeRecordsTheCluster(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{})
	cp, err := c.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cp.ServerVersion, "v1.") || len(cp.Nodes) != len(cluster.Nodes) || cp.Server != c.Server {
		t.Errorf("cluster %+v: want the server's version and its %d nodes", cp, len(cluster.Nodes))
	}
	for _, n := range cp.Nodes {
		if !strings.HasPrefix(n.KubeletVersion, "kwok-") || !strings.HasPrefix(n.ContainerRuntime, "kwok-") || n.Architecture != "amd64" {
			t.Errorf("node %+v: want what its (kwok) kubelet reports", n)
		}
	}
	app, err := c.Deploy(ctx, bookinfoSpec(t, "prov01"))
	t.Cleanup(func() { _ = c.Teardown(context.Background(), app) })
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx, app, nil); err != nil {
		t.Fatal(err)
	}
	images, err := c.PodImages(ctx, "baseline", app.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if len(images) != 1 || images[0].Container != "app" || images[0].Image != "registry.example/meshmark:test" || images[0].Pods != 6 || images[0].Mesh != "baseline" {
		t.Errorf("images %+v: want the meshmark image, run by bookinfo's 6 pods", images)
	}
}

// TestCheckPlacementNamesAnUnmatchedSelector: a node selector no node matches is refused
// before anything is created, naming it, each node's value of its key and how to label
// one, rather than leaving every pod unschedulable; where both selectors match a node,
// the app and the generators may share it.
func TestCheckPlacementNamesAnUnmatchedSelector(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{AppNodeSelector: map[string]string{"meshmark.dev/test-node": "0"}, LoadgenNodeSelector: map[string]string{"type": "kwok"}})
	p, err := c.CheckPlacement(ctx)
	if err != nil || !slices.Equal(p.App, cluster.Nodes[:1]) || len(p.Loadgen) != len(cluster.Nodes) || !slices.Equal(p.Shared(), cluster.Nodes[:1]) {
		t.Errorf("placement %+v (shared %v), %v: want the app on node 0, the generators on every node, sharing node 0", p, p.Shared(), err)
	}
	c = connect(t, Config{AppNodeSelector: map[string]string{"meshmark.dev/role": "sut"}, LoadgenNodeSelector: map[string]string{"meshmark.dev/role": "loadgen"}})
	_, err = c.CheckPlacement(ctx)
	for _, want := range []string{
		"spec.substrate.kubernetes.sutNodeSelector meshmark.dev/role=sut: no node that takes pods matches it (nodes " + cluster.Nodes[0] + ": meshmark.dev/role=(none);",
		"label one: kubectl label node NODE meshmark.dev/role=sut",
		"spec.substrate.kubernetes.loadgenNodeSelector meshmark.dev/role=loadgen: no node",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("placement with selectors no node matches: %v; want it to say %q", err, want)
		}
	}
}

// TestReadinessIsAnHTTPProbeForEveryProtocol: every workload pod's readiness probe is an
// HTTP GET of the service's health path, gRPC services' too, and a gRPC service's real
// server answers it on its gRPC port: Linkerd's policy controller authorizes a pod's
// HTTP probe paths by default (linkerd2 edge-26.8.3,
// policy-controller/k8s/index/src/inbound/workload.rs, pod_http_probes), not its gRPC
// probes, which the all-authenticated default would refuse.
func TestReadinessIsAnHTTPProbeForEveryProtocol(t *testing.T) {
	g, err := workload.Builtin("emojivoto")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{cfg: Config{Image: "registry.example/meshmark:test"}}
	spec := AppSpec{Run: "r", Mesh: "linkerd", Args: func(d workload.Deployment) []string { return g.ServiceArgs(d, PodNameArg) }}
	grpcServices := 0
	for _, d := range g.Deployments() {
		dep := c.deployment(spec, d, nil)
		probe := dep.Spec.Template.Spec.Containers[0].ReadinessProbe
		if probe.GRPC != nil || probe.HTTPGet == nil || probe.HTTPGet.Path != workload.HealthPath || probe.HTTPGet.Port.IntValue() != d.Port {
			t.Errorf("%s (%s): readiness probe %+v, want an HTTP GET of %s on port %d", d.Service, d.Protocol, probe, workload.HealthPath, d.Port)
		}
		if d.Protocol != workload.ProtocolGRPC {
			continue
		}
		grpcServices++
		srv, err := workload.NewServer(g, workload.ServerOptions{Service: d.Service, Version: d.Version})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go srv.Serve(ctx, ln)
		resp, err := http.Get("http://" + ln.Addr().String() + workload.HealthPath)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("gRPC service %s: GET %s: %v %v", d.Service, workload.HealthPath, resp, err)
		} else {
			resp.Body.Close()
		}
		cancel()
	}
	if grpcServices == 0 {
		t.Fatal("emojivoto has no gRPC service to check")
	}
}

// TestPodsAreToldTheRunnersVersion: the meshmark containers the substrate starts (the
// workload's, the load generators', the plaintext probe's; its control's likewise) are
// told the runner's version, which their meshmark checks against its own before it runs.
func TestPodsAreToldTheRunnersVersion(t *testing.T) {
	g, err := workload.Builtin("chain-1")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{cfg: Config{Image: "registry.example/meshmark:test", RunnerVersion: "v1.2.3"}}
	spec := AppSpec{Run: "r", Mesh: "m", Args: func(d workload.Deployment) []string { return g.ServiceArgs(d, PodNameArg) }}
	containers := []corev1.Container{
		c.deployment(spec, g.Deployments()[0], nil).Spec.Template.Spec.Containers[0],
		c.generatorDeployment(spec, nil, 1).Spec.Template.Spec.Containers[0],
		c.probePod("p", nil, meshkube.OptOut{}, nil, meshprobe.PlaintextTarget{Service: "control", Addr: "control:9080", Protocol: "http"}, time.Minute).Spec.Containers[0],
	}
	for _, ctr := range containers {
		found := false
		for _, e := range ctr.Env {
			found = found || e.Name == RunnerVersionEnv && e.Value == "v1.2.3"
		}
		if !found {
			t.Errorf("container %s env %v: want %s=v1.2.3", ctr.Name, ctr.Env, RunnerVersionEnv)
		}
	}
}
