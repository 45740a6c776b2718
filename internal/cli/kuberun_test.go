package cli

// `meshmark run` on a Kubernetes cluster, against the test control plane (package
// kubetest). The run, its namespaces, its load-generator pods and the port-forwards the
// API server makes to them are real, and so is Istio: its own charts, installed with
// Helm, and its own istiod, built from Istio's module, which injects the sidecars. kwok
// runs the pods only on paper, so:
//   - istiod runs beside the cluster, as Istio's external control plane does, and its
//     injection webhook is reached by URL (the chart's istiodRemote.injectionURL);
//   - a real `meshmark generator` process stands behind each generator pod (kwok's
//     kubelet endpoint dials it for the port-forward);
//   - an HTTP server of the test stands in for the entry service's pods, and no
//     sidecar proxies traffic;
//   - under strict mTLS, the test does what the plaintext probe pod's process would,
//     against listeners of its own that refuse plaintext as a sidecar does, and ends
//     the pod with its report.
// What is measured is therefore the generators' load on that server, through the same
// code a real cluster uses; what the mesh does to latency cannot be seen here.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
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

func TestRunMeasuresOnKubernetesThroughGeneratorPods(t *testing.T) {
	c := startTestCluster(t)
	if _, err := os.Stat(filepath.Join(prereq.IstioCharts(), "base")); err != nil {
		t.Skipf("no Istio charts (%v): make setup (or: meshmark setup --for test)", err)
	}
	var served atomic.Int64
	entry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		time.Sleep(200 * time.Microsecond)
		_, _ = w.Write([]byte("ok"))
	}))
	defer entry.Close()
	gens := standInGenerators(t, c, "front", entry.Listener.Addr().String())
	webhook := standInIstiod(t, c)
	// Every service refuses the probe's plaintext, as a sidecar under strict mTLS does.
	probes := c.StandInPlaintextProbe(t, kubetest.PlaintextProbe{
		Selector: kube.RoleLabel + "=" + kube.PlaintextProbeRole, ParseTarget: kube.ParsePlaintextTarget, Run: kube.RunPlaintextProbe, Control: kube.PlaintextControlService,
	})
	// The front sidecar counts what the entry service served; back's counts 3 at each
	// read. The generators' sidecars answer the bring-up's two reads, around its probe
	// burst, and nothing after: each trial finds them unreadable.
	var backReads atomic.Int64
	sidecars := standInSidecarStats(t, c, map[string]func() int64{
		"front": served.Load,
		"back":  func() int64 { return 3 * backReads.Add(1) },
	})

	dir := t.TempDir()
	graph := "name: two-tier\nservices:\n  - name: front\n    isEntrypoint: true\n    script: [call: back]\n  - name: back\n"
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(graph), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: kube-run}
spec:
  substrate:
    kubernetes:
      kubeconfig: %s
      image: registry.example/meshmark:test
      namespacePrefix: mmrun
      generators: 2
      sutNodeSelector: {meshmark.dev/test-node: "0"}
      loadgenNodeSelector: {type: kwok}
  workload: {graph: app.yaml}
  meshes:
    - {name: baseline, profile: none}
    - name: istio
      profile: envoy-sidecar
      options:
        mtls: strict
        istio_charts: %s
        helm_values:
          istio-base: {base: {validationURL: "%[3]s/validate"}}
          istiod: {base: {validationURL: "%[3]s/validate"}, istiodRemote: {injectionURL: "%[3]s/inject"}}
  repeats: 2
  experiments:
    - {name: latency, kind: fixed-rate, rate: 200, duration: 3s, warmup: 1s}
