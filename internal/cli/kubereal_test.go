package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/substrate"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
)

// TestStudyOnRealNodes runs one study end to end on a real two-node cluster
// (localcluster: kubelets, containerd, bridge CNI, kube-proxy, CoreDNS): no mesh
// (spreading calls per request, and balanced per connection by kube-proxy), the Istio
// sidecar under strict mTLS and Istio ambient, each installed from its own charts with
// images built on this machine. Every part is real: two of meshmark's generator pods
// measure bookinfo's pods, each proxy's counters must have counted the probe burst and
// every trial, meshmark's plaintext probe pods must be refused by every meshed service
// while the positive control (a service outside the mesh) answers them, the kubelets'
// metrics give each container's CPU and working set, the cluster's own nodes are the
// run's provenance, and what each workload pod served, read from the pod itself, gives
// each trial's request mix (a third each per request, skewed and flagged per
// connection). Afterwards nothing of the run or of either mesh is left.
func TestStudyOnRealNodes(t *testing.T) {
	l := kubetest.SharedLocal(t)
	// Linkerd's images are built only on request (setup --for linkerd); Istio's, which
	// this test needs, are built by setup for every cluster.
	images, _, err := mesh.LocalImages()
	if err != nil {
		t.Fatal(err)
	}
	l.LoadImages(t, images...)

	// Two generator pods, whose schedules interleave into the study's one rate. The
	// baseline spreads calls per request; kube-proxy is the same app balanced per
	// connection, by kube-proxy, as callers that keep their connections are.
	path := realNodesStudy(t, l, "real-nodes", `    - {name: baseline, profile: none}
    - {name: kube-proxy, profile: none, options: {balancing: per-connection}}
    - {name: istio, profile: envoy-sidecar, options: {mtls: strict}}
    - {name: ambient, profile: istio-ambient, options: {mtls: strict}}
  baseline: baseline`, "      generators: 2\n",
		"    - {name: latency, kind: fixed-rate, rate: 40, duration: 12s, warmup: 2s}\n")
	db, reportDir := filepath.Join(t.TempDir(), "results.db"), t.TempDir()
	_, errOut, err := execCLI("run", "--db", db, "--report-dir", reportDir, path)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, errOut)
	}
	run := lastRun(t, db)

	if run.Status != results.StatusComplete || len(run.Trials) != 4 {
		t.Fatalf("run %s (%s) with %d trials, want complete with 4\n%s", run.Status, run.StatusReason, len(run.Trials), errOut)
	}
	for _, want := range []string{"2 load generators", "istio: installing ", "istio: every pod is in the mesh (", "ambient: every pod is in the mesh (",
		"baseline torn down", "mesh uninstalled"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("progress does not say %q:\n%s", want, errOut)
		}
	}
	for _, m := range []string{"baseline", "kube-proxy", "istio", "ambient"} {
		// One run id: the namespaces carry the stored run's, which clean takes.
		if want := fmt.Sprintf("namespace mmreal-%s-%s", run.ID, m); !strings.Contains(errOut, want) {
			t.Errorf("progress does not say %q: the namespaces do not carry the stored run's id %s", want, run.ID)
		}
	}
	for _, tr := range run.Trials {
		// 40 req/s for 12 s after the warm-up: every request answered, through
		// bookinfo's four services.
		if n := tr.Result.Requests; n < 475 || n > 485 || tr.Result.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors; want 480 (40/s for 12 s), none failed", tr.Mesh, n, tr.Result.Errors)
		}
		if got := tr.Result.Latency.TotalCount(); got != tr.Result.Requests {
			t.Errorf("%s: latency histogram holds %d requests, the trial %d", tr.Mesh, got, tr.Result.Requests)
		}
		if tr.Params.Extra["generators"] != "2" || !strings.Contains(tr.Params.Extra["url"], ".svc.cluster.local:9080/") {
			t.Errorf("%s: params %+v; want 2 generators calling productpage by its cluster name", tr.Mesh, tr.Params)
		}
		checkCountersOnRealNodes(t, tr)
		measured := measuredRoles(tr)
		want := map[string]substrate.Role{"baseline": substrate.RoleWorkload, "kube-proxy": substrate.RoleWorkload, "istio": substrate.RoleSidecar, "ambient": substrate.RoleNodeProxy}
		if !measured[substrate.RoleWorkload] || !measured[want[tr.Mesh]] {
			t.Errorf("%s: containers with CPU and memory read from their kubelets: %v; want the workload's and %s", tr.Mesh, measured, want[tr.Mesh])
		}
	}
	// The request mix is read from every pod through a port-forward to its loopback,
	// which no mesh intercepts: under strict mTLS too.
	if strings.Contains(errOut, "the request mix is not checked") {
		t.Errorf("the request mix was not checked:\n%s", errOut)
	}
	for _, tr := range run.Trials {
		reviews := map[string]results.VersionShare{}
		var total int64
		for _, v := range tr.Result.Mix {
			if v.Service == "reviews" {
				reviews[v.Version] = v
				total += v.Requests
			}
		}
		t.Logf("%s: reviews' mix %+v, flags %v", tr.Mesh, reviews, tr.Result.Flags)
		if len(reviews) != 3 || total < 400 {
			t.Errorf("%s: request mix %+v; want reviews' three versions read back, about 560 requests among them", tr.Mesh, tr.Result.Mix)
			continue
		}
		switch tr.Mesh {
		case "ambient":
			continue // ztunnel alone balances per connection (L4): its mix is what it is
		case "kube-proxy":
			// productpage keeps its connections to reviews, so a trial's calls stay on
			// the versions those connections were given: not a third each.
			if !tr.Result.HasFlag(results.FlagMixSkewed) {
				t.Errorf("kube-proxy: reviews' mix %+v not flagged skewed", reviews)
			}
			continue
		}
		// The baseline spreads per request over headless Services, Istio's sidecars
		// balance per request: a third each.
		for _, v := range reviews {
			if v.Share < 0.23 || v.Share > 0.43 || tr.Result.HasFlag(results.FlagMixSkewed) {
				t.Errorf("%s: reviews %s served %.0f%% of %d requests, flags %v: want a third each", tr.Mesh, v.Version, 100*v.Share, total, tr.Result.Flags)
			}
		}
	}
	if !regexp.MustCompile(`warning: request mix off by more than 10 points in latency 40 req/s on kube-proxy: reviews v\d served \d+% of \d+ requests`).MatchString(errOut) {
		t.Errorf("progress does not warn of kube-proxy's mix:\n%s", errOut)
	}
	for _, m := range run.Meshes {
		if m.Label == "baseline" || m.Label == "kube-proxy" {
			continue
		}
		// ratings is called only by reviews v2 and v3: under ambient's per-connection
		// balancing the burst may all go to v1, and then ratings serves none of it and
		// is not held to it.
		checkStrictOnRealNodes(t, m, m.Label == "ambient")
	}
	if c := run.Provenance.Cluster; c == nil || len(c.Nodes) != 2 || c.Nodes[0].KubeletVersion == "" {
		t.Errorf("provenance of the cluster: %+v; want its two nodes", c)
	}
	for _, want := range []string{"every pod's proxy carried traffic", "plaintext"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("progress lacks %q:\n%s", want, errOut)
		}
	}

	checkEffortOnRealNodes(t, run, reportDir)
	checkNothingLeft(t, l, "istio-system")
}

