package kubeplatform

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/store"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestContainerResourcesFeedTheAnalysis: a cluster trial's kubelet readings, stored as
// containerResources stores them, come out of the same analysis as the local sampler's
// processes: per role, the average cores over the measured window only (the warm-up's
// readings left out), and memory.
func TestContainerResourcesFeedTheAnalysis(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	var samples []kube.ContainerSample
	// The sidecar burns 0.5 core during the warm-up (0-2 s) and 0.1 core in the window
	// (2-6 s); the app 0.25 core throughout. Readings every second, the last one after
	// the window.
	sidecarCPU, appCPU := 0.0, 0.0
	for i := 0; i <= 7; i++ {
		samples = append(samples,
			kube.ContainerSample{Node: "n1", Namespace: "ns", Pod: "front-1", Container: "istio-proxy", Role: substrate.RoleSidecar, T: at(float64(i)), CPUSeconds: sidecarCPU, WorkingSetBytes: 30 << 20},
			kube.ContainerSample{Node: "n1", Namespace: "ns", Pod: "front-1", Container: "app", Role: substrate.RoleWorkload, T: at(float64(i)), CPUSeconds: appCPU, WorkingSetBytes: 60 << 20})
		if i < 2 {
			sidecarCPU += 0.5
		} else {
			sidecarCPU += 0.1
		}
		appCPU += 0.25
	}
	stored, coarse := containerResources(samples, "istio", at(2), at(6))
	if coarse != "" {
		t.Errorf("readings every second called coarse: %s", coarse)
	}
	for _, s := range stored {
		if s.T.Before(at(2)) || s.T.After(at(6)) {
			t.Errorf("reading at %s kept, outside the window 2s..6s", s.T.Sub(t0))
		}
	}
	if len(stored) != 2*5 {
		t.Errorf("%d readings kept, want 5 per container (2s..6s)", len(stored))
	}
	latency := hdrhistogram.New(1, 60_000_000, 3)
	for i := 0; i < 400; i++ {
		_ = latency.RecordValue(1000)
	}
	run := &results.Run{ID: "r", Meshes: []results.Mesh{{Label: "istio", Profile: "envoy-sidecar"}}, Trials: []results.Trial{{
		Mesh: "istio", Experiment: "latency", Kind: "fixed-rate", Start: at(2), End: at(6),
		Params: results.TrialParams{RequestedRate: 100}, Result: results.TrialResult{Requests: 400, Latency: latency, Resources: stored},
	}}}
	rep := analysis.Analyze(run, analysis.Options{Seed: 1}, nil)
	want := map[string]float64{"sidecar": 0.1, "workload": 0.25}
	for _, u := range rep.Resources {
		w, ok := want[u.Role]
		if !ok {
			t.Errorf("role %s (%s) analysed; only sidecar and workload were read", u.Role, u.Component)
			continue
		}
		delete(want, u.Role)
		if math.Abs(u.CPUCores-w) > 1e-9 {
			t.Errorf("%s %s: %.4f cores, want %.4f", u.Role, u.Component, u.CPUCores, w)
		}
		if u.RSSPeak == 0 {
			t.Errorf("%s: no memory", u.Role)
		}
	}
	if len(want) > 0 {
		t.Errorf("roles missing from the analysis: %v", want)
	}
}