`, c.Kubeconfig, prereq.IstioCharts(), webhook)
	path := filepath.Join(dir, "study.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "results.db")

	reportDir := t.TempDir()
	out, errOut, err := execCLI("run", "--db", db, "--report-dir", reportDir, path)

	if err != nil {
		t.Fatalf("run: %v\n%s\n%s", err, out, errOut)
	}
	for _, want := range []string{"cluster https://127.0.0.1:", "2 load generators", "istio: installing ", "istio-discovery into istio-system",
		"istio: every pod is in the mesh (4 pods; each carries istio-proxy)",
		"istio: plaintext from outside the mesh refused by all 2 services (2× refused: connection closed without an answer)",
		"istio: every pod's proxy carried traffic: 2 proxies held to a 3s probe burst of ",
		"baseline torn down", "mesh uninstalled"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("progress does not say %q:\n%s", want, errOut)
		}
	}
	run := lastRun(t, db)
	if run.Status != "complete" || run.Substrate != "kubernetes" || len(run.Trials) != 4 {
		t.Fatalf("run %s: status %s, substrate %q, %d trials; want complete, kubernetes, one trial per mesh and repeat", run.ID, run.Status, run.Substrate, len(run.Trials))
	}
	// One run id: the namespaces carry the stored run's, which clean takes.
	for _, m := range []string{"baseline", "istio"} {
		if want := fmt.Sprintf("namespace mmrun-%s-%s", run.ID, m); !strings.Contains(errOut, want) {
			t.Errorf("progress does not say %q: the namespaces do not carry the stored run's id %s:\n%s", want, run.ID, errOut)
		}
	}
	var measured int64
	for _, tr := range run.Trials {
		// 200 req/s for 3 s after the warm-up, split over two generators whose
		// schedules interleave into one.
		if n := tr.Result.Requests; n < 595 || n > 605 || tr.Result.Errors != 0 {
			t.Errorf("%s repeat %d: %d requests, %d errors; want 600 (200/s for 3 s) and none", tr.Mesh, tr.Repeat, n, tr.Result.Errors)
		}
		if got := tr.Result.Latency.TotalCount(); got != tr.Result.Requests {
			t.Errorf("%s repeat %d: latency histogram holds %d requests, the trial %d", tr.Mesh, tr.Repeat, got, tr.Result.Requests)
		}
		if tr.Params.Extra["generators"] != "2" || !strings.Contains(tr.Params.Extra["url"], ".svc.cluster.local:9080/") {
			t.Errorf("%s repeat %d params %+v", tr.Mesh, tr.Repeat, tr.Params)
		}
		measured += tr.Result.Requests
	}
	// The stand-in served the warm-ups too, 800 per trial, and each Istio bring-up's
	// probe burst (67 req/s for 3 s: front's one pod must get 20, the floor is 200).
	if n := served.Load(); n < measured+2*195 || n > 4*805+2*205 {
		t.Errorf("the entry service served %d requests; the trials measured %d after warm-up (want about 3200 in all, and 2 bursts of 201)", n, measured)
	}
	if plans := gens.plans(); plans != 12 {
		t.Errorf("the generator processes ran %d plans, want 2 generators × (2 meshes × 2 repeats + 2 Istio bursts)", plans)
	}
	checkSidecarCounters(t, run, sidecars)
	// The progress says which sidecars could not be read, each with why.
	warned := regexp.MustCompile(`warning: envoy in meshmark-loadgen-\S+ could not be read \(pod meshmark-loadgen-\S+: GET /api/v1/namespaces/mmrun-\S+-istio/pods/meshmark-loadgen-\S+:15090/proxy/stats/prometheus: (?:[^()]|\([^()]*\))+\); envoy in meshmark-loadgen-`).FindAllString(errOut, -1)
	if len(warned) != 2 {
		t.Errorf("%d warnings name both generators' unreadable sidecars, want one per Istio trial:\n%s", len(warned), errOut)
	}
	var enr mesh.Enrollment
	if m := run.Mesh("istio"); m == nil || json.Unmarshal(m.Enrollment, &enr) != nil || !enr.Pass || len(enr.Pods) != 4 {
		t.Errorf("istio enrollment %+v: want every pod (2 of the app, 2 generators) checked and passing", enr)
	}
	// Before measuring, the burst was counted by both of the app's sidecars (front's
	// counted every request, back's its 3 per read); the generators' were read, not held.
	if tr := enr.Traffic; tr == nil || !tr.Proven || tr.Held != 2 || tr.Sent < 195 || tr.Succeeded != tr.Sent || len(tr.Proxies) != 4 {
		t.Errorf("istio traffic proof %+v: want both app sidecars held to a burst of about 201 requests, all answered, 4 sidecars read", tr)
	} else {
		for _, pe := range enr.Pods {
			if want := map[string]uint64{"front": uint64(tr.Sent), "back": 3}[pe.Service]; pe.InboundRequests != want {
				t.Errorf("istio enrollment row %+v: want %d inbound requests from the burst", pe, want)
			}
		}
	}
	// Strict mTLS: each bring-up's plaintext probe called both services, each refused.
	if enr.PlaintextRefused == nil || !*enr.PlaintextRefused || len(enr.Plaintext) != 2 || enr.Plaintext[0].Service != "back" || !enr.Plaintext[0].Refused ||
		enr.Plaintext[1].Service != "front" || !enr.Plaintext[1].Refused || !strings.Contains(enr.Plaintext[1].Target, ".svc.cluster.local:9080 (http)") {
		t.Errorf("istio enrollment stored plaintext refused %v, outcomes %+v: want both services probed and refusing", enr.PlaintextRefused, enr.Plaintext)
	}
	if installs, n := strings.Count(errOut, "istio: installed in "), len(probes.Pods()); n != installs || n == 0 {
		t.Errorf("%d plaintext probe pods for %d Istio bring-ups, want one each (and none for the baseline)", n, installs)
	}
	var effort results.InstallEffort
	found := false
	for _, gc := range run.Provenance.Configs {
		if gc.Mesh == "istio" && gc.Name == results.InstallEffortConfig {
			found = json.Unmarshal(gc.Content, &effort) == nil
		}
	}
	if e := effort; !found || len(e.CRDs) != 15 || e.Kinds["PeerAuthentication"] != 1 || e.Objects < 35 || e.Values != 3 || len(e.Charts) != 2 || e.Ready <= 0 {
		t.Errorf("istio install effort stored %v: %+v; want Istio's 2 charts, 15 CRDs, the strict PeerAuthentication, the 3 values set", found, effort)
	}
	reports, _ := filepath.Glob(filepath.Join(reportDir, "meshmark-*", "report.md"))
	if len(reports) != 1 {
		t.Fatalf("reports written: %v", reports)
	}
	report, err := os.ReadFile(reports[0])
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`\| istio \| 2 \| [0-9.]+ \| 3[5-9] \| 15 \| 3 \|`).Match(report) {
		t.Errorf("the report's install effort table does not show Istio's two installs:\n%s", report)
	}
	// The report judges the cluster's trials from the sidecars' counters as a local run's.
	if !regexp.MustCompile(`istio \| plaintext from outside refused \| PASS \|`).Match(report) {
		t.Errorf("the report's checks do not show that Istio refused plaintext from outside the mesh:\n%s", report)
	}
	if !regexp.MustCompile(`istio \| every request crossed the mesh's proxies at the entry service \| PASS \| in 0 of 2 trials`).Match(report) {
		t.Errorf("the report's checks do not show that Istio's sidecars counted every request in both trials:\n%s", report)
	}
	if left := meshmarkNamespaces(t, c); len(left) > 0 {
		t.Errorf("run left namespaces %v", left)
	}
	if left := istioLeftovers(t, c); len(left) > 0 {
		t.Errorf("run left Istio's %v", left)
	}
}

