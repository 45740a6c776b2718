package kubeplatform

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/report"
	"github.com/meshmark/meshmark/internal/results"
	"github.com/meshmark/meshmark/internal/runner"
	"github.com/meshmark/meshmark/internal/study"
	"github.com/meshmark/meshmark/internal/substrate/kube"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	corev1 "k8s.io/api/core/v1"
)

// TestKubePlaintextCheckNamesTheServiceThatServed runs the plaintext half of the
// enrollment check on the test cluster, against an app deployed as a run deploys it.
// kwok runs no container: the mesh's charts are not installed (the check asks only
// what the profile promises), and the probe pod's process is stood in for
// (kubetest.StandInPlaintextProbe). A service that serves plaintext fails the check, naming the
// service and what it answered, and the report's row "plaintext from outside refused"
// fails; refused everywhere passes; a mesh that does not promise to refuse plaintext,
// or whose pods are not all enrolled, is not probed; a probe that cannot start fails the
// check as unproven.
func TestKubePlaintextCheckNamesTheServiceThatServed(t *testing.T) {
	if missing, how := kubetest.Missing(); len(missing) > 0 {
		t.Skipf("no test cluster: %s missing (%s)", strings.Join(missing, ", "), how)
	}
	ctx := context.Background()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	cluster, err := kubetest.Start(startCtx, t.TempDir(), kubetest.Options{Nodes: 2})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	probes := cluster.StandInPlaintextProbe(t, kubetest.PlaintextProbe{
		Selector: kube.RoleLabel + "=" + kube.PlaintextProbeRole, ParseTarget: kube.ParsePlaintextTarget, Run: kube.RunPlaintextProbe, Control: kube.PlaintextControlService,
	})

	st := parseStudy(t, fmt.Sprintf(`apiVersion: meshmark.dev/v1alpha1
kind: Study
metadata: {name: kube-plaintext}
spec:
  substrate:
    kubernetes:
      kubeconfig: %s
      image: registry.example/meshmark:test
      namespacePrefix: mmpt
      sutNodeSelector: {meshmark.dev/test-node: "0"}
      loadgenNodeSelector: {meshmark.dev/test-node: "1"}
  workload:
    graph: bookinfo
  meshes:
    - {name: istio, profile: envoy-sidecar, options: {mtls: strict}}
    - {name: linkerd, profile: linkerd}
    - {name: baseline, profile: none}
  experiments:
    - {name: latency, kind: fixed-rate, rate: 100, duration: 4s, warmup: 1s}
`, cluster.Kubeconfig))
	var progress strings.Builder
	h, err := runner.NewHost(st, runner.Options{}, &progress)
	r := &run{Host: h}
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.connectKubernetes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	istio, linkerd := &st.Spec.Meshes[0], &st.Spec.Meshes[1]
	spec, err := r.appSpec("pt1", istio)
	if err != nil {
		t.Fatal(err)
	}
	app, err := c.Deploy(ctx, spec)
	t.Cleanup(func() {
		if err := c.Teardown(context.Background(), app); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	check := func(m *study.Mesh, pass bool) mesh.Enrollment {
		t.Helper()
		plan, err := kubernetesInstall(*m)
		if err != nil {
			t.Fatal(err)
		}
		enr := mesh.Enrollment{Mesh: m.Name, Pass: pass}
		if err := r.checkPlaintextOnCluster(ctx, c, "pt1", app, m, plan, &enr); err != nil {
			t.Fatal(err)
		}
		return enr
	}
	reportRow := func(enr mesh.Enrollment) report.CheckRow {
		t.Helper()
		doc, err := json.Marshal(enr)
		if err != nil {
			t.Fatal(err)
		}
		run := &results.Run{ID: "r", Meshes: []results.Mesh{{Label: enr.Mesh, Profile: "envoy-sidecar", Enrollment: doc}}}
		for _, row := range report.Summarize(run, nil, report.Options{}).Checks {
			if row.Check == "plaintext from outside refused" {
				return row
			}
		}
		t.Fatalf("the report has no row for the plaintext check of %+v", enr)
		return report.CheckRow{}
	}
	services := []string{"details", "productpage", "ratings", "reviews"}

	t.Run("a service that serves plaintext fails the check", func(t *testing.T) {
		probes.Set(map[string]bool{"ratings": true}, nil)
		enr := check(istio, true)
		if enr.Pass || enr.PlaintextRefused == nil || *enr.PlaintextRefused || len(enr.Failures) != 1 {
			t.Fatalf("pass %v, plaintext refused %v, failures %q: want one failure, for ratings", enr.Pass, enr.PlaintextRefused, enr.Failures)
		}
		want := fmt.Sprintf(`service ratings served a plaintext request from outside the mesh (ratings.%s.svc.cluster.local:9080 (http)): served: HTTP 200 "{\"service\":\"ratings\",\"version\":\"v1\",\"pod\":\"ratings-v1-7d9c\"}"`, app.Namespace)
		if enr.Failures[0] != want {
			t.Errorf("failure %q\nwant    %q", enr.Failures[0], want)
		}
		if len(enr.Plaintext) != len(services) {
			t.Fatalf("outcomes stored %+v, want one per service %v", enr.Plaintext, services)
		}
		for i, p := range enr.Plaintext {
			if p.Service != services[i] || p.Refused != (p.Service != "ratings") {
				t.Errorf("outcome %+v", p)
			}
		}
		if row := reportRow(enr); row.Pass || !strings.Contains(row.Detail, "refused 3 of 4 times (3× refused: connection closed without an answer, 1× served: HTTP 200") {
			t.Errorf("report row %+v: want it failed", row)
		}
	})

	t.Run("refused by every service passes", func(t *testing.T) {
		probes.Set(nil, nil)
		progress.Reset()
		enr := check(istio, true)
		if !enr.Pass || enr.PlaintextRefused == nil || !*enr.PlaintextRefused || len(enr.Plaintext) != len(services) {
			t.Fatalf("pass %v, plaintext refused %v, failures %q, outcomes %+v: want it passed", enr.Pass, enr.PlaintextRefused, enr.Failures, enr.Plaintext)
		}
		if row := reportRow(enr); !row.Pass {
			t.Errorf("report row %+v: want it passed", row)
		}
		if want := "istio: plaintext from outside the mesh refused 4 of 4 times (4× refused: connection closed without an answer); positive controls answered 1 of 1 (1× served: HTTP 200"; !strings.Contains(progress.String(), want) {
			t.Errorf("progress does not say %q:\n%s", want, progress.String())
		}
	})

	t.Run("no promise or no enrollment, no probe", func(t *testing.T) {
		probes.Set(nil, nil)
		before := len(probes.Pods())
		if enr := check(linkerd, true); enr.PlaintextRefused != nil || !enr.Pass || enr.Plaintext != nil {
			t.Errorf("linkerd, permissive: %+v; want no plaintext check", enr)
		}
		if enr := check(istio, false); enr.PlaintextRefused != nil || enr.Plaintext != nil {
			t.Errorf("istio with pods outside the mesh: %+v; want no plaintext check", enr)
		}
		if after := len(probes.Pods()); after != before {
			t.Errorf("%d probe pods started, want none", after-before)
		}
	})

	t.Run("a probe that cannot start leaves refusal unproven", func(t *testing.T) {
		// The probe pod waits for an image it cannot pull.
		probes.Set(nil, func(ctx context.Context, p *corev1.Pod, _ []byte) error {
			return cluster.PodWaits(ctx, p.Namespace, p.Name, "ImagePullBackOff", "Back-off pulling image "+p.Spec.Containers[0].Image)
		})
		start := time.Now()
		enr := check(istio, true)
		if enr.Pass || enr.PlaintextRefused != nil || len(enr.Failures) != 1 ||
			!strings.Contains(enr.Failures[0], "refusal of plaintext unproven: the plaintext probe could not run: ") ||
			!strings.Contains(enr.Failures[0], "cannot start: the image cannot be pulled (container probe, image registry.example/meshmark:test): ImagePullBackOff") {
			t.Errorf("pass %v, plaintext refused %v, failures %q: want it failed as unproven, saying why", enr.Pass, enr.PlaintextRefused, enr.Failures)
		}
		if took := time.Since(start); took > time.Minute {
			t.Errorf("took %s: the image pull's failure should end the check at once, not at its time limit", took)
		}
	})
}