// checkCountersOnRealNodes holds a trial to what its proxies counted over it: a trial
// with no mesh reads none; every proxy of a mesh is read (none unreadable, none bypassed),
// and the proxies at productpage counted, in their unit, at least the trial's measured
// requests (the warm-up's too, 80 more, no more than that): Istio's sidecars count
// requests, ztunnel connections.
func checkCountersOnRealNodes(t *testing.T, tr results.Trial) {
	t.Helper()
	if tr.Mesh == "baseline" || tr.Mesh == "kube-proxy" {
		if len(tr.Result.ProxyStats) != 0 || tr.Result.HasFlag(results.FlagProxyUnreadable) {
			t.Errorf("%s: proxy counters %d, flags %v; no mesh, no proxy", tr.Mesh, len(tr.Result.ProxyStats), tr.Result.Flags)
		}
		return
	}
	if tr.Result.HasFlag(results.FlagProxyBypassed) || tr.Result.HasFlag(results.FlagProxyUnreadable) {
		t.Errorf("%s: flags %v; want every proxy read, none bypassed", tr.Mesh, tr.Result.Flags)
	}
	entry := map[string]uint64{}
	for _, ps := range tr.Result.ProxyStats {
		var d mesh.ProxyDelta
		if err := json.Unmarshal(ps.Stats, &d); err != nil {
			t.Fatal(err)
		}
		if d.Err != "" || d.Pod != ps.Pod || ps.Mesh != tr.Mesh {
			t.Errorf("%s: %s in %s stored %+v", tr.Mesh, ps.Component, ps.Pod, d)
		}
		entry[d.Unit] += d.Inbound["productpage"]
	}
	t.Logf("%s: %d proxies read; productpage's inbound by unit %v over %d requests", tr.Mesh, len(tr.Result.ProxyStats), entry, tr.Result.Requests)
	switch tr.Mesh {
	case "istio":
		// productpage's sidecar, and every generator's and bookinfo's pod has one.
		if n := entry["requests"]; len(tr.Result.ProxyStats) < 8 || n < uint64(tr.Result.Requests) || n > uint64(tr.Result.Requests)+85 {
			t.Errorf("istio: %d sidecars read, productpage's counted %d requests; want 8 (6 of bookinfo, 2 generators) and the trial's %d plus its warm-up's 80",
				len(tr.Result.ProxyStats), n, tr.Result.Requests)
		}
	case "ambient":
		// One ztunnel per node; each generator pod opened a connection at least.
		if len(tr.Result.ProxyStats) != 2 || entry["connections"] < 2 {
			t.Errorf("ambient: %d ztunnels read, productpage's connections %d; want both nodes' and one per generator at least", len(tr.Result.ProxyStats), entry["connections"])
		}
	}
}