// TestKubeletRefreshDoesNotSmearTrialCPU: a kubelet refreshes its readings every 10 s,
// not every second. A trial's CPU is the counters' difference between its first and last
// readings inside the trial, not between the readings around it, which would average in
// the idle time before and after: a container busy at half a core from 5 s to 35 s
// measures 0.5 core over the trial 5-35 s (readings at 10, 20, 30 s), where the
// bracketing readings (0 and 40 s) give 0.375. A trial shorter than the refresh period
// holds fewer than two readings: it keeps the bracketing ones and says its CPU is coarse.
func TestKubeletRefreshDoesNotSmearTrialCPU(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	busy := func(s float64) float64 { return 0.5 * max(0, min(s, 35)-5) } // CPU seconds used by time s
	var samples []kube.ContainerSample
	// Read every second, as the runner does; the kubelet's timestamp moves every 10 s.
	for i := 0; i <= 40; i++ {
		refreshed := float64(i / 10 * 10)
		samples = append(samples, kube.ContainerSample{Node: "n1", Namespace: "ns", Pod: "front-1", Container: "istio-proxy", Role: substrate.RoleSidecar,
			T: at(refreshed), CPUSeconds: busy(refreshed), WorkingSetBytes: 30 << 20})
	}
	// The sampler keeps a reading once per kubelet timestamp.
	samples = slices.CompactFunc(samples, func(a, b kube.ContainerSample) bool { return a.T.Equal(b.T) })
	cores := func(stored []results.ResourceSample, start, end time.Time) float64 {
		latency := hdrhistogram.New(1, 60_000_000, 3)
		_ = latency.RecordValue(1000)
		run := &results.Run{ID: "r", Meshes: []results.Mesh{{Label: "istio", Profile: "envoy-sidecar"}}, Trials: []results.Trial{{
			Mesh: "istio", Experiment: "latency", Kind: "fixed-rate", Start: start, End: end,
			Params: results.TrialParams{RequestedRate: 100}, Result: results.TrialResult{Requests: 1, Latency: latency, Resources: stored},
		}}}
		for _, u := range analysis.Analyze(run, analysis.Options{Seed: 1}, nil).Resources {
			return u.CPUCores
		}
		return -1
	}
	stored, coarse := containerResources(samples, "istio", at(5), at(35))
	if got := cores(stored, at(5), at(35)); math.Abs(got-0.5) > 1e-9 || coarse != "" {
		t.Errorf("a 30 s trial at half a core measures %.4f cores (coarse %q); want 0.5000, from the readings inside it", got, coarse)
	}
	stored, coarse = containerResources(samples, "istio", at(12), at(15))
	if len(stored) != 2 || !stored[0].T.Equal(at(10)) || !stored[1].T.Equal(at(20)) {
		t.Errorf("a 3 s trial keeps %+v; want the readings at 10 and 20 s around it", stored)
	}
	for _, want := range []string{"the kubelets refresh their readings about every 10s", "front-1/istio-proxy had fewer than two readings within this 3s trial", "readings 10s apart"} {
		if !strings.Contains(coarse, want) {
			t.Errorf("coarse %q does not say %q", coarse, want)
		}
	}
}

// TestResourceWarningNamesWhatIsMissing: an unreadable node is named with its failure,
// and a trial that read nothing says so, rather than showing zero.
func TestResourceWarningNamesWhatIsMissing(t *testing.T) {
	rd := kube.ResourceReadings{Rounds: 5, Unread: []kube.UnreadNode{{Node: "kind-worker2", Failed: 5, Rounds: 5, Err: "GET /api/v1/nodes/kind-worker2/proxy/metrics/resource: dial tcp: connection refused"}}}
	msg := resourceWarning(rd, 10)
	if !strings.Contains(msg, "node kind-worker2: resource metrics unreadable in 5 of 5 rounds") || !strings.Contains(msg, "connection refused") {
		t.Errorf("warning %q", msg)
	}
	if msg := resourceWarning(kube.ResourceReadings{Rounds: 5}, 0); !strings.Contains(msg, "no container's resources were read") {
		t.Errorf("nothing read: warning %q", msg)
	}
	if msg := resourceWarning(kube.ResourceReadings{Rounds: 5}, 10); msg != "" {
		t.Errorf("all read: warning %q", msg)
	}
}

