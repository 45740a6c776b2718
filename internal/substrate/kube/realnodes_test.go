package kube

// These tests run on real nodes (kubetest.SharedLocal: a two-node localcluster with
// real kubelets, containerd, bridge CNI, kube-proxy and CoreDNS, and meshmark's own
// image in every node): their subject is a pod, a wait on the kubelets' word, or a load
// generator, which the paper-only cluster of the other tests can only pretend to run.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/load"
	"github.com/meshmark/meshmark/internal/loadgen"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/meshmark/meshmark/internal/workload"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// connectLocal connects to the shared local cluster with meshmark's image of it.
func connectLocal(t *testing.T, l *kubetest.Local, cfg Config) *Cluster {
	t.Helper()
	cfg.Kubeconfig = l.Kubeconfig
	if cfg.Image == "" {
		cfg.Image = l.Image
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	c, err := Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// connectAcrossNodes connects to the shared local cluster with the app's pods on its
// first node and the load generators' on its second, and returns the nodes, sorted.
func connectAcrossNodes(t *testing.T, l *kubetest.Local) (*Cluster, []string) {
	t.Helper()
	nodes := nodeNames(t, l.ClientOf(t))
	if len(nodes) < 2 {
		t.Fatalf("nodes %v, want two", nodes)
	}
	return connectLocal(t, l, Config{
		AppNodeSelector:     map[string]string{"kubernetes.io/hostname": nodes[0]},
		LoadgenNodeSelector: map[string]string{"kubernetes.io/hostname": nodes[1]},
	}), nodes
}

// deployReady deploys spec, removed when the test ends, and waits until its pods are
// ready.
func deployReady(t *testing.T, c *Cluster, spec AppSpec) *App {
	t.Helper()
	ctx := context.Background()
	app, err := c.Deploy(ctx, spec)
	t.Cleanup(func() { _ = c.Teardown(context.Background(), app) })
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx, app, nil); err != nil {
		t.Fatal(err)
	}
	return app
}

// nodeNames are the cluster's nodes, sorted.
func nodeNames(t *testing.T, client kubernetes.Interface) []string {
	t.Helper()
	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	sort.Strings(names)
	return names
}

func TestDeployWaitTeardownLeavesNothing(t *testing.T) {
	l := kubetest.SharedLocal(t)
	ctx := context.Background()
	nodes := nodeNames(t, l.ClientOf(t))
	if len(nodes) < 2 {
		t.Fatalf("nodes %v, want two", nodes)
	}
	c := connectLocal(t, l, Config{AppNodeSelector: map[string]string{"kubernetes.io/hostname": nodes[1]}})
	spec := bookinfoSpec(t, "a1b2c3")
	// Labels a mesh's injection would act on: no mesh is installed, so they only have to
	// reach the namespace and the pods.
	spec.NamespaceLabels = map[string]string{"istio-injection": "enabled"}
	spec.PodAnnotations = map[string]string{"linkerd.io/inject": "enabled"}
	app, err := c.Deploy(ctx, spec)
	t.Cleanup(func() { _ = c.Teardown(context.Background(), app) })
	if err != nil {
		t.Fatal(err)
	}
	var seen []int
	if err := c.WaitReady(ctx, app, func(p WaitProgress) { seen = append(seen, p.Ready, p.Total) }); err != nil {
		t.Fatal(err)
	}
	if len(seen) < 2 || seen[len(seen)-2] != seen[len(seen)-1] || seen[len(seen)-1] != len(spec.Deployments) {
		t.Errorf("progress %v: want it to end at %d of %d pods ready", seen, len(spec.Deployments), len(spec.Deployments))
	}
	client := c.Client()
	ns, err := client.CoreV1().Namespaces().Get(ctx, app.Namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if app.Namespace != "meshmark-a1b2c3-baseline" || ns.Labels["istio-injection"] != "enabled" || ns.Labels[ManagedByLabel] != ManagedBy {
		t.Errorf("namespace %s labels %v", app.Namespace, ns.Labels)
	}
	if owner := ns.Annotations[OwnerAnnotation]; !strings.Contains(owner, fmt.Sprintf(" %d ", os.Getpid())) {
		t.Errorf("owner annotation %q does not name this process", owner)
	}
	pods, err := client.CoreV1().Pods(app.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != len(spec.Deployments) {
		t.Errorf("%d pods, want one per deployment (%d)", len(pods.Items), len(spec.Deployments))
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != nodes[1] {
			t.Errorf("pod %s scheduled on %q, want the node the selector names (%s)", p.Name, p.Spec.NodeName, nodes[1])
		}
		if p.Annotations["linkerd.io/inject"] != "enabled" || p.Labels["app"] == "" || p.Labels["version"] == "" {
			t.Errorf("pod %s: labels %v annotations %v", p.Name, p.Labels, p.Annotations)
		}
		args := strings.Join(p.Spec.Containers[0].Args, " ")
		if !strings.Contains(args, "--pod $(POD_NAME)") || !strings.Contains(args, "--service "+p.Labels["app"]) {
			t.Errorf("pod %s args %q", p.Name, args)
		}
		// Ready on a kubelet's word: its HTTP readiness probe of the real service answered.
		if !podReady(&p) || p.Status.PodIP == "" {
			t.Errorf("pod %s: ready %v, address %q", p.Name, podReady(&p), p.Status.PodIP)
		}
	}
	svc, err := client.CoreV1().Services(app.Namespace).Get(ctx, "reviews", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Ports[0].Name != "http" || svc.Spec.Ports[0].Port != 9080 || svc.Spec.Selector["app"] != "reviews" {
		t.Errorf("service reviews: %+v", svc.Spec)
	}
	eps, err := client.DiscoveryV1().EndpointSlices(app.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=reviews"})
	if err != nil {
		t.Fatal(err)
	}
	if n := countEndpoints(eps.Items); n != 3 {
		t.Errorf("service reviews has %d ready endpoints, want its 3 versions' pods", n)
	}

	if err := c.Teardown(ctx, app); err != nil {
		t.Fatal(err)
	}
	if left := labelledIn(t, client, "a1b2c3"); len(left) > 0 {
		t.Errorf("teardown left %v", left)
	}
}

func TestWaitReadySaysWhyPodsWait(t *testing.T) {
	l := kubetest.SharedLocal(t)
	ctx := context.Background()
	c := connectLocal(t, l, Config{AppNodeSelector: map[string]string{"meshmark.dev/test-node": "no-such-node"}, Timeout: 3 * time.Second})
	spec := bookinfoSpec(t, "d4e5f6")
	app, err := c.Deploy(ctx, spec)
	t.Cleanup(func() { _ = c.Teardown(context.Background(), app) })
	if err != nil {
		t.Fatal(err)
	}
	err = c.WaitReady(ctx, app, nil)
	if err == nil || !strings.Contains(err.Error(), "not ready after 3s") || !strings.Contains(err.Error(), "not scheduled") ||
		!strings.Contains(err.Error(), "node affinity/selector") {
		t.Errorf("WaitReady with no node to run on: %v", err)
	}
}

// A mesh with a sidecar gets no pod of the workload created until a dry run of one
// comes back with the sidecar: here no mesh is installed, so no injector ever adds
// "mesh-proxy", and Deploy gives up at the study's time limit, saying so, with nothing
// of the workload created (Istio's and Linkerd's real injectors pass this wait in the
// cli package's real-node tests).
func TestDeployWaitsForTheMeshsInjector(t *testing.T) {
	l := kubetest.SharedLocal(t)
	c := connectLocal(t, l, Config{Timeout: 3 * time.Second})
	spec := bookinfoSpec(t, "inject1")
	spec.Sidecar = "mesh-proxy"
	start := time.Now()
	app, err := c.Deploy(context.Background(), spec)
	t.Cleanup(func() { _ = c.Teardown(context.Background(), app) })
	if err == nil || !strings.Contains(err.Error(), "the mesh's injector did not add mesh-proxy to a dry run of ") ||
		!strings.Contains(err.Error(), "within 3s: the pod came back without it") {
		t.Fatalf("Deploy without an injector: %v", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("gave up after %s; want about the 3 s limit", took.Round(time.Second))
	}
	deps, err := c.client.AppsV1().Deployments(app.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(deps.Items) != 0 || len(app.Deployments) != 0 {
		t.Errorf("deployments %d on the cluster, %v recorded: want none created before the injector answered", len(deps.Items), app.Deployments)
	}
}

// TestWaitReadyGivesUpWithTheClustersReason makes a deployment that cannot get ready in
// each way a real cluster reports early, and wants the wait to give up with the
// cluster's reason well before its time limit.
func TestWaitReadyGivesUpWithTheClustersReason(t *testing.T) {
	l := kubetest.SharedLocal(t)
	ctx := context.Background()
	const limit = 3 * time.Minute
	cases := []struct {
		name, run string
		cfg       Config
		nsLabels  map[string]string
		// service, when set, is the service every pod is told to serve.
		service string
		want    []string
	}{
		// No registry answers here: the kubelet's pull fails at once.
		{name: "image cannot be pulled", run: "stuck1", cfg: Config{Image: "registry.invalid/meshmark:none"},
			want: []string{"namespace meshmark-stuck1-baseline: pod ", "cannot start: the image cannot be pulled (container app, image registry.invalid/meshmark:none)"}},
		// Told to serve a service the graph lacks, meshmark-pod exits with code 2 (usage).
		{name: "container keeps crashing", run: "stuck2", service: "no-such-service",
			want: []string{"keeps crashing (", "its last run exited with code 2 (Error)", `graph bookinfo has no service "no-such-service"`}},
		{name: "no node takes it", run: "stuck3", cfg: Config{AppNodeSelector: map[string]string{"meshmark.dev/test-node": "no-such-node"}},
			want: []string{"cannot be scheduled (for 1", "0/2 nodes are available", "node affinity/selector"}},
		{name: "admission refuses its pods", run: "stuck4", nsLabels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
			want: []string{"cannot create its pods: FailedCreate: ", `violates PodSecurity "restricted:latest"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Timeout = limit
			c := connectLocal(t, l, tc.cfg)
			spec := bookinfoSpec(t, tc.run)
			spec.NamespaceLabels = tc.nsLabels
			if tc.service != "" {
				args := spec.Args
				spec.Args = func(d workload.Deployment) []string {
					a := args(d)
					for i := range a {
						if a[i] == "--service" {
							a[i+1] = tc.service
						}
					}
					return a
				}
			}
			app, err := c.Deploy(ctx, spec)
			t.Cleanup(func() { _ = c.Teardown(context.Background(), app) })
			if err != nil {
				t.Fatal(err)
			}
			var seen []WaitProgress
			start := time.Now()
			err = c.WaitReady(ctx, app, func(p WaitProgress) { seen = append(seen, p) })
			took := time.Since(start)
			var stuck *StuckError
			if !errors.As(err, &stuck) {
				t.Fatalf("WaitReady: %v after %s; want it to give up with the cluster's reason, not at its time limit", err, took.Round(time.Second))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			t.Logf("gave up after %s: %v", took.Round(time.Second), err)
			if took > limit/2 {
				t.Errorf("gave up after %s, near its limit %s", took.Round(time.Second), limit)
			}
			if len(seen) > 0 {
				if p := seen[len(seen)-1]; p.Ready >= p.Total {
					t.Errorf("progress %s while a pod cannot start", p)
				}
			}
		})
	}
}

// TestGeneratorsAreSpreadAndReachedThroughPortForwards puts two load-generator pods on
// the two nodes, reaches each through a port-forward made by the API server and the
// kubelet, and has each run its own plan against bookinfo's productpage by its Service
// name. Each plan has its own request count, and each pod's log must tell that count,
// so every forward is seen to lead to its own generator.
func TestGeneratorsAreSpreadAndReachedThroughPortForwards(t *testing.T) {
	l := kubetest.SharedLocal(t)
	ctx := context.Background()
	c := connectLocal(t, l, Config{})
	spec := bookinfoSpec(t, "9e7f01")
	spec.Generators = 2
	app := deployReady(t, c, spec)
	fw, err := c.ForwardGenerators(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()
	if len(fw.Generators) != 2 {
		t.Fatalf("%d forwards, want 2", len(fw.Generators))
	}
	nodes := map[string]bool{}
	for i, g := range fw.Generators {
		nodes[g.Node] = true
		count := int64(30 + 17*i)
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		pool, err := loadgen.Dial(dctx, []string{g.Addr})
		cancel()
		if err != nil {
			t.Fatalf("generator %s through %s: %v", g.Pod, g.Addr, err)
		}
		untilAnswered(t, pool, "http://productpage:9080/productpage")
		spec := load.Spec{
			Version: load.SpecVersion,
			Request: load.RequestSpec{URL: "http://productpage:9080/productpage"},
			Closed:  &load.ClosedSpec{Connections: 1},
			Count:   count, Duration: 30 * time.Second, Timeout: 5 * time.Second,
		}
		res, _, err := pool.Run(ctx, spec, nil)
		pool.Close()
		if err != nil {
			t.Fatalf("generator %s: %v", g.Pod, err)
		}
		if res.Completed != count || res.Errors.Total() != 0 {
			t.Errorf("generator %s: %d requests completed, %d errors; want %d, none failed", g.Pod, res.Completed, res.Errors.Total(), count)
		}
		log := podLog(t, c.Client(), app.Namespace, g.Pod)
		if want := fmt.Sprintf(": %d requests, 0 errors", count); !strings.Contains(log, want) {
			t.Errorf("generator %s's log does not tell the plan sent through its forward (%q):\n%s", g.Pod, want, log)
		}
	}
	if len(nodes) != 2 {
		t.Errorf("generator pods on nodes %v, want them spread over two nodes", nodes)
	}
	if err := fw.Err(); err != nil {
		t.Errorf("a forward broke: %v", err)
	}
}

// dialGenerator forwards to the app's one generator pod and dials it; both are closed
// when the test ends.
func dialGenerator(t *testing.T, c *Cluster, app *App) *loadgen.Pool {
	t.Helper()
	fw, err := c.ForwardGenerators(context.Background(), app)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fw.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := loadgen.Dial(ctx, []string{fw.Generators[0].Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// untilAnswered sends a few requests to url through the generator until none fails, for
// up to 30 s: kube-proxy programs a Service a moment after its endpoints turn ready, and
// refuses connections to it until then (seen in CI: 1 of 30 requests failed just after
// the wait). The tests count only what they send afterwards.
func untilAnswered(t *testing.T, pool *loadgen.Pool, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, _, err := pool.Run(context.Background(), load.Spec{
			Version: load.SpecVersion, Request: load.RequestSpec{URL: url},
			Closed: &load.ClosedSpec{Connections: 1}, Count: 5, Duration: 10 * time.Second, Timeout: 2 * time.Second,
		}, nil)
		if err == nil && res.Completed == 5 && res.Errors.Total() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not answered through the generator within 30 s: %v, last %+v", url, err, res)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// podLog is a pod's log so far.
func podLog(t *testing.T, client kubernetes.Interface, namespace, pod string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := client.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{}).Stream(ctx)
	if err != nil {
		t.Fatalf("log of %s: %v", pod, err)
	}
	defer rc.Close()
	var b strings.Builder
	sc := bufio.NewScanner(io.LimitReader(rc, 1<<20))
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
}

// TestSpreadServicesCarryTheVersionsWeights: with SpreadServices, each service version
// has a headless Service over its pods, whose endpoints the wait waits for and the
// plaintext probe leaves out. bookinfo's real pods, told to spread their calls over
// those names as the runner tells the baseline's, reach reviews' three versions a third
// each per request through cluster DNS; 600 requests come from a real generator pod,
// and what each pod served is read back from the pod through a port-forward (Served).
func TestSpreadServicesCarryTheVersionsWeights(t *testing.T) {
	l := kubetest.SharedLocal(t)
	ctx := context.Background()
	c := connectLocal(t, l, Config{})
	g, err := workload.Builtin("bookinfo")
	if err != nil {
		t.Fatal(err)
	}
	var spread []string
	for _, s := range g.Services {
		var eps []workload.Endpoint
		for _, v := range s.Versions {
			eps = append(eps, workload.Endpoint{Addr: fmt.Sprintf("%s:%d", SpreadServiceName(s.Name, v.Name), s.Port), Weight: 1})
		}
		spread = append(spread, "--spread", workload.FormatSpread(s.Name, eps))
	}
	spec := bookinfoSpec(t, "spread1")
	spec.SpreadServices = true
	spec.Generators = 1
	args := spec.Args
	spec.Args = func(d workload.Deployment) []string { return append(args(d), spread...) }
	app := deployReady(t, c, spec)
	client := c.Client()
	for _, d := range g.Deployments() {
		name := SpreadServiceName(d.Service, d.Version)
		svc, err := client.CoreV1().Services(app.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.Selector["version"] != d.Version || svc.Spec.Ports[0].Port != int32(d.Port) {
			t.Fatalf("headless service %s: %+v, %v", name, svc, err)
		}
	}
	if targets, err := c.plaintextTargets(ctx, app); err != nil || len(targets) != len(g.Services) {
		t.Errorf("plaintext targets %+v, %v: want the graph's %d services only", targets, err, len(g.Services))
	}
	pool := dialGenerator(t, c, app)
	untilAnswered(t, pool, "http://productpage:9080"+g.Entrypoint().Path)
	before, err := c.Served(ctx, app)
	if err != nil || len(before) != len(g.Deployments()) {
		t.Fatalf("served before: %+v, %v", before, err)
	}
	const n = 600
	res, _, err := pool.Run(ctx, load.Spec{
		Version: load.SpecVersion,
		Request: load.RequestSpec{URL: "http://productpage:9080" + g.Entrypoint().Path},
		Closed:  &load.ClosedSpec{Connections: 4},
		Count:   n, Duration: time.Minute, Timeout: 5 * time.Second,
	}, nil)
	if err != nil || res.Completed != n || res.Errors.Total() != 0 {
		t.Fatalf("600 requests to productpage: %v completed, %v errors, %v", res.Completed, res.Errors.Total(), err)
	}
	after, err := c.Served(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	was := map[string]int64{}
	for _, p := range before {
		was[p.Pod] = p.Served
	}
	byVersion := map[string]int64{}
	for _, p := range after {
		byVersion[p.Service+" "+p.Version] += p.Served - was[p.Pod]
	}
	t.Logf("served over %d requests: %v", n, byVersion)
	// reviews' three versions of equal weight: 200 each expected, sd 11.5.
	for _, v := range []string{"v1", "v2", "v3"} {
		if got := byVersion["reviews "+v]; got < 160 || got > 240 {
			t.Errorf("reviews %s served %d of %d requests: want about a third, per request", v, got, n)
		}
	}
	if byVersion["productpage v1"] != n || byVersion["details v1"] != n || byVersion["ratings v1"] != byVersion["reviews v2"]+byVersion["reviews v3"] {
		t.Errorf("served %v: want productpage and details every request, ratings every call of reviews v2 and v3", byVersion)
	}
}