// checkEffortOnRealNodes: each mesh's install effort, counted from its own charts, is
// stored and reported, and the report judges the meshes from their proxies' counters
// and the plaintext probe as it judges a local run.
func checkEffortOnRealNodes(t *testing.T, run *results.Run, reportDir string) {
	t.Helper()
	for label, charts := range map[string]int{"istio": 2, "ambient": 4} {
		var effort results.InstallEffort
		found := false
		for _, gc := range run.Provenance.Configs {
			if gc.Mesh == label && gc.Name == results.InstallEffortConfig {
				found = json.Unmarshal(gc.Content, &effort) == nil
			}
		}
		if e := effort; !found || len(e.CRDs) < 10 || e.Kinds["PeerAuthentication"] != 1 || len(e.Charts) != charts || e.Objects < 20 || e.Ready <= 0 {
			t.Errorf("%s: install effort stored %v: %+v; want its %d charts, Istio's CRDs, the strict PeerAuthentication", label, found, effort, charts)
		}
	}
	reports, _ := filepath.Glob(filepath.Join(reportDir, "meshmark-*", "report.md"))
	if len(reports) != 1 {
		t.Fatalf("reports written: %v", reports)
	}
	report, err := os.ReadFile(reports[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`\| istio \| 1 \| [0-9.]+ \| \d+ \| \d+ \| \d+ \|`, `\| ambient \| 1 \| [0-9.]+ \| \d+ \| \d+ \| \d+ \|`,
		`istio \| plaintext from outside refused \| PASS \|`, `ambient \| plaintext from outside refused \| PASS \|`,
		`istio \| every request crossed the mesh's proxies at the entry service \| PASS \| in 0 of 1 trials`,
		`ambient \| every request crossed the mesh's proxies at the entry service \| PASS \| in 0 of 1 trials`,
	} {
		if !regexp.MustCompile(want).Match(report) {
			t.Errorf("the report lacks %s:\n%s", want, report)
		}
	}
}

// checkStrictOnRealNodes holds a mesh of a real-node run to what strict mTLS promises:
// the enrollment passed with every proxy having counted the burst; bookinfo's four
// services refused plaintext while the positive control answered it; and the proxies'
// own counters saw the burst come in over mTLS at every service and in plaintext at
// none (ratings excused where the burst may not reach it).
func checkStrictOnRealNodes(t *testing.T, m results.Mesh, ratingsMayIdle bool) {
	t.Helper()
	var e mesh.Enrollment
	if err := json.Unmarshal(m.Enrollment, &e); err != nil {
		t.Fatalf("%s: enrollment %s: %v", m.Label, m.Enrollment, err)
	}
	if e.MTLS != mesh.MTLSStrict {
		t.Errorf("%s: enrollment's mTLS mode %q, want strict as the study configured", m.Label, e.MTLS)
	}
	if !e.Pass || e.Traffic == nil || !e.Traffic.Proven || len(e.Traffic.Proxies) == 0 {
		t.Errorf("%s: enrollment pass %v, traffic %+v; want every proxy to have counted the burst", m.Label, e.Pass, e.Traffic)
	}
	if e.PlaintextRefused == nil || !*e.PlaintextRefused || len(e.Plaintext) < 4 {
		t.Errorf("%s: plaintext %+v; want bookinfo's four services to refuse it", m.Label, e.Plaintext)
	}
	seen := map[string]bool{}
	for _, p := range e.Pods {
		switch p.MTLSObserved {
		case "mtls":
			seen[p.Service] = true
		case "plaintext", "mixed":
			t.Errorf("%s: pod %s took plaintext during the burst: %+v", m.Label, p.Pod, p)
		}
	}
	for _, svc := range []string{"productpage", "details", "reviews", "ratings"} {
		if !seen[svc] && !(svc == "ratings" && ratingsMayIdle) {
			t.Errorf("%s: mTLS seen on the wire for services %v; want %s among them", m.Label, seen, svc)
		}
	}
	if len(e.PlaintextControl) == 0 {
		t.Errorf("%s: no positive control for the plaintext probe", m.Label)
	}
	for _, c := range e.PlaintextControl {
		if c.Refused {
			t.Errorf("%s: the positive control refused the probe: %+v", m.Label, c)
		}
	}
}

// TestLinkerdOnRealNodes runs Linkerd (edge-26.8.3, its control plane built from the
// linkerd2 repository and linkerd2-proxy's release build, installed from its own
// charts) with its all-authenticated policy on the real two-node cluster: its injector
// must have put linkerd-proxy in every pod, every proxy counted the burst over mTLS
// (the kubelet's plaintext probes, which the policy admits, not counted as traffic),
// plaintext is refused with the positive control answering, the proxies' CPU and
// memory are read from their kubelets, and nothing of the run or of Linkerd is left.
// Linkerd's images are built only by `meshmark setup --for linkerd`, which fetches the
// linkerd2 sources from GitHub: a machine that reaches only package registries cannot
// build them, so there the test says so and skips, under CI too.
func TestLinkerdOnRealNodes(t *testing.T) {
	images, notBuilt, err := mesh.LocalImages()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range notBuilt {
		if strings.HasPrefix(n, "mesh linkerd:") {
			t.Skipf("%s (it needs GitHub, which a machine reaching only package registries does not)", n)
		}
	}
	l := kubetest.SharedLocal(t)
	l.LoadImages(t, images...)

	run, errOut := runOnRealNodes(t, l, "real-nodes-linkerd", `    - {name: linkerd, profile: linkerd, options: {mtls: strict}}`)
	if run.Status != results.StatusComplete || len(run.Trials) != 1 || len(run.Meshes) != 1 {
		t.Fatalf("run %s (%s) with %d trials, want complete with 1\n%s", run.Status, run.StatusReason, len(run.Trials), errOut)
	}
	tr := run.Trials[0]
	if tr.Result.Requests < 400 || tr.Result.Errors != 0 {
		t.Errorf("%d requests, %d errors; want about 480, none failed", tr.Result.Requests, tr.Result.Errors)
	}
	if measured := measuredRoles(tr); !measured[substrate.RoleWorkload] || !measured[substrate.RoleSidecar] {
		t.Errorf("containers with CPU and memory read from their kubelets: %v; want the workload's and the sidecars'", measured)
	}
	checkStrictOnRealNodes(t, run.Meshes[0], false)
	checkNothingLeft(t, l, "linkerd")
}

// runOnRealNodes runs a study of bookinfo with meshes (YAML list items) on the shared
// real cluster: one generator, 40 req/s for 12 s, one repeat.
func runOnRealNodes(t *testing.T, l *kubetest.Local, name, meshes string) (*results.Run, string) {
	t.Helper()
	return runOnCluster(t, realNodesStudy(t, l, name, meshes, "      generators: 1\n",
		"    - {name: latency, kind: fixed-rate, rate: 40, duration: 12s, warmup: 2s}\n"))
}

// realNodesStudy writes a study of bookinfo on the shared real cluster, its namespaces
// prefixed mmreal, with meshes and experiments (YAML list items) and more of the
// kubernetes substrate's fields (indented lines).
func realNodesStudy(t *testing.T, l *kubetest.Local, name, meshes, substrate, experiments string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "study.yaml")
	doc := fmt.Sprintf(`apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: %s}
spec:
  substrate:
    kubernetes:
      kubeconfig: %s
      image: %s
      namespacePrefix: mmreal
%s  workload: {graph: bookinfo}
  meshes:
%s
  experiments:
%s  repeats: 1
`, name, l.Kubeconfig, l.Image, substrate, meshes, experiments)
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunKeptOnRealNodes: on the real cluster, a run through two real generator pods
// stores the cluster's own provenance (its server's version, its two nodes' kubelets
// and containerd, the meshmark image each pod ran with the digest its node resolved);
// with cleanup off, the run's two meshes, whose interleaved repeats bring each up again,
// are removed before each new bring-up (which would meet them), the app's namespace up
// at the end stays under the run's stored id, and `meshmark clean --kubernetes --all
// ID` takes that id and leaves nothing. (The capacity search on the cluster is
// TestCapacityOnBothPlatforms.)
func TestRunKeptOnRealNodes(t *testing.T) {
	l := kubetest.SharedLocal(t)
	path := realNodesStudy(t, l, "real-nodes-kept", "    - {name: baseline, profile: none}\n    - {name: again, profile: none}",
		"      generators: 2\n      cleanup: false\n",
		"    - {name: fixed, kind: fixed-rate, rate: 100, duration: 2s, warmup: 1s, repeats: 2}\n")
	run, errOut := runOnCluster(t, path)
	t.Cleanup(func() {
		_, _, _ = execCLI("clean", "--kubernetes", "--kubeconfig", l.Kubeconfig, "--all", run.ID)
	})

	ups := map[string]int{}
	for i, tr := range run.Trials {
		if i == 0 || run.Trials[i-1].Mesh != tr.Mesh {
			ups[tr.Mesh]++
		}
		if tr.Result.Errors != 0 || tr.Throughput() < 95 {
			t.Errorf("%s repeat %d: %d errors, %.0f req/s of 100", tr.Mesh, tr.Repeat+1, tr.Result.Errors, tr.Throughput())
		}
	}
	if len(run.Trials) != 4 || ups["baseline"] == 0 || ups["again"] == 0 || ups["baseline"]+ups["again"] < 3 {
		t.Fatalf("%d trials, bring-ups %v; want two on each mesh, a mesh brought up twice", len(run.Trials), ups)
	}

	cp := run.Provenance.Cluster
	if cp == nil || !strings.HasPrefix(cp.ServerVersion, "v1.") || len(cp.Nodes) != 2 {
		t.Fatalf("cluster provenance %+v: want the server's version and its 2 nodes", cp)
	}
	for _, n := range cp.Nodes {
		if !strings.HasPrefix(n.KubeletVersion, "v1.") || !strings.HasPrefix(n.ContainerRuntime, "containerd://") || n.CPU == "" {
			t.Errorf("node %+v: want its kubelet's version, containerd and its capacity", n)
		}
	}
	pods := map[string]int{}
	for _, im := range cp.Images {
		if im.Mesh == "baseline" && im.Image == l.Image && strings.HasPrefix(im.ImageID, "sha256:") {
			pods[im.Container] += im.Pods
		}
	}
	if n := pods["app"] / 6; n == 0 || pods["app"] != 6*n || pods["generator"] != 2*n {
		t.Errorf("images %+v: want the meshmark image, with its digest, in bookinfo's 6 pods and 2 generators at each bring-up", cp.Images)
	}

	want := "mmreal-" + run.ID + "-" + run.Trials[len(run.Trials)-1].Mesh
	kept := keptNamespaces(t, l)
	if len(kept) != 1 || kept[0] != want {
		t.Fatalf("cleanup: false kept namespaces %v, want [%s] (the stored run id %s)\n%s", kept, want, run.ID, errOut)
	}
	if hint := "remove it with `meshmark clean --kubernetes --all " + run.ID + "`"; !strings.Contains(errOut, hint) {
		t.Errorf("progress does not say %q:\n%s", hint, errOut)
	}
	out, _, err := execCLI("clean", "--kubernetes", "--kubeconfig", l.Kubeconfig, "--all", "0123456789ab")
	if err != nil || !strings.Contains(out, "nothing to clean") || len(keptNamespaces(t, l)) != 1 {
		t.Errorf("clean of another run's id: %v\n%s", err, out)
	}
	out, _, err = execCLI("clean", "--kubernetes", "--kubeconfig", l.Kubeconfig, "--all", run.ID)
	if err != nil || !strings.Contains(out, "namespace "+want+" (run "+run.ID+"): removed") {
		t.Errorf("clean --all %s: %v\n%s", run.ID, err, out)
	}
	checkNothingLeft(t, l, "")
}

// keptNamespaces are the namespaces of the real cluster that meshmark's label marks.
func keptNamespaces(t *testing.T, l *kubetest.Local) []string {
	t.Helper()
	list, err := l.ClientOf(t).CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{LabelSelector: kube.ManagedByLabel + "=" + kube.ManagedBy})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range list.Items {
		if ns.DeletionTimestamp == nil {
			names = append(names, ns.Name)
		}
	}
	return names
}

