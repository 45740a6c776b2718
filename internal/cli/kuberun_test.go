package cli

// `meshmark run` and `deploy` on a Kubernetes cluster of paper nodes (package kubetest:
// kube-apiserver and kwok), for what the real two-node cluster (kubereal_test.go) cannot
// show on demand: generators whose every request fails, users' tasks counted by path,
// and an ambient install whose node agent cannot run. The run, its namespaces, its load-generator pods and the port-forwards
// the API server makes to them are real; kwok runs the pods only on paper, so a real
// `meshmark generator` process stands behind each generator pod (kwok's kubelet
// endpoint dials it for the port-forward) and an HTTP server of the test stands in for
// the entry service's pods.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	corev1 "k8s.io/api/core/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// standInGenerators watches the cluster for load-generator pods and starts, for each,
// a `meshmark generator` process, as the pod's container would run it, with the pod's
// namespace; the entry service's cluster name resolves to the stand-in entry server.
// kwok's kubelet endpoint forwards the pod's generator port to the process.
func standInGenerators(t *testing.T, c *kubetest.Cluster, entryService, entryAddr string) {
	t.Helper()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	var procs []*exec.Cmd
	t.Cleanup(func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	})
	logDir := t.TempDir()
	c.OnNewPods(t, kube.RoleLabel+"=loadgen", func(ctx context.Context, p *corev1.Pod) (bool, error) {
		svc, err := client.CoreV1().Services(p.Namespace).Get(ctx, entryService, metav1.GetOptions{})
		if err != nil {
			return false, nil // not created yet
		}
		host := fmt.Sprintf("%s.%s.svc.cluster.local:%d", entryService, p.Namespace, svc.Spec.Ports[0].Port)
		g, err := spawnGenerator(logDir, "--allow-namespace", p.Namespace, "--resolve", host+":"+entryAddr)
		if err != nil {
			return false, err
		}
		procs = append(procs, g.cmd)
		return true, c.ForwardPodPort(ctx, p.Namespace, p.Name, kube.GeneratorPort, g.addr)
	})
}

// meshLeftovers lists what a mesh install leaves cluster-wide if it is not removed: its
// namespace, the webhook configurations (none of the tests' own) and the CRDs of the
// API groups it adds (a group, or any group ending in "."+group).
func meshLeftovers(t *testing.T, c *kubetest.Cluster, namespace string, groups ...string) []string {
	t.Helper()
	ctx := context.Background()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	if _, err := client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); err == nil {
		left = append(left, "namespace/"+namespace)
	}
	mwcs, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range mwcs.Items {
		left = append(left, "mutatingwebhookconfiguration/"+w.Name)
	}
	vwcs, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range vwcs.Items {
		left = append(left, "validatingwebhookconfiguration/"+w.Name)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ext, err := apiextensions.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := ext.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds.Items {
		for _, g := range groups {
			if crd.Spec.Group == g || strings.HasSuffix(crd.Spec.Group, "."+g) {
				left = append(left, "crd/"+crd.Name)
				break
			}
		}
	}
	return left
}

// istioLeftovers is what an Istio install leaves: istio-system and Istio's CRDs.
func istioLeftovers(t *testing.T, c *kubetest.Cluster) []string {
	t.Helper()
	return meshLeftovers(t, c, "istio-system", "istio.io")
}

// TestAmbientThatEnrollsNothingIsRefused installs Istio ambient's own four charts (base,
// istiod, istio-cni and ztunnel, with the ambient profile) through `meshmark deploy`. On
// this cluster no istio-cni agent can run to redirect the pods, as none would on a node
// whose CNI it cannot hook, so the enrollment check must find every pod outside the
// mesh and refuse, and the deploy must leave nothing behind: the check is not a formality.
// (On real nodes ztunnel is never ready without the agent, so the install's wait stops
// such a run first: TestAmbientWithoutItsNodeAgentStopsTheRunOnRealNodes.)
func TestAmbientThatEnrollsNothingIsRefused(t *testing.T) {
	c := startTestCluster(t)
	if _, err := os.Stat(filepath.Join(prereq.IstioCharts(), "ztunnel")); err != nil {
		t.Skipf("no Istio charts (%v): make setup (or: meshmark setup --for test)", err)
	}
	// Nothing listens there: the API server's calls to Istio's validation webhook fail
	// at once, on loopback, instead of going to the addresses of its Service.
	port, err := kubetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	path := kubeStudy(t, c, fmt.Sprintf(`    - {name: baseline, profile: none}
    - name: ambient
      profile: istio-ambient
      options:
        istio_charts: %s
        helm_values:
          istio-base: {base: {validationURL: "https://localhost:%[2]d/validate"}}
          istiod: {base: {validationURL: "https://localhost:%[2]d/validate"}}`, prereq.IstioCharts(), port))

	out, errOut, err := execCLI("deploy", path)

	if err == nil || !strings.Contains(err.Error(), "mesh ambient is not set up as claimed, refusing to measure it") ||
		!strings.Contains(err.Error(), "has no ambient.istio.io/redirection=enabled: the mesh did not take it in") {
		t.Fatalf("deploy of ambient without a CNI agent: %v\n%s\n%s", err, out, errOut)
	}
	if !regexp.MustCompile(`ambient: installed in \S+: \d+ objects, 15 CRDs added, 4 values set`).MatchString(errOut) {
		t.Errorf("progress does not report the install's effort:\n%s", errOut)
	}
	if !strings.Contains(out, "baseline ") {
		t.Errorf("the baseline, which came up, is not listed:\n%s", out)
	}
	if left := meshmarkNamespaces(t, c); len(left) > 0 {
		t.Errorf("deploy left namespaces %v", left)
	}
	if left := istioLeftovers(t, c); len(left) > 0 {
		t.Errorf("deploy left Istio's %v", left)
	}
}

