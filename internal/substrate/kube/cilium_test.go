package kube

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/mesh/cilium"
	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/substrate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// ciliumPlan is the install the cilium profile describes for options, from the
// stand-in chart in testdata/charts/cilium (Cilium's own cannot be fetched here, nor
// run: its agent is eBPF in each node's kernel).
func ciliumPlan(t *testing.T, options map[string]any) meshkube.KubernetesInstall {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "charts", "cilium"))
	if err != nil {
		t.Fatal(err)
	}
	options["cilium_chart"] = dir
	return profileInstall(t, cilium.Name, options)
}

// profileInstall is what the profile name, with options, describes for Kubernetes.
func profileInstall(t *testing.T, name string, options map[string]any) meshkube.KubernetesInstall {
	t.Helper()
	p, err := mesh.New(name, options)
	if err != nil {
		t.Fatal(err)
	}
	in, err := p.(mesh.KubernetesInstaller).Kubernetes()
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func chartsOf(plan meshkube.KubernetesInstall) []Chart {
	var out []Chart
	for _, ch := range plan.Charts {
		out = append(out, Chart{Release: ch.Release, Namespace: ch.Namespace, Ref: ch.Chart, Repo: ch.Repo, Version: ch.Version, Values: ch.Values})
	}
	return out
}

// TestCiliumRefusesAClusterWithAnotherNetwork checks what the cilium profile requires
// of a cluster before its install: this one runs no CNI's DaemonSet, which passes; with
// kindnet's, as a kind cluster made with its default CNI has, it is refused, naming the
// DaemonSet, why, and how to make the cluster; with encryption: ipsec and no key
// Secret, it is refused naming the Secret.
func TestCiliumRefusesAClusterWithAnotherNetwork(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{})
	plan := ciliumPlan(t, map[string]any{})
	if err := c.CheckRequirements(ctx, plan.Requires); err != nil {
		t.Fatalf("a cluster without a CNI refused: %v", err)
	}

	kindnet := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "kindnet", Labels: map[string]string{"app": "kindnet"}},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kindnet"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "kindnet"}},
				Spec: corev1.PodSpec{TerminationGracePeriodSeconds: new(int64), Containers: []corev1.Container{{Name: "kindnet-cni", Image: "registry.example/kindnetd"}}}}}}
	ds := c.Client().AppsV1().DaemonSets("kube-system")
	if _, err := ds.Create(ctx, kindnet, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Delete(context.Background(), "kindnet", metav1.DeleteOptions{}) })
	err := c.CheckRequirements(ctx, plan.Requires)
	for _, want := range []string{"nothing was installed", "DaemonSet kube-system/kindnet is there: kind's default CNI runs on this cluster",
		"breaks both", "networking.disableDefaultCNI: true"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a cluster running kindnet: %v; want it refused saying %q", err, want)
		}
	}
	if err != nil {
		t.Log(err)
	}
	if err := ds.Delete(ctx, "kindnet", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	err = c.CheckRequirements(ctx, ciliumPlan(t, map[string]any{"encryption": "ipsec"}).Requires)
	if err == nil || !strings.Contains(err.Error(), "Secret kube-system/cilium-ipsec-keys is missing: Cilium's IPsec reads its keys from it") {
		t.Errorf("ipsec without its key Secret: %v", err)
	}
}