// sidecarStats are the stand-ins for istio-proxy's stats endpoint, one per meshed pod
// of the app, and what each served.
type sidecarStats struct {
	mu sync.Mutex
	// served is, by pod, its service and the request counts its stand-in served, in
	// order.
	served map[string][]int64
	svc    map[string]string
}

// standInSidecarStats watches for the app's pods that carry istio-proxy and serves, at
// each one's address and istio-proxy's stats port (reached through the API server's pod
// proxy, kubetest.ReachPodPort), Envoy's Prometheus stats as istio-proxy serves them,
// with the count of the pod's service's function as the requests that arrived at the
// pod: no sidecar runs on this cluster, so the test says what one counted. Pods of
// other services (the generators) answer the bring-up's two reads around its probe
// burst, counting nothing, and then fail, as sidecars that cannot be read.
func standInSidecarStats(t *testing.T, c *kubetest.Cluster, counts map[string]func() int64) *sidecarStats {
	t.Helper()
	st := &sidecarStats{served: map[string][]int64{}, svc: map[string]string{}}
	var servers []*httptest.Server
	t.Cleanup(func() {
		for _, s := range servers {
			s.Close()
		}
	})
	c.OnNewPods(t, kube.ManagedByLabel, func(_ context.Context, p *corev1.Pod) (bool, error) {
		service, count := p.Labels["app"], counts[p.Labels["app"]]
		if p.Status.PodIP == "" {
			return false, nil
		}
		meshed := false
		for _, ctr := range append(p.Spec.Containers, p.Spec.InitContainers...) {
			meshed = meshed || ctr.Name == "istio-proxy"
		}
		if !meshed {
			return false, nil
		}
		name, ns := p.Name, p.Namespace
		if count == nil {
			// kwok may give the pod the address of a pod of an earlier bring-up,
			// which the test served: the pod's port must lead to this pod's own
			// stand-in, which answers twice and then as a sidecar that is gone.
			var reads atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if reads.Add(1) > 2 {
					http.Error(w, "stand-in sidecar gone", http.StatusServiceUnavailable)
					return
				}
				fmt.Fprintf(w, "# TYPE envoy_server_live gauge\nenvoy_server_live{} 1\n# TYPE istio_build gauge\nistio_build{component=\"proxy\",tag=\"1.31.1\"} 1\n")
			}))
			servers = append(servers, srv)
			return true, c.ReachPodPort(p.Status.PodIP, 15090, srv.Listener.Addr().String())
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/stats/prometheus" {
				http.NotFound(w, r)
				return
			}
			n := count()
			st.mu.Lock()
			st.served[name] = append(st.served[name], n)
			st.mu.Unlock()
			fmt.Fprintf(w, "# TYPE istio_requests_total counter\n"+
				"istio_requests_total{reporter=\"destination\",source_workload=\"meshmark-loadgen\",source_workload_namespace=\"%[2]s\",destination_workload=\"%[3]s-v1\",destination_workload_namespace=\"%[2]s\",destination_canonical_service=\"%[3]s\",request_protocol=\"http\",response_code=\"200\",response_flags=\"-\",connection_security_policy=\"mutual_tls\"} %[1]d\n"+
				"# TYPE envoy_server_live gauge\nenvoy_server_live{} 1\n"+
				"# TYPE istio_build gauge\nistio_build{component=\"proxy\",tag=\"1.31.1\"} 1\n", n, ns, service)
		}))
		servers = append(servers, srv)
		st.mu.Lock()
		st.svc[name] = service
		st.mu.Unlock()
		return true, c.ReachPodPort(p.Status.PodIP, 15090, srv.Listener.Addr().String())
	})
	return st
}