// measuredRoles are the roles of a trial's containers whose CPU and memory were read.
func measuredRoles(tr results.Trial) map[substrate.Role]bool {
	measured := map[substrate.Role]bool{}
	for _, s := range tr.Result.Resources {
		if s.CPUUserSeconds+s.CPUSysSeconds > 0 && s.RSSBytes > 0 {
			measured[substrate.Role(s.Role)] = true
		}
	}
	return measured
}

// checkNothingLeft wants no namespace of a real-node run, nor the mesh's own (if any),
// left.
func checkNothingLeft(t *testing.T, l *kubetest.Local, meshNamespace string) {
	t.Helper()
	nss, err := l.ClientOf(t).CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range nss.Items {
		if strings.HasPrefix(ns.Name, "mmreal") || (meshNamespace != "" && ns.Name == meshNamespace) {
			t.Errorf("namespace %s left after the run (%s)", ns.Name, ns.Status.Phase)
		}
	}
}

// TestRunWithClusterDNSDownFailsOnRealNodes: with the cluster's DNS not answering (its
// CoreDNS scaled to none, as a user's broken cluster was seen), the generator pod cannot
// resolve the entry service, so none of the requests it sends before the first trial,
// to see that the entry answers it, is answered: the run fails before any trial saying
// so, with the failed lookups counted, and is stored failed, not complete with 0%
// errors. Nothing of it is left, and CoreDNS is brought back for the next test. (A trial
// in which no request succeeded fails the run too: TestFailedRunsOnBothPlatforms.)
func TestRunWithClusterDNSDownFailsOnRealNodes(t *testing.T) {
	l := kubetest.SharedLocal(t)
	client := l.ClientOf(t)
	ctx := context.Background()
	scaleDNS := func(replicas int) error {
		patch := []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas))
		if _, err := client.AppsV1().Deployments("kube-system").Patch(ctx, "coredns", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			return err
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			d, err := client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
			if err != nil {
				return err
			}
			pods, err := client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
			if err != nil {
				return err
			}
			if int(d.Status.ReadyReplicas) == replicas && len(pods.Items) == replicas {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CoreDNS: %d of %d replicas ready, %d pods, 2 minutes after scaling", d.Status.ReadyReplicas, replicas, len(pods.Items))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	if err := scaleDNS(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := scaleDNS(1); err != nil {
			t.Errorf("bringing CoreDNS back: %v", err)
		}
	})

	path := realNodesStudy(t, l, "real-nodes-no-dns", "    - {name: baseline, profile: none}", "      generators: 1\n",
		"    - {name: latency, kind: fixed-rate, rate: 20, duration: 2s, warmup: 500ms}\n")
	db := filepath.Join(t.TempDir(), "results.db")
	start := time.Now()
	_, errOut, err := execCLI("run", "--db", db, "--no-report", path)
	t.Logf("run failed after %s: %v", time.Since(start).Round(time.Second), err)
	if err == nil || !strings.Contains(err.Error(), "mesh baseline: the entry service did not answer the load generators within 30s: 0 of ") ||
		!regexp.MustCompile(`[1-9][0-9]* failed lookups`).MatchString(err.Error()) {
		t.Fatalf("run with the cluster's DNS down: %v; want it to fail before any trial, no request having been answered, its lookups failed\n%s", err, errOut)
	}
	run := lastRun(t, db)
	if run.Status != results.StatusFailed || !strings.Contains(run.StatusReason, "did not answer the load generators") || len(run.Trials) != 0 {
		t.Errorf("stored run: status %s (%s), %d trials; want failed, saying why, no trial", run.Status, run.StatusReason, len(run.Trials))
	}
	checkNothingLeft(t, l, "")
}

