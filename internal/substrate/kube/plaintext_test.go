package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	_ "github.com/meshmark/meshmark/internal/mesh/meshes" // every mesh's opt-outs, which the probe pods carry
	"github.com/meshmark/meshmark/internal/mesh/meshprobe"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/meshmark/meshmark/internal/workload"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// standInProbes stands in for the process of every plaintext probe pod
// (kubetest.StandInPlaintextProbe, with this package's probe).
func standInProbes(t *testing.T) *kubetest.PlaintextProbeStandIn {
	t.Helper()
	return cluster.StandInPlaintextProbe(t, kubetest.PlaintextProbe{
		Selector: RoleLabel + "=" + PlaintextProbeRole, ParseTarget: ParsePlaintextTarget, Run: RunPlaintextProbe, Control: PlaintextControlService,
	})
}

func deployGraph(t *testing.T, c *Cluster, run, graph string) *App {
	t.Helper()
	g, err := workload.Builtin(graph)
	if err != nil {
		t.Fatal(err)
	}
	app, err := c.Deploy(context.Background(), AppSpec{
		Run: run, Mesh: "istio", Deployments: g.Deployments(),
		Args: func(d workload.Deployment) []string { return g.ServiceArgs(d, PodNameArg) },
	})
	t.Cleanup(func() {
		if err := c.Teardown(context.Background(), app); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return app
}

// TestPlaintextProbeThatCannotReportIsAnError: a probe that does not report how every
// service answered is an error that says why, within the time limit, never a result:
// a pod that never ends, whose image cannot be pulled (at once, not at the limit), whose
// process fails or reports nothing, or that the mesh took in. Its namespace is removed
// each time. These are failures a real kubelet and meshmark's real probe do not make on
// demand, so the paper-only cluster's stand-in plays the pod's end here; the probe's
// real run, and a real image that cannot be pulled, are TestPlaintextProbeOnRealNodes.
func TestPlaintextProbeThatCannotReportIsAnError(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{AppNodeSelector: map[string]string{"meshmark.dev/test-node": "0"}, LoadgenNodeSelector: map[string]string{"meshmark.dev/test-node": "1"}})
	probes := standInProbes(t)
	app := deployGraph(t, c, "ptfail", "chain-2")
	const limit = 5 * time.Second
	cases := []struct {
		name string
		end  func(ctx context.Context, p *corev1.Pod, report []byte) error
		// within bounds the error's arrival: at the limit, or at once.
		within time.Duration
		want   []string
	}{
		{"never ends",
			func(context.Context, *corev1.Pod, []byte) error { return nil },
			limit + 5*time.Second, []string{"the plaintext probe did not finish within 5s", "pod meshmark-plaintext-probe-0: still running"}},
		{"image cannot be pulled",
			func(ctx context.Context, p *corev1.Pod, _ []byte) error {
				return cluster.PodWaits(ctx, p.Namespace, p.Name, "ImagePullBackOff", `Back-off pulling image "registry.example/meshmark:test"`)
			},
			limit - time.Second, []string{"probe pod meshmark-plaintext-probe-0 cannot start: the image cannot be pulled (container probe, image registry.example/meshmark:test): ImagePullBackOff Back-off pulling image"}},
		{"process fails",
			func(ctx context.Context, p *corev1.Pod, _ []byte) error {
				return cluster.EndPod(ctx, p.Namespace, p.Name, 1, `Error: unknown command "plaintext-probe" for "meshmark"`)
			},
			limit, []string{"probe pod meshmark-plaintext-probe-0 failed: exit code 1 (Error): Error: unknown command"}},
		{"no report",
			func(ctx context.Context, p *corev1.Pod, _ []byte) error {
				return cluster.EndPod(ctx, p.Namespace, p.Name, 0, "")
			},
			limit, []string{"ended without a report (no termination message)"}},
		{"a service left out",
			func(ctx context.Context, p *corev1.Pod, _ []byte) error {
				return cluster.EndPod(ctx, p.Namespace, p.Name, 0, `[{"service":"svc-0","refused":true,"observed":"refused: connection reset"}]`)
			},
			limit, []string{"reported nothing for service svc-1"}},
		{"taken into the mesh",
			func(ctx context.Context, p *corev1.Pod, report []byte) error {
				patch := []byte(`{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}`)
				if _, err := c.Client().CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
					return err
				}
				return cluster.EndPod(ctx, p.Namespace, p.Name, 0, string(report))
			},
			limit, []string{"probe pod meshmark-plaintext-probe-0 is marked ambient.istio.io/redirection=enabled: the mesh took it in despite its opt-outs"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			probes.Set(nil, tc.end)
			start := time.Now()
			res, err := c.ProbePlaintext(ctx, app, PlaintextCheck{Run: "ptfail", Mesh: "istio", EnrolledAnnotations: map[string]string{"ambient.istio.io/redirection": "enabled"}, Outside: mesh.KnownClusterMarks().Outside, Timeout: limit})
			took := time.Since(start)
			if err == nil || res.Probes != nil {
				t.Fatalf("no error (probes %+v)", res.Probes)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			// The namespace's removal comes after the error, and takes its own time.
			if _, gerr := c.Client().CoreV1().Namespaces().Get(ctx, res.Namespace, metav1.GetOptions{}); !IsNotFound(gerr) {
				t.Errorf("probe namespace %s left behind: %v", res.Namespace, gerr)
			}
			t.Logf("%s: error after %s (with the namespace's removal): %v", tc.name, took.Round(100*time.Millisecond), err)
			if took > tc.within+30*time.Second {
				t.Errorf("the error came after %s, want it within %s and the namespace's removal", took, tc.within)
			}
		})
	}
}

// TestPlaintextReportFitsATerminationMessage: the report of a probe pod's 16 services,
// with the longest names a Service can have and long answers, fits the 4096 bytes a
// kubelet keeps of a termination message, and reads back whole.
func TestPlaintextReportFitsATerminationMessage(t *testing.T) {
	var probes []meshprobe.PlaintextProbe
	for i := range servicesPerProbe {
		name := fmt.Sprintf("%s-%02d", strings.Repeat("s", 60), i)
		probes = append(probes, meshprobe.PlaintextProbe{Service: name, Target: "ignored", Refused: i%2 == 0,
			Observed: "served: HTTP 200 " + strings.Repeat("é", 300)})
	}
	report := plaintextReport(probes)
	if len(report) > TerminationMessageLimit {
		t.Fatalf("report of %d bytes, over the kubelet's %d", len(report), TerminationMessageLimit)
	}
	var back []meshprobe.PlaintextProbe
	if err := json.Unmarshal(report, &back); err != nil {
		t.Fatal(err)
	}
	for i, p := range back {
		if p.Service != probes[i].Service || p.Refused != probes[i].Refused || p.Target != "" ||
			!strings.HasPrefix(p.Observed, "served: HTTP 200 é") || !strings.HasSuffix(p.Observed, "…") {
			t.Errorf("read back %+v", p)
		}
	}
	for _, s := range []string{"front=front.ns.svc.cluster.local:9080/grpc", "front=10.0.0.1:80"} {
		tg, err := ParsePlaintextTarget(s)
		if err != nil || (tg.Protocol == "grpc") != strings.HasSuffix(s, "/grpc") || !strings.HasPrefix(FormatPlaintextTarget(tg), s) {
			t.Errorf("target %q read as %+v, %v", s, tg, err)
		}
	}
	for _, s := range []string{"front", "=a:1", "front=host", "front=h:1/udp"} {
		if _, err := ParsePlaintextTarget(s); err == nil {
			t.Errorf("target %q accepted", s)
		}
	}
}

// TestPlaintextProbeWithoutItsControlProvesNothing: a probe pod that cannot reach the
// positive control, a plaintext service outside the mesh in its own namespace, would see
// every service refuse whatever the mesh does (cluster DNS down, no route): its
// refusals are no evidence, and ProbePlaintext says so instead of reporting them.
func TestPlaintextProbeWithoutItsControlProvesNothing(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{AppNodeSelector: map[string]string{"meshmark.dev/test-node": "0"}, LoadgenNodeSelector: map[string]string{"meshmark.dev/test-node": "1"}})
	probes := standInProbes(t)
	probes.ControlDown(true)
	app := deployGraph(t, c, "ptctl", "chain-2")
	res, err := c.ProbePlaintext(ctx, app, PlaintextCheck{Run: "ptctl", Mesh: "istio", Outside: mesh.KnownClusterMarks().Outside, Timeout: time.Minute})
	want := "probe pod meshmark-plaintext-probe-0 could not reach the positive control, a plaintext service outside the mesh (" + PlaintextControlService + "." + app.Namespace +
		"-probe.svc.cluster.local:9080 (http)): refused: connection refused; so the services' refusals it saw are no evidence"
	if err == nil || res.Probes != nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("probe whose control is unreachable: probes %+v, %v; want no result and an error saying %q", res.Probes, err, want)
	}
	if _, gerr := c.Client().CoreV1().Namespaces().Get(ctx, res.Namespace, metav1.GetOptions{}); !IsNotFound(gerr) {
		t.Errorf("probe namespace %s left behind: %v", res.Namespace, gerr)
	}
}