// TestKubernetesTrialStoresContainerResources runs a study on the test cluster with
// `meshmark generator` processes standing in for the generator pods (kwok runs pods
// only on paper) and an HTTP server for the entry service, and checks that every trial
// stores its containers' resources, read through the API server from each node's
// kubelet resource metrics, and that the report shows them per role. The numbers are
// kwok's (its default usage, 1m and 1Mi per container), not measured; the generator's
// node serves no metrics, so its container is missing, and the trial says so.
func TestKubernetesTrialStoresContainerResources(t *testing.T) {
	if missing, how := kubetest.Missing(); len(missing) > 0 {
		t.Skipf("no test cluster: %s missing (%s)", strings.Join(missing, ", "), how)
	}
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	c, err := kubetest.Start(startCtx, t.TempDir(), kubetest.Options{Nodes: 2, NoResourceMetrics: []int{1}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	entry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer entry.Close()
	standInGenerators(t, c, entry.Listener.Addr().String())

	dir := t.TempDir()
	graph := "name: two\nservices:\n  - name: front\n    isEntrypoint: true\n    replicas: 2\n    script: [call: back]\n  - name: back\n"
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(graph), 0o644); err != nil {
		t.Fatal(err)
	}
	st := parseStudy(t, fmt.Sprintf(`apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: kube-resources}
spec:
  substrate:
    kubernetes:
      kubeconfig: %s
      image: registry.example/meshmark:test
      namespacePrefix: mmres
      sutNodeSelector: {meshmark.dev/test-node: "0"}
      loadgenNodeSelector: {meshmark.dev/test-node: "1"}
  workload: {graph: %s}
  meshes:
    - {name: baseline, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, duration: 4s, warmup: 500ms}
  repeats: 1
`, c.Kubeconfig, filepath.Join(dir, "app.yaml")))
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "results.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := runner.Run(ctx, st, runner.Options{Store: db, Progress: testWriter{t}}); err != nil {
		t.Fatal(err)
	}
	run, err := db.LoadRun(ctx, "last")
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Trials) != 1 {
		t.Fatalf("%d trials stored, want 1", len(run.Trials))
	}
	tr := run.Trials[0]
	pods := map[string]bool{}
	for _, s := range tr.Result.Resources {
		if s.Role != string(substrate.RoleWorkload) || s.Component != "app" || s.Node != c.Nodes[0] || s.Mesh != "baseline" {
			t.Errorf("stored %+v: want only the workload's app containers on %s", s, c.Nodes[0])
		}
		pods[s.Pod] = true
	}
	if len(pods) != 3 {
		t.Errorf("resources of %d pods stored (%v), want the 3 workload pods", len(pods), pods)
	}
	warning := tr.Params.Extra["resource_warning"]
	if !tr.Result.HasFlag(flagResourcesIncomplete) || !strings.Contains(warning, "node "+c.Nodes[1]+": resource metrics unreadable") {
		t.Errorf("flags %v, warning %q: want the trial flagged, naming %s, whose metrics cannot be read", tr.Result.Flags, warning, c.Nodes[1])
	}
	sum := report.Summarize(run, nil, report.Options{})
	var workload float64
	for _, row := range sum.Resources {
		if row.Role != string(substrate.RoleWorkload) {
			t.Errorf("report row %+v: only the workload was read", row)
			continue
		}
		workload += row.AvgCores
		if math.Abs(row.AvgMemMiB-1) > 1e-9 {
			t.Errorf("report row %+v: want kwok's 1Mi", row)
		}
	}
	if want := 3 * 0.001; math.Abs(workload-want) > 0.1*want {
		t.Errorf("the report shows the workload at %.5f vCPU, kwok's default gives 3 containers %.3f", workload, want)
	}
}

// standInGenerators starts, for each load-generator pod the cluster gets, a
// `meshmark-pod generator` process as the pod's container would run it, whose entry service's
// cluster name resolves to entryAddr, and points kwok's forward of the pod's generator
// port at it.
func standInGenerators(t *testing.T, c *kubetest.Cluster, entryAddr string) {
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
	c.OnNewPods(t, kube.RoleLabel+"=loadgen", func(ctx context.Context, p *corev1.Pod) (bool, error) {
		svc, err := client.CoreV1().Services(p.Namespace).Get(ctx, "front", metav1.GetOptions{})
		if err != nil {
			return false, nil // not created yet
		}
		port, err := kubetest.FreePort()
		if err != nil {
			return false, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		host := fmt.Sprintf("front.%s.svc.cluster.local:%d", p.Namespace, svc.Spec.Ports[0].Port)
		cmd := exec.Command(podBin, "generator", "--listen", addr, "--allow-namespace", p.Namespace, "--resolve", host+":"+entryAddr)
		if err := cmd.Start(); err != nil {
			return false, err
		}
		procs = append(procs, cmd)
		return true, c.ForwardPodPort(ctx, p.Namespace, p.Name, kube.GeneratorPort, addr)
	})
}