// TestDeployOnRealNodesWaitsAndLeavesNothing: `meshmark deploy` brings each mesh's
// bookinfo up on the real cluster, waits on the kubelets' word that every pod is ready
// (their readiness probes answered), prints one line per mesh and removes it all;
// with --keep it leaves them, `clean --kubernetes` keeps a live owner's namespaces, and
// `clean --kubernetes --all RUN` removes them.
func TestDeployOnRealNodesWaitsAndLeavesNothing(t *testing.T) {
	l := kubetest.SharedLocal(t)
	path := realNodesStudy(t, l, "real-nodes-deploy", "    - {name: baseline, profile: none}\n    - {name: baseline-b, profile: none}",
		"      generators: 1\n", "    - {name: latency, kind: fixed-rate, rate: 40, duration: 12s}\n")

	out, errOut, err := execCLI("deploy", path)
	if err != nil {
		t.Fatalf("deploy: %v\n%s", err, errOut)
	}
	// One line per mesh: its own namespace, bookinfo's six pods and the load generator.
	rows := regexp.MustCompile(`(?m)^(baseline(?:-b)?)\s+(mmreal-[0-9a-f]{6}-baseline(?:-b)?)\s+7 pods\s+\d+ objects\s+ready in `).FindAllStringSubmatch(out, -1)
	if len(rows) != 2 || rows[0][2] == rows[1][2] {
		t.Errorf("deploy printed:\n%s\nprogress:\n%s", out, errOut)
	}
	for _, want := range []string{"] baseline: 7/7 pods ready", "] baseline-b up in", "namespace mmreal-", "removed"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("progress does not say %q:\n%s", want, errOut)
		}
	}
	if left := keptNamespaces(t, l); len(left) > 0 {
		t.Errorf("deploy left namespaces %v", left)
	}

	_, errOut, err = execCLI("deploy", "--keep", path)
	if err != nil {
		t.Fatalf("deploy --keep: %v\n%s", err, errOut)
	}
	run := regexp.MustCompile(`--all ([0-9a-f]{6})`).FindStringSubmatch(errOut)
	if run != nil {
		t.Cleanup(func() { _, _, _ = execCLI("clean", "--kubernetes", "--kubeconfig", l.Kubeconfig, "--all", run[1]) })
	}
	if kept := keptNamespaces(t, l); len(kept) != 2 || run == nil {
		t.Fatalf("deploy --keep left %v; progress:\n%s", kept, errOut)
	}
	out, _, err = execCLI("clean", "--kubernetes", "--kubeconfig", l.Kubeconfig)
	if err != nil || !strings.Contains(out, "kept (owner pid") || len(keptNamespaces(t, l)) != 2 {
		t.Errorf("clean without --all must keep a live owner's namespaces: %v\n%s", err, out)
	}
	out, _, err = execCLI("clean", "--kubernetes", "--kubeconfig", l.Kubeconfig, "--all", run[1])
	if err != nil || strings.Count(out, ": removed") != 2 {
		t.Errorf("clean --all: %v\n%s", err, out)
	}
	checkNothingLeft(t, l, "")
}

