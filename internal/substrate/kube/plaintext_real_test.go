package kube

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/mesh"
	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	"github.com/meshmark/meshmark/internal/workload"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// TestPlaintextProbeOnRealNodes: ProbePlaintext calls each of the 17 services of a
// chain from real probe pods outside the mesh (16 services per pod, so two pods, on the
// load-generator node), which run meshmark's probe, resolve the services' cluster names
// through CoreDNS and leave their reports as the kubelet's termination message. No mesh
// is installed, so a service that refuses is one whose Service sends its callers to a
// port its pod does not listen on: the pod's kernel resets the connection. Two such
// services must be reported refused, in the words of the connection's end; every other
// service served (its answer names it; those whose next hop refuses answer 502, which is
// still the application's answer). The
// positive control answered each probe pod, the probe pods carried every mesh's
// opt-outs, and the probe's namespace is gone when ProbePlaintext returns.
func TestPlaintextProbeOnRealNodes(t *testing.T) {
	l := kubetest.SharedLocal(t)
	ctx := context.Background()
	client := l.ClientOf(t)
	c, nodes := connectAcrossNodes(t, l)
	g, err := workload.Builtin("chain-17")
	if err != nil {
		t.Fatal(err)
	}
	const run = "ptreal"
	app := deployReady(t, c, AppSpec{Run: run, Mesh: "baseline", Deployments: g.Deployments(),
		Args: func(d workload.Deployment) []string { return g.ServiceArgs(d, PodNameArg) }})
	closed := map[string]bool{"svc-5": true, "svc-16": true}
	for svc := range closed {
		closeServicePort(t, client, app.Namespace, svc)
	}

	probePods := watchProbePods(t, client, run)
	start := time.Now()
	res, err := c.ProbePlaintext(ctx, app, PlaintextCheck{Run: run, Mesh: "baseline", Outside: mesh.KnownClusterMarks().Outside, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probed %d services in %s", len(res.Probes), time.Since(start).Round(100*time.Millisecond))

	if len(res.Probes) != 17 {
		t.Fatalf("%d services probed, want 17: %+v", len(res.Probes), res.Probes)
	}
	for _, p := range res.Probes {
		wantTarget := fmt.Sprintf("%s.%s.svc.cluster.local:", p.Service, app.Namespace)
		if !strings.HasPrefix(p.Target, wantTarget) || !strings.HasSuffix(p.Target, " (http)") {
			t.Errorf("%s: target %q, want its cluster name %s... in http", p.Service, p.Target, wantTarget)
		}
		switch {
		case closed[p.Service]:
			if !p.Refused || p.Observed != "refused: connection refused" {
				t.Errorf("%s, whose pod does not listen on the port its Service sends to: %+v", p.Service, p)
			}
		case p.Refused || !strings.HasPrefix(p.Observed, "served: HTTP ") || !strings.Contains(p.Observed, fmt.Sprintf(`{\"service\":\"%s\"`, p.Service)):
			t.Errorf("%s, which serves plaintext: %+v", p.Service, p)
		}
	}
	if len(res.Control) != 2 {
		t.Errorf("positive control %+v: want one outcome per probe pod", res.Control)
	}
	for _, ctl := range res.Control {
		if ctl.Refused || !strings.Contains(ctl.Observed, `served: HTTP 200 "{\"service\":\"svc-0\",\"version\":\"v1\",\"pod\":\"meshmark-plaintext-control\"`) ||
			!strings.HasPrefix(ctl.Target, PlaintextControlService+"."+app.Namespace+"-probe.svc.cluster.local:9080") {
			t.Errorf("positive control %+v: want it served, at its cluster name in the probe's namespace", ctl)
		}
	}
	if res.Namespace != app.Namespace+"-probe" || len(res.Pods) != 2 {
		t.Errorf("probe namespace %s, pods %v: want %s-probe, two pods for 17 services", res.Namespace, res.Pods, app.Namespace)
	}
	seen := probePods()
	if len(seen) != 2 {
		t.Fatalf("saw %d probe pods, want 2", len(seen))
	}
	for _, p := range seen {
		ctr := p.Spec.Containers[0]
		switch {
		case p.Namespace != res.Namespace:
			t.Errorf("probe pod %s in namespace %s, want %s", p.Name, p.Namespace, res.Namespace)
		case p.Labels[ManagedByLabel] != ManagedBy || p.Labels[MeshLabel] != "baseline":
			t.Errorf("probe pod %s labels %v: want meshmark's, with the run and the mesh", p.Name, p.Labels)
		case p.Labels["sidecar.istio.io/inject"] != "false" || p.Annotations["sidecar.istio.io/inject"] != "false" ||
			p.Annotations["linkerd.io/inject"] != "disabled" || p.Labels["istio.io/dataplane-mode"] != "none":
			t.Errorf("probe pod %s labels %v annotations %v: want every mesh's opt-out", p.Name, p.Labels, p.Annotations)
		case ctr.Image != l.Image || ctr.Args[0] != PlaintextProbeCommand || ctr.TerminationMessagePath != TerminationMessagePath:
			t.Errorf("probe pod %s runs %s %v (message %s)", p.Name, ctr.Image, ctr.Args, ctr.TerminationMessagePath)
		case p.Spec.NodeName != nodes[1] || p.Spec.RestartPolicy != corev1.RestartPolicyNever || *p.Spec.AutomountServiceAccountToken:
			t.Errorf("probe pod %s on %s, restart %s, token %v: want the load-generator node, once, no token", p.Name, p.Spec.NodeName, p.Spec.RestartPolicy, *p.Spec.AutomountServiceAccountToken)
		case p.Status.Phase != corev1.PodSucceeded:
			t.Errorf("probe pod %s last seen %s, want it to have ended by itself", p.Name, p.Status.Phase)
		}
	}
	if ns, err := client.CoreV1().Namespaces().Get(ctx, res.Namespace, metav1.GetOptions{}); err == nil {
		t.Errorf("probe namespace %s left behind (phase %s)", res.Namespace, ns.Status.Phase)
	} else if !IsNotFound(err) {
		t.Fatal(err)
	}

	// A probe whose image no node holds or can pull (its registry refuses connections)
	// fails at once with the kubelet's reason, and removes its namespace: its positive
	// control cannot start either.
	bad := connectLocal(t, l, Config{Image: "127.0.0.1:1/meshmark:absent",
		LoadgenNodeSelector: map[string]string{"kubernetes.io/hostname": nodes[1]}})
	start = time.Now()
	res, err = bad.ProbePlaintext(ctx, app, PlaintextCheck{Run: run, Mesh: "baseline", Outside: mesh.KnownClusterMarks().Outside, Timeout: time.Minute})
	took := time.Since(start)
	if err == nil || res.Probes != nil || !strings.Contains(err.Error(), "cannot be pulled") || !strings.Contains(err.Error(), "127.0.0.1:1/meshmark:absent") {
		t.Errorf("probe with an image no one can pull: probes %+v, %v", res.Probes, err)
	}
	if took > 45*time.Second {
		t.Errorf("the error came after %s; the kubelet says within seconds that the image cannot be pulled", took.Round(time.Second))
	}
	t.Logf("unpullable image: error after %s: %v", took.Round(100*time.Millisecond), err)
	if _, gerr := client.CoreV1().Namespaces().Get(ctx, res.Namespace, metav1.GetOptions{}); !IsNotFound(gerr) {
		t.Errorf("probe namespace %s left behind: %v", res.Namespace, gerr)
	}
}

// closeServicePort points a Service at a port its pods do not listen on, so that a
// caller's connection is reset by the pod's kernel, as a mesh's proxy refusing it would,
// and waits until the Service's endpoints carry the port. kube-proxy programs it within
// a second of that; the probe's positive control takes longer to start.
func closeServicePort(t *testing.T, client kubernetes.Interface, namespace, service string) {
	t.Helper()
	ctx := context.Background()
	const closedPort = 9
	patch := []byte(fmt.Sprintf(`{"spec":{"ports":[{"name":"http","port":9080,"targetPort":%d}]}}`, closedPort))
	if _, err := client.CoreV1().Services(namespace).Patch(ctx, service, "application/strategic-merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		eps, err := client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + service})
		if err != nil {
			t.Fatal(err)
		}
		if len(eps.Items) == 1 && len(eps.Items[0].Ports) == 1 && eps.Items[0].Ports[0].Port != nil && *eps.Items[0].Ports[0].Port == closedPort {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s: endpoints %+v a minute after its target port was closed", service, eps.Items)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// watchProbePods records, from now on, the last state of every plaintext probe pod of a
// run; the returned func stops the watch and returns them.
func watchProbePods(t *testing.T, client kubernetes.Interface, run string) func() []corev1.Pod {
	t.Helper()
	w, err := client.CoreV1().Pods("").Watch(context.Background(), metav1.ListOptions{LabelSelector: RunLabel + "=" + run + "," + RoleLabel + "=" + PlaintextProbeRole})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		last = map[string]corev1.Pod{}
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			mu.Lock()
			last[p.Namespace+"/"+p.Name] = *p
			mu.Unlock()
		}
	}()
	return func() []corev1.Pod {
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		var pods []corev1.Pod
		for _, p := range last {
			pods = append(pods, p)
		}
		return pods
	}
}
