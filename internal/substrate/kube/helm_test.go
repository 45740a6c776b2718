package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	widgetCRD = "widgets.test.meshmark.dev"
	// gadgetCRD is templated and marked for Helm to keep.
	gadgetCRD = "gadgets.test.meshmark.dev"
)

// The installer meshes will go through, on a test chart shaped like a mesh's: a CRD in
// crds/, a custom resource of it, a Deployment behind a Service.
func TestHelmInstallMeasuresEffortAndUninstallLeavesNothing(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{})
	why := "install the widget chart first"
	if err := c.RequireCRDs(ctx, why, widgetCRD, "namespaces"); err == nil ||
		!strings.Contains(err.Error(), "lacks CustomResourceDefinition "+widgetCRD+", namespaces: "+why) {
		t.Errorf("RequireCRDs before the install: %v", err)
	}
	var helmLog bytes.Buffer
	var seen []WaitProgress
	inst, err := c.Install(ctx, Chart{
		Release: "widgets", Ref: "testdata/charts/widget-app", Namespace: "mmtest-widgets-system",
		Values: map[string]any{"replicas": 2, "nodeSelector": map[string]any{"meshmark.dev/test-node": "2"}},
	}, &helmLog, func(p WaitProgress) { seen = append(seen, p) })
	if err != nil {
		t.Fatalf("%v\n%s", err, helmLog.String())
	}
	// Helm's wait polls every 2 s; the watch of the release's pods every second.
	if len(seen) > 0 && seen[len(seen)-1].Total != 2 {
		t.Errorf("install progress %v: want it to count the release's 2 pods", seen)
	}
	e := inst.Effort
	wantKinds := map[string]int{"ServiceAccount": 1, "Deployment": 1, "Service": 1, "Widget": 1, "ClusterRole": 1, "CustomResourceDefinition": 2}
	if e.Objects != 7 || len(e.Kinds) != len(wantKinds) || e.Values != 2 || e.Ready <= 0 || !slices.Equal(e.CRDs, []string{gadgetCRD, widgetCRD}) {
		t.Errorf("effort %+v: want 7 objects %v, 2 values, the two CRDs added", e, wantKinds)
	}
	for k, n := range wantKinds {
		if e.Kinds[k] != n {
			t.Errorf("effort kinds %v: want %d %s", e.Kinds, n, k)
		}
	}
	dep, err := c.Client().AppsV1().Deployments("mmtest-widgets-system").Get(ctx, "widgets", metav1.GetOptions{})
	if err != nil || dep.Status.AvailableReplicas != 2 {
		t.Errorf("after the install (Helm waits): deployment %v, err %v", dep.Status, err)
	}
	if err := c.RequireCRDs(ctx, why, widgetCRD); err != nil {
		t.Error(err)
	}

	if err := c.Uninstall(ctx, inst, &helmLog); err != nil {
		t.Fatal(err)
	}
	if err := c.RequireCRDs(ctx, why, widgetCRD); err == nil {
		t.Error("the CRD the install added is still there")
	}
	if err := c.RequireCRDs(ctx, why, gadgetCRD); err == nil {
		t.Error("the templated CRD Helm keeps is still there")
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-widgets-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("the release's namespace is still there: %v", err)
	}
}

func TestHelmInstallThatNeverGetsReadyIsRemoved(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{Timeout: 5 * time.Second})
	_, err := c.Install(ctx, Chart{
		Release: "stuck", Ref: "testdata/charts/widget-app", Namespace: "mmtest-stuck-system",
		Values: map[string]any{"nodeSelector": map[string]any{"meshmark.dev/test-node": "none"}},
	}, nil, nil)
	// At Helm's time limit (before the watch would give up on an unschedulable pod),
	// the error says what the pods wait for, not only Helm's "context deadline exceeded".
	if err == nil || !strings.Contains(err.Error(), "install stuck (chart widget-app 0.3.1) into mmtest-stuck-system") ||
		!strings.Contains(err.Error(), "(spec.substrate.kubernetes.readyTimeout 5s); pod stuck-") || !strings.Contains(err.Error(), "not scheduled: 0/3 nodes are available") {
		t.Fatalf("install of pods no node takes: %v", err)
	}
	for _, crd := range []string{widgetCRD, gadgetCRD} {
		if err := c.RequireCRDs(ctx, "", crd); err == nil {
			t.Errorf("a failed install left its CRD %s", crd)
		}
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-stuck-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("a failed install left its namespace: %v", err)
	}
	if _, err := c.Install(ctx, Chart{Release: "x", Ref: "istiod", Repo: "https://istio-release.storage.googleapis.com/charts", Namespace: "x"}, nil, nil); err == nil ||
		!strings.Contains(err.Error(), "no version: pin one") {
		t.Errorf("an unpinned repository chart: %v", err)
	}
}