// TestCiliumInstallsAndEnrollsByNode installs the stand-in of Cilium's chart through
// InstallMesh with the values the cilium profile gives it (WireGuard, the agent's
// metrics, SPIRE mutual authentication) and its cluster-wide policy, into kube-system,
// which it must leave in place. Real here: Helm's rendering and wait, the DaemonSets'
// pods on the nodes their selector names, the policy applied and removed, the
// enrollment and the proxy counters as the runner reads them. The agents run on node 0
// only: the workload there is enrolled, and the load generator, on node 1, is not,
// since no agent took it in; its node's agent is missing from the counters, named.
func TestCiliumInstallsAndEnrollsByNode(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	onNode := func(i int) map[string]string { return map[string]string{"meshmark.dev/test-node": fmt.Sprint(i)} }
	c := connect(t, Config{AppNodeSelector: onNode(0), LoadgenNodeSelector: onNode(1), Timeout: 2 * time.Minute})
	plan := ciliumPlan(t, map[string]any{"mutual_auth": "spire",
		"helm_values": map[string]any{"cilium": map[string]any{"nodeSelector": onNode(0)}}})
	if err := c.CheckRequirements(ctx, plan.Requires); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	mi, uninstall := installMesh(t, c, chartsOf(plan), plan.Manifests, &log)
	e := mi.Effort
	// prometheus.enabled, encryption's two, authentication's three, the node selector.
	if e.Kinds["DaemonSet"] != 2 || e.Kinds["Deployment"] != 1 || e.Kinds["CiliumClusterwideNetworkPolicy"] != 1 || e.Values != 7 {
		t.Errorf("effort %+v: want the agent and cilium-envoy DaemonSets, the operator, the policy and 7 values", e)
	}
	cm, err := c.Client().CoreV1().ConfigMaps("kube-system").Get(ctx, "cilium-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"prometheus-serve-addr": ":9962", "enable-wireguard": "true", "enable-l7-proxy": "true",
		"external-envoy-proxy": "true", "mesh-auth-enabled": "true", "mesh-auth-mutual-enabled": "true"} {
		if got := cm.Data[k]; got != want {
			t.Errorf("cilium-config %s = %q, want %q (all: %v)", k, got, want, cm.Data)
		}
	}

	spec := bookinfoSpec(t, "c111a")
	spec.Mesh, spec.Generators = "cilium", 1
	app, err := c.Deploy(ctx, spec)
	defer func() { _ = c.Teardown(context.Background(), app) }()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx, app, nil); err != nil {
		t.Fatal(err)
	}
	placed, err := c.NodeAgents(ctx, app, plan.NodeAgents[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(placed) != len(spec.Deployments)+1 {
		t.Errorf("%d pods placed, want %d", len(placed), len(spec.Deployments)+1)
	}
	var generatorPod string
	for _, p := range placed {
		switch {
		case p.App == "loadgen":
			generatorPod = p.Pod
			if p.Node != cluster.Nodes[1] || p.Agent != "" || p.Ready {
				t.Errorf("generator %+v: want it on %s, where no agent runs", p, cluster.Nodes[1])
			}
		case p.Node != cluster.Nodes[0] || !strings.HasPrefix(p.Agent, "cilium-") || !p.Ready:
			t.Errorf("workload pod %+v: want it on %s beside a ready agent", p, cluster.Nodes[0])
		}
	}
	if generatorPod == "" {
		t.Errorf("no load-generator pod among %+v", placed)
	}

	// The agent's metrics on node 0, through the API server's pod proxy; node 1 has no
	// agent to read, which is said.
	agents, err := c.Client().CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=cilium"})
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for _, p := range agents.Items {
		var port int
		var body string
		switch p.Labels["k8s-app"] {
		case "cilium":
			port, body = cilium.AgentMetricsPort, "# TYPE cilium_version gauge\ncilium_version{arch=\"linux/amd64\",revision=\"9a89824332\",version=\"1.19.6\"} 1\n"+
				"# TYPE cilium_forward_count_total counter\ncilium_forward_count_total{direction=\"INGRESS\"} 42\n"
		case "cilium-envoy":
			port, body = cilium.EnvoyMetricsPort, "# TYPE envoy_server_live gauge\nenvoy_server_live{} 1\n"
		default:
			continue
		}
		if p.Status.PodIP == "" {
			t.Fatalf("pod %s has no address", p.Name)
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprint(w, body)
		}))
		t.Cleanup(srv.Close)
		if err := cluster.ReachPodPort(p.Status.PodIP, port, srv.Listener.Addr().String()); err != nil {
			t.Fatal(err)
		}
		served++
	}
	if served != 2 {
		t.Fatalf("%d Cilium pods served, want the agent and cilium-envoy of node 0", served)
	}
	read := map[string]meshkube.ProxyCounters{}
	for _, pc := range c.ReadProxyCounters(ctx, app, plan.Proxies, []string{"productpage"}) {
		read[pc.Component+"/"+pc.Pod] = pc
	}
	if pc := read["cilium-agent/"+cluster.Nodes[0]]; pc.Err != nil || pc.Version != "1.19.6" || pc.Counters["cilium_forward_count_total{direction=INGRESS}"] != 42 {
		t.Errorf("node 0's agent: %+v", pc)
	}
	if pc := read["cilium-envoy/"+cluster.Nodes[0]]; pc.Err != nil || pc.Gauges["envoy_server_live"] != 1 {
		t.Errorf("node 0's cilium-envoy: %+v", pc)
	}
	if pc := read["cilium-agent/"+cluster.Nodes[1]]; pc.Err == nil || !strings.Contains(pc.Err.Error(), "no cilium-agent pod (namespace kube-system, labels k8s-app=cilium) on the node") {
		t.Errorf("node 1, which runs no agent: %+v", pc)
	}

	// Resources: Cilium's pods in kube-system are the mesh's, the cluster's own are not.
	scope := ResourceScope{Mesh: "cilium", App: app.Namespace, MeshPodLabels: plan.OwnPodLabels}
	scope.AddMesh(mi)
	for _, p := range agents.Items {
		want := substrate.RoleNodeProxy
		if p.Labels["name"] == "cilium-operator" {
			want = substrate.RoleControlPlane
		}
		if role, ok := scope.RoleOf(&p, p.Spec.Containers[0].Name); !ok || role != want {
			t.Errorf("Cilium's pod %s counted as %q (%v), want %s", p.Name, role, ok, want)
		}
	}
	kubeProxy := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy-x", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-proxy"},
		OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "kube-proxy"}}}}
	if role, ok := scope.RoleOf(&kubeProxy, "kube-proxy"); ok {
		t.Errorf("the cluster's kube-proxy counted as Cilium's %s", role)
	}

	if err := c.Teardown(ctx, app); err != nil {
		t.Fatal(err)
	}
	if err := uninstall(); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err != nil {
		t.Errorf("kube-system after uninstalling Cilium: %v", err)
	}
	if l, err := c.Client().AppsV1().DaemonSets("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=cilium"}); err != nil || len(l.Items) > 0 {
		t.Errorf("Cilium's DaemonSets after uninstall: %v %v", l, err)
	}
	crds, err := c.crdNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if crds["ciliumclusterwidenetworkpolicies.cilium.io"] {
		t.Error("Cilium's policy CRD left after uninstall")
	}
}