// TestBypassedSidecarStopsTheRunOnRealNodes: Istio's injector puts istio-proxy in every
// pod, but is told, with Istio's own setting (global.proxy.excludeInboundPorts, given
// through the study's helm_values), to leave the app's port 9080 out of each pod's
// inbound redirection: the static check sees every pod enrolled, yet every request
// reaches the app around its sidecar. mTLS is off so that the callers' sidecars send
// plaintext the app can read (under auto mTLS they would send TLS to a port the app
// serves in plaintext, and the burst would fail on errors instead). The probe burst
// must catch it: each sidecar counted nothing for its own service, the run stops before
// any trial, naming the pods, and is stored failed with the check; nothing is left.
func TestBypassedSidecarStopsTheRunOnRealNodes(t *testing.T) {
	l := sharedLocalWithMeshImages(t)

	path := realNodesStudy(t, l, "real-nodes-bypass",
		`    - {name: bypassed, profile: envoy-sidecar, options: {mtls: off, helm_values: {istiod: {global: {proxy: {excludeInboundPorts: "9080"}}}}}}`,
		"      generators: 1\n", "    - {name: latency, kind: fixed-rate, rate: 20, duration: 2s, warmup: 500ms}\n")
	errOut, enr, err := runRefusedAtEnrollment(t, path)
	if !strings.Contains(err.Error(), "refusing to measure it") || !strings.Contains(err.Error(), "its traffic bypassed the proxy") {
		t.Fatalf("run of a mesh its requests bypass: %v; want it refused, the traffic having bypassed the proxies\n%s", err, errOut)
	}
	if enr.Pass || enr.Traffic == nil || enr.Traffic.Proven || enr.Traffic.Succeeded == 0 || enr.Traffic.Succeeded != enr.Traffic.Sent {
		t.Errorf("enrollment pass %v, traffic %+v: want the burst answered in full, around the proxies, and the check failed", enr.Pass, enr.Traffic)
	}
	// Every service pod carries its sidecar, and each is named for counting nothing.
	bypassed := map[string]bool{}
	for _, f := range enr.Failures {
		if m := regexp.MustCompile(`^pod (\S+): its istio-proxy counted no inbound request for (\w+) during `).FindStringSubmatch(f); m != nil && strings.HasSuffix(f, "its traffic bypassed the proxy") {
			bypassed[m[2]] = true
		}
	}
	for _, svc := range []string{"productpage", "details", "reviews", "ratings"} {
		if !bypassed[svc] {
			t.Errorf("no failure names %s's pods as bypassed: %q", svc, enr.Failures)
		}
	}
	sidecars := 0
	for _, p := range enr.Pods {
		if p.Sidecar {
			sidecars++
		}
	}
	if sidecars < 6 {
		t.Errorf("%d pods with their sidecar read; want bookinfo's six at least: the injection happened, the redirection did not", sidecars)
	}
	checkNothingLeft(t, l, "istio-system")
}