// TestUsersOnKubernetesRunTheirTasksByWeight: users, shared out among two generator
// pods, run their tasks by weight, each task's method and path reaching the entry. The
// entry here is a server of the test, which counts what each task sent: a real pod
// counts per service, not per path. (A capacity search feeding a relative rate through
// generator pods runs on real nodes: TestCapacityOnBothPlatforms.)
func TestUsersOnKubernetesRunTheirTasksByWeight(t *testing.T) {
	c := startTestCluster(t)
	var home, cart atomic.Int64
	entry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Microsecond)
		switch {
		case r.URL.Path == "/home":
			home.Add(1)
		case r.URL.Path == "/cart" && r.Method == "POST":
			cart.Add(1)
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer entry.Close()
	standInGenerators(t, c, "front", entry.Listener.Addr().String())
	path := kubeStudy(t, c, "    - {name: baseline, profile: none}")
	rewriteStudy(t, path, "    - {name: latency, kind: fixed-rate, rate: 100, duration: 30s}",
		"    - {name: shoppers, kind: users, users: 4, spawnRate: 100, thinkTime: 5ms-15ms, duration: 2s, warmup: 200ms,\n"+
			"       tasks: [{name: home, path: /home, weight: 3}, {name: 'buy: cart', method: POST, path: /cart}]}",
		"      namespacePrefix: mmtest\n", "      namespacePrefix: mmtest\n      generators: 2\n")
	run, errOut := runOnCluster(t, path)
	var users *results.Trial
	for i, tr := range run.Trials {
		if tr.Experiment == "shoppers" {
			users = &run.Trials[i]
		}
	}
	t.Logf("users: /home %d, POST /cart %d", home.Load(), cart.Load())
	if users == nil || users.Params.Users != 4 || users.Result.Requests < 50 || users.Result.Errors != 0 {
		t.Fatalf("users trial %+v\n%s", users, errOut)
	}
	if h, c := home.Load(), cart.Load(); h+c < users.Result.Requests || float64(h)/float64(h+c) < 0.6 || float64(h)/float64(h+c) > 0.9 {
		t.Errorf("the users' tasks reached /home %d and POST /cart %d times (%d requests stored), want 3:1", h, c, users.Result.Requests)
	}
}

// TestRunWaitsUntilTheEntryAnswersEveryGenerator: a Service whose ready endpoints each
// node's kube-proxy has not programmed yet swallows the connections opened meanwhile
// (seen on the real cluster: one trial after a bring-up measured p50 29 s, every
// request answered late). Here the stand-in entry closes every connection for its first
// 1.5 s, as that window does, which a kwok cluster, without kube-proxy, cannot show on
// demand. The run must wait, saying so, until every generator is answered, and only then
// measure: the trial has every request answered, none failed, none late.
func TestRunWaitsUntilTheEntryAnswersEveryGenerator(t *testing.T) {
	c := startTestCluster(t)
	var first atomic.Int64
	entry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first.CompareAndSwap(0, time.Now().UnixNano())
		if time.Since(time.Unix(0, first.Load())) < 1500*time.Millisecond {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer entry.Close()
	standInGenerators(t, c, "front", entry.Listener.Addr().String())
	path := kubeStudy(t, c, "    - {name: baseline, profile: none}")
	rewriteStudy(t, path, "    - {name: latency, kind: fixed-rate, rate: 100, duration: 30s}",
		"    - {name: latency, kind: fixed-rate, rate: 100, duration: 1s, warmup: 200ms}")
	run, errOut := runOnCluster(t, path)
	for _, want := range []string{"baseline: waiting for the entry service to answer every load generator (0 of 5 requests answered: 5 reset",
		"baseline: the entry service answered every load generator after "} {
		if !strings.Contains(errOut, want) {
			t.Errorf("progress does not say %q:\n%s", want, errOut)
		}
	}
	if len(run.Trials) == 0 {
		t.Fatalf("no trial stored\n%s", errOut)
	}
	for _, tr := range run.Trials {
		res := tr.Result
		if res.Requests < 95 || res.Requests > 105 || res.Errors != 0 || res.Latency.ValueAtQuantile(100) > int64(time.Second/time.Microsecond) {
			t.Errorf("repeat %d: %d requests, %d errors, slowest %dµs; want 100, none failed, none late", tr.Repeat+1, res.Requests, res.Errors, res.Latency.ValueAtQuantile(100))
		}
	}
}

// rewriteStudy replaces, in the study file at path, each old text (given in pairs old,
// new) once.
func rewriteStudy(t *testing.T, path string, oldNew ...string) {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	for i := 0; i+1 < len(oldNew); i += 2 {
		if !strings.Contains(text, oldNew[i]) {
			t.Fatalf("study %s has no %q to replace", path, oldNew[i])
		}
		text = strings.Replace(text, oldNew[i], oldNew[i+1], 1)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runOnCluster runs the study at path with `meshmark run` into a fresh database and
// returns the stored run and the progress output.
func runOnCluster(t *testing.T, path string) (*results.Run, string) {
	t.Helper()
	db := filepath.Join(t.TempDir(), "results.db")
	out, errOut, err := execCLI("run", "--db", db, "--no-report", path)
	if err != nil {
		t.Fatalf("run: %v\n%s\n%s", err, out, errOut)
	}
	return lastRun(t, db), errOut
}

// lastRun is the run last stored in the results database at db.
func lastRun(t *testing.T, db string) *results.Run {
	t.Helper()
	s, err := store.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	run, err := s.LoadRun(context.Background(), "last")
	if err != nil {
		t.Fatal(err)
	}
	return run
}