// TestCiliumIsReconfiguredInPlace: a mesh that is the cluster's pod network goes from
// one configuration to the next by Helm upgrade, as Cilium's docs change its settings,
// never uninstalled between them (which would leave every node without a network and
// drop what its CRDs hold): the agents' DaemonSet and the CRDs stay, the configuration
// follows the new values, the old configuration's policy goes and the new one's comes.
// Real here: Helm's upgrade and wait on the stand-in of Cilium's chart, the objects.
func TestCiliumIsReconfiguredInPlace(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	node0 := map[string]any{"cilium": map[string]any{"nodeSelector": map[string]string{"meshmark.dev/test-node": "0"}}}
	c := connect(t, Config{Timeout: 2 * time.Minute})
	plain := ciliumPlan(t, map[string]any{"encryption": "none", "l7": "off", "helm_values": node0})
	secured := ciliumPlan(t, map[string]any{"mutual_auth": "spire", "helm_values": node0})
	var log bytes.Buffer
	mi, uninstall := installMesh(t, c, chartsOf(plain), plain.Manifests, &log)
	agents := func() *appsv1.DaemonSet {
		ds, err := c.Client().AppsV1().DaemonSets("kube-system").Get(ctx, "cilium", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	config := func() map[string]string {
		cm, err := c.Client().CoreV1().ConfigMaps("kube-system").Get(ctx, "cilium-config", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	policies := func() int {
		gvr := schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumclusterwidenetworkpolicies"}
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	before, crds := agents().UID, mi.Releases[0].Effort.CRDs
	if cfg := config(); cfg["enable-wireguard"] == "true" || policies() != 0 {
		t.Fatalf("plain Cilium: config %v, %d policies", cfg, policies())
	}

	if err := c.ReconfigureMesh(ctx, mi, chartsOf(secured), secured.Manifests, &log, nil); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if uid := agents().UID; uid != before {
		t.Error("the agents' DaemonSet was made anew: Cilium was uninstalled between its configurations")
	}
	if cfg := config(); cfg["enable-wireguard"] != "true" || cfg["mesh-auth-enabled"] != "true" || policies() != 1 {
		t.Errorf("after reconfiguring for WireGuard and SPIRE: config %v, %d policies applied", cfg, policies())
	}
	if e := mi.Effort; e.Values != 7 || e.Ready <= 0 || len(e.CRDs) != 0 || !slices.Equal(mi.Releases[0].Effort.CRDs, crds) {
		t.Errorf("reconfiguration effort %+v (release's CRDs %v): want the change's 7 values, no CRD added, the install's CRDs kept for its uninstall", e, mi.Releases[0].Effort.CRDs)
	}
	for _, crd := range crds {
		if _, err := c.crdClient().Get(ctx, crd, metav1.GetOptions{}); err != nil {
			t.Errorf("CRD %s gone while reconfiguring: %v", crd, err)
		}
	}

	if err := c.ReconfigureMesh(ctx, mi, chartsOf(plain), plain.Manifests, &log, nil); err != nil {
		t.Fatal(err)
	}
	if cfg := config(); cfg["enable-wireguard"] == "true" || policies() != 0 || agents().UID != before {
		t.Errorf("back to plain Cilium: config %v, %d policies", cfg, policies())
	}
	if err := uninstall(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().AppsV1().DaemonSets("kube-system").Get(ctx, "cilium", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("the agents' DaemonSet after uninstalling: %v", err)
	}
	checkCRDsGone(t, c, crds)
}