// checkSidecarCounters: every Istio trial stores what each sidecar counted over it,
// exactly what its stand-in served between its reads before and after the trial (front:
// the requests the entry service answered, warm-up included; back: 3), with the
// generators' sidecars, which nothing serves, stored with the failure in the API
// server's words and the trial flagged, not the run failed; the baseline's trials read
// no proxy.
func checkSidecarCounters(t *testing.T, run *results.Run, sidecars *sidecarStats) {
	t.Helper()
	sidecars.mu.Lock()
	defer sidecars.mu.Unlock()
	trialsOn := map[string]int{}
	for _, tr := range run.Trials {
		if tr.Mesh == "baseline" {
			if len(tr.Result.ProxyStats) != 0 || tr.Result.HasFlag(results.FlagProxyUnreadable) {
				t.Errorf("baseline repeat %d: proxy counters %d, flags %v; the baseline has no proxy", tr.Repeat, len(tr.Result.ProxyStats), tr.Result.Flags)
			}
			continue
		}
		if tr.Result.HasFlag(results.FlagProxyBypassed) || !tr.Result.HasFlag(results.FlagProxyUnreadable) {
			t.Errorf("istio repeat %d: flags %v; want proxy-unreadable (the generators' sidecars), not proxy-bypassed", tr.Repeat, tr.Result.Flags)
		}
		unread, byService := 0, map[string]uint64{}
		for _, ps := range tr.Result.ProxyStats {
			var d mesh.ProxyDelta
			if err := json.Unmarshal(ps.Stats, &d); err != nil {
				t.Fatal(err)
			}
			if ps.Component != "envoy" || ps.Mesh != "istio" || d.Pod != ps.Pod {
				t.Errorf("istio repeat %d: stored %s/%s of mesh %s", tr.Repeat, ps.Component, ps.Pod, ps.Mesh)
			}
			service, ok := sidecars.svc[ps.Pod]
			if !ok {
				if !strings.Contains(d.Err, "GET /api/v1/namespaces/") || !strings.Contains(d.Err, "/pods/"+ps.Pod+":15090/proxy/stats/prometheus") {
					t.Errorf("istio repeat %d: the unserved sidecar of %s stored %+v; want the failure, naming its path", tr.Repeat, ps.Pod, d)
				}
				unread++
				continue
			}
			got := d.Inbound[service]
			// The bring-up's probe burst read the stand-in twice, before and after, and
			// so did each trial on the pod, and nothing else read it: this trial's
			// reads are the next pair.
			s, i := sidecars.served[ps.Pod], 2+2*trialsOn[ps.Pod]
			trialsOn[ps.Pod]++
			var want uint64
			if i+1 < len(s) {
				want = uint64(s[i+1] - s[i])
			}
			if d.Err != "" || i+1 >= len(s) || got != want || d.Version != "1.31.1" {
				t.Errorf("istio repeat %d: %s (%s) stored %+v; its stand-in served %v, so want inbound %d", tr.Repeat, ps.Pod, service, d, s, want)
			}
			byService[service] += got
		}
		if unread != 2 || len(tr.Result.ProxyStats) != 4 {
			t.Errorf("istio repeat %d: %d sidecars stored, %d unread; want the 4 pods' (2 generators' unread)", tr.Repeat, len(tr.Result.ProxyStats), unread)
		}
		if byService["front"] < uint64(tr.Result.Requests) || byService["front"] > 805 || byService["back"] != 3 {
			t.Errorf("istio repeat %d: sidecars counted %v, the trial measured %d requests after a 1 s warm-up", tr.Repeat, byService, tr.Result.Requests)
		}
	}
}