// TestPlaintextLeakStopsTheRunOnRealNodes: Istio's sidecar under strict mTLS, as the
// study configures it, but with a PeerAuthentication in the app's namespace, made by
// the test as soon as the namespace appears, that leaves details PERMISSIVE: a real
// misconfiguration under which one service serves anyone in plaintext. The plaintext
// probe pods, outside the mesh, must be served by details alone, and the run stops
// before any trial naming details and what it answered, the check stored failed, while
// the other services refused and the positive control answered. Nothing is left.
func TestPlaintextLeakStopsTheRunOnRealNodes(t *testing.T) {
	l := sharedLocalWithMeshImages(t)
	rc, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	client := l.ClientOf(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	leaked := make(chan string, 1)
	go func() {
		// The app's namespace is created after the mesh's charts, so Istio's CRDs are
		// there by then.
		for ctx.Err() == nil {
			nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: kube.ManagedByLabel})
			if err == nil {
				for _, ns := range nss.Items {
					if !strings.HasPrefix(ns.Name, "mmreal-") || !strings.HasSuffix(ns.Name, "-leaky") {
						continue
					}
					pa := &unstructured.Unstructured{Object: map[string]any{
						"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
						"metadata": map[string]any{"name": "details-permissive", "namespace": ns.Name},
						"spec":     map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "details"}}, "mtls": map[string]any{"mode": "PERMISSIVE"}},
					}}
					gvr := schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "peerauthentications"}
					if _, err := dyn.Resource(gvr).Namespace(ns.Name).Create(ctx, pa, metav1.CreateOptions{}); err != nil {
						leaked <- "creating the PeerAuthentication: " + err.Error()
					} else {
						leaked <- ns.Name
					}
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	path := realNodesStudy(t, l, "real-nodes-leak", `    - {name: leaky, profile: envoy-sidecar, options: {mtls: strict}}`,
		"      generators: 1\n", "    - {name: latency, kind: fixed-rate, rate: 20, duration: 2s, warmup: 500ms}\n")
	errOut, enr, err := runRefusedAtEnrollment(t, path)
	stop()
	select {
	case ns := <-leaked:
		t.Logf("PeerAuthentication details-permissive made in %s", ns)
	default:
		t.Fatalf("the app's namespace never appeared\n%s", errOut)
	}
	if !strings.Contains(err.Error(), "mesh leaky is not set up as claimed, refusing to measure it: service details served a plaintext request from outside the mesh (details.") {
		t.Fatalf("run of a mesh one of whose services serves plaintext: %v; want it refused, naming details\n%s", err, errOut)
	}
	if enr.Pass || enr.PlaintextRefused == nil || *enr.PlaintextRefused || len(enr.Failures) != 1 {
		t.Errorf("enrollment pass %v, plaintext refused %v, failures %q: want the one failure, for details", enr.Pass, enr.PlaintextRefused, enr.Failures)
	}
	served := map[string]bool{}
	for _, p := range enr.Plaintext {
		served[p.Service] = served[p.Service] || !p.Refused
	}
	if len(served) != 4 || !served["details"] || served["productpage"] || served["reviews"] || served["ratings"] {
		t.Errorf("plaintext served by %v; want details alone of bookinfo's four: %+v", served, enr.Plaintext)
	}
	if len(enr.PlaintextControl) == 0 || slices.ContainsFunc(enr.PlaintextControl, func(c meshprobe.PlaintextProbe) bool { return c.Refused }) {
		t.Errorf("positive control %+v; want it answered", enr.PlaintextControl)
	}
	checkNothingLeft(t, l, "istio-system")
}

