package kube

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/prereq"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestIstioInstallsInjectsAndLeavesNothing installs Istio's own charts (base and istiod,
// from the Istio commit `meshmark setup --for test` fetched) through InstallMesh, runs
// that commit's istiod beside the cluster, as Istio's external control plane runs
// (pods cannot run here; the charts' istiodRemote.injectionURL and base.validationURL
// point the webhooks at it), and deploys a workload into a namespace labelled for injection: every
// pod must come out of the API server with istiod's istio-proxy sidecar. Uninstalling
// must leave none of Istio's CRDs, webhooks or its namespace.
func TestIstioInstallsInjectsAndLeavesNothing(t *testing.T) {
	needCluster(t)
	charts := prereq.IstioCharts()
	for _, p := range []string{filepath.Join(charts, "base"), kubetest.IstiodBinary()} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("no Istio for the test (%v): make setup (or: meshmark setup --for test)", err)
		}
	}
	ctx := context.Background()
	c := connect(t, Config{Timeout: 2 * time.Minute})
	webhook, err := kubetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	// istiod's webhooks are reached by URL, as with an external control plane: through
	// their Services, the API server's calls would go to addresses that exist nowhere.
	validate := map[string]any{"validationURL": kubetest.WebhookURL(webhook) + "/validate"}
	mi, uninstall := installMesh(t, c, []Chart{
		{Release: "istio-base", Ref: filepath.Join(charts, "base"), Namespace: "istio-system",
			Values: map[string]any{"base": validate}},
		{Release: "istiod", Ref: filepath.Join(charts, "istio-control", "istio-discovery"), Namespace: "istio-system",
			Values: map[string]any{"base": validate,
				"istiodRemote": map[string]any{"injectionURL": kubetest.WebhookURL(webhook) + "/inject"}}},
	}, []string{"apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: istio-system}\nspec: {mtls: {mode: STRICT}}\n"}, &log)
	e := mi.Effort
	if len(e.CRDs) != 15 || e.Kinds["CustomResourceDefinition"] != 15 || e.Kinds["MutatingWebhookConfiguration"] != 1 ||
		e.Kinds["PeerAuthentication"] != 1 || e.Kinds["Deployment"] != 1 || e.Values != 3 || e.Objects < 35 {
		t.Errorf("effort %+v: want Istio's 15 CRDs, istiod, its webhook, the PeerAuthentication, 3 values", e)
	}
	if zero := kindsCountedZero(e.Kinds); len(zero) > 0 {
		t.Errorf("effort lists kinds with no object: %v", zero)
	}

	istiod, err := cluster.StartIstiod(webhook, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer istiod.Stop()

	spec := bookinfoSpec(t, "151d01")
	spec.NamespaceLabels = map[string]string{"istio-injection": "enabled"}
	spec.Generators = 1
	app, err := c.Deploy(ctx, spec)
	defer func() { _ = c.Teardown(context.Background(), app) }()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx, app, nil); err != nil {
		b, _ := os.ReadFile(istiod.Log)
		t.Fatalf("%v\nistiod log (end):\n%s", err, lastLines(string(b), 20))
	}
	pods, err := c.Sidecars(ctx, app, "istio-proxy")
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != len(spec.Deployments)+1 {
		t.Errorf("%d pods, want %d", len(pods), len(spec.Deployments)+1)
	}
	for _, p := range pods {
		if !p.Sidecar {
			t.Errorf("pod %s (%s) has no istio-proxy: istiod did not inject it", p.Pod, p.App)
		}
	}
	if err := c.Teardown(ctx, app); err != nil {
		t.Fatal(err)
	}
	if err := uninstall(); err != nil {
		t.Fatal(err)
	}
	checkCRDsGone(t, c, e.CRDs)
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "istio-system", metav1.GetOptions{}); !IsNotFound(err) {
		t.Errorf("namespace istio-system after uninstall: %v", err)
	}
	if mwcs, err := c.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{}); err != nil || len(mwcs.Items) > 0 {
		t.Errorf("mutating webhooks after uninstall: %v %v", mwcs, err)
	}
}

// installMesh installs charts and manifests through InstallMesh, failing the test with
// the install's log. The mesh is uninstalled when the test ends unless the test called
// uninstall first, as it does to see what an uninstall leaves behind.
func installMesh(t *testing.T, c *Cluster, charts []Chart, manifests []string, log *bytes.Buffer) (mi *MeshInstall, uninstall func() error) {
	t.Helper()
	mi, err := c.InstallMesh(context.Background(), charts, manifests, log, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			_ = c.UninstallMesh(context.Background(), mi, log)
		}
	})
	return mi, func() error {
		uninstalled = true
		return c.UninstallMesh(context.Background(), mi, log)
	}
}

// checkCRDsGone fails the test for each of crds that is still there after an uninstall.
func checkCRDsGone(t *testing.T, c *Cluster, crds []string) {
	t.Helper()
	for _, crd := range crds {
		if _, err := c.crdClient().Get(context.Background(), crd, metav1.GetOptions{}); !IsNotFound(err) {
			t.Errorf("CRD %s still there after uninstall (%v)", crd, err)
		}
	}
}

func kindsCountedZero(m map[string]int) []string {
	var out []string
	for k, n := range m {
		if n == 0 {
			out = append(out, k)
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
