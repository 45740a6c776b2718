package cli

// `meshmark deploy` and `meshmark clean --kubernetes` against a real control plane with
// kwok nodes (package kubetest): the objects, scheduling and deletion are real; no
// container starts, so pods are ready on kwok's word and nothing is measured.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func startTestCluster(t *testing.T) *kubetest.Cluster {
	t.Helper()
	if missing, how := kubetest.Missing(); len(missing) > 0 {
		t.Skipf("no test cluster: %s missing (%s)", strings.Join(missing, ", "), how)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := kubetest.Start(ctx, t.TempDir(), kubetest.Options{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

func kubeStudy(t *testing.T, c *kubetest.Cluster, meshes string) string {
	t.Helper()
	graph := "name: two-tier\nservices:\n  - name: front\n    isEntrypoint: true\n    replicas: 2\n    script: [call: back]\n  - name: back\n    versions: [{name: v1}, {name: v2}]\n"
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(graph), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: kube-deploy}
spec:
  substrate:
    kubernetes:
      kubeconfig: %s
      image: registry.example/meshmark:test
      namespacePrefix: mmtest
      sutNodeSelector: {meshmark.dev/test-node: "0"}
  workload: {graph: app.yaml}
  meshes:
%s
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, duration: 30s}
`, c.Kubeconfig, meshes)
	path := filepath.Join(dir, "study.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func execCLI(args ...string) (stdout, stderr string, err error) {
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err = root.Execute()
	return out.String(), errOut.String(), err
}

func meshmarkNamespaces(t *testing.T, c *kubetest.Cluster) []string {
	t.Helper()
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	list, err := client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{LabelSelector: kube.ManagedByLabel + "=" + kube.ManagedBy})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ns := range list.Items {
		names = append(names, ns.Name)
	}
	return names
}

func TestDeployRefusesBeforeCreatingAnything(t *testing.T) {
	c := startTestCluster(t)
	for _, tc := range []struct {
		name, meshes, want string
	}{
		{"profile not on Kubernetes yet", "    - {name: baseline, profile: none}\n    - {name: traefik, profile: traefik-mesh}",
			"spec.meshes[1].profile: profile traefik-mesh cannot be installed on Kubernetes yet"},
		{"option not carried to the mesh", "    - {name: baseline, profile: none}\n    - {name: sidecar, profile: envoy-sidecar, options: {telemetry: off}}",
			"spec.meshes[1].options.telemetry: not carried over to Istio yet on Kubernetes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := execCLI("deploy", kubeStudy(t, c, tc.meshes))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("deploy: %v, want it to say %q", err, tc.want)
			}
			if left := meshmarkNamespaces(t, c); len(left) > 0 {
				t.Errorf("refused deploy created %v", left)
			}
		})
	}
	probes := kubeStudy(t, c, "    - {name: baseline, profile: none}")
	rewriteStudy(t, probes, "{name: latency, kind: fixed-rate, rate: 100, duration: 30s}", "{name: probes, kind: security}")
	if _, errOut, err := execCLI("validate", probes); err == nil || !regexp.MustCompile(`study.yaml:\d+:\d+: spec.experiments\[0\].kind: kind security is not measured on Kubernetes yet`).MatchString(errOut) {
		t.Errorf("validate of a security experiment on kubernetes: %v\n%s", err, errOut)
	}
	_, _, err := execCLI("run", "--db", filepath.Join(t.TempDir(), "r.db"), probes)
	if err == nil || !strings.Contains(err.Error(), "spec.experiments[0].kind: kind security is not measured on Kubernetes yet") {
		t.Errorf("run of a security experiment on kubernetes: %v", err)
	}
	// the ingress path: the plain gateway for the baseline, not in place of Istio's own
	ingress := kubeStudy(t, c, "    - {name: baseline, profile: none}")
	rewriteStudy(t, ingress, "{name: latency, kind: fixed-rate, rate: 100, duration: 30s}", "{name: latency, kind: fixed-rate, rate: 100, duration: 30s, path: ingress}")
	if _, errOut, err := execCLI("validate", ingress); err != nil {
		t.Errorf("validate of the ingress path without a mesh on kubernetes: %v\n%s", err, errOut)
	}
	rewriteStudy(t, ingress, "{name: baseline, profile: none}", "{name: baseline, profile: none}\n    - {name: sidecar, profile: envoy-sidecar}")
	if _, errOut, err := execCLI("validate", ingress); err != nil {
		t.Errorf("validate of the ingress path through Istio's sidecars (its own gateway) on kubernetes: %v\n%s", err, errOut)
	}
	rewriteStudy(t, ingress, "{name: sidecar, profile: envoy-sidecar}", "{name: ambient, profile: istio-ambient}")
	if _, errOut, err := execCLI("validate", ingress); err == nil || !regexp.MustCompile(`study.yaml:\d+:\d+: spec.experiments\[0\].path: mesh ambient \(istio-ambient\) has an ingress gateway of its own, which is not deployed on Kubernetes yet`).MatchString(errOut) {
		t.Errorf("validate of the ingress path through Istio ambient on kubernetes: %v\n%s", err, errOut)
	}
	// kept up together: the baseline beside one mesh that installs, but not two
	keepUp := kubeStudy(t, c, "    - {name: baseline, profile: none}\n    - {name: sidecar, profile: envoy-sidecar}")
	rewriteStudy(t, keepUp, "  experiments:\n", "  keepMeshesUp: true\n  experiments:\n")
	if _, errOut, err := execCLI("validate", keepUp); err != nil {
		t.Errorf("validate of keepMeshesUp with the baseline and one mesh on kubernetes: %v\n%s", err, errOut)
	}
	rewriteStudy(t, keepUp, "{name: sidecar, profile: envoy-sidecar}", "{name: sidecar, profile: envoy-sidecar}\n    - {name: mtls, profile: envoy-sidecar, options: {mtls: strict}}")
	if _, errOut, err := execCLI("validate", keepUp); err == nil || !regexp.MustCompile(`study.yaml:\d+:\d+: spec.keepMeshesUp: on Kubernetes, of the meshes kept up together at most one may install anything: meshes sidecar \(profile envoy-sidecar\) and mtls`).MatchString(errOut) {
		t.Errorf("validate of keepMeshesUp with two meshes that install on kubernetes: %v\n%s", err, errOut)
	}
	if left := meshmarkNamespaces(t, c); len(left) > 0 {
		t.Errorf("refused run created %v", left)
	}
	var ee *exitError
	_, _, err = execCLI("clean", "--kubernetes", "--kubeconfig", filepath.Join(t.TempDir(), "missing"))
	if err == nil || errors.As(err, &ee) && ee.code == 0 || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("clean with a missing kubeconfig: %v", err)
	}
}

func TestKubernetesExamplesValidate(t *testing.T) {
	files, err := filepath.Glob("../../examples/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Kubernetes examples: %v", err)
	}
	for _, f := range files {
		if out, errOut, err := execCLI("validate", f); err != nil || !strings.Contains(out, ": ok (") {
			t.Errorf("%s: %v\n%s%s", f, err, out, errOut)
		}
	}
}

// TestKubernetesExamplesFitOneNode: every Kubernetes example can run on a one-node
// cluster: one node can carry the labels of both its node selectors, which therefore
// never give one key two values (a study can keep the app and the generators apart only
// where nodes differ, by labelling them).
func TestKubernetesExamplesFitOneNode(t *testing.T) {
	files, err := filepath.Glob("../../examples/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Kubernetes examples: %v", err)
	}
	for _, f := range files {
		st, err := study.ParseFile(f)
		if err != nil {
			t.Fatal(err)
		}
		k := st.Spec.Substrate.Kubernetes
		for key, v := range k.SUTNodeSelector {
			if w, ok := k.LoadgenNodeSelector[key]; ok && w != v {
				t.Errorf("%s: sutNodeSelector %s=%s and loadgenNodeSelector %s=%s: no one node can carry both", f, key, v, key, w)
			}
		}
	}
}