// sharedLocalWithMeshImages is the shared real cluster with the meshes' images loaded
// into its nodes.
func sharedLocalWithMeshImages(t *testing.T) *kubetest.Local {
	t.Helper()
	l := kubetest.SharedLocal(t)
	images, _, err := mesh.LocalImages()
	if err != nil {
		t.Fatal(err)
	}
	l.LoadImages(t, images...)
	return l
}

// runRefused runs the study at path, which must fail before any trial, and returns the
// progress, the run stored failed, and why it failed.
func runRefused(t *testing.T, path string) (string, *results.Run, error) {
	t.Helper()
	db := filepath.Join(t.TempDir(), "results.db")
	_, errOut, err := execCLI("run", "--db", db, "--no-report", path)
	t.Logf("run: %v", err)
	if err == nil {
		t.Fatalf("the run was not refused\n%s", errOut)
	}
	run := lastRun(t, db)
	if run.Status != results.StatusFailed || len(run.Trials) != 0 {
		t.Fatalf("stored run: status %s (%s), %d trials; want failed before any trial", run.Status, run.StatusReason, len(run.Trials))
	}
	return errOut, run, err
}

// runRefusedAtEnrollment runs the study at path, of one mesh, which must fail before any
// trial, and returns the progress, the enrollment check stored with the failed run, and
// why it failed.
func runRefusedAtEnrollment(t *testing.T, path string) (string, mesh.Enrollment, error) {
	t.Helper()
	errOut, run, err := runRefused(t, path)
	if len(run.Meshes) != 1 {
		t.Fatalf("stored run with %d meshes; want the one, with its check", len(run.Meshes))
	}
	var enr mesh.Enrollment
	if err := json.Unmarshal(run.Meshes[0].Enrollment, &enr); err != nil {
		t.Fatalf("enrollment %s: %v", run.Meshes[0].Enrollment, err)
	}
	return errOut, enr, err
}

// TestAmbientWithoutItsNodeAgentStopsTheRunOnRealNodes: Istio ambient from its own
// charts on the real cluster, but with istio-cni's node agent told to run only on a
// node that does not exist, as on a cluster whose nodes it cannot run on. On kwok,
// where no pod runs, the same install reaches the enrollment check, which refuses it
// (TestAmbientThatEnrollsNothingIsRefused). On real nodes it does not get that far:
// istio-cni's install fails as soon as its DaemonSet is placed on no node, naming it
// (without that, ztunnel would wait for the agent until readyTimeout and the error name
// ztunnel), the run is stored failed with no trial, and nothing is left behind.
func TestAmbientWithoutItsNodeAgentStopsTheRunOnRealNodes(t *testing.T) {
	l := sharedLocalWithMeshImages(t)
	path := realNodesStudy(t, l, "real-nodes-no-cni-agent", `    - name: stranded
      profile: istio-ambient
      options:
        helm_values:
          istio-cni:
            affinity:
              nodeAffinity:
                requiredDuringSchedulingIgnoredDuringExecution:
                  nodeSelectorTerms:
                    - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [no-such-node]}]`,
		"      generators: 1\n      readyTimeout: 45s\n", "    - {name: latency, kind: fixed-rate, rate: 20, duration: 2s, warmup: 500ms}\n")
	errOut, _, err := runRefused(t, path)
	if !regexp.MustCompile(`mesh stranded: install istio-cni .*: daemonset istio-cni-node runs on no node: its node selector, affinity and tolerations leave out each of the cluster's 2 nodes`).MatchString(err.Error()) {
		t.Fatalf("run of ambient without its node agent: %v; want the install of istio-cni to name its DaemonSet placed on no node\n%s", err, errOut)
	}
	checkNothingLeft(t, l, "istio-system")
}