// standIns are the real generator processes behind the cluster's generator pods.
type standIns struct {
	mu   sync.Mutex
	logs []string
}

// plans counts the plans every stand-in generator said it ran.
func (s *standIns) plans() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.logs {
		b, _ := os.ReadFile(l)
		n += strings.Count(string(b), "plan ")
	}
	return n
}

// standInGenerators watches the cluster for load-generator pods and starts, for each,
// a `meshmark generator` process, as the pod's container would run it, with the pod's
// namespace; the entry service's cluster name resolves to the stand-in entry server.
// kwok's kubelet endpoint forwards the pod's generator port to the process.
func standInGenerators(t *testing.T, c *kubetest.Cluster, entryService, entryAddr string) *standIns {
	t.Helper()
	return standInGeneratorsTo(t, c, entryService, func(string) (string, bool) { return entryAddr, true })
}

// standInGeneratorsTo is standInGenerators with the entry's address known later: a
// generator pod gets its stand-in only once entry says where the entry service is.
func standInGeneratorsTo(t *testing.T, c *kubetest.Cluster, entryService string, entry func(namespace string) (string, bool)) *standIns {
	t.Helper()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	s := &standIns{}
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
		entryAddr, ok := entry(p.Namespace)
		if !ok {
			return false, nil // the entry service's stand-in is not up yet
		}
		host := fmt.Sprintf("%s.%s.svc.cluster.local:%d", entryService, p.Namespace, svc.Spec.Ports[0].Port)
		g, err := spawnGenerator(logDir, "--allow-namespace", p.Namespace, "--resolve", host+":"+entryAddr)
		if err != nil {
			return false, err
		}
		procs = append(procs, g.cmd)
		s.mu.Lock()
		s.logs = append(s.logs, g.log)
		s.mu.Unlock()
		return true, c.ForwardPodPort(ctx, p.Namespace, p.Name, kube.GeneratorPort, g.addr)
	})
	return s
}