// TestHelmInstallOfANodeAgentThatRunsNowhereFails: Helm's wait counts a DaemonSet that
// is placed on no node ready, having no pod to wait for. A mesh's node agent that runs
// nowhere leaves the mesh without its node part (Istio's ztunnel then waits until
// readyTimeout), so the install fails at once naming the DaemonSet, and is removed. The
// same agent on nodes that take it installs, and an upgrade that takes it off them all
// fails.
func TestHelmInstallOfANodeAgentThatRunsNowhereFails(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{Timeout: 3 * time.Minute})
	_, err := c.Install(ctx, Chart{
		Release: "agentless", Ref: "testdata/charts/widget-app", Namespace: "mmtest-agentless-system",
		Values: map[string]any{"agent": map[string]any{"nodeSelector": map[string]any{"meshmark.dev/test-node": "none"}}},
	}, nil, nil)
	var stuck *StuckError
	if !errors.As(err, &stuck) || !strings.Contains(err.Error(), "install agentless (chart widget-app 0.3.1) into mmtest-agentless-system: namespace mmtest-agentless-system: "+
		"daemonset agentless-agent runs on no node: its node selector, affinity and tolerations leave out each of the cluster's 3 nodes") {
		t.Fatalf("install of a node agent no node takes: %v", err)
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-agentless-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("a failed install left its namespace: %v", err)
	}

	inst, err := c.Install(ctx, Chart{
		Release: "agented", Ref: "testdata/charts/widget-app", Namespace: "mmtest-agented-system",
		Values: map[string]any{"agent": map[string]any{"nodeSelector": map[string]any{"type": "kwok"}}},
	}, nil, nil)
	if err != nil {
		t.Fatalf("install of a node agent on every node: %v", err)
	}
	defer func() {
		if err := c.Uninstall(ctx, inst, nil); err != nil {
			t.Fatal(err)
		}
	}()
	// An upgrade that takes the release's agent off every node fails the same way,
	// though the DaemonSet was there before it.
	err = c.Upgrade(ctx, inst, Chart{
		Release: "agented", Ref: "testdata/charts/widget-app", Namespace: "mmtest-agented-system",
		Values: map[string]any{"agent": map[string]any{"nodeSelector": map[string]any{"meshmark.dev/test-node": "none"}}},
	}, nil, nil)
	if !errors.As(err, &stuck) || !strings.Contains(err.Error(), "upgrade agented (chart widget-app 0.3.1) in mmtest-agented-system: namespace mmtest-agented-system: "+
		"daemonset agented-agent runs on no node") {
		t.Errorf("upgrade that places the node agent on no node: %v", err)
	}
}

// TestHelmInstallGivesUpOnAPodThatCannotStart: while Helm waits, a pod of the release
// that the cluster says cannot start ends the install at once with the kubelet's reason
// (kwok runs no container: the test writes the kubelet's status), and the release is
// removed.
func TestHelmInstallGivesUpOnAPodThatCannotStart(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{Timeout: 3 * time.Minute})
	cluster.OnNewPods(t, "app=pulling", func(ctx context.Context, p *corev1.Pod) (bool, error) {
		if p.Status.Phase != corev1.PodRunning {
			return false, nil
		}
		return true, cluster.PodWaits(ctx, p.Namespace, p.Name, "ErrImagePull", `failed to pull and unpack image "registry.example/widget:1": not found`)
	})
	_, err := c.Install(ctx, Chart{Release: "pulling", Ref: "testdata/charts/widget-app", Namespace: "mmtest-pulling-system"}, nil, nil)
	var stuck *StuckError
	if !errors.As(err, &stuck) || !strings.Contains(err.Error(), "install pulling (chart widget-app 0.3.1) into mmtest-pulling-system: namespace mmtest-pulling-system: pod pulling-") ||
		!strings.Contains(err.Error(), `cannot start: the image cannot be pulled (container widget, image registry.example/widget:1): ErrImagePull failed to pull and unpack image "registry.example/widget:1": not found`) {
		t.Fatalf("install whose image cannot be pulled: %v", err)
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-pulling-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("a failed install left its namespace: %v", err)
	}
}

// installAndHang is a run killed during an install: it installs a chart whose pods
// never become ready, so that it is inside Helm's wait when it is killed.
func installAndHang() int {
	c, err := Connect(context.Background(), Config{Kubeconfig: os.Getenv("MESHMARK_KUBE_TEST_KUBECONFIG"), Timeout: time.Hour})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	_, err = c.Install(context.Background(), Chart{
		Release: "killed", Ref: "testdata/charts/widget-app", Namespace: "mmtest-killed-system",
		Values: map[string]any{"nodeSelector": map[string]any{"meshmark.dev/test-node": "none"}},
	}, nil, nil)
	fmt.Println("install returned:", err)
	return 1
}

func TestCleanAfterAKilledInstall(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "MESHMARK_KUBE_TEST_INSTALL=1", "MESHMARK_KUBE_TEST_KUBECONFIG="+cluster.Kubeconfig)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := connect(t, Config{})
	// Killed once Helm has applied the templates and waits for the pods.
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := c.Client().AppsV1().Deployments("mmtest-killed-system").Get(ctx, "killed", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the install never got to its wait:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if _, err := c.Client().RbacV1().ClusterRoles().Get(ctx, "killed-widget-reader", metav1.GetOptions{}); err != nil {
		t.Fatalf("the killed install's ClusterRole is not there to clean: %v", err)
	}

	report, err := c.Clean(ctx, CleanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	removed := map[string]bool{}
	for _, e := range report {
		removed[e.Name] = e.Removed
	}
	if !removed["mmtest-killed-system"] || !removed["customresourcedefinition/"+widgetCRD] {
		t.Errorf("clean: %+v", report)
	}
	if err := c.RequireCRDs(ctx, "", widgetCRD); err == nil {
		t.Error("clean left the killed install's CRD")
	}
	if err := c.RequireCRDs(ctx, "", gadgetCRD); err == nil {
		t.Error("clean left the killed install's templated CRD, which Helm keeps")
	}
	if _, err := c.Client().RbacV1().ClusterRoles().Get(ctx, "killed-widget-reader", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("clean left the killed install's ClusterRole: %v", err)
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-killed-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("clean left the killed install's namespace: %v", err)
	}
}

// TestInstallRightsNameTheMeshsKinds: what installing a mesh asks of meshmark's own
// requests is its CRDs and requirements (meshRights), and creating and deleting each of
// its manifests' kinds, by their resource names, and a Gateway's also read.
func TestInstallRightsNameTheMeshsKinds(t *testing.T) {
	rights, err := InstallRights(
		[]string{"apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: istio-system}\n",
			"apiVersion: cilium.io/v2\nkind: CiliumClusterwideNetworkPolicy\nmetadata: {name: p}\n"},
		[]meshkube.AppGateway{{Manifest: "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: waypoint}\n", Deployment: "waypoint"}},
		[]string{"apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: admin}\n"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ra := range rights {
		got = append(got, describe(ra))
	}
	want := []string{"create customresourcedefinitions.apiextensions.k8s.io", "delete customresourcedefinitions.apiextensions.k8s.io", "list daemonsets.apps", "list secrets",
		"create peerauthentications.security.istio.io", "delete peerauthentications.security.istio.io",
		"create ciliumclusterwidenetworkpolicies.cilium.io", "delete ciliumclusterwidenetworkpolicies.cilium.io",
		"create gateways.gateway.networking.k8s.io", "get gateways.gateway.networking.k8s.io", "delete gateways.gateway.networking.k8s.io",
		"create servers.policy.linkerd.io"}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("install rights %v lack %q", got, w)
		}
	}
	if _, err := InstallRights([]string{"kind: [broken"}, nil, nil); err == nil {
		t.Error("a manifest that does not parse gave rights")
	}
}

// TestPrivilegedNamespaceAdmitsAMeshsPods: on a cluster that enforces Pod Security's
// baseline level by default, pods with an init container that writes iptables
// (NET_ADMIN, NET_RAW: istio-init, linkerd-init) are refused unless their namespace is
// labelled privileged, which meshmark does for the namespaces a mesh's profile names,
// where it creates them; refused, the install ends at once with admission's words. Pod
// Security admission is the real API server's; kwok starts no container.
func TestPrivilegedNamespaceAdmitsAMeshsPods(t *testing.T) {
	needCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	strict, err := kubetest.Start(ctx, t.TempDir(), kubetest.Options{Nodes: 1, PodSecurity: "baseline"})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer strict.Stop()
	c, err := Connect(context.Background(), Config{Kubeconfig: strict.Kubeconfig, Timeout: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx = context.Background()
	inst, err := c.Install(ctx, Chart{Release: "meshy", Ref: "testdata/charts/widget-app", Namespace: "mmtest-meshy-system", Privileged: true,
		Values: map[string]any{"netAdmin": true}}, nil, nil)
	if err != nil {
		t.Fatalf("install into a namespace labelled privileged: %v", err)
	}
	ns, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-meshy-system", metav1.GetOptions{})
	if err != nil || ns.Labels[meshkube.PodSecurityEnforce] != meshkube.PodSecurityPrivileged {
		t.Errorf("namespace labels %v, %v: want %s=%s", ns.Labels, err, meshkube.PodSecurityEnforce, meshkube.PodSecurityPrivileged)
	}
	if err := c.Uninstall(ctx, inst, nil); err != nil {
		t.Fatal(err)
	}
	_, err = c.Install(ctx, Chart{Release: "refused", Ref: "testdata/charts/widget-app", Namespace: "mmtest-refused-system",
		Values: map[string]any{"netAdmin": true}}, nil, nil)
	var stuck *StuckError
	if !errors.As(err, &stuck) || !strings.Contains(err.Error(), `violates PodSecurity "baseline:latest": non-default capabilities`) {
		t.Errorf("install into a namespace left at the cluster's baseline: %v; want it refused at once, in admission's words", err)
	}
}

// TestCleanOfARunTakesTheMeshItInstalled: a mesh installed for a run carries the run in
// the namespace meshmark made for it, so that cleaning that run's kept deployments
// (`clean --kubernetes --all RUN`) takes the mesh's release too, and cleaning another
// run leaves it.
func TestCleanOfARunTakesTheMeshItInstalled(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{})
	var helmLog bytes.Buffer
	inst, err := c.Install(ctx, Chart{
		Release: "widgets", Ref: "testdata/charts/widget-app", Namespace: "mmtest-kept-system", Run: "kept01",
		Values: map[string]any{"replicas": 1, "nodeSelector": map[string]any{"meshmark.dev/test-node": "2"}},
	}, &helmLog, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, helmLog.String())
	}
	t.Cleanup(func() { _ = c.Uninstall(context.Background(), inst, io.Discard) })
	if _, err := c.Clean(ctx, CleanOptions{All: true, Runs: []string{"other1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-kept-system", metav1.GetOptions{}); err != nil {
		t.Fatalf("cleaning another run took the mesh: %v", err)
	}
	report, err := c.Clean(ctx, CleanOptions{All: true, Runs: []string{"kept01"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(report, func(n CleanedNamespace) bool { return n.Name == "mmtest-kept-system" && n.Run == "kept01" && n.Removed }) {
		t.Errorf("clean of run kept01: %+v; want the mesh's namespace removed with it", report)
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "mmtest-kept-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("the mesh's namespace is still there after cleaning its run: %v", err)
	}
	if err := c.RequireCRDs(ctx, "", widgetCRD); err == nil {
		t.Error("the CRD the mesh's install added is still there after cleaning its run")
	}
}