// standInIstiod runs istiod beside the cluster (kubetest.StartIstiod) each time
// Istio's charts are installed, that is each time a new injector ConfigMap appears in
// istio-system, and returns the base URL of its webhooks for the charts' injectionURL
// and validationURL: through their Services, the API server's calls would go to
// addresses that exist nowhere.
func standInIstiod(t *testing.T, c *kubetest.Cluster) string {
	t.Helper()
	port, err := kubetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	logDir := t.TempDir()
	wg.Add(1)
	go func() {
		defer wg.Done()
		var cur *kubetest.Istiod
		defer func() {
			if cur != nil {
				cur.Stop()
			}
		}()
		lastUID := ""
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			cm, err := client.CoreV1().ConfigMaps("istio-system").Get(ctx, "istio-sidecar-injector", metav1.GetOptions{})
			if err != nil || string(cm.UID) == lastUID {
				continue
			}
			lastUID = string(cm.UID)
			if cur != nil {
				cur.Stop()
			}
			if cur, err = c.StartIstiod(port, logDir); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return kubetest.WebhookURL(port)
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
// generator pods runs on real nodes: TestCapacityRunKeptOnRealNodes.)
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

// TestPrecisionOnKubernetesAddsRounds: a precision target on Kubernetes adds rounds of
// the last stage through the generator pods, as on the local substrate, until the
// budget would be exceeded, and says so.
func TestPrecisionOnKubernetesAddsRounds(t *testing.T) {
	c := startTestCluster(t)
	entry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer entry.Close()
	standInGenerators(t, c, "front", entry.Listener.Addr().String())
	path := kubeStudy(t, c, "    - {name: base-a, profile: none}\n    - {name: base-b, profile: none}")
	rewriteStudy(t, path, "    - {name: latency, kind: fixed-rate, rate: 100, duration: 30s}",
		"    - {name: latency, kind: fixed-rate, rate: 100, duration: 1s, warmup: 200ms}\n  repeats: 2\n  precision: {p50: 0.001%, budget: 90s}")
	if _, errOut, err := execCLI("validate", path); err != nil {
		t.Fatalf("validate refuses precision on Kubernetes: %v\n%s", err, errOut)
	}
	run, errOut := runOnCluster(t, path)
	repeats := map[string]int{}
	for _, tr := range run.Trials {
		repeats[tr.Mesh] = max(repeats[tr.Mesh], tr.Repeat+1)
	}
	t.Logf("repeats per mesh %v", repeats)
	if repeats["base-a"] < 3 || repeats["base-a"] != repeats["base-b"] {
		t.Errorf("repeats per mesh %v: want more than the 2 planned, the same for both\n%s", repeats, errOut)
	}
	for _, want := range []string{"precision not met at 2 repeats", "adding repeats 3–", "would not fit the 1m30s budget"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("progress lacks %q:\n%s", want, errOut)
		}
	}
}

// TestRunOnClusterWithNoSuccessFails: a trial through the generator pods in which no
// request succeeded fails the run, which is stored failed with the reason, and leaves
// nothing on the cluster.
func TestRunOnClusterWithNoSuccessFails(t *testing.T) {
	c := startTestCluster(t)
	entry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer entry.Close()
	standInGenerators(t, c, "front", entry.Listener.Addr().String())
	path := kubeStudy(t, c, "    - {name: baseline, profile: none}")
	rewriteStudy(t, path, "    - {name: latency, kind: fixed-rate, rate: 100, duration: 30s}",
		"    - {name: latency, kind: fixed-rate, rate: 100, duration: 1s, warmup: 200ms}")
	db := filepath.Join(t.TempDir(), "results.db")
	_, errOut, err := execCLI("run", "--db", db, "--no-report", path)
	want := "latency 100 req/s on baseline, repeat 1, through 1 load generators: no request succeeded: 100 measured, all failed (non-2xx 100); answers 503×100"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("run: %v; want it to fail saying %q\n%s", err, want, errOut)
	}
	run := lastRun(t, db)
	if run.Status != results.StatusFailed || !strings.Contains(run.StatusReason, "no request succeeded") || len(run.Trials) != 0 {
		t.Errorf("stored run: status %s (%s), %d trials; want failed, saying why, no trial", run.Status, run.StatusReason, len(run.Trials))
	}
	if left := meshmarkNamespaces(t, c); len(left) > 0 {
		t.Errorf("run left namespaces %v", left)
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
